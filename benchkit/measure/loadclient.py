"""One load-client process: the request it sends, how it reads the answer's event stream, what it
records, and how busy the process itself was (used by `benchkit.measure.loadgen` in its own
process and by each `benchkit.measure.loadworkers` worker).

Each request is `POST /v1/completions` (or `/v1/chat/completions` with `api="chat"`) with
`stream: true`, `stream_options: {"include_usage": true}` (plus `continuous_usage_stats` and
`return_token_ids` as `ClientOptions` say), `max_tokens = output_len`, `ignore_eos` (a
vLLM/SGLang extra parameter), `temperature` and `seed`. The response is an event stream
(`benchkit.measure.sse`: WHATWG framing, CRLF/LF/CR, comments, multi-line data, BOM; bytes
decoded once an event is complete) read by `benchkit.measure.httpstream`, which stamps each read
with the kernel's receive time of its bytes (mapped onto `time.perf_counter_ns`); every event
completed by a read carries that read's stamp. For every message the
client records the output tokens it carried:

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

A request is complete only when the stream says so: a choice with a `finish_reason`, the final
usage-only message, or `data: [DONE]`. Per-request failures are recorded in `RequestLog.error`
(never raised), starting with a stable prefix (`request_failure_code` in
`benchkit.measure.validity` maps them to codes):

- `http 500: ...` non-2xx answer; `timeout after X s`; `transport: ...` (connection error);
- `stream error: ...` an in-band error object (`data: {"error": ...}` or an `event: error`);
- `error body: ...` a 2xx answer whose body is a JSON error object instead of an event stream
  (the server's message is kept);
- `bad_stream: ...` invalid UTF-8 in an event, event data that is not a JSON object, or a body
  that is no event stream at all;
- `truncated_stream: ...` the stream closed without a finish reason, usage message or [DONE].

Client headroom (MEASUREMENT.md, "The client can be the bottleneck"): over the measured window
each client process records its CPU time and its event-loop lag (how late a timer that should
fire every `LAG_INTERVAL_S` actually ran) with `HeadroomSampler`; `ClientHeadroom` summarises
them (`LoadResult.client`) and `benchkit.measure.validity` marks a saturated client's run
suspect (`client_saturated`).

Transport: `benchkit.measure.httpstream` (HTTP/1.1 over non-blocking sockets read with
`recvmsg`, kernel receive stamps; replaced aiohttp, whose reads could only be stamped when Python
got to them: the last message of a burst across many streams was late by the whole burst's
processing time, issue 22). Fast path (issue 22): once the SSE parser is between events, a read
that holds whole `data: ` events (not [DONE]) skips the parser, and each event's JSON is decoded
into typed msgspec structs holding only the fields read here (`_FastChunk`); any other shape
(no choices, an error, engine extras such as `metrics` or `sglext`, a field of another type,
invalid UTF-8 anywhere) is handed to the general path unchanged, so both record the same
(tests/test_loadclient_fastpath.py). Event loop: uvloop where it is installed (it is in vLLM's
and the GPU image's environments; measured about 10 % less client CPU per token than asyncio's
own loop on the 2-core dev machine), else asyncio's; `ClientHeadroom.event_loop` records which.
Per message the client decodes the JSON (msgspec, typed on the fast path), appends three
integers to flat arrays and, where asked, the token ids; with kernel stamps the time Python
takes per message no longer moves the stamps, only how many streams one process can keep up
with (a stream whose next message arrives before the previous one was read gets one stamp for
both: the kernel merges queued packets and keeps the newest stamp).
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import json
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import msgspec
import numpy as np

from benchkit.measure.httpstream import ConnectionPool, HttpError, Sink
from benchkit.measure.logs import KINDS, RequestLog
from benchkit.measure.outputs import FULL_REQUESTS, OutputRecord, digest_output
from benchkit.measure.specrequests import parse_spec_details
from benchkit.measure.sse import SSEError, SSEParser
from benchkit.measure.workloads import Prompt
from benchkit.specs import WorkloadSpec

APIS = ("completions", "chat")

ProgressFn = Callable[[int, int], None]

#: Event-loop lag probe: a timer due every this many seconds; its lateness is one lag sample.
LAG_INTERVAL_S = 0.005
#: Bytes of a response body kept for the failure message when no event arrived.
_HEAD_BYTES = 4096

_json_decode = msgspec.json.decode
_json_encode = msgspec.json.encode
#: Bytes of a non-event-stream body (an error answer) kept for the failure message.
_KEEP_BODY_BYTES = 64 * 1024
_DONE = "[DONE]"
_REASONING, _CONTENT, _USAGE = (KINDS.index(k) for k in ("reasoning", "content", "usage"))


# -- the common message, decoded into typed structs (RequestStream's fast path) -------------------
# A token message of vLLM's or SGLang's OpenAI-compatible stream, only the fields the client
# reads; the rest are skipped by the decoder without building objects. Any other shape (a field
# of another type, a usage-only message, an error, engine extras such as `metrics`) fails
# `_FastChunk` decoding or its checks and goes through the dict path (`RequestStream._message`),
# which holds the rules; both paths record the same thing for the messages the fast one takes
# (tests/test_loadclient_fastpath.py).
class _FastDelta(msgspec.Struct, gc=False):
    content: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None
    token_ids: list[int] | None = None


class _FastChoice(msgspec.Struct, gc=False):
    text: str | None = None
    delta: _FastDelta | None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = None


class _FastUsage(msgspec.Struct, gc=False):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


_UNSET = msgspec.UNSET


class _FastChunk(msgspec.Struct, gc=False):
    choices: list[_FastChoice] | None = None
    usage: _FastUsage | None = None
    metrics: msgspec.Raw | msgspec.UnsetType = _UNSET
    sglext: msgspec.Raw | msgspec.UnsetType = _UNSET
    meta_info: msgspec.Raw | msgspec.UnsetType = _UNSET


_fast_decode = msgspec.json.Decoder(_FastChunk).decode


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@dataclass
class ProcessHeadroom:
    """One client process over its measured window.

    `cpu_s`: CPU time (user + system, all threads, `time.process_time`) spent in the window (s).
    `wall_s`: the window as this process saw it, from its first measured send to the end of its
    last measured request (s). `core_share`: cpu_s / wall_s (1.0 = one core fully busy).
    `loop_lag_*_ms`: event-loop lag (ms): how late a timer due every LAG_INTERVAL_S ran, over
    `lag_samples` samples; None without samples. The floor on an idle loop is about 0.1-0.3 ms
    (the selector's timeout granularity). `gc_pauses` / `gc_pause_max_ms`: garbage-collector
    passes in the window and the longest (ms); every one stalls the loop.
    `stall_max_ms`: the longest time the event loop ran nothing (the largest lag sample, ms; a
    SIGSTOP, a swapped-out or descheduled process, a long GC pass); `stalled_share`: the share
    of the window spent in stalls of at least STALL_MIN_MS (0..1); `stalls`: how many.
    `kernel_reads` / `fallback_reads`: reads stamped by the kernel / when Python read them
    (`benchkit.measure.httpstream`); `read_delay_p99_ms` / `read_delay_max_ms`: how long the
    bytes of a kernel-stamped read waited before Python read them (ms; None without such reads);
    `clock_steps`: wall-clock steps seen while mapping kernel stamps.
    """

    cpu_s: float
    wall_s: float
    core_share: float
    loop_lag_p50_ms: float | None
    loop_lag_p99_ms: float | None
    loop_lag_max_ms: float | None
    lag_samples: int
    gc_pauses: int = 0
    gc_pause_max_ms: float | None = None
    stall_max_ms: float | None = None
    stalled_share: float | None = None
    stalls: int = 0
    kernel_reads: int = 0
    fallback_reads: int = 0
    read_delay_p99_ms: float | None = None
    read_delay_max_ms: float | None = None
    clock_steps: int = 0


def _worst(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


@dataclass
class ClientHeadroom:
    """The load client's own load over the measured window (all its processes).

    `processes`: client processes. `cpu_s`: CPU seconds summed over them. `max_core_share`:
    the busiest process's CPU share of one core (0..1; a single-threaded event loop cannot use
    more than one core). `loop_lag_p99_ms` / `loop_lag_max_ms`: the worst process's p99 and
    maximum event-loop lag (ms), None without samples. `per_process`: each process's figures.
    `event_loop`: "uvloop" or "asyncio" (what `new_event_loop` gives here).
    `stall_max_ms`, `stalled_share`: the worst process's longest stall (ms) and stalled share of
    its window (0..1); `read_delay_p99_ms`: the worst process's p99 wait of bytes in the socket
    (ms); `kernel_stamped_share`: share of reads stamped by the kernel (0..1, None without
    reads); `stamps`: "kernel", "read" or "mixed" (ProcessHeadroom has the counts).
    """

    processes: int
    cpu_s: float
    max_core_share: float
    loop_lag_p99_ms: float | None
    loop_lag_max_ms: float | None
    per_process: list[ProcessHeadroom] = field(default_factory=list)
    event_loop: str = ""
    stall_max_ms: float | None = None
    stalled_share: float | None = None
    read_delay_p99_ms: float | None = None
    kernel_stamped_share: float | None = None
    stamps: str = ""

    @classmethod
    def merge(cls, parts: list[ProcessHeadroom]) -> ClientHeadroom:
        """Combine per-process figures (sum of CPU, worst share, worst lag, worst stall)."""
        kernel = sum(p.kernel_reads for p in parts)
        reads = kernel + sum(p.fallback_reads for p in parts)
        return cls(
            processes=len(parts),
            cpu_s=sum(p.cpu_s for p in parts),
            max_core_share=max((p.core_share for p in parts), default=0.0),
            loop_lag_p99_ms=_worst([p.loop_lag_p99_ms for p in parts]),
            loop_lag_max_ms=_worst([p.loop_lag_max_ms for p in parts]),
            per_process=list(parts),
            event_loop=event_loop_name(),
            stall_max_ms=_worst([p.stall_max_ms for p in parts]),
            stalled_share=_worst([p.stalled_share for p in parts]),
            read_delay_p99_ms=_worst([p.read_delay_p99_ms for p in parts]),
            kernel_stamped_share=kernel / reads if reads else None,
            stamps=("kernel" if kernel == reads else "read" if not kernel else "mixed") if reads else "",
        )


def event_loop_name() -> str:
    """"uvloop" when uvloop is importable here (then `new_event_loop` uses it), else "asyncio"."""
    return "uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio"


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A fresh event loop for the load client: uvloop's when installed, else asyncio's."""
    if event_loop_name() == "uvloop":
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


