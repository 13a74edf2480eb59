"""Issue 11: operations that survive faults, with real processes, real signals and a real Redis.

Each test runs a real Celery worker (and beat where a test needs one) against the test database
and a private Redis with the embedded default's AOF settings, on the synthetic engine build (a
managed server process group, see tests/celeryproc.py), with supervision intervals shortened
through settings. Each prints how long recovery took (`recovered in`), which the trial counts in
the closing report of issue 11 come from.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from datetime import UTC, datetime, timedelta

import psutil
import pytest
from django.utils import timezone
from django_celery_beat.models import PeriodicTask

from benchkit.hosts.teardown import group_members, stop_tagged_processes, tagged_processes
from runs.models import GpuLease, Host, Run, RunState, RunTransition, Sweep
from runs.services.hosts import get_or_create_host
from runs.services.sweeps import create_sweep
from tests import celeryproc as cp

pytestmark = [pytest.mark.celery, pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

GPU = {"index": 0, "uuid": "GPU-fault-test", "pci_bus_id": "", "numa_node": -1, "name": "synthetic"}


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A private Redis, a fresh host name and the environment of its worker/beat processes;
    every process started through `site.worker()` / `site.beat()` is stopped afterwards."""
    monkeypatch.setenv("DRAFTBOARD_ENGINE_FLAGS", str(cp.SYNTHETIC_FLAGS))
    redis = cp.PrivateRedis().start()
    host_name = f"ft-{uuid.uuid4().hex[:8]}"
    procs: list[cp.CeleryProc] = []

    class Site:
        def __init__(self):
            self.redis, self.host_name, self.tmp = redis, host_name, tmp_path
            self.env = cp.child_env(redis.url, host_name, tmp_path / "runs")
            self.host = get_or_create_host(host_name)
            self.model = cp.synthetic_model(tmp_path)

        def worker(self) -> cp.CeleryProc:
            w = cp.start_worker(self.env, host_name, tmp_path / f"worker-{len(procs)}.log")
            procs.append(w)
            return w

        def beat(self) -> cp.CeleryProc:
            b = cp.start_beat(self.env, tmp_path / f"beat-{len(procs)}.log")
            procs.append(b)
            return b

        def logs(self) -> str:
            return "\n".join(f"--- {p.log_path.name}\n{p.log(3000)}" for p in procs)

        def sweep(self, name: str, **kw) -> Sweep:
            """Store a synthetic sweep on this host and send it as `manage.py enqueue_sweep` does."""
            spec = cp.synthetic_sweep(name, self.model, kw.pop("port", None) or cp.free_port(), **kw)
            sweep = create_sweep(spec, self.host, source="test", enqueue=False)
            cp.manage(self.env, "enqueue_sweep", str(sweep.pk))
            return sweep

    yield Site()
    for p in procs:
        p.stop()
    for tag in Run.objects.filter(host__name=host_name).exclude(server_tag="").values_list("server_tag", flat=True):
        stop_tagged_processes(tag, term_timeout_s=2)  # never leave a server of a failed test behind
    redis.stop()


def _run(pk: int) -> Run:
    return Run.objects.get(pk=pk)


def _claims(run: Run) -> int:
    return RunTransition.objects.filter(run=run, from_state=RunState.QUEUED, to_state=RunState.PREFLIGHT).count()


def _reaped(site, run: Run) -> Run:
    """Wait until `run` is failed and its clean-up is over (no process of its server start
    left, no GPU lease, the reaper's clean-up written in its history): recovery, as the trial
    counts measure it."""
    def done():
        r = _run(run.pk)
        gone = not r.server_tag or not tagged_processes(r.server_tag)
        noted = RunTransition.objects.filter(run=r, from_state=RunState.FAILED, note__startswith="reaper: ").exists()
        return r.state == RunState.FAILED and gone and noted and not GpuLease.objects.filter(run=r).exists() and r
    return cp.wait_for(done, 60, lambda: f"run {run.pk} to be failed and cleaned up\n" + site.logs())


