"""Read-side queries of the runs app. Each returns plain querysets or dicts; no writes."""

from __future__ import annotations

import bisect
import functools
import json
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from operator import itemgetter
from typing import Any

from django.conf import settings
from django.db.models import BooleanField, Case, CharField, Count, Max, Min, Q, QuerySet, TextField, Value, When
from django.db.models.functions import Cast
from django.utils import timezone

from benchkit.hosts.inventory import HostInventory
from benchkit.measure.efficiency import cost_usd_per_m_output_tokens
from benchkit.measure.metrics import METRIC_FIELDS, METRICS, WindowMetrics
from benchkit.methods import method_label
from runs.models import (
    ACTIVE_STATES,
    GpuPrice,
    HardwareSnapshot,
    Host,
    RegressionFlag,
    Run,
    RunMetrics,
    RunState,
    Sweep,
)

#: Columns that list and figure pages never need and that are heavy to fetch and decode: the run
#: page's samples (~150 KB of JSON per run), the full RunSpec, the server environment and the
#: 20 KB server-log tail. Only the run page and recompute read them.
HEAVY_RUN_COLUMNS = ("spec", "server_env", "server_log_tail")
HEAVY_METRICS_COLUMNS = ("distributions", "definitions", "extra")
#: Run columns of a point dict (`figure_points`): what speedup matching and the figures read.
_POINT_COLUMNS = ("id", "host_id", "engine", "engine_version", "engine_build", "model", "gpus", "tp", "dataset",
                  "input_len", "output_len", "concurrency", "request_rate", "temperature", "seed", "method",
                  "num_speculative_tokens", "tree_budget", "drafter", "repeat_index")
