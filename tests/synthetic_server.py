"""A real HTTP server that streams like vLLM's OpenAI-compatible server, with set timings.

It listens on 127.0.0.1 (a free port) in a background thread (aiohttp, its own event loop) and
answers `POST /v1/completions` and `POST /v1/chat/completions` with Server-Sent Events in vLLM's
shapes (`vllm/entrypoints/openai/completion/serving.py`): one chunk per message, the cumulative
`usage` on every chunk when the client asks for `continuous_usage_stats`, a final usage-only
chunk (`choices: []`) when it asks for `include_usage`, then `data: [DONE]`. It also answers
`POST /tokenize`, `POST /detokenize` (one token per character; token id = code point; BOS id 1
when `bos`), `GET /health`, `GET /v1/models`, `POST /reset_prefix_cache` and `GET /metrics`.
With `spec_k` > 0, `/metrics` carries vLLM's spec-decode counters as a speculating server
would count them: every message after a request's first is one draft step of `spec_k` draft
tokens of which (tokens in the message - 1) were accepted; each counter has its `_created`
sample and the page has `process_start_time_seconds`, as prometheus_client writes them. With
`restart_at` = n, the server behaves as if it restarted when generation request n (0-based)
arrives: counters start again from 0 and both times move one hour on.

What a test sets (`SyntheticConfig`): TTFT, the gap between messages and tokens per message
(message j of a request is sent at receipt + ttft_ms + j * gap_ms, on an absolute schedule; a
request body may override both with the extra fields `synthetic_ttft_ms` / `synthetic_gap_ms`),
whether usage is reported, reasoning deltas (chat), and per-request failures keyed by arrival
order (0-based count of generation requests): `http_500`, `hang` (no answer for `hang_s`),
`no_tokens` (200 with no output token), `early_eos` (stops after `early_eos_tokens`),
`stream_error` (one token, then an in-stream error object), `drop` (closes the connection
mid-stream), `truncate` (`early_eos_tokens` tokens, then a clean end of the stream without a
finish reason, usage message or [DONE]).

Token ids: with `return_token_ids: true` in the body every streamed choice carries `token_ids`
(the code points of its text), as vLLM's does. Per-request spec-decode metrics (`spec_metrics`,
with `spec_k` > 0): the final usage-only chunk carries vLLM's `metrics.speculative_decoding`
(`--per-request-spec-decode-metrics summary`), counted like the counters (every message after
the first is one verify step). Lossy outputs (`diverge_after` p, `diverge_share` s): for a
deterministic share s of prompts (by a hash of the prompt text) every output token from
position p on is upper-case, so their outputs differ from a lossless run's from token p.

Ground truth (`record_sends`): for every generation request the server keeps, under its prompt
text, the `time.perf_counter_ns()` of its arrival and of each token-carrying write (`sends`). On
Linux that clock is CLOCK_MONOTONIC, shared by every process of the host, so a client's own
stamps compare with these directly. With `reuse_port` several server processes can listen on one
port (SO_REUSEPORT: the kernel spreads connections over them).

Usage::

    with SyntheticServer(SyntheticConfig(ttft_ms=50, gap_ms=20, tokens_per_message=3)) as url:
        ...  # url == "http://127.0.0.1:PORT"

As a managed server (a process draftboard starts and stops, like vLLM): `python -m
tests.synthetic_server --port P [--ttft-ms 20 --gap-ms 10 --tokens-per-message 1]` serves in the
foreground (`--ignore-sigterm`: as a hung server that only SIGKILL stops; `--diverge-after P
--diverge-share S`: a lossy speculative build, whose outputs diverge as `diverge_after` /
`diverge_share` say only when it was started with vLLM's `--speculative-config`, so the `auto`
server of the same flags stays lossless); unknown engine flags (`--seed`, ...) are ignored. It first
forks one child that inherits the listening socket and sleeps, the way an engine's worker
processes share its process group: killing only the leader leaves the port held, so only a
whole-group teardown frees it. The engine build `synthetic` (tests/fixtures/synthetic_flags.yaml,
via DRAFTBOARD_ENGINE_FLAGS) launches it.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import heapq
import json
import math
import multiprocessing as mp
import os
import signal
import socket
import string
import sys
import threading
import time
from array import array
from dataclasses import dataclass, field

from aiohttp import web

FAILURE_MODES = ("http_500", "hang", "no_tokens", "early_eos", "stream_error", "drop", "truncate")
BOS_ID = 1


@dataclass
class SyntheticConfig:
    """Behaviour of a SyntheticServer (times in ms, counts in tokens).

    `usage`: "continuous" (honour include_usage and continuous_usage_stats), "final" (honour
    include_usage only: one final usage-only message) or "none" (never send usage).
    `first_message_tokens`: tokens in the first message (None: `tokens_per_message`).
    `reasoning_tokens`: on the chat API, the first this many output tokens are sent as reasoning
    deltas in field `reasoning_field`. `failures`: arrival ordinal -> one of FAILURE_MODES.
    `tokenizer`: "char" (one token per character) or "none" (no /tokenize, /detokenize: 404).
    `record_sends`: keep the ground-truth send times (`SyntheticServer.sends`). `keep_requests`:
    keep every request body in `SyntheticServer.requests` (off for long benchmarks; the arrival
    count still drives `failures` and `restart_at`).
    """

    ttft_ms: float = 20.0
    gap_ms: float = 10.0
    tokens_per_message: int = 1
    first_message_tokens: int | None = None
    usage: str = "continuous"
    reasoning_tokens: int = 0
    reasoning_field: str = "reasoning"
    failures: dict[int, str] = field(default_factory=dict)
    early_eos_tokens: int = 1
    hang_s: float = 30.0
    tokenizer: str = "char"
    bos: bool = False
    model: str = "synthetic"
    spec_k: int = 0
    restart_at: int | None = None
    record_sends: bool = False
    keep_requests: bool = True
    spec_metrics: bool = False
    diverge_after: int | None = None
    diverge_share: float = 0.0
    #: Forced acceptance (vLLM's `rejection_sample_method: synthetic` with
    #: `synthetic_acceptance_length`, which the vLLM CPU build refuses): with `spec_k` > 0, message
    #: j >= 1 of a request carries round(j tau) - round((j - 1) tau) tokens, so the counted mean
    #: acceptance length is `forced_tau` (up to the last message's truncation).
    forced_tau: float | None = None
    #: Category-dependent acceptance: {prompt prefix: tau}; a request whose prompt starts with a
    #: prefix is forced to that tau (as `forced_tau`, which it overrides; needs `spec_k` > 0).
    tau_by_prefix: dict[str, float] = field(default_factory=dict)
    #: write a request's token messages after the first from the server's one timer (`_Pump`)
    #: instead of a task per request waking per message; the same bytes and schedule, less CPU
    pump: bool = True
    #: with `pump`: when the next message is due within this many ms, poll the loop (call_soon)
    #: instead of arming a timer. asyncio's selector waits in whole milliseconds (epoll_wait's
    #: timeout is rounded up), so a timer a few microseconds off still sleeps about 1 ms and the
    #: messages behind it go out up to 1 ms late in a burst; polling costs a core, which a fleet's
    #: pinned processes have to themselves. 0: never poll.
    pump_poll_ms: float = 0.0

    def diverges(self, prompt: str) -> bool:
        """Whether this prompt's output diverges (`diverge_after`, `diverge_share`)."""
        if self.diverge_after is None or self.diverge_share <= 0:
            return False
        h = int.from_bytes(hashlib.blake2b(prompt.encode(), digest_size=4).digest(), "little")
        return h % 10_000 < self.diverge_share * 10_000

    def __post_init__(self) -> None:
        bad = {k: v for k, v in self.failures.items() if v not in FAILURE_MODES}
        if bad:
            raise ValueError(f"SyntheticConfig.failures: unknown mode(s) {bad}; expected {FAILURE_MODES}")
        if self.usage not in ("continuous", "final", "none"):
            raise ValueError(f"SyntheticConfig.usage must be continuous, final or none, got {self.usage!r}")


