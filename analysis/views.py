"""Dashboard views: load -> build (analysis.dashboard, pure) -> render. Figures reach
plotly.js through `json_script`; live progress through small JSON endpoints."""

from __future__ import annotations

import tempfile
from pathlib import Path

from django.conf import settings
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, render

from analysis import (
    acceptance,
    ceilings,
    changepoints,
    dashboard,
    display,
    exports,
    figures,
    filters,
    history,
    recommend,
    report,
)
from analysis import glossary as glossary_content
from analysis.filters import QueryError, Selection, parse_selection
from benchkit.compare import verdicts
from benchkit.hosts.topology import TopoMatrix
from benchkit.point import SPEED_FIELD, Point
from runs import selectors
from runs.ceilings import ceiling_inputs
from runs.models import Host, Run, RunState, Sweep


def sweep_list(request: HttpRequest) -> HttpResponse:
    """All sweeps, newest first, with run counts per state."""
    return render(request, "analysis/sweep_list.html", {"sweeps": selectors.sweep_list()[:200],
                                                        "hosts": selectors.hosts_with_workers()})


def bad_query(exc: QueryError) -> HttpResponse:
    """The one answer to a bad query string, on every page and JSON endpoint: HTTP 400, text
    `bad query: <param>: <reason>` (analysis.filters reads every query)."""
    return HttpResponse(f"bad query: {exc}\n", status=400, content_type="text/plain; charset=utf-8")


def _sweep_points(request: HttpRequest, pk: int, metric_fields=figures.SWEEP_POINT_FIELDS,
                  prices: dict[str, float | None] | None = None) -> tuple[Selection, list[dict], list[Point]]:
    """(selection, dimension rows, figure points with `metric_fields`, priced when `prices` are
    given) of a sweep page request; QueryError names a bad query parameter. Without filters the
    points are every counted run, and the dimensions are read off them (one query); with filters
    the dimensions come first (they give the baseline configuration that the points query must
    include)."""
    selection = parse_selection(request.GET)
    if not selection.is_filtered:
        points = selectors.figure_points(pk, metric_fields, prices)
        dims = selectors.dimensions_of(points)
        dashboard.baseline_config(selection, dims)  # a baseline that is not in the sweep: 400
        return selection, dims, points
    dims = selectors.sweep_dimensions(pk)
    base_cfg = dashboard.baseline_config(selection, dims)
    return selection, dims, selectors.figure_points(pk, metric_fields, prices, **selection.load_kwargs(base_cfg))


def sweep_detail(request: HttpRequest, pk: int) -> HttpResponse:
    """A sweep organised by its grid's dimensions: the headline (fastest configuration per TP
    and concurrency), filters in the URL query, four figures (read by the page's script from
    `sweep_data` with the same query) and a per-configuration run table; every run is listed,
    paginated, at `sweep_runs`. A sweep on several hosts names each, with a link to its runs
    only. Loads only the columns the figures need (and, for a sweep on a dataset, the figures
    per prompt category of the runs its category matrices show: one query more)."""
    sweep = get_object_or_404(Sweep.objects.select_related("host"), pk=pk)
    try:
        selection, dims, points = _sweep_points(request, pk)
    except QueryError as exc:
        return bad_query(exc)
    cells = dashboard.category_cells(points, selection)
    ctx = dashboard.build_sweep_page(points, dims, selection, selectors.config_state_counts(pk),
                                     selectors.failure_counts(pk), cells,
                                     selectors.category_figures(pk, cells["run_ids"]) if cells else {})
    ctx.update(sweep=sweep, query=selection.query(), active=selectors.active_run(pk),
               hosts=[(name, selection.query(host=(name,))) for name in selectors.sweep_hosts(pk)],
               all_hosts_query=selection.query(host=()))
    return render(request, "analysis/sweep_detail.html", ctx)