#: Grid order of a sweep's runs.
GRID_ORDER = ("tp", "method", "num_speculative_tokens", "tree_budget", "concurrency", "output_len", "id")


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
    return (Run.objects.filter(sweep=sweep).select_related("metrics").order_by(*GRID_ORDER)
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


def figure_points(sweep_id: int, metric_fields: Sequence[str], **selection: Any) -> list[dict[str, Any]]:
    """Point dicts of a sweep's counted runs for figures, in one query of exactly the columns
    they need: the shape of `point_from_run` (match and configuration fields, `run_id`,
    `label`, `repeat_index`) with only the WindowMetrics fields named in `metric_fields`.

    `selection`: keyword filters of `_selection` (tp, concurrency, output_len, methods,
    configs). Raises KeyError naming a metric field that is not in the schema. Grid order
    (`_grid_key`)."""
    for f in metric_fields:
        if f not in METRICS:
            raise KeyError(f"not a WindowMetrics field: {f!r}")
    # sorted here, not by the database: PostgreSQL's sort of thousands of rows on the text column
    # `method` under the database's collation took a third of the query (issue 9, 100k runs)
    qs = _selection(Run.objects.counted().filter(sweep_id=sweep_id), **selection).order_by()
    # the GPU list as its stored text, decoded once per distinct value (a sweep has a few)
    cols = [c for c in _POINT_COLUMNS if c not in ("id", "gpus")]
    rows = qs.annotate(gpus_text=Cast("gpus", TextField())).values_list(
        "id", "gpus_text", *cols, *(f"metrics__{f}" for f in metric_fields))
    uuids: dict[str | None, tuple[str, ...]] = {}
    names: dict[str | None, tuple[str, ...]] = {}
    labels: dict[tuple, str] = {}
    points = []
    n = 2 + len(cols)
    for r in rows:
        text = r[1]
        if text not in uuids:
            gpus = (json.loads(text) if text else None) or []
            uuids[text] = tuple(g.get("uuid", "") for g in gpus)
            names[text] = tuple(g.get("name", "") for g in gpus)
        p = dict(zip(cols, r[2:n], strict=True))
        cfg = (p["method"], p["num_speculative_tokens"], p["tree_budget"])
        if cfg not in labels:
            labels[cfg] = method_label(*cfg)
        p["run_id"], p["gpu_uuids"], p["gpu_names"], p["label"] = r[0], uuids[text], names[text], labels[cfg]
        p.update(zip(metric_fields, r[n:], strict=True))
        points.append(p)
    points.sort(key=_grid_key)
    return points


def _grid_key(p: dict[str, Any]) -> tuple:
    """GRID_ORDER of a point dict, empty values last (as PostgreSQL orders NULLs ascending),
    text by code point."""
    k, b, c, o = p["num_speculative_tokens"], p["tree_budget"], p["concurrency"], p["output_len"]
    return (p["tp"], p["method"], k is None, k or 0, b is None, b or 0, c is None, c or 0, o is None, o or 0,
            p["run_id"])


def sweep_dimensions(sweep_id: int) -> list[dict[str, Any]]:
    """The distinct (tp, concurrency, output_len, method, num_speculative_tokens, tree_budget)
    of a sweep's counted runs (one query): what its filters can choose from."""
    return list(Run.objects.counted().filter(sweep_id=sweep_id)
                .values("tp", "concurrency", "output_len", "method", "num_speculative_tokens", "tree_budget")
                .distinct().order_by())


_DIMENSIONS = ("tp", "concurrency", "output_len", "method", "num_speculative_tokens", "tree_budget")


def dimensions_of(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`sweep_dimensions` read off already loaded points (no query): equal to it when `points`
    are every counted run of the sweep (`figure_points` without a selection)."""
    return [dict(zip(_DIMENSIONS, key, strict=True)) for key in dict.fromkeys(itemgetter(*_DIMENSIONS)(p)
                                                                                for p in points)]


def config_state_counts(sweep_id: int) -> list[dict[str, Any]]:
    """{method, num_speculative_tokens, tree_budget, tp, state, n}: runs of a sweep per
    configuration, TP degree and state (one GROUP BY query)."""
    return list(Run.objects.filter(sweep_id=sweep_id)
                .values("method", "num_speculative_tokens", "tree_budget", "tp", "state")
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


def sweep_hosts(sweep_id: int) -> list[str]:
    """Names of the hosts a sweep's runs are on, sorted (one query)."""
    return list(Run.objects.filter(sweep_id=sweep_id).order_by("host__name").values_list("host__name", flat=True)
                .distinct())


def counted_points(runs) -> list[dict[str, Any]]:
    """Point dicts (`point_from_run`) of the counted runs among `runs` (already loaded, in
    order): only succeeded runs with metrics feed charts and speedups (`Run.counts`)."""
    return [point_from_run(r) for r in runs if r.counts]


def gpu_prices() -> dict[str, float | None]:
    """{GPU model name (NVML name): USD per GPU-hour, None where the admin left it empty}."""
    return {name: None if price is None else float(price)
            for name, price in GpuPrice.objects.values_list("gpu_name", "usd_per_gpu_hour")}


def price_for(run: Run | dict[str, Any], prices: dict[str, float | None] | None = None) -> float | None:
    """The USD price per GPU-hour of `run`'s GPU model (`Run.gpus[*].name`, or a dict with a
    `gpus` list): None when the run has no GPUs, a GPU without a name, GPUs of different models,
    or no price set for its model (no cost figure then, never a guess). `prices`: the table of
    `gpu_prices()` when the caller prices many runs (else one query)."""
    gpus = run.get("gpus") if isinstance(run, dict) else run.gpus
    names = {g.get("name") or "" for g in gpus or [] if isinstance(g, dict)}
    if len(names) != 1 or "" in names:
        return None
    table = prices if prices is not None else gpu_prices()
    return table.get(names.pop())


def cost_of(run: Run | dict[str, Any], m: RunMetrics | WindowMetrics | dict[str, Any] | None,
            prices: dict[str, float | None] | None = None) -> tuple[float | None, float | None]:
    """(USD per million output tokens, the USD per GPU-hour it used) of `run` at today's price
    (benchkit.measure.efficiency.cost_usd_per_m_output_tokens over the window's duration and
    output tokens, G = the run's GPUs); (None, price) when a figure is missing."""
    price = price_for(run, prices)
    gpus = run.get("gpus") if isinstance(run, dict) else run.gpus
    get = m.get if isinstance(m, dict) else (lambda k: getattr(m, k, None))
    if m is None or price is None:
        return None, price
    duration, tokens = get("duration_s"), get("total_output_tokens")
    if not duration or not tokens:
        return None, price
    return cost_usd_per_m_output_tokens(price, len(gpus or []), duration, int(tokens)), price


def add_costs(points: list[dict[str, Any]], prices: dict[str, float | None] | None = None) -> list[dict[str, Any]]:
    """Set `cost_usd_per_m_output_tokens` and `price_usd_per_gpu_hour` on each point dict (from
    `gpu_names`, `duration_s` and `total_output_tokens`; None where a figure or the price is
    missing) at today's prices (`gpu_prices()`, one query, unless given). Returns `points`."""
    table = gpu_prices() if prices is None else prices
    for p in points:
        names = p.get("gpu_names") or ()
        run = {"gpus": [{"name": n} for n in names]}
        p["cost_usd_per_m_output_tokens"], p["price_usd_per_gpu_hour"] = cost_of(run, p, table)
    return points


#: select_related of the run page: its telemetry and log rows without their data (gpu_series).
RUN_PAGE_RELATED = ("sweep", "host", "metrics", "result_file", "gpu_telemetry", "request_logs")
RUN_PAGE_DEFERRED = ("gpu_telemetry__data", "request_logs__data")
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


def point_from_run(run: Any) -> dict[str, Any]:
    """Flatten a succeeded Run with metrics into the point dict benchkit.compare.speedups uses.

    Output: match fields, config fields, `run_id`, `label`, `repeat_index`, and every
    WindowMetrics field under its own name (`output_throughput_tok_s`, `median_tpot_ms`,
    `acceptance_length`, ...; None where unknown).
    """
    return {
        "run_id": run.pk, "host_id": run.host_id,
        "engine": run.engine, "engine_version": run.engine_version, "engine_build": run.engine_build,
        "model": run.model, "gpu_uuids": tuple(g.get("uuid", "") for g in run.gpus or []),
        "gpu_names": tuple(g.get("name", "") for g in run.gpus or []), "tp": run.tp,
        "dataset": run.dataset, "input_len": run.input_len, "output_len": run.output_len,
        "concurrency": run.concurrency, "request_rate": run.request_rate, "temperature": run.temperature,
        "seed": run.seed, "method": run.method, "num_speculative_tokens": run.num_speculative_tokens,
        "tree_budget": run.tree_budget, "drafter": run.drafter, "label": run.method_label,
        "repeat_index": run.repeat_index, **window_of(run.metrics).to_dict(),
    }


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

#: Run columns every history point carries (benchkit.compare.sweepdiff.IDENTITY_FIELDS and
#: ENV_FIELDS but the fingerprint, and speedups' MATCH_FIELDS but the GPU UUIDs, which come
#: from `gpus`).
_HISTORY_RUN_COLUMNS = ("id", "sweep_id", "host_id", "engine", "engine_version", "engine_build", "engine_commit",
                        "model", "drafter", "method", "num_speculative_tokens", "tree_budget", "tp", "dataset",
                        "input_len", "output_len", "concurrency", "request_rate", "temperature", "seed",
                        "repeat_index", "started_at", "gpus_text")
#: Filters a history query accepts (run columns, each a list of allowed values).
HISTORY_FILTERS = ("tp", "concurrency", "output_len", "input_len", "method")
#: At most this many snapshots per host are read to date runs' hardware fingerprints.
SNAPSHOT_HISTORY_CAP = 1000


def _method_label(method: str, k: int | None, budget: int | None, _cache: dict = {}) -> str:  # noqa: B006
    """Run.method_label for loose column values (one unsaved Run per distinct configuration)."""
    key = (method, k, budget)
    if key not in _cache:
        _cache[key] = Run(method=method, num_speculative_tokens=k, tree_budget=budget).method_label
    return _cache[key]


@functools.lru_cache(maxsize=1024)
def _gpu_uuids(gpus_json: str | None) -> tuple[str, ...]:
    """The UUIDs of a run's `gpus` column given as JSON text."""
    return tuple(g.get("uuid", "") for g in json.loads(gpus_json or "[]") or [])


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


def snapshot_history(host_ids: list[int]) -> dict[int, list[dict[str, Any]]]:
    """{host id: snapshots oldest first}, each {taken_at, fingerprint, changed, driver_version,
    cuda_version, gpu_name, gpu_count}; the newest SNAPSHOT_HISTORY_CAP per host (one query)."""
    out: dict[int, list[dict[str, Any]]] = {h: [] for h in host_ids}
    if not host_ids:
        return out
    rows = (HardwareSnapshot.objects.filter(host_id__in=host_ids).order_by("host_id", "-taken_at")
            .values("host_id", "taken_at", "fingerprint", "changed", "driver_version", "cuda_version", "gpu_name",
                    "gpu_count"))
    for r in rows:
        lst = out[r.pop("host_id")]
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


def history_points(sweep_ids: list[int], metrics: tuple[str, ...], filters: dict[str, list] | None = None,
                   snapshots: dict[int, list[dict[str, Any]]] | None = None,
                   gpus: bool = True) -> list[dict[str, Any]]:
    """Counted points of the sweeps `sweep_ids` with only the columns a history page needs:
    run columns (_HISTORY_RUN_COLUMNS but `started_at`; `run_id` for `id`), `gpu_uuids`,
    `label`, `hardware_fingerprint` (the host's snapshot in force when the run started: given
    `snapshots`, computed by the database in the same query (`_fingerprint_case`), else from
    one more query; `snapshots={}` skips it: "") and the WindowMetrics fields `metrics`;
    `gpus=False` leaves out `gpu_uuids` (needed by speedups only). `filters`: run column ->
    allowed values (HISTORY_FILTERS). One query for the runs (succeeded, with metrics;
    `Run.objects.counted()`), in (sweep, id) order.
    """
    qs = Run.objects.counted().filter(sweep_id__in=sweep_ids)
    for col, allowed in (filters or {}).items():
        if col not in HISTORY_FILTERS:
            raise ValueError(f"unknown history filter {col!r}: use {', '.join(HISTORY_FILTERS)}")
        qs = qs.filter(**{f"{col}__in": allowed})
    case = _fingerprint_case(snapshots) if snapshots else None
    skip = {"started_at"} if snapshots == {} or case is not None else set()
    if not gpus:
        skip.add("gpus_text")
    columns = tuple(c for c in _HISTORY_RUN_COLUMNS if c not in skip)
    names = [*columns, *(f"metrics__{m}" for m in metrics)]
    # the GPU list as text, decoded once per distinct value (a sweep has a few), not per row
    if gpus:
        qs = qs.annotate(gpus_text=Cast("gpus", TextField()))
    if case is not None:
        qs = qs.annotate(fingerprint_at_start=case)
        names.append("fingerprint_at_start")
    rows = list(qs.order_by("sweep_id", "id").values_list(*names))
    keys = ["run_id" if c == "id" else c for c in columns] + list(metrics)
    labels: dict[tuple, str] = {}
    out = []
    if case is not None or snapshots == {}:
        for r in rows:
            p = dict(zip(keys, r, strict=False))
            if gpus:
                p["gpu_uuids"] = _gpu_uuids(p.pop("gpus_text"))
            cfg = (p["method"], p["num_speculative_tokens"], p["tree_budget"])
            if cfg not in labels:
                labels[cfg] = _method_label(*cfg)
            p["label"] = labels[cfg]
            p["hardware_fingerprint"] = r[-1] if case is not None else ""
            out.append(p)
        return out
    if snapshots is None:
        snapshots = snapshot_history(sorted({r[2] for r in rows}))  # r[2]: host_id
    times = {h: [s["taken_at"] for s in lst] for h, lst in snapshots.items()}
    for r in rows:
        p = dict(zip(keys, r, strict=True))
        if gpus:
            p["gpu_uuids"] = _gpu_uuids(p.pop("gpus_text"))
        p["label"] = _method_label(p["method"], p["num_speculative_tokens"], p["tree_budget"])
        when, ts = p.pop("started_at", None), times.get(p["host_id"])
        i = bisect.bisect_right(ts, when) if ts and when is not None else 0
        p["hardware_fingerprint"] = snapshots[p["host_id"]][i - 1]["fingerprint"] if i else ""
        out.append(p)
    return out


def facet_values(sweep_ids: list[int]) -> dict[str, list]:
    """{filter column: sorted distinct values} over the counted runs of `sweep_ids` (one grouped
    query on the runs of those sweeps)."""
    rows = Run.objects.counted().filter(sweep_id__in=sweep_ids).order_by().values_list(*HISTORY_FILTERS).distinct()
    out: dict[str, set] = {c: set() for c in HISTORY_FILTERS}
    for r in rows:
        for c, v in zip(HISTORY_FILTERS, r, strict=True):
            out[c].add(v)
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
