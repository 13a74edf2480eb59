"""Issue 35 on the Django side: a worker rides out a database outage (retries with backoff, the
run ends with its outcome as soon as the database answers), the reaper tells a worker that moved
on from a stuck one, every path that ends a sweep's last run queues the checks exactly once, and a
lease whose server cannot be checked is kept until the host's own worker confirms.

The outage is a real connection-level error (django.db.OperationalError, what psycopg raises
when PostgreSQL restarts) thrown by the database work it interrupts; the same faults on a real
PostgreSQL restarted under a real worker are benchmarks/fault_trials.py's database kinds."""

from __future__ import annotations

import logging
import os
from datetime import timedelta

import pytest
from celery import current_app
from django.db import OperationalError
from django.utils import timezone

from benchkit.execution.outcome import RunOutcome
from runs.models import GpuLease, Run, RunState, RunTransition, Sweep
from runs.services import dbretry, execution, leases, regressions, supervision
from runs.services.transitions import transition
from tests.factories import finish_run, make_host, make_run, make_sweep

pytestmark = pytest.mark.django_db


def _flaky(fails: int, then, error=OperationalError("server closed the connection unexpectedly")):
    """A callable that raises `error` `fails` times, then returns `then()`; `.calls` counts tries."""
    def call(*args, **kwargs):
        call.calls += 1
        if call.calls <= fails:
            raise error
        return then(*args, **kwargs)
    call.calls = 0
    return call


# --- the retry ------------------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)  # outside an atomic block: a retry is possible
def test_retry_waits_out_an_outage_logs_once_and_gives_up_with_the_reason(caplog):
    waits = []
    fn = _flaky(3, lambda: "stored")
    with caplog.at_level(logging.INFO, logger="runs.services.dbretry"):
        assert dbretry.retry(fn, "run 1: store", sleep=waits.append) == "stored"
    assert fn.calls == 4 and waits == [0.5, 1.0, 2.0]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "database unavailable" in lines[0] and "database back" in lines[1]
    never = _flaky(10**6, lambda: None)
    with pytest.raises(dbretry.DatabaseUnavailable) as err:
        dbretry.retry(never, "run 2: store", max_s=0.2, sleep=lambda s: None)
    assert err.value.reason == "database_unavailable" and "run 2: store" in str(err.value)
    with pytest.raises(ValueError):  # not a connection error: raised at once, never retried
        dbretry.retry(_flaky(1, lambda: None, ValueError("bug")), "x", sleep=waits.append)


# --- the worker through an outage -----------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_worker_stores_its_outcome_and_frees_its_lease_once_the_database_is_back(monkeypatch, settings, tmp_path):
    """Red before issue 35: the first failed query after the runner (the store) raised out of the
    task, the lease release in `finally` failed too, and the run stayed active until the reaper's
    deadline + grace."""
    from benchkit.specs import GpuRef

    settings.DRAFTBOARD_RUNS_DIR = str(tmp_path)
    monkeypatch.setattr(dbretry, "FIRST_S", 0.01)
    monkeypatch.setattr(dbretry, "CAP_S", 0.01)
    sent = []
    monkeypatch.setattr(current_app, "send_task", lambda name, **kw: sent.append((name, kw["args"][0])))
    run = make_run(make_sweep(make_host("dbo")), gpus=[GpuRef(index=0, uuid="GPU-dbo")])
    outcome = RunOutcome(ok=False, reason="server_exited", message="exit 1")
    monkeypatch.setattr(execution, "execute_runs", lambda specs, hooks, workdir, server_tag: [outcome])
    store = _flaky(2, execution.store_outcome)
    release = _flaky(2, leases.release)
    monkeypatch.setattr(execution, "store_outcome", store)
    monkeypatch.setattr(leases, "release", release)
    done, = execution.execute_group([run.pk])
    assert (done.state, done.failure_reason) == (RunState.FAILED, "server_exited")
    assert store.calls == 3 and release.calls == 3
    assert not GpuLease.objects.exists()
    assert Sweep.objects.get(pk=run.sweep_id).checks_queued_at is not None
    assert [n for n, _ in sent] == ["runs.check_lossless", "runs.detect_regressions"]
    assert supervision.executing_runs(os.getpid()) == []  # the task said it moved on


@pytest.mark.django_db(transaction=True)
def test_progress_write_in_an_outage_is_skipped_and_state_moves_wait(monkeypatch):
    monkeypatch.setattr(dbretry, "FIRST_S", 0.01)
    run = make_run(make_sweep(make_host("dbp")))
    transition(run, RunState.PREFLIGHT)
    hooks = execution._DjangoHooks(run)
    monkeypatch.setattr(Run.objects, "filter", _flaky(1, Run.objects.filter))
    hooks.progress(3, 10)  # red before: the OperationalError ended the load client (internal_error)
    monkeypatch.undo()
    monkeypatch.setattr(dbretry, "FIRST_S", 0.01)
    monkeypatch.setattr(execution, "transition", _flaky(2, execution.transition))
    hooks.state(RunState.STARTING)
    assert Run.objects.get(pk=run.pk).state == RunState.STARTING


# --- the reaper -------------------------------------------------------------------------------------

def _claimed(run: Run) -> Run:
    transition(run, RunState.PREFLIGHT, **supervision.claim_fields(600))
    for state in (RunState.STARTING, RunState.WARMING, RunState.MEASURING, RunState.STOPPING):
        transition(run, state)
    return Run.objects.get(pk=run.pk)