#: What the "what to run" fragment loads: the page's figures and the cost model's (the same
#: fields `manage.py recommend` reads, analysis.recommend.POINT_FIELDS).
WHAT_TO_RUN_FIELDS = tuple(dict.fromkeys((*figures.SWEEP_POINT_FIELDS, *recommend.POINT_FIELDS)))


def sweep_what_to_run(request: HttpRequest, pk: int) -> HttpResponse:
    """The sweep page's ceilings figure and "what to run" panel (analysis.ceilings,
    analysis.recommend) as an HTML fragment for the same query parameters as the page, which
    its script loads after the page (like the figures from `sweep_data`): fitting the cost
    model for every (TP, concurrency) costs more than the rest of the page."""
    sweep = get_object_or_404(Sweep.objects.only("id", "name", "is_demo"), pk=pk)
    try:
        _, _, points = _sweep_points(request, pk, WHAT_TO_RUN_FIELDS)
    except QueryError as exc:
        return bad_query(exc)
    if not points:
        return HttpResponse('<p class="empty">No counted runs in this selection: nothing to fit.</p>')
    inputs = ceiling_inputs({p.model for p in points} | {p.drafter for p in points}, {p.host_id for p in points})
    return render(request, "analysis/_what_to_run.html",
                  {"sweep": sweep, "ridge_figure": ceilings.ridge_figure(points, inputs),
                   "what_to_run": recommend.panel_context(points, inputs)})


def sweep_data(request: HttpRequest, pk: int) -> JsonResponse | HttpResponse:
    """The sweep page's figures as JSON, for the same query parameters as the page
    (codespeed style: a data endpoint per chart page); `points=1` adds the point table."""
    sweep = get_object_or_404(Sweep.objects.only("id", "name", "is_demo"), pk=pk)
    try:
        selection, _, points = _sweep_points(request, pk, tuple(dict.fromkeys(figures.SWEEP_POINT_FIELDS
                                                                          + figures.EFFICIENCY_POINT_FIELDS)),
                                             selectors.gpu_prices())
    except QueryError as exc:
        return bad_query(exc)
    return JsonResponse(dashboard.sweep_data(sweep, points, selection, with_points=request.GET.get("points") == "1"))


#: Runs per page of a sweep's run list.
RUNS_PER_PAGE = 100


def sweep_runs(request: HttpRequest, pk: int) -> HttpResponse:
    """Every run of a sweep, paginated (RUNS_PER_PAGE), narrowed by the sweep page's filters (host
    included) and `state`; each row shows its host and links to its run page."""
    sweep = get_object_or_404(Sweep.objects.only("id", "name", "is_demo"), pk=pk)
    try:
        selection = parse_selection(request.GET)
        state = filters.choice(request.GET, "state", RunState.values)
    except QueryError as exc:
        return bad_query(exc)
    qs = selectors.run_list(pk, figures.POINT_METRICS, state=state, tp=selection.tp,
                            concurrency=selection.concurrency, output_len=selection.output_len,
                            methods=selection.names, configs=selection.configs, host=selection.host)
    page = Paginator(qs, RUNS_PER_PAGE).get_page(request.GET.get("page"))
    query = selection.query()
    if state:
        query = (query + "&" if query else "?") + f"state={state}"
    return render(request, "analysis/sweep_runs.html", {
        "sweep": sweep, "page": page, "rows": [dashboard.run_row(r) for r in page.object_list],
        "headers": dashboard.RUN_LIST_HEADERS, "query": query, "state": state, "selection": selection,
        "hosts": [(name, selection.query(host=(name,))) for name in selectors.sweep_hosts(pk)]})


def sweep_progress(request: HttpRequest, pk: int) -> JsonResponse:
    """Live progress of a sweep (polled by the sweep page and by `manage.py demo`)."""
    return JsonResponse(selectors.sweep_progress(get_object_or_404(Sweep, pk=pk)))


