"""Read-side queries of the runs app. Each returns plain querysets or dicts; no writes."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from django.db.models import Count, Q, QuerySet, TextField
from django.db.models.functions import Cast

from benchkit.hosts.inventory import HostInventory
from benchkit.measure.metrics import METRIC_FIELDS, METRICS, WindowMetrics
from benchkit.methods import method_label
from runs.models import ACTIVE_STATES, HardwareSnapshot, Host, Run, RunMetrics, RunState, Sweep

#: Columns that list and figure pages never need and that are heavy to fetch and decode: the run
#: page's samples (~150 KB of JSON per run), the full RunSpec, the server environment and the
#: 20 KB server-log tail. Only the run page and recompute read them.
HEAVY_RUN_COLUMNS = ("spec", "server_env", "server_log_tail")
HEAVY_METRICS_COLUMNS = ("distributions", "definitions", "extra")
#: Run columns of a point dict (`figure_points`): what speedup matching and the figures read.
_POINT_COLUMNS = ("id", "engine", "engine_version", "engine_build", "model", "gpus", "tp", "dataset", "input_len",
                  "output_len", "concurrency", "request_rate", "temperature", "seed", "method",
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
               configs: Iterable[tuple[str, int | None, int | None]] = ()) -> QuerySet[Run]:
    """`qs` narrowed to the given TP degrees, concurrency levels and output lengths (each: any
    of the values; empty: all), and to runs whose method is one of `methods` or whose
    (method, num_speculative_tokens, tree_budget) is one of `configs` (both empty: all)."""
    tp, concurrency, output_len = list(tp), list(concurrency), list(output_len)
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
    configs). Raises KeyError naming a metric field that is not in the schema. Grid order."""
    for f in metric_fields:
        if f not in METRICS:
            raise KeyError(f"not a WindowMetrics field: {f!r}")
    qs = _selection(Run.objects.counted().filter(sweep_id=sweep_id), **selection).order_by(*GRID_ORDER)
    # the GPU list as its stored text, decoded once per distinct value (a sweep has a few)
    rows = qs.annotate(gpus_text=Cast("gpus", TextField())).values(
        *(c for c in _POINT_COLUMNS if c != "gpus"), "gpus_text", *(f"metrics__{f}" for f in metric_fields))
    uuids: dict[str | None, tuple[str, ...]] = {}
    labels: dict[tuple, str] = {}
    points = []
    for r in rows:
        text = r.pop("gpus_text")
        if text not in uuids:
            uuids[text] = tuple(g.get("uuid", "") for g in (json.loads(text) if text else None) or [])
        cfg = (r["method"], r["num_speculative_tokens"], r["tree_budget"])
        if cfg not in labels:
            labels[cfg] = method_label(*cfg)
        p = {k: r[k] for k in _POINT_COLUMNS if k not in ("id", "gpus")}
        p.update(run_id=r["id"], gpu_uuids=uuids[text], label=labels[cfg],
                 **{f: r[f"metrics__{f}"] for f in metric_fields})
        points.append(p)
    return points


def sweep_dimensions(sweep_id: int) -> list[dict[str, Any]]:
    """The distinct (tp, concurrency, output_len, method, num_speculative_tokens, tree_budget)
    of a sweep's counted runs (one query): what its filters can choose from."""
    return list(Run.objects.counted().filter(sweep_id=sweep_id)
                .values("tp", "concurrency", "output_len", "method", "num_speculative_tokens", "tree_budget")
                .distinct().order_by())


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
    return (qs.select_related("metrics").order_by(*GRID_ORDER)
            .only("id", "sweep_id", "method", "num_speculative_tokens", "tree_budget", "tp", "concurrency",
                  "output_len", "repeat_index", "gpus", "gpus_cross_numa", "state", "failure_reason",
                  "failure_message", "suspect", "suspect_reasons", "metrics__id",
                  *(f"metrics__{f}" for f in metric_fields)))


def counted_points(runs) -> list[dict[str, Any]]:
    """Point dicts (`point_from_run`) of the counted runs among `runs` (already loaded, in
    order): only succeeded runs with metrics feed charts and speedups (`Run.counts`)."""
    return [point_from_run(r) for r in runs if r.counts]


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
        "run_id": run.pk,
        "engine": run.engine, "engine_version": run.engine_version, "engine_build": run.engine_build,
        "model": run.model, "gpu_uuids": tuple(g.get("uuid", "") for g in run.gpus or []), "tp": run.tp,
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


def latest_inventory(host: Host) -> HostInventory | None:
    """The host's most recent inventory (benchkit.hosts.inventory.HostInventory), or None if it
    was never recorded."""
    snap = HardwareSnapshot.objects.filter(host=host).order_by("-taken_at").only("data").first()
    return HostInventory.from_dict(snap.data) if snap else None


def latest_snapshot(host: Host) -> HardwareSnapshot | None:
    """The host's newest hardware snapshot with its GPUs prefetched, or None."""
    return HardwareSnapshot.objects.filter(host=host).prefetch_related("gpus").order_by("-taken_at").first()


def snapshot_history(host: Host, limit: int = 50) -> list[HardwareSnapshot]:
    """The host's newest `limit` snapshots, newest first, with the columns the host page lists
    (one query: `host` is loaded too, else Django's related manager fetches it per row)."""
    return list(HardwareSnapshot.objects.filter(host=host).order_by("-taken_at")
                .only("host", "taken_at", "fingerprint", "changed", "gpu_count", "gpu_name", "driver_version")[:limit])
