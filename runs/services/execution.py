"""Execute one queued run: claim it, hold its GPUs, call benchkit.execution.runner, store the outcome.

Slow I/O (server start, load) happens outside any transaction; the outcome is stored in one
transaction (runs.services.outcomes.store_outcome), so a crash leaves the run `failed` with a
reason and never half-stored metrics.
A worker that dies mid-run leaves the run to the reaper (runs.services.supervision), which the
claim feeds: the claim records the executing process, a heartbeat thread keeps the run's
heartbeat, and the server's process group and tag are recorded as soon as it starts.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from pathlib import Path

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import connection

from benchkit.execution.outcome import RunOutcome
from benchkit.execution.runner import execute_runs
from benchkit.specs import RunSpec
from runs.models import ACTIVE_STATES, Host, Run, RunState
from runs.services import dbretry, leases, regressions, supervision
from runs.services.outcomes import store_outcome
from runs.services.transitions import IllegalTransition, record, transition

log = logging.getLogger(__name__)

#: Progress is written to the run row at most this often (seconds).
PROGRESS_MIN_INTERVAL_S = 1.0


class _DjangoHooks:
    """benchkit.execution.runner hooks that write state transitions and throttled progress to the run row."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self._last_progress = 0.0
        self._thread = threading.get_ident()

    def state(self, name: str, note: str = "") -> None:
        """Move the run to benchkit's phase `name` (preflight, starting, warming, measuring, stopping).

        Through a database outage the move is retried (dbretry.retry: the run waits, its server
        idles) and raises dbretry.DatabaseUnavailable after DRAFTBOARD_DB_RETRY_MAX_S."""
        if self.run.state != name:
            dbretry.retry(lambda: self._move(name, note), f"run {self.run.pk}: move to {name}")
            self._close_foreign()

    def _move(self, name: str, note: str) -> None:
        """One try of the move: a try whose commit went through before the connection broke
        finds the run already in `name`."""
        current = Run.objects.filter(pk=self.run.pk).values_list("state", flat=True).first()
        if current == name:
            self.run.state = name
            return
        transition(self.run, name, note=note)

    def progress(self, done: int, total: int) -> None:
        """Record `done` of `total` measured requests, at most once per PROGRESS_MIN_INTERVAL_S."""
        now = time.monotonic()
        if done < total and now - self._last_progress < PROGRESS_MIN_INTERVAL_S:
            return
        self._last_progress = now
        try:
            Run.objects.filter(pk=self.run.pk).update(progress_done=done, progress_total=total)
        except dbretry.TRANSIENT:  # the database is away: this progress line is skipped, never the run
            dbretry.close_quietly()
        self._close_foreign()

    def _close_foreign(self) -> None:
        """Close this thread's DB connection when it is not the thread that made the hooks: the
        load client reports from its own threads, Django's connections are per thread, and no
        request cycle ever closes a worker thread's (PostgreSQL kept one idle connection per
        finished client thread, and test teardown could not drop the database)."""
        if threading.get_ident() != self._thread:
            connection.close()

    def server_started(self, pgid: int, tag: str) -> None:
        """Record the run's managed server (process group `pgid`, tag `tag`) for the reaper."""
        dbretry.retry(lambda: supervision.record_server([self.run.pk], pgid, tag), f"run {self.run.pk}: record server")


def execute(run_id: int) -> Run:
    """Execute queued run `run_id` on a server of its own; see execute_group."""
    return execute_group([run_id])[0]


