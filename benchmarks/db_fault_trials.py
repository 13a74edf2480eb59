"""PostgreSQL faults under a real worker (issue 35): does a sweep recover, lose or repeat nothing?

    .venv/bin/python benchmarks/db_fault_trials.py [--trials 5]
        [--only measuring-restart,store-restart,after-window-restart,stopped-60s,beat-killed]

Everything runs against a PRIVATE PostgreSQL cluster (tests/celeryproc.PrivatePostgres: initdb in
a temp dir, its own port; never the machine's shared data) and a private Redis, with one real
Celery worker (-c 1, the host's queue) and one beat (runs.scheduler.ResilientScheduler), on the
synthetic engine build. The children run with short intervals (heartbeat 2 s, heartbeat timeout
20 s, supervise every 5 s). Each trial stores and sends a fresh 2-run sweep (a long run, 4 x 6 s
requests, then a short one, as tests/test_faults.py `_long_then_short`); when run 1 measures, a
fake GPU lease is added for it (the synthetic host has no GPUs) so the lease release is seen.
The faults:

- measuring-restart: `pg_ctl restart -m fast` 1 s into run 1's measuring.
- store-restart: when run 1 reaches `stopping`, a separate connection takes
  `LOCK TABLE runs_run IN ACCESS EXCLUSIVE MODE` (so the outcome store waits on it), then
  `pg_ctl restart -m fast` (which drops the lock and the waiting store's connection).
- after-window-restart: restart as soon as run 1 leaves measuring (no lock).
- stopped-60s: `pg_ctl stop -m fast` 1 s into run 1's measuring, 60 s down, then start.
- beat-killed: SIGKILL of the beat process 1 s into run 1's measuring. Nothing in this setup
  restarts beat (production relies on systemd Restart=always), so a trial counts as recovered
  only if a beat process is running again 30 s after the sweep ended; the worker's stand-in for
  a silent beat (runs.worker) is reported. The script starts a new beat before the next trial.

Per trial, measured: recovery s = from the database being back (beat-killed: from the kill)
until the sweep has no queued or active run (at most 240 s; it includes the rest of the sweep's
normal work: run 1's remaining requests and run 2; each trial line also says when run 1 itself
ended relative to that moment); lost = runs not final at the end;
twice = runs claimed more than once (queued -> preflight transitions); checks once = the sweep's
checks_queued_at is set and the worker log shows runs.check_lossless received exactly once for
the trial; leases left = GpuLease rows of the sweep's runs after it ended; the runs' states and
failure reasons. A trial is recovered when nothing was lost, nothing ran twice, the checks were
queued once and no lease was left. Figures depend on the machine's load. Like the other scripts
here it never fails on a figure (exit 0 after printing).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import sys
import tempfile
import time
import traceback
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

KINDS = ["measuring-restart", "store-restart", "after-window-restart", "stopped-60s", "beat-killed"]
SETTLE_TIMEOUT_S = 240
CHILD_INTERVALS = {"DRAFTBOARD_HEARTBEAT_INTERVAL_S": "2", "DRAFTBOARD_HEARTBEAT_TIMEOUT_S": "20",
                   "DRAFTBOARD_SUPERVISE_INTERVAL_S": "5"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _setup_env() -> tuple[int, Path]:
    """Environment of this process (before django.setup()): the private cluster's URL, a var dir."""
    port = _free_port()
    var = Path(tempfile.mkdtemp(prefix="dbfault-var-"))
    os.environ.update({"DJANGO_SETTINGS_MODULE": "benchsite.settings", "DRAFTBOARD_VAR_DIR": str(var),
                       "DATABASE_URL": f"postgres://postgres@127.0.0.1:{port}/draftboard",
                       "DRAFTBOARD_ENGINE_FLAGS": str(REPO / "tests" / "fixtures" / "synthetic_flags.yaml"),
                       **CHILD_INTERVALS})
    return port, var


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--only", default=",".join(KINDS), help=f"comma-separated, of: {', '.join(KINDS)}")
    args = parser.parse_args()
    kinds = [k.strip() for k in args.only.split(",") if k.strip()]
    for k in kinds:
        if k not in KINDS:
            parser.error(f"unknown kind {k!r}; kinds: {', '.join(KINDS)}")
    port, var = _setup_env()
    from tests import celeryproc as cp  # imports nothing of Django's models: safe before setup

    pg = cp.PrivatePostgres(port=port)
    redis = None
    procs: list = []
    rows = []
    try:
        pg.init().start()
        pg.createdb("draftboard")
        import django

        django.setup()
        bench = Bench(cp, pg, var, procs)
        bench.migrate()
        redis = cp.PrivateRedis().start()
        bench.start(redis)
        for kind in kinds:
            results = []
            for i in range(args.trials):
                try:
                    res = bench.trial(kind, i)
                except Exception as exc:  # a harness failure is a trial that did not recover
                    traceback.print_exc()
                    res = {"recovered": False, "recovery_s": None, "lost": None, "twice": None,
                           "checks_once": False, "leases_left": None, "outcomes": f"harness error: {exc}"}
                    bench.heal()
                results.append(res)
                took = "" if res["recovery_s"] is None else f" in {res['recovery_s']:.1f} s"
                print(f"{kind} trial {i + 1}/{args.trials}: {'recovered' if res['recovered'] else 'NOT RECOVERED'}"
                      f"{took}"
                      f"; lost {res['lost']}, twice {res['twice']}, checks once {res['checks_once']}, "
                      f"leases left {res['leases_left']}; {res['outcomes']}"
                      f"{'; ' + res['note'] if res.get('note') else ''}", flush=True)
            rows.append((kind, results))
    except Exception:
        traceback.print_exc()
    finally:
        for p in procs:
            try:
                p.stop()
            except Exception:
                traceback.print_exc()
        if redis is not None:
            try:
                redis.stop()
            except Exception:
                traceback.print_exc()
        try:
            from django.db import connection

            connection.close()
        except Exception:
            pass
        pg.destroy()
    print()
    print(f"{'kind':<22} {'trials':>6} {'recovered':>9} {'median s':>8} {'max s':>6} {'lost':>4} {'twice':>5} "
          f"{'checks-once':>11} {'leases left':>11}")
    for kind, results in rows:
        times = [r["recovery_s"] for r in results if r["recovery_s"] is not None]
        def total(key, results=results):
            return sum(r[key] for r in results if r[key] is not None)
        median = statistics.median(times) if times else float("nan")
        worst = max(times) if times else float("nan")
        print(f"{kind:<22} {len(results):>6} {sum(r['recovered'] for r in results):>9} "
              f"{median:>8.1f} {worst:>6.1f} "
              f"{total('lost'):>4} {total('twice'):>5} {sum(bool(r['checks_once']) for r in results):>11} "
              f"{total('leases_left'):>11}")
    sys.exit(0)