def _assert_cleaned_up(run: Run) -> None:
    """No process of the run's server start is left, no lease, and its port is free."""
    assert run.server_pgid and run.server_tag
    assert group_members(run.server_pgid) == [], f"server group {run.server_pgid} still has processes"
    assert tagged_processes(run.server_tag) == {}
    assert not GpuLease.objects.filter(run=run).exists()
    assert cp.port_free(run.spec["port"]), f"port {run.spec['port']} still held"


def _long_then_short(site, name: str) -> tuple[Run, Run]:
    """A sweep of two server starts: a long run (4 x 6 s requests) then a short one."""
    sweep = site.sweep(name, output_len=[300, 8], gap_ms=20, share_server=False)
    a, b = Run.objects.filter(sweep=sweep).order_by("id")
    assert (a.output_len, b.output_len) == (300, 8)
    return a, b


def _until(site, run: Run, state: str = RunState.MEASURING) -> Run:
    """Wait until `run` is in `state` with its server recorded, then one second more (mid-phase)."""
    run = cp.wait_for(lambda: (r := _run(run.pk)).state == state and r.server_pgid and r,
                      60, lambda: f"run {run.pk} to reach {state}\n" + site.logs())
    time.sleep(1.0)
    return _run(run.pk)


def test_worker_child_sigkill_mid_run(site):
    """SIGKILL the pool process executing a run: the run ends failed(worker_lost) within
    seconds, its server's whole group is gone and the port and GPU lease are free; the next
    run of the sweep runs once and succeeds."""
    worker = site.worker()
    a, b = _long_then_short(site, "child-kill")
    a = _until(site, a)
    GpuLease.objects.create(host=site.host, gpu_uuid=GPU["uuid"], run=a, expires_at=a.deadline_at)
    assert a.worker_pid in worker.children()
    leader_group = group_members(a.server_pgid)
    assert len(leader_group) == 2  # the server and its forked child
    t0 = time.monotonic()
    os.kill(a.worker_pid, signal.SIGKILL)
    a = _reaped(site, a)
    recovered_s = time.monotonic() - t0
    print(f"\nchild SIGKILL: recovered in {recovered_s:.1f} s")
    assert a.failure_reason == "worker_lost", (a.failure_reason, a.failure_message)
    assert str(a.worker_pid) in a.failure_message
    _assert_cleaned_up(a)
    b = cp.wait_for(lambda: (r := _run(b.pk)).state in (RunState.SUCCEEDED, RunState.FAILED) and r, 60,
                    lambda: f"run {b.pk} to finish\n" + site.logs())
    assert b.state == RunState.SUCCEEDED, (b.failure_reason, b.failure_message, site.logs())
    assert (_claims(a), _claims(b)) == (1, 1)  # nothing ran twice
    # the killed task's message was requeued at the back of the queue (reject_on_worker_lost): it
    # comes after run b's and is recorded as a duplicate delivery, never run again
    cp.wait_for(lambda: RunTransition.objects.filter(run=a, note__startswith="duplicate delivery ignored").exists(),
                30, lambda: "the requeued message of run a\n" + site.logs())
    assert _claims(a) == 1
    notes = list(RunTransition.objects.filter(run=a).values_list("note", flat=True))
    assert any("released 1 GPU lease" in n for n in notes), notes
    assert worker.proc.poll() is None  # the worker itself lives on
    seen = Host.objects.get(pk=site.host.pk).worker_seen_at  # the worker's own heartbeat (runs.worker)
    assert seen is not None and (timezone.now() - seen).total_seconds() < 10


