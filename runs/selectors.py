"""Read-side queries of the runs app. Each returns plain querysets, dicts or benchkit records
(points: `load_points`, the one builder of benchkit.point.Point from stored runs); no writes."""

from __future__ import annotations

import bisect
import itertools
import json
import marshal
import zlib
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from operator import attrgetter
from typing import Any

from django.conf import settings
from django.db.models import BooleanField, Case, CharField, Count, F, Max, Min, Q, QuerySet, TextField, Value, When
from django.db.models.functions import Cast
from django.utils import timezone

from benchkit.hosts.inventory import HostInventory
from benchkit.measure.efficiency import cost_usd_per_m_output_tokens
from benchkit.measure.metrics import METRIC_FIELDS, METRICS, WindowMetrics
from benchkit.point import (
    AXIS_FIELDS,
    DECODING_FIELDS,
    FILTER_FIELDS,
    GRID_FIELDS,
    PRICED_FIGURES,
    RECORD_FIELDS,
    Point,
    build_points,
)
from runs.models import (
    ACTIVE_STATES,
    ChangePoint,
    GpuPrice,
    HardwareSnapshot,
    Host,
    RegressionFlag,
    Run,
    RunMetrics,
    RunState,
    SchedulerHeartbeat,
    Sweep,
    SweepSummaryColumn,
)

#: Columns that list and figure pages never need and that are heavy to fetch and decode: the run
#: page's samples (~150 KB of JSON per run), the full RunSpec, the server environment and the
#: 20 KB server-log tail. Only the run page and recompute read them.
HEAVY_RUN_COLUMNS = ("spec", "server_env", "server_log_tail")
HEAVY_METRICS_COLUMNS = ("distributions", "definitions", "extra")


def _column(field: str) -> str:
    """The Run column of a point field that is one (the run id is the row's `id`)."""
    return "id" if field == "run_id" else field


#: The point's fields that are Run columns, loaded as they are (benchkit.point.RECORD_FIELDS; the
#: others are made by `load_points`: GPU UUIDs and names from `gpus`, the hardware fingerprint
#: from the host's snapshots).
_RUN_COLUMNS = {f.attname for f in Run._meta.concrete_fields} | {"id"}
_STORED_FIELDS = tuple(f for f in RECORD_FIELDS if _column(f) in _RUN_COLUMNS)
#: The point's lossless group (benchkit.point, group "lossless"), read from the run's LosslessCheck
#: row in the same query (a LEFT JOIN: "" / None for a run without one), in the group's order
#: (tests/test_lossless_storage.py holds them equal).
_LOSSLESS_COLUMNS = {"lossless_verdict": "verdict", "lossless_identical_share": "identical_share",
                     "lossless_divergence_median": "median_first_divergence", "lossless_sentence": "sentence"}
_LOADED_FIELDS = (*_STORED_FIELDS, *_LOSSLESS_COLUMNS)
#: Grid order of a sweep's runs (benchkit.point.GRID_FIELDS as Run columns).
GRID_ORDER = tuple(_column(f) for f in GRID_FIELDS)


def sweep_list() -> QuerySet[Sweep]:
    """Sweeps, newest first, with run counts per state (one query)."""
    return (
        Sweep.objects.select_related("host")
        .annotate(
            n_runs=Count("runs"),
            n_succeeded=Count("runs", filter=Q(runs__state=RunState.SUCCEEDED)),
            n_failed=Count("runs", filter=Q(runs__state=RunState.FAILED)),
            n_invalidated=Count("runs", filter=Q(runs__state=RunState.INVALIDATED)),
            n_queued=Count("runs", filter=Q(runs__state=RunState.QUEUED)),
        )
        .order_by("-created_at")
    )


def sweep_runs(sweep: Sweep) -> QuerySet[Run]:
    """All runs of a sweep with their metrics (one query), in grid order, without the heavy
    columns (HEAVY_RUN_COLUMNS, HEAVY_METRICS_COLUMNS; reading one costs a query per run)."""
    return (Run.objects.filter(sweep=sweep).select_related("metrics", "lossless").order_by(*GRID_ORDER)
            .defer(*HEAVY_RUN_COLUMNS, *(f"metrics__{c}" for c in HEAVY_METRICS_COLUMNS)))


def _selection(qs: QuerySet[Run], tp: Iterable[int] = (), concurrency: Iterable[int] = (),
               output_len: Iterable[int] = (), methods: Iterable[str] = (),
               configs: Iterable[tuple[str, int | None, int | None]] = (),
               host: Iterable[str] = ()) -> QuerySet[Run]:
    """`qs` narrowed to the given TP degrees, concurrency levels, output lengths and host names
    (each: any of the values; empty: all), and to runs whose method is one of `methods` or whose
    (method, num_speculative_tokens, tree_budget) is one of `configs` (both empty: all)."""
    tp, concurrency, output_len, host = list(tp), list(concurrency), list(output_len), list(host)
    if host:
        qs = qs.filter(host__name__in=host)
    if tp:
        qs = qs.filter(tp__in=tp)
    if concurrency:
        qs = qs.filter(concurrency__in=concurrency)
    if output_len:
        qs = qs.filter(output_len__in=output_len)
    q = Q()
    for m in methods:
        q |= Q(method=m)
    for m, k, b in configs:
        q |= Q(method=m, num_speculative_tokens=k, tree_budget=b)
    return qs.filter(q) if q else qs


