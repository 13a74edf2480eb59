"""Run supervision and delivery reconciliation (issue 11): which worker process executes a run,
whether it still lives, what to do when it died, and re-sending runs whose message was lost.

Recorded on each active run (written with its claim in runs.services.execution, see
`claim_fields`): `worker_node` (machine), `worker_pid` (the process executing the task),
`deadline_at` (claim time + the runs' bound, leases.total_limit_s, which is also the task's
soft time limit) and `heartbeat_at` (written every DRAFTBOARD_HEARTBEAT_INTERVAL_S by a thread
of that process, `Heartbeat`); once its managed server runs, `server_pgid` and `server_tag`
(benchkit.hosts.teardown.SERVER_TAG_ENV, inherited by every process of that server start).

The reaper (`reap`) runs on the host's own worker, where those pids and process groups live: at
worker start (`worker_started`, from runs.worker), at the start of every run task
(execution.execute_group) and every DRAFTBOARD_SUPERVISE_INTERVAL_S from Celery beat
(`supervise`; one beat entry per host queue, `ensure_schedule`). An active run is lost when

- its worker process is gone: on this machine, its pid no longer exists, is a zombie, or names
  a process started after the claim (a reused pid); where the process cannot be checked from
  here (another machine, no pid recorded), its heartbeat is older than
  DRAFTBOARD_HEARTBEAT_TIMEOUT_S;
- or its worker process still lives but is past the deadline plus the hard time limit's grace
  (stuck where Celery's hard time limit could not kill it).

A live worker's run is never failed before that: a heartbeat that stops while the process
lives is logged, not acted on. A lost run is failed `run_timeout` when its deadline has passed,
else `worker_lost`; every process of its server start still alive is stopped (found by tag,
then verified as teardown does; survivors quarantine the host), its GPUs must come back to their
idle baseline (else the host is quarantined), and the GPU leases of its server start are
released. The move to `failed` is conditional (transitions.transition), so a worker that moves
the run first wins and the reaper leaves it alone.

Clocks: pids and heartbeats are compared on the host's own machine (`timezone.now()` there);
`sent_at` is written by whichever machine sends (web server, worker), so the reconciler's
margin (DRAFTBOARD_RECONCILE_MARGIN_S) also absorbs clock skew between machines.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import psutil
from django.conf import settings
from django.db import DatabaseError, connection
from django.db.models import Q
from django.utils import timezone
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from benchkit.hosts import preflight, teardown
from benchkit.specs import Limits
from runs.models import ACTIVE_STATES, GpuLease, Host, Run, RunState, Sweep
from runs.services import dispatch, hosts, regressions
from runs.services.transitions import IllegalTransition, record, transition

log = logging.getLogger(__name__)

#: Name prefix of the beat entry that supervises each host (`ensure_schedule`).
SCHEDULE_PREFIX = "supervise host "
#: At most this many lost runs are re-sent per reconcile call (bounded work; the next one
#: takes the rest).
RECONCILE_BATCH = 500


def this_node() -> str:
    """This machine's name, as recorded in `Run.worker_node`."""
    return socket.gethostname()


def claim_fields(ttl_s: float, now: datetime | None = None) -> dict:
    """Run columns written together with a claim (queued -> preflight) by the process that will
    execute the run: machine, pid, first heartbeat, deadline (now + `ttl_s` seconds)."""
    now = now or timezone.now()
    return dict(worker_node=this_node(), worker_pid=psutil.Process().pid, heartbeat_at=now,
                deadline_at=now + timedelta(seconds=ttl_s))


def record_server(run_ids: list[int], pgid: int, tag: str) -> None:
    """Record the managed server of runs `run_ids`: its process-group id and its tag."""
    Run.objects.filter(pk__in=run_ids).update(server_pgid=pgid, server_tag=tag)


def _worker_file(pid: int, node: str | None = None) -> Path:
    return Path(settings.DRAFTBOARD_RUNS_DIR) / "workers" / f"{node or this_node()}-{pid}.json"