def sweep_export(request: HttpRequest, pk: int, fmt: str) -> HttpResponse:
    """Download the sweep's counted runs as csv, json or tex (404 for any other format)."""
    if fmt not in ("csv", "json", "tex"):
        raise Http404(f"unknown export format {fmt!r}: use csv, json or tex")
    sweep = get_object_or_404(Sweep, pk=pk)
    runs = list(selectors.sweep_runs(sweep))
    prices = selectors.gpu_prices()
    points, speedups = dashboard.sweep_results(runs, prices)
    inputs = ceiling_inputs({r.model for r in runs} | {r.drafter for r in runs}, {r.host_id for r in runs})
    table = exports.sweep_table(points, speedups, inputs)
    name = f"sweep-{sweep.pk}"
    if fmt == "csv":
        resp = HttpResponse(exports.to_csv(table), content_type="text/csv")
    elif fmt == "tex":
        resp = HttpResponse(exports.to_latex(table, caption=f"{sweep.name} (sweep {sweep.pk})"),
                            content_type="application/x-tex")
    else:
        resp = JsonResponse(exports.sweep_json(sweep, runs, prices, inputs), json_dumps_params={"indent": 1})
    resp["Content-Disposition"] = f'attachment; filename="{name}.{fmt}"'
    return resp


def sweep_report(request: HttpRequest, pk: int) -> HttpResponse:
    """The sweep's report as HTML (analysis.report: the document `manage.py report` writes, its
    figures drawn by plotly.js from the same figure dicts); `?baseline=LABEL` as on the sweep page."""
    sweep = get_object_or_404(Sweep.objects.select_related("host"), pk=pk)
    try:
        ctx = report.build_report(report.load_inputs(sweep, request.GET.get("baseline", "auto")))
    except QueryError as exc:
        return bad_query(exc)
    return HttpResponse(report.render_html(ctx, request=request))


def sweep_report_pdf(request: HttpRequest, pk: int) -> HttpResponse:
    """The sweep's report as a PDF, built now (figures through kaleido, then pdflatex; a few
    seconds); 503 with the reason when this server lacks pdflatex, kaleido or Chromium."""
    sweep = get_object_or_404(Sweep.objects.select_related("host"), pk=pk)
    baseline = request.GET.get("baseline", "auto")
    with tempfile.TemporaryDirectory(prefix="draftboard-report-") as tmp:
        try:
            pdf = report.write_report(sweep, Path(tmp), "pdf", baseline)
        except QueryError as exc:
            return bad_query(exc)
        except report.ReportError as exc:
            return HttpResponse(f"the PDF report cannot be built on this server: {exc}\n", status=503,
                                content_type="text/plain; charset=utf-8")
        resp = HttpResponse(pdf.read_bytes(), content_type="application/pdf")
    resp["Content-Disposition"] = f'attachment; filename="{pdf.name}"'
    return resp


def run_detail(request: HttpRequest, pk: int) -> HttpResponse:
    """One run: configuration, how to reproduce it (sweep-file fragment and exact command line),
    GPUs, metrics, binned distributions, history, log tail."""
    run = get_object_or_404(Run.objects.select_related(*selectors.RUN_PAGE_RELATED)
                            .defer(*selectors.RUN_PAGE_DEFERRED), pk=pk)
    m = getattr(run, "metrics", None)
    ctx = dashboard.build_run(run, run.sweep.name, gpu_series=selectors.gpu_series(run),
                              cost=selectors.cost_of(run, m) if m else (None, None))
    ctx.update(run=run, transitions=list(run.transitions.all()),
               # the title of an unknown figure's marker ({% figure %}, analysis.display)
               unknown_why=display.WHY_NOT_IN_FILE if (run.spec or {}).get("imported") else display.WHY_NOT_MEASURED,
               ceilings=ceilings.run_section(run, ceiling_inputs({run.model, run.drafter}, {run.host_id})),
               acceptance=acceptance.acceptance_section(run, m))
    return render(request, "analysis/run_detail.html", ctx)


