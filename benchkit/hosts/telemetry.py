"""Sample a run's GPUs through NVML at a fixed rate while it is measured (issue 12).

`TelemetrySampler` runs the sampling in a CHILD PROCESS (`python -m benchkit.hosts.telemetry`),
started just before the warmup and stopped after the measured window, and returns a
`benchkit.measure.gpu_samples.TelemetryStream`. Why a process: the load client is asyncio in the
runner's process, and a sampler thread there would share its interpreter (the GIL) and its
event-loop thread's core; every Python-level step of the sampler (about ten NVML calls per GPU
per tick, each wrapped in ctypes and Python objects) would delay the client's reads of streamed
tokens, which is exactly what the client's timing measures. A separate process shares nothing
with the client but the host's cores. `benchmarks/gpu_telemetry_check.py` measures the client's
timing error with no sampler, with a sampler thread and with this process on a real GPU host.

Each tick reads every field of every GPU (`gpu_samples.FIELDS`) plus the compute processes,
each query guarded on its own: a query that raises leaves that value None and counts the reason
(`benchkit.hosts.nvml.nvml_error_text`) in `GpuSeries.missing`, so one unsupported query (the
energy counter before Volta, say) loses nothing else. Ticks are due on an absolute schedule
(t0 + k / hz); a tick that runs late skips the ticks it missed rather than bunching them. When
asked to stop, the sampler takes one last tick at once, so the stream covers the window's end.
The sampler also stops by itself after `max_duration_s` (the stream says `truncated`) or when its
parent goes away (stdin closes).

Protocol between parent and child (lines on stdout / stdin): the child prints `ready <t_ns>`
after its first tick (or `error <message>` and exits 2), samples until it reads `stop` (or EOF,
or SIGTERM), writes the encoded stream to `--out` (atomically: temp file, then rename), prints
`done <ticks>` and exits 0. SIGINT is ignored in the child: the parent decides when it stops.

Times are `time.perf_counter_ns()`, on Linux CLOCK_MONOTONIC, one clock for every process of
the host, so the child's tick times compare directly with the load client's window.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import math
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchkit.hosts.nvml import (
    NVML_CLOCK_MEM,
    NVML_CLOCK_SM,
    NVML_TEMPERATURE_GPU,
    gpu_used_mib,
    load_pynvml,
    nvml_error_text,
    nvml_str,
)
from benchkit.measure.gpu_samples import (
    FIELDS,
    PROCS,
    GpuSeries,
    ProcessInfo,
    TelemetryStream,
    decode_telemetry,
    encode_telemetry,
)

#: Default sampling rate (ticks per second).
DEFAULT_HZ = 10.0
#: Default bound on one sampling session (s; Limits.run_timeout_s's default); the stream says
#: `truncated` when it is reached. The child holds the stream in memory until it stops.
DEFAULT_MAX_DURATION_S = 3600.0
#: Accepted sampling rates (Hz): NVML's power reading is a 1 s average and its utilisation a
#: 1/6 s to 1 s one (nvml.h), so rates beyond 50 Hz buy nothing but load.
MIN_HZ, MAX_HZ = 0.1, 50.0

_REPO_ROOT = Path(__file__).resolve().parents[2]


class TelemetryError(RuntimeError):
    """The sampler could not start (NVML init failed, a GPU UUID is unknown, the child did not
    answer in time) or its stream could not be read back. The run itself goes on without
    telemetry; the message says why."""


def describe_pid(pid: int) -> ProcessInfo:
    """ProcessInfo for `pid` as this process sees it: its process group (os.getpgid; None when the
    pid is not visible here, e.g. another PID namespace) and name (psutil; "" when unknown)."""
    try:
        pgid: int | None = os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        pgid = None
    name = ""
    try:
        import psutil

        name = psutil.Process(pid).name()
    except Exception:  # noqa: BLE001 - gone, not visible, or no psutil: the name is optional
        pass
    return ProcessInfo(pid=pid, pgid=pgid, name=name)


def _call(fn: Callable[[], Any]) -> tuple[Any, str | None]:
    try:
        return fn(), None
    except Exception as exc:  # noqa: BLE001 - each query is guarded on its own
        return None, nvml_error_text(exc)


class Recorder:
    """Reads ticks of every GPU of a run from an NVML module into a TelemetryStream.

    `nv`: the `pynvml` module or a stand-in with the same functions, already initialised
    (`nvmlInit`). `gpu_uuids`: the GPUs, in the run's order. `hz`: the configured rate (stored
    in the stream). `group_pgid`: the run's process group, stored for the validity checks.
    `clock`: ns clock (perf_counter_ns). `describe`: pid -> ProcessInfo (`describe_pid`).
    Raises TelemetryError naming a UUID NVML does not know. Per-GPU static facts (name, enforced
    power limit, max SM clock) are read once here; a failure leaves them None.
    """

    def __init__(
        self,
        nv: Any,
        gpu_uuids: Sequence[str],
        hz: float = DEFAULT_HZ,
        group_pgid: int | None = None,
        *,
        clock: Callable[[], int] = time.perf_counter_ns,
        describe: Callable[[int], ProcessInfo] = describe_pid,
        sampler: str = "process",
    ):
        self.nv = nv
        self.clock = clock
        self.describe = describe
        self.stream = TelemetryStream(hz=float(hz), group_pgid=group_pgid, sampler=sampler)
        self.handles: list[Any] = []
        self._last_procs: list[tuple | None] = []
        for uuid in gpu_uuids:
            try:
                h = nv.nvmlDeviceGetHandleByUUID(uuid)
            except Exception as exc:  # noqa: BLE001
                raise TelemetryError(f"GPU {uuid} not found by NVML: {nvml_error_text(exc)}") from None
            index, _ = _call(lambda h=h: int(nv.nvmlDeviceGetIndex(h)))
            name, _ = _call(lambda h=h: nvml_str(nv.nvmlDeviceGetName(h)))
            limit, _ = _call(lambda h=h: int(nv.nvmlDeviceGetEnforcedPowerLimit(h)))
            max_sm, _ = _call(lambda h=h: int(nv.nvmlDeviceGetMaxClockInfo(h, NVML_CLOCK_SM)))
            self.stream.gpus.append(GpuSeries(
                index=index if index is not None else len(self.handles),
                uuid=str(uuid), name=name or "", power_limit_mw=limit, max_sm_mhz=max_sm,
            ))
            self.handles.append(h)
            self._last_procs.append(None)

    # -- one query per field ------------------------------------------------------------
    def _temperature(self, h: Any) -> int:
        nv = self.nv
        if hasattr(nv, "nvmlDeviceGetTemperatureV"):
            try:
                return int(nv.nvmlDeviceGetTemperatureV(h, NVML_TEMPERATURE_GPU))
            except Exception:  # noqa: BLE001 - older driver: the deprecated call below still answers
                pass
        return int(nv.nvmlDeviceGetTemperature(h, NVML_TEMPERATURE_GPU))

    def _clock_events(self, h: Any) -> int:
        nv = self.nv
        fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        return int(fn(h))

    def _procs(self, h: Any) -> tuple[tuple[int, int | None], ...]:
        out = []
        for p in self.nv.nvmlDeviceGetComputeRunningProcesses(h):
            mem = getattr(p, "usedGpuMemory", None)
            out.append((int(p.pid), None if mem is None else int(mem) >> 20))
        return tuple(sorted(out))

    def tick(self) -> None:
        """Read every field of every GPU once and append the values (None where a query
        failed, its reason counted) as one tick stamped with the clock's time before the
        queries; the time the queries took goes to `query_ns`."""
        nv, s = self.nv, self.stream
        t = self.clock()
        if s.t_ns and t <= s.t_ns[-1]:
            t = s.t_ns[-1] + 1  # a coarse stand-in clock: keep ticks strictly increasing
        tick = len(s.t_ns)
        for gi, (h, g) in enumerate(zip(self.handles, s.gpus, strict=True)):
            row: dict[str, tuple[Any, str | None]] = {
                "power_mw": _call(lambda h=h: int(nv.nvmlDeviceGetPowerUsage(h))),
                "energy_mj": _call(lambda h=h: int(nv.nvmlDeviceGetTotalEnergyConsumption(h))),
                "sm_mhz": _call(lambda h=h: int(nv.nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM))),
                "mem_mhz": _call(lambda h=h: int(nv.nvmlDeviceGetClockInfo(h, NVML_CLOCK_MEM))),
            }
            util, err = _call(lambda h=h: nv.nvmlDeviceGetUtilizationRates(h))
            row["util_gpu_pct"] = (int(util.gpu), None) if util is not None else (None, err)
            row["util_mem_pct"] = (int(util.memory), None) if util is not None else (None, err)
            row["mem_used_mib"] = _call(lambda h=h: gpu_used_mib(nv, h))
            row["temp_c"] = _call(lambda h=h: self._temperature(h))
            row["clock_events"] = _call(lambda h=h: self._clock_events(h))
            for f in FIELDS:
                value, reason = row[f]
                g.values[f].append(value)
                if reason is not None:
                    counts = g.missing.setdefault(f, {})
                    counts[reason] = counts.get(reason, 0) + 1
            procs, reason = _call(lambda h=h: self._procs(h))
            if reason is not None:
                counts = g.missing.setdefault(PROCS, {})
                counts[reason] = counts.get(reason, 0) + 1
            elif procs != self._last_procs[gi]:
                g.procs.append((tick, procs))
                self._last_procs[gi] = procs
                for pid, _ in procs:
                    if pid not in s.processes:
                        s.processes[pid] = self.describe(pid)
        s.t_ns.append(t)
        s.query_ns.append(max(self.clock() - t, 0))


def sample_until(
    recorder: Recorder,
    stop: threading.Event,
    max_duration_s: float = DEFAULT_MAX_DURATION_S,
    *,
    clock: Callable[[], int] | None = None,
    wait: Callable[[float], bool] | None = None,
    on_first_tick: Callable[[int], None] | None = None,
) -> TelemetryStream:
    """Tick `recorder` at its stream's rate until `stop` is set, then take one last tick, and
    return the stream. Tick k is due at t0 + k / hz (absolute schedule; a late tick skips the
    due times it missed). After `max_duration_s` it stops by itself and marks the stream
    `truncated`. `on_first_tick(t_ns)` is called once the first tick is taken. `clock` (ns)
    and `wait(seconds) -> stop was set` default to the recorder's clock and `stop.wait` (tests
    pass fakes)."""
    clock = clock or recorder.clock
    wait = wait or stop.wait
    period_ns = round(1e9 / recorder.stream.hz)
    t0 = clock()
    k = 0
    recorder.tick()
    if on_first_tick is not None:
        on_first_tick(recorder.stream.t_ns[0])
    while not stop.is_set():
        now = clock()
        if now - t0 >= max_duration_s * 1e9:
            recorder.stream.truncated = True
            recorder.stream.note = f"sampling stopped after its bound of {max_duration_s:g} s"
            return recorder.stream
        k = max(k + 1, math.ceil((now - t0) / period_ns))
        delay_s = (t0 + k * period_ns - now) / 1e9
        if delay_s > 0 and wait(delay_s):
            break
        recorder.tick()
    recorder.tick()  # the reading at stop time: the stream covers the window's end
    return recorder.stream


def load_nvml(factory: str = "", arg: str = "") -> Any:
    """The NVML module to sample: `pynvml` when `factory` is empty, else `factory` =
    "module:callable" (a dotted attribute path is allowed) called with `arg` when given (a
    stand-in, e.g. tests' `nvml_series:SeriesNvml.from_file`).
    Raises TelemetryError when it cannot be imported."""
    if not factory:
        try:
            return load_pynvml()
        except ImportError as exc:
            raise TelemetryError(f"nvidia-ml-py (pynvml) is not installed: {exc}") from None
    module, _, attr = factory.partition(":")
    try:
        fn = importlib.import_module(module)
        for part in attr.split("."):
            fn = getattr(fn, part)
    except (ImportError, AttributeError) as exc:
        raise TelemetryError(f"cannot load NVML stand-in {factory!r}: {exc}") from None
    return fn(arg) if arg else fn()


class ThreadSampler:
    """The same sampling in a thread of this process (no child). For measurement only
    (`benchmarks/gpu_telemetry_check.py` compares it with the process) and for hosts where a
    child process cannot be started; the runner uses TelemetrySampler.

    `nv`: an initialised NVML module; other arguments as Recorder / sample_until."""

    def __init__(self, nv: Any, gpu_uuids: Sequence[str], hz: float = DEFAULT_HZ, group_pgid: int | None = None,
                 max_duration_s: float = DEFAULT_MAX_DURATION_S):
        self.recorder = Recorder(nv, gpu_uuids, hz, group_pgid, sampler="thread")
        self._stop = threading.Event()
        self._max = max_duration_s
        self._thread = threading.Thread(target=self._run, name="gpu-telemetry", daemon=True)
        self._cpu0 = 0

    def _run(self) -> None:
        self._cpu0 = time.thread_time_ns()
        sample_until(self.recorder, self._stop, self._max)
        self.recorder.stream.sampler_cpu_ns = time.thread_time_ns() - self._cpu0

    def start(self) -> None:
        """Start ticking."""
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> TelemetryStream:
        """Stop (after one last tick) and return the stream. Raises TelemetryError when the
        thread does not end within `timeout_s`."""
        self._stop.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise TelemetryError(f"the sampler thread did not stop within {timeout_s:g} s")
        return self.recorder.stream


class TelemetrySampler:
    """Sample GPUs in a child process; `start()` before the warmup, `stop()` after the window.

    `gpu_uuids`: the run's GPUs. `out_path`: where the child writes the encoded stream (kept:
    it is the raw file of the run); its log (stderr) goes beside it with suffix `.log`.
    `hz`: ticks per second (MIN_HZ..MAX_HZ; ValueError otherwise). `group_pgid`: the run's
    server process group (stored in the stream). `max_duration_s`: the child's own bound.
    `nvml_factory` / `nvml_arg`: a stand-in NVML for tests (see `load_nvml`); `python`: the
    interpreter; `extra_path`: folders prepended to the child's PYTHONPATH (where a stand-in
    lives). Use as a context manager to be sure the child is gone on any exit.
    """

    def __init__(
        self,
        gpu_uuids: Sequence[str],
        out_path: str | os.PathLike,
        hz: float = DEFAULT_HZ,
        group_pgid: int | None = None,
        max_duration_s: float = DEFAULT_MAX_DURATION_S,
        *,
        nvml_factory: str = "",
        nvml_arg: str = "",
        python: str = sys.executable,
        extra_path: Sequence[str] = (),
    ):
        if not MIN_HZ <= hz <= MAX_HZ:
            raise ValueError(f"telemetry rate must be within {MIN_HZ:g}..{MAX_HZ:g} Hz, got {hz!r}")
        if not gpu_uuids:
            raise ValueError("TelemetrySampler needs at least one GPU UUID")
        self.out_path = Path(out_path)
        self.log_path = self.out_path.with_suffix(self.out_path.suffix + ".log")
        self.argv = [python, "-m", "benchkit.hosts.telemetry", "--out", str(self.out_path), "--hz", repr(float(hz)),
                     "--max-duration-s", repr(float(max_duration_s))]
        for u in gpu_uuids:
            self.argv += ["--uuid", str(u)]
        if group_pgid is not None:
            self.argv += ["--group-pgid", str(int(group_pgid))]
        if nvml_factory:
            self.argv += ["--nvml", nvml_factory, "--nvml-arg", nvml_arg]
        self.extra_path = [str(p) for p in extra_path]
        self.proc: subprocess.Popen | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.first_tick_ns: int | None = None

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        paths = [str(_REPO_ROOT), *self.extra_path]
        if env.get("PYTHONPATH"):
            paths.append(env["PYTHONPATH"])
        env["PYTHONPATH"] = os.pathsep.join(paths)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def _read_stdout(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.strip())
        self._lines.put(None)

    def _expect(self, word: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TelemetryError(f"the sampler did not say {word!r} within {timeout_s:g} s{self._log_tail()}")
            try:
                line = self._lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                code = self.proc.wait(10) if self.proc else None
                raise TelemetryError(f"the sampler exited ({code}) before {word!r}{self._log_tail()}")
            head, _, rest = line.partition(" ")
            if head == word:
                return rest
            if head == "error":
                raise TelemetryError(f"the sampler failed: {rest}")

    def _log_tail(self) -> str:
        try:
            tail = self.log_path.read_text(errors="replace").strip().splitlines()[-5:]
        except OSError:
            return ""
        return (": " + " | ".join(tail)) if tail else ""

    def start(self, timeout_s: float = 60.0) -> int:
        """Start the child and wait until it has taken its first tick; return that tick's time
        (perf_counter_ns). Raises TelemetryError (child killed) when NVML fails there or it does
        not answer within `timeout_s`; RuntimeError when already started."""
        if self.proc is not None:
            raise RuntimeError("TelemetrySampler already started")
        self.out_path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.out_path.unlink()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv, env=self._env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=log, text=True, bufsize=1)
        threading.Thread(target=self._read_stdout, name="telemetry-stdout", daemon=True).start()
        try:
            self.first_tick_ns = int(self._expect("ready", timeout_s))
        except TelemetryError:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)  # it exits by itself after saying `error`
            self.kill()
            raise
        return self.first_tick_ns

    def stop(self, timeout_s: float = 60.0) -> TelemetryStream:
        """Ask the child to stop (it takes one last tick), wait for its file and return the
        decoded stream. Raises TelemetryError when it fails, times out (then it is killed) or
        its file does not decode; RuntimeError when not started."""
        if self.proc is None:
            raise RuntimeError("TelemetrySampler.stop before start")
        try:
            with contextlib.suppress(BrokenPipeError, OSError, ValueError):
                self.proc.stdin.write("stop\n")
                self.proc.stdin.flush()
                self.proc.stdin.close()
            self._expect("done", timeout_s)
            self.proc.wait(timeout_s)
        except (TelemetryError, subprocess.TimeoutExpired) as exc:
            self.kill()
            raise TelemetryError(str(exc)) from None
        try:
            return decode_telemetry(self.out_path.read_bytes())
        except (OSError, ValueError) as exc:
            raise TelemetryError(f"cannot read the sampler's stream {self.out_path}: {exc}") from None

    def kill(self) -> None:
        """Kill the child if it still runs (no stream is written then)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)

    def __enter__(self) -> TelemetrySampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