def figure_points(sweep_id: int, figures: Sequence[str], prices: dict[str, float | None] | None = None,
                  **selection: Any) -> list[Point]:
    """Points of a sweep's counted runs for its figures, with the figures named in `figures`
    (WindowMetrics fields) and, given `prices` (`gpu_prices()`), the priced ones
    (`load_points`), in grid order (`Point.grid_key`). No hardware fingerprint ("").

    `selection`: keyword filters of `_selection` (tp, concurrency, output_len, methods, configs,
    host). Read from the sweep's stored summary (`SweepSummary`, one query; a host filter one more
    for the host ids), else from its runs (`load_points`, one more query); the same points
    either way. Raises KeyError naming a figure that is not in the schema."""
    # sorted here, not by the database: PostgreSQL's sort of thousands of rows on the text column
    # `method` under the database's collation took a third of the query (issue 9, 100k runs)
    stored = _summaries([sweep_id], figures)
    if sweep_id in stored:
        points = _summary_points(stored[sweep_id], figures, keep=_selection_mask(stored[sweep_id], **selection),
                                 prices=prices)
    else:
        qs = _selection(Run.objects.counted().filter(sweep_id=sweep_id), **selection).order_by()
        points = load_points(qs, figures, prices=prices)
    points.sort(key=Point.grid_key)
    return points


def category_figures(sweep_id: int, run_ids: Iterable[int] | None = None) -> dict[int, list[dict[str, Any]]]:
    """{run id: its figures per prompt category (RunMetrics.categories)} of the sweep's counted
    runs whose dataset is not random (`run_ids`: only these, which must be counted runs of the
    sweep: the page's points), runs without categories left out. One query; {} for a sweep on
    random prompts."""
    if run_ids is not None:  # the caller's counted points of this sweep: no join needed
        qs = RunMetrics.objects.filter(run_id__in=list(run_ids), run__sweep_id=sweep_id)
    else:
        qs = RunMetrics.objects.filter(run__in=Run.objects.counted().filter(sweep_id=sweep_id)
                                       .exclude(dataset="random"))
    return {rid: cats for rid, cats in qs.values_list("run_id", "categories") if cats}


def sweep_dimensions(sweep_id: int) -> list[dict[str, Any]]:
    """The distinct grid axes (benchkit.point.AXIS_FIELDS: TP, decoding configuration,
    concurrency, output and input length) of a sweep's counted runs, one dict each (one query):
    what its filters can choose from. From the sweep's stored summary when it has one."""
    stored = _summaries([sweep_id], (), AXIS_FIELDS)
    if sweep_id in stored:
        cols = stored[sweep_id]
        keys = dict.fromkeys(zip(*(cols[f] for f in AXIS_FIELDS), strict=True))
        return [dict(zip((_column(f) for f in AXIS_FIELDS), key, strict=True)) for key in keys]
    return list(Run.objects.counted().filter(sweep_id=sweep_id).values(*(_column(f) for f in AXIS_FIELDS))
                .distinct().order_by())


_AXES = attrgetter(*AXIS_FIELDS)


def dimensions_of(points: list[Point]) -> list[dict[str, Any]]:
    """`sweep_dimensions` read off already loaded points (no query): equal to it when `points`
    are every counted run of the sweep (`figure_points` without a selection)."""
    keys = dict.fromkeys(map(_AXES, points))
    return [dict(zip(AXIS_FIELDS, key, strict=True)) for key in keys]


def config_state_counts(sweep_id: int) -> list[dict[str, Any]]:
    """{the decoding fields (benchkit.point.DECODING_FIELDS), tp, state, n}: runs of a sweep per
    configuration, TP degree and state (one GROUP BY query)."""
    return list(Run.objects.filter(sweep_id=sweep_id)
                .values(*DECODING_FIELDS, "tp", "state")
                .annotate(n=Count("id")).order_by())


def failure_counts(sweep_id: int) -> dict[str, int]:
    """{failure reason: number of failed runs} of a sweep, most frequent first (one query)."""
    rows = (Run.objects.filter(sweep_id=sweep_id, state=RunState.FAILED).values("failure_reason")
            .annotate(n=Count("id")).order_by("-n", "failure_reason"))
    return {r["failure_reason"] or "unknown": r["n"] for r in rows}


def run_list(sweep_id: int, metric_fields: Sequence[str], state: str = "", **selection: Any) -> QuerySet[Run]:
    """A sweep's runs for a paginated list, in grid order: the light columns of the run plus the
    named metric fields (nothing heavy), narrowed as `_selection` and to `state` when given."""
    qs = _selection(Run.objects.filter(sweep_id=sweep_id), **selection)
    if state:
        qs = qs.filter(state=state)
    return (qs.select_related("metrics", "host").order_by(*GRID_ORDER)
            .only("id", "sweep_id", "host__name", "method", "num_speculative_tokens", "tree_budget", "tp",
                  "concurrency", "output_len", "repeat_index", "gpus", "gpus_cross_numa", "state", "failure_reason",
                  "failure_message", "suspect", "suspect_reasons", "metrics__id",
                  *(f"metrics__{f}" for f in metric_fields)))


def report_runs(sweep_id: int) -> QuerySet[Run]:
    """Every run of a sweep for its report (analysis.report), in grid order, with its host: the
    light columns, the argv and server environment (exact command lines), failure, invalidation
    and suspect marks, the engine build's provenance; no metrics, no heavy column (one query)."""
    return (Run.objects.filter(sweep_id=sweep_id).select_related("host").order_by(*GRID_ORDER)
            .only("id", "sweep_id", "host__name", "engine", "engine_build", "engine_version", "engine_commit",
                  "provenance", "model", "drafter", "is_demo_model", "method", "num_speculative_tokens",
                  "tree_budget", "tp", "gpus", "gpus_cross_numa", "concurrency", "request_rate", "input_len",
                  "output_len", "num_prompts", "dataset", "temperature", "seed", "repeat_index", "state",
                  "failure_reason", "failure_message", "invalidated_reason", "suspect", "suspect_reasons", "argv",
                  "server_env"))


def sweep_hosts(sweep_id: int) -> list[str]:
    """Names of the hosts a sweep's runs are on, sorted (one query)."""
    return list(Run.objects.filter(sweep_id=sweep_id).order_by("host__name").values_list("host__name", flat=True)
                .distinct())


