"""Build stored runs for Django-side tests through the real services (transitions,
store_outcome), with metrics computed by benchkit.measure.metrics from hand-built request logs."""

from __future__ import annotations

from benchkit.execution.outcome import RunOutcome
from benchkit.measure import metrics
from benchkit.measure.logs import MessageEvent, RequestLog
from benchkit.specs import GpuRef, RunSpec, ServerConfig, WorkloadSpec
from runs.models import Host, Run, RunState, Sweep
from runs.services.outcomes import store_outcome
from runs.services.sweeps import run_fields
from runs.services.transitions import transition

MS = 1_000_000  # ns per ms


def make_logs(n_requests: int, tokens_per_msg: int, gap_ms: float, n_tokens: int, ttft_ms: float = 20.0,
              input_len: int = 32) -> tuple[list[RequestLog], int, int]:
    """`n_requests` sequential requests, each streaming `n_tokens` in messages of
    `tokens_per_msg` every `gap_ms`. Returns (logs, window_start_ns, window_end_ns)."""
    logs, t = [], 1_000 * MS
    start = t
    for i in range(n_requests):
        send = t
        events, got, at = [], 0, send + int(ttft_ms * MS)
        while got < n_tokens:
            k = min(tokens_per_msg, n_tokens - got)
            events.append(MessageEvent(t_ns=at, tokens=k, kind="content"))
            got += k
            at += int(gap_ms * MS)
        end = events[-1].t_ns
        logs.append(RequestLog(index=i, warmup=False, send_ns=send, events=events, ok=True, prompt_tokens=input_len,
                               completion_tokens=n_tokens, input_len=input_len, output_len=n_tokens, end_ns=end))
        t = end + MS
    return logs, start, logs[-1].end_ns


def make_host(name: str = "testhost") -> Host:
    return Host.objects.get_or_create(name=name)[0]


def make_sweep(host: Host | None = None, name: str = "test sweep", is_demo: bool = False) -> Sweep:
    return Sweep.objects.create(name=name, host=host or make_host(), source="test", is_demo=is_demo)


def make_run(sweep: Sweep, method: str = "auto", k: int | None = None, tp: int = 1, concurrency: int = 1,
             budget: int | None = None, repeat: int = 0, gpus: list[GpuRef] | None = None) -> Run:
    spec = RunSpec(server=ServerConfig(engine="vllm", model="/models/m", method=method, num_speculative_tokens=k,
                                       tree_budget=budget, tp=tp),
                   workload=WorkloadSpec(concurrency=concurrency, output_len=64, input_len=32, num_prompts=4),
                   gpus=gpus or [], repeat_index=repeat)
    key = f"{method}|{k}|{budget}|tp{tp}|c{concurrency}|r{repeat}"
    return Run.objects.create(sweep=sweep, host=sweep.host, point_key=key, spec=spec.to_dict(), **run_fields(spec))


def finish_run(run: Run, tokens_per_msg: int = 1, gap_ms: float = 10.0, ok: bool = True,
               spec_decode: dict | None = None, reason: str = "") -> Run:
    """Drive `run` through every state and store an outcome built from synthetic logs;
    `spec_decode` gives the window's acceptance figures (WindowMetrics field names)."""
    for state in (RunState.PREFLIGHT, RunState.STARTING, RunState.WARMING, RunState.MEASURING, RunState.STOPPING):
        transition(run, state)
    logs, t0, t1 = make_logs(4, tokens_per_msg, gap_ms, n_tokens=64)
    window = metrics.compute_run_metrics(logs, t0, t1, None)
    if spec_decode:
        window = window.with_spec_decode(spec_decode)
    argv = ["python", "-m", "vllm.entrypoints.openai.api_server"]
    outcome = RunOutcome(ok=ok, reason=reason, message=reason, argv=argv,
                         logs=logs, window_start_ns=t0, window_end_ns=t1, metrics=window if ok else None,
                         spec_source="vllm" if spec_decode else "", distributions=metrics.distributions(logs))
    return store_outcome(run, outcome)
