"""Dashboard views: load -> build (analysis.dashboard, pure) -> render. Figures reach
plotly.js through `json_script`; live progress through small JSON endpoints."""

from __future__ import annotations

from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse
from django.shortcuts import get_object_or_404, render

from analysis import dashboard, exports, figures
from analysis.filters import Selection, SelectionError, parse_selection
from benchkit.hosts.topology import TopoMatrix
from runs import selectors
from runs.models import Host, Run, RunState, Sweep


def sweep_list(request: HttpRequest) -> HttpResponse:
    """All sweeps, newest first, with run counts per state."""
    return render(request, "analysis/sweep_list.html", {"sweeps": selectors.sweep_list()[:200],
                                                        "hosts": Host.objects.order_by("name")})


def _selection_or_400(request: HttpRequest, pk: int) -> tuple[Selection, list[dict], tuple] | HttpResponse:
    """(selection, dimension rows, baseline config) of a sweep page request, or a 400 answer
    naming the bad query parameter."""
    try:
        selection = parse_selection(request.GET)
        dims = selectors.sweep_dimensions(pk)
        return selection, dims, dashboard.baseline_config(selection, dims)
    except SelectionError as exc:
        return HttpResponseBadRequest(f"bad filter {exc}", content_type="text/plain; charset=utf-8")


def sweep_detail(request: HttpRequest, pk: int) -> HttpResponse:
    """A sweep organised by its grid's dimensions: the headline (fastest configuration per TP
    and concurrency), filters in the URL query, four figures (read by the page's script from
    `sweep_data` with the same query) and a per-configuration run table; every run is listed,
    paginated, at `sweep_runs`. Loads only the columns the figures need."""
    sweep = get_object_or_404(Sweep.objects.select_related("host"), pk=pk)
    got = _selection_or_400(request, pk)
    if isinstance(got, HttpResponse):
        return got
    selection, dims, base_cfg = got
    points = selectors.figure_points(pk, figures.POINT_METRICS, **selection.load_kwargs(base_cfg))
    ctx = dashboard.build_sweep_page(points, dims, selection, selectors.config_state_counts(pk),
                                     selectors.failure_counts(pk))
    ctx.update(sweep=sweep, query=selection.query(), active=selectors.active_run(pk))
    return render(request, "analysis/sweep_detail.html", ctx)


def sweep_data(request: HttpRequest, pk: int) -> JsonResponse | HttpResponse:
    """The sweep page's figures as JSON, for the same query parameters as the page
    (codespeed style: a data endpoint per chart page); `points=1` adds the point table."""
    sweep = get_object_or_404(Sweep.objects.only("id", "name", "is_demo"), pk=pk)
    got = _selection_or_400(request, pk)
    if isinstance(got, HttpResponse):
        return got
    selection, _, base_cfg = got
    points = selectors.figure_points(pk, figures.POINT_METRICS, **selection.load_kwargs(base_cfg))
    return JsonResponse(dashboard.sweep_data(sweep, points, selection, with_points=request.GET.get("points") == "1"))


#: Runs per page of a sweep's run list.
RUNS_PER_PAGE = 100


def sweep_runs(request: HttpRequest, pk: int) -> HttpResponse:
    """Every run of a sweep, paginated (RUNS_PER_PAGE), narrowed by the sweep page's filters and
    `state`; each row links to its run page."""
    sweep = get_object_or_404(Sweep.objects.only("id", "name", "is_demo"), pk=pk)
    try:
        selection = parse_selection(request.GET)
    except SelectionError as exc:
        return HttpResponseBadRequest(f"bad filter {exc}", content_type="text/plain; charset=utf-8")
    state = request.GET.get("state", "")
    if state and state not in RunState.values:
        return HttpResponseBadRequest(f"bad filter state: {state!r} (one of {', '.join(RunState.values)})",
                                      content_type="text/plain; charset=utf-8")
    qs = selectors.run_list(pk, figures.POINT_METRICS, state=state, tp=selection.tp,
                            concurrency=selection.concurrency, output_len=selection.output_len,
                            methods=selection.names, configs=selection.configs)
    page = Paginator(qs, RUNS_PER_PAGE).get_page(request.GET.get("page"))
    query = selection.query()
    if state:
        query = (query + "&" if query else "?") + f"state={state}"
    return render(request, "analysis/sweep_runs.html", {
        "sweep": sweep, "page": page, "rows": [dashboard.run_row(r) for r in page.object_list],
        "headers": dashboard.RUN_LIST_HEADERS, "query": query, "state": state, "selection": selection})


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
    """One run: configuration, how to reproduce it (sweep-file fragment and exact command line),
    GPUs, metrics, binned distributions, history, log tail."""
    run = get_object_or_404(Run.objects.select_related("sweep", "host", "metrics"), pk=pk)
    ctx = dashboard.build_run(run, run.sweep.name)
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
    history = selectors.snapshot_history(host)
    return render(request, "analysis/host_detail.html", {"host": host, "snapshot": snap, "topology": fig,
                                                         "history": history})