def counted_points(runs, prices: dict[str, float | None] | None = None) -> list[Point]:
    """Points of the counted runs among `runs` (Run rows already loaded with their metrics, in
    order; only succeeded runs with metrics feed charts and speedups: `Run.counts`), with every
    WindowMetrics figure and, given `prices` (`gpu_prices()`), the priced ones: the rows
    `load_points` would read, built the same way (`_points_of`); no hardware fingerprint ("")."""
    figures = tuple(METRICS)

    def lossless(r: Run) -> tuple:
        check = getattr(r, "lossless", None)  # no row: RelatedObjectDoesNotExist, an AttributeError
        return tuple(getattr(check, c, None) for c in _LOSSLESS_COLUMNS.values())

    rows = ((*(getattr(r, _column(f)) for f in _STORED_FIELDS), *lossless(r), json.dumps(r.gpus), "",
             *(getattr(r.metrics, f) for f in figures)) for r in runs if r.counts)
    return _points_of(rows, figures, dated=None, prices=prices)


def gpu_prices() -> dict[str, float | None]:
    """{GPU model name (NVML name): USD per GPU-hour, None where the admin left it empty}."""
    return {name: None if price is None else float(price)
            for name, price in GpuPrice.objects.values_list("gpu_name", "usd_per_gpu_hour")}


def _price(names: Iterable[str], table: dict[str, float | None] | None) -> float | None:
    """The price per GPU-hour of GPUs named `names`: None for no GPU, a GPU without a name, GPUs
    of different models, or no price set for the model (no cost figure then, never a guess).
    `table`: `gpu_prices()`, read here (one query) when None and a price is needed."""
    distinct = set(names)
    if len(distinct) != 1 or "" in distinct:
        return None
    return (table if table is not None else gpu_prices()).get(distinct.pop())


def price_for(run: Run, prices: dict[str, float | None] | None = None) -> float | None:
    """The USD price per GPU-hour of `run`'s GPU model (`Run.gpus[*].name`): None when the run
    has no GPUs, a GPU without a name, GPUs of different models, or no price set for its model.
    `prices`: the table of `gpu_prices()` when the caller prices many runs (else one query)."""
    return _price((g.get("name") or "" for g in run.gpus or [] if isinstance(g, dict)), prices)


def cost_of(run: Run, m: RunMetrics | WindowMetrics | None,
            prices: dict[str, float | None] | None = None) -> tuple[float | None, float | None]:
    """(USD per million output tokens, the USD per GPU-hour it used) of `run` at today's price
    (benchkit.measure.efficiency.cost_usd_per_m_output_tokens over the window's duration and
    output tokens, G = the run's GPUs); (None, price) when a figure is missing."""
    price = price_for(run, prices)
    if m is None:
        return None, price
    return _cost(price, len(run.gpus or []), m.duration_s, m.total_output_tokens), price


def _cost(price: float | None, n_gpus: int, duration_s: float | None, output_tokens: int | None) -> float | None:
    if price is None or not duration_s or not output_tokens:
        return None
    return cost_usd_per_m_output_tokens(price, n_gpus, duration_s, int(output_tokens))


#: select_related of the run page: its telemetry and log rows without their data (gpu_series).
RUN_PAGE_RELATED = ("sweep", "host", "metrics", "result_file", "gpu_telemetry", "request_logs", "outputs_blob",
                    "lossless")
RUN_PAGE_DEFERRED = ("gpu_telemetry__data", "request_logs__data", "outputs_blob__data")
#: At most this many points per trace of the run page's GPU figure.
GPU_SERIES_MAX_POINTS = 2000


