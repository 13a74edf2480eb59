// Render every Plotly figure on the page. Each <div data-figure="ID"> has a sibling
// <script type="application/json" id="ID"> written by Django's json_script.
// window.draftboardFigures(root) draws those under `root` (a fragment loaded later calls it).
(function () {
  "use strict";
  function drawFigures(root) {
    root.querySelectorAll("[data-figure]").forEach(function (el) {
      var src = document.getElementById(el.dataset.figure);
      if (!src) { return; }
      var fig = JSON.parse(src.textContent);
      if (fig.empty) {  // a figure without data says why (analysis.figures.empty)
        el.textContent = fig.empty;
        el.className += " figure-empty empty";
        return;
      }
      Plotly.newPlot(el, fig.data, fig.layout, {responsive: true, displaylogo: false});
    });
  }
  window.draftboardFigures = drawFigures;
  drawFigures(document);
  // Live progress of a running sweep: poll the JSON endpoint, reload when a run finishes.
  var prog = document.getElementById("progress");
  if (prog && Number(prog.dataset.finished) < Number(prog.dataset.total)) {
    var seen = Number(prog.dataset.finished);
    var timer = setInterval(function () {
      fetch(prog.dataset.url).then(function (r) { return r.json(); }).then(function (p) {
        prog.querySelector("progress").value = p.finished;
        var active = p.active ? " · run " + p.active.id + " " + p.active.state + " " +
          p.active.progress_done + "/" + p.active.progress_total + " requests" : "";
        prog.querySelector(".progress-text").textContent = p.finished + " / " + p.total + " runs finished" + active;
        if (p.finished !== seen) { clearInterval(timer); window.location.reload(); }
      }).catch(function () { clearInterval(timer); });
    }, 3000);
  }
})();
