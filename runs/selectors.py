"""Read-side queries of the runs app. Each returns plain querysets or dicts; no writes."""

from __future__ import annotations

from django.db.models import Count, Q, QuerySet

from runs.models import HardwareSnapshot, Host, Run, RunState, Sweep


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


def counted_runs(runs) -> list[Run]:
    """Only succeeded runs with metrics feed charts and speedups (invalidated/failed never do)."""
    return [r for r in runs if r.state == RunState.SUCCEEDED and hasattr(r, "metrics")]


def state_counts(sweep: Sweep) -> dict[str, int]:
    """{state: count} for a sweep, every state present (zeros included)."""
    rows = Run.objects.filter(sweep=sweep).values("state").annotate(n=Count("id")).values_list("state", "n")
    counts = dict(rows)
    return {s.value: counts.get(s.value, 0) for s in RunState}


def sweep_progress(sweep: Sweep) -> dict:
    """Live progress of a sweep: state counts, finished/total runs, and the active run's progress."""
    counts = state_counts(sweep)
    total = sum(counts.values())
    finished = counts["succeeded"] + counts["failed"] + counts["invalidated"]
    active = (
        Run.objects.filter(sweep=sweep, state__in=[s for s in RunState if s not in (
            RunState.QUEUED, RunState.SUCCEEDED, RunState.FAILED, RunState.INVALIDATED)])
        .values("id", "state", "progress_done", "progress_total", "method", "concurrency")
        .first()
    )
    return {"sweep": sweep.pk, "total": total, "finished": finished, "counts": counts, "active": active}


def latest_snapshot(host: Host) -> HardwareSnapshot | None:
    """The host's newest hardware snapshot with its GPUs prefetched, or None."""
    return HardwareSnapshot.objects.filter(host=host).prefetch_related("gpus").order_by("-taken_at").first()
