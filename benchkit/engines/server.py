"""A managed inference-server process: start in its own process group, wait until ready, stop.

`ManagedServer` starts the argv from `benchkit.engines.adapters.EngineAdapter.build_argv` with
`subprocess.Popen(..., start_new_session=True)`, so the server is the leader of a new session and
its pid is its process-group id; every worker it forks (vLLM's engine core and TP workers,
SGLang's schedulers) stays in that group, and `stop()` tears the whole group down through
`benchkit.hosts.teardown.stop_process_group`. stdout and stderr go to one log file.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import httpx

from benchkit.hosts.teardown import TeardownReport, stop_process_group


class ServerStartError(RuntimeError):
    """The server did not become ready.

    `code` is machine-readable: `server_exited` (the process died before it was ready; the
    message names the exit code), `server_not_ready` (the timeout passed with the process
    alive), or `server_not_started` (`wait_ready` called before `start`, or the argv could not
    be executed).
    """

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


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
        """Launch the process in a new session; return its pid.

        Raises RuntimeError when already started, ServerStartError(`server_not_started`) when
        the executable cannot be run (OSError from Popen).
        """
        if self.proc is not None:
            raise RuntimeError("ManagedServer already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                self.argv,
                env={**os.environ, **self.env} if self.env is not None else None,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
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
        the exit code and the last log lines), `server_not_ready` when `timeout_s` passes.
        """
        if self.proc is None:
            raise ServerStartError("server_not_started", "wait_ready called before start()")
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        pending = list(urls)
        last_error = "no answer yet"
        with httpx.Client(timeout=httpx.Timeout(max(poll_s, 1.0) * 5), trust_env=False) as client:
            while True:
                code = self.proc.poll()
                if code is not None:
                    raise ServerStartError(
                        "server_exited",
                        f"server process exited with code {code} before it was ready "
                        f"(log {self.log_path}):\n{self.log_tail(30)}",
                    )
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
                        f"server not ready after {timeout_s:.0f} s (last: {last_error}; log {self.log_path})",
                    )
                time.sleep(min(poll_s, max(deadline - now, 0.0)))

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
