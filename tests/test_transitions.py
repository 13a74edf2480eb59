"""The run state machine: one function, legal moves only, races lose cleanly."""

import pytest

from runs.models import Run, RunState, RunTransition
from runs.services.transitions import IllegalTransition, transition
from tests.factories import make_run, make_sweep

pytestmark = pytest.mark.django_db


def test_full_life_cycle_is_logged():
    run = make_run(make_sweep())
    for s in ("preflight", "starting", "warming", "measuring", "stopping", "succeeded"):
        transition(run, s)
    run.refresh_from_db()
    assert run.state == RunState.SUCCEEDED
    assert run.started_at is not None and run.finished_at is not None
    assert list(RunTransition.objects.filter(run=run).values_list("to_state", flat=True)) == [
        "preflight", "starting", "warming", "measuring", "stopping", "succeeded"]


@pytest.mark.parametrize("path", [["succeeded"], ["preflight", "measuring"], ["invalidated"],
                                  ["preflight", "failed", "queued"]])
def test_illegal_moves_are_refused(path):
    run = make_run(make_sweep())
    with pytest.raises(IllegalTransition):
        for s in path:
            transition(run, s)


def test_stale_state_loses_race():
    run = make_run(make_sweep())
    other = Run.objects.get(pk=run.pk)
    transition(other, "preflight")  # another worker claimed it
    with pytest.raises(IllegalTransition, match="expected state queued, found preflight"):
        transition(run, "preflight")
    assert RunTransition.objects.filter(run=run).count() == 1


def test_any_active_state_can_fail_and_failed_can_be_invalidated():
    run = make_run(make_sweep())
    transition(run, "preflight")
    transition(run, "failed", failure_reason="model_missing")
    transition(run, "invalidated", invalidated_reason="bad host")
    run.refresh_from_db()
    assert (run.state, run.failure_reason, run.invalidated_reason) == ("invalidated", "model_missing", "bad host")