@dataclass(frozen=True)
class ClientOptions:
    """What the client asks of the server and how it times the answer; per engine build, recorded
    with the run (`asdict`). The engine registry says what each engine supports; the client never
    reads engine names.

    `continuous_usage`: ask for the cumulative `usage` on every message
    (`stream_options.continuous_usage_stats`; more server work per message); without it the
    client counts each message's tokens from its `token_ids` where the server returns them, else
    one per non-empty message (flagged `tokens_from_text`), and the final usage message still
    gives n. `return_token_ids`: ask for the output's token ids (`return_token_ids: true`, vLLM):
    exact tokens per message and the ids kept for the lossless check. `spec_tokens_details`: ask
    for per-request speculative-decoding details in the body (SGLang `return_spec_tokens_details`;
    vLLM sends `metrics.speculative_decoding` when its server was started with
    `--per-request-spec-decode-metrics`, nothing to ask here). `kernel_stamps`: stamp each read
    with the kernel's receive time (`benchkit.measure.httpstream`); False stamps it when Python
    read it (the old way; for comparisons). `keep_outputs`: keep each measured request's output
    digest (`benchkit.measure.outputs`), the first `full_outputs` prompts in full.
    """

    continuous_usage: bool = False
    return_token_ids: bool = False
    spec_tokens_details: bool = False
    kernel_stamps: bool = True
    keep_outputs: bool = True
    full_outputs: int = FULL_REQUESTS


