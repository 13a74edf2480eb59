"""Read-side queries of the runs app. Each returns plain querysets or dicts; no writes."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Min, Q, QuerySet

from benchkit.hosts.inventory import HostInventory
from benchkit.measure.metrics import METRIC_FIELDS, WindowMetrics
from runs.models import HardwareSnapshot, Host, Run, RunMetrics, RunState, Sweep


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
    """All runs of a sweep with their metrics (one query), in grid order."""
    return Run.objects.filter(sweep=sweep).select_related("metrics").order_by("tp", "method", "num_speculative_tokens",
                                                                               "tree_budget", "concurrency", "id")


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
    active = (
        Run.objects.filter(sweep=sweep, state__in=[s for s in RunState if s not in (
            RunState.QUEUED, RunState.SUCCEEDED, RunState.FAILED, RunState.INVALIDATED)])
        .values("id", "state", "progress_done", "progress_total", "method", "concurrency")
        .first()
    )
    return {"sweep": sweep.pk, "total": total, "finished": finished, "counts": counts, "active": active}


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
