"""The multi-process load client: `run_load(processes=N)` with N > 1 lands here.

Parent side (`run_workers`): starts N worker processes as plain subprocesses
(`python -m benchkit.measure.loadworkers`; not `multiprocessing`, whose children a daemonic
Celery worker may not start), hands each its share of the work, waits until every worker has
finished its warmup, calls `on_window_start`, then tells all of them to start at one moment
`t0` (20 ms ahead, so they start together) and merges their request logs.

How work is split (`split_work`): the concurrency cap C is split as evenly as possible (worker j
keeps at most c_j requests in flight, sum c_j = C); the warmup prompts in proportion to c_j (so
each worker warms at least c_j connections, as MEASUREMENT.md asks of the whole client); the
measured prompts in proportion to c_j in contiguous blocks for a closed loop, and round-robin
for an open loop (request i stays due at t0 + its offset, whichever worker sends it; each
worker's cap then bounds its own share).

One clock: every time in the logs is `time.perf_counter_ns()`, which on Linux reads
CLOCK_MONOTONIC, one system-wide clock (`benchkit.measure.loadgen.clock_is_system_wide` is
checked before any worker starts), so the workers' logs merge without any offset.

What each worker runs is the one-process client of `benchkit.measure.loadclient` (`Driver`,
`RequestStream`, `HeadroomSampler`), the same code `run_load` uses in its own process.

Protocol (both directions on the worker's stdin/stdout, the worker's own stdout is redirected
to stderr so stray prints cannot corrupt it): frames of a 4-byte big-endian length and a pickle.
Parent -> worker: the job dict, then ("go", t0_ns) or ("stop",). Worker -> parent: ("warm",),
then one ("progress",) per finished measured request, then ("done", packed logs, ProcessHeadroom,
output digests) or ("error", traceback text).
"""

from __future__ import annotations

import asyncio
import os
import pickle
import struct
import sys
import time
import traceback
from pathlib import Path
from typing import Any, BinaryIO

from benchkit.measure import loadclient
from benchkit.measure.logs import RequestLog
from benchkit.measure.outputs import OutputRecord, full_requests
from benchkit.measure.workloads import Prompt
from benchkit.specs import WorkloadSpec

#: How far ahead of "now" the common start t0 is set (ns), so every worker has read it in time.
START_LEAD_NS = 20_000_000

_HEADER = struct.Struct(">I")