def build_body(prompt: Prompt, model: str, workload: WorkloadSpec, api: str, extra_body: dict | None = None,
               options: ClientOptions | None = None) -> dict:
    """The JSON body of one streaming request for `api` ("completions" or "chat"); `options` as
    ClientOptions (default: ClientOptions()); `extra_body` keys are added last (they win), as
    `vllm bench serve --extra-body` does."""
    opts = options or ClientOptions()
    stream_options: dict = {"include_usage": True}
    if opts.continuous_usage:
        stream_options["continuous_usage_stats"] = True
    body: dict = {
        "model": model,
        "max_tokens": prompt.output_len,
        "stream": True,
        "stream_options": stream_options,
        "ignore_eos": workload.ignore_eos,
        "temperature": workload.temperature,
        "seed": workload.seed if prompt.seed is None else prompt.seed,
    }
    if opts.return_token_ids:
        body["return_token_ids"] = True
    if opts.spec_tokens_details:
        body["return_spec_tokens_details"] = True
    if api == "chat":
        body["messages"] = [{"role": "user", "content": prompt.text}]
    else:
        body["prompt"] = prompt.text
    if extra_body:
        body.update(extra_body)
    return body


def _error_text(doc: object) -> str:
    """The message of an OpenAI/vLLM/SGLang error object (`{"error": {"message": ...}}`,
    `{"object": "error", "message": ...}`, `{"error": "text"}`), else its JSON; at most 300
    characters."""
    text = None
    if isinstance(doc, dict):
        err = doc.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            text = err["message"]
        elif isinstance(err, str):
            text = err
        elif isinstance(doc.get("message"), str):
            text = doc["message"]
    elif isinstance(doc, str):
        text = doc
    return (text if text is not None else json.dumps(doc))[:300]


