"""Stop a server's whole process group and prove that nothing of it is left.

Inference servers fork workers (vLLM's engine core and TP workers, SGLang's schedulers), so
stopping only the parent pid leaves GPU memory held. `benchkit.engines.server.ManagedServer` starts
every server as the leader of a new session (`start_new_session=True`), so its pid is also its
process-group id, and this module stops that group: SIGTERM, wait, SIGKILL, then verify.

Every managed server also carries an environment variable `SERVER_TAG_ENV` (a fresh random
value per server start, inherited by every process it forks). A supervisor that finds a run
whose worker died uses it to recognise that run's server processes after the fact
(`stop_tagged_processes`): a recorded process-group id alone could by then name an unrelated
group that reused the number.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field

import psutil


@dataclass
class TeardownReport:
    """What `stop_process_group` did.

    `clean` is True when no process of the group remains. `killed` lists pids that needed
    SIGKILL after `term_timeout_s`; `survivors` lists pids still alive at the end (only
    possible for unkillable processes, e.g. stuck in the kernel in a GPU driver call).
    `outside` reports what stopped processes the launch started outside the group (a container
    stopped by its runtime: benchkit.engines.environment.Launch.stop_outside), {} when none.
    """

    pgid: int
    clean: bool
    terminated: list[int] = field(default_factory=list)
    killed: list[int] = field(default_factory=list)
    survivors: list[int] = field(default_factory=list)
    elapsed_s: float = 0.0
    outside: dict = field(default_factory=dict)


def group_members(pgid: int) -> list[int]:
    """Pids of live (non-zombie) processes whose process group is `pgid`, via psutil."""
    members = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if os.getpgid(proc.info["pid"]) == pgid:
                members.append(proc.info["pid"])
        except (ProcessLookupError, psutil.NoSuchProcess, PermissionError):
            continue
    return members


#: Environment variable naming the server start a process belongs to (see the module docstring).
SERVER_TAG_ENV = "DRAFTBOARD_SERVER_TAG"


def tagged_processes(tag: str) -> dict[int, int]:
    """{pid: process-group id} of live (non-zombie) processes whose environment has
    SERVER_TAG_ENV == `tag`, via psutil (reads /proc/PID/environ; processes of other users that
    cannot be read are skipped). Empty for an empty `tag`."""
    found: dict[int, int] = {}
    if not tag:
        return found
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get(SERVER_TAG_ENV) == tag:
                found[proc.info["pid"]] = os.getpgid(proc.info["pid"])
        except (ProcessLookupError, psutil.NoSuchProcess, psutil.AccessDenied, PermissionError, OSError):
            continue
    return found


def stop_tagged_processes(tag: str, term_timeout_s: float = 30.0, kill_timeout_s: float = 10.0) -> TeardownReport:
    """Stop every process group that holds a process tagged `tag` (SERVER_TAG_ENV), as
    `stop_process_group` does, then verify that no tagged process is left.

    A group is stopped only while one of its members carries the tag, so a process-group id
    reused by an unrelated program is never signalled (Linux does not reuse a pid as long as a
    live process has it as its group id). Returns one report for all groups (`pgid` is the
    first group's, 0 when none was found); `clean` is True when no tagged process remains.
    """
    t0 = time.monotonic()
    groups = sorted(set(tagged_processes(tag).values()))
    report = TeardownReport(pgid=groups[0] if groups else 0, clean=True)
    for pgid in groups:
        part = stop_process_group(pgid, term_timeout_s=term_timeout_s, kill_timeout_s=kill_timeout_s)
        report.terminated += part.terminated
        report.killed += part.killed
    report.survivors = sorted(tagged_processes(tag))
    report.clean = not report.survivors
    report.elapsed_s = time.monotonic() - t0
    return report


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_empty(pgid: int, timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while True:
        left = group_members(pgid)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)


def stop_process_group(pgid: int, term_timeout_s: float = 30.0, kill_timeout_s: float = 10.0) -> TeardownReport:
    """SIGTERM the process group `pgid`, wait up to `term_timeout_s`, SIGKILL what is left,
    wait up to `kill_timeout_s`, and report whether any member survived.

    Never raises for processes that are already gone. Zombies (exited, not yet reaped by
    their parent) count as gone: they hold no memory and no GPU context.
    """
    t0 = time.monotonic()
    first = group_members(pgid)
    report = TeardownReport(pgid=pgid, clean=True, terminated=first)
    if not first:
        report.elapsed_s = time.monotonic() - t0
        return report
    _signal_group(pgid, signal.SIGTERM)
    left = _wait_empty(pgid, term_timeout_s)
    if left:
        report.killed = left
        _signal_group(pgid, signal.SIGKILL)
        left = _wait_empty(pgid, kill_timeout_s)
    report.survivors = left
    report.clean = not left
    report.elapsed_s = time.monotonic() - t0
    return report
