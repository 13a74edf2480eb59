"""Real processes for the fault tests (issue 11): a private Redis with the embedded default's AOF
settings, Celery workers and beats against the test database, `manage.py` commands, and sweeps on
the synthetic engine build (tests/fixtures/synthetic_flags.yaml), which starts
tests/synthetic_server.py as a managed server (a real process group) instead of vLLM.

Supervision intervals are shortened through settings in the child processes' environment
(SHORT_INTERVALS), never by sleeping long in a test.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
from django.db import connection

from benchkit.hosts import teardown
from benchkit.sweeps import sweepfile
from runs import localstack

REPO = Path(__file__).resolve().parents[1]
SYNTHETIC_FLAGS = REPO / "tests" / "fixtures" / "synthetic_flags.yaml"
#: Settings for the worker and beat processes of a fault test (seconds).
SHORT_INTERVALS = {
    "DRAFTBOARD_HEARTBEAT_INTERVAL_S": "1",
    "DRAFTBOARD_HEARTBEAT_TIMEOUT_S": "4",
    "DRAFTBOARD_SUPERVISE_INTERVAL_S": "2",
    "DRAFTBOARD_RECONCILE_MARGIN_S": "1",
}


def database_url() -> str:
    """A DATABASE_URL naming the database this test session uses (SQLite file or PostgreSQL)."""
    s = connection.settings_dict
    if s["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{s['NAME']}"
    return f"postgres://{s['USER']}:{s['PASSWORD'] or ''}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_free(port: int) -> bool:
    """True when `port` can be bound on 127.0.0.1 (with SO_REUSEADDR, as servers bind)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def wait_for(cond, timeout_s: float, what, poll_s: float = 0.2):
    """Poll `cond()` until it returns a true value (returned) or `timeout_s` passes
    (AssertionError naming `what`, a string or a function making one, e.g. with process logs)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what() if callable(what) else what}")
        time.sleep(poll_s)


class PrivateRedis:
    """The embedded default's Redis (localstack.redis_argv: unix socket, AOF) in a short temp dir."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="dbr-"))  # unix socket paths must stay short
        self.url = f"redis+socket://{self.dir / 'redis' / 'redis.sock'}"

    def start(self) -> PrivateRedis:
        localstack.ensure_redis(self.url, self.dir)
        return self

    def pid(self) -> int | None:
        try:
            return int((self.dir / "redis" / "redis.pid").read_text())
        except (OSError, ValueError):
            return None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Stop it with `sig` (SIGKILL: a crash; SIGTERM: a clean shutdown) and wait until gone."""
        pid = self.pid()
        if pid:
            os.kill(pid, sig)
            wait_for(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE,
                     15, "redis to stop")

    def wipe(self) -> None:
        """Forget everything it holds, AOF included (a Redis restarted without persistence)."""
        import redis

        client = redis.Redis(unix_socket_path=str(self.dir / "redis" / "redis.sock"))
        client.flushall()
        client.close()

    def stop(self) -> None:
        """Stop it (SIGTERM) and delete its folder."""
        pid = self.pid()
        if localstack.stop_redis(self.dir) and pid:
            wait_for(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE,
                     15, "redis to stop")
        shutil.rmtree(self.dir, ignore_errors=True)


class CeleryProc:
    """A `celery worker` or `celery beat` process in its own session, logging to a file."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path):
        self.log_path = log
        self._log = open(log, "ab")
        self.proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def children(self) -> list[int]:
        """Pids of its pool processes."""
        try:
            return [c.pid for c in psutil.Process(self.pid).children()]
        except psutil.NoSuchProcess:
            return []

    def log(self, tail: int = 4000) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")[-tail:]

    def stop(self) -> None:
        """Stop its whole process group (SIGTERM, then SIGKILL) and reap it (again: a no-op)."""
        if self._log.closed:
            return
        teardown.stop_process_group(self.pid, term_timeout_s=15)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._log.close()


def child_env(broker_url: str, host_name: str, runs_dir: Path, extra: dict[str, str] | None = None) -> dict:
    """Environment of a worker, beat or manage.py process of a fault test."""
    return {**os.environ, "DATABASE_URL": database_url(), "CELERY_BROKER_URL": broker_url,
            "DRAFTBOARD_HOST": host_name, "DRAFTBOARD_RUNS_DIR": str(runs_dir),
            "DRAFTBOARD_ENGINE_FLAGS": str(SYNTHETIC_FLAGS), "PYTHONUNBUFFERED": "1", **SHORT_INTERVALS,
            **(extra or {})}


def start_worker(env: dict, host_name: str, log: Path) -> CeleryProc:
    """A worker with one pool process consuming `host.<host_name>`, as README's GPU-host step 3;
    returns once it is ready (its log says so)."""
    w = CeleryProc([sys.executable, "-m", "celery", "-A", "benchsite", "worker", "-Q", f"host.{host_name}",
                    "-c", "1", "--loglevel", "INFO", "-n", f"{host_name}-{uuid.uuid4().hex[:4]}@%h"], env, log)
    wait_for(lambda: " ready." in w.log(20000) or w.proc.poll() is not None, 60, lambda: "the worker:\n" + w.log())
    assert w.proc.poll() is None, w.log()
    return w


def start_beat(env: dict, log: Path) -> CeleryProc:
    """A `celery beat` with runs.scheduler.ResilientScheduler (no pid file, so two can run)."""
    return CeleryProc([sys.executable, "-m", "celery", "-A", "benchsite", "beat", "--loglevel", "INFO",
                       "-S", "runs.scheduler:ResilientScheduler", "--pidfile=",
                       "--max-interval", "1"], env, log)


