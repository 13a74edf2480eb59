"""One big run through the storing path in bounded memory (issue 22: "a 10 000 x 2 000 run ...
stores with peak RSS < 1 GB and the note gives its blob size before and after").

Not a test. It seeds `--requests` request logs of `--tokens` output tokens each (one token per
message plus the final usage-only message, as the load client records a stream with usage on
every message; `--warmup` of them warmup), held as the client now hands them over: three
numpy columns per request (benchkit.measure.logs.RequestLog.set_columns), then does what a
worker does with them:

1. `measure`: the window's figures and samples (benchkit.measure.metrics.measure_window, as the
   runner's `_finish` does);
2. `store`: `runs.services.outcomes.store_outcome` (the request-log blob, version 2, and the
   metrics row) for a run of a fresh sweep;
3. `recompute`: `runs.services.recompute.recompute_runs` of that run (decodes the stored blob)
   and checks its figures equal the stored ones;

and prints the process's peak RSS after each phase (`resource.getrusage` ru_maxrss: the peak so
far, never lower) and psutil's RSS now, the blob's size (version 2: binary delta columns in one
zstandard frame) against the size the old layout (version 1, zlib level 9 over JSON columns:
`encode_logs_v1`) gives for the same logs, both in bytes per million messages and per million
tokens, and the encode / decode times. The old size is computed by a streaming writer that emits
the same bytes as `encode_logs_v1` (checked on a sample first) so that measuring the old layout
does not itself need gigabytes.

Message times: a stream's gaps are a shared step time (normal, `--step-ms` +- 5 %) plus the
client's delay (exponential, mean 50 us), at ns resolution; the first message comes after a
TTFT of about 100 ms. The bytes per message of any lossless layout depend on how random these
times are (about 21 bits of entropy per gap here); real runs at high concurrency, whose
messages arrive in bursts, compress better.

    flock /tmp/draftboard-heavy.lock env DATABASE_URL=postgres://postgres@127.0.0.1:5432/draftboard_big22 \\
        .venv/bin/python benchmarks/big_run.py --requests 10000 --tokens 2000 --json benchmarks/results/big_run_pg.json

Results (10 000 x 2 000, PostgreSQL, 2-core machine; benchmarks/results/big_run_pg.log): peak RSS
per phase before -> after the metrics walked the logs in chunks (benchkit.measure.logs.LogChunks:
one float64 sample array at a time, a stored blob decoded one chunk at a time): measure
2 695 -> 709 MB, store 699 -> 701 MB (code unchanged), recompute 2 748 -> 770 MB; every figure
bit for bit the same as before. The measure child starts with the ~500 MB of logs it shares
with this process, so its own work adds about 200 MB. (Recomputing the same run stored as a
version-1 blob, measured on its own: 2 316 -> 873 MB.)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchsite.settings")

import django  # noqa: E402

django.setup()

import numpy as np  # noqa: E402
from _common import print_table  # noqa: E402
from django.core.management import call_command  # noqa: E402

from benchkit.execution.outcome import RunOutcome  # noqa: E402
from benchkit.measure import metrics  # noqa: E402
from benchkit.measure.logs import RequestLog, _deltas, decode_columns, encode_logs, encode_logs_v1  # noqa: E402
from runs.models import Host, RequestLogBlob, Run, RunMetrics, RunState, Sweep  # noqa: E402
from runs.selectors import window_of  # noqa: E402
from runs.services.outcomes import store_outcome  # noqa: E402
from runs.services.recompute import recompute_runs  # noqa: E402
from runs.services.transitions import transition  # noqa: E402

MS = 1_000_000


def peak_mb() -> float:
    """Peak RSS of this process so far (MB; Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def seed_logs(n: int, tokens: int, warmup: int, step_ms: float, seed: int) -> tuple[list[RequestLog], int, int]:
    """`n` request logs (see the module docstring), the measured ones after `warmup` warmup ones;
    returns (logs, window_start_ns, window_end_ns). Columns per request: no object per message."""
    rng = np.random.default_rng(seed)
    step_ns = step_ms * MS
    logs, t0 = [], 10**12
    kinds = np.ones(tokens + 1, np.int8)
    kinds[-1] = 2  # the final usage-only message
    toks = np.ones(tokens + 1, np.int64)
    toks[-1] = 0
    for i in range(n):
        send = t0 + i * int(step_ns // 4) + int(rng.integers(0, 1000))
        gaps = (rng.normal(step_ns, 0.05 * step_ns, tokens + 1) + rng.exponential(50_000, tokens + 1)).astype(np.int64)
        gaps[0] = int(100 * MS + rng.integers(0, 5 * MS))
        gaps[-1] = int(rng.integers(10_000, 200_000))  # the usage message right after the last token
        t = send + np.cumsum(gaps)
        log = RequestLog(index=i, warmup=i < warmup, send_ns=send, prompt_tokens=512, completion_tokens=tokens,
                         input_len=512, output_len=tokens, end_ns=int(t[-1]) + 1000)
        log.set_columns(t, toks.copy(), kinds.copy())
        logs.append(log)
    start = max(log.send_ns for log in logs[:warmup]) if warmup else logs[0].send_ns
    return logs, start, max(log.end_ns for log in logs)


def v1_size(logs: list[RequestLog]) -> int:
    """len(encode_logs_v1(logs)) without building the document: the same JSON text, written in
    pieces through one zlib stream (level 9)."""
    comp, size = zlib.compressobj(9), 0

    def put(text: str) -> None:
        nonlocal size
        size += len(comp.compress(text.encode("utf-8")))

    doc = encode_logs_v1([])  # the header of an empty document tells the key order
    keys = list(json.loads(zlib.decompress(doc)))
    req = {
        "v": None, "index": [lg.index for lg in logs], "warmup": [int(lg.warmup) for lg in logs],
        "send_ns": [lg.send_ns for lg in logs], "ok": [int(lg.ok) for lg in logs], "error": [lg.error for lg in logs],
        "prompt_tokens": [lg.prompt_tokens for lg in logs], "completion_tokens": [lg.completion_tokens for lg in logs],
        "tokens_from_text": [int(lg.tokens_from_text) for lg in logs], "input_len": [lg.input_len for lg in logs],
        "output_len": [lg.output_len for lg in logs], "end_dns": [lg.end_ns - lg.send_ns for lg in logs],
        "n_events": [lg.n_events for lg in logs],
    }
    events = {"ev_dt_ns": _deltas, "ev_tokens": lambda lg: lg.ev_tokens, "ev_kind": lambda lg: lg.ev_kind}
    put("{")
    for j, key in enumerate(keys):
        put(("," if j else "") + json.dumps(key) + ":")
        if key == "v":
            put("1")
        elif key in req:
            put(json.dumps(req[key], separators=(",", ":")))
        elif key in events:
            put("[")
            first = True
            for lg in logs:
                v = events[key](lg)
                if len(v):
                    put(("" if first else ",") + ",".join(map(str, v.tolist())))
                    first = False
            put("]")
        else:
            raise KeyError(key)  # a spec column: the seeded logs have none
    put("}")
    return size + len(comp.flush())


def _in_child(fn, *args):
    """(fn(*args), the child's peak RSS in MB) from a forked child process: the figures and the
    recompute are measured in their own processes so that each peak is its own (a forked child
    starts with the pages it shares with this process, so its peak includes them)."""
    import multiprocessing

    from django.db import connections

    global _CALL
    connections.close_all()  # the child opens its own database connection
    _CALL = (fn, args)  # inherited by the fork: the logs are not pickled (that would cost this process their size)
    try:
        with multiprocessing.get_context("fork").Pool(1) as pool:
            return pool.apply(_child)
    finally:
        _CALL = None


_CALL = None


def _child():
    fn, args = _CALL
    return fn(*args), peak_mb()


def _recompute(pk: int) -> int:
    return recompute_runs([pk])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--tokens", type=int, default=2_000)
    ap.add_argument("--warmup", type=int, default=64)
    ap.add_argument("--step-ms", type=float, default=12.0)
    ap.add_argument("--seed", type=int, default=22)
    ap.add_argument("--skip-old", action="store_true", help="do not compute the old layout's size (slow)")
    ap.add_argument("--store-only", action="store_true",
                    help="only seed and store (the stored figures from the first 100 requests): the storing "
                         "process's peak without the figure computation and recompute children")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args()

    call_command("migrate", verbosity=0)
    figures: dict[str, object] = {"requests": args.requests, "tokens": args.tokens, "warmup": args.warmup,
                                  "database": django.db.connection.vendor}
    phases = [("start (Django set up)", "this", peak_mb(), 0.0)]

    # the old layout's writer is byte for byte the streaming size computation (on a sample)
    sample, _, _ = seed_logs(40, 50, 4, args.step_ms, args.seed)
    assert v1_size(sample) == len(encode_logs_v1(sample)), "streaming v1 size differs from encode_logs_v1"

    t = time.perf_counter()
    logs, w0, w1 = seed_logs(args.requests, args.tokens, args.warmup, args.step_ms, args.seed)
    phases.append(("seed (logs as the client hands them)", "this", peak_mb(), time.perf_counter() - t))
    n_events = sum(lg.n_events for lg in logs)
    n_tokens = sum(int(lg.ev_tokens.sum()) for lg in logs)

    t = time.perf_counter()
    if args.store_only:  # figures of the first 100 requests: the stored row's size, not its values, matters here
        window, samples = metrics.measure_window(logs[:100], w0, w1)
    else:
        (window, samples), child_peak = _in_child(metrics.measure_window, logs, w0, w1)
        phases.append(("measure: window figures + samples (the runner's _finish)", "child", child_peak,
                       time.perf_counter() - t))

    host = Host.objects.get_or_create(name="bench-big-run")[0]
    sweep = Sweep.objects.create(name="bench-big-run", host=host, source="benchmarks/big_run.py")
    run = Run.objects.create(sweep=sweep, host=host, point_key="big", spec={}, engine="vllm", model="m", method="auto",
                             concurrency=256, output_len=args.tokens, input_len=512)
    for state in (RunState.PREFLIGHT, RunState.STARTING, RunState.WARMING, RunState.MEASURING, RunState.STOPPING):
        transition(run, state)
    outcome = RunOutcome(ok=True, argv=["bench"], logs=logs, window_start_ns=w0, window_end_ns=w1, metrics=window,
                         distributions=samples)
    t = time.perf_counter()
    store_outcome(run, outcome)
    phases.append(("store: store_outcome (blob + metrics row)", "this", peak_mb(), time.perf_counter() - t))
    store_peak = peak_mb()
    assert RequestLogBlob.objects.filter(run=run).values_list("n_requests", flat=True).get() == args.requests
    blob = bytes(RequestLogBlob.objects.get(run=run).data)

    t = time.perf_counter()
    encode_logs(logs)
    encode_s = time.perf_counter() - t
    t = time.perf_counter()
    cols = decode_columns(blob)
    decode_s = time.perf_counter() - t
    exact = (np.array_equal(cols.t_ns, np.concatenate([lg.ev_t_ns for lg in logs]))
             and np.array_equal(cols.tokens, np.concatenate([lg.ev_tokens for lg in logs]))
             and np.array_equal(cols.kind, np.concatenate([lg.ev_kind for lg in logs])))
    del cols
    stored = window_of(RunMetrics.objects.get(run=run)).to_dict()
    old_size = None if args.skip_old else v1_size(logs)
    del logs, outcome, window, samples

    same = None
    if not args.store_only:
        t = time.perf_counter()
        n, child_peak = _in_child(_recompute, run.pk)
        assert n == 1
        phases.append(("recompute: decode the stored blob, figures again", "child", child_peak,
                       time.perf_counter() - t))
        same = window_of(RunMetrics.objects.get(run=run)).to_dict() == stored

    print(f"{args.requests} requests x {args.tokens} tokens: {n_events:,} messages, {n_tokens:,} output tokens; "
          f"database {figures['database']}")
    print_table(["phase", "process", "peak RSS (MB)", "s"],
                [[name, proc, f"{p:.0f}", f"{s:.2f}"] for name, proc, p, s in phases])
    rows = [["new (v2: binary delta columns, zstandard)", f"{len(blob):,}", f"{len(blob) / n_events * 1e6:,.0f}",
             f"{len(blob) / n_tokens * 1e6:,.0f}", f"{len(blob) / n_events:.2f}"]]
    if old_size is not None:
        rows.insert(0, ["old (v1: zlib over JSON columns)", f"{old_size:,}", f"{old_size / n_events * 1e6:,.0f}",
                        f"{old_size / n_tokens * 1e6:,.0f}", f"{old_size / n_events:.2f}"])
    print_table(["request-log blob", "bytes", "bytes per M messages", "bytes per M tokens", "bytes per message"], rows)
    print(f"encode {encode_s:.2f} s, decode {decode_s:.2f} s; decoded exactly: {exact}; "
          f"recomputed figures equal the stored ones: {same}")
    print(f"storing process peak RSS {store_peak:.0f} MB (target < 1024 MB)")
    figures.update(messages=n_events, output_tokens=n_tokens, phases=[
        {"phase": n, "process": proc, "peak_rss_mb": round(p), "seconds": round(s, 2)} for n, proc, p, s in phases],
        blob_bytes_v2=len(blob), blob_bytes_v1=old_size, bytes_per_million_tokens_v2=round(len(blob) / n_tokens * 1e6),
        bytes_per_million_tokens_v1=round(old_size / n_tokens * 1e6) if old_size else None,
        encode_s=round(encode_s, 2), decode_s=round(decode_s, 2), decoded_exactly=exact, recompute_same=same,
        storing_peak_rss_mb=round(store_peak))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    Sweep.objects.filter(pk=sweep.pk).delete()


if __name__ == "__main__":
    main()
