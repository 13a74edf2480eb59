"""Invalidating runs: an administrator takes finished runs out of every chart, with a reason;
they stay stored for audit."""

from __future__ import annotations

from runs.models import RunState
from runs.services.transitions import IllegalTransition, transition


def invalidate_runs(runs, reason: str) -> tuple[int, list[str]]:
    """Invalidate each finished run with `reason`; it stays stored for audit but leaves every
    chart, speedup and export. Returns (count invalidated, messages for runs skipped).

    Raises ValueError when `reason` is blank (an invalidation must say why)."""
    reason = reason.strip()
    if not reason:
        raise ValueError("an invalidation needs a reason")
    done, skipped = 0, []
    for run in runs:
        if run.state not in (RunState.SUCCEEDED, RunState.FAILED):
            skipped.append(f"run {run.pk} is {run.state}; only succeeded or failed runs can be invalidated")
            continue
        try:
            transition(run, RunState.INVALIDATED, note=reason, invalidated_reason=reason)
            done += 1
        except IllegalTransition as exc:
            skipped.append(str(exc))
    return done, skipped
