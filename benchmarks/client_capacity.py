"""Benchmark: the highest streamed tok/s at which a load client still times every message to
better than 1 ms (p99), for draftboard's client with 1, 2, 4 and 8 processes, for `vllm bench
serve`'s client where vLLM is installed and for SGLang's bench clients (benchmarks/peers.py).

Server: `tests/synthetic_server.py` in S processes on one port (`SyntheticFleet`: the first
accepts and hands the connections round-robin to all, so every process serves an equal share of
the streams; `--server-reuseport` for the kernel's SO_REUSEPORT hash instead), each pinned to its
own core, one token per message, message j of a request written at arrival + TTFT + j * gap
(the gap comes with each request as the extra body field `synthetic_gap_ms`, so the servers run
once for the whole benchmark), by each process's one pump (`--server-no-pump`: a task per
request, as before; the same bytes; `--server-poll-ms 1`: poll instead of sleeping when the next
message is due within 1 ms, since asyncio sleeps whole milliseconds). Every server process records
when it wrote each message (`time.perf_counter_ns`, CLOCK_MONOTONIC on Linux, the same clock the
client stamps with): that is the ground truth.

Client: pinned to the remaining cores (its worker processes and `vllm bench serve` inherit the
pin). For each client the configured aggregate rate R climbs (x `--step` per level from
`--start-rate`) with `--concurrency` streams, gap = concurrency * 1000 / R ms, about `--seconds`
of measured load per level (at least four waves of requests). The rule, the same for every
client: a level where the server fell behind its own schedule (its lateness p99 > 2 ms) is void,
neither pass nor fail (it says nothing about the client); any other level passes when every
request completed and the p99 of |timing error| is below 1 ms, and fails else. Timing error = the
client's gap between two consecutive messages minus the true gap between their writes (every
client reports per-message gaps: draftboard's ICL, vLLM's "itl" list from --save-detailed,
SGLang's ITLs). A client that falls behind reads late and coalesces messages, which is exactly
what this error sees. The streamed rate of a level is what the servers wrote per second in the
middle half of the level (all streams running; a closed loop's start and tail left out). The
climb stops at the first failing level, at a level still void after `--void-retries` more tries
(default 1: the fleet's lateness has rare spikes; each try is printed), or when the time budget
is spent (the reason is printed); a client's capacity is its highest passing level. Also printed
per level: the achieved output tok/s over the client's window, draftboard's absolute lateness
p99 (its stamp minus the write time), its busiest process's CPU share and event-loop lag p99,
and the servers' CPU share; then every client side by side at each configured level.

Goals printed at the end (issue 13): 4 client processes reach >= 3x the single-process
capacity; the best multi-process figure is >= 2x `vllm bench serve`'s; (issue 22) draftboard's
best >= SGLang's Rust client's, and the same for draftboard without token ids per message
(`--no-token-ids-too 8`: the server's per-message work of SGLang's clients, like for like). A
benchmark, not a test: it exits 0 after printing (2 when nothing could run).

On the 16-core GPU machine (7 server processes, 9 client cores; about 4-7 minutes):

    python3 benchmarks/client_capacity.py

Small scale on a 2-core machine (1 server process, 1 client core; about 1-2 minutes):

    .venv/bin/python benchmarks/client_capacity.py --processes 1,2 --concurrency 32 --seconds 1 \\
        --start-rate 10000 --max-rate 80000 --budget-s 150

draftboard's client stamps each read with the kernel's receive time (issue 22) and asks, as it
would of vLLM, for token ids instead of usage on every message (`--continuous-usage` asks for
that too); `--read-stamps 1` adds the same client stamping each read when Python reads it (the
client before issue 22), measured in the same call.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
from _common import (  # noqa: E402
    SyntheticFleet,
    draftboard_errors,
    fmt,
    pct,
    print_table,
    ratio,
    run_vllm_bench_serve,
    server_late_ms,
    streamed_tok_s,
    vllm_available,
    vllm_errors,
)
from peers import PEERS_DIR, python_client_ready, run_sglang_client, rust_extension, sglang_errors  # noqa: E402

from benchkit.measure.loadclient import ClientOptions  # noqa: E402
from benchkit.measure.loadgen import run_load_sync  # noqa: E402
from benchkit.measure.metrics import compute_run_metrics  # noqa: E402
from benchkit.measure.workloads import Prompt  # noqa: E402
from benchkit.specs import WorkloadSpec  # noqa: E402

MODEL = "synthetic"
ERROR_LIMIT_MS = 1.0
SERVER_LATE_LIMIT_MS = 2.0
WARMUP_OUTPUT_LEN = 8


def make_prompts(tag: str, n_warm: int, n_meas: int, input_len: int, output_len: int) -> list[Prompt]:
    """Unique prompts (the ground truth is keyed by prompt text): `n_warm` short warmup ones,
    then `n_meas` measured ones; one token per character on the synthetic server."""
    def text(i: int) -> str:
        head = f"{tag} r{i:07d} "
        return (head + "x" * input_len)[: max(input_len, len(head))]

    return ([Prompt(text(i), input_len, WARMUP_OUTPUT_LEN) for i in range(n_warm)]
            + [Prompt(text(n_warm + i), input_len, output_len) for i in range(n_meas)])


def level_workload(args: argparse.Namespace, rate: float) -> tuple[WorkloadSpec, float]:
    gap_ms = args.concurrency * 1000.0 / rate
    # at least 4 waves of requests, so the middle half of the level has every stream running
    n = max(4 * args.concurrency, round(rate * args.seconds / args.output_len))
    wl = WorkloadSpec(input_len=args.input_len, output_len=args.output_len, num_prompts=n,
                      concurrency=args.concurrency, ignore_eos=True)
    return wl, gap_ms


def summarize(rate: float, gap_ms: float, tok_s: float, completed: int, failed: int, errs: dict,
              records, args: argparse.Namespace, server_cpu_share: float, extra: dict) -> dict:
    icl = np.abs(np.asarray(errs["icl_err_ms"])) if errs["icl_err_ms"] else np.asarray([])
    late = server_late_ms(records, args.ttft_ms, gap_ms)
    row = {
        "rate": rate, "gap_ms": gap_ms, "tok_s": tok_s, "streamed": streamed_tok_s(records),
        "completed": completed, "failed": failed,
        "err_p99": pct(icl, 99), "err_p50": pct(icl, 50),
        "late_p99": pct(errs["late_ms"], 99), "ttft_err_p99": pct(errs["ttft_err_ms"], 99),
        "server_late_p99": pct(late, 99), "server_cpu": server_cpu_share,
        "mismatched": errs["mismatched"] + errs["missing"], **extra,
    }
    reasons = []
    if failed or row["mismatched"]:
        reasons.append(f"{failed} failed / {row['mismatched']} unmatched requests")
    if row["err_p99"] is None or row["err_p99"] >= ERROR_LIMIT_MS:
        reasons.append(f"timing error p99 {fmt(row['err_p99'])} ms >= {ERROR_LIMIT_MS:g}")
    row["fail"] = "; ".join(reasons)
    row["server_behind"] = row["server_late_p99"] is not None and row["server_late_p99"] > SERVER_LATE_LIMIT_MS
    return row


def verdict(r: dict) -> str:
    """The same rule for every client: a level where the server fell behind its own schedule is
    void (neither pass nor fail: it says nothing about the client); otherwise it passes with no
    failed or unmatched request and |timing error| p99 < 1 ms, and fails else."""
    if r["server_behind"]:
        return f"void: server late p99 {fmt(r['server_late_p99'])} ms > {SERVER_LATE_LIMIT_MS:g}"
    return "FAIL: " + r["fail"] if r["fail"] else "pass"


def passed(r: dict) -> bool:
    """The level passed under `verdict`'s rule."""
    return verdict(r) == "pass"