def test_reaper_fails_the_run_of_a_worker_that_moved_on_at_once_and_says_so(settings, tmp_path):
    """Red before: a live worker's run was left alone until deadline + grace, then called
    'still alive but stuck past its hard time limit'."""
    settings.DRAFTBOARD_RUNS_DIR = str(tmp_path)
    host = make_host("moved")
    sweep = make_sweep(host)
    left, unstored, current = (_claimed(make_run(sweep, m)) for m in ("auto", "linear", "ngram"))
    supervision.mark_executing([current.pk])  # this live process now runs `current`
    Run.objects.filter(pk=current.pk).update(started_at=timezone.now() - timedelta(seconds=5))
    supervision.note_unstored([unstored.pk], "run: store its outcome: the database did not answer for 900 s")
    reaped = {r.run_id: r for r in supervision.reap(host)}
    assert set(reaped) == {left.pk, unstored.pk}
    assert reaped[left.pk].reason == "worker_lost"
    assert f"lives but moved on (it now executes runs [{current.pk}])" in reaped[left.pk].message
    assert reaped[unstored.pk].reason == "database_unavailable"
    assert "did not answer for 900 s" in reaped[unstored.pk].message
    assert Run.objects.get(pk=current.pk).state == RunState.STOPPING  # still executing: left alone


def test_every_path_that_ends_a_sweeps_last_run_queues_the_checks_once(monkeypatch, settings, tmp_path,
                                                                        django_capture_on_commit_callbacks):
    """Red before: the reaper ending a sweep's last run queued neither the lossless check nor
    regression detection."""
    settings.DRAFTBOARD_RUNS_DIR = str(tmp_path)
    sent = []
    monkeypatch.setattr(current_app, "send_task", lambda name, **kw: sent.append((name, kw["args"][0])))
    host = make_host("last")
    sweep = make_sweep(host)
    finish_run(make_run(sweep, "auto"))
    lost = _claimed(make_run(sweep, "linear"))
    supervision.mark_executing([])  # its worker (this process) moved on
    with django_capture_on_commit_callbacks(execute=True):
        assert [r.run_id for r in supervision.reap(host)] == [lost.pk]
        regressions.runs_finished([lost.pk])  # a second path ending the same run: nothing more
        regressions.queue_pending_checks(host.pk)
    assert sorted(sent) == [("runs.check_lossless", sweep.pk), ("runs.detect_regressions", sweep.pk)]


def test_a_check_the_broker_refused_is_sent_again_by_the_supervisor(monkeypatch, django_capture_on_commit_callbacks):
    sweep = make_sweep(make_host("catchup"), is_demo=True)
    run = finish_run(make_run(sweep))
    monkeypatch.setattr(current_app, "send_task", _flaky(1, lambda *a, **k: None, ConnectionError("broker down")))
    with django_capture_on_commit_callbacks(execute=True):
        regressions.runs_finished([run.pk])
    assert Sweep.objects.get(pk=sweep.pk).checks_queued_at is None  # not taken: left for the catch-up
    sent = []
    monkeypatch.setattr(current_app, "send_task", lambda name, **kw: sent.append(name))
    with django_capture_on_commit_callbacks(execute=True):
        regressions.queue_pending_checks(sweep.host_id)
    assert sent == ["runs.check_lossless"] and Sweep.objects.get(pk=sweep.pk).checks_queued_at is not None


def test_a_lease_whose_server_cannot_be_checked_stays_until_its_host_confirms(settings, tmp_path):
    """Red before: the reaper on another machine released the GPU lease while the server ran on."""
    settings.DRAFTBOARD_RUNS_DIR = str(tmp_path)
    host = make_host("keep")
    run = _claimed(make_run(make_sweep(host)))
    Run.objects.filter(pk=run.pk).update(worker_node="gpu-host-7", heartbeat_at=timezone.now() - timedelta(hours=1))
    GpuLease.objects.create(host=host, gpu_uuid="GPU-k", run=run, expires_at=timezone.now() - timedelta(minutes=1))
    reaped, = supervision.reap(host)
    lease = GpuLease.objects.get()
    assert "not on this machine" in lease.unconfirmed and "kept until gpu-host-7's worker confirms" in reaped.cleanup[0]
    other = make_run(make_sweep(host), "linear")
    with pytest.raises(leases.GpusBusy):  # expired, but kept: a server may still hold the GPU
        leases.acquire(other, ["GPU-k"], ttl_s=60)
    assert supervision.confirm_leases(host, node="elsewhere") == []  # still not its machine
    assert supervision.confirm_leases(host, node="gpu-host-7") == [run.pk]  # on gpu-host-7: no process left
    assert not GpuLease.objects.exists()
    assert RunTransition.objects.filter(run=run, note__contains="released: its server is known stopped").exists()


def test_a_worker_stands_in_for_a_silent_beat(monkeypatch):
    """Red before: once beat died nothing sent the supervise task, so no reaper, reconciler or
    checks' catch-up ran until beat was started by hand."""
    from runs import worker
    from runs.models import SchedulerHeartbeat

    sent = []
    monkeypatch.setattr(current_app, "send_task", lambda name, **kw: sent.append(kw["queue"]))
    monkeypatch.setitem(worker._served, "hosts", ["gpu-a"])
    monkeypatch.setitem(worker._served, "supervised", 0.0)
    monkeypatch.setitem(worker._served, "beat_silent", False)
    worker._stand_in_for_beat(10**6)
    assert sent == []  # no beat ever seen (a worker alone): nothing to stand in for
    now = timezone.now()
    beat = SchedulerHeartbeat.objects.create(name="n:1", started_at=now, beat_at=now)
    worker._stand_in_for_beat(2 * 10**6)
    assert sent == []  # beat alive
    SchedulerHeartbeat.objects.filter(pk=beat.pk).update(beat_at=now - timedelta(minutes=10))
    worker._stand_in_for_beat(3 * 10**6)
    worker._stand_in_for_beat(3 * 10**6 + 1)  # within one supervise interval: not again
    assert sent == ["host.gpu-a"]