def _sse(obj: dict | str) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def _chunk_dict(chat: bool, ordinal: int, model: str, want_ids: bool, reasoning_field: str,
                usage_prompt: int | None, text: str, reasoning: bool, cum: int, finish: str | None) -> dict:
    """One streamed chunk in vLLM's shape, as a dict (`usage_prompt`: the prompt's token count when
    usage goes on every chunk, else None). `_ChunkEncoder` writes the same bytes faster."""
    if chat:
        delta = {reasoning_field: text} if reasoning else {"content": text}
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": text, "finish_reason": finish}
    if want_ids:
        choice["token_ids"] = [ord(c) for c in text]
    msg = {"id": f"cmpl-{ordinal}", "object": "chat.completion.chunk" if chat else "text_completion",
           "model": model, "choices": [choice]}
    if usage_prompt is not None:
        msg["usage"] = {"prompt_tokens": usage_prompt, "completion_tokens": cum, "total_tokens": usage_prompt + cum}
    return msg


def _dumps(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"))


class _ChunkEncoder:
    """`_sse(_chunk_dict(...))` of one request's token chunks, byte for byte, without building and
    dumping a dict per message: the request's constant head (id, object, model) is encoded once,
    and the choice part of a short text is kept in `cache` (shared by the requests of a server, one
    entry per (flavour, text, reasoning, finish)). The synthetic server's hot loop."""

    def __init__(self, cache: dict, chat: bool, ordinal: int, model: str, want_ids: bool, reasoning_field: str,
                 usage_prompt: int | None):
        obj = "chat.completion.chunk" if chat else "text_completion"
        self.head = f'data: {{"id":{_dumps(f"cmpl-{ordinal}")},"object":"{obj}","model":{_dumps(model)},' \
                    f'"choices":['.encode()
        self.tail = b"]}\n\n"
        self.usage_prompt = usage_prompt
        self.chat, self.want_ids, self.reasoning_field = chat, want_ids, reasoning_field
        self.cache = cache
        self.flavour = (chat, want_ids, reasoning_field)

    def choice(self, text: str, reasoning: bool, finish: str | None) -> bytes:
        key = (self.flavour, text, reasoning, finish)
        got = self.cache.get(key)
        if got is not None:
            return got
        t = _dumps(text)
        if self.chat:
            field = _dumps(self.reasoning_field) if reasoning else '"content"'
            inner = f'"delta":{{{field}:{t}}}'
        else:
            inner = f'"text":{t}'
        ids = f',"token_ids":{_dumps([ord(c) for c in text])}' if self.want_ids else ""
        out = f'{{"index":0,{inner},"finish_reason":{_dumps(finish)}{ids}}}'.encode()
        if len(text) <= 4:
            self.cache[key] = out
        return out

    def message(self, text: str, reasoning: bool, cum: int, finish: str | None) -> bytes:
        if self.usage_prompt is None:
            return self.head + self.choice(text, reasoning, finish) + self.tail
        p = self.usage_prompt
        usage = f'],"usage":{{"prompt_tokens":{p},"completion_tokens":{cum},"total_tokens":{p + cum}}}}}\n\n'
        return self.head + self.choice(text, reasoning, finish) + usage.encode()


class _TokenStream:
    """One request's token messages in order: `next()` gives the next one as (due s after the
    request's start, its bytes, its token count), None after the last; `written(k)` after each is
    written counts it (vLLM's spec-decode counters: every message after the first is a draft step)."""

    def __init__(self, server: SyntheticServer, enc: _ChunkEncoder, n_out: int, mode: str | None, chat: bool,
                 diverge_at: int | None, echo: str, ttft_ms: float, gap_ms: float, tau: float | None = None):
        self.server, self.cfg, self.enc = server, server.config, enc
        self.tau = tau if tau is not None else self.cfg.forced_tau
        self.n_out, self.mode, self.chat, self.diverge_at, self.echo = n_out, mode, chat, diverge_at, echo
        self.ttft_ms, self.gap_ms = ttft_ms, gap_ms
        self.sent = self.j = self.steps = self.accepted = 0
        self.hist = [0] * (self.cfg.spec_k + 1)

    def next(self) -> tuple[float, bytes, int] | None:
        cfg, sent, j = self.cfg, self.sent, self.j
        if sent >= self.n_out:
            return None
        k = cfg.tokens_per_message if (j > 0 or cfg.first_message_tokens is None) else cfg.first_message_tokens
        if self.tau is not None and cfg.spec_k and j > 0:
            k = math.floor(j * self.tau + 0.5) - math.floor((j - 1) * self.tau + 0.5)
        k = min(k, self.n_out - sent)
        letters, diverge_at = string.ascii_lowercase, self.diverge_at
        if k == 1 and (diverge_at is None or sent < diverge_at):
            text = letters[sent % 26]
        else:
            text = "".join(letters[(sent + i) % 26] if diverge_at is None or sent + i < diverge_at
                           else letters[(sent + i) % 26].upper() for i in range(k))
        if self.echo and j == 0:  # a peer client that reports no prompt: name the request in its text
            text = self.echo + text
        reasoning = self.chat and sent < cfg.reasoning_tokens
        self.sent = sent = sent + k
        mode = self.mode
        finish = ("stop" if mode == "early_eos" else "length") if sent == self.n_out and mode != "truncate" else None
        return (self.ttft_ms + j * self.gap_ms) / 1000.0, self.enc.message(text, reasoning, sent, finish), k

    def written(self, k: int) -> None:
        cfg = self.cfg
        if cfg.spec_k and self.j > 0:
            self.steps += 1
            self.accepted += min(k - 1, cfg.spec_k)
            self.hist[min(k - 1, cfg.spec_k)] += 1
            counters = self.server.spec_counters
            counters["drafts"] += 1
            counters["draft_tokens"] += cfg.spec_k
            counters["accepted"] += k - 1
        self.j += 1


class _PumpedStream:
    """A request's remaining token messages, written by the server's `_Pump` straight to the
    connection, each framed as one HTTP/1.1 chunk exactly as aiohttp's writer frames it."""

    __slots__ = ("tokens", "msg", "transport", "stamps", "t0", "done")

    def __init__(self, tokens: _TokenStream, msg: tuple[float, bytes, int], transport: asyncio.Transport,
                 stamps: array, t0: float):
        self.tokens, self.msg, self.transport, self.stamps, self.t0 = tokens, msg, transport, stamps, t0
        self.done: asyncio.Future | None = None

    def due(self) -> float:
        return self.t0 + self.msg[0]

    def write(self) -> float | None:
        """Write the pending message (now due); return the next one's due time (loop clock), or
        None when the stream is finished (`done` resolved)."""
        if self.done.done():  # the handler was cancelled
            return None
        if self.transport.is_closing():
            self.done.set_exception(ConnectionResetError("Cannot write to closing transport"))
            return None
        _, data, k = self.msg
        self.stamps.append(time.perf_counter_ns())
        self.transport.write(b"%x\r\n%b\r\n" % (len(data), data))
        self.tokens.written(k)
        msg = self.tokens.next()
        if msg is None:
            self.done.set_result(None)
            return None
        self.msg = msg
        return self.t0 + msg[0]


class _Pump:
    """Writes the token messages of every pumped stream of one server from a single timer (a heap
    of due times), instead of one task waking, sleeping and writing through aiohttp per message:
    the same schedule (a message is written once the loop's clock reaches its due time, never
    before) at a fraction of the CPU per message. Streams due together go out in due order; after
    `BATCH` messages it yields to the loop (requests keep being read)."""

    BATCH = 256

    def __init__(self, poll_s: float = 0.0) -> None:
        self._poll_s = poll_s
        self._polling = False
        self._heap: list[tuple[float, int, _PumpedStream]] = []
        self._seq = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._loop: asyncio.AbstractEventLoop | None = None

    async def run(self, stream: _PumpedStream) -> None:
        """Pump `stream` until its last message is written (raises ConnectionResetError when its
        connection closes first)."""
        loop = self._loop = asyncio.get_running_loop()
        stream.done = loop.create_future()
        self._push(stream.due(), stream)
        try:
            await stream.done
        finally:
            if not stream.done.done():
                stream.done.cancel()

    def _push(self, due: float, stream: _PumpedStream) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (due, self._seq, stream))
        if due < self._timer_at and not self._polling:
            if self._timer is not None:
                self._timer.cancel()
            self._arm(due, self._loop.time())

    def _arm(self, at: float, now: float) -> None:
        self._timer_at = at
        self._polling = at - now < self._poll_s  # due within the poll window: do not sleep
        self._timer = self._loop.call_soon(self._fire) if self._polling else self._loop.call_at(at, self._fire)

    def _fire(self) -> None:
        self._timer, self._timer_at, self._polling = None, math.inf, False
        heap, loop = self._heap, self._loop
        now = loop.time()
        for _ in range(self.BATCH):
            if not heap:
                return
            due = heap[0][0]
            if due > now:
                now = loop.time()
                if due > now:
                    break
            stream = heapq.heappop(heap)[2]
            try:
                nxt = stream.write()
            except Exception as exc:  # noqa: BLE001 - one broken stream must not stop the others
                if not stream.done.done():
                    stream.done.set_exception(exc)
                continue
            if nxt is not None:
                self._seq += 1
                heapq.heappush(heap, (nxt, self._seq, stream))
        else:
            if heap:  # a full batch: let the loop read requests, then go on
                self._timer_at, self._polling = heap[0][0], True
                self._timer = loop.call_soon(self._fire)
            return
        self._arm(heap[0][0], now)