# -------------------------------------------------------------------------------------------
# The child process


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    """Child process entry (see the module docstring for the protocol). Exit 0 after writing the
    stream, 2 when NVML or a GPU cannot be opened (after printing `error <message>`)."""
    ap = argparse.ArgumentParser(description="Sample GPUs through NVML until told to stop.")
    ap.add_argument("--out", required=True, help="file for the encoded stream")
    ap.add_argument("--uuid", action="append", required=True, help="GPU UUID (repeat per GPU)")
    ap.add_argument("--hz", type=float, default=DEFAULT_HZ)
    ap.add_argument("--group-pgid", type=int, default=None)
    ap.add_argument("--max-duration-s", type=float, default=DEFAULT_MAX_DURATION_S)
    ap.add_argument("--nvml", default="", help="module:callable of a stand-in NVML (tests)")
    ap.add_argument("--nvml-arg", default="")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    cpu0 = time.process_time_ns()
    try:
        nv = load_nvml(args.nvml, args.nvml_arg)
        try:
            nv.nvmlInit()
        except Exception as exc:  # noqa: BLE001
            raise TelemetryError(f"NVML init failed: {nvml_error_text(exc)}") from None
        recorder = Recorder(nv, args.uuid, args.hz, args.group_pgid, sampler="process")
    except TelemetryError as exc:
        print(f"error {exc}", flush=True)
        return 2

    def watch_stdin() -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        stop.set()  # "stop", or EOF: the parent is gone

    threading.Thread(target=watch_stdin, name="stdin", daemon=True).start()
    try:
        stream = sample_until(recorder, stop, args.max_duration_s,
                              on_first_tick=lambda t_ns: print(f"ready {t_ns}", flush=True))
    finally:
        with contextlib.suppress(Exception):
            nv.nvmlShutdown()
    stream.sampler_cpu_ns = time.process_time_ns() - cpu0
    _write_atomically(Path(args.out), encode_telemetry(stream))
    print(f"done {stream.n_ticks}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
