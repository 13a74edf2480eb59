"""The functions that create runs and change their state: the run life cycle's only moves.

Legal moves (MEASUREMENT.md, issue 2):
queued -> preflight -> starting -> warming -> measuring -> stopping -> succeeded | failed;
any active or queued state -> failed; succeeded | failed -> invalidated (admin, with a reason).
A run comes to exist by one of three creation moves, from an origin that is no state a run is
ever in: new -> queued (a sweep's grid point, for a worker), imported -> succeeded | failed
(another tool's result file), ingested -> succeeded | failed (an offline bundle's run).
`create` makes those (an INSERT), `transition` the others: a conditional UPDATE ... WHERE
state=<from> (healthchecks style), so two workers racing for one run cannot both win. Every
move is logged as a RunTransition row (from, to, note). Events that change no state but belong
to the run's history (a duplicate delivery, a re-send) are logged by `record` as a row whose
from and to states are equal.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from runs.models import Run, RunState, RunTransition
from runs.services import summaries

S = RunState

#: Where a run comes from: the from-state of its creation move (never a state a run is in).
NEW, IMPORTED, INGESTED = "new", "imported", "ingested"
ORIGINS = (NEW, IMPORTED, INGESTED)

ALLOWED: dict[str, set[str]] = {
    NEW: {S.QUEUED},
    IMPORTED: {S.SUCCEEDED, S.FAILED},
    INGESTED: {S.SUCCEEDED, S.FAILED},
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


def create(runs: list[Run], origin: str, to_state: str, note: str = "", **fields) -> list[Run]:
    """Insert the new, unsaved `runs` in `to_state` by the creation move `origin -> to_state`,
    also setting `fields` on each, and log the move in each run's history with `note`; returns
    them saved (pks set), in order.

    A run created finished (imported, ingested) gets started_at and finished_at now unless it
    has its own. Raises IllegalTransition when the move is not in ALLOWED or a run is saved
    already. Call it inside the caller's transaction when more rows belong with the runs."""
    if origin not in ORIGINS or to_state not in ALLOWED[origin]:
        raise IllegalTransition(f"a run cannot be created by {origin} -> {to_state}")
    now = timezone.now()
    for run in runs:
        if run.pk is not None:
            raise IllegalTransition(f"run {run.pk} exists: {origin} -> {to_state} creates a run")
        run.state = to_state
        for key, value in fields.items():
            setattr(run, key, value)
        if to_state in (S.SUCCEEDED, S.FAILED):
            run.started_at = run.started_at or now
            run.finished_at = run.finished_at or now
    with transaction.atomic():
        created = Run.objects.bulk_create(runs)
        RunTransition.objects.bulk_create([RunTransition(run=run, from_state=origin, to_state=to_state,
                                                         note=note[:2000]) for run in created])
        if to_state == S.SUCCEEDED:  # counted from now on: the sweeps' stored summaries no longer hold
            summaries.mark_stale({run.sweep_id for run in created})
    return created


def transition(run: Run, to_state: str, note: str = "", **fields) -> Run:
    """Move `run` to `to_state`, also writing `fields` (e.g. failure_reason), atomically.

    Raises IllegalTransition if the move is not in ALLOWED or if the row's state in the
    database is no longer `run.state`. Sets started_at on leaving queued and finished_at on
    reaching succeeded/failed. Returns the run with the new values set in memory.
    """
    from_state = run.state
    if from_state in ORIGINS or to_state not in ALLOWED.get(from_state, set()):
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
        if S.SUCCEEDED in (from_state, to_state):  # counted from now on, or no longer
            summaries.mark_stale([run.sweep_id])
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
