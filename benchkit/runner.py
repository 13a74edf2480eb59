"""Execute ONE benchmark run end to end, Django-free, and return what happened.

Order (issue 2, MEASUREMENT.md): preflight (model and drafter paths, device nodes and a real
CUDA init in a child process, idle GPUs, free ports) -> start the server in its own process
group (argv list) -> wait for readiness with a timeout -> warmup -> read the Prometheus
counters -> measured window -> read the counters again -> stop the whole process group and
check the GPUs are free -> compute metrics and validity. Every failure ends in a RunOutcome
with `ok=False` and a machine-readable `reason`; nothing here raises for a benchmark failure
and no server process is left behind.
"""

from __future__ import annotations

import dataclasses
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from benchkit import engines, loadgen, metrics, preflight, promcounters, validity
from benchkit.logs import RequestLog
from benchkit.server import ManagedServer, ServerStartError
from benchkit.specs import RunSpec


class RunHooks(Protocol):
    """Callbacks the caller gives `execute_run` (the Django layer writes them to the run row)."""

    def state(self, name: str, note: str = "") -> None:
        """Entered phase `name`: preflight, starting, warming, measuring, stopping."""

    def progress(self, done: int, total: int) -> None:
        """`done` of `total` measured requests have finished."""


class NullHooks:
    """Hooks that do nothing (command-line use)."""

    def state(self, name: str, note: str = "") -> None:  # noqa: D102
        pass

    def progress(self, done: int, total: int) -> None:  # noqa: D102
        pass


@dataclass
class RunOutcome:
    """Result of `execute_run`.

    `ok` is True only when the run counts (MEASUREMENT.md "When a run does not count");
    otherwise `reason` is a code (preflight codes, `server_exited`, `server_not_ready`,
    `server_died`, validity codes, `internal_error`) and `message` says what happened.
    `metrics_flat` is benchkit.metrics.RunMetrics.to_flat() of the window; `spec_decode` the
    counter deltas (acceptance_rate, acceptance_length = tau, per_position_rate, ...).
    """

    ok: bool
    reason: str = ""
    message: str = ""
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    engine_version: str = ""
    engine_commit: str = ""
    server_log_tail: str = ""
    logs: list[RequestLog] | None = None
    window_start_ns: int = 0
    window_end_ns: int = 0
    metrics_flat: dict[str, Any] | None = None
    spec_decode: dict[str, Any] | None = None
    distributions: dict[str, Any] = field(default_factory=dict)
    suspect_reasons: list[str] = field(default_factory=list)
    violations: list[tuple[str, str]] = field(default_factory=list)
    teardown: dict[str, Any] = field(default_factory=dict)
    timings_s: dict[str, float] = field(default_factory=dict)


def free_port(start: int, span: int = 1, attempts: int = 200) -> int:
    """First port >= `start` such that `span` consecutive ports are free on 127.0.0.1.

    Raises RuntimeError when none is found in `attempts` tries."""
    port = start
    for _ in range(attempts):
        ok = True
        for p in range(port, port + span):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return port
        port += span
    raise RuntimeError(f"no {span} free consecutive ports from {start}")


def _preflight(spec: RunSpec, adapter: engines.EngineAdapter, port: int) -> None:
    s = spec.server
    if s.engine == "external":
        return
    dummy = s.load_format == "dummy"
    preflight.check_model_dir(s.model, role="model", allow_no_weights=dummy)
    if s.drafter and s.method not in ("ngram", "auto"):
        preflight.check_model_dir(s.drafter, role="drafter", allow_no_weights=dummy)
    uuids = [g.uuid for g in spec.gpus]
    if uuids:
        # A real CUDA initialisation in a child process (NVML alone is not enough). It runs
        # first because /dev/nvidia-uvm may only appear once CUDA is used on bare metal; when it
        # fails, the device-node check says which node is missing or blocked.
        try:
            preflight.check_cuda_init(uuids)
        except preflight.PreflightError as exc:
            try:
                preflight.check_device_nodes()
            except preflight.PreflightError as nodes:
                raise preflight.PreflightError(exc.code, f"{exc.message}; {nodes.message}") from None
            raise
        preflight.check_gpus_idle(uuids)
    for p in adapter.port_span(port):  # the main port and those the engine derives from it
        preflight.check_port_free(p)


