"""The users' grid (DOMAIN.md), stored through the real services with the users' headline figures.

`make_users_grid()` loads `sweeps/users-grid-sglang.yaml`, creates its 36 runs with
`runs.services.sweeps.create_sweep` on a host whose inventory is the users' 8-GPU PCIe machine
(tests/test_allocation.pcie8_inventory: TP1 on GPU0, TP4 on GPUs 0-3, TP8 across both
sockets), drives every run through its states (`transitions.transition`) and stores an
outcome with `runs.services.outcomes.store_outcome`, exactly as a worker does. Each outcome
carries request logs built so that the window's metrics (benchkit.measure.metrics, computed
from the logs) reproduce the figures below, the SGLang command line the engine adapter builds,
and spec-decode counter figures.

Figures (`OUTPUT_TOK_S`, `TAU`): the users' own, from DOMAIN.md, where they exist -
TP1 at concurrency 1: DDTree b15 = 6.5x autoregressive and 1.63x linear DFlash;
TP4 b15 = 1270.8 tok/s aggregate at 8 concurrent requests; at concurrency 1 every
configuration is faster at TP4 than at TP8. The other cells are invented to be plausible
(acceptance length grows with the budget, each step costs more, so speed peaks at b15), and
are labelled so here; tests assert only the users' figures.
"""

from __future__ import annotations

from pathlib import Path

from benchkit.compare.verdicts import MIN_COMPLETED_REQUESTS
from benchkit.engines.adapters import adapter_for
from benchkit.execution.outcome import RunOutcome
from benchkit.measure import metrics
from benchkit.measure.logs import MessageEvent, RequestLog
from benchkit.specs import RunSpec
from benchkit.sweeps.sweepfile import load_sweep_file
from runs.models import Run, RunState, Sweep
from runs.services.hosts import record_inventory
from runs.services.outcomes import store_outcome
from runs.services.sweeps import create_sweep
from runs.services.transitions import transition
from tests.factories import make_host
from tests.test_allocation import pcie8_inventory

SWEEP_FILE = Path(__file__).resolve().parents[1] / "sweeps" / "users-grid-sglang.yaml"
MS = 1_000_000

#: Autoregressive output tok/s per (TP, concurrency): per request at 1, aggregate at 8.
#: Invented; TP8 below TP4 at concurrency 1 is the users' finding (all-reduce across sockets).
AR_TOK_S = {(1, 1): 28.0, (4, 1): 61.0, (8, 1): 52.0, (1, 8): 190.0, (4, 8): 440.0, (8, 8): 420.0}
#: Speedup over autoregressive per (TP, concurrency, label). TP1 c1 b15 = 6.5 and linear =
#: 6.5 / 1.63 are the users' (DOMAIN.md); TP4 c8 b15 = 1270.8 / 440 gives their 1270.8 tok/s.
SPEEDUP = {
    (1, 1): {"linear": 6.5 / 1.63, "b15": 6.5, "b16": 6.31, "b32": 5.62, "b64": 4.48},
    (4, 1): {"linear": 3.10, "b15": 4.62, "b16": 4.55, "b32": 4.05, "b64": 3.20},
    (8, 1): {"linear": 2.95, "b15": 4.41, "b16": 4.36, "b32": 3.88, "b64": 3.02},
    (1, 8): {"linear": 2.30, "b15": 3.12, "b16": 3.05, "b32": 2.55, "b64": 1.90},
    (4, 8): {"linear": 2.15, "b15": 1270.8 / 440.0, "b16": 2.85, "b32": 2.40, "b64": 1.75},
    (8, 8): {"linear": 2.05, "b15": 2.70, "b16": 2.66, "b32": 2.28, "b64": 1.68},
}
#: Mean acceptance length tau (server counters) per label: grows with the budget (invented).
TAU = {"auto": None, "linear": 4.3, "b15": 7.4, "b16": 7.5, "b32": 8.3, "b64": 9.0}
#: Draft tokens per step per label, for the counters' acceptance rate.
DRAFT_TOKENS = {"linear": 15, "b15": 15, "b16": 16, "b32": 32, "b64": 64}


def output_tok_s(tp: int, concurrency: int, label: str) -> float:
    """The output tok/s the grid stores for one point (see the module docstring)."""
    return AR_TOK_S[(tp, concurrency)] * (1.0 if label == "auto" else SPEEDUP[(tp, concurrency)][label])