def _unstored_file(run_id: int) -> Path:
    return Path(settings.DRAFTBOARD_RUNS_DIR) / "unstored" / f"run-{run_id}.json"


def mark_executing(run_ids: list[int]) -> None:
    """Record, in a file of this worker process (no database needed), that it now executes runs
    `run_ids` ([] when its task ended). The reaper reads it (`executing_runs`) to tell a worker
    that is stuck in a run from one that moved on. Written before the claim; never raises."""
    path = _worker_file(os.getpid())
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"run_ids": list(run_ids), "at": timezone.now().isoformat()}))
        tmp.replace(path)
    except OSError as exc:
        log.warning("could not record the runs of worker pid %s (%s): the reaper will not tell "
                    "a worker that moved on from a stuck one", os.getpid(), exc)


def executing_runs(pid: int, node: str | None = None, since: datetime | None = None) -> list[int] | None:
    """The runs worker process `pid` on this machine says it executes now (`mark_executing`), or
    None when it never said (an older worker, an unreadable file) or said it before `since` (a
    run's claim: the marker written before the claim lists the run, a later one tells whether
    the process moved on)."""
    try:
        found = json.loads(_worker_file(pid, node).read_text())
        if since is not None and datetime.fromisoformat(found["at"]) < since:
            return None
        return [int(i) for i in found["run_ids"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def note_unstored(run_ids: list[int], message: str) -> None:
    """Leave, beside the runs folder, why runs `run_ids`' outcome could not be stored (the
    database stayed unavailable past DRAFTBOARD_DB_RETRY_MAX_S): the reaper fails them
    `database_unavailable` with this message as soon as the database is back. Never raises."""
    for run_id in run_ids:
        path = _unstored_file(run_id)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"message": message, "at": timezone.now().isoformat()}))
        except OSError as exc:
            log.warning("run %s: could not note its unstored outcome (%s)", run_id, exc)