def execute_run(spec: RunSpec, hooks: RunHooks | None = None, workdir: Path | None = None) -> RunOutcome:
    """Run `spec` to completion. Never raises for a benchmark failure; see RunOutcome.

    `workdir` receives the server log (`server.log`). Units: timings in seconds.
    """
    hooks = hooks or NullHooks()
    workdir = Path(workdir or Path.cwd() / "runs-workdir")
    workdir.mkdir(parents=True, exist_ok=True)
    out = RunOutcome(ok=False)
    s, w = spec.server, spec.workload
    t0 = time.monotonic()
    server: ManagedServer | None = None
    hooks.state("preflight")
    try:
        adapter = engines.adapter_for(s.engine)
        version = adapter.version(sys.executable)
        out.engine_version = version.get("version") or ""
        out.engine_commit = version.get("git_commit") or ""
        if s.engine == "external":
            base_url = s.endpoint_url.rstrip("/")
        else:
            port = spec.port or free_port(8100)
            _preflight(spec, adapter, port)
            out.argv = adapter.build_argv(s, port, python=sys.executable, seed=w.seed)
            out.env = adapter.env(spec.gpus, server=s)
            base_url = f"http://127.0.0.1:{port}"
    except preflight.PreflightError as exc:
        out.reason, out.message = exc.code, exc.message
        return out
    except (engines.EngineConfigError, RuntimeError, OSError) as exc:
        out.reason, out.message = "config_error", str(exc)
        return out
    out.timings_s["preflight"] = time.monotonic() - t0

    reached_window_end = False
    try:
        hooks.state("starting")
        if s.engine != "external":
            server = ManagedServer(out.argv, out.env, workdir / "server.log")
            server.start()
            out.timings_s["ready"] = server.wait_ready(adapter.ready_urls(base_url), spec.limits.ready_timeout_s)
        model_name = s.served_model_name or s.model
        metrics_url = adapter.metrics_url(base_url)

        hooks.state("warming")
        counters: dict[str, Any] = {}

        def on_window_start() -> None:
            counters["before"] = promcounters.scrape(metrics_url)
            hooks.state("measuring")

        result = loadgen.run_load_sync(
            base_url, model_name, w,
            request_timeout_s=spec.limits.request_timeout_s,
            progress=hooks.progress,
            on_window_start=on_window_start,
        )
        counters["after"] = promcounters.scrape(metrics_url)
        out.logs = result.logs
        out.window_start_ns, out.window_end_ns = result.window_start_ns, result.window_end_ns
        if server is not None and not server.alive():
            out.reason = "server_died"
            out.message = f"the server exited during the run (exit code {server.returncode})"
            return out
        reached_window_end = True
    except ServerStartError as exc:
        out.reason, out.message = exc.code, exc.message
        return out
    except promcounters.ScrapeError as exc:
        out.reason, out.message = "metrics_unavailable", str(exc)
        if server is not None and not server.alive():
            out.reason = "server_died"
            out.message = f"the server exited during the run (exit code {server.returncode}); {exc}"
        return out
    finally:
        if not reached_window_end and server is not None:
            # any failure, including a bug of ours: the server's process group goes, always
            _stop(server, spec, out)
    hooks.state("stopping")
    if server is not None:
        _stop(server, spec, out)
    return _finish(spec, out, counters)


def _stop(server: ManagedServer, spec: RunSpec, out: RunOutcome) -> None:
    if out.teardown:
        return
    report = server.stop(spec.limits.stop_timeout_s)
    out.teardown = dataclasses.asdict(report)
    out.server_log_tail = server.log_tail(200)
    uuids = [g.uuid for g in spec.gpus]
    if uuids:
        try:
            preflight.gpus_back_to_baseline(uuids)
        except preflight.PreflightError as exc:
            out.teardown["gpus_freed"] = False
            out.teardown["gpus_message"] = exc.message


def _finish(spec: RunSpec, out: RunOutcome, counters: dict[str, Any]) -> RunOutcome:
    w = spec.workload
    m = metrics.compute_run_metrics(out.logs or [], out.window_start_ns, out.window_end_ns, w.slo or None)
    out.metrics_flat = m.to_flat()
    out.distributions = metrics.distributions(out.logs or [])
    try:
        sd = promcounters.spec_decode_metrics(counters.get("before"), counters.get("after"))
    except promcounters.CounterResetError as exc:  # the server restarted inside the window
        out.reason, out.message = "counters_reset", str(exc)
        return out
    if sd is not None:
        out.spec_decode = {**dataclasses.asdict(sd), **sd.to_flat()}
    marks = validity.check_run(out.logs or [], out.metrics_flat, ignore_eos=w.ignore_eos,
                               max_error_rate=spec.limits.max_error_rate, teardown=out.teardown, spec_decode=sd)
    out.suspect_reasons = [v.message for v in marks if not v.is_failure]
    violations = validity.failures(marks)
    out.violations = [(v.code, v.message) for v in violations]
    if violations:
        out.reason = violations[0].code
        out.message = "; ".join(v.message for v in violations)
        return out
    out.ok = True
    return out
