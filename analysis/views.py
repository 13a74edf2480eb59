"""Dashboard views: load -> build (analysis.dashboard, pure) -> render. Figures reach
plotly.js through `json_script`; live progress through small JSON endpoints."""

from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, render

from analysis import dashboard, exports, figures
from benchkit.hosts.topology import TopoMatrix
from runs import selectors
from runs.models import Host, Run, Sweep


def sweep_list(request: HttpRequest) -> HttpResponse:
    """All sweeps, newest first, with run counts per state."""
    return render(request, "analysis/sweep_list.html", {"sweeps": selectors.sweep_list()[:200],
                                                        "hosts": selectors.hosts_with_workers()})


def sweep_detail(request: HttpRequest, pk: int) -> HttpResponse:
    """A sweep: speedup, throughput and acceptance charts, and every run with its state."""
    sweep = get_object_or_404(Sweep.objects.select_related("host"), pk=pk)
    runs = list(selectors.sweep_runs(sweep))
    ctx = dashboard.build_sweep(sweep, runs)
    ctx.update(sweep=sweep, progress=selectors.sweep_progress(sweep))
    return render(request, "analysis/sweep_detail.html", ctx)


def sweep_data(request: HttpRequest, pk: int) -> JsonResponse:
    """The sweep page's figures and points as JSON (codespeed style: a data endpoint per chart page)."""
    sweep = get_object_or_404(Sweep, pk=pk)
    ctx = dashboard.build_sweep(sweep, list(selectors.sweep_runs(sweep)))
    return JsonResponse({"sweep": sweep.pk, "figures": ctx["figures"], "points": ctx["points"],
                         "inconsistent_tps": ctx["inconsistent_tps"]})


def sweep_progress(request: HttpRequest, pk: int) -> JsonResponse:
    """Live progress of a sweep (polled by the sweep page and by `manage.py demo`)."""
    return JsonResponse(selectors.sweep_progress(get_object_or_404(Sweep, pk=pk)))


def sweep_export(request: HttpRequest, pk: int, fmt: str) -> HttpResponse:
    """Download the sweep's counted runs as csv, json or tex (404 for any other format)."""
    if fmt not in ("csv", "json", "tex"):
        raise Http404(f"unknown export format {fmt!r}: use csv, json or tex")
    sweep = get_object_or_404(Sweep, pk=pk)
    runs = list(selectors.sweep_runs(sweep))
    table = exports.sweep_table(*dashboard.sweep_results(runs))
    name = f"sweep-{sweep.pk}"
    if fmt == "csv":
        resp = HttpResponse(exports.to_csv(table), content_type="text/csv")
    elif fmt == "tex":
        resp = HttpResponse(exports.to_latex(table, caption=f"{sweep.name} (sweep {sweep.pk})"),
                            content_type="application/x-tex")
    else:
        resp = JsonResponse(exports.sweep_json(sweep, runs), json_dumps_params={"indent": 1})
    resp["Content-Disposition"] = f'attachment; filename="{name}.{fmt}"'
    return resp


def run_detail(request: HttpRequest, pk: int) -> HttpResponse:
    """One run: configuration, command line, GPUs, metrics, distributions, history, log tail."""
    run = get_object_or_404(Run.objects.select_related("sweep", "host", "metrics"), pk=pk)
    ctx = dashboard.build_run(run)
    ctx.update(run=run, transitions=list(run.transitions.all()))
    return render(request, "analysis/run_detail.html", ctx)


def run_progress(request: HttpRequest, pk: int) -> JsonResponse:
    """A run's state and measured-request progress."""
    run = get_object_or_404(Run.objects.only("state", "progress_done", "progress_total", "failure_reason"), pk=pk)
    return JsonResponse({"run": run.pk, "state": run.state, "done": run.progress_done, "total": run.progress_total,
                         "failure_reason": run.failure_reason})


def host_detail(request: HttpRequest, name: str) -> HttpResponse:
    """A host: latest snapshot's GPUs, the topology matrix as a coloured grid, snapshot history."""
    host = get_object_or_404(Host, name=name)
    snap = selectors.latest_snapshot(host)
    fig = None
    if snap and snap.data.get("topology"):
        topo = TopoMatrix.from_dict(snap.data["topology"])
        fig = figures.topology_figure(list(topo.gpus), topo.links)
    history = host.snapshots.only("taken_at", "fingerprint", "changed", "gpu_count", "gpu_name", "driver_version")[:50]
    return render(request, "analysis/host_detail.html", {"host": host, "snapshot": snap, "topology": fig,
                                                         "history": history})