def test_worker_parent_sigkill_mid_run(site):
    """SIGKILL the worker's main process: Celery's pool child dies with it, PDEATHSIG stops the
    server leader at once, and the leftover server process (holding the port) is stopped by the
    reaper when a worker comes back, which fails the run worker_lost within seconds."""
    worker = site.worker()
    a, b = _long_then_short(site, "parent-kill")
    a = _until(site, a)
    leader = a.server_pgid
    os.kill(worker.pid, signal.SIGKILL)
    cp.wait_for(lambda: not psutil.pid_exists(a.worker_pid), 10, "the pool child to die with its parent")
    cp.wait_for(lambda: leader not in group_members(leader), 10, "PDEATHSIG to stop the server leader")
    assert len(tagged_processes(a.server_tag)) == 1 and not cp.port_free(a.spec["port"])  # the child holds it
    assert _run(a.pk).state == RunState.MEASURING  # nobody alive to notice yet
    worker.stop()
    t0 = time.monotonic()
    site.worker()
    a = _reaped(site, a)
    recovered_s = time.monotonic() - t0
    print(f"\nparent SIGKILL: recovered in {recovered_s:.1f} s after the worker came back")
    assert a.failure_reason == "worker_lost", (a.failure_reason, a.failure_message)
    _assert_cleaned_up(a)
    b = cp.wait_for(lambda: (r := _run(b.pk)).state in (RunState.SUCCEEDED, RunState.FAILED) and r, 60,
                    lambda: f"run {b.pk} to finish\n" + site.logs())
    assert b.state == RunState.SUCCEEDED, (b.failure_reason, b.failure_message, site.logs())
    assert (_claims(a), _claims(b)) == (1, 1)


def test_hard_time_limit_kill_of_a_hung_teardown_is_reaped_from_beat(site):
    """The issue's "hard time-limit kill leaves the run in warming": the soft limit fires, the
    teardown hangs on a server that ignores SIGTERM, and the parent kills the pool process at the
    hard limit and acks the message (no redelivery). Beat's supervise task, run by the
    replacement pool process, fails the run `run_timeout` (its bound has passed) and SIGKILLs the
    server's group. The limits are compressed here: bound 3 + 1 + 4 = 8 s, soft limit 5 s, hard
    8.7 s (enqueue_runs uses the bound and the bound + 120 s)."""
    worker = site.worker()
    site.beat()
    spec = cp.synthetic_sweep("hard-limit", site.model, cp.free_port(), output_len=[300], gap_ms=20,
                              server_args=("--ignore-sigterm",),
                              limits={"ready_timeout_s": 3, "run_timeout_s": 1, "stop_timeout_s": 4})
    a = Run.objects.get(sweep=create_sweep(spec, site.host, source="test", enqueue=False))
    code = ("from celery import current_app as app; from runs.models import Run; from django.utils import timezone; "
            f"Run.objects.filter(pk={a.pk}).update(sent_at=timezone.now()); "
            f"app.send_task('runs.execute_runs', args=[[{a.pk}]], queue='host.{site.host_name}', "
            "soft_time_limit=5, time_limit=8.7)")
    cp.manage(site.env, "shell", "-c", code)
    a = _until(site, a, RunState.WARMING)
    cp.wait_for(lambda: "TimeLimitExceeded" in worker.log(50000), 30, worker.log)
    t0 = time.monotonic()
    assert _run(a.pk).state == RunState.WARMING  # what the issue saw: left active, nobody to end it
    a = _reaped(site, a)
    print(f"\nhard time limit: recovered in {time.monotonic() - t0:.1f} s")
    assert a.failure_reason == "run_timeout", (a.failure_reason, a.failure_message)
    _assert_cleaned_up(a)
    notes = " | ".join(RunTransition.objects.filter(run=a).values_list("note", flat=True))
    assert "SIGKILL needed" in notes, notes  # SIGTERM was ignored
    assert _claims(a) == 1 and "duplicate delivery" not in notes  # acked at the hard limit, not redelivered


def _finished(sweep: Sweep, n: int):
    runs = list(Run.objects.filter(sweep=sweep).order_by("id"))
    done = [r for r in runs if r.state in (RunState.SUCCEEDED, RunState.FAILED)]
    return runs if len(runs) == n and len(done) == n else None


