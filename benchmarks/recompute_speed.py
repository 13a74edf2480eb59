"""Milliseconds per run of `manage.py recompute_metrics`, today's path against the new one
(issue 9: "about 138 ms per run ... at least 5x faster per run").

Not a test: it seeds `--runs` succeeded runs shaped like the users' grid at 1024 output tokens
(64 measured + 8 warmup requests each; half `auto` with one token per message, half DDTree with
1-8 tokens per message; the stored rows as a real run has them: request-log blob, full metrics
row with the run page's samples, 20 KB server-log tail), then recomputes them

- with `reference_recompute`: today's path, copied here unchanged from runs/services/recompute.py,
  the command and metrics_store at commit 74508a7, over that commit's pure-Python log decoding
  and metrics (tests/metrics_reference.py): every run loaded in full with its metrics row, each
  request's metrics computed twice (window figures, then samples), the row read before it is
  written; and
- with the `recompute_metrics` command as it is now, with `--jobs 1` and `--jobs N`,

and prints ms per run, the ratio to today's path, and whether both paths stored the same figures.
Other work on the machine moves the numbers (run it when the machine is quiet).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/draftboard_dash \\
        .venv/bin/python benchmarks/recompute_speed.py --runs 200 --jobs 2
"""

from __future__ import annotations

import argparse
import io
import os
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchsite.settings")

import django  # noqa: E402

django.setup()

from _common import print_table  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import transaction  # noqa: E402

from benchkit.formats.common import TOOL_DRAFTBOARD, json_safe  # noqa: E402
from benchkit.measure import metrics  # noqa: E402
from benchkit.measure.logs import MessageEvent, RequestLog, encode_logs_v1  # noqa: E402
from runs.models import Host, RequestLogBlob, Run, RunMetrics, RunState, Sweep  # noqa: E402
from runs.selectors import window_of  # noqa: E402
from runs.services.metrics_store import store_metrics  # noqa: E402
from tests import metrics_reference as reference  # noqa: E402

MS = 1_000_000
SWEEP = "bench-recompute"
N_TOKENS, N_MEASURED, CONCURRENCY = 1024, 64, 8


