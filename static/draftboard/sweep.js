// The sweep page's figures: read from the sweep's JSON endpoint (the page's own query, so a
// linked view shows the same selection), drawn with plotly.js; a figure without data shows the
// reason the server gives instead of empty axes. Clicking a point opens its run.
(function () {
  "use strict";
  var root = document.getElementById("sweep-figures");
  if (!root) { return; }

  // The figure's title and caption go into the box's heading and paragraph (text, never HTML).
  function label(el, fig) {
    var box = el.parentElement;
    box.querySelector(".figure-title").textContent = fig.title || "";
    box.querySelector(".figure-caption").textContent = fig.caption || "";
  }

  function showEmpty(el, fig) {
    el.textContent = fig.empty;
    el.classList.add("figure-empty");
  }

  function linkRuns(el) {
    el.on("plotly_click", function (ev) {
      var cd = ev.points && ev.points[0] && ev.points[0].customdata;
      if (cd && cd.runs && cd.runs.length) {
        window.location.href = root.dataset.runUrl.replace("/0/", "/" + cd.runs[0] + "/");
      }
    });
  }

  // Auto-submit the filter form on change (the button stays for keyboards and no-JS).
  document.querySelectorAll("form.filters input, form.filters select").forEach(function (input) {
    input.addEventListener("change", function () { input.form.submit(); });
  });

  function draw(el, fig) {
    label(el, fig);
    el.classList.remove("figure-empty");
    if (window.Plotly && el.data) { Plotly.purge(el); }
    if (fig.empty) { showEmpty(el, fig); return Promise.resolve(); }
    el.textContent = "";
    return Plotly.newPlot(el, fig.data, fig.layout, {responsive: true, displaylogo: false})
      .then(function () { linkRuns(el); });
  }

  // The throughput figure's y-axis switch (output tok/s, per GPU, J per output token, USD per
  // million output tokens): each choice is a figure of data.json's "throughput_y".
  function ySwitch(payload) {
    var ty = payload.throughput_y, el = document.getElementById("fig-tp_scaling");
    if (!ty || !el) { return; }
    var box = el.parentElement, wrap = document.createElement("p"), sel = document.createElement("select");
    wrap.className = "y-switch";
    wrap.appendChild(document.createTextNode("y-axis: "));
    sel.id = "throughput-y";
    ty.options.forEach(function (o) {
      var opt = document.createElement("option");
      opt.value = o.key;
      opt.textContent = o.label;
      sel.appendChild(opt);
    });
    sel.addEventListener("change", function () {
      root.dataset.state = "loading";
      draw(el, ty.figures[sel.value]).then(function () { root.dataset.state = "ready"; });
    });
    wrap.appendChild(sel);
    box.insertBefore(wrap, el);
  }

  fetch(root.dataset.url, {headers: {"Accept": "application/json"}})
    .then(function (r) {
      if (!r.ok) { throw new Error("chart data: HTTP " + r.status); }
      return r.json();
    })
    .then(function (payload) {
      var pending = [];
      Object.keys(payload.figures).forEach(function (key) {
        var el = document.getElementById("fig-" + key);
        if (!el) { return; }
        var fig = payload.figures[key];
        label(el, fig);
        if (fig.empty) { showEmpty(el, fig); return; }
        el.textContent = "";
        pending.push(Plotly.newPlot(el, fig.data, fig.layout, {responsive: true, displaylogo: false})
          .then(function () { linkRuns(el); }));
      });
      ySwitch(payload);
      return Promise.all(pending);
    })
    .then(function () { root.dataset.state = "ready"; })
    .catch(function (err) {
      root.dataset.state = "error";
      var p = document.createElement("p");
      p.className = "banner bad";
      p.textContent = "Could not draw the figures: " + err.message;
      root.prepend(p);
    });

  // The ceilings figure and "what to run" panel: an HTML fragment of the same selection, loaded
  // after the page (fitting the cost model costs more than the rest of the page).
  var slot = document.getElementById("what-to-run-slot");
  if (slot) {
    fetch(slot.dataset.url, {headers: {"Accept": "text/html"}})
      .then(function (r) {
        if (!r.ok) { throw new Error("HTTP " + r.status); }
        return r.text();
      })
      .then(function (html) {
        slot.innerHTML = html;
        if (window.draftboardFigures) { window.draftboardFigures(slot); }
        slot.dataset.state = "ready";
      })
      .catch(function (err) {
        slot.dataset.state = "error";
        slot.innerHTML = "";
        var p = document.createElement("p");
        p.className = "banner bad";
        p.textContent = "Could not load the what-to-run panel: " + err.message;
        slot.appendChild(p);
      });
  }
})();