def gpu_series(run: Run, max_points: int = GPU_SERIES_MAX_POINTS) -> dict[str, Any] | None:
    """The run's GPU telemetry for the run page's figure, or None when none was stored.

    {"t_s": [seconds from the window start per point (the warmup at negative x)], "window_s":
    window length (s; None without request logs), "hz", "n_ticks", "bin_ticks" (readings per
    point), "gpus": [{"index", "uuid", "name", "power_w", "sm_mhz", "util_pct" (one value per
    point, None where no reading), "throttled" (a throttle bit, gpu_validity.THROTTLE_BITS, in
    any reading of the point)}]}. With more than `max_points` ticks, consecutive readings are
    averaged in bins of ceil(n_ticks / max_points) ticks. Load the run with
    `RUN_PAGE_RELATED` (select_related, the blobs' data deferred): then a run without telemetry
    costs no query and one with telemetry one (its stream)."""
    from benchkit.measure.gpu_samples import decode_telemetry
    from benchkit.measure.gpu_validity import THROTTLE_BITS

    tele = getattr(run, "gpu_telemetry", None)  # RelatedObjectDoesNotExist is an AttributeError
    if tele is None:
        return None
    stream = decode_telemetry(bytes(tele.data))
    logs = getattr(run, "request_logs", None)
    window = (logs.window_start_ns, logs.window_end_ns) if logs is not None else None
    start_ns = window[0] if window else (stream.t_ns[0] if stream.t_ns else 0)
    n = stream.n_ticks
    size = max(1, -(-n // max_points))
    bins = [range(i, min(i + size, n)) for i in range(0, n, size)]

    def mean(col: list, scale: float = 1.0) -> list[float | None]:
        out = []
        for b in bins:
            vals = [col[i] for i in b if col[i] is not None]
            out.append(round(sum(vals) / len(vals) / scale, 3) if vals else None)
        return out

    gpus = []
    for g in stream.gpus:
        events = g.values["clock_events"]
        gpus.append({"index": g.index, "uuid": g.uuid, "name": g.name,
                     "power_w": mean(g.values["power_mw"], 1000.0), "sm_mhz": mean(g.values["sm_mhz"]),
                     "util_pct": mean(g.values["util_gpu_pct"]),
                     "throttled": [any((events[i] or 0) & THROTTLE_BITS for i in b) for b in bins]})
    return {"t_s": [round((sum(stream.t_ns[i] for i in b) / len(b) - start_ns) / 1e9, 4) for b in bins],
            "window_s": (window[1] - window[0]) / 1e9 if window else None, "hz": stream.hz, "n_ticks": n,
            "bin_ticks": size, "gpus": gpus}


def window_of(m: RunMetrics) -> WindowMetrics:
    """The stored row as benchkit's WindowMetrics (every schema column, NULL as None)."""
    return WindowMetrics(**{f.name: getattr(m, f.name) for f in METRIC_FIELDS})


def load_points(runs: QuerySet[Run], figures: Sequence[str] = (), *, gpus: bool = True,
                snapshots: dict[int, list[dict[str, Any]]] | None = None,
                prices: dict[str, float | None] | None = None) -> list[Point]:
    """The one builder of points from stored runs: the benchkit.point.Point of each run of `runs`
    (a queryset already narrowed to counted runs and ordered as the caller wants), in one query of
    exactly the columns a point needs, never the samples, spec, argv, environment or log tail:
    the point's Run columns, `gpus` (as text, decoded once per distinct value: a sweep has a
    few; `gpus=False` leaves it unread and the points without GPU UUIDs and names, for a page
    that never matches runs by GPU), and the `figures` (WindowMetrics fields) of its metrics row.

    `snapshots` ({host id: snapshots oldest first}, `snapshot_history`) gives each point the
    hardware fingerprint of its host's snapshot in force when the run started, computed by the
    database in the same query (`_fingerprint_case`) or, past FINGERPRINT_CASE_MAX changes,
    dated here from `started_at`; None: not read (""). `prices` (`gpu_prices()`) adds the priced
    figures (benchkit.point.PRICED_FIGURES; `figures` must then hold `duration_s` and
    `total_output_tokens`). Raises KeyError naming a figure that is not in the schema."""
    for f in figures:
        if f not in METRICS:
            raise KeyError(f"not a WindowMetrics field: {f!r}")
    runs = runs.annotate(gpus_text=Cast("gpus", TextField()) if gpus else Value(None, TextField()))
    case = _fingerprint_case(snapshots) if snapshots else None
    dated = None
    if case is not None:
        runs = runs.annotate(fingerprint=case)
    elif snapshots:
        runs, dated = runs.annotate(fingerprint=F("started_at")), _dated(snapshots)
    else:
        runs = runs.annotate(fingerprint=Value("", CharField()))
    rows = runs.values_list(*(_column(f) for f in _STORED_FIELDS),
                            *(f"lossless__{c}" for c in _LOSSLESS_COLUMNS.values()),
                            "gpus_text", "fingerprint", *(f"metrics__{f}" for f in figures))
    return _points_of(rows, figures, dated=dated, prices=prices)


def _dated(snapshots: dict[int, list[dict[str, Any]]]) -> Callable[[Any, int | None], str]:
    """(started_at, host id) -> the fingerprint of the host's snapshot in force then ("")."""
    times = {h: [s["taken_at"] for s in lst] for h, lst in snapshots.items()}

    def at(when: Any, host_id: int | None) -> str:
        ts = times.get(host_id)
        i = bisect.bisect_right(ts, when) if ts and when is not None else 0
        return snapshots[host_id][i - 1]["fingerprint"] if i else ""

    return at


def _points_of(rows: Iterable[Sequence[Any]], figures: Sequence[str], *,
               dated: Callable[[Any, int | None], str] | None, prices: dict[str, float | None] | None
               ) -> list[Point]:
    """Points (benchkit.point.build_points) from rows of: the _STORED_FIELDS values, the lossless
    columns (_LOSSLESS_COLUMNS, None without a LosslessCheck row), the `gpus` column as JSON text
    (None: not read), the hardware fingerprint (or, with `dated`, the start time it is dated
    from), the `figures` values. With `prices`, each point is priced."""
    n, host_at = len(_LOADED_FIELDS), _STORED_FIELDS.index("host_id")
    verdict_at, sentence_at = len(_STORED_FIELDS), n - 1
    gpus: dict[str | None, tuple] = {}
    names = (*figures, *PRICED_FIGURES) if prices is not None else tuple(figures)
    duration_at = n + 2 + figures.index("duration_s") if prices is not None else 0
    tokens_at = n + 2 + figures.index("total_output_tokens") if prices is not None else 0

    def row(r: Sequence[Any]) -> tuple:
        text = r[n]
        if text not in gpus:
            g = [x for x in ((json.loads(text) if text else None) or []) if isinstance(x, dict)]
            uuids, gnames = tuple(x.get("uuid", "") for x in g), tuple(x.get("name", "") for x in g)
            gpus[text] = (uuids, gnames, _price(gnames, prices) if prices is not None else None)
        uuids, gnames, price = gpus[text]
        fp = r[n + 1] if dated is None else dated(r[n + 1], r[host_at])
        head = (*r[:verdict_at], r[verdict_at] or "", *r[verdict_at + 1:sentence_at], r[sentence_at] or "")
        if prices is None:
            return (*head, uuids, gnames, fp, *r[n + 2:])
        cost = _cost(price, len(uuids), r[duration_at], r[tokens_at])
        return (*head, uuids, gnames, fp, *r[n + 2:], cost, price)

    return build_points((*_LOADED_FIELDS, "gpu_uuids", "gpu_names", "hardware_fingerprint"), names, map(row, rows))


def state_counts(sweep: Sweep) -> dict[str, int]:
    """{state: count} for a sweep, every state present (zeros included)."""
    rows = Run.objects.filter(sweep=sweep).values("state").annotate(n=Count("id")).values_list("state", "n")
    counts = dict(rows)
    return {s.value: counts.get(s.value, 0) for s in RunState}


def sweep_progress(sweep: Sweep) -> dict:
    """Live progress of a sweep: state counts, finished/total runs, and the active run's progress."""
    counts = state_counts(sweep)
    total = sum(counts.values())
    finished = counts[RunState.SUCCEEDED] + counts[RunState.FAILED] + counts[RunState.INVALIDATED]
    return {"sweep": sweep.pk, "total": total, "finished": finished, "counts": counts,
            "active": active_run(sweep.pk)}


def active_run(sweep_id: int) -> dict[str, Any] | None:
    """{id, state, progress_done, progress_total, method, concurrency} of a run of the sweep
    that is executing now (lowest id), or None."""
    return (Run.objects.filter(sweep_id=sweep_id, state__in=ACTIVE_STATES)
            .values("id", "state", "progress_done", "progress_total", "method", "concurrency").order_by("id").first())


def failure_reasons(sweep: Sweep) -> list[tuple[str, int, str]]:
    """(failure reason, how many runs, the first such run's message) for the sweep's failed runs,
    most frequent first (two queries, bounded by the number of distinct reasons)."""
    rows = (Run.objects.filter(sweep=sweep, state=RunState.FAILED).values("failure_reason")
            .annotate(n=Count("id"), first=Min("id")).order_by("-n", "failure_reason"))
    rows = list(rows)
    messages = dict(Run.objects.filter(pk__in=[r["first"] for r in rows]).values_list("id", "failure_message"))
    return [(r["failure_reason"], r["n"], messages.get(r["first"], "")) for r in rows]


def latest_inventory(host: Host) -> HostInventory | None:
    """The host's most recent inventory (benchkit.hosts.inventory.HostInventory), or None if it
    was never recorded."""
    snap = HardwareSnapshot.objects.filter(host=host).order_by("-taken_at").only("data").first()
    return HostInventory.from_dict(snap.data) if snap else None


def latest_snapshot(host: Host) -> HardwareSnapshot | None:
    """The host's newest hardware snapshot with its GPUs prefetched, or None."""
    return HardwareSnapshot.objects.filter(host=host).prefetch_related("gpus").order_by("-taken_at").first()


def recent_snapshots(host: Host, limit: int = 50) -> list[HardwareSnapshot]:
    """The host's newest `limit` snapshots, newest first, with the columns the host page lists
    (one query: `host` is loaded too, else Django's related manager fetches it per row)."""
    return list(HardwareSnapshot.objects.filter(host=host).order_by("-taken_at")
                .only("host", "taken_at", "fingerprint", "changed", "gpu_count", "gpu_name", "driver_version")[:limit])


# --- nightly series: compare, trend, regressions, home page ---------------------------------------
# A series is the sweeps of one name on one host (a sweep file's `name`, run night after night),
# oldest first; every query below reads a bounded set of sweeps through the index
# `sweep_series_latest` and the runs of those sweeps only (`run_sweep_state`), never all runs.

#: At most this many snapshots per host are read to date runs' hardware fingerprints.
SNAPSHOT_HISTORY_CAP = 1000


def series_sweeps(host_id: int, name: str, until: Sweep | None = None, limit: int = 30,
                  include_demo: bool = True) -> list[Sweep]:
    """The last `limit` sweeps (nights) of the series (host, name), oldest first, up to and
    including `until` (default: the newest). One query; only the columns pages need."""
    qs = Sweep.objects.filter(host_id=host_id, name=name)
    if until is not None:
        qs = qs.filter(Q(created_at__lt=until.created_at) | Q(created_at=until.created_at, pk__lte=until.pk))
    if not include_demo:
        qs = qs.filter(is_demo=False)
    rows = list(qs.order_by("-created_at", "-pk").only("id", "name", "host_id", "created_at", "is_demo", "source")
                [:limit])
    return rows[::-1]


def previous_in_series(sweep: Sweep) -> Sweep | None:
    """The sweep of the same series just before `sweep`, or None (one query)."""
    prev = series_sweeps(sweep.host_id, sweep.name, until=sweep, limit=2)
    return prev[0] if len(prev) == 2 else None


def latest_per_series(limit: int = 50) -> list[Sweep]:
    """The newest sweep of each series (host, name), newest first, at most `limit`, with its
    host (two queries over the sweep table only: ids, then rows)."""
    ids = (Sweep.objects.values("host_id", "name").annotate(latest=Max("id")).order_by("-latest")
           .values_list("latest", flat=True)[:limit])
    return list(Sweep.objects.filter(pk__in=list(ids)).select_related("host").order_by("-created_at", "-pk"))


def state_counts_by_sweep(sweep_ids: list[int]) -> dict[int, dict[str, int]]:
    """{sweep id: {state: count}} with every state present (zeros included); one grouped query
    over the `run_sweep_state` index of those sweeps only."""
    out = {sid: {s.value: 0 for s in RunState} for sid in sweep_ids}
    for sid, state, n in (Run.objects.filter(sweep_id__in=sweep_ids).values("sweep_id", "state")
                          .annotate(n=Count("id")).values_list("sweep_id", "state", "n")):
        out[sid][state] = n
    return out


def snapshot_history(host_ids: Iterable[int] | QuerySet) -> dict[int, list[dict[str, Any]]]:
    """{host id: snapshots oldest first}, each {taken_at, fingerprint, changed, driver_version,
    cuda_version, gpu_name, gpu_count}; the newest SNAPSHOT_HISTORY_CAP per host (one query;
    `host_ids` may be a queryset of host ids, read as a subquery). A host without snapshots
    maps to [] when named in a list, and is absent when `host_ids` is a queryset."""
    if isinstance(host_ids, QuerySet):
        out: dict[int, list[dict[str, Any]]] = {}
    else:
        out = {h: [] for h in host_ids}
        if not out:
            return out
        host_ids = list(out)
    rows = (HardwareSnapshot.objects.filter(host_id__in=host_ids).order_by("host_id", "-taken_at")
            .values("host_id", "taken_at", "fingerprint", "changed", "driver_version", "cuda_version", "gpu_name",
                    "gpu_count"))
    for r in rows:
        lst = out.setdefault(r.pop("host_id"), [])
        if len(lst) < SNAPSHOT_HISTORY_CAP:
            lst.append(r)
    for lst in out.values():
        lst.reverse()
    return out


def fingerprint_at(snapshots: list[dict[str, Any]], when) -> str:
    """The fingerprint of the newest snapshot taken at or before `when` (snapshots oldest
    first, as `snapshot_history` gives them); "" when there is none (or `when` is None)."""
    if when is None or not snapshots:
        return ""
    times = [s["taken_at"] for s in snapshots]
    i = bisect.bisect_right(times, when)
    return snapshots[i - 1]["fingerprint"] if i else ""


#: Most fingerprint changes turned into one SQL CASE by `history_points` (beyond: dated in Python).
FINGERPRINT_CASE_MAX = 64


def _fingerprint_case(snapshots: dict[int, list[dict[str, Any]]]) -> Case | None:
    """A CASE expression giving each run the fingerprint of its host's snapshot in force when it
    started (the newest taken at or before `started_at`; "" when none, or no start time), built
    from the points where a host's fingerprint changes (snapshots oldest first, as
    `snapshot_history` gives them). None when there are more than FINGERPRINT_CASE_MAX such points."""
    whens = []
    for host_id, snaps in snapshots.items():
        changes = [s for i, s in enumerate(snaps) if i == 0 or s["fingerprint"] != snaps[i - 1]["fingerprint"]]
        whens += [When(host_id=host_id, started_at__gte=s["taken_at"], then=Value(s["fingerprint"]))
                  for s in reversed(changes)]  # newest first: the first that holds wins
    if len(whens) > FINGERPRINT_CASE_MAX:
        return None
    return Case(*whens, default=Value(""), output_field=CharField())


def history_points(sweep_ids: list[int], figures: Sequence[str], filters: dict[str, list] | None = None,
                   snapshots: dict[int, list[dict[str, Any]]] | None = None, gpus: bool = True) -> list[Point]:
    """Points of the counted runs of the sweeps `sweep_ids` with the figures `figures`, in (sweep,
    id) order (one query of their stored summaries, `SweepSummary`; the sweeps without one from
    their runs, `load_points`: one more query; with `filters` over more than
    SUMMARY_FILTERED_MAX_SWEEPS sweeps, from the runs only: one query). The hardware
    fingerprint of each is its host's snapshot in force when it started: given `snapshots`,
    computed in the same query (or from the summary's start times); None: from one more query
    (`snapshot_history` of the runs' hosts); `snapshots={}` skips it (""). `gpus=False`:
    no GPU UUIDs or names (a page that never matches runs by GPU). `filters`: point field ->
    allowed values, for the fields of benchkit.point.FILTER_FIELDS; ValueError for another."""
    qs = Run.objects.counted().filter(sweep_id__in=sweep_ids)
    for name, allowed in (filters or {}).items():
        if name in FILTER_FIELDS:
            qs = qs.filter(**{f"{_column(name)}__in": allowed})
    for name in filters or {}:
        if name not in FILTER_FIELDS:
            raise ValueError(f"unknown history filter {name!r}: use {', '.join(FILTER_FIELDS)}")
    # a filtered read of many sweeps (the trend page: 30 nights, a few workloads) reads only the
    # chosen runs through the index `run_history_workload`; a summary would decode every run
    summarised = filters is None or not filters or len(sweep_ids) <= SUMMARY_FILTERED_MAX_SWEEPS
    stored = _summaries(sweep_ids, figures) if summarised else {}
    if snapshots is None:
        snapshots = snapshot_history(Run.objects.filter(sweep_id__in=sweep_ids).values("host_id"))
    missing = [pk for pk in sweep_ids if pk not in stored]
    points = load_points(qs.filter(sweep_id__in=missing).order_by("sweep_id", "id"), figures, gpus=gpus,
                         snapshots=snapshots) if missing else []
    for pk in sorted(stored):
        cols = stored[pk]
        points += _summary_points(cols, figures, keep=_filter_mask(cols, filters or {}), gpus=gpus,
                                  snapshots=snapshots)
    if missing and stored:
        points.sort(key=_SWEEP_RUN)
    return points


def facet_values(sweep_ids: list[int]) -> dict[str, list]:
    """{filter field (benchkit.point.FILTER_FIELDS): sorted distinct values} over the counted runs
    of `sweep_ids` (their stored summaries, one query; the sweeps without one: one grouped query on
    their runs)."""
    stored = _summaries(sweep_ids, (), FILTER_FIELDS)
    rows: list = []
    for cols in stored.values():
        rows += dict.fromkeys(zip(*(cols[f] for f in FILTER_FIELDS), strict=True))
    missing = [pk for pk in sweep_ids if pk not in stored]
    if missing:
        rows += (Run.objects.counted().filter(sweep_id__in=missing).order_by()
                 .values_list(*(_column(f) for f in FILTER_FIELDS)).distinct())
    out: dict[str, set] = {f: set() for f in FILTER_FIELDS}
    for r in rows:
        for f, v in zip(FILTER_FIELDS, r, strict=True):
            out[f].add(v)
    return {c: sorted(v) for c, v in out.items()}


def open_regression_flags(limit: int = 50) -> list[RegressionFlag]:
    """Unacknowledged regression flags, newest first, with their sweep and host (one query over
    the partial index `regression_open`)."""
    return list(RegressionFlag.objects.filter(acknowledged_at__isnull=True).select_related("sweep", "host")
                .order_by("-detected_at", "-pk")[:limit])


def series_regression_flags(host_id: int, name: str, sweep_ids: list[int]) -> list[RegressionFlag]:
    """The series' flags (open and acknowledged) raised on the nights `sweep_ids` (one query)."""
    return list(RegressionFlag.objects.filter(host_id=host_id, series=name, sweep_id__in=sweep_ids)
                .order_by("sweep_id", "tp", "concurrency", "label"))
def hosts_with_workers(now: datetime | None = None) -> QuerySet[Host]:
    """Hosts by name, each annotated `worker_alive`: its worker's last heartbeat
    (`Host.worker_seen_at`, written by runs.worker) is at most DRAFTBOARD_HEARTBEAT_TIMEOUT_S
    seconds old. One query."""
    cutoff = (now or timezone.now()) - timedelta(seconds=settings.DRAFTBOARD_HEARTBEAT_TIMEOUT_S)
    alive = Case(When(worker_seen_at__gte=cutoff, then=Value(True)), default=Value(False), output_field=BooleanField())
    return Host.objects.annotate(worker_alive=alive).order_by("name")


def scheduler_status(now: datetime | None = None) -> dict[str, Any]:
    """Celery beat's last sign of life: the newest runs.models.SchedulerHeartbeat (written by
    runs.scheduler.ResilientScheduler every few seconds while it reaches the database). Returns
    {"alive": its beat_at is at most DRAFTBOARD_HEARTBEAT_TIMEOUT_S seconds before `now`,
    "seen_at": that beat_at (aware datetime), "name": "node:pid", "outages": database outages it
    rode out, "last_outage": their last one's description}; with no row ever written, alive
    False and seen_at / name None. One query."""
    hb = SchedulerHeartbeat.objects.order_by("-beat_at", "-pk").first()
    if hb is None:
        return {"alive": False, "seen_at": None, "name": None, "outages": 0, "last_outage": ""}
    cutoff = (now or timezone.now()) - timedelta(seconds=settings.DRAFTBOARD_HEARTBEAT_TIMEOUT_S)
    return {"alive": hb.beat_at >= cutoff, "seen_at": hb.beat_at, "name": hb.name, "outages": hb.outages,
            "last_outage": hb.last_outage}


def open_change_points(limit: int = 50) -> list[ChangePoint]:
    """Unacknowledged change points, newest first, with their sweep and host (one query over the
    partial index `change_point_open`)."""
    return list(ChangePoint.objects.filter(acknowledged_at__isnull=True).select_related("sweep", "host")
                .order_by("-detected_at", "-pk")[:limit])


def series_change_points(host_id: int, name: str, sweep_ids: list[int]) -> list[ChangePoint]:
    """The series' change points (open and acknowledged) on the nights `sweep_ids` (one query)."""
    return list(ChangePoint.objects.filter(host_id=host_id, series=name, sweep_id__in=sweep_ids)
                .order_by("sweep_id", "tp", "concurrency", "label"))


def point_acceptance_history(sweep_ids: list[int], point_key: str) -> list[Point]:
    """The counted runs of point `point_key` (Point.identity_hash) on the nights `sweep_ids`, with
    tau and the per-position acceptance rates, in (sweep, id) order (one query over those sweeps'
    runs; the key is matched here)."""
    pts = history_points(sweep_ids, ("acceptance_length", "per_position_acceptance_rate"), snapshots={}, gpus=False)
    return [p for p in pts if p.identity_hash() == point_key]
# --- stored per-sweep point summaries (issue 22) -----------------------------------------------
# A SweepSummary row and its SweepSummaryColumn rows hold, per column, the values `load_points`
# reads of each counted run of one sweep (run-id order); the readers above take the sweep's
# points from the columns they need in one query and never touch the runs. Written by
# runs.services.summaries (the codec is here: the read side owns it).

#: Most sweeps a filtered `history_points` reads from their summaries (more: from the runs).
SUMMARY_FILTERED_MAX_SWEEPS = 2
#: Format of a stored summary (SweepSummary.format): a summary of another format (or missing a
#: column a reader needs, e.g. a figure added to the schema since it was built) is ignored and
#: the sweep read from its runs.
SUMMARY_FORMAT = 1
#: The summary's columns: the point's Run columns (point field names), its lossless group, the
#: `gpus` column as JSON text, the start time (microseconds since the epoch, None when unknown)
#: and every WindowMetrics figure.
SUMMARY_COLUMNS = (*_LOADED_FIELDS, "gpus_text", "started_at_us", *METRICS)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SWEEP_RUN = attrgetter("sweep_id", "run_id")


def summary_columns(sweep_id: int) -> dict[str, list]:
    """{SUMMARY_COLUMNS entry: [value per counted run of the sweep, in id order]} read live from
    the runs (one query): what `runs.services.summaries` stores and `figure_points` /
    `history_points` read back."""
    qs = Run.objects.counted().filter(sweep_id=sweep_id).order_by("id").annotate(
        gpus_text=Cast("gpus", TextField()))
    rows = list(qs.values_list(*(_column(f) for f in _STORED_FIELDS),
                               *(f"lossless__{c}" for c in _LOSSLESS_COLUMNS.values()),
                               "gpus_text", "started_at", *(f"metrics__{f}" for f in METRICS)))
    cols = dict(zip(SUMMARY_COLUMNS, (list(c) for c in zip(*rows, strict=True)), strict=True)) if rows else {
        c: [] for c in SUMMARY_COLUMNS}
    cols["started_at_us"] = [None if t is None else _to_us(t) for t in cols["started_at_us"]]
    return cols


def _to_us(t: datetime) -> int:
    return (t - _EPOCH) // timedelta(microseconds=1)


def pack_summary(cols: dict[str, list]) -> dict[str, bytes]:
    """`summary_columns` as stored: {column: zlib (level 1) over marshal of its list} (values are
    None, bool, int, float, str or lists of those), one SweepSummaryColumn row each, so that a
    reader fetches and decodes only the columns it reads. Raises ValueError for a value marshal
    cannot hold."""
    return {c: zlib.compress(marshal.dumps(v), 1) for c, v in cols.items()}


class SummaryColumns(dict):
    """Packed summary columns ({column: bytes}, `pack_summary`) read as {column: list}, each
    decoded when first read."""

    def __missing__(self, name: str) -> list:
        value = marshal.loads(zlib.decompress(self._packed[name]))  # noqa: S302 (written by pack_summary)
        self[name] = value
        return value

    def __contains__(self, name: object) -> bool:
        return name in self._packed

    def __init__(self, packed: dict[str, bytes]) -> None:
        super().__init__()
        self._packed = packed


def _summaries(sweep_ids: Iterable[int], figures: Sequence[str], columns: Sequence[str] = ()
               ) -> dict[int, SummaryColumns]:
    """{sweep id: columns} of the stored summaries (of SUMMARY_FORMAT) of `sweep_ids` with the
    columns `columns` (default: the point's, the start time and `figures`), fetching those
    columns only (one query); a sweep without a usable summary is absent (read from its runs).
    KeyError for a figure outside the schema."""
    for f in figures:
        if f not in METRICS:
            raise KeyError(f"not a WindowMetrics field: {f!r}")
    names = set(columns or (*_LOADED_FIELDS, "gpus_text", "started_at_us", *figures))
    packed: dict[int, dict[str, bytes]] = {}
    for pk, name, data in (SweepSummaryColumn.objects.filter(summary_id__in=list(sweep_ids), name__in=names,
                                                             summary__format=SUMMARY_FORMAT)
                           .values_list("summary_id", "name", "data")):
        packed.setdefault(pk, {})[name] = bytes(data)
    return {pk: SummaryColumns(cols) for pk, cols in packed.items() if names <= cols.keys()}


def _selection_mask(cols: dict[str, list], tp: Iterable[int] = (), concurrency: Iterable[int] = (),
                    output_len: Iterable[int] = (), methods: Iterable[str] = (),
                    configs: Iterable[tuple[str, int | None, int | None]] = (),
                    host: Iterable[str] = ()) -> list[bool] | None:
    """`_selection` over a summary's columns: True per run it keeps (None: every run). A host
    filter reads the hosts' ids (one query)."""
    n = len(cols["run_id"])
    keep = [True] * n
    tests: list[tuple[str, set]] = []
    host = list(host)
    if host:
        tests.append(("host_id", set(Host.objects.filter(name__in=host).values_list("id", flat=True))))
    for name, values in (("tp", tp), ("concurrency", concurrency), ("output_len", output_len)):
        values = set(values)
        if values:
            tests.append((name, values))
    for name, values in tests:
        keep = [k and v is not None and v in values for k, v in zip(keep, cols[name], strict=True)]
    methods, configs = set(methods), set(configs)
    if methods or configs:
        keep = [k and (m in methods or (m, nk, b) in configs) for k, m, nk, b in
                zip(keep, cols["method"], cols["num_speculative_tokens"], cols["tree_budget"], strict=True)]
    return keep if tests or methods or configs else None


def _filter_mask(cols: dict[str, list], filters: dict[str, list]) -> list[bool] | None:
    """`history_points`' filters over a summary's columns (None: every run)."""
    if not filters:
        return None
    keep = [True] * len(cols["run_id"])
    for name, allowed in filters.items():
        values = set(allowed)
        keep = [k and v is not None and v in values for k, v in zip(keep, cols[name], strict=True)]
    return keep


def _summary_points(cols: dict[str, list], figures: Sequence[str], *, keep: list[bool] | None,
                    gpus: bool = True, snapshots: dict[int, list[dict[str, Any]]] | None = None,
                    prices: dict[str, float | None] | None = None) -> list[Point]:
    """The points `load_points` makes (the same values as `_points_of` gives them), from a
    summary's columns: the runs `keep` marks (None: all), in id order, with `figures`, the
    hardware fingerprint dated from the start time given `snapshots`, GPUs unless `gpus` is
    False, priced given `prices`. Works a column at a time (no function call per row)."""

    def sel(name: str) -> list:
        col = cols[name]
        return col if keep is None else list(itertools.compress(col, keep))

    columns = [sel(c) for c in _LOADED_FIELDS]
    m = len(columns[0])
    for at in (len(_STORED_FIELDS), len(_LOADED_FIELDS) - 1):  # verdict, sentence: "" without a verdict
        columns[at] = [v or "" for v in columns[at]]
    texts = sel("gpus_text") if gpus else [None] * m
    decoded: dict[str | None, tuple] = {}
    for text in set(texts):
        g = [x for x in ((json.loads(text) if text else None) or []) if isinstance(x, dict)]
        uuids, gnames = tuple(x.get("uuid", "") for x in g), tuple(x.get("name", "") for x in g)
        decoded[text] = (uuids, gnames, _price(gnames, prices) if prices is not None else None)
    per_run = [decoded[t] for t in texts]
    columns += [[d[0] for d in per_run], [d[1] for d in per_run]]
    if snapshots:
        at = _dated(snapshots)
        dates: dict[tuple, str] = {}
        keys = list(zip(sel("started_at_us"), columns[_STORED_FIELDS.index("host_id")], strict=True))
        for us, host_id in set(keys):
            dates[us, host_id] = at(None if us is None else _EPOCH + timedelta(microseconds=us), host_id)
        columns.append([dates[key] for key in keys])
    else:
        columns.append([""] * m)
    columns += [sel(f) for f in figures]
    names = tuple(figures)
    if prices is not None:
        duration, tokens = sel("duration_s"), sel("total_output_tokens")
        columns.append([_cost(d[2], len(d[0]), dur, tok)
                        for d, dur, tok in zip(per_run, duration, tokens, strict=True)])
        columns.append([d[2] for d in per_run])
        names += PRICED_FIGURES
    return build_points((*_LOADED_FIELDS, "gpu_uuids", "gpu_names", "hardware_fingerprint"), names,
                        zip(*columns, strict=True))