def make_logs(spec: bool, seed: int) -> tuple[list[RequestLog], int, int]:
    """8 concurrent streams of 1024 tokens; auto: 1 token per message, DDTree: 1-8 per message."""
    rng = random.Random(seed)
    logs, end = [], 0
    for i in range(N_MEASURED + CONCURRENCY):
        send = (i // CONCURRENCY) * 4000 * MS + rng.randint(0, 3 * MS)
        t, got, events = send + rng.randint(40, 90) * MS, 0, []
        while got < N_TOKENS:
            k = min(N_TOKENS - got, rng.randint(1, 8) if spec else 1)
            events.append(MessageEvent(t_ns=t, tokens=k, kind="content"))
            got += k
            t += rng.randint(3 * MS, 12 * MS)
        logs.append(RequestLog(index=i, warmup=i < CONCURRENCY, send_ns=send, events=events, prompt_tokens=512,
                               completion_tokens=N_TOKENS, input_len=512, output_len=N_TOKENS, end_ns=t))
        end = max(end, t)
    return logs, 4000 * MS, end  # the window opens with the first measured send


def seed(n: int) -> Sweep:
    """The benchmark sweep with `n` succeeded runs (created once, reused while it has `n`)."""
    sweep = Sweep.objects.filter(name=SWEEP).first()
    if sweep and sweep.runs.count() == n:
        return sweep
    if sweep:
        sweep.runs.all().delete()
        sweep.delete()
    host, _ = Host.objects.get_or_create(name="bench-recompute")
    tail = "INFO scheduler.py:123] Decode batch. #running-req: 8, gen throughput (token/s): 1270.8\n" * 220
    with transaction.atomic():
        sweep = Sweep.objects.create(name=SWEEP, host=host, source="benchmarks/recompute_speed.py")
        for i in range(n):
            spec = i % 2 == 1
            run = Run.objects.create(
                sweep=sweep, host=host, point_key=f"r{i}", engine="sglang", model="/models/Qwen3.5-27B",
                method="ddtree" if spec else "auto", tree_budget=15 if spec else None, tp=1, concurrency=CONCURRENCY,
                input_len=512, output_len=N_TOKENS, num_prompts=N_MEASURED, state=RunState.SUCCEEDED,
                spec={"server": {"method": "ddtree" if spec else "auto"}, "workload": {"slo": {"ttft_ms": 2000.0}}},
                argv=["python", "-m", "sglang.launch_server"] * 10, server_log_tail=tail)
            logs, t0, t1 = make_logs(spec, i)
            # stored in the old layout (zlib JSON): the reference path decodes only that
            RequestLogBlob.objects.create(run=run, data=encode_logs_v1(logs), n_requests=len(logs),
                                          n_warmup=CONCURRENCY, window_start_ns=t0, window_end_ns=t1)
            window = metrics.compute_run_metrics(logs, t0, t1, {"ttft_ms": 2000.0})
            if spec:
                window = window.with_spec_decode({"acceptance_length": 4.5, "acceptance_rate": 0.23,
                                                  "spec_num_drafts": 15000.0})
            store_metrics(run, window, spec_source="sglang" if spec else "", distributions=metrics.distributions(logs))
    return sweep


# --- today's path: runs/services/recompute.py, the command and metrics_store.store_metrics as they were at
# --- commit 74508a7, over the pure-Python metrics of that commit (tests/metrics_reference.py)

def _reference_store(run: Run, window, *, spec_source=None, distributions=None, source_tool=TOOL_DRAFTBOARD,
                     definitions=None, extra=None) -> RunMetrics:
    row, _ = RunMetrics.objects.update_or_create(run=run, defaults={
        **window.to_dict(), "spec_source": (spec_source or "")[:300], "distributions": distributions or {},
        "source_tool": source_tool, "definitions": definitions or {}, "extra": json_safe(extra or {})})
    return row


def _reference_recompute_run(run: Run) -> RunMetrics | None:
    if run.state != RunState.SUCCEEDED or not hasattr(run, "request_logs"):
        return None
    blob = run.request_logs
    logs = reference.decode_logs(bytes(blob.data))
    slo = (run.spec.get("workload") or {}).get("slo") or None
    window = reference.compute_run_metrics(logs, blob.window_start_ns, blob.window_end_ns, slo)
    kept = {}
    old = getattr(run, "metrics", None)
    if old is not None:
        window = window.with_spec_decode(window_of(old).to_dict())
        kept = dict(spec_source=old.spec_source, source_tool=old.source_tool, definitions=old.definitions,
                    extra=old.extra)
    with transaction.atomic():
        return _reference_store(run, window, distributions=reference.distributions(logs), **kept)


def reference_recompute(sweep: Sweep) -> int:
    qs = Run.objects.filter(state=RunState.SUCCEEDED).select_related("request_logs", "metrics")
    qs = qs.filter(sweep_id=sweep.pk)
    done = 0
    for run in qs.iterator(chunk_size=100):
        if _reference_recompute_run(run) is not None:
            done += 1
    return done


def snapshot(sweep: Sweep) -> dict:
    """{run id: (window figures, samples)} as stored now."""
    return {m.run_id: (window_of(m).to_dict(), m.distributions)
            for m in RunMetrics.objects.filter(run__sweep=sweep).order_by("run_id")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--jobs", type=int, default=2, help="worker processes for the parallel leg")
    ap.add_argument("--rounds", type=int, default=2, help="timed passes of each path (the best is kept)")
    args = ap.parse_args()
    call_command("migrate", verbosity=0)
    sweep = seed(args.runs)
    n = sweep.runs.count()
    legs = [("today (reference copy)", lambda: reference_recompute(sweep))]
    for jobs in sorted({1, args.jobs}):
        def command(jobs=jobs):
            call_command("recompute_metrics", "--sweep", str(sweep.pk), "--jobs", str(jobs), stdout=io.StringIO(),
                         stderr=io.StringIO())
        legs.append((f"recompute_metrics --jobs {jobs}", command))
    best: dict[str, float] = {}
    stored: dict[str, bool] = {}
    expected = None
    for _ in range(args.rounds):  # legs interleaved, so a busy spell on the machine hits all of them
        for name, fn in legs:
            t0 = time.perf_counter()
            fn()
            ms = (time.perf_counter() - t0) * 1000 / n
            best[name] = min(best.get(name, ms), ms)
            now = snapshot(sweep)
            expected = expected or now
            stored[name] = stored.get(name, True) and now == expected
    base = best[legs[0][0]]
    rows = [[name, best[name], base / best[name], "yes" if stored[name] else "NO"] for name, _ in legs]
    print(f"{n} runs x {N_MEASURED + CONCURRENCY} requests x {N_TOKENS} tokens, database "
          f"{django.db.connection.vendor}, {os.cpu_count()} CPUs")
    print_table(["path", "ms per run", "x faster than today", "same figures as today"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
