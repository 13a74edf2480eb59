"""Invalidating runs: an administrator takes finished runs out of every chart, with a reason;
they stay stored for audit."""

from __future__ import annotations

from django.db import transaction

from runs.models import RunState, Sweep
from runs.services import lossless
from runs.services.transitions import IllegalTransition, transition


def invalidate_runs(runs, reason: str) -> tuple[int, list[str]]:
    """Invalidate each finished run with `reason`; it stays stored for audit but leaves every
    chart, speedup and export. Returns (count invalidated, messages for runs skipped).

    The lossless check of each sweep touched is queued again on its host's queue (an invalidated
    run is no baseline and no floor any more). Raises ValueError when `reason` is blank (an
    invalidation must say why)."""
    reason = reason.strip()
    if not reason:
        raise ValueError("an invalidation needs a reason")
    done, skipped, sweeps = 0, [], set()
    for run in runs:
        if run.state not in (RunState.SUCCEEDED, RunState.FAILED):
            skipped.append(f"run {run.pk} is {run.state}; only succeeded or failed runs can be invalidated")
            continue
        try:
            transition(run, RunState.INVALIDATED, note=reason, invalidated_reason=reason)
            done += 1
            sweeps.add(run.sweep_id)
        except IllegalTransition as exc:
            skipped.append(str(exc))
    for sweep in Sweep.objects.filter(pk__in=sweeps).select_related("host").only("id", "host__name"):
        transaction.on_commit(lambda s=sweep: lossless.send_check(s.pk, s.host.queue))
    return done, skipped
