"""Streaming load client for OpenAI-compatible servers (vLLM, SGLang).

Load shape (docs/MEASUREMENT.md): first `workload.n_warmup` warmup requests (closed loop at the
concurrency cap, logged with warmup=True), then the measured requests: closed loop (at most
`concurrency` in flight) when `workload.request_rate` is None, otherwise open loop where request
i is due at t0 + sum of the first i inter-arrival gaps, the gaps drawn (seeded) from a gamma
distribution with shape = burstiness and mean 1/request_rate (shape 1 = Poisson, as in `vllm
bench serve`), still capped at `concurrency`. Sends are scheduled on that absolute clock, so a
late send does not shift later ones. The window runs from the first measured send to the last
measured completion.

Several processes (`processes` > 1, see `default_client_processes`): the prompts are split
between worker processes (`python -m benchkit.measure.loadworkers`, started as plain
subprocesses so this also works inside a daemonic Celery worker), each with its share of the
concurrency cap and of the warmup. They all finish warmup before `on_window_start` runs, then
start together. Their logs are merged on one clock: on Linux `time.perf_counter_ns` is
`clock_gettime(CLOCK_MONOTONIC)` (checked at run time with `time.get_clock_info`), a system-wide
clock, so stamps from different processes of one host compare directly. Where perf_counter is
not CLOCK_MONOTONIC, more than one process is refused (ValueError).

What one client process does (the request body, reading the event stream, per-request failure
messages, the client's headroom, transport and event loop): `benchkit.measure.loadclient`;
several processes: `benchkit.measure.loadworkers`; the socket reads and their kernel receive
stamps: `benchkit.measure.httpstream`. What the client asks of the server (continuous usage,
token ids, per-request spec-decode details) and whether it stamps reads with kernel time are
`ClientOptions`, chosen per engine build by the caller and recorded with the run.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from benchkit.measure import loadworkers
from benchkit.measure.loadclient import (
    APIS,
    ClientHeadroom,
    ClientOptions,
    Driver,
    HeadroomSampler,
    ProgressFn,
    RequestStream,
    connection_pool,
    endpoint_path,
    new_event_loop,
    span_ns,
)
from benchkit.measure.logs import RequestLog
from benchkit.measure.outputs import OutputRecord, RunOutputs, full_requests
from benchkit.measure.workloads import Prompt, build_prompts
from benchkit.specs import WorkloadSpec

#: Concurrent streams one client process is given by default (`default_client_processes`).
STREAMS_PER_PROCESS = 32


@dataclass
class LoadResult:
    """What `run_load` returns.

    `logs`: one RequestLog per request, warmup first, in prompt order. `window_start_ns` /
    `window_end_ns`: first measured send and last measured completion (perf_counter_ns).
    `achieved_rate_req_s`: measured sends per second, (N - 1) / (last send - first send) for
    N >= 2 sends, else None. `prompts_flagged_approx`: some prompt's input_len is a local
    approximation (the server had no tokenizer endpoint). `client`: the client's CPU time and
    event-loop lag, stalls and read stamps over the window (None only if no measured request
    ran). `outputs`: every measured request's output digest (`benchkit.measure.outputs`; store
    it with `encode_outputs`), None when `options.keep_outputs` is off. `options`: the
    ClientOptions the run used (record them with the run).
    """

    logs: list[RequestLog]
    window_start_ns: int
    window_end_ns: int
    achieved_rate_req_s: float | None
    prompts_flagged_approx: bool
    client: ClientHeadroom | None = None
    outputs: RunOutputs | None = None
    options: ClientOptions | None = None


def arrival_offsets_s(n: int, request_rate: float, burstiness: float, seed: int) -> list[float]:
    """Send offsets (s from t0) of `n` open-loop requests: the cumulative sums of `n` gamma
    gaps with shape `burstiness` and scale 1 / (request_rate * burstiness), i.e. mean gap
    1 / request_rate s; the first request is due at offset 0. Deterministic for a seed.
    Raises ValueError for a non-positive rate or burstiness."""
    if request_rate <= 0 or burstiness <= 0:
        raise ValueError(f"request_rate and burstiness must be > 0 (got {request_rate}, {burstiness})")
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness), size=n)
    gaps[0] = 0.0
    return [float(x) for x in np.cumsum(gaps)]


def default_client_processes(concurrency: int, cpus: int | None = None) -> int:
    """Client processes used when `run_load(processes=None)`: one per STREAMS_PER_PROCESS
    concurrent streams (rounded up), at most half the CPUs this process may run on (the server
    under test shares the host), at least 1. E.g. concurrency 8 -> 1, 64 -> 2, 256 -> 8 on 16+
    cores."""
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(math.ceil(max(concurrency, 1) / STREAMS_PER_PROCESS), cpus // 2))


def clock_is_system_wide() -> bool:
    """True when `time.perf_counter_ns` reads CLOCK_MONOTONIC (Linux), whose values compare
    across the processes of one host; then request logs of several client processes share one
    clock."""
    return "CLOCK_MONOTONIC" in time.get_clock_info("perf_counter").implementation


async def run_load(
    base_url: str,
    model: str,
    workload: WorkloadSpec,
    *,
    prompts: list[Prompt] | None = None,
    request_timeout_s: float = 300.0,
    progress: ProgressFn | None = None,
    api: str = "completions",
    on_window_start: Callable[[], None] | None = None,
    processes: int | None = None,
    extra_body: dict | None = None,
    options: ClientOptions | None = None,
) -> LoadResult:
    """Send `workload` to the server at `base_url` (e.g. "http://127.0.0.1:8000") and log it.

    `prompts`: the first `workload.n_warmup` are warmup prompts, the next
    `workload.num_prompts` the measured ones; when None they are built with
    `benchkit.measure.workloads.build_prompts` against the server's tokenizer. `request_timeout_s`:
    limit for one whole request (s). `progress(done, total)` is called after each measured
    request finishes (`total` = num_prompts; warmup requests are not counted).
    `on_window_start()` is called once after warmup, just before the first measured send (e.g.
    to read the server's counters). Both callbacks run in a worker thread
    (`asyncio.to_thread`), never on the event loop, so they may block or use Django's ORM.
    `api`: "completions" or "chat". `processes`: client processes (1 = this process only;
    None = `default_client_processes(concurrency)`; capped at the concurrency); see the module
    doc for how work is split. `extra_body`: JSON fields added to every request body (e.g.
    engine-specific sampling options). `options`: ClientOptions (default ClientOptions(): no
    continuous usage, no token ids, kernel stamps, outputs kept).
    Raises ValueError for an unknown api, too few prompts, num_prompts < 1, processes < 1, or
    several processes where perf_counter is not a system-wide clock; RuntimeError when a
    worker process dies. Request failures are never raised, they are in the logs.
    """
    if api not in APIS:
        raise ValueError(f"api must be one of {APIS}, got {api!r}")
    n_warm, n_meas = workload.n_warmup, workload.num_prompts
    if n_meas < 1:
        raise ValueError(f"workload.num_prompts must be >= 1, got {n_meas}")
    if processes is not None and processes < 1:
        raise ValueError(f"processes must be >= 1 or None, got {processes}")
    cap = max(workload.concurrency, 1)
    n_proc = min(default_client_processes(cap) if processes is None else processes, cap)
    if n_proc > 1 and not clock_is_system_wide():
        raise ValueError(
            "several client processes need perf_counter to be CLOCK_MONOTONIC (system-wide); here it is "
            f"{time.get_clock_info('perf_counter').implementation}"
        )
    if prompts is None:
        prompts = await asyncio.to_thread(build_prompts, workload, base_url=base_url, model=model)
    if len(prompts) < n_warm + n_meas:
        raise ValueError(
            f"{len(prompts)} prompts given, the run needs {n_warm + n_meas} "
            f"({n_warm} warmup + {n_meas} measured; warmup prompts are not reused)"
        )
    total = n_warm + n_meas
    prompts = list(prompts[:total])
    offsets_ns: list[int | None] = [None] * n_meas
    if workload.request_rate is not None:
        offsets = arrival_offsets_s(n_meas, workload.request_rate, workload.burstiness, workload.seed)
        offsets_ns = [round(o * 1e9) for o in offsets]
    opts = options or ClientOptions()
    if n_proc > 1:
        logs, client, records = await loadworkers.run_workers(
            n_proc, base_url, model, workload, prompts, offsets_ns, request_timeout_s, api, progress,
            on_window_start, extra_body, opts)
    else:
        logs, client, records = await _run_in_process(base_url, model, workload, prompts, offsets_ns,
                                                      request_timeout_s, api, progress, on_window_start, extra_body,
                                                      opts)
    meas_logs = logs[n_warm:]
    sends = sorted(log.send_ns for log in meas_logs)
    span_s = (sends[-1] - sends[0]) / 1e9
    return LoadResult(
        logs=logs,
        window_start_ns=sends[0],
        window_end_ns=max(log.end_ns for log in meas_logs),
        achieved_rate_req_s=(len(sends) - 1) / span_s if len(sends) >= 2 and span_s > 0 else None,
        prompts_flagged_approx=any(p.approx for p in prompts),
        client=client,
        outputs=RunOutputs.from_records(records) if opts.keep_outputs else None,
        options=opts,
    )


async def _run_in_process(base_url: str, model: str, workload: WorkloadSpec, prompts: list[Prompt],
                          offsets_ns: list[int | None], request_timeout_s: float, api: str,
                          progress: ProgressFn | None, on_window_start: Callable[[], None] | None,
                          extra_body: dict | None, options: ClientOptions
                          ) -> tuple[list[RequestLog], ClientHeadroom, list[OutputRecord]]:
    n_warm, n_meas = workload.n_warmup, workload.num_prompts
    cap = max(workload.concurrency, 1)
    streams = [
        RequestStream(RequestLog(index=i, warmup=i < n_warm, send_ns=0, input_len=p.input_len, output_len=p.output_len,
                                 category=p.category))
        for i, p in enumerate(prompts)
    ]
    done = 0

    async def report() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            await asyncio.to_thread(progress, done, n_meas)

    pool = connection_pool(base_url, cap, options)
    try:
        driver = Driver(pool, endpoint_path(base_url, api), model, workload, api, cap, request_timeout_s, extra_body,
                        options)
        await driver.phase([(streams[i], prompts[i], None) for i in range(n_warm)])
        if on_window_start is not None:
            await asyncio.to_thread(on_window_start)
        headroom = HeadroomSampler(pool=pool)
        headroom.start()
        t0 = time.perf_counter_ns()
        items = [(streams[n_warm + j], prompts[n_warm + j], None if off is None else t0 + off)
                 for j, off in enumerate(offsets_ns)]
        await driver.phase(items, report, digest_below=n_warm + full_requests(
            n_meas, workload.samples_per_prompt, options.full_outputs))
        part = await headroom.stop(span_ns([st.log for st in streams[n_warm:]]))
    finally:
        pool.close()
    records = [st.output for st in streams[n_warm:] if st.output is not None]
    return [st.materialize() for st in streams], ClientHeadroom.merge([part]), records


def run_load_sync(
    base_url: str,
    model: str,
    workload: WorkloadSpec,
    *,
    prompts: list[Prompt] | None = None,
    request_timeout_s: float = 300.0,
    progress: ProgressFn | None = None,
    api: str = "completions",
    on_window_start: Callable[[], None] | None = None,
    processes: int | None = None,
    extra_body: dict | None = None,
    options: ClientOptions | None = None,
) -> LoadResult:
    """Blocking wrapper of `run_load` (runs it in a fresh event loop from `new_event_loop`, with
    `asyncio.Runner`; do not call it from inside a running loop). Same arguments, result and
    errors."""
    box: list[LoadResult] = []

    async def main() -> None:
        # The result goes through `box`, not the task's result: in the main thread asyncio's
        # Runner checks its SIGINT handler on the way out with signal.getsignal, which formats the main
        # task's repr, result included (measured: 0.4 s for 500 requests of 256 tokens).
        box.append(await run_load(
            base_url, model, workload, prompts=prompts, request_timeout_s=request_timeout_s,
            progress=progress, api=api, on_window_start=on_window_start, processes=processes,
            extra_body=extra_body, options=options,
        ))

    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        runner.run(main())
    return box[0]
