"""Streaming load client for OpenAI-compatible servers (vLLM, SGLang), on aiohttp.

Each request is `POST /v1/completions` (or `/v1/chat/completions` with `api="chat"`) with
`stream: true`, `stream_options: {"include_usage": true, "continuous_usage_stats": true}`,
`max_tokens = output_len`, `ignore_eos` (a vLLM/SGLang extra parameter), `temperature` and
`seed`. The response is Server-Sent Events (`data: {json}` lines, ending with `data: [DONE]`).
For every message the client records its arrival time (`time.perf_counter_ns`) and the output
tokens it carried:

- from the server's cumulative `usage.completion_tokens` (delta to the previous message) when
  the message has usage (vLLM sends it on every chunk with `continuous_usage_stats`);
- else from the choice's `token_ids` list when present (vLLM `return_token_ids`);
- else from the text: one token per message with non-empty text (exact for servers that stream
  one token per message, an undercount with speculative decoding), and the request is flagged
  `tokens_from_text`.

A message with empty `choices` and a `usage` object is the final usage-only message (kind
`usage`, 0 tokens); its `prompt_tokens` / `completion_tokens` are the server's counts. Chat
deltas carrying `reasoning` (vLLM >= 0.10) or `reasoning_content` (older vLLM, SGLang) are kind
`reasoning` and their tokens count as output tokens.

Load shape (docs/MEASUREMENT.md): first `workload.n_warmup` warmup requests (closed loop at the
concurrency cap, logged with warmup=True), then the measured requests: closed loop (at most
`concurrency` in flight) when `workload.request_rate` is None, otherwise open loop where request
i is due at t0 + sum of the first i inter-arrival gaps, the gaps drawn (seeded) from a gamma
distribution with shape = burstiness and mean 1/request_rate (shape 1 = Poisson, as in `vllm
bench serve`), still capped at `concurrency`. Sends are scheduled on that absolute clock, so a
late send does not shift later ones. The window runs from the first measured send to the last
measured completion. Failures (non-2xx, transport error, timeout, in-stream error) are
recorded per request and never raised.

Transport: aiohttp, reading the body as it arrives and splitting Server-Sent Events on blank
lines (as `vllm bench serve` does); every event in one read gets that read's arrival time.
aiohttp rather than httpx because its streaming path costs less CPU per message: on one core
against a synthetic server (benchmarks/client_capacity.py) the httpx version sustained about
0.43x the tokens/s of `vllm bench serve`'s client.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import numpy as np

from benchkit.measure.logs import MessageEvent, RequestLog
from benchkit.measure.workloads import Prompt, build_prompts
from benchkit.specs import WorkloadSpec

APIS = ("completions", "chat")

ProgressFn = Callable[[int, int], None]


@dataclass
class LoadResult:
    """What `run_load` returns.

    `logs`: one RequestLog per request, warmup first, in prompt order. `window_start_ns` /
    `window_end_ns`: first measured send and last measured completion (perf_counter_ns).
    `achieved_rate_req_s`: measured sends per second, (N - 1) / (last send - first send) for
    N >= 2 sends, else None. `prompts_flagged_approx`: some prompt's input_len is a local
    approximation (the server had no tokenizer endpoint).
    """

    logs: list[RequestLog]
    window_start_ns: int
    window_end_ns: int
    achieved_rate_req_s: float | None
    prompts_flagged_approx: bool


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


def build_body(prompt: Prompt, model: str, workload: WorkloadSpec, api: str) -> dict:
    """The JSON body of one streaming request for `api` ("completions" or "chat")."""
    body: dict = {
        "model": model,
        "max_tokens": prompt.output_len,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "ignore_eos": workload.ignore_eos,
        "temperature": workload.temperature,
        "seed": workload.seed,
    }
    if api == "chat":
        body["messages"] = [{"role": "user", "content": prompt.text}]
    else:
        body["prompt"] = prompt.text
    return body


class _Stream:
    """Turns parsed SSE messages of one request into MessageEvents."""

    def __init__(self, log: RequestLog):
        self.log = log
        self.cum = 0  # last cumulative completion_tokens seen

    def feed(self, msg: dict, t_ns: int) -> str | None:
        """Record one message; returns an error string for an in-stream error message."""
        if "error" in msg or msg.get("object") == "error":
            err = msg.get("error", msg)
            text = err.get("message", err) if isinstance(err, dict) else err
            return f"stream error: {str(text)[:300]}"
        choices = msg.get("choices") or []
        usage = msg.get("usage") if isinstance(msg.get("usage"), dict) else None
        if not choices:
            if usage is not None:
                self._final_usage(usage)
                self.log.events.append(MessageEvent(t_ns=t_ns, tokens=0, kind="usage"))
            return None
        choice = choices[0]
        delta = choice.get("delta")
        if isinstance(delta, dict):  # chat
            reasoning = delta.get("reasoning") or delta.get("reasoning_content") or ""
            content = delta.get("content") or ""
        else:
            reasoning, content = "", choice.get("text") or ""
        kind = "reasoning" if reasoning and not content else "content"
        if usage is not None and isinstance(usage.get("completion_tokens"), int):
            tokens = usage["completion_tokens"] - self.cum
            self.cum = usage["completion_tokens"]
            self._final_usage(usage)
        elif isinstance(choice.get("token_ids"), list):
            tokens = len(choice["token_ids"])
            self.cum += tokens
        else:
            tokens = 1 if (reasoning or content) else 0
            self.cum += tokens
            self.log.tokens_from_text = True
        self.log.events.append(MessageEvent(t_ns=t_ns, tokens=tokens, kind=kind))
        return None

    def _final_usage(self, usage: dict) -> None:
        if isinstance(usage.get("prompt_tokens"), int):
            self.log.prompt_tokens = usage["prompt_tokens"]
        if isinstance(usage.get("completion_tokens"), int):
            self.log.completion_tokens = usage["completion_tokens"]


async def _one_request(
    session: aiohttp.ClientSession, url: str, body: dict, log: RequestLog, timeout_s: float
) -> None:
    """Send one request and fill `log`; never raises (except cancellation)."""
    stream = _Stream(log)
    log.send_ns = time.perf_counter_ns()
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(url, json=body) as resp:
                if resp.status // 100 != 2:
                    text = (await resp.read()).decode("utf-8", "replace")
                    log.ok, log.error = False, f"http {resp.status}: {text[:300]}"
                    return
                buf = b""
                async for chunk in resp.content.iter_any():
                    t_ns = time.perf_counter_ns()
                    buf += chunk
                    while (end := buf.find(b"\n\n")) >= 0:
                        event, buf = buf[:end], buf[end + 2:]
                        err = _feed_event(stream, event, t_ns)
                        if err == "[DONE]":
                            return
                        if err:
                            log.ok, log.error = False, err
                            return
                if buf.strip():
                    err = _feed_event(stream, buf, time.perf_counter_ns())
                    if err and err != "[DONE]":
                        log.ok, log.error = False, err
    except TimeoutError:
        log.ok, log.error = False, f"timeout after {timeout_s} s"
    except aiohttp.ClientError as exc:
        log.ok, log.error = False, f"transport: {type(exc).__name__}: {exc}"[:400]
    finally:
        log.end_ns = time.perf_counter_ns()


def _feed_event(stream: _Stream, event: bytes, t_ns: int) -> str | None:
    """Feed one SSE event (its `data:` lines); returns "[DONE]", an error string, or None."""
    for line in event.split(b"\n"):
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            return "[DONE]"
        try:
            msg = json.loads(data)
        except json.JSONDecodeError:
            return f"bad stream message: {data[:200]!r}"
        err = stream.feed(msg, t_ns) if isinstance(msg, dict) else "stream message is not an object"
        if err:
            return err
    return None


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
    `api`: "completions" or "chat".
    Raises ValueError for an unknown api, too few prompts or num_prompts < 1; request failures
    are never raised, they are in the logs.
    """
    if api not in APIS:
        raise ValueError(f"api must be one of {APIS}, got {api!r}")
    n_warm, n_meas = workload.n_warmup, workload.num_prompts
    if n_meas < 1:
        raise ValueError(f"workload.num_prompts must be >= 1, got {n_meas}")
    if prompts is None:
        prompts = await asyncio.to_thread(build_prompts, workload, base_url=base_url, model=model)
    if len(prompts) < n_warm + n_meas:
        raise ValueError(
            f"{len(prompts)} prompts given, the run needs {n_warm + n_meas} "
            f"({n_warm} warmup + {n_meas} measured; warmup prompts are not reused)"
        )
    path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
    cap = max(workload.concurrency, 1)
    total = n_warm + n_meas
    logs = [
        RequestLog(index=i, warmup=i < n_warm, send_ns=0, input_len=p.input_len, output_len=p.output_len)
        for i, p in enumerate(prompts[:total])
    ]
    done = 0
    sem = asyncio.Semaphore(cap)
    url = base_url.rstrip("/") + path

    async def send(i: int, due_ns: int | None) -> None:
        if due_ns is not None:
            delay = (due_ns - time.perf_counter_ns()) / 1e9
            if delay > 0:
                await asyncio.sleep(delay)
        async with sem:
            await _one_request(
                session, url, build_body(prompts[i], model, workload, api), logs[i], request_timeout_s
            )

    async def phase(indices: list[int], due: list[int | None], report: bool) -> None:
        nonlocal done
        tasks = [asyncio.create_task(send(i, d)) for i, d in zip(indices, due, strict=True)]
        try:
            for fut in asyncio.as_completed(tasks):
                await fut
                if report:
                    done += 1
                    if progress is not None:
                        await asyncio.to_thread(progress, done, n_meas)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    connector = aiohttp.TCPConnector(limit=cap, force_close=False)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=min(30.0, request_timeout_s))
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await phase(list(range(n_warm)), [None] * n_warm, report=False)
        if on_window_start is not None:
            await asyncio.to_thread(on_window_start)
        measured = list(range(n_warm, total))
        if workload.request_rate is None:
            due: list[int | None] = [None] * n_meas
        else:
            offsets = arrival_offsets_s(n_meas, workload.request_rate, workload.burstiness, workload.seed)
            t0 = time.perf_counter_ns()
            due = [t0 + round(o * 1e9) for o in offsets]
        await phase(measured, due, report=True)

    meas_logs = logs[n_warm:]
    sends = sorted(log.send_ns for log in meas_logs)
    span_s = (sends[-1] - sends[0]) / 1e9
    return LoadResult(
        logs=logs,
        window_start_ns=sends[0],
        window_end_ns=max(log.end_ns for log in meas_logs),
        achieved_rate_req_s=(len(sends) - 1) / span_s if len(sends) >= 2 and span_s > 0 else None,
        prompts_flagged_approx=any(p.approx for p in prompts[:total]),
    )


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
) -> LoadResult:
    """Blocking wrapper of `run_load` (runs it in a fresh event loop with `asyncio.run`; do not
    call it from inside a running loop). Same arguments, result and errors."""
    return asyncio.run(
        run_load(
            base_url,
            model,
            workload,
            prompts=prompts,
            request_timeout_s=request_timeout_s,
            progress=progress,
            api=api,
            on_window_start=on_window_start,
        )
    )