def glossary(request: HttpRequest) -> HttpResponse:
    """Every figure with its formula, unit and the tokens it counts (analysis.glossary)."""
    return render(request, "analysis/glossary.html", {"sections": glossary_content.SECTIONS})


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
    history = selectors.recent_snapshots(host)
    scheduler = selectors.scheduler_status()
    return render(request, "analysis/host_detail.html", {"host": host, "snapshot": snap, "topology": fig,
                                                         "history": history, "scheduler": scheduler})


# --- history pages: home, compare two sweeps, trend of a nightly series ---------------------------
# Each page reads a bounded set of sweeps and only the runs of those (runs.selectors' history
# queries); its JSON endpoint returns the `data` dict the page renders.

#: Most series on the home page, nights on a trend page.
HOME_SERIES_LIMIT = 12
TREND_NIGHTS_DEFAULT, TREND_NIGHTS_MAX = 30, 90
#: A trend page shows at most this many concurrency rows by default (first and last otherwise).
TREND_DEFAULT_ROWS = 3


def _sweep_or_404(pk: int | None) -> Sweep | None:
    """The sweep `pk` with its host (None for None; 404 when there is none)."""
    return None if pk is None else get_object_or_404(Sweep.objects.select_related("host"), pk=pk)


def _home_context() -> dict:
    latest = selectors.latest_per_series(limit=HOME_SERIES_LIMIT)
    ids = [s.pk for s in latest]
    points = selectors.history_points(ids, tuple(dict.fromkeys((SPEED_FIELD, *verdicts.EXCLUSION_FIGURES))),
                                      snapshots={})
    ctx = history.build_home(latest, selectors.state_counts_by_sweep(ids), points,
                             selectors.open_regression_flags(limit=history.ROW_LIMIT))
    ctx["data"]["change_points"] = changepoints.home_rows(selectors.open_change_points(limit=history.ROW_LIMIT))
    return ctx


def home(request: HttpRequest) -> HttpResponse:
    """The latest sweep of each series with its headline, run counts and open regression flags."""
    ctx = _home_context()
    scheduler = selectors.scheduler_status()
    return render(request, "analysis/home.html", {**ctx, "hosts": Host.objects.order_by("name"),
                                                  "scheduler": scheduler})


def home_data(request: HttpRequest) -> JsonResponse:
    """The home page's data as JSON."""
    return JsonResponse(_home_context()["data"])


def _compare_context(request: HttpRequest, limit: int = history.ROW_LIMIT) -> dict | None:
    """(old, new) from `?old=ID&new=ID`; `new` defaults to the newest sweep of the newest series,
    `old` to the sweep before `new` in its series. None when there is nothing to compare.
    The query is read first: a bad value is QueryError whatever is stored."""
    new_id, old_id = filters.sweep_id(request.GET, "new"), filters.sweep_id(request.GET, "old")
    chosen = filters.parse_history_filters(request.GET)
    new, old = _sweep_or_404(new_id), _sweep_or_404(old_id)
    if new is None:
        latest = selectors.latest_per_series(limit=1)
        new = latest[0] if latest else None
    if new is None:
        return None
    if old is None:
        old = selectors.previous_in_series(new)
        if old is None:
            return None
        old = Sweep.objects.select_related("host").get(pk=old.pk)
    snaps = selectors.snapshot_history(sorted({old.host_id, new.host_id}))
    points = selectors.history_points([old.pk, new.pk], history.HISTORY_METRICS, chosen, snaps, gpus=False)
    old_pk, new_pk = old.pk, new.pk
    ctx = history.build_compare(old, new, [p for p in points if p.sweep_id == old_pk],
                                [p for p in points if p.sweep_id == new_pk], settings.DRAFTBOARD_COMPARE_NOISE_PCT,
                                limit=limit)
    inputs = ceiling_inputs({p.model for p in points} | {p.drafter for p in points}, {p.host_id for p in points})
    ceilings.annotate_compare(ctx["data"], points, inputs)
    ctx.update(old=old, new=new, filters=chosen)
    return ctx