def run_draftboard(url: str, fleet: SyntheticFleet, n_proc: int, rate: float, tag: str,
                   args: argparse.Namespace, kernel_stamps: bool = True, token_ids: bool = True) -> dict:
    wl, gap_ms = level_workload(args, rate)
    prompts = make_prompts(tag, wl.n_warmup, wl.num_prompts, args.input_len, args.output_len)
    fleet.collect()  # drop anything left over
    cpu0, t0 = fleet.cpu_s(), time.monotonic()
    # as against vLLM: token ids per message, no usage on every message
    opts = ClientOptions(return_token_ids=token_ids and not args.no_token_ids, continuous_usage=args.continuous_usage,
                         kernel_stamps=kernel_stamps, keep_outputs=False)
    res = run_load_sync(url, MODEL, wl, prompts=prompts, processes=n_proc, request_timeout_s=120,
                        extra_body={"synthetic_gap_ms": gap_ms, "synthetic_ttft_ms": args.ttft_ms}, options=opts)
    server_share = (fleet.cpu_s() - cpu0) / max(time.monotonic() - t0, 1e-9) / len(fleet.cores)
    records = fleet.collect()
    measured = {p.text for p in prompts[wl.n_warmup:]}
    records = {k: v for k, v in records.items() if k in measured}
    m = compute_run_metrics(res.logs, res.window_start_ns, res.window_end_ns)
    c = res.client
    return summarize(rate, gap_ms, m.output_throughput_tok_s, m.completed, m.failed,
                     draftboard_errors(res.logs, prompts, records), records, args, server_share,
                     {"cpu_share": c.max_core_share if c else None, "lag_p99": c.loop_lag_p99_ms if c else None})