def _body_failure(raw: bytes, status: int, content_type: str) -> str:
    """Failure message for a 2xx body that is not an event stream (`raw`: its first bytes)."""
    text = raw.decode("utf-8", "replace").strip()
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and ("error" in doc or doc.get("object") == "error"):
        return f"error body: HTTP {status} {content_type or 'no content type'}: {_error_text(doc)}"
    if isinstance(doc, dict) and "choices" in doc:
        return f"bad_stream: HTTP {status} answered one JSON completion, not an event stream"
    if not text:
        return f"truncated_stream: HTTP {status} with an empty body"
    return f"bad_stream: HTTP {status} {content_type or 'no content type'} body is not an event stream: {text[:200]!r}"


class RequestStream(Sink):
    """Turns the answer of one request into message records and says when the stream is done.

    It is the `benchkit.measure.httpstream.Sink` of its request: the connection hands it the
    response head and each piece of the body with the stamp of the read that brought it; it
    parses the event stream and records every message. During the run the records are kept in
    flat arrays (`t_ns`, `tokens`, `kinds`), not as MessageEvent objects: a million long-lived
    objects make the garbage collector's full passes take tens of ms, which would stall the event
    loop. `materialize()` hands them to the log's columns once the phase is over. `ids` / `text` collect the
    output (token ids where every token-carrying message had them, else text) for the output
    digest; `output` is that digest (`benchkit.measure.outputs.OutputRecord`) once the request
    ended, and the buffers are dropped.
    """

    __slots__ = ("log", "cum", "finished", "events_seen", "t_ns", "tokens", "kinds", "parser", "status",
                 "content_type", "raw", "head_bytes", "error", "ids", "text", "ids_complete", "output", "fast")

    def __init__(self, log: RequestLog):
        self.log = log
        self.cum = 0  # output tokens counted so far (last cumulative completion_tokens seen)
        self.finished = False  # a finish reason, the final usage message or [DONE] arrived
        self.events_seen = 0
        self.t_ns = array("q")
        self.tokens = array("q")
        self.kinds = bytearray()
        self.parser = SSEParser()
        self.status = 0
        self.content_type = ""
        self.raw: bytearray | None = None  # the body of an answer that is not an event stream
        self.head_bytes = b""
        self.error = ""
        self.ids = array("i")
        self.text: list[str] = []
        self.ids_complete = True  # every token-carrying message had token_ids
        self.output: OutputRecord | None = None
        self.fast = False  # the SSE parser holds nothing: whole `data:` events may skip it (`data`)

    # -- Sink ---------------------------------------------------------------------------------
    def head(self, status: int, headers: dict[str, str]) -> None:
        self.status = status
        self.content_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if status // 100 != 2 or self.content_type == "application/json":
            self.raw = bytearray()

    def data(self, piece: bytes, t_ns: int) -> bool:
        # Fast path: the parser holds nothing and the piece is whole `data: ` events (one per read
        # is the common case), none of them [DONE]: no SSE state machine, and each event's JSON
        # is decoded into typed structs. Anything else takes the general path below.
        # (UTF-8 is checked on the whole piece, as the parser decodes every event of a read before
        # the first is handled; msgspec would not check the fields it skips)
        if self.fast and piece[-2:] == b"\n\n" and piece[:6] == b"data: " and b"\r" not in piece \
                and b"[DONE]" not in piece and (piece.isascii() or _is_utf8(piece)):
            if piece.find(b"\n") == len(piece) - 2:
                return self._fast_event(piece[6:-2], t_ns)
            parts = piece[:-2].split(b"\n\n")
            if all(p[:6] == b"data: " and b"\n" not in p for p in parts):
                for i, p in enumerate(parts):
                    if self._fast_event(p[6:], t_ns):
                        self.parser.events_dispatched += len(parts) - 1 - i  # the parser dispatches them all
                        return True
                return False
        raw = self.raw
        if raw is not None:
            if len(raw) < _KEEP_BODY_BYTES:
                raw += piece[: _KEEP_BODY_BYTES - len(raw)]
            return False
        parser = self.parser
        events = parser.feed(piece)
        self.fast = parser.idle
        if not parser.events_dispatched and len(self.head_bytes) < _HEAD_BYTES:
            self.head_bytes += piece[: _HEAD_BYTES - len(self.head_bytes)]
        for event_type, data in events:
            err = self.on_event(event_type, data, t_ns)
            if err is not None:
                if err is not _DONE:
                    self.error = err
                else:
                    self.finished = True
                return True
        return False

    def _fast_event(self, data: bytes, t_ns: int) -> bool:
        """One `data:` event's bytes, valid UTF-8 (the fast path of `data`); True once the sink is
        done."""
        try:
            msg = _fast_decode(data)
        except msgspec.MsgspecError:
            msg = None
        choices = msg.choices if msg is not None else None
        if (not choices or msg.metrics is not _UNSET or msg.sglext is not _UNSET
                or msg.meta_info is not _UNSET):
            # another shape, or not valid: the general path, exactly as if the fast one did not exist
            self.fast = False
            return self.data(b"data: " + data + b"\n\n", t_ns)
        self.parser.events_dispatched += 1
        self.events_seen += 1
        choice = choices[0]
        if choice.finish_reason is not None:
            self.finished = True
        delta = choice.delta
        if delta is not None:  # chat
            reasoning = delta.reasoning or delta.reasoning_content or ""
            content = delta.content or ""
        else:
            reasoning, content = "", choice.text or ""
        ids = choice.token_ids
        if ids is None and delta is not None:
            ids = delta.token_ids
        usage = msg.usage
        if usage is None:
            self._take(t_ns, reasoning, content, ids, None, None)
        else:
            self._take(t_ns, reasoning, content, ids, usage.completion_tokens, usage.prompt_tokens)
        return False

    def end(self) -> None:
        pass

    def conclude(self) -> None:
        """After the answer: record its failure, if any, in the log."""
        log = self.log
        if self.raw is not None:
            text = bytes(self.raw)
            if self.status // 100 != 2:
                log.ok, log.error = False, f"http {self.status}: {text.decode('utf-8', 'replace')[:300]}"
            else:
                log.ok, log.error = False, _body_failure(text, self.status, self.content_type)
        elif self.error:
            log.ok, log.error = False, self.error
        elif not self.finished:
            log.ok = False
            if self.events_seen:
                log.error = self.truncated()
            else:
                log.error = _body_failure(self.head_bytes, self.status, self.content_type)

    # -- messages -------------------------------------------------------------------------------
    def on_event(self, event_type: str, data: str, t_ns: int) -> str | None:
        """Record one event; returns _DONE after [DONE], an error string, or None."""
        self.events_seen += 1
        if data == _DONE:
            self.finished = True
            return _DONE
        try:
            msg = _json_decode(data)
        except msgspec.DecodeError:
            try:  # what msgspec refuses but Python's json reads (NaN, Infinity)
                msg = json.loads(data)
            except ValueError:
                if event_type == "error":
                    return f"stream error: {data[:300]}"
                return f"bad_stream: event data is not JSON: {data[:200]!r}"
        if event_type == "error":
            return f"stream error: {_error_text(msg)}"
        if type(msg) is not dict:
            return f"bad_stream: event data is not a JSON object: {data[:200]!r}"
        try:
            return self._message(msg, t_ns)
        except (AttributeError, TypeError, IndexError, KeyError) as exc:
            return f"bad_stream: unexpected message shape ({type(exc).__name__}: {exc}): {data[:200]!r}"

    def _message(self, msg: dict, t_ns: int) -> str | None:
        choices = msg.get("choices")
        usage = msg.get("usage")
        if type(usage) is not dict:
            usage = None
        if "metrics" in msg or "sglext" in msg or "meta_info" in msg:
            self._spec(msg)
        if not choices:
            if "error" in msg or msg.get("object") == "error":
                return f"stream error: {_error_text(msg)}"
            if usage is not None:
                self._final_usage(usage)
                self.finished = True  # the usage-only message comes after every choice finished
                self._record(t_ns, 0, _USAGE)
            return None
        choice = choices[0]
        if choice.get("finish_reason") is not None:
            self.finished = True
        delta = choice.get("delta")
        if type(delta) is dict:  # chat
            reasoning = delta.get("reasoning") or delta.get("reasoning_content") or ""
            content = delta.get("content") or ""
        else:
            reasoning, content = "", choice.get("text") or ""
        ids = choice.get("token_ids")
        if type(ids) is not list:
            ids = delta.get("token_ids") if type(delta) is dict else None
        completion = prompt = None
        if usage is not None:
            completion, prompt = usage.get("completion_tokens"), usage.get("prompt_tokens")
        self._take(t_ns, reasoning, content, ids if type(ids) is list else None,
                   completion if type(completion) is int else None, prompt if type(prompt) is int else None)
        return None

    def _take(self, t_ns: int, reasoning: str, content: str, ids: list[int] | None, completion: int | None,
              prompt: int | None) -> None:
        """Record one token message (both paths): its output tokens from the cumulative
        `completion` when the server sent usage, else from `ids`, else one per non-empty message
        (module docstring); its text or ids for the output digest; its kind."""
        if completion is not None:
            tokens = completion - self.cum
            self.cum = completion
            if prompt is not None:
                self.log.prompt_tokens = prompt
            self.log.completion_tokens = completion
        elif ids is not None:
            tokens = len(ids)
            self.cum += tokens
        else:
            tokens = 1 if (reasoning or content) else 0
            self.cum += tokens
            if tokens:
                self.log.tokens_from_text = True
        if ids is not None:
            self.ids.extend(ids)
        elif tokens:
            self.ids_complete = False
        if reasoning:
            self.text.append(reasoning)
        if content:
            self.text.append(content)
        self._record(t_ns, tokens, _REASONING if reasoning and not content else _CONTENT)

    def _spec(self, msg: dict) -> None:
        details = parse_spec_details(msg)
        if details is not None:
            log = self.log
            log.spec_steps, log.spec_draft_tokens = details.steps, details.draft_tokens
            log.spec_accepted_tokens, log.spec_histogram = details.accepted_tokens, details.histogram

    def _record(self, t_ns: int, tokens: int, kind: int) -> None:
        self.t_ns.append(t_ns)
        self.tokens.append(tokens)
        self.kinds.append(kind)

    def _final_usage(self, usage: dict) -> None:
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if type(prompt) is int:
            self.log.prompt_tokens = prompt
        if type(completion) is int:
            self.log.completion_tokens = completion

    def truncated(self) -> str:
        """Failure message for a stream that ended without saying it was complete."""
        return (
            f"truncated_stream: the stream ended after {self.cum} output tokens in {self.events_seen} "
            "events without a finish reason, a final usage message or [DONE]"
        )

    def digest(self, prompt_text: str, keep_full: bool) -> None:
        """Keep the output digest of a measured request (ids where every token-carrying message had
        them, else text; nothing for a failed request) and drop the buffers."""
        if self.log.ok:
            ids = self.ids if (self.ids and self.ids_complete) else None
            text = "".join(self.text) if ids is None else None
            self.output = digest_output(self.log.index, prompt_text, ids, text, keep_full)
        else:
            self.output = digest_output(self.log.index, prompt_text, None, None, False)
        self.ids, self.text = array("i"), []

    def materialize(self) -> RequestLog:
        """Hand the recorded messages to the log as its columns (once, after the phase; the arrays
        are wrapped, not copied, and no object per message is built) and return the log."""
        self.log.set_columns(self.t_ns, self.tokens, self.kinds)
        return self.log