@pytest.mark.parametrize("crash", ["sigkill", "sigkill-and-data-lost"])
def test_redis_restart_mid_sweep_loses_and_repeats_nothing(site, crash):
    """Kill Redis while run 2 of a 6-run sweep measures and start it again. With AOF (the
    embedded default) the queue survives; with the data gone too (a Redis without persistence)
    the reconciler re-sends the runs whose messages vanished. Either way: 6 runs, each claimed
    once, all succeeded."""
    site.worker()
    site.beat()  # sends the supervise entry the worker registered, which runs the reconciler
    sweep = site.sweep(f"redis-{crash}", output_len=[20, 21, 22, 23, 24, 25], gap_ms=20, share_server=False)
    second = Run.objects.filter(sweep=sweep).order_by("id")[1]
    cp.wait_for(lambda: _run(second.pk).state == RunState.MEASURING, 90, lambda: "run 2 to measure\n" + site.logs())
    if crash == "sigkill-and-data-lost":
        site.redis.wipe()
    site.redis.kill(signal.SIGKILL)
    time.sleep(1.0)
    t0 = time.monotonic()
    site.redis.start()
    runs = cp.wait_for(lambda: _finished(sweep, 6), 150, lambda: "the sweep to finish\n" + site.logs())
    recovered_s = time.monotonic() - t0
    print(f"\nredis {crash}: sweep finished {recovered_s:.1f} s after the restart")
    assert [r.state for r in runs] == [RunState.SUCCEEDED] * 6, [(r.pk, r.state, r.failure_reason) for r in runs]
    assert [_claims(r) for r in runs] == [1] * 6  # 0 lost, 0 run twice
    resent = RunTransition.objects.filter(run__sweep=sweep, note__startswith="re-sent by the reconciler")
    if crash == "sigkill":
        assert not resent.exists()  # nothing was lost, so nothing was re-sent
    else:
        assert set(resent.values_list("run_id", flat=True)) >= {r.pk for r in runs[2:]}


def _nightly(site, tmp_path) -> PeriodicTask:
    """A nightly schedule (manage.py schedule_nightly) of a synthetic sweep file, one hour ago and
    never run since yesterday, so a beat starting now sends it at once (a missed night)."""
    import yaml

    spec = cp.synthetic_sweep("nightly", site.model, cp.free_port()).to_dict()
    path = tmp_path / "nightly.yaml"
    path.write_text(yaml.safe_dump({k: spec[k] for k in ("name", "engine", "engine_build", "model", "port",
                                                         "server", "grid", "workload", "limits")}))
    hour = (timezone.now().hour - 1) % 24
    cp.manage(site.env, "schedule_nightly", str(path), "--hour", str(hour), "--host", site.host_name)
    task = PeriodicTask.objects.get(task="runs.start_sweep_from_file", queue=f"host.{site.host_name}")
    PeriodicTask.objects.filter(pk=task.pk).update(last_run_at=timezone.now() - timedelta(days=1))
    return task


def test_two_beats_and_a_resend_make_one_sweep(site, tmp_path):
    """Two beat processes both send the missed nightly entry, and it is sent once more by hand
    with the same schedule name: one sweep for the night, the other sends say so."""
    worker = site.worker()
    task = _nightly(site, tmp_path)
    beats = [site.beat(), site.beat()]
    t0 = time.monotonic()
    for b in beats:
        cp.wait_for(lambda b=b: "Sending due task " + task.name in b.log(20000), 60, lambda b=b: b.log())
    code = ("import json; from celery import current_app as app; "
            f"app.send_task('runs.start_sweep_from_file', kwargs=json.loads({task.kwargs!r}), "
            f"queue='host.{site.host_name}', "
            f"headers={{'periodic_task_name': {task.name!r}}})")
    cp.manage(site.env, "shell", "-c", code)
    cp.wait_for(lambda: worker.log(50000).count("this send created nothing") >= 2, 60, worker.log)
    sweeps = list(Sweep.objects.filter(host=site.host))
    print(f"\ntwo beats + a resend: settled in {time.monotonic() - t0:.1f} s, {len(sweeps)} sweep(s)")
    assert len(sweeps) == 1
    assert (sweeps[0].schedule, sweeps[0].window) == (task.name, datetime.now(UTC).date())
    time.sleep(2)  # a late third message would show here
    assert Sweep.objects.filter(host=site.host).count() == 1