def run_vllm(url: str, fleet: SyntheticFleet, rate: float, tag: str, args: argparse.Namespace,
             tokenizer: Path, work: Path) -> dict:
    wl, gap_ms = level_workload(args, rate)
    prompts = make_prompts(tag, 0, wl.num_prompts, args.input_len, args.output_len)  # vLLM warms with prompt 0
    dataset = work / f"{tag}.jsonl"
    with dataset.open("w") as fh:
        for p in prompts:
            fh.write(json.dumps({"prompt": p.text, "output_tokens": p.output_len}) + "\n")
    fleet.collect()
    cpu0, t0 = fleet.cpu_s(), time.monotonic()
    extra = {"synthetic_gap_ms": gap_ms, "synthetic_ttft_ms": args.ttft_ms}
    res = run_vllm_bench_serve(url, MODEL, tokenizer, dataset, wl, work, tag, 600,
                               extra=["--save-detailed", "--extra-body", json.dumps(extra)])
    # vLLM's start-up (imports, tokenizer) is in this wall time, so the share is an underestimate
    server_share = (fleet.cpu_s() - cpu0) / max(time.monotonic() - t0, 1e-9) / len(fleet.cores)
    records = fleet.collect()
    return summarize(rate, gap_ms, res["output_throughput"], res["completed"], res["failed"],
                     vllm_errors(res, prompts, records), {p.text: records.get(p.text, [])[-1:] for p in prompts},
                     args, server_share, {"cpu_share": None, "lag_p99": None})