async def send_request(pool: ConnectionPool, path: str, body: dict, stream: RequestStream, timeout_s: float) -> None:
    """Send one request and fill `stream` (and its log); never raises (except cancellation)."""
    log = stream.log
    payload = _json_encode(body)
    log.send_ns = time.perf_counter_ns()
    try:
        async with asyncio.timeout(timeout_s):
            await pool.post(path, payload, stream, lambda: log.send_ns)
        stream.conclude()
    except SSEError as exc:
        log.ok, log.error = False, f"bad_stream: {exc}"
    except TimeoutError:
        log.ok, log.error = False, f"timeout after {timeout_s} s"
    except HttpError as exc:
        log.ok, log.error = False, f"transport: {exc}"[:400]
    except OSError as exc:
        log.ok, log.error = False, (f"transport: {type(exc).__name__}: {exc} (connecting to "
                                    f"{pool.host}:{pool.port})")[:400]
    finally:
        log.end_ns = time.perf_counter_ns()


#: A lag sample at least this long (ms) is a stall: the process ran nothing for that long (stopped,
#: swapped out, descheduled, a long GC pass). Ten probe intervals: far above scheduler ticks.
STALL_MIN_MS = 50.0


class HeadroomSampler:
    """Samples this process's CPU time, event-loop lag, stalls and garbage-collector pauses
    between `start()` and `stop()`; `pool` (a ConnectionPool) adds how its reads were stamped
    and how long bytes waited in the socket before Python read them.

    While sampling, the objects that existed at `start()` are frozen out of the garbage collector
    (`gc.freeze()`, undone by `stop()`): a full pass over a large process (a Celery worker, a
    test session) took about 110 ms here and stalled the loop; frozen, a pass only scans what the
    window itself allocated. The probe also measures the kernel clock offset again when due.
    """

    def __init__(self, interval_s: float = LAG_INTERVAL_S, pool: ConnectionPool | None = None):
        self.interval_s = interval_s
        self.pool = pool
        self.lags_ns: list[int] = []
        self.gc_ns: list[int] = []
        self._gc_t0 = 0
        self._task: asyncio.Task | None = None
        self._cpu0 = 0
        self._reads0 = (0, 0, 0, 0)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_t0 = time.perf_counter_ns()
        elif self._gc_t0:
            self.gc_ns.append(time.perf_counter_ns() - self._gc_t0)

    def start(self) -> None:
        gc.freeze()
        gc.callbacks.append(self._on_gc)
        self._cpu0 = time.process_time_ns()
        if self.pool is not None:
            st = self.pool.stats
            self._reads0 = (st.kernel, st.fallback, len(st.delay_ns), self.pool.clock.steps)
        self._task = asyncio.create_task(self._probe())

    async def _probe(self) -> None:
        interval_ns = round(self.interval_s * 1e9)
        pool = self.pool
        while True:
            due = time.perf_counter_ns() + interval_ns
            await asyncio.sleep(self.interval_s)
            now = time.perf_counter_ns()
            self.lags_ns.append(max(0, now - due))
            if pool is not None:
                pool.clock.refresh(now)

    async def stop(self, wall_ns: int) -> ProcessHeadroom:
        """Stop sampling; `wall_ns` is this process's window length (ns)."""
        cpu_s = (time.process_time_ns() - self._cpu0) / 1e9
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        gc.unfreeze()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        lags = np.asarray(self.lags_ns, dtype=float) / 1e6
        wall_s = max(wall_ns, 1) / 1e9
        stalls = lags[lags >= STALL_MIN_MS]
        kernel = fallback = steps = 0
        delays = np.zeros(0)
        if self.pool is not None:
            st, (k0, f0, d0, s0) = self.pool.stats, self._reads0
            kernel, fallback, steps = st.kernel - k0, st.fallback - f0, self.pool.clock.steps - s0
            delays = np.frombuffer(st.delay_ns, dtype=np.int64)[d0:].astype(float) / 1e6
        return ProcessHeadroom(
            cpu_s=cpu_s,
            wall_s=wall_s,
            core_share=cpu_s / wall_s,
            loop_lag_p50_ms=float(np.percentile(lags, 50)) if lags.size else None,
            loop_lag_p99_ms=float(np.percentile(lags, 99)) if lags.size else None,
            loop_lag_max_ms=float(lags.max()) if lags.size else None,
            lag_samples=int(lags.size),
            gc_pauses=len(self.gc_ns),
            gc_pause_max_ms=max(self.gc_ns) / 1e6 if self.gc_ns else None,
            stall_max_ms=float(lags.max()) if lags.size else None,
            stalled_share=min(1.0, float(stalls.sum()) / 1e3 / wall_s) if lags.size else None,
            stalls=int(stalls.size),
            kernel_reads=kernel,
            fallback_reads=fallback,
            read_delay_p99_ms=float(np.percentile(delays, 99)) if delays.size else None,
            read_delay_max_ms=float(delays.max()) if delays.size else None,
            clock_steps=steps,
        )