class Bench:
    """The site: a host, its worker and beat, and the trial of each kind."""

    def __init__(self, cp, pg, var: Path, procs: list):
        self.cp, self.pg, self.var, self.procs = cp, pg, var, procs
        self.tmp = var / "bench"
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.host_name = f"dbf-{uuid.uuid4().hex[:8]}"
        self.worker = self.beat = None

    def migrate(self) -> None:
        env = {**os.environ, "DATABASE_URL": self.pg.url()}
        self.cp.manage(env, "migrate", "--noinput")

    def start(self, redis) -> None:
        from runs.services.hosts import get_or_create_host

        self.env = self.cp.child_env(redis.url, self.host_name, self.tmp / "runs", extra=CHILD_INTERVALS)
        self.env["DATABASE_URL"] = self.pg.url()
        self.host = get_or_create_host(self.host_name)
        self.model = self.cp.synthetic_model(self.tmp)
        self.worker = self.cp.start_worker(self.env, self.host_name, self.tmp / "worker.log")
        self.procs.append(self.worker)
        self.new_beat()

    def new_beat(self) -> None:
        self.beat = self.cp.start_beat(self.env, self.tmp / f"beat-{len(self.procs)}.log")
        self.procs.append(self.beat)

    def heal(self) -> None:
        """After a harness error: the database up, a beat running."""
        try:
            if not self.pg.running():
                self.pg.start()
        except Exception:
            traceback.print_exc()
        if self.beat is None or self.beat.proc.poll() is not None:
            self.new_beat()

    # --- database reads that ride out the outage (None while it is away) ----------------------
    @staticmethod
    def q(fn):
        from django.db import InterfaceError, OperationalError, connection

        try:
            return fn()
        except (OperationalError, InterfaceError):
            try:
                connection.close()
            except Exception:
                pass
            return None

    def state(self, pk: int) -> str | None:
        from runs.models import Run

        return self.q(lambda: Run.objects.filter(pk=pk).values_list("state", flat=True).first())

    def wait(self, cond, timeout_s: float, what: str, poll_s: float = 0.2):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            v = cond()
            if v:
                return v
            time.sleep(poll_s)
        raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}\n{self.worker.log(3000)}")

    def check_received(self) -> int:
        text = self.worker.log_path.read_text(errors="replace")
        return sum(1 for line in text.splitlines() if "runs.check_lossless[" in line and "received" in line)

    # --- one trial ---------------------------------------------------------------------------
    def trial(self, kind: str, i: int) -> dict:
        from django.utils import timezone

        from runs.models import ACTIVE_STATES, GpuLease, Run, RunState, RunTransition, Sweep
        from runs.services.sweeps import create_sweep

        if self.beat is None or self.beat.proc.poll() is not None:
            self.new_beat()
        checks_before = self.check_received()
        spec = self.cp.synthetic_sweep(f"{kind}-{i}-{uuid.uuid4().hex[:4]}", self.model, self.cp.free_port(),
                                       output_len=[300, 8], gap_ms=20, share_server=False)
        sweep = create_sweep(spec, self.host, source="bench", enqueue=False)
        self.cp.manage(self.env, "enqueue_sweep", str(sweep.pk))
        a, b = Run.objects.filter(sweep=sweep).order_by("id")
        self.wait(lambda: (r := Run.objects.get(pk=a.pk)).state == RunState.MEASURING and r.server_pgid, 90,
                  f"run {a.pk} to measure")
        a = Run.objects.get(pk=a.pk)
        GpuLease.objects.create(host=self.host, gpu_uuid=f"GPU-dbf-{uuid.uuid4().hex[:8]}", run=a,
                                expires_at=a.deadline_at or timezone.now())
        note = ""
        if kind in ("measuring-restart", "stopped-60s", "beat-killed"):
            time.sleep(1.0)
        if kind == "measuring-restart":
            landed = self.state(a.pk)
            self.pg.restart()
            t_back, t_back_wall = time.monotonic(), timezone.now()
            note = f"fault landed in run 1 {landed}"
        elif kind == "stopped-60s":
            landed = self.state(a.pk)
            self.pg.stop()
            time.sleep(60)
            self.pg.start()
            t_back, t_back_wall = time.monotonic(), timezone.now()
            note = f"stopped during run 1 {landed}"
        elif kind in ("store-restart", "after-window-restart"):
            landed = self.wait(lambda: (s := self.state(a.pk)) not in (None, RunState.MEASURING) and s, 120,
                               f"run {a.pk} to leave measuring", poll_s=0.01)
            if kind == "store-restart":
                import psycopg

                conn = psycopg.connect(self.pg.url())
                conn.execute("SET lock_timeout = '5s'")
                conn.execute("LOCK TABLE runs_run IN ACCESS EXCLUSIVE MODE")
                landed_locked = conn.execute("SELECT state FROM runs_run WHERE id = %s", (a.pk,)).fetchone()[0]
                time.sleep(1.0)  # the outcome store (or the next state move) now waits on the lock
                waiting = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                       "AND datname = 'draftboard'").fetchone()[0]
                self.pg.restart()
                try:
                    conn.close()
                except Exception:
                    pass
                note = (f"run 1 seen {landed}, {landed_locked} under the lock, "
                        f"{waiting} connection(s) waiting on it at the restart")
            else:
                self.pg.restart()
                note = f"restart when run 1 was {landed}"
            t_back, t_back_wall = time.monotonic(), timezone.now()
        elif kind == "beat-killed":
            landed = self.state(a.pk)
            os.kill(self.beat.pid, signal.SIGKILL)
            self.beat.proc.wait(timeout=10)
            t_back, t_back_wall = time.monotonic(), timezone.now()
            note = f"beat SIGKILLed during run 1 {landed}"
        else:
            raise ValueError(kind)

        def settled():
            n = self.q(lambda: Run.objects.filter(sweep=sweep, state__in=[RunState.QUEUED, *ACTIVE_STATES]).count())
            return n == 0
        try:
            self.wait(settled, SETTLE_TIMEOUT_S, f"sweep {sweep.pk} to settle", poll_s=0.25)
            recovery_s = time.monotonic() - t_back
        except RuntimeError:
            recovery_s = None
        # the checks: stamped by the last path that ended a run, or the supervisor's catch-up
        try:
            self.wait(lambda: self.q(lambda: Sweep.objects.get(pk=sweep.pk).checks_queued_at) is not None
                      and self.check_received() > checks_before, 30, "the checks to be queued", poll_s=0.5)
        except RuntimeError:
            pass
        time.sleep(3)  # a late second check_lossless would show here
        runs = list(Run.objects.filter(sweep=sweep).order_by("id"))
        final = {RunState.SUCCEEDED, RunState.FAILED}
        lost = sum(r.state not in final for r in runs)
        claims = [RunTransition.objects.filter(run=r, from_state=RunState.QUEUED, to_state=RunState.PREFLIGHT).count()
                  for r in runs]
        twice = sum(c > 1 for c in claims)
        stamped = Sweep.objects.get(pk=sweep.pk).checks_queued_at is not None
        received = self.check_received() - checks_before
        checks_once = stamped and received == 1
        leases_left = GpuLease.objects.filter(run__sweep=sweep).count()
        outcomes = ", ".join(f"run {k + 1} {r.state}{f' ({r.failure_reason})' if r.failure_reason else ''}"
                             for k, r in enumerate(runs))
        if not checks_once:
            outcomes += f"; checks stamped {stamped}, check_lossless received {received}x"
        recovered = recovery_s is not None and lost == 0 and twice == 0 and checks_once and leases_left == 0
        if kind == "beat-killed":
            stood_in = "this worker sends its hosts the supervise task itself" in self.worker.log_path.read_text(
                errors="replace")
            time.sleep(max(0.0, 30 - (time.monotonic() - t_back)))
            alive = self.beat.proc.poll() is None  # nothing here restarts it: it stays dead
            recovered = recovered and alive
            note += (f"; beat restarted by anything: {'yes' if alive else 'no (no supervisor in this setup)'}"
                     f"; worker stood in for the silent beat: {'yes' if stood_in else 'no'}")
            if not alive:
                self.new_beat()
        if runs[0].finished_at:
            after = (runs[0].finished_at - t_back_wall).total_seconds()
            note += f"; run 1 final {after:.1f} s after the database was back (beat-killed: the kill)"
        for r in runs:
            if r.failure_reason:
                note += f"; run {r.pk}: {r.failure_message[:160]}"
        return {"recovered": recovered, "recovery_s": recovery_s, "lost": lost, "twice": twice,
                "checks_once": checks_once, "leases_left": leases_left, "outcomes": outcomes, "note": note}


if __name__ == "__main__":
    main()