def manage(env: dict, *args: str) -> str:
    """Run `manage.py ARGS` in `env`; returns its output (AssertionError with it on failure)."""
    out = subprocess.run([sys.executable, "manage.py", *args], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def synthetic_model(root: Path) -> Path:
    """A model directory preflight accepts with `load_format: dummy` (config + tokenizer files)."""
    d = root / "synthetic-model"
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({"architectures": ["Synthetic"]}))
    (d / "tokenizer.json").write_text("{}")
    return d


def synthetic_sweep(name: str, model: Path, port: int, *, gap_ms: float = 5, output_len: list[int] | None = None,
                    concurrency: list[int] | None = None, num_prompts: int = 3, share_server: bool = True,
                    server_args: tuple[str, ...] = (), limits: dict | None = None):
    """A sweep on the synthetic engine build: one server start per server configuration, the
    server streaming one token every `gap_ms` ms (more flags of tests/synthetic_server.py in
    `server_args`; `limits` override the defaults below). Needs DRAFTBOARD_ENGINE_FLAGS=SYNTHETIC_FLAGS."""
    return sweepfile.parse_sweep({
        "name": name, "engine": "vllm", "engine_build": "synthetic", "model": str(model), "port": port,
        "share_server": share_server,
        "server": {"served_model_name": "synthetic", "load_format": "dummy",
                   "extra_args": ["--gap-ms", str(gap_ms), *server_args]},
        "grid": {"tp": [1], "methods": ["auto"], "concurrency": concurrency or [1],
                 "output_len": output_len or [16], "input_len": [8]},
        "workload": {"num_prompts": num_prompts, "ignore_eos": True, "seed": 0},
        "limits": {"ready_timeout_s": 30, "request_timeout_s": 60, "run_timeout_s": 300, "stop_timeout_s": 5,
                   **(limits or {})},
    }, source=f"test:{name}")


def twin_sweep_doc(model: Path, twin: dict, name: str = "twin-night", output_len: int = 128, num_prompts: int = 6,
                   k: int = 3) -> dict:
    """A sweep file (as a dict) on the synthetic engine build (SYNTHETIC_FLAGS): auto and
    draft_model k=`k` at TP 1, concurrency 1, asking for `twin` (a `twin:` block). Two tokens per
    message: the real speculative run's tau is 2 (one draft accepted per step)."""
    return {
        "name": name, "engine": "vllm", "engine_build": "synthetic", "model": str(model),
        "server": {"served_model_name": "synthetic", "load_format": "dummy",
                   "extra_args": ["--ttft-ms", "5", "--gap-ms", "3", "--tokens-per-message", "2", "--spec-counters"]},
        "grid": {"tp": [1], "concurrency": [1], "output_len": [output_len], "input_len": [8],
                 "methods": ["auto", {"method": "draft_model", "num_speculative_tokens": k, "drafter": str(model)}]},
        "workload": {"num_prompts": num_prompts, "ignore_eos": True, "seed": 0},
        "limits": {"ready_timeout_s": 30, "request_timeout_s": 30, "run_timeout_s": 120, "stop_timeout_s": 5},
        "twin": twin,
    }


class PrivatePostgres:
    """A PostgreSQL cluster of its own (initdb in a temp dir, trust auth, TCP on 127.0.0.1 at a
    free port, its unix socket in the same dir), never the machine's shared one: for faults
    (restart, stop) that must not touch anybody else's data. As root (initdb refuses root) the
    cluster belongs to the `postgres` user and its commands run through `runuser -u postgres --`."""

    def __init__(self, port: int | None = None) -> None:
        import glob
        import pwd

        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        if not bins:
            raise RuntimeError("no /usr/lib/postgresql/*/bin/initdb: PostgreSQL server binaries not installed")
        self.bin = Path(bins[-1]).parent
        self.dir = Path(tempfile.mkdtemp(prefix="dbpg-"))
        self.data = self.dir / "data"
        self.log_path = self.dir / "postgres.log"
        self.port = port or free_port()
        self._as = []
        if os.geteuid() == 0:
            os.chown(self.dir, pwd.getpwnam("postgres").pw_uid, pwd.getpwnam("postgres").pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]

    def url(self, db: str = "draftboard") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{db}"

    def _pg_ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        out = subprocess.run([*self._as, str(self.bin / "pg_ctl"), "-D", str(self.data), *args],
                             capture_output=True, text=True, timeout=120)
        if check and out.returncode != 0:
            raise RuntimeError(f"pg_ctl {' '.join(args)}: {out.stdout}{out.stderr}")
        return out

    def _opts(self) -> list[str]:
        return ["-o", f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1", "-l", str(self.log_path)]

    def init(self) -> PrivatePostgres:
        out = subprocess.run([*self._as, str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres",
                              "--auth=trust"], capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise RuntimeError(f"initdb: {out.stdout}{out.stderr}")
        return self

    def start(self) -> PrivatePostgres:
        self._pg_ctl(*self._opts(), "-w", "start")
        return self

    def stop(self, mode: str = "fast") -> None:
        self._pg_ctl("-m", mode, "-w", "stop")

    def restart(self, mode: str = "fast") -> None:
        self._pg_ctl(*self._opts(), "-m", mode, "-w", "restart")

    def running(self) -> bool:
        return self._pg_ctl("status", check=False).returncode == 0

    def createdb(self, name: str = "draftboard") -> None:
        import psycopg

        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')

    def destroy(self) -> None:
        """Stop it (immediate) if it runs and delete its folder."""
        if self.data.exists() and self.running():
            self._pg_ctl("-m", "immediate", "-w", "stop", check=False)
        shutil.rmtree(self.dir, ignore_errors=True)