class Driver:
    """Sends requests of one client process: one connection pool, at most `cap` in flight."""

    def __init__(self, pool: ConnectionPool, path: str, model: str, workload: WorkloadSpec,
                 api: str, cap: int, timeout_s: float, extra_body: dict | None = None,
                 options: ClientOptions | None = None):
        self.pool, self.path, self.model, self.workload, self.api = pool, path, model, workload, api
        self.extra_body = extra_body
        self.options = options or ClientOptions()
        self.sem = asyncio.Semaphore(max(cap, 1))
        self.timeout_s = timeout_s

    async def phase(self, items: list[tuple[RequestStream, Prompt, int | None]],
                    on_done: Callable[[], object] | None = None, digest_below: int | None = None) -> None:
        """Run `(stream, prompt, due_ns or None)` items, each sent at its due time (or as soon as
        a slot is free); `on_done()` (may return an awaitable) after each request ends. With
        `digest_below` (and `options.keep_outputs`), each request's output digest is kept, in
        full for prompt indices below it."""
        keep = self.options.keep_outputs and digest_below is not None

        async def send(stream: RequestStream, prompt: Prompt, due_ns: int | None) -> None:
            if due_ns is not None:
                delay = (due_ns - time.perf_counter_ns()) / 1e9
                if delay > 0:
                    await asyncio.sleep(delay)
            async with self.sem:
                body = build_body(prompt, self.model, self.workload, self.api, self.extra_body, self.options)
                await send_request(self.pool, self.path, body, stream, self.timeout_s)
            if keep:
                stream.digest(prompt.text, stream.log.index < digest_below)
            else:
                stream.ids, stream.text = array("i"), []

        tasks = [asyncio.create_task(send(*item)) for item in items]
        try:
            for fut in asyncio.as_completed(tasks):
                await fut
                if on_done is not None:
                    res = on_done()
                    if asyncio.iscoroutine(res):
                        await res
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def connection_pool(base_url: str, cap: int, options: ClientOptions | None = None) -> ConnectionPool:
    """The ConnectionPool of one client process (call inside its running event loop)."""
    return ConnectionPool(base_url, kernel_stamps=(options or ClientOptions()).kernel_stamps, limit=max(cap, 1))


def endpoint_path(base_url: str, api: str) -> str:
    """The request path of `api` under `base_url` (a base URL may carry a path prefix)."""
    prefix = urlsplit(base_url).path.rstrip("/")
    return prefix + ("/v1/chat/completions" if api == "chat" else "/v1/completions")


def span_ns(logs: list[RequestLog]) -> int:
    """From the first send to the last end of `logs` (ns)."""
    return max(log.end_ns for log in logs) - min(log.send_ns for log in logs)