def run_sglang(kind: str, url: str, fleet: SyntheticFleet, rate: float, tag: str, args: argparse.Namespace,
               work: Path, worker_threads: int | None = None) -> dict:
    """One level of SGLang's `rust` or `python` bench client (benchmarks/peers.py), same prompts,
    streams, output length and gaps as draftboard's level; errors matched through the echo key."""
    wl, gap_ms = level_workload(args, rate)
    prompts = make_prompts(tag, 0, wl.num_prompts, args.input_len, args.output_len)
    fleet.collect()
    cpu0, t0 = fleet.cpu_s(), time.monotonic()
    res = run_sglang_client(kind, url, MODEL, PEERS_DIR / "tokenizer", prompts, args.output_len, args.concurrency,
                            1, {"synthetic_gap_ms": gap_ms, "synthetic_ttft_ms": args.ttft_ms}, work, tag, 600,
                            worker_threads=worker_threads)
    server_share = (fleet.cpu_s() - cpu0) / max(time.monotonic() - t0, 1e-9) / len(fleet.cores)
    records = fleet.collect()
    measured = {p.text for p in prompts}
    records = {k: v for k, v in records.items() if k in measured}
    return summarize(rate, gap_ms, res.get("output_throughput") or 0.0, res.get("completed") or 0,
                     len(prompts) - (res.get("completed") or 0), sglang_errors(res, records),
                     {k: v[-1:] for k, v in records.items()}, args, server_share, {"cpu_share": None, "lag_p99": None})


LEVEL_HEADERS = ["configured tok/s", "gap ms", "streamed tok/s", "achieved tok/s", "err p50 ms", "err p99 ms",
                 "late p99 ms", "TTFT err p99", "client CPU", "loop lag p99", "server late p99", "server CPU",
                 "verdict"]


def level_row(r: dict) -> list:
    return [f"{r['rate']:.0f}", r["gap_ms"], r["streamed"], r["tok_s"], r["err_p50"], r["err_p99"], r["late_p99"],
            r["ttft_err_p99"], r["cpu_share"], r["lag_p99"], r["server_late_p99"], r["server_cpu"], verdict(r)]


def same_level_table(names: list[str], results: dict[str, list[dict]]) -> tuple[list[str], list[list]]:
    """One row per configured level, one column per client: streamed tok/s, |timing error| p99 and
    the verdict's first word (pass / FAIL / void) at that level; '-' where the client did not run it."""
    rates = sorted({round(r["rate"]) for name in names for r in results[name]})
    rows = []
    for rate in rates:
        row: list = [str(rate)]
        for name in names:
            r = next((r for r in reversed(results[name]) if round(r["rate"]) == rate), None)
            row.append("-" if r is None else f"{fmt(r['streamed'], 0)} {fmt(r['err_p99'])} {verdict(r).split(':')[0]}")
        rows.append(row)
    return ["configured tok/s"] + names, rows