def compare(request: HttpRequest) -> HttpResponse:
    """Two sweeps side by side: per matched point the change in tok/s, TPOT, TTFT and tau with a
    verdict; points on other hardware or another engine build apart."""
    try:
        ctx = _compare_context(request, limit=history.PAGE_ROW_LIMIT)
    except QueryError as exc:
        return bad_query(exc)
    if ctx:
        ctx.update(history.compare_page_tables(ctx["data"]))
    return render(request, "analysis/compare.html", ctx or {"data": None})


def _history_data(request: HttpRequest, context, missing: str) -> HttpResponse:
    """A history page's JSON endpoint: the `data` of `context(request)`; 400 for a bad query,
    404 with `missing` when there is nothing to show."""
    try:
        ctx = context(request)
    except QueryError as exc:
        return bad_query(exc)
    if ctx is None:
        raise Http404(missing)
    return JsonResponse(ctx["data"])


def compare_data(request: HttpRequest) -> HttpResponse:
    """The compare page's data as JSON (404 when there are not two sweeps to compare)."""
    return _history_data(request, _compare_context, "no two sweeps to compare: give ?old=ID&new=ID")


def _default_filters(facets: dict[str, list]) -> dict[str, list]:
    """What a trend page shows without filters: every TP and configuration; at most
    TREND_DEFAULT_ROWS concurrency levels (else the lowest and the highest); the longest output
    and input length when there are several."""
    out: dict[str, list] = {}
    if len(facets["concurrency"]) > TREND_DEFAULT_ROWS:
        out["concurrency"] = [facets["concurrency"][0], facets["concurrency"][-1]]
    for col in ("output_len", "input_len"):
        if len(facets[col]) > 1:
            out[col] = [facets[col][-1]]
    return out


def _trend_context(request: HttpRequest) -> dict | None:
    """The trend page of `?host=NAME&series=SWEEP_NAME` (default: the newest series), None when
    nothing is stored. The query is read first: a bad value is QueryError whatever is stored."""
    nights_n = filters.whole_number(request.GET, "nights", TREND_NIGHTS_DEFAULT, 1, TREND_NIGHTS_MAX)
    asked = filters.parse_history_filters(request.GET)
    host_name, name = request.GET.get("host", "").strip(), request.GET.get("series", "").strip()
    if not host_name or not name:
        latest = selectors.latest_per_series(limit=1)
        if not latest:
            return None
        host, name = latest[0].host, latest[0].name
    else:
        host = get_object_or_404(Host, name=host_name)
    nights = selectors.series_sweeps(host.pk, name, limit=nights_n)
    if not nights:
        raise Http404(f"no sweep named {name!r} on host {host.name}")
    facets = selectors.facet_values([nights[-1].pk])
    chosen = asked or _default_filters(facets)
    snaps = selectors.snapshot_history([host.pk])
    points = selectors.history_points([n.pk for n in nights], (SPEED_FIELD,), chosen, snaps)
    flags = selectors.series_regression_flags(host.pk, name, [n.pk for n in nights])
    ctx = history.build_trend(host, name, nights, points, flags, snaps[host.pk], facets, chosen)
    changepoints.extend_trend(ctx, host, name, nights, points, request.GET.get("point", "").strip()[:64])
    ctx.update(host=host, series=name, nights=nights, first=nights[0], latest=nights[-1])
    return ctx


def trend(request: HttpRequest) -> HttpResponse:
    """A nightly series (`?host=NAME&series=SWEEP_NAME`): tok/s and speedup per point over the
    nights, hardware and engine changes on the time axis, regression flags."""
    try:
        ctx = _trend_context(request)
    except QueryError as exc:
        return bad_query(exc)
    return render(request, "analysis/trend.html", ctx or {"data": None})


def trend_data(request: HttpRequest) -> HttpResponse:
    """The trend page's data as JSON."""
    return _history_data(request, _trend_context, "no series yet")