class SyntheticServer:
    """The server. `start() -> base_url`, `stop()`, or use it as a context manager.

    `requests` lists (path, JSON body) of every generation request received, in arrival order.
    `sends` (with `record_sends`): prompt text -> one (arrival ns, array of write ns per
    token-carrying message) per request with that prompt, in arrival order. `port` / `reuse_port`:
    listen on this port (0: a free one), with SO_REUSEPORT so other processes can share it.
    """

    def __init__(self, config: SyntheticConfig | None = None, port: int = 0, reuse_port: bool = False,
                 sock: socket.socket | None = None,
                 hand_to: list[socket.socket] | None = None, take_from: socket.socket | None = None):
        self.config = config or SyntheticConfig()
        self.port, self.reuse_port = port, reuse_port
        self._sock = sock  # a bound socket to serve on (default: a fresh one on `port`, 0 = free)
        # a fleet balancing its connections (SyntheticFleet): the listening process hands every
        # accepted connection in turn to itself and to the processes behind `hand_to` (Unix
        # SOCK_SEQPACKET sockets, SCM_RIGHTS); such a process takes them from `take_from` and
        # does not listen
        self._hand_to, self._take_from = hand_to, take_from
        self._next_peer = 0
        self._conn_tasks: set[asyncio.Task] = set()
        self._own_sockets: list[socket.socket] = []  # read by the loop outside aiohttp: closed by stop()
        self.requests: list[tuple[str, dict]] = []
        self.n_requests = 0
        self.sends: dict[str, list[tuple[int, array]]] = {}
        self.spec_counters = {"drafts": 0, "draft_tokens": 0, "accepted": 0}
        self.started_s = 1_796_000_000.0  # Unix time of this "server life" (moves on a restart)
        self.prefix_cache_resets = 0
        self.base_url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._lock = threading.Lock()
        self._chunk_cache: dict = {}  # _ChunkEncoder's encoded choices
        self._pump = _Pump(self.config.pump_poll_ms / 1000.0)

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> str:
        """Start listening; returns the base URL ("http://127.0.0.1:PORT")."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="synthetic-server", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._astart(), self._loop).result(timeout=30)
        return self.base_url

    async def _astart(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", self._generate)
        app.router.add_post("/v1/chat/completions", self._generate)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/reset_prefix_cache", self._reset_prefix_cache)
        if self.config.tokenizer == "char":
            app.router.add_post("/tokenize", self._tokenize)
            app.router.add_post("/detokenize", self._detokenize)
        self._runner = web.AppRunner(app, shutdown_timeout=0.2, access_log=None)
        await self._runner.setup()
        loop = asyncio.get_running_loop()
        if self._take_from is not None:  # served connections come from the fleet's listening process
            self._take_from.setblocking(False)
            loop.add_reader(self._take_from.fileno(), self._take_connections)
            self._own_sockets.append(self._take_from)
            return
        sock = self._sock
        if sock is None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if self.reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(("127.0.0.1", self.port))
        if self._hand_to:
            sock.listen(1024)
            sock.setblocking(False)
            loop.add_reader(sock.fileno(), self._accept_and_hand, sock)
            self._own_sockets.append(sock)
        else:
            site = web.SockSite(self._runner, sock)
            await site.start()
        self.base_url = f"http://127.0.0.1:{sock.getsockname()[1]}"

    def _serve_connection(self, conn: socket.socket) -> None:
        task = self._loop.create_task(self._loop.connect_accepted_socket(self._runner.server, conn))
        self._conn_tasks.add(task)
        task.add_done_callback(self._conn_tasks.discard)

    def _accept_and_hand(self, sock: socket.socket) -> None:
        """Accept what is pending; connection n goes to process n mod (1 + len(hand_to)), this one
        being 0: C streams opened together land within one of C / processes on every process,
        where SO_REUSEPORT's hash of the client's port leaves some with twice the average."""
        for _ in range(256):
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            peer, self._next_peer = self._next_peer % (1 + len(self._hand_to)), self._next_peer + 1
            if peer == 0:
                self._serve_connection(conn)
                continue
            try:
                socket.send_fds(self._hand_to[peer - 1], [b"c"], [conn.fileno()])
            finally:
                conn.close()

    def _take_connections(self) -> None:
        while True:
            try:
                msg, fds, _flags, _addr = socket.recv_fds(self._take_from, 16, 16)
            except (BlockingIOError, InterruptedError):
                return
            if not msg and not fds:  # the listening process is gone
                self._loop.remove_reader(self._take_from.fileno())
                return
            for fd in fds:
                self._serve_connection(socket.socket(fileno=fd))

    async def _metrics(self, request: web.Request) -> web.Response:
        c = self.spec_counters
        lines = ["# TYPE process_start_time_seconds gauge", f"process_start_time_seconds {self.started_s}"]
        if self.config.spec_k:
            labels = f'engine="0",model_name="{self.config.model}"'
            for name, key in (("num_drafts", "drafts"), ("num_draft_tokens", "draft_tokens"),
                              ("num_accepted_tokens", "accepted")):
                lines += [f"# TYPE vllm:spec_decode_{name} counter",
                          f"vllm:spec_decode_{name}_total{{{labels}}} {c[key]}.0",
                          f"vllm:spec_decode_{name}_created{{{labels}}} {self.started_s + 1}"]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def _reset_prefix_cache(self, request: web.Request) -> web.Response:
        self.prefix_cache_resets += 1
        return web.Response(text="")

    def stop(self) -> None:
        """Stop the server and its thread (hanging handlers are cancelled)."""
        if self._loop is None:
            return
        for sock in self._own_sockets:
            self._loop.call_soon_threadsafe(self._loop.remove_reader, sock.fileno())
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=30)
        asyncio.run_coroutine_threadsafe(self._cancel_rest(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()
        for sock in self._own_sockets:
            sock.close()
        self._loop = None

    @staticmethod
    async def _cancel_rest() -> None:
        me = asyncio.current_task()
        rest = [t for t in asyncio.all_tasks() if t is not me]
        for t in rest:
            t.cancel()
        await asyncio.gather(*rest, return_exceptions=True)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- handlers ------------------------------------------------------------------------
    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.config.model, "object": "model"}]})

    def _ids(self, text: str, special: bool) -> list[int]:
        return ([BOS_ID] if special and self.config.bos else []) + [ord(c) for c in text]

    async def _tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        ids = self._ids(body["prompt"], body.get("add_special_tokens", True))
        return web.json_response({"count": len(ids), "max_model_len": 1 << 20, "tokens": ids})

    async def _detokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"prompt": "".join(chr(t) for t in body["tokens"] if t != BOS_ID)})

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        arrival_ns = time.perf_counter_ns()
        body = await request.json()
        chat = request.path.endswith("/chat/completions")
        with self._lock:
            ordinal = self.n_requests
            self.n_requests += 1
            if self.config.keep_requests:
                self.requests.append((request.path, body))
            if ordinal == self.config.restart_at:
                self.spec_counters = dict.fromkeys(self.spec_counters, 0)
                self.started_s += 3600.0
        cfg = self.config
        mode = cfg.failures.get(ordinal)
        if mode == "http_500":
            return web.json_response(
                {"object": "error", "message": "synthetic failure", "code": 500}, status=500
            )
        if mode == "hang":
            await asyncio.sleep(cfg.hang_s)
            return web.json_response({"object": "error", "message": "hung"}, status=504)

        if chat:
            prompt_tokens = sum(len(m.get("content") or "") for m in body.get("messages", []))
        else:
            prompt_tokens = len(self._ids(body.get("prompt", ""), True))
        n_out = int(body.get("max_tokens", 16))
        if mode == "no_tokens":
            n_out = 0
        elif mode in ("early_eos", "stream_error", "drop", "truncate"):
            n_out = min(n_out, cfg.early_eos_tokens if mode in ("early_eos", "truncate") else 1)
        opts = body.get("stream_options") or {}
        final_usage = cfg.usage != "none" and bool(opts.get("include_usage"))
        cont_usage = cfg.usage == "continuous" and final_usage and bool(opts.get("continuous_usage_stats"))

        want_ids = bool(body.get("return_token_ids"))
        key_text = str(body.get("prompt") if not chat else (body.get("messages") or [{}])[-1].get("content", ""))
        diverge_at = cfg.diverge_after if cfg.diverges(key_text) else None
        ttft_ms = float(body.get("synthetic_ttft_ms", cfg.ttft_ms))
        gap_ms = float(body.get("synthetic_gap_ms", cfg.gap_ms))
        stamps = array("q")
        if cfg.record_sends:
            self.sends.setdefault(key_text, []).append((arrival_ns, stamps))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        writer = await resp.prepare(request)
        obj = "chat.completion.chunk" if chat else "text_completion"
        usage_prompt = prompt_tokens if cont_usage else None
        enc = _ChunkEncoder(self._chunk_cache, chat, ordinal, cfg.model, want_ids, cfg.reasoning_field, usage_prompt)
        if chat:  # vLLM's first chat chunk: the role, no token
            first = _chunk_dict(chat, ordinal, cfg.model, want_ids, cfg.reasoning_field, usage_prompt,
                                "", False, 0, None)
            first["choices"][0]["delta"] = {"role": "assistant", "content": ""}
            await resp.write(_sse(first))
        # `synthetic_echo_key: true`: the first message's text starts with "[8 hex digits]", the
        # blake2b-32 of the prompt text, so that a client whose results list no prompts (SGLang's
        # Rust bench client) can be matched to this server's ground truth by its generated text
        echo = (f"[{hashlib.blake2b(key_text.encode(), digest_size=4).hexdigest()}]"
                if body.get("synthetic_echo_key") else "")
        tau = next((t for prefix, t in cfg.tau_by_prefix.items() if key_text.startswith(prefix)), None)
        tokens = _TokenStream(self, enc, n_out, mode, chat, diverge_at, echo, ttft_ms, gap_ms, tau)
        while (msg := tokens.next()) is not None:
            due, data, k = msg
            await asyncio.sleep(max(0.0, t0 + due - loop.time()))
            stamps.append(time.perf_counter_ns())
            await resp.write(data)
            tokens.written(k)
            if mode == "stream_error":
                await resp.write(_sse({"error": {"message": "synthetic in-stream error", "code": 500}}))
                break
            if mode == "drop":
                request.transport.close()
                return resp
            if cfg.pump and mode is None and getattr(writer, "chunked", False) and request.transport is not None:
                # the first message (with the headers) went through aiohttp; the server's pump
                # writes the rest, framed as aiohttp would, from one timer for all streams
                if (msg := tokens.next()) is not None:
                    await self._pump.run(_PumpedStream(tokens, msg, request.transport, stamps, t0))
                break
        sent, steps, accepted, hist = tokens.sent, tokens.steps, tokens.accepted, tokens.hist
        if mode == "truncate":
            await resp.write_eof()
            return resp
        if final_usage:
            last = {
                "id": f"cmpl-{ordinal}",
                "object": obj,
                "model": cfg.model,
                "choices": [],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": sent,
                          "total_tokens": prompt_tokens + sent},
            }
            if cfg.spec_metrics and cfg.spec_k and steps:
                last["metrics"] = {"speculative_decoding": {
                    "mean_acceptance_length": 1 + accepted / steps,
                    "draft_acceptance_rate": accepted / (steps * cfg.spec_k),
                    "acceptance_histogram": hist, "num_spec_steps": steps, "num_accepted_draft_tokens": accepted,
                    "num_draft_tokens": steps * cfg.spec_k, "num_spec_tokens": cfg.spec_k}}
            await resp.write(_sse(last))
        await resp.write(_sse("[DONE]"))
        await resp.write_eof()
        return resp


#: prompt text -> one (arrival ns, [write ns of each token message]) per request, arrival order.
Records = dict[str, list[tuple[int, array]]]


def _fleet_child(core: int | None, port: int, config: dict, conn, hand_to: list[socket.socket] | None = None,
                 take_from: socket.socket | None = None) -> None:
    """Child process: pin to `core`, serve on `port` (SO_REUSEPORT; with `hand_to`, the fleet's
    one listener handing connections round the others; with `take_from`, serving what it hands
    over), answer "collect" / "cpu" / "stop" on `conn`."""
    if core is not None:
        os.sched_setaffinity(0, {core})
    server = SyntheticServer(SyntheticConfig(**config), port=port, reuse_port=True, hand_to=hand_to,
                             take_from=take_from)
    conn.send(server.start())
    while True:
        cmd = conn.recv()
        if cmd == "collect":
            records, server.sends = server.sends, {}
            conn.send(records)
        elif cmd == "cpu":
            conn.send(time.process_time())
        else:
            break
    server.stop()


class SyntheticFleet:
    """`len(cores)` synthetic server processes on one port, one pinned to each core (None: not
    pinned), with `record_sends` on and request bodies not kept: a server whose timing does not
    share the client's process (GIL, event loop). Context manager yielding the base URL.
    `collect()` returns and clears the ground-truth Records of every process; `cpu_s()` is the
    CPU seconds all of them used so far. Config keys as SyntheticConfig.

    `balance` (default): the first process listens and hands accepted connections round-robin to
    every process (itself included), so C streams opened together are spread within one of
    C / processes; otherwise every process listens (SO_REUSEPORT), and the kernel's hash of each
    client port decides (32 streams on 7 processes: the busiest often serves 7-8, the average
    4.6). What the processes write and record is the same either way.

    The processes run asyncio's own event loop, not uvloop: uvloop's clock and timers count whole
    milliseconds (`loop.time()` is libuv's millisecond `uv_now`, a delay under 0.5 ms runs at
    once), so on it about a third of the messages of a 0.3 ms-gap stream went out early, up to
    1 ms before their due time; on asyncio's loop none is ever early."""

    def __init__(self, cores: list[int | None], balance: bool = True, **config: object):
        self.cores = list(cores)
        self.balance = balance
        self.config = {"record_sends": True, "keep_requests": False, "model": "synthetic", **config}
        self._ctx = mp.get_context("spawn")
        self._procs: list = []
        self._conns: list = []

    def _start(self, core: int | None, port: int, hand_to: list[socket.socket] | None = None,
               take_from: socket.socket | None = None) -> str:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_fleet_child, daemon=True,
                                 args=(core, port, self.config, child, hand_to, take_from))
        proc.start()
        self._procs.append(proc)
        self._conns.append(parent)
        if not parent.poll(60):
            raise RuntimeError("a synthetic server process did not start within 60 s")
        return parent.recv()

    def __enter__(self) -> str:
        pairs = ([socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) for _ in self.cores[1:]]
                 if self.balance else [])
        try:
            url = self._start(self.cores[0], 0, hand_to=[a for a, _ in pairs] or None)
            port = int(url.rsplit(":", 1)[1])
            for i, core in enumerate(self.cores[1:]):
                self._start(core, port, take_from=pairs[i][1] if pairs else None)
        finally:
            for pair in pairs:  # the children hold their own copies
                for end in pair:
                    end.close()
        return url

    def collect_each(self) -> list[Records]:
        """The ground-truth Records of each process (and clear them)."""
        for conn in self._conns:
            conn.send("collect")
        return [conn.recv() for conn in self._conns]

    def collect(self) -> Records:
        merged: Records = {}
        for records in self.collect_each():
            for prompt, recs in records.items():
                merged.setdefault(prompt, []).extend(recs)
        for recs in merged.values():
            recs.sort(key=lambda r: r[0])
        return merged

    def cpu_s(self) -> float:
        total = 0.0
        for conn in self._conns:
            conn.send("cpu")
        for conn in self._conns:
            total += conn.recv()
        return total

    def __exit__(self, *exc: object) -> None:
        for conn in self._conns:
            try:
                conn.send("stop")
            except (OSError, BrokenPipeError):
                pass
        for proc in self._procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join(5)