def execute_group(run_ids: list[int]) -> list[Run]:
    """Execute queued runs that share one server start (same RunSpec.server_key(), same
    host), in the given order, and return them in their final states.

    First reaps the host's runs whose worker died (supervision.reap), so their GPUs and ports
    are free. Runs that are no longer queued were delivered before: each is left untouched and
    the duplicate delivery is recorded in its history (a run is claimed at most once). Then
    leases the GPUs: raises leases.GpusBusy (the runs stay queued; the task retries later) when
    another run holds one. Then claims each run atomically (queued -> preflight), recording the
    executing process and its deadline (supervision.claim_fields); a heartbeat thread runs while
    they execute. A quarantined host fails the runs with `host_quarantined`. Never raises for a
    benchmark failure: those end as state `failed` with `failure_reason`.
    """
    first = Run.objects.select_related("host").filter(pk__in=run_ids).first()
    if first is None:
        return []
    supervision.reap(first.host)
    runs = list(Run.objects.select_related("host").filter(pk__in=run_ids))
    runs.sort(key=lambda r: run_ids.index(r.pk))
    for state in sorted({r.state for r in runs if r.state != RunState.QUEUED}):
        record([r for r in runs if r.state == state],
               f"duplicate delivery ignored: the run is already {state} (a run is claimed at most once)")
    todo = [r for r in runs if r.state == RunState.QUEUED]
    if not todo:
        log.info("runs %s are not queued: duplicate delivery, nothing to do", run_ids)
        return runs
    host: Host = todo[0].host
    if host.quarantined:
        why = f"host {host.name} is quarantined: {host.quarantine_reason}"
        failed = [transition(r, RunState.FAILED, failure_reason="host_quarantined", failure_message=why) for r in todo]
        regressions.runs_finished([r.pk for r in failed])
        return failed
    specs = [RunSpec.from_dict(r.spec) for r in todo]
    ttl = sum(leases.total_limit_s(sp.limits) for sp in specs)
    holder = todo[0]
    leases.acquire(holder, [g.uuid for g in specs[0].gpus], ttl_s=ttl)
    supervision.mark_executing([r.pk for r in todo])
    try:
        claimed = []
        tag = uuid.uuid4().hex  # names this server start's processes (benchkit.hosts.teardown.SERVER_TAG_ENV)
        for run, spec in zip(todo, specs, strict=True):
            try:
                claim = supervision.claim_fields(ttl)
                note = (f"claimed by worker pid {claim['worker_pid']} on {claim['worker_node']}"
                        + (" (shares one server start)" if len(todo) > 1 else ""))
                transition(run, RunState.PREFLIGHT, note=note, server_tag=tag, **claim)
                claimed.append((run, spec))
            except IllegalTransition:
                continue
        if not claimed:
            return [Run.objects.get(pk=r.pk) for r in runs]
        workdir = Path(settings.DRAFTBOARD_RUNS_DIR) / f"run-{claimed[0][0].pk}"
        hooks = [_DjangoHooks(run) for run, _ in claimed]
        try:
            with supervision.Heartbeat([run.pk for run, _ in claimed]):
                outcomes = execute_runs([sp for _, sp in claimed], hooks, workdir, server_tag=tag)
        except SoftTimeLimitExceeded:  # the task's bound (leases.total_limit_s); the server was stopped
            outcomes = [RunOutcome(ok=False, reason="run_timeout", message=f"the runs exceeded {ttl:.0f} s")
                        for _ in claimed]
        except dbretry.DatabaseUnavailable as exc:  # a state move waited out DRAFTBOARD_DB_RETRY_MAX_S
            outcomes = [RunOutcome(ok=False, reason=dbretry.REASON, message=f"{exc}; the runner stopped there, "
                                   "so no request logs were kept") for _ in claimed]
        except Exception as exc:  # a bug in our own code: still end failed, never stuck
            log.exception("runs %s crashed", [r.pk for r, _ in claimed])
            outcomes = [RunOutcome(ok=False, reason="internal_error", message=f"{type(exc).__name__}: {exc}")
                        for _ in claimed]
        finished = {}
        try:
            for (run, _), outcome in zip(claimed, outcomes, strict=True):
                stored = dbretry.retry(lambda run=run, outcome=outcome: _store(run.pk, outcome),
                                       f"run {run.pk}: store its outcome")
                if stored is not None:
                    finished[run.pk] = stored
            dbretry.retry(lambda: regressions.runs_finished(list(finished)), f"runs {list(finished)}: queue checks")
        except dbretry.DatabaseUnavailable as exc:  # the reaper fails them as soon as the database is back
            left = [run.pk for run, _ in claimed if run.pk not in finished]
            log.error("runs %s: outcome not stored: %s", left, exc)
            supervision.note_unstored(left, f"{exc}; the outcome was lost with the task (its request logs too)")
            raise
        return dbretry.retry(lambda: [finished.get(r.pk) or Run.objects.get(pk=r.pk) for r in runs], "reload runs")
    finally:
        supervision.mark_executing([])
        try:
            dbretry.retry(lambda: leases.release(holder), f"run {holder.pk}: release its GPU leases")
        except dbretry.DatabaseUnavailable as exc:  # the reaper releases them (the server is stopped)
            log.error("GPU leases of run %s not released: %s", holder.pk, exc)


def _store(run_id: int, outcome: RunOutcome) -> Run | None:
    """One try of storing `outcome` as run `run_id`'s end (a fresh read each try: a try that
    failed left nothing, see store_outcome); None when the run already ended (the reaper took
    it for lost: a worker stuck past its limit), which its history then says."""
    run = Run.objects.select_related("host").get(pk=run_id)
    if run.state not in ACTIVE_STATES:
        record([run], f"outcome not stored ({outcome.reason or 'ok'}): the run was already {run.state}")
        return None
    return store_outcome(run, outcome)


def fail_queued(run_id: int, reason: str, message: str) -> Run:
    """Fail a run that never started (e.g. its GPUs stayed busy past every retry)."""
    run = Run.objects.get(pk=run_id)
    if run.state != RunState.QUEUED:
        return run
    run = transition(run, RunState.FAILED, failure_reason=reason, failure_message=message)
    regressions.runs_finished([run.pk])
    return run
