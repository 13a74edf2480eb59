"""Benchmark: how many streamed tokens/s a load client sustains on one core, and how exactly it
times them: draftboard's client (`benchkit.measure.loadgen`) against `vllm bench serve`.

The server is `tests/synthetic_server.py` (a real aiohttp HTTP server streaming Server-Sent
Events in vLLM's completion shapes, one token per message, message j of a request due at
receipt + TTFT + j * gap on an absolute schedule). It runs in its own process pinned to one core
(`os.sched_setaffinity`); this script and everything it starts (draftboard's client in-process,
`vllm bench serve` as a child process, which inherits the pin) run pinned to another core.

Levels: for each configured aggregate rate R (tok/s) the gap is concurrency * 1000 / R ms, so
`concurrency` streams together ask for R tokens/s; the last level is gap 0 ("max": the server
streams as fast as it can). At each level both clients send the same prompts (closed loop,
`concurrency` in flight, ignore_eos, `--output-len` tokens each, `concurrency` warmup requests),
and the script prints per client: achieved output tok/s (completed tokens / measured window),
achieved / configured, and the timing error = measured gap between consecutive token-carrying
messages minus the configured gap (ms; p50 and p99; draftboard's ICL samples, vLLM's "itl"
samples from `--save-detailed`), and the synthetic server's CPU use during the run (% of its
core, from psutil; near 100 % means the server, not the client, is the limit). The error is
end to end: server scheduling lateness counts in it too, for both clients alike.

vLLM's client needs a tokenizer for its dataset code; it gets the demo target model's (built
into a temp dir); the synthetic server already answers /v1/models. Its dataset is the same
prompts, written as a custom JSON-lines dataset.

Goal printed at the end: draftboard's highest achieved tok/s at least as high as vllm bench
serve's, and draftboard's timing error p99 under 1 ms at the 10 000 tok/s level. A benchmark,
not a test: it prints whether the goal is met and exits 0 (2 when a client could not run).

Run (about 2-3 minutes):

    .venv/bin/python benchmarks/client_capacity.py --concurrency 16 --num-prompts 48 --output-len 256
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import psutil  # noqa: E402
from _common import fmt, pct, print_table, ratio, run_vllm_bench_serve  # noqa: E402

from benchkit.engines.demo_models import build_demo_models  # noqa: E402
from benchkit.measure.loadgen import run_load_sync  # noqa: E402
from benchkit.measure.metrics import compute_run_metrics, request_metrics  # noqa: E402
from benchkit.measure.workloads import Prompt, build_prompts  # noqa: E402
from benchkit.specs import WorkloadSpec  # noqa: E402

MODEL = "synthetic"


def _serve(core: int, ttft_ms: float, gap_ms: float, conn, stop) -> None:
    """Child process: pin to `core`, run a SyntheticServer, send its URL, wait for `stop`."""
    os.sched_setaffinity(0, {core})
    sys.path.insert(0, str(REPO / "tests"))
    from synthetic_server import SyntheticConfig, SyntheticServer

    config = SyntheticConfig(ttft_ms=ttft_ms, gap_ms=gap_ms, tokens_per_message=1, model=MODEL)
    server = SyntheticServer(config)
    conn.send(server.start())
    stop.wait()
    server.stop()


class ServerProcess:
    """A synthetic server in its own process pinned to `core`; context manager yielding the URL."""

    def __init__(self, core: int, ttft_ms: float, gap_ms: float):
        ctx = mp.get_context("spawn")
        self._parent, child = ctx.Pipe()
        self._stop = ctx.Event()
        self.proc = ctx.Process(target=_serve, args=(core, ttft_ms, gap_ms, child, self._stop), daemon=True)

    def __enter__(self) -> str:
        self.proc.start()
        if not self._parent.poll(60):
            self.proc.kill()
            raise RuntimeError("synthetic server did not start within 60 s")
        return self._parent.recv()

    def cpu_s(self) -> float:
        """CPU seconds (user + system) the server process has used so far."""
        t = psutil.Process(self.proc.pid).cpu_times()
        return t.user + t.system

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)


def gap_errors_draftboard(logs, gap_ms: float) -> list[float]:
    """Measured minus configured gap (ms) for every ICL sample of completed measured requests."""
    out: list[float] = []
    for log in logs:
        if log.warmup:
            continue
        rm = request_metrics(log)
        if rm.completed:
            out.extend(x - gap_ms for x in rm.icl_ms)
    return out


def run_draftboard(url: str, workload: WorkloadSpec, prompts: list[Prompt], gap_ms: float) -> dict:
    """One draftboard run: achieved tok/s, window (s), failures, gap errors (ms)."""
    res = run_load_sync(url, MODEL, workload, prompts=prompts, request_timeout_s=120)
    m = compute_run_metrics(res.logs, res.window_start_ns, res.window_end_ns)
    return {
        "tok_s": m.output_throughput_tok_s,
        "duration": m.duration_s,
        "completed": m.completed,
        "failed": m.failed,
        "tokens": m.total_output_tokens,
        "errors": gap_errors_draftboard(res.logs, gap_ms),
    }


def run_vllm(
    url: str, workload: WorkloadSpec, dataset: Path, tokenizer: Path, out_dir: Path, name: str, gap_ms: float
) -> dict:
    """One `vllm bench serve --save-result --save-detailed` run; same keys as `run_draftboard`.
    Raises RuntimeError with its output tail when it fails."""
    res = run_vllm_bench_serve(url, MODEL, tokenizer, dataset, workload, out_dir, name, 300,
                               extra=["--save-detailed"])
    errors = [x * 1000.0 - gap_ms for itls in res.get("itls", []) for x in itls]
    return {
        "tok_s": res["output_throughput"],
        "duration": res["duration"],
        "completed": res["completed"],
        "failed": res["failed"],
        "tokens": res["total_output_tokens"],
        "errors": errors,
    }


def main(argv: list[str] | None = None) -> int:
    """Parse options, run every level with both clients, print the tables; return exit status."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, default=16, help="streams in flight")
    ap.add_argument("--num-prompts", type=int, default=48, help="measured requests per run")
    ap.add_argument("--output-len", type=int, default=256, help="tokens per request")
    ap.add_argument("--input-len", type=int, default=16)
    ap.add_argument("--ttft-ms", type=float, default=5.0)
    ap.add_argument("--rates", default="2000,5000,10000,20000",
                    help="configured aggregate tok/s levels (comma list); a gap-0 'max' level is added")
    ap.add_argument("--client-core", type=int, default=None, help="default: first allowed core")
    ap.add_argument("--server-core", type=int, default=None, help="default: second allowed core")
    ap.add_argument("--goal-rate", type=float, default=10000.0, help="level for the p99 < 1 ms goal")
    ap.add_argument("--work-dir", default="")
    args = ap.parse_args(argv)

    cores = sorted(os.sched_getaffinity(0))
    client_core = args.client_core if args.client_core is not None else cores[0]
    server_core = args.server_core if args.server_core is not None else cores[-1]
    if client_core == server_core:
        print(f"need two different cores (allowed: {cores}); got client {client_core}, server {server_core}")
        return 2
    os.sched_setaffinity(0, {client_core})  # children (vllm bench serve) inherit this pin
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="draftboard-capacity-"))
    work.mkdir(parents=True, exist_ok=True)
    models = build_demo_models(work / "models")
    rates = [float(x) for x in args.rates.split(",") if x.strip()]
    levels = [(r, args.concurrency * 1000.0 / r) for r in rates] + [(None, 0.0)]
    workload = WorkloadSpec(dataset="random", input_len=args.input_len, output_len=args.output_len,
                            num_prompts=args.num_prompts, concurrency=args.concurrency, ignore_eos=True)
    print(f"work dir: {work}; client pinned to core {client_core}, synthetic server to core {server_core}")
    print(f"per run: {args.num_prompts} requests x {args.output_len} tokens (1 token per message), "
          f"concurrency {args.concurrency}, TTFT {args.ttft_ms:g} ms, {workload.n_warmup} warmup requests")

    clients = ("draftboard", "vllm bench serve")
    results: dict[str, list[dict]] = {c: [] for c in clients}
    status = 0
    try:
        for i, (rate, gap) in enumerate(levels):
            srv = ServerProcess(server_core, args.ttft_ms, gap)
            with srv as url:
                if i == 0:
                    prompts = build_prompts(workload, base_url=url, model=MODEL)
                    dataset = work / "prompts.jsonl"
                    with dataset.open("w") as fh:
                        for p in prompts[workload.n_warmup:]:
                            fh.write(json.dumps({"prompt": p.text, "output_tokens": p.output_len}) + "\n")
                for who in clients if i % 2 == 0 else clients[::-1]:
                    cpu0, t0 = srv.cpu_s(), time.monotonic()
                    if who == "draftboard":
                        res = run_draftboard(url, workload, prompts, gap)
                    else:
                        res = run_vllm(url, workload, dataset, models.target, work, f"vllm-level{i}", gap)
                    # Server CPU over the whole client run (incl. warmup and, for vLLM, its start-up,
                    # when the server idles), divided by the measured window: an upper-bound estimate.
                    res["server_cpu_pct"] = 100.0 * (srv.cpu_s() - cpu0) / max(res["duration"], 1e-9)
                    res["rate"], res["gap"] = rate, gap
                    results[who].append(res)
                    label = f"{rate:g} tok/s" if rate else "max"
                    print(f"level {label:>12s} (gap {gap:.3f} ms) {who:16s}: {res['tok_s']:9.1f} tok/s, "
                          f"completed {res['completed']}, failed {res['failed']}, "
                          f"{time.monotonic() - t0:5.1f} s")
    except Exception as exc:
        print(f"\nABORTED: {type(exc).__name__}: {exc}")
        status = 2

    for who in clients:
        print(f"\n{who} (client on core {client_core}):")
        rows = []
        for r in results[who]:
            errs = r["errors"]
            rows.append([
                f"{r['rate']:g}" if r["rate"] else "max (gap 0)",
                r["gap"],
                r["tok_s"],
                ratio(r["tok_s"], r["rate"]) if r["rate"] else None,
                pct(errs, 50) if r["rate"] else None,
                pct(errs, 99) if r["rate"] else None,
                pct(errs, 1) if r["rate"] else None,
                r["server_cpu_pct"],
                f"{r['completed']}/{r['failed']}",
            ])
        print_table(["configured tok/s", "gap ms", "achieved tok/s", "achieved/conf", "err p50 ms",
                     "err p99 ms", "err p1 ms", "server CPU %*", "ok/failed"], rows)

    print("\n* server CPU seconds during the whole client run (incl. warmup requests) / measured window:"
          " an upper bound of its load; near or above 100 % the server, not the client, may be the limit.")
    db, vl = results["draftboard"], results["vllm bench serve"]
    if not db or not vl:
        print("\nRESULT: not comparable (a client did not run).")
        return 2
    n = min(len(db), len(vl))
    print("\nRatio draftboard / vllm bench serve:")
    rows = [[f"{d['rate']:g}" if d["rate"] else "max (gap 0)",
             d["tok_s"], v["tok_s"], ratio(d["tok_s"], v["tok_s"]),
             pct(d["errors"], 99) if d["rate"] else None, pct(v["errors"], 99) if v["rate"] else None]
            for d, v in zip(db[:n], vl[:n], strict=True)]
    print_table(["configured tok/s", "draftboard tok/s", "vllm tok/s", "ratio d/v", "d err p99 ms",
                 "v err p99 ms"], rows)
    best_d, best_v = max(x["tok_s"] for x in db), max(x["tok_s"] for x in vl)
    print(f"highest achieved tok/s: draftboard {best_d:.1f}, vllm bench serve {best_v:.1f}, "
          f"ratio {fmt(ratio(best_d, best_v))}")
    goal = [x for x in db if x["rate"] == args.goal_rate]
    p99 = pct(goal[0]["errors"], 99) if goal else None
    met_rate = best_d >= best_v
    met_err = p99 is not None and p99 < 1.0
    print(f"\nGoal 1: draftboard's highest tok/s >= vllm bench serve's: {'MET' if met_rate else 'NOT MET'} "
          f"({best_d:.1f} vs {best_v:.1f})")
    print(f"Goal 2: draftboard timing error p99 < 1 ms at {args.goal_rate:g} tok/s: "
          f"{'MET' if met_err else 'NOT MET'} (p99 {fmt(p99)} ms"
          + (f", achieved {goal[0]['tok_s']:.1f} tok/s)" if goal else ", level not run)"))
    return status


if __name__ == "__main__":
    sys.exit(main())