def _chunks(n_tokens: int, tau: float) -> list[int]:
    """Message sizes summing to n_tokens: the prefill's one token, then messages of about tau
    tokens each (one per target step; 1 for autoregressive)."""
    sizes, acc, got = [1], 1.0, 1
    while got < n_tokens:
        acc += tau
        k = max(1, min(int(round(acc)) - got, n_tokens - got))
        sizes.append(k)
        got += k
    return sizes


def point_logs(concurrency: int, n_tokens: int, tok_s: float, tau: float | None, input_len: int,
               ttft_ms: float = 80.0) -> tuple[list[RequestLog], int, int]:
    """`concurrency` streams, each sending requests back to back (two in all at concurrency 1,
    one each above), each streaming `n_tokens` in messages of about `tau` tokens at a constant
    gap chosen so that the window's output tok/s is `tok_s`. Returns (logs, start ns, end ns)."""
    per_stream = -(-MIN_COMPLETED_REQUESTS // concurrency)  # enough requests to feed a verdict
    sizes = _chunks(n_tokens, tau or 1.0)
    window_ns = concurrency * per_stream * n_tokens / tok_s * 1e9
    gap_ns = (window_ns / per_stream - ttft_ms * MS) / (len(sizes) - 1)
    logs, start = [], 1_000_000 * MS
    for _stream in range(concurrency):
        send = start
        for _ in range(per_stream):
            t, events = send + ttft_ms * MS, []
            for k in sizes:
                events.append(MessageEvent(t_ns=int(round(t)), tokens=k, kind="content"))
                t += gap_ns
            end = events[-1].t_ns
            logs.append(RequestLog(index=len(logs), warmup=False, send_ns=int(send), events=events, ok=True,
                                   prompt_tokens=input_len, completion_tokens=n_tokens, input_len=input_len,
                                   output_len=n_tokens, end_ns=end))
            send = end
    return logs, start, max(log.end_ns for log in logs)


def _finish(run: Run, spec: RunSpec) -> Run:
    for state in (RunState.PREFLIGHT, RunState.STARTING, RunState.WARMING, RunState.MEASURING, RunState.STOPPING):
        run = transition(run, state)
    label = run.method_label
    w = spec.workload
    logs, t0, t1 = point_logs(w.concurrency, w.output_len, output_tok_s(spec.server.tp, w.concurrency, label),
                              TAU[label], w.input_len)
    window = metrics.compute_run_metrics(logs, t0, t1, w.slo or None)
    if TAU[label]:
        drafts = window.total_output_tokens / TAU[label]
        window = window.with_spec_decode({
            "acceptance_length": TAU[label], "acceptance_rate": (TAU[label] - 1) / DRAFT_TOKENS[label],
            "spec_num_drafts": drafts, "spec_num_draft_tokens": drafts * DRAFT_TOKENS[label],
            "spec_num_accepted_tokens": drafts * (TAU[label] - 1)})
    adapter = adapter_for(spec.server.engine)
    port = spec.port or adapter.default_port  # what the runner would have chosen, free
    outcome = RunOutcome(
        ok=True, port=port, argv=adapter.build_argv(spec.server, port, python="python3"),
        env=adapter.env(spec.gpus, {}, server=spec.server), engine_version="0.5.9.dev0+ddtree",
        engine_commit="4f1c2ab", server_log_tail="[sglang] server ready\n", logs=logs, window_start_ns=t0,
        window_end_ns=t1, metrics=window, spec_source="sglang" if TAU[label] else "",
        distributions=metrics.distributions(logs))
    return store_outcome(run, outcome)


def make_users_grid(host_name: str = "ws-pcie8", repeats: int = 1) -> Sweep:
    """The users' grid, every run succeeded with the figures above (36 runs x `repeats`; the
    repeats of a point measure the same figures)."""
    host = make_host(host_name)
    if not host.snapshots.exists():
        record_inventory(host, pcie8_inventory())
    spec = load_sweep_file(SWEEP_FILE)
    spec.repeats = repeats
    sweep = create_sweep(spec, host, source="sweeps/users-grid-sglang.yaml", enqueue=False)
    for run in Run.objects.filter(sweep=sweep).order_by("id"):
        _finish(run, RunSpec.from_dict(run.spec))
    return sweep