def main(argv: list[str] | None = None) -> int:
    """Parse options, climb the rates for every client, print the tables; return exit status."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", default="1,2,4,8", help="draftboard client process counts (comma list)")
    ap.add_argument("--vllm", choices=("auto", "skip"), default="auto",
                    help="also measure vllm bench serve's client when vLLM is installed")
    ap.add_argument("--concurrency", type=int, default=256, help="streams in flight")
    ap.add_argument("--output-len", type=int, default=128, help="tokens per measured request")
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--ttft-ms", type=float, default=5.0)
    ap.add_argument("--seconds", type=float, default=3.0, help="measured load per level (about)")
    ap.add_argument("--start-rate", type=float, default=40000.0, help="first configured tok/s")
    ap.add_argument("--step", type=float, default=1.5, help="rate factor between levels")
    ap.add_argument("--max-rate", type=float, default=3e6)
    ap.add_argument("--server-processes", type=int, default=0,
                    help="default: cores - max(processes) - 1 (at least 1)")
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop climbing after this many seconds")
    ap.add_argument("--work-dir", default="")
    ap.add_argument("--read-stamps", default="",
                    help="also run draftboard with these process counts (comma list) stamping each read when "
                         "Python reads it instead of with the kernel's receive time (the client before issue 22)")
    ap.add_argument("--sglang", default="auto",
                    help="SGLang peer clients: comma list of rust, rust1 (one worker thread), python; 'auto' = "
                         "those fetched into .peers/ (benchmarks/peers.py fetch); 'skip' = none")
    ap.add_argument("--no-token-ids", action="store_true",
                    help="draftboard does not ask for token ids per message (counts tokens from the text, as "
                         "SGLang's clients do): less work per message for the server")
    ap.add_argument("--no-token-ids-too", default="",
                    help="also run draftboard with these process counts (comma list) without token ids per "
                         "message: the same per-message server work as SGLang's clients (like for like)")
    ap.add_argument("--server-reuseport", action="store_true",
                    help="every server process listens (SO_REUSEPORT: the kernel's hash spreads connections) "
                         "instead of one handing connections round-robin to all (the fleet before issue 22's end)")
    ap.add_argument("--server-no-pump", action="store_true",
                    help="a task per request writes each token message through aiohttp instead of each server "
                         "process's one pump (the fleet before issue 22's end; same bytes, more CPU per message)")
    ap.add_argument("--server-poll-ms", type=float, default=0.0,
                    help="server processes poll their loop instead of sleeping when the next message is due "
                         "within this many ms (asyncio sleeps whole ms: about 1 ms of lateness otherwise); "
                         "each then keeps its core busy, so its CPU share reads about 1")
    ap.add_argument("--void-retries", type=int, default=1,
                    help="measure a void level (the server fell behind its schedule) again this many times "
                         "before the climb stops there; every client gets the same retries")
    ap.add_argument("--continuous-usage", action="store_true",
                    help="ask for usage on every message (stream_options.continuous_usage_stats)")
    args = ap.parse_args(argv)

    procs = [int(x) for x in args.processes.split(",") if x.strip()]
    cores = sorted(os.sched_getaffinity(0))
    n_server = args.server_processes or max(1, len(cores) - max(procs + [0]) - 1)
    server_cores = cores[:n_server] if n_server < len(cores) else [None] * n_server
    client_cores = cores[n_server:] or cores
    os.sched_setaffinity(0, set(client_cores))  # client workers and vllm bench serve inherit this
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="draftboard-capacity-"))
    work.mkdir(parents=True, exist_ok=True)
    clients: list[tuple[str, int | str | None]] = [(f"draftboard x{p}", p) for p in procs]
    read_procs = [int(x) for x in args.read_stamps.split(",") if x.strip()]
    clients += [(f"draftboard x{p} read-stamps", p) for p in read_procs]
    same_work = [int(x) for x in args.no_token_ids_too.split(",") if x.strip()]
    clients += [(f"draftboard x{p} no-token-ids", p) for p in same_work]
    tokenizer = None
    if args.vllm == "auto":
        if vllm_available():
            from benchkit.engines.demo_models import build_demo_models

            tokenizer = build_demo_models(work / "models").target  # vLLM's dataset code needs a tokenizer
            clients.append(("vllm bench serve", None))
        else:
            print("vllm bench serve: skipped (vLLM is not installed here)")
    want = {"auto": ("rust", "rust1", "python"), "skip": ()}.get(args.sglang, tuple(args.sglang.split(",")))
    for kind in want:
        if kind in ("rust", "rust1") and rust_extension() is None:
            print(f"sglang {kind}: skipped (no Rust bench extension for this Python under {PEERS_DIR})")
        elif kind == "python" and not python_client_ready():
            print("sglang python: skipped (its files or its imports are missing here)")
        else:
            clients.append((f"sglang {kind}", kind))
    print(f"{len(cores)} cores: synthetic server x{n_server} on {server_cores}, clients on {client_cores}")
    writes = "a task per request" if args.server_no_pump else "one pump per process"
    spread = "spread by SO_REUSEPORT" if args.server_reuseport else "handed round-robin to the processes"
    poll = f", polling when the next is due within {args.server_poll_ms:g} ms" if args.server_poll_ms else ""
    print(f"server: token messages written by {writes}{poll}, connections {spread}")
    print(f"per level: concurrency {args.concurrency}, {args.output_len} tokens per request (1 per message), "
          f"about {args.seconds:g} s measured, TTFT {args.ttft_ms:g} ms; pass = no failure and "
          f"|timing error| p99 < {ERROR_LIMIT_MS:g} ms")
    print(f"python {sys.version.split()[0]}; work dir {work}")

    started = time.monotonic()
    results: dict[str, list[dict]] = {name: [] for name, _ in clients}
    stops: dict[str, str] = {}
    status = 0
    try:
        fleet = SyntheticFleet(server_cores, balance=not args.server_reuseport, pump=not args.server_no_pump,
                               pump_poll_ms=args.server_poll_ms, ttft_ms=args.ttft_ms, gap_ms=10.0)
        with fleet as url:
            for ci, (name, n_proc) in enumerate(clients):
                rate, level, retries = args.start_rate, 0, args.void_retries
                while True:
                    if rate > args.max_rate:
                        stops[name] = f"reached --max-rate {args.max_rate:g}"
                        break
                    if time.monotonic() - started > args.budget_s:
                        stops[name] = f"time budget {args.budget_s:g} s spent"
                        break
                    tag = f"c{ci}l{level}r{retries}"
                    t1 = time.monotonic()
                    try:
                        if isinstance(n_proc, str):
                            row = run_sglang("python" if n_proc == "python" else "rust", url, fleet, rate, tag,
                                             args, work, worker_threads=1 if n_proc == "rust1" else None)
                        elif n_proc is None:
                            row = run_vllm(url, fleet, rate, tag, args, tokenizer, work)
                        else:
                            row = run_draftboard(url, fleet, n_proc, rate, tag, args,
                                                 kernel_stamps=not name.endswith("read-stamps"),
                                                 token_ids=not name.endswith("no-token-ids"))
                    except Exception as exc:  # a client that cannot run: say so, go on with the next
                        stops[name] = f"could not run: {type(exc).__name__}: {str(exc)[-300:]}"
                        break
                    results[name].append(row)
                    print(f"{name:18s} {rate:10.0f} tok/s: streamed {fmt(row['streamed'], 0):>8s}, err p99 "
                          f"{fmt(row['err_p99'])} ms, server late p99 {fmt(row['server_late_p99'])} ms, "
                          f"{time.monotonic() - t1:5.1f} s  " + verdict(row), flush=True)
                    if row["server_behind"] and retries > 0:
                        retries -= 1  # it says nothing about the client: measure the level again
                        continue
                    if row["server_behind"]:
                        late = fmt(row["server_late_p99"])
                        stops[name] = (f"void at {rate:.0f}: the server fell behind its schedule (late p99 {late} ms"
                                       f" > {SERVER_LATE_LIMIT_MS:g}); the client was not pushed to its own limit")
                        break
                    if row["fail"]:
                        stops[name] = f"failed at {rate:.0f}: {row['fail']}"
                        break
                    rate *= args.step
                    level += 1
                    retries = args.void_retries
    except Exception as exc:
        print(f"\nABORTED: {type(exc).__name__}: {exc}")
        status = 2

    for name, _ in clients:
        print(f"\n{name}: every level")
        print_table(LEVEL_HEADERS, [level_row(r) for r in results[name]])

    def best(name: str) -> dict | None:
        ok = [r for r in results[name] if passed(r)]
        return max(ok, key=lambda r: r["rate"]) if ok else None

    names = [name for name, _ in clients]
    print("\nEvery client at each configured level: streamed tok/s, |timing error| p99 ms, verdict "
          "(void = the server fell behind its schedule)")
    print_table(*same_level_table(names, results))

    print(f"\nCapacity: highest passing level (no failure, timing error p99 < {ERROR_LIMIT_MS:g} ms, and the "
          f"server kept to its schedule: late p99 <= {SERVER_LATE_LIMIT_MS:g} ms); streamed = what the servers "
          "wrote per second")
    rows = []
    for name, _ in clients:
        b = best(name)
        rows.append([name, f"{b['rate']:.0f}" if b else "-", b["streamed"] if b else None,
                     b["err_p99"] if b else None, b["late_p99"] if b else None, b["cpu_share"] if b else None,
                     stops.get(name, "-")])
    print_table(["client", "configured tok/s", "streamed tok/s", "err p99 ms", "late p99 ms", "client CPU",
                 "the climb stopped because"], rows)

    def cap(name: str) -> float | None:
        b = best(name)
        return b["streamed"] if b else None

    one = cap(f"draftboard x{procs[0]}") if procs and procs[0] == 1 else None
    if one:
        print("\nRatios to draftboard x1: " + ", ".join(f"x{p}: {fmt(ratio(cap(f'draftboard x{p}'), one), 2)}"
                                                      for p in procs))
    multi = max((cap(f"draftboard x{p}") or 0.0 for p in procs if p > 1), default=0.0) or None
    four = cap("draftboard x4") if 4 in procs else None
    if one and four is not None:
        met = four >= 3 * one
        print(f"Goal: 4 processes >= 3x one process: {'MET' if met else 'NOT MET'} "
              f"({fmt(four, 0)} vs {fmt(one, 0)} tok/s, {fmt(ratio(four, one), 2)}x)")
    if "vllm bench serve" in results:
        v = cap("vllm bench serve")
        print(f"Goal: best multi-process draftboard >= 2x vllm bench serve: "
              f"{'MET' if multi and v and multi >= 2 * v else 'NOT MET'} ({fmt(multi, 0)} vs {fmt(v, 0)} tok/s, "
              f"{fmt(ratio(multi, v), 2)}x); draftboard x1 / vllm: {fmt(ratio(one, v), 2)}")
    else:
        print("Goal vs vllm bench serve: not measured here (no vLLM)")
    def rank(name: str) -> tuple[float, float]:
        """A client with a passing level, ranked by its highest passing level, then what streamed there."""
        b = best(name)
        return b["rate"], b["streamed"] or 0.0

    rust = [n for n in ("sglang rust", "sglang rust1") if n in results and best(n)]
    if rust:
        top_rust = max(rust, key=rank)

        def against(label: str, mine: list[str]) -> None:
            mine = [n for n in mine if best(n)]
            if not mine:
                print(f"Goal (issue 22): {label} >= SGLang's Rust client: NOT MET ({label}: no passing level)")
                return
            top = max(mine, key=rank)
            bound = [n for n in (top, top_rust) if stops.get(n, "").startswith("void")]
            # capacity is the highest passing level; at one level the streamed figures differ by
            # what the servers happened to write, so equal levels are a tie (>= holds), named so
            mine_rate, rust_rate = round(best(top)["rate"]), round(best(top_rust)["rate"])
            met = ("NOT MET" if mine_rate < rust_rate else
                   "MET, a tie by level" if mine_rate == rust_rate else "MET")
            print(f"Goal (issue 22): {label} >= SGLang's Rust client: {met} "
                  f"({top} {fmt(cap(top), 0)} tok/s streamed at {best(top)['rate']:.0f} configured vs {top_rust} "
                  f"{fmt(cap(top_rust), 0)} at {best(top_rust)['rate']:.0f}, {fmt(ratio(cap(top), cap(top_rust)), 3)}x)"
                  + (f"; the climb of {' and '.join(bound)} ended on a void level (the server fleet's limit, not "
                     "the client's)" if bound else ""))

        against("draftboard's best", [f"draftboard x{p}" for p in procs])
        if same_work:
            against("draftboard without token ids (like for like)",
                    [f"draftboard x{p} no-token-ids" for p in same_work])
    print(f"\ntotal {time.monotonic() - started:.0f} s")
    return status if any(results.values()) else 2


if __name__ == "__main__":
    sys.exit(main())
