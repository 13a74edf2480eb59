"""Execute benchmark runs end to end, Django-free, and return what happened.

Order (issue 2, MEASUREMENT.md): a port (the sweep's pinned one, else a free one chosen now
with the ports the engine derives from it) -> preflight (`preflight_checks`: model and
drafter paths, the build's own environment and its provenance, a real CUDA init in a child
process and the device nodes, idle GPUs, free ports) -> start the server in its own process
group (argv list, through the build's interpreter or launcher, benchkit.engines.environment;
an external endpoint is only checked) -> wait for readiness with a timeout -> for each run:
GPU telemetry sampler started (benchkit.hosts.telemetry, a child process; runs with GPUs only) ->
warmup -> read the Prometheus counters -> measured window (the load client asks the server for
what the engine's capabilities allow, EngineAdapter.client_options, recorded with the run; each
request's output digest is kept for the lossless check) -> sampler stopped -> read the counters
again -> then
stop what the launch started (a container through its runtime, then the whole process group)
and check the GPUs are free -> compute metrics, GPU efficiency figures and validity per run
(benchkit.measure.gpu_window; a GPU verdict marks the run suspect). A telemetry failure never
fails a run: the outcome's `telemetry_note` says why there is no stream.

`execute_runs` takes several runs whose server configuration is identical (`RunSpec.server_key()`):
they differ only in workload (concurrency, lengths, request rate, repeat), so MEASUREMENT.md
("Reusing a server between points") lets them share one server start; the prefix cache is
reset between them and the counters are read afresh for each window. Each such run records
`server_shared`. `execute_run` is the one-run case.

Every failure ends in a RunOutcome (benchkit.execution.outcome) with `ok=False` and a
machine-readable `reason`; nothing here raises for a benchmark failure and no server process is
left behind.

A full disk is named (issue 35): preflight's first check (`disk`) refuses a runs folder (the
workdir's parent) with less free space than benchkit.hosts.preflight.min_free_mib() (512 MiB,
DRAFTBOARD_MIN_FREE_MIB); a write into the workdir (the folder itself, the env file, the server
log, the telemetry stream) that meets ENOSPC / EDQUOT ends the run `disk_full`, naming the path,
its folder and the free MiB; a server that exits with an almost empty log on a filesystem below
the minimum is `disk_full`, not `server_exited` (benchkit.engines.server).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import httpx
import psutil

from benchkit.engines import adapters, cpus, environment
from benchkit.engines.server import ManagedServer, ServerStartError, wait_for_urls
from benchkit.execution.outcome import RunOutcome
from benchkit.hosts import preflight
from benchkit.hosts.teardown import SERVER_TAG_ENV
from benchkit.hosts.telemetry import TelemetryError, TelemetrySampler
from benchkit.measure import counters, datasets, gpu_window, loadgen, metrics, validity, workloads
from benchkit.measure.window import assemble_window
from benchkit.methods import METHODS
from benchkit.specs import RunSpec


class RunHooks(Protocol):
    """Callbacks the caller gives `execute_runs`, one per run (the Django layer writes them to
    the run row)."""

    def state(self, name: str, note: str = "") -> None:
        """Entered phase `name`: preflight, starting, warming, measuring, stopping."""

    def progress(self, done: int, total: int) -> None:
        """`done` of `total` measured requests have finished."""

    def server_started(self, pgid: int, tag: str) -> None:
        """The managed server runs as process group `pgid`; its processes carry
        SERVER_TAG_ENV=`tag` (a supervisor uses both to stop it if this process dies)."""


class NullHooks:
    """Hooks that do nothing (command-line use)."""

    def state(self, name: str, note: str = "") -> None:  # noqa: D102
        pass

    def progress(self, done: int, total: int) -> None:  # noqa: D102
        pass

    def server_started(self, pgid: int, tag: str) -> None:  # noqa: D102
        pass


def choose_port(adapter: adapters.EngineAdapter, attempts: int = 100) -> int:
    """A main port for a server of `adapter`'s engine, chosen now: a port the kernel hands out as
    free (a bind to port 0 on 127.0.0.1, so two workers on one host, or another program that
    uses an engine's default port, rarely pick the same one), kept only when every port of
    `adapter.port_span(p)` (the main port and those the engine derives from it, e.g. SGLang's
    p + 233 ...) passes preflight.check_port_free (a real bind on 127.0.0.1 and 0.0.0.0).

    Raises RuntimeError when none of `attempts` candidates is free with its derived ports."""
    for _ in range(attempts):
        port = _kernel_free_port()
        try:
            for p in adapter.port_span(port) or [port]:
                preflight.check_port_free(p)
            return port
        except (preflight.PreflightError, ValueError):
            continue
    raise RuntimeError(f"no free port for {adapter.name} in {attempts} tries (each with the ports the engine "
                       "derives from it)")


def _kernel_free_port() -> int:
    """A port the kernel hands out as free now (bind to 127.0.0.1:0, then close)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _place_cpus(server: ManagedServer, engine_cpus: str, adapter: adapters.EngineAdapter) -> dict[str, Any]:
    """Bind the ready server's processes (benchkit.engines.cpus.place) and return the record the
    run keeps in its provenance; a process tree that cannot be read gives {"error": why}
    instead (the run goes on with the engine's own placement, and says so)."""
    try:
        return cpus.place(server.pid, engine_cpus, adapter.cpu_placement)
    except (psutil.Error, OSError, cpus.CpuPlacementError) as exc:
        return {"engine_cpus": engine_cpus, "error": f"{type(exc).__name__}: {exc}"}


def _check_listener(server: ManagedServer, port: int) -> None:
    """Raise ServerStartError `port_in_use` when the port the readiness check reached is held by
    a process outside the server's process group: another program took the chosen port between
    the check and the server's bind, and answered for it. Says nothing when the listener cannot
    be seen (psutil.net_connections)."""
    try:
        pids = {c.pid for c in psutil.net_connections(kind="tcp")
                if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port}
    except (psutil.Error, OSError):
        return
    ours = set()
    for pid in pids - {None}:
        try:
            if os.getpgid(pid) == server.pgid:
                ours.add(pid)
        except OSError:
            continue
    if pids and not ours:
        raise ServerStartError("port_in_use", f"port {port} answered the readiness check, but it is held by "
                                              f"pid(s) {sorted(p for p in pids if p) or 'of another user'} outside "
                                              "the server's process group: another program took the port after it "
                                              f"was chosen (log {server.log_path})")


def preflight_checks(spec: RunSpec, adapter: adapters.EngineAdapter, launch: environment.Launch,
                     workdir: Path | None = None) -> list[tuple[str, Callable[[], Any]]]:
    """The checks made before `spec`'s server starts, in order, as (name, check) pairs; each
    check raises preflight.PreflightError when it fails. The runner stops at the first failure;
    a dry run (benchkit.sweeps.dryrun) runs them all.

    Names: `disk` (only with `workdir`: its parent, the runs folder, has at least the minimum
    free space, preflight.check_free_space, else `disk_full`), `dataset` (a categorized
    dataset's file read and its selection checked, no server needed:
    benchkit.measure.datasets.check_dataset; returns {category: prompts}), `model`,
    `drafter` (directories complete; no weights needed with `load_format:
    dummy`), `engine_env` (the build's interpreter or launcher and the engine in it; returns
    the provenance, environment.check_engine_env), `cuda_init` (a real CUDA initialisation on
    the run's GPUs in a child process; when it fails, the device-node check says which node is
    missing or blocked), `gpus_idle`, `ports` (the main port and those the engine derives
    from it, `adapter.port_span`)."""
    s = spec.server
    dummy = s.load_format == "dummy"

    def dataset() -> Any:
        try:
            prompts = datasets.check_dataset(spec.workload)
        except (datasets.DatasetError, ValueError) as exc:
            raise preflight.PreflightError(preflight.DATASET_ERROR, str(exc)) from None
        return None if prompts is None else datasets.category_counts(prompts)

    checks: list[tuple[str, Callable[[], Any]]] = []
    if workdir is not None:
        checks.append(("disk", lambda: preflight.check_free_space(Path(workdir).parent)))
    checks += [
        ("dataset", dataset),
        ("model", lambda: preflight.check_model_dir(s.model, role="model", allow_no_weights=dummy))]
    method = METHODS.get(s.method)  # an unknown method fails in build_argv, with its reason
    if s.drafter and method and method.takes_drafter:
        checks.append(("drafter", lambda: preflight.check_model_dir(s.drafter, role="drafter",
                                                                    allow_no_weights=dummy)))
    checks.append(("engine_env", lambda: environment.check_engine_env(launch)))
    uuids = [g.uuid for g in spec.gpus]
    if uuids:
        # It runs first among the GPU checks because /dev/nvidia-uvm may only appear once CUDA is
        # used on bare metal.
        def cuda_init() -> Any:
            try:
                return preflight.check_cuda_init(uuids)
            except preflight.PreflightError as exc:
                try:
                    preflight.check_device_nodes()
                except preflight.PreflightError as nodes:
                    raise preflight.PreflightError(exc.code, f"{exc.message}; {nodes.message}") from None
                raise

        checks.append(("cuda_init", cuda_init))
        checks.append(("gpus_idle", lambda: preflight.check_gpus_idle(uuids)))
    ports = adapter.port_span(launch.port) if launch.port is not None else []
    checks.append(("ports", lambda: [preflight.check_port_free(p) for p in ports]))
    return checks


def execute_run(spec: RunSpec, hooks: RunHooks | None = None, workdir: Path | None = None) -> RunOutcome:
    """Run `spec` to completion on a server of its own. Never raises for a benchmark
    failure; see RunOutcome. `workdir` receives the server log (`server.log`)."""
    return execute_runs([spec], [hooks or NullHooks()], workdir)[0]


def execute_runs(specs: list[RunSpec], hooks: list[RunHooks], workdir: Path | None = None,
                 server_tag: str = "") -> list[RunOutcome]:
    """Run every spec on ONE server start, in order, and return one outcome per spec.

    A managed server is started with SERVER_TAG_ENV=`server_tag` (default: a fresh random
    value) in its environment, and every hook's `server_started(pgid, tag)` is called once it
    runs. An external endpoint (engine `external`) must answer its readiness URL within the
    ready timeout, else the first run fails `server_not_ready` (not `workload_error`).

    All specs must have the same `RunSpec.server_key()` (ValueError otherwise). The prefix cache is
    reset before each run after the first (vLLM `/reset_prefix_cache`, SGLang
    `/flush_cache`). If the server dies or cannot be reached during run i, run i fails with
    `server_died` (or `metrics_unavailable`) and the runs after it fail with
    `not_run_server_died`, never attempted. The teardown happens once, after the last run;
    its report and the GPU check apply to every run. Units: timings in seconds.
    """
    if not specs or len(specs) != len(hooks):
        raise ValueError("execute_runs needs one hooks object per spec, and at least one spec")
    if len({s.server_key() for s in specs}) != 1:
        raise ValueError("execute_runs: the specs differ in their server configuration; they cannot share a server")
    workdir = Path(workdir or Path.cwd() / "runs-workdir")
    shared = len(specs) > 1
    outs = [RunOutcome(ok=False, server_shared=shared) for _ in specs]
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if not preflight.is_disk_full(exc):
            raise
        return _fail_all(outs, preflight.DISK_FULL, _disk_full_text(exc, workdir))
    first, s = specs[0], specs[0].server
    t0 = time.monotonic()
    server: ManagedServer | None = None
    hooks[0].state("preflight")
    launch: environment.Launch | None = None
    provenance: dict[str, Any] = {}
    idle_used_mib: dict[str, int] = {}
    try:
        adapter = adapters.adapter_for(s.engine)
        port: int | None = None
        if not adapter.launched:
            base_url, argv, env = s.endpoint_url.rstrip("/"), [], {}
            provenance = environment.unreadable_provenance(
                "external", "an external server: draftboard did not start it and cannot read its engine's version",
                {"kind": "external", "endpoint_url": s.endpoint_url})
        else:
            port = first.port if first.port is not None else choose_port(adapter)
            launch = adapter.launch(s, port, first.gpus, seed=first.workload.seed, workdir=workdir,
                                    name_hint=workdir.name, acceptance_tau=s.acceptance_tau)
            provenance = environment.unreadable_provenance(
                launch.build_env.build, "preflight failed before the engine's environment was read",
                {"kind": launch.build_env.kind, "python": launch.build_env.python})
            for name, check in preflight_checks(first, adapter, launch, workdir=workdir):
                result = check()
                if name == "engine_env":
                    provenance = result
                elif name == "gpus_idle" and isinstance(result, preflight.CheckResult):
                    idle_used_mib = {u: int(r["used_mib"]) for u, r in result.data.items()
                                     if isinstance(r, dict) and r.get("used_mib") is not None}
            launch.env[SERVER_TAG_ENV] = server_tag or uuid.uuid4().hex  # names the server's processes
            launch.write_env_file()
            argv, env = launch.argv, launch.env
            base_url = f"http://127.0.0.1:{port}"
    except preflight.PreflightError as exc:
        if exc.code == preflight.ENGINE_ENV_ERROR:
            provenance["version_error"] = exc.message
        return _fail_all(outs, exc.code, exc.message, provenance, launch)
    except (adapters.EngineConfigError, RuntimeError, OSError) as exc:
        if preflight.is_disk_full(exc):  # the env file, written into the workdir
            return _fail_all(outs, preflight.DISK_FULL, _disk_full_text(exc, workdir), provenance, launch)
        return _fail_all(outs, "config_error", str(exc), provenance, launch)
    for out in outs:
        out.port = port
        out.provenance = provenance
        out.engine_version = provenance.get("version") or ""
        out.engine_commit = provenance.get("git_commit") or ""
        out.argv, out.env = argv, env
        out.idle_used_mib = dict(idle_used_mib)
        out.timings_s["preflight"] = time.monotonic() - t0

    readings: list[dict[str, Any]] = [{} for _ in specs]
    done = 0  # runs whose window ended cleanly
    try:
        hooks[0].state("starting")
        if adapter.launched:
            server = ManagedServer(argv, env, workdir / "server.log",
                                   stop_outside=launch.stop_outside if launch and launch.container_name else None)
            server.start()
            for hook in hooks:
                hook.server_started(server.pgid, env[SERVER_TAG_ENV])
            ready_s = server.wait_ready(adapter.ready_urls(base_url), first.limits.ready_timeout_s)
            if launch is not None and not launch.container_name:  # a container's listener is not in the group
                _check_listener(server, launch.port)
                if s.engine_cpus and adapter.cpu_placement is not None:
                    placed = _place_cpus(server, s.engine_cpus, adapter)
                    for out in outs:
                        out.provenance["cpu_placement"] = placed
        else:  # someone else's server: nothing to start, but it must answer before any load
            ready_s = wait_for_urls(adapter.ready_urls(base_url), first.limits.ready_timeout_s,
                                    where=f"external endpoint {base_url}")
        outs[0].timings_s["ready"] = ready_s
        for i, (spec, hook, out) in enumerate(zip(specs, hooks, outs, strict=True)):
            if i > 0:
                hook.state("preflight", note="shares the server of the run before it")
                hook.state("starting", note="server already running")
                _reset_prefix_cache(adapter, base_url)
            _measure(spec, hook, out, readings[i], adapter, base_url, server,
                     telemetry_path=workdir / f"telemetry-{i}.bin")
            if out.reason:
                break
            hook.state("stopping")
            done += 1
    except ServerStartError as exc:
        outs[done].reason, outs[done].message = exc.code, exc.message
    except OSError as exc:  # a write into the workdir (the telemetry stream's files) met a full disk
        if not preflight.is_disk_full(exc):
            raise
        outs[done].reason, outs[done].message = preflight.DISK_FULL, _disk_full_text(exc, workdir)
    except counters.ScrapeError as exc:
        outs[done].reason, outs[done].message = "metrics_unavailable", str(exc)
        if server is not None and not server.alive():
            outs[done].reason = "server_died"
            outs[done].message = f"the server exited during the run (exit code {server.returncode}); {exc}"
    finally:
        # always, also after a bug of ours: the server's process group goes
        teardown, log_tail = _stop(server, first)
        for out in outs:
            out.teardown, out.server_log_tail = dict(teardown), log_tail
    for out in outs[done + 1:]:
        if not out.reason:
            out.reason = "not_run_server_died"
            out.message = f"not run: an earlier run on the shared server failed ({outs[done].reason})"
    for i in range(done):
        _finish(specs[i], outs[i], readings[i])
    return outs


def _disk_full_text(exc: OSError, workdir: Path) -> str:
    """preflight.disk_full_message for the file `exc` names (the workdir when it names none)."""
    return preflight.disk_full_message(exc.filename or workdir, exc)


def _fail_all(outs: list[RunOutcome], reason: str, message: str, provenance: dict[str, Any] | None = None,
              launch: environment.Launch | None = None) -> list[RunOutcome]:
    for out in outs:
        out.reason, out.message = reason, message
        out.provenance = dict(provenance or {})
        if launch is not None:  # what would have been started, for the run page
            out.argv, out.env, out.port = launch.argv, launch.env, launch.port
    return outs


def _reset_prefix_cache(adapter: adapters.EngineAdapter, base_url: str) -> None:
    """Clear the server's prefix cache so the next point does not reuse the last one's prompts.

    Raises ScrapeError when the server refuses (a run must not silently reuse a warm cache)."""
    url = adapter.reset_cache_url(base_url)
    if url is None:
        return
    try:
        response = httpx.post(url, timeout=30)
    except httpx.HTTPError as exc:
        raise counters.ScrapeError(f"cannot reset the prefix cache at {url}: {exc}") from exc
    if response.status_code // 100 != 2:
        raise counters.ScrapeError(
            f"{url} answered HTTP {response.status_code} ({adapter.title} servers get {adapter.server_env} for it)")


def telemetry_sampler(spec: RunSpec, path: Path, group_pgid: int | None) -> TelemetrySampler:
    """The sampler of one run's GPUs (TelemetrySampler in a child process, at
    `spec.limits.telemetry_hz`, bounded by `spec.limits.run_timeout_s`), writing its raw stream
    to `path`. Tests replace this function to sample a stand-in NVML
    (tests/nvml_series.py). Raises ValueError for a rate outside telemetry.MIN_HZ..MAX_HZ."""
    return TelemetrySampler([g.uuid for g in spec.gpus], path, hz=spec.limits.telemetry_hz, group_pgid=group_pgid,
                            max_duration_s=spec.limits.run_timeout_s)


def _start_telemetry(spec: RunSpec, out: RunOutcome, path: Path | None,
                     server: ManagedServer | None) -> TelemetrySampler | None:
    """Start sampling the run's GPUs (before the warmup, so it is sampled too); None, with
    `out.telemetry_note` saying why, when the run has no GPUs or the sampler cannot start."""
    if not spec.gpus:
        out.telemetry_note = gpu_window.NO_GPUS_NOTE
        return None
    if path is None:
        out.telemetry_note = "no GPU telemetry: no work folder for the raw stream"
        return None
    sampler = None
    try:
        sampler = telemetry_sampler(spec, path, server.pgid if server is not None else None)
        sampler.start()
        return sampler
    except (TelemetryError, ValueError, OSError, RuntimeError) as exc:
        if sampler is not None:
            sampler.kill()
        if preflight.is_disk_full(exc):  # the disk is full: the run ends `disk_full`, not just its stream
            if isinstance(exc, OSError) and exc.filename is None:
                exc.filename = str(path)
            raise
        out.telemetry_note = f"no GPU telemetry: {exc}"
        return None


def _end_telemetry(sampler: TelemetrySampler | None, out: RunOutcome, graceful: bool = True,
                   timeout_s: float = 60.0) -> None:
    """Stop the sampler and keep its stream in `out.telemetry` (a failure, or no answer within
    `timeout_s`, goes to `out.telemetry_note` and never fails the run); `graceful` False (an
    interrupt): kill it, no stream."""
    if sampler is None:
        return
    if not graceful:
        sampler.kill()
        out.telemetry_note = "no GPU telemetry: the run was interrupted, the sampler was killed"
        return
    try:
        out.telemetry = sampler.stop(timeout_s=timeout_s)
    except TelemetryError as exc:
        out.telemetry_note = f"no GPU telemetry: {exc}"
        stream = getattr(sampler, "out_path", None)
        free = preflight.free_mib(stream.parent) if stream is not None else None
        if free is not None and free < preflight.NEARLY_FULL_MIB:  # the child could not write its stream
            out.telemetry_note += (f" (disk full: folder {stream.parent} has {free:.1f} MiB free, "
                                   f"the stream {stream} could not be written)")
    except BaseException:
        sampler.kill()
        raise


def _measure(spec: RunSpec, hooks: RunHooks, out: RunOutcome, readings: dict[str, Any],
             adapter: adapters.EngineAdapter, base_url: str, server: ManagedServer | None,
             telemetry_path: Path | None = None) -> None:
    """Telemetry on, warmup, counters, measured window, telemetry off, counters: fills
    `out.logs`, the window and `out.telemetry` (or `out.telemetry_note`), or sets `out.reason`
    when the server died during it. One telemetry stream per run, also on a shared server (the
    server's idle time between runs is not sampled)."""
    s, w = spec.server, spec.workload
    metrics_url = adapter.metrics_url(base_url)
    sampler = _start_telemetry(spec, out, telemetry_path, server)
    hooks.state("warming")

    def on_window_start() -> None:
        readings["before"] = adapter.scrape_counters(metrics_url)
        hooks.state("measuring")

    options = adapter.client_options()  # what the engine's capabilities allow (token ids, usage per message)
    out.client_options = dataclasses.asdict(options)
    try:
        result = loadgen.run_load_sync(
            base_url, s.served_model_name or s.model, w,
            request_timeout_s=spec.limits.request_timeout_s,
            progress=hooks.progress,
            on_window_start=on_window_start,
            options=options,
        )
    except (httpx.HTTPError, workloads.WorkloadError) as exc:  # building prompts needs the server's tokenizer
        _end_telemetry(sampler, out)
        dead = server is not None and not server.alive()
        out.reason = "server_died" if dead else "workload_error"
        out.message = f"could not build the prompts against {base_url}: {type(exc).__name__}: {exc}"
        return
    except Exception:  # a counter scrape, a task's soft time limit, a bug: keep the stream for audit, briefly
        _end_telemetry(sampler, out, timeout_s=10.0)
        raise
    except BaseException:  # the task's time limit, an interrupt: no waiting for the sampler
        _end_telemetry(sampler, out, graceful=False)
        raise
    _end_telemetry(sampler, out)
    out.logs = result.logs
    out.window_start_ns, out.window_end_ns = result.window_start_ns, result.window_end_ns
    out.outputs = result.outputs
    if result.client is not None:
        out.client_headroom = dataclasses.asdict(result.client)
    if server is not None and not server.alive():
        out.reason = "server_died"
        out.message = f"the server exited during the run (exit code {server.returncode})"
        return
    readings["after"] = adapter.scrape_counters(metrics_url)


def _stop(server: ManagedServer | None, spec: RunSpec) -> tuple[dict[str, Any], str]:
    """Stop the server's process group and check the GPUs; (teardown dict, log tail)."""
    if server is None:
        return {}, ""
    report = server.stop(spec.limits.stop_timeout_s)
    if report is None:  # never started (its log could not be created)
        return {}, ""
    teardown = dataclasses.asdict(report)
    uuids = [g.uuid for g in spec.gpus]
    if uuids:
        try:
            preflight.gpus_back_to_baseline(uuids)
        except preflight.PreflightError as exc:
            teardown["gpus_freed"] = False
            teardown["gpus_message"] = exc.message
    return teardown, server.log_tail(200)


def _finish(spec: RunSpec, out: RunOutcome, readings: dict[str, Any]) -> RunOutcome:
    """Figures, GPU results and validity of a run whose window ended: the window assembled from
    the logs, the counter readings (`readings` before / after), the client's headroom and the
    telemetry stream (benchkit.measure.window.assemble_window); `ok` unless a failure is found."""
    w, s = spec.workload, spec.server
    measured, out.distributions = metrics.measure_window(out.logs or [], out.window_start_ns, out.window_end_ns,
                                                         w.slo or None)
    sd, counter_error = None, None
    try:
        sd = counters.spec_decode_metrics(
            readings.get("before"), readings.get("after"),
            counters.max_accepted_per_step(s.method, s.num_speculative_tokens, s.tree_budget))
    except counters.CounterWindowError as exc:  # restarted or out of bounds: no figures, a suspect mark
        counter_error = exc
    window, gw = assemble_window(measured, out.window_start_ns, out.window_end_ns,
                                 spec_decode=sd.to_flat() if sd is not None else None,
                                 client_headroom=out.client_headroom, telemetry=out.telemetry,
                                 gpu_uuids=[g.uuid for g in spec.gpus], idle_used_mib=out.idle_used_mib,
                                 telemetry_note=out.telemetry_note)
    out.metrics, out.efficiency, out.gpu_check = window, gw.efficiency, gw.gpu_check
    out.spec_source = sd.source if sd is not None else ""
    marks = validity.check_run(out.logs or [], window, ignore_eos=w.ignore_eos,
                               max_error_rate=spec.limits.max_error_rate, teardown=out.teardown,
                               counter_error=counter_error, client=out.client_headroom or None,
                               suspect_messages=gw.suspect_messages)
    out.suspect_reasons = [v.message for v in marks if not v.is_failure]
    violations = validity.failures(marks)
    out.violations = [(v.code, v.message) for v in violations]
    if violations:
        out.reason = violations[0].code
        out.message = "; ".join(v.message for v in violations)
        return out
    out.ok = True
    return out
