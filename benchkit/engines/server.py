"""A managed inference-server process: start in its own process group, wait until ready, stop.

`ManagedServer` starts the argv from `benchkit.engines.adapters.EngineAdapter.build_argv` with
`subprocess.Popen(..., start_new_session=True)`, so the server is the leader of a new session and
its pid is its process-group id; every worker it forks (vLLM's engine core and TP workers,
SGLang's schedulers) stays in that group, and `stop()` tears the whole group down through
`benchkit.hosts.teardown.stop_process_group`. stdout and stderr go to one log file.

The server must not outlive the process that started it (issue 11). Two layers cover that:

- On Linux the server leader gets `PR_SET_PDEATHSIG` (prctl(2)) through a preexec hook: when
  the thread that started it dies (the Celery pool child killed by SIGKILL, the OOM killer or
  a hard time limit; or the worker parent killed, since Celery gives its pool children
  PDEATHSIG SIGKILL), the kernel sends the leader SIGTERM at once. Engines stop their own
  workers on SIGTERM (vLLM's API server, SGLang's launcher). It covers only the leader, only a
  leader that still obeys SIGTERM, and only the death of the starting *thread* (so `start()`
  and the server's whole life belong in one thread, as in benchkit.execution.runner).
- Everything else (grandchildren left behind, a leader that ignores SIGTERM, a server started
  by a process that then hung) is the supervisor's: the run row records the group id and the
  server's processes carry `benchkit.hosts.teardown.SERVER_TAG_ENV`, so the reaper
  (runs.services.supervision) stops the whole group, verifies it, or quarantines the host.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import httpx

from benchkit.hosts import preflight
from benchkit.hosts.teardown import TeardownReport, stop_process_group


class ServerStartError(RuntimeError):
    """The server did not become ready.

    `code` is machine-readable: `server_exited` (the process died before it was ready; the
    message names the exit code), `server_not_ready` (the timeout passed with the process
    alive), `server_not_started` (`wait_ready` called before `start`, or the argv could not
    be executed), or `disk_full` (the log could not be created for want of space, or the process
    died leaving an almost empty log on a filesystem below the minimum free space).
    """

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


#: prctl(2) option: signal to deliver when the parent (thread) dies (linux/prctl.h).
PR_SET_PDEATHSIG = 1


def pdeathsig_preexec(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A `subprocess.Popen(preexec_fn=...)` hook that asks the kernel to send `sig` to the child
    when the thread that forked it dies (prctl PR_SET_PDEATHSIG); None off Linux or when libc's
    prctl cannot be found.

    prctl is looked up before the fork, so the hook itself only makes one C call (no import,
    no allocation beyond the call). If the parent died between fork and prctl, the hook sends
    `sig` to the child itself (the kernel would not).
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), sig)

    return preexec


def wait_for_urls(urls: list[str], timeout_s: float, poll_s: float = 1.0,
                  exited: Callable[[], str | None] | None = None, where: str = "") -> float:
    """Poll `urls` in order with GET until each answers HTTP 200; return the seconds taken.

    A url counts once it has answered 200; the next one is then polled. `exited`, called
    before each poll, returns a message when the server process has died (then
    ServerStartError `server_exited` is raised with it). Raises ServerStartError
    `server_not_ready` when `timeout_s` passes, naming the last error and `where` (e.g. the
    log file). Used for managed servers and for external endpoints alike.
    """
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    pending = list(urls)
    last_error = "no answer yet"
    per_request_s = min(max(poll_s, 1.0) * 5, max(timeout_s, 1.0))
    with httpx.Client(timeout=httpx.Timeout(per_request_s), trust_env=False) as client:
        while True:
            if exited is not None:
                message = exited()
                if message is not None:
                    raise ServerStartError("server_exited", message)
            while pending:
                try:
                    resp = client.get(pending[0])
                except httpx.HTTPError as exc:
                    last_error = f"{pending[0]}: {type(exc).__name__}: {exc}"
                    break
                if resp.status_code != 200:
                    last_error = f"{pending[0]}: HTTP {resp.status_code}"
                    break
                pending.pop(0)
            if not pending:
                return time.monotonic() - t0
            now = time.monotonic()
            if now >= deadline:
                raise ServerStartError(
                    "server_not_ready",
                    f"server not ready after {timeout_s:.0f} s (last: {last_error}{'; ' + where if where else ''})",
                )
            time.sleep(min(poll_s, max(deadline - now, 0.0)))


class ManagedServer:
    """One server process and its process group.

    `argv` is a list (never a shell string); `env` holds variables set for the child on top of
    the parent's environment (`os.environ` at `start()`; None = the parent's unchanged), e.g.
    `EngineAdapter.env(gpus, server=...)`; `log_path` receives stdout and stderr (appended).
    `stop_outside(timeout_s) -> dict` (optional) stops what the launch started outside the process
    group (a container, `benchkit.engines.environment.Launch.stop_outside`); `stop()` calls it
    first and keeps its report in `TeardownReport.outside`. Use as a context manager to stop the
    group on any exit.
    """

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str] | None,
        log_path: str | Path,
        cwd: str | Path | None = None,
        stop_outside: Callable[[float], dict[str, Any]] | None = None,
    ):
        if isinstance(argv, str) or not argv:
            raise ValueError("argv must be a non-empty list of strings, not a shell string")
        self.argv = [str(a) for a in argv]
        self.env = dict(env) if env is not None else None
        self.log_path = Path(log_path)
        self.cwd = cwd
        self.stop_outside = stop_outside
        self.proc: subprocess.Popen | None = None
        self._log: IO[bytes] | None = None
        self.teardown: TeardownReport | None = None
        self.started_at: float | None = None

    @property
    def pid(self) -> int | None:
        """The server's pid (None before `start`)."""
        return self.proc.pid if self.proc else None

    @property
    def pgid(self) -> int | None:
        """The server's process-group id; equal to `pid` (session leader). None before `start`."""
        return self.proc.pid if self.proc else None

    def start(self) -> int:
        """Launch the process in a new session, with PDEATHSIG SIGTERM (`pdeathsig_preexec`);
        return its pid.

        Raises RuntimeError when already started, ServerStartError(`server_not_started`) when
        the executable cannot be run (OSError from Popen), ServerStartError(`disk_full`) when the
        log file cannot be created for want of space (ENOSPC / EDQUOT; the message names the
        path, its folder and the free MiB).
        """
        if self.proc is not None:
            raise RuntimeError("ManagedServer already started")
        try:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.log_path, "ab")
        except OSError as exc:
            if preflight.is_disk_full(exc):
                raise ServerStartError(preflight.DISK_FULL, preflight.disk_full_message(self.log_path, exc)) from exc
            raise
        try:
            self.proc = subprocess.Popen(
                self.argv,
                env={**os.environ, **self.env} if self.env is not None else None,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=pdeathsig_preexec(signal.SIGTERM),
            )
        except OSError as exc:
            self._log.close()
            self._log = None
            raise ServerStartError("server_not_started", f"cannot execute {self.argv[0]!r}: {exc}") from exc
        self.started_at = time.monotonic()
        return self.proc.pid

    def alive(self) -> bool:
        """True while the leader process runs (not yet exited)."""
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """The leader's exit status once it exited (negative = killed by that signal), else None."""
        return self.proc.poll() if self.proc else None

    def wait_ready(self, urls: list[str], timeout_s: float, poll_s: float = 1.0) -> float:
        """Poll `urls` in order with GET until each answers HTTP 200; return seconds taken
        (from this call, not from `start`).

        A url counts once it has answered 200; the next one is then polled. Raises
        ServerStartError `server_exited` as soon as the process has died (message includes
        the exit code and the last log lines), `disk_full` instead when it died leaving an
        (almost) empty log on a filesystem below the minimum free space
        (benchkit.hosts.preflight.disk_full_exit_message), `server_not_ready` when `timeout_s`
        passes.
        """
        if self.proc is None:
            raise ServerStartError("server_not_started", "wait_ready called before start()")
        proc = self.proc

        def exited() -> str | None:
            code = proc.poll()
            if code is None:
                return None
            if self._log is not None:
                self._log.flush()
            full = preflight.disk_full_exit_message(self.log_path, code)
            if full is not None:
                tail = self.log_tail(30)
                raise ServerStartError(preflight.DISK_FULL, full + (f"; log tail:\n{tail}" if tail.strip() else ""))
            return (f"server process exited with code {code} before it was ready "
                    f"(log {self.log_path}):\n{self.log_tail(30)}")

        return wait_for_urls(urls, timeout_s, poll_s, exited=exited, where=f"log {self.log_path}")

    def log_tail(self, n_lines: int = 200) -> str:
        """The last `n_lines` lines of the log file ('' when there is none yet)."""
        if self._log is not None:
            self._log.flush()
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as fh:
                return "".join(deque(fh, maxlen=n_lines))
        except FileNotFoundError:
            return ""

    def stop(self, term_timeout_s: float = 30.0) -> TeardownReport | None:
        """Stop what the launch started outside the group (`stop_outside`, e.g. the runtime stops
        a container: signals to the runtime's client do not reach it), then SIGTERM the whole
        process group, SIGKILL it after `term_timeout_s`, reap the leader and close the log.
        Returns the TeardownReport (None if never started), not clean when `stop_outside` says
        something outside survived. Safe to call more than once; the first report is kept in
        `self.teardown`."""
        if self.proc is None:
            return None
        if self.teardown is None:
            outside = self.stop_outside(term_timeout_s) if self.stop_outside is not None else {}
            report = stop_process_group(self.proc.pid, term_timeout_s=term_timeout_s)
            if outside:
                report.outside = outside
                report.clean = report.clean and bool(outside.get("clean"))
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.proc.pid, 9)
                except (ProcessLookupError, PermissionError):
                    pass
                self.proc.wait(timeout=10)
            self.teardown = report
        if self._log is not None:
            self._log.close()
            self._log = None
        return self.teardown

    def __enter__(self) -> ManagedServer:
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