def _unstored(run_id: int) -> str | None:
    try:
        return json.loads(_unstored_file(run_id).read_text())["message"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def beat(run_ids: list[int], now: datetime | None = None) -> int:
    """Write the heartbeat of the still-active runs among `run_ids`; returns how many."""
    return Run.objects.filter(pk__in=run_ids, state__in=ACTIVE_STATES).update(heartbeat_at=now or timezone.now())


class Heartbeat:
    """Context manager: a daemon thread of the executing process writes `beat(run_ids)` every
    `interval_s` seconds (default DRAFTBOARD_HEARTBEAT_INTERVAL_S) until the block exits.

    A database error skips one beat (logged) and the connection is reopened for the next; the
    thread closes its own connection when it ends."""

    def __init__(self, run_ids: list[int], interval_s: float | None = None):
        self.run_ids = list(run_ids)
        self.interval_s = float(interval_s or settings.DRAFTBOARD_HEARTBEAT_INTERVAL_S)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"heartbeat-runs-{self.run_ids}", daemon=True)

    def _loop(self) -> None:
        try:
            while not self._stop.wait(self.interval_s):
                try:
                    beat(self.run_ids)
                except DatabaseError as exc:
                    log.warning("heartbeat of runs %s skipped: %s", self.run_ids, exc)
                    connection.close()
        finally:
            connection.close()

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def process_alive(pid: int, claimed_at: datetime | None) -> bool:
    """True when `pid` on this machine is a live, non-zombie process that already existed at
    `claimed_at` (a process created later reuses the number: the claimer is gone). A process
    psutil may not inspect counts as alive (never fail a live worker's run)."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return claimed_at is None or proc.create_time() <= claimed_at.timestamp() + 1.0
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def verdict(run: Run, now: datetime, node: str | None = None) -> tuple[str, str] | None:
    """Why active `run` must be failed now, as (reason, message), or None while its worker
    lives (see the module docstring for the rules). Reasons: `worker_lost`, `run_timeout`, and
    `database_unavailable` for a run its worker could not store (`note_unstored`)."""
    node = node or this_node()
    overdue = run.deadline_at is not None and now > run.deadline_at
    reason = "run_timeout" if overdue else "worker_lost"
    bound = f"; its bound ended {run.deadline_at:%Y-%m-%d %H:%M:%S} UTC" if overdue else ""
    if run.worker_node == node and run.worker_pid:
        if not process_alive(run.worker_pid, run.started_at):
            return reason, f"the worker process {run.worker_pid} on {node} that ran it is gone{bound}"
        executing = executing_runs(run.worker_pid, node, since=run.started_at)
        if executing is not None and run.pk not in executing:
            unstored = _unstored(run.pk)
            if unstored:
                return "database_unavailable", unstored
            doing = f"it now executes runs {executing}" if executing else "its task ended"
            return reason, (f"the worker process {run.worker_pid} on {node} lives but moved on ({doing}) without "
                            f"storing this run's outcome{bound}")
        grace = timedelta(seconds=dispatch.HARD_LIMIT_GRACE_S + settings.DRAFTBOARD_HEARTBEAT_TIMEOUT_S)
        if run.deadline_at is not None and now > run.deadline_at + grace:
            return "run_timeout", (f"the worker process {run.worker_pid} on {node} is still alive but stuck past "
                                   f"its hard time limit{bound}")
        last = run.heartbeat_at or run.started_at
        if last is not None and (now - last).total_seconds() > settings.DRAFTBOARD_HEARTBEAT_TIMEOUT_S:
            log.warning("run %s: no heartbeat since %s, but its worker process %s still lives; left running",
                        run.pk, last, run.worker_pid)
        return None
    last = run.heartbeat_at or run.started_at or run.created_at
    silent_s = (now - last).total_seconds()
    if silent_s > settings.DRAFTBOARD_HEARTBEAT_TIMEOUT_S:
        who = f"{run.worker_node or 'an unknown machine'} pid {run.worker_pid or '?'}"
        return reason, f"no heartbeat for {silent_s:.0f} s from its worker ({who}){bound}"
    return None


@dataclass
class Reaped:
    """One run the reaper failed: its id, reason, message and what the clean-up did."""

    run_id: int
    reason: str
    message: str
    cleanup: list[str] = field(default_factory=list)


def reap(host: Host, now: datetime | None = None) -> list[Reaped]:
    """Fail the lost active runs of `host` and clean up after them (module docstring); returns
    what was done. Runs of a live worker are left alone; never raises for a run that another
    process moved meanwhile."""
    node = this_node()
    done = []
    for run in Run.objects.filter(host=host, state__in=ACTIVE_STATES).order_by("id"):
        found = verdict(run, now or timezone.now(), node)
        if found is None:
            continue
        reason, message = found
        try:
            transition(run, RunState.FAILED, note=f"reaper: {message}", failure_reason=reason,
                       failure_message=message)
        except IllegalTransition:
            continue  # its worker moved it first: alive after all
        notes = clean_up(run, node)
        if notes:
            record([run], "reaper: " + "; ".join(notes))
        log.warning("run %s failed %s by the reaper: %s (%s)", run.pk, reason, message, "; ".join(notes))
        done.append(Reaped(run.pk, reason, message, notes))
        _unstored_file(run.pk).unlink(missing_ok=True)
    confirm_leases(host, node)
    if done:
        regressions.runs_finished([r.run_id for r in done])
    return done


def clean_up(run: Run, node: str | None = None) -> list[str]:
    """After failing a lost run: stop every process of its server start still alive (by tag,
    verified), check its GPUs are back at their idle baseline, quarantine the host when either
    fails, and release the GPU leases of its server start. Returns notes for its history."""
    node = node or this_node()
    notes: list[str] = []
    holders = Q(run=run) | (Q(run__server_tag=run.server_tag) if run.server_tag else Q(pk__in=[]))
    if run.worker_node and run.worker_node != node:
        why = f"its server ran on {run.worker_node}, not on this machine ({node}): processes not checked"
        kept = GpuLease.objects.filter(holders, host_id=run.host_id).update(unconfirmed=why)
        notes.append(why + (f"; {kept} GPU lease(s) kept until {run.worker_node}'s worker confirms its server "
                            "stopped" if kept else ""))
        return notes
    else:
        limits = Limits(**(run.spec.get("limits") or {}))
        if run.server_tag:
            report = teardown.stop_tagged_processes(run.server_tag, term_timeout_s=limits.stop_timeout_s)
            if report.terminated:
                notes.append(f"stopped its server's processes {sorted(report.terminated)} (group {run.server_pgid})"
                             + (f", SIGKILL needed for {report.killed}" if report.killed else ""))
            if not report.clean:
                hosts.quarantine(run.host_id, f"run {run.pk}: server processes {report.survivors} survived the reaper")
                notes.append(f"processes {report.survivors} survived: host quarantined")
                why = f"processes {report.survivors} of its server survived the reaper"
                kept = GpuLease.objects.filter(holders, host_id=run.host_id).update(unconfirmed=why)
                if kept:
                    notes.append(f"{kept} GPU lease(s) kept: its server is not known stopped")
                    return notes
        uuids = [g["uuid"] for g in run.gpus or [] if g.get("uuid")]
        if uuids:
            try:
                preflight.gpus_back_to_baseline(uuids)
            except preflight.PreflightError as exc:
                hosts.quarantine(run.host_id, f"run {run.pk}: GPUs not idle after the reaper: {exc.message}")
                notes.append(f"GPUs not idle ({exc.message}): host quarantined")
    released, _ = GpuLease.objects.filter(holders, host_id=run.host_id).delete()
    if released:
        notes.append(f"released {released} GPU lease(s)")
    return notes


def confirm_leases(host: Host, node: str | None = None) -> list[int]:
    """On the machine that ran them: release the leases the reaper kept (`GpuLease.unconfirmed`)
    of `host`'s finished runs once none of their server start's processes is alive (stopping
    any it finds by tag, as `clean_up` does). Leases of runs of other machines stay. Returns the
    ids of the runs whose leases were released."""
    node = node or this_node()
    freed = []
    kept = (GpuLease.objects.filter(host=host).exclude(unconfirmed="").exclude(run__state__in=ACTIVE_STATES)
            .select_related("run"))
    for run in {lease.run for lease in kept}:
        if run.worker_node and run.worker_node != node:
            continue
        if run.server_tag:
            limits = Limits(**(run.spec.get("limits") or {}))
            if not teardown.stop_tagged_processes(run.server_tag, term_timeout_s=limits.stop_timeout_s).clean:
                continue
        n, _ = GpuLease.objects.filter(run=run).delete()
        record([run], f"reaper: {n} GPU lease(s) released: its server is known stopped on {node}")
        freed.append(run.pk)
    return freed


def reconcile(host: Host, checkpoint: datetime) -> list[int]:
    """Re-send the queued runs of `host` whose message was lost; returns their ids.

    `checkpoint` is when the message that called this was sent to the host's queue (the marker
    `supervise` sends). The host's one worker takes messages off its queue in order, so when the
    marker runs, every message sent before it has been taken: a run still `queued` whose
    `sent_at` is older than the checkpoint by more than DRAFTBOARD_RECONCILE_MARGIN_S has lost
    its message (the broker restarted without it, the send failed, or a worker died holding it
    before the claim, when it would only come back after the broker's visibility timeout).
    A run waiting for busy GPUs has `sent_at` set to its next attempt (dispatch.expect_redelivery),
    so it is not taken for lost. Runs never sent (stored with --no-enqueue) are left alone.
    Each re-sent run gets a history note; if its old message turns up later, the claim refuses
    it and execution records a duplicate delivery: a run is never executed twice.
    """
    cutoff = checkpoint - timedelta(seconds=settings.DRAFTBOARD_RECONCILE_MARGIN_S)
    lost = list(Run.objects.filter(host=host, state=RunState.QUEUED, sent_at__lt=cutoff)
                .order_by("id").values_list("id", "sweep_id", "sent_at")[:RECONCILE_BATCH])
    if not lost:
        return []
    share = dict(Sweep.objects.filter(pk__in={s for _, s, _ in lost}).values_list("pk", "spec"))
    for sweep_id in sorted({s for _, s, _ in lost}):
        ids = [i for i, s, _ in lost if s == sweep_id]
        first_sent = min(t for i, s, t in lost if s == sweep_id)
        record(ids, f"re-sent by the reconciler: still queued, but its message (sent {first_sent:%H:%M:%S} UTC) "
                    f"is no longer on {host.queue} (checkpoint {checkpoint:%H:%M:%S} UTC)")
        dispatch.enqueue_runs(ids, host.queue, (share.get(sweep_id) or {}).get("share_server", True))
    ids = [i for i, _, _ in lost]
    log.warning("reconciler re-sent %d lost run(s) of host %s: %s", len(ids), host.name, ids)
    return ids


def touch_worker(host_names: list[str], worker_name: str = "", now: datetime | None = None) -> None:
    """Record that the worker of each host in `host_names` is alive now (Host.worker_seen_at)."""
    fields = {"worker_seen_at": now or timezone.now()}
    if worker_name:
        fields["worker_name"] = worker_name[:200]
    Host.objects.filter(name__in=host_names).update(**fields)


def ensure_schedule(host: Host):
    """The Celery-beat entry that sends the supervise task to `host`'s queue every
    DRAFTBOARD_SUPERVISE_INTERVAL_S seconds (django-celery-beat; a message that waited longer
    than one interval expires unexecuted). Created or corrected, never duplicated; returns it."""
    every = settings.DRAFTBOARD_SUPERVISE_INTERVAL_S
    interval, _ = IntervalSchedule.objects.get_or_create(every=every, period=IntervalSchedule.SECONDS)
    wanted = dict(task=dispatch.SUPERVISE_TASK, interval=interval, crontab=None, queue=host.queue,
                  kwargs=json.dumps({"host_name": host.name}), expire_seconds=every, enabled=True)
    task, created = PeriodicTask.objects.get_or_create(name=SCHEDULE_PREFIX + host.name, defaults=wanted)
    if not created and any(getattr(task, k) != v for k, v in wanted.items()):
        for key, value in wanted.items():
            setattr(task, key, value)
        task.save()
    return task


def worker_started(host_name: str, worker_name: str) -> list[Reaped]:
    """A worker for `host_name` has just started (runs.worker): record it, make sure beat
    supervises the host, reap the runs a dead worker left behind, and send a reconcile marker
    (`supervise`) so that messages lost while no worker ran are re-sent. Returns the reaped runs."""
    host = hosts.get_or_create_host(host_name)
    touch_worker([host.name], worker_name)
    ensure_schedule(host)
    reaped = reap(host)
    dispatch.send_supervise(host.name, host.queue, checkpoint=timezone.now())
    return reaped


def supervise(host_name: str, checkpoint: datetime | None = None) -> dict:
    """The supervise task's work on the host's own worker: mark the worker alive, reap, then
    either send a reconcile marker (beat's call, no `checkpoint`) or, as that marker, reconcile
    (`checkpoint` = when the marker was sent). Returns {"reaped": [ids], "resent": [ids]}."""
    host = hosts.get_or_create_host(host_name)
    touch_worker([host.name])
    reaped = [r.run_id for r in reap(host)]
    regressions.queue_pending_checks(host.pk)
    if checkpoint is None:
        dispatch.send_supervise(host.name, host.queue, checkpoint=timezone.now())
        return {"reaped": reaped, "resent": []}
    return {"reaped": reaped, "resent": reconcile(host, checkpoint)}
