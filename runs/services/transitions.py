"""The one function that changes a run's state.

Legal moves (MEASUREMENT.md, issue 2):
queued -> preflight -> starting -> warming -> measuring -> stopping -> succeeded | failed;
any active or queued state -> failed; succeeded | failed -> invalidated (admin, with a reason).
Each move is a conditional UPDATE ... WHERE state=<from> (healthchecks style), so two workers
racing for one run cannot both win, and each is logged as a RunTransition row. Events that
change no state but belong to the run's history (a duplicate delivery, a re-send, who created
it) are logged by `record` as a row whose from and to states are equal.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from runs.models import Run, RunState, RunTransition

S = RunState

ALLOWED: dict[str, set[str]] = {
    S.QUEUED: {S.PREFLIGHT, S.FAILED},
    S.PREFLIGHT: {S.STARTING, S.FAILED},
    S.STARTING: {S.WARMING, S.FAILED},
    S.WARMING: {S.MEASURING, S.FAILED},
    S.MEASURING: {S.STOPPING, S.FAILED},
    S.STOPPING: {S.SUCCEEDED, S.FAILED},
    S.SUCCEEDED: {S.INVALIDATED},
    S.FAILED: {S.INVALIDATED},
    S.INVALIDATED: set(),
}


class IllegalTransition(Exception):
    """Raised when a run is asked to move between states the life cycle does not allow,
    or when its state changed under us (another worker moved it first)."""


def transition(run: Run, to_state: str, note: str = "", **fields) -> Run:
    """Move `run` to `to_state`, also writing `fields` (e.g. failure_reason), atomically.

    Raises IllegalTransition if the move is not in ALLOWED or if the row's state in the
    database is no longer `run.state`. Sets started_at on leaving queued and finished_at on
    reaching succeeded/failed. Returns the run with the new values set in memory.
    """
    from_state = run.state
    if to_state not in ALLOWED.get(from_state, set()):
        raise IllegalTransition(f"run {run.pk}: {from_state} -> {to_state} is not allowed")
    now = timezone.now()
    if from_state == S.QUEUED:
        fields.setdefault("started_at", now)
    if to_state in (S.SUCCEEDED, S.FAILED):
        fields.setdefault("finished_at", now)
    with transaction.atomic():
        changed = Run.objects.filter(pk=run.pk, state=from_state).update(state=to_state, **fields)
        if changed != 1:
            current = Run.objects.filter(pk=run.pk).values_list("state", flat=True).first()
            raise IllegalTransition(f"run {run.pk}: expected state {from_state}, found {current}")
        RunTransition.objects.create(run=run, from_state=from_state, to_state=to_state, note=note[:2000])
    run.state = to_state
    for key, value in fields.items():
        setattr(run, key, value)
    return run


def record(run_ids, note: str) -> None:
    """Add `note` to the history of each run in `run_ids` (ids or Run rows) without changing its
    state: a RunTransition row with from_state == to_state == the run's current state."""
    ids = [getattr(r, "pk", r) for r in run_ids]
    rows = Run.objects.filter(pk__in=ids).values_list("pk", "state")
    RunTransition.objects.bulk_create(
        [RunTransition(run_id=pk, from_state=state, to_state=state, note=note[:2000]) for pk, state in rows])