def main(argv: list[str] | None = None) -> None:
    """Serve in the foreground on `--port` (see the module docstring) until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ttft-ms", type=float, default=20.0)
    parser.add_argument("--gap-ms", type=float, default=10.0)
    parser.add_argument("--tokens-per-message", type=int, default=1)
    parser.add_argument("--served-model-name", default="synthetic")
    parser.add_argument("--no-fork-child", action="store_true", help="do not fork the socket-holding child")
    parser.add_argument("--ignore-sigterm", action="store_true", help="leader and child ignore SIGTERM (a hung "
                        "server: only SIGKILL stops it)")
    parser.add_argument("--diverge-after", type=int, default=None, help="a lossy speculative build: with "
                        "--speculative-config, outputs differ from token P on (see --diverge-share)")
    parser.add_argument("--diverge-share", type=float, default=0.0, help="the share of prompts that diverge")
    parser.add_argument("--speculative-config", default="", help="vLLM's flag: any value means speculating; "
                        "with `rejection_sample_method: synthetic` its `synthetic_acceptance_length` is forced "
                        "(and counted as vLLM's spec-decode counters, k = its num_speculative_tokens)")
    parser.add_argument("--spec-counters", action="store_true", help="with --speculative-config: count vLLM's "
                        "spec-decode counters (k = num_speculative_tokens; tau = tokens per message)")
    parser.add_argument("--per-request-spec-decode-metrics", default="", help="vLLM's flag: with a speculative "
                        "config and counters, the final usage chunk carries the request's spec-decode figures")
    parser.add_argument("--tau-by-prefix", default="", help="with --speculative-config and --spec-counters: "
                        "PREFIX=TAU,... forces the acceptance length of prompts starting with PREFIX")
    args, _engine_flags = parser.parse_known_args(argv)
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    sock.listen(128)
    if not args.no_fork_child and os.fork() == 0:  # the "worker" child: holds the socket, sleeps
        while True:
            time.sleep(3600)
    lossy = args.speculative_config and args.diverge_after is not None
    spec = json.loads(args.speculative_config) if args.speculative_config.startswith("{") else {}
    forced = spec.get("synthetic_acceptance_length") if spec.get("rejection_sample_method") == "synthetic" else None
    k = int(spec.get("num_speculative_tokens") or 1) if (forced is not None or args.spec_counters) and spec else 0
    cfg = SyntheticConfig(ttft_ms=args.ttft_ms, gap_ms=args.gap_ms, tokens_per_message=args.tokens_per_message,
                          model=args.served_model_name, diverge_after=args.diverge_after if lossy else None,
                          diverge_share=args.diverge_share if lossy else 0.0, spec_k=k,
                          forced_tau=float(forced) if forced is not None else None,
                          spec_metrics=bool(k and args.per_request_spec_decode_metrics),
                          tau_by_prefix={p: float(t) for p, t in (kv.split("=", 1) for kv in
                                                                  args.tau_by_prefix.split(",") if kv)} if k else {})
    server = SyntheticServer(cfg, sock=sock)
    server.start()
    print(f"synthetic server pid {os.getpid()} on {server.base_url}", flush=True)
    if not args.ignore_sigterm:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        signal.pause()


if __name__ == "__main__":
    main()