def split_counts(n: int, weights: list[int]) -> list[int]:
    """Split `n` items in proportion to `weights` (largest remainder; the counts sum to n)."""
    total = sum(weights)
    exact = [n * w / total for w in weights]
    counts = [int(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda j: exact[j] - counts[j], reverse=True)
    for j in order[: n - sum(counts)]:
        counts[j] += 1
    return counts


def split_work(n_proc: int, cap: int, n_warm: int, n_meas: int, open_loop: bool
               ) -> list[tuple[int, list[int], list[int]]]:
    """Per worker: (its concurrency cap, its warmup request indices, its measured request
    indices); indices count from 0 over warmup + measured prompts. Raises ValueError when
    n_proc < 1 or n_proc > cap."""
    if not 1 <= n_proc <= cap:
        raise ValueError(f"need 1 <= processes <= concurrency, got {n_proc} processes for concurrency {cap}")
    caps = [cap // n_proc + (1 if j < cap % n_proc else 0) for j in range(n_proc)]
    warm_counts = split_counts(n_warm, caps)
    out = []
    w0 = 0
    m0 = n_warm
    meas_counts = split_counts(n_meas, caps)
    for j in range(n_proc):
        warm = list(range(w0, w0 + warm_counts[j]))
        w0 += warm_counts[j]
        if open_loop:
            meas = list(range(n_warm + j, n_warm + n_meas, n_proc))
        else:
            meas = list(range(m0, m0 + meas_counts[j]))
            m0 += meas_counts[j]
        out.append((caps[j], warm, meas))
    return out


def _write(out: BinaryIO, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    out.write(_HEADER.pack(len(data)) + data)
    out.flush()


def _read(inp: BinaryIO) -> Any:
    head = inp.read(_HEADER.size)
    if len(head) < _HEADER.size:
        raise EOFError("the parent closed the pipe")
    (n,) = _HEADER.unpack(head)
    data = inp.read(n)
    if len(data) < n:
        raise EOFError("the parent closed the pipe mid-frame")
    return pickle.loads(data)


def _pack(streams: list[loadclient.RequestStream]) -> list[tuple]:
    """Logs as plain tuples and int arrays (pickles far faster than a million dataclasses)."""
    return [
        (st.log.index, st.log.warmup, st.log.send_ns, st.log.ok, st.log.error, st.log.prompt_tokens,
         st.log.completion_tokens, st.log.tokens_from_text, st.log.input_len, st.log.output_len, st.log.end_ns,
         st.t_ns, st.tokens, bytes(st.kinds), st.log.spec_steps, st.log.spec_draft_tokens,
         st.log.spec_accepted_tokens, st.log.spec_histogram, st.log.category)
        for st in streams
    ]


def _unpack(packed: list[tuple]) -> list[RequestLog]:
    logs = []
    for (index, warmup, send_ns, ok, error, prompt_tokens, completion_tokens, from_text, input_len,
         output_len, end_ns, ts, toks, kinds, spec_steps, spec_drafts, spec_accepted, spec_hist, category) in packed:
        log = RequestLog(index=index, warmup=warmup, send_ns=send_ns, ok=ok, error=error,
                         prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                         tokens_from_text=from_text, input_len=input_len, output_len=output_len,
                         end_ns=end_ns, spec_steps=spec_steps, spec_draft_tokens=spec_drafts,
                         spec_accepted_tokens=spec_accepted, spec_histogram=spec_hist, category=category)
        log.set_columns(ts, toks, kinds)  # the unpickled arrays, wrapped: no object per message
        logs.append(log)
    return logs


async def run_workers(
    n_proc: int,
    base_url: str,
    model: str,
    workload: WorkloadSpec,
    prompts: list[Prompt],
    offsets_ns: list[int | None],
    request_timeout_s: float,
    api: str,
    progress: loadclient.ProgressFn | None,
    on_window_start: Any,
    extra_body: dict | None = None,
    options: loadclient.ClientOptions | None = None,
) -> tuple[list[RequestLog], loadclient.ClientHeadroom, list[OutputRecord]]:
    """Run the load on `n_proc` worker processes (arguments as
    `benchkit.measure.loadgen.run_load`; `prompts` warmup first, `offsets_ns[i]` the i-th
    measured request's due offset or None for a closed loop). Returns (all logs in prompt order,
    the merged ClientHeadroom, the measured requests' output digests). Raises RuntimeError naming
    the worker when one fails or exits early; every worker is stopped before returning."""
    n_warm, n_meas = workload.n_warmup, workload.num_prompts
    n_proc = min(n_proc, n_meas)
    cap = max(workload.concurrency, 1)
    shares = split_work(n_proc, cap, n_warm, n_meas, open_loop=offsets_ns[0] is not None)
    root = str(Path(loadclient.__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    procs: list[asyncio.subprocess.Process] = []
    options = options or loadclient.ClientOptions()
    results: list[tuple[list[RequestLog], loadclient.ProcessHeadroom, list[OutputRecord]]] = []
    try:
        for cap_j, warm, meas in shares:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "benchkit.measure.loadworkers",
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env)
            procs.append(proc)
            job = {
                "base_url": base_url, "model": model, "workload": workload, "api": api,
                "request_timeout_s": request_timeout_s, "cap": cap_j, "extra_body": extra_body,
                "options": options, "digest_below": n_warm + full_requests(n_meas, workload.samples_per_prompt,
                                                                            options.full_outputs),
                "warm": [(i, prompts[i]) for i in warm],
                "measured": [(i, prompts[i], offsets_ns[i - n_warm]) for i in meas],
            }
            await _send(proc, job)

        async def expect(j: int, proc: asyncio.subprocess.Process) -> Any:
            try:
                head = await proc.stdout.readexactly(_HEADER.size)
                msg = pickle.loads(await proc.stdout.readexactly(_HEADER.unpack(head)[0]))
            except asyncio.IncompleteReadError:
                code = await proc.wait()
                raise RuntimeError(f"load client worker {j} exited with code {code} before finishing") from None
            if msg[0] == "error":
                raise RuntimeError(f"load client worker {j} failed:\n{msg[1]}")
            return msg

        for j, proc in enumerate(procs):
            msg = await expect(j, proc)
            if msg[0] != "warm":
                raise RuntimeError(f"load client worker {j}: expected 'warm', got {msg[0]!r}")
        if on_window_start is not None:
            await asyncio.to_thread(on_window_start)
        t0 = time.perf_counter_ns() + START_LEAD_NS
        for proc in procs:
            await _send(proc, ("go", t0))
        done = 0

        async def pump(j: int, proc: asyncio.subprocess.Process) -> None:
            nonlocal done
            while True:
                msg = await expect(j, proc)
                if msg[0] == "progress":
                    done += 1
                    if progress is not None:
                        await asyncio.to_thread(progress, done, n_meas)
                elif msg[0] == "done":
                    results.append((_unpack(msg[1]), msg[2], msg[3]))
                    return
                else:
                    raise RuntimeError(f"load client worker {j}: unexpected message {msg[0]!r}")

        await asyncio.gather(*(pump(j, p) for j, p in enumerate(procs)))
    finally:
        for proc in procs:  # after "done" each worker exits by itself; on any failure, stop them
            if proc.returncode is None:
                try:
                    await asyncio.wait_for(proc.wait(), 5 if len(results) == len(procs) else 0.01)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
    logs = sorted((log for part, _, _ in results for log in part), key=lambda log: log.index)
    records = sorted((r for _, _, recs in results for r in recs), key=lambda r: r.index)
    return logs, loadclient.ClientHeadroom.merge([h for _, h, _ in results]), records


async def _send(proc: asyncio.subprocess.Process, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    proc.stdin.write(_HEADER.pack(len(data)) + data)
    await proc.stdin.drain()


async def _work(job: dict, inp: BinaryIO, out: BinaryIO) -> None:
    workload: WorkloadSpec = job["workload"]

    def stream(i: int, p: Prompt, warmup: bool) -> loadclient.RequestStream:
        return loadclient.RequestStream(RequestLog(index=i, warmup=warmup, send_ns=0, input_len=p.input_len,
                                          output_len=p.output_len, category=p.category))

    warm = [(stream(i, p, True), p, None) for i, p in job["warm"]]
    meas = [(stream(i, p, False), p, off) for i, p, off in job["measured"]]
    cap, timeout_s, options = job["cap"], job["request_timeout_s"], job["options"]
    pool = loadclient.connection_pool(job["base_url"], cap, options)
    try:
        path = loadclient.endpoint_path(job["base_url"], job["api"])
        driver = loadclient.Driver(pool, path, job["model"], workload, job["api"], cap, timeout_s,
                                   job.get("extra_body"), options)
        await driver.phase(warm)
        _write(out, ("warm",))
        msg = await asyncio.to_thread(_read, inp)
        if msg[0] != "go":
            return
        t0 = msg[1]
        delay = (t0 - time.perf_counter_ns()) / 1e9
        if delay > 0:
            await asyncio.sleep(delay)
        headroom = loadclient.HeadroomSampler(pool=pool)
        headroom.start()
        items = [(st, p, None if off is None else t0 + off) for st, p, off in meas]
        await driver.phase(items, lambda: _write(out, ("progress",)), digest_below=job["digest_below"])
        part = await headroom.stop(loadclient.span_ns([st.log for st, _, _ in meas]))
    finally:
        pool.close()
    records = [st.output for st, _, _ in meas if st.output is not None]
    _write(out, ("done", _pack([st for st, _, _ in warm + meas]), part, records))


def main() -> int:
    """Worker entry point: read the job from stdin, run it, report on the saved stdout."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed from here on goes to stderr, not into the frame stream
    inp = sys.stdin.buffer
    try:
        job = _read(inp)
        with asyncio.Runner(loop_factory=loadclient.new_event_loop) as runner:
            runner.run(_work(job, inp, out))
    except EOFError:
        return 0  # the parent went away: nothing to report to
    except BaseException:  # noqa: BLE001 - the parent gets every failure as a message
        try:
            _write(out, ("error", traceback.format_exc()))
        except OSError:
            pass
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
