"""Raw per-request event logs: what the load client saw, before any metric is computed.

Every draftboard metric is a pure function of these logs plus the run's window
(docs/MEASUREMENT.md, "Raw data first"), so they are stored with the run and a formula fix can
recompute old runs. Times are `time.perf_counter_ns()` integers (ns, monotonic, only meaningful
relative to each other within one process run).

In memory a request's messages are three numpy columns (`RequestLog.ev_t_ns`, `.ev_tokens`,
`.ev_kind`), not an object per message: a 10 000 x 2 000-token run is 20 M messages, which as
Python objects took 5 GB (issue 22); as columns it is 17 bytes per message. The metrics walk
them in chunks of requests (`LogChunks`; a stored blob is decoded one chunk at a time). `RequestLog.events`
still gives MessageEvent objects, built on each access, for code that wants them.

Stored form (`encode_logs`, FORMAT_VERSION 2): `MAGIC` then one zstandard frame holding a JSON
header (the per-request columns) and the per-message columns in binary: time deltas (first
message to the send time, later ones to the previous message), token counts and kind codes, each
in the narrowest little-endian integer type that holds it, byte-shuffled in blocks of
`_BLOCK_REQUESTS` requests (byte 0 of every value, then byte 1, ...: what zstandard compresses
best). All integers: the round trip is exact. Each request's prompt category (issue 33) is two
optional header entries, written only when some request has one: `categories` (the names, in
first-seen order) and `category` (per request, an index into them); a blob without them (every
blob written before) decodes with category "" for every request, and a reader that predates them
ignores them, so the format version stays 2. The older FORMAT_VERSION 1 blobs (zlib over JSON
columns, `encode_logs_v1`) still decode exactly: `decode_columns` reads both.
"""

from __future__ import annotations

import json
import struct
import warnings
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import zstandard

from benchkit.inflate import MAX_INFLATED_BYTES, InflateLimitError, inflate_zlib

#: Message kinds. `reasoning` and `content` messages may carry output tokens; a `usage` message
#: is the final usage-only message (empty `choices`) and carries none.
KINDS = ("reasoning", "content", "usage")

#: Version tag of the layout `encode_logs` writes; `decode_logs` reads this one and version 1.
FORMAT_VERSION = 2
#: The first bytes of a version-2 blob (a version-1 blob is zlib data: it starts with 0x78).
MAGIC = b"DBRL\x02"
#: zstandard level of `encode_logs` (measured by benchmarks/big_run.py: higher levels gain a few
#: per cent for several times the CPU).
ZSTD_LEVEL = 9
#: Requests per byte-shuffled block of a per-message column (bounds the encoder's scratch memory).
_BLOCK_REQUESTS = 256
#: Messages per chunk when a run's logs are walked in pieces (`LogChunks`, what the metrics do):
#: bounds the walker's scratch memory (tens of MB) whatever the run's size (issue 22).
CHUNK_EVENTS = 1 << 19

_KIND_CODE = {k: i for i, k in enumerate(KINDS)}
_EMPTY_I64 = np.zeros(0, np.int64)
_EMPTY_I8 = np.zeros(0, np.int8)


@dataclass
class MessageEvent:
    """One streamed message as it arrived.

    `t_ns`: arrival time (perf_counter_ns). `tokens`: output tokens this message carried (from
    the server's cumulative usage delta, else estimated from the text; see
    `RequestLog.tokens_from_text`). `kind`: one of KINDS. Raises ValueError on an unknown kind.
    """

    t_ns: int
    tokens: int
    kind: str = "content"

    def __post_init__(self) -> None:
        if self.kind not in _KIND_CODE:
            raise ValueError(f"MessageEvent.kind must be one of {KINDS}, got {self.kind!r}")


def _as_i64(values: Any) -> np.ndarray:
    """A 1-D int64 array of `values` (a buffer such as array('q') is wrapped without a copy)."""
    if isinstance(values, np.ndarray):
        return values if values.dtype == np.int64 else values.astype(np.int64)
    if isinstance(values, memoryview | bytes | bytearray) or hasattr(values, "typecode"):
        return np.frombuffer(values, dtype=np.int64) if len(values) else _EMPTY_I64
    return np.asarray(values, dtype=np.int64) if len(values) else _EMPTY_I64


class RequestLog:
    """Everything the client recorded for one request.

    `index`: position of the request's prompt in the run's prompt list (warmup first).
    `warmup`: sent before the measured window; counts nowhere. `send_ns`: when the request was
    sent. `events`: streamed messages in arrival order (a list of MessageEvent, built on each
    read from the columns below; assigning a list sets the columns). `ok`: the server answered
    2xx and the stream ended without an error (a 2xx with zero output tokens is still `ok` here;
    the metrics count it as failed). `error`: reason when not ok ("http 500: ...", "timeout after
    300.0 s", "transport: ..."). `prompt_tokens` / `completion_tokens`: the server's final
    `usage`, None when the server sent none. `tokens_from_text`: at least one message's token
    count was estimated from its text because the server sent no cumulative usage with it.
    `input_len` / `output_len`: the workload's intended lengths (tokens). `end_ns`: when the
    request finished (stream closed, error or timeout). `spec_steps`, `spec_draft_tokens`,
    `spec_accepted_tokens`, `spec_histogram`: the engine's per-request speculative-decoding
    figures where it returned them (`benchkit.measure.specrequests`), else None (unknown).
    `category`: the prompt's dataset category (benchkit.measure.datasets), "" where it has none.

    The messages themselves: `ev_t_ns` (int64 ns), `ev_tokens` (int64) and `ev_kind` (int8 code
    into KINDS), one entry per message; `set_columns` sets them without copying. Two logs are
    equal when every field and every message is.
    """

    __slots__ = ("index", "warmup", "send_ns", "ok", "error", "prompt_tokens", "completion_tokens",
                 "tokens_from_text", "input_len", "output_len", "end_ns", "spec_steps", "spec_draft_tokens",
                 "spec_accepted_tokens", "spec_histogram", "category", "ev_t_ns", "ev_tokens", "ev_kind")
    _FIELDS = __slots__[:16]

    def __init__(self, index: int, warmup: bool, send_ns: int, events: list[MessageEvent] | None = None,
                 ok: bool = True, error: str = "", prompt_tokens: int | None = None,
                 completion_tokens: int | None = None, tokens_from_text: bool = False, input_len: int = 0,
                 output_len: int = 0, end_ns: int = 0, spec_steps: int | None = None,
                 spec_draft_tokens: int | None = None, spec_accepted_tokens: int | None = None,
                 spec_histogram: list[int] | None = None, category: str = ""):
        self.index, self.warmup, self.send_ns, self.ok, self.error = index, warmup, send_ns, ok, error
        self.prompt_tokens, self.completion_tokens = prompt_tokens, completion_tokens
        self.tokens_from_text = tokens_from_text
        self.input_len, self.output_len, self.end_ns = input_len, output_len, end_ns
        self.spec_steps, self.spec_draft_tokens = spec_steps, spec_draft_tokens
        self.spec_accepted_tokens, self.spec_histogram = spec_accepted_tokens, spec_histogram
        self.category = category
        self.events = events or []

    @property
    def events(self) -> list[MessageEvent]:
        """The messages as MessageEvent objects (a new list on each read)."""
        return [MessageEvent(t, n, KINDS[k]) for t, n, k in
                zip(self.ev_t_ns.tolist(), self.ev_tokens.tolist(), self.ev_kind.tolist(), strict=True)]

    @events.setter
    def events(self, events: list[MessageEvent]) -> None:
        self.set_columns([e.t_ns for e in events], [e.tokens for e in events],
                         np.asarray([_KIND_CODE[e.kind] for e in events], dtype=np.int8))

    def set_columns(self, t_ns: Any, tokens: Any, kind: Any) -> None:
        """Set the messages from three equal-length columns: arrival times (ns) and token counts
        (int64 arrays or buffers of 8-byte integers such as array('q'), wrapped without a copy),
        kind codes (int8 array or a bytes-like of codes). Raises ValueError on unequal lengths or
        a kind code outside KINDS."""
        t, n = _as_i64(t_ns), _as_i64(tokens)
        k = (kind if isinstance(kind, np.ndarray) else np.frombuffer(bytes(kind), dtype=np.uint8)).astype(np.int8,
                                                                                                       copy=False)
        if not len(t) == len(n) == len(k):
            raise ValueError(f"request log {self.index}: message columns of lengths {len(t)}, {len(n)}, {len(k)}")
        if len(k) and (int(k.min()) < 0 or int(k.max()) >= len(KINDS)):
            raise ValueError(f"request log {self.index}: bad event kind code in {sorted(set(k.tolist()))}")
        self.ev_t_ns, self.ev_tokens, self.ev_kind = t, n, k

    @property
    def n_events(self) -> int:
        """How many messages the request received."""
        return len(self.ev_t_ns)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RequestLog):
            return NotImplemented
        return (all(getattr(self, f) == getattr(other, f) for f in self._FIELDS)
                and np.array_equal(self.ev_t_ns, other.ev_t_ns) and np.array_equal(self.ev_tokens, other.ev_tokens)
                and np.array_equal(self.ev_kind, other.ev_kind))

    __hash__ = None  # type: ignore[assignment]  # mutable, like the dataclass it replaced

    def __repr__(self) -> str:
        fields = ", ".join(f"{f}={getattr(self, f)!r}" for f in self._FIELDS)
        return f"RequestLog({fields}, n_events={self.n_events})"

    def __getstate__(self) -> dict[str, Any]:
        return {s: getattr(self, s) for s in self.__slots__}

    def __setstate__(self, state: dict[str, Any]) -> None:
        object.__setattr__(self, "category", "")  # a log pickled before the field existed
        for s, v in state.items():
            object.__setattr__(self, s, v)


#: Per-request columns added after FORMAT_VERSION 1 was first written: optional in a blob (an
#: older blob has none: every value None), each a list of int | None (the histogram: list | None).
_SPEC_COLUMNS = ("spec_steps", "spec_draft_tokens", "spec_accepted_tokens", "spec_histogram")

_COLUMNS = (
    "index",
    "warmup",
    "send_ns",
    "ok",
    "error",
    "prompt_tokens",
    "completion_tokens",
    "tokens_from_text",
    "input_len",
    "output_len",
    "end_dns",
    "n_events",
    "ev_dt_ns",
    "ev_tokens",
    "ev_kind",
)
#: The per-request columns (the first 12), kept in a version-2 blob's JSON header.
_REQUEST_COLUMNS = _COLUMNS[:12]
#: The per-message columns, binary in a version-2 blob.
_EVENT_COLUMNS = _COLUMNS[12:]


def _request_doc(logs: list[RequestLog]) -> dict[str, list]:
    """The per-request columns of `logs` (JSON-ready lists), spec columns only when some request has one."""
    doc: dict[str, list] = {
        "index": [log.index for log in logs], "warmup": [int(log.warmup) for log in logs],
        "send_ns": [log.send_ns for log in logs], "ok": [int(log.ok) for log in logs],
        "error": [log.error for log in logs], "prompt_tokens": [log.prompt_tokens for log in logs],
        "completion_tokens": [log.completion_tokens for log in logs],
        "tokens_from_text": [int(log.tokens_from_text) for log in logs],
        "input_len": [log.input_len for log in logs], "output_len": [log.output_len for log in logs],
        "end_dns": [log.end_ns - log.send_ns for log in logs], "n_events": [log.n_events for log in logs],
    }
    if any(getattr(log, c) is not None for log in logs for c in _SPEC_COLUMNS):
        doc.update({c: [getattr(log, c) for log in logs] for c in _SPEC_COLUMNS})
    if any(log.category for log in logs):
        names, codes = category_codes([log.category for log in logs])
        doc.update(categories=names, category=codes.tolist())
    return doc


def category_codes(categories: list[str]) -> tuple[list[str], np.ndarray]:
    """(names in first-seen order, int32 index into them per entry) of a list of categories."""
    index: dict[str, int] = {}
    codes = np.asarray([index.setdefault(c, len(index)) for c in categories], dtype=np.int32)
    return list(index), codes


def encode_logs_v1(logs: list[RequestLog]) -> bytes:
    """Encode request logs in the old FORMAT_VERSION 1 layout (zlib level 9 over JSON column
    arrays), kept to test that old blobs still decode and to measure the change (benchmarks/big_run.py).

    One JSON object with `v` (1) and the columns in `_COLUMNS`; per-event columns are
    concatenated over requests in order, `n_events` says how many belong to each. Event times
    are deltas (first event to `send_ns`, later ones to the previous event) and `end_ns` is
    `end_dns = end_ns - send_ns`. The `_SPEC_COLUMNS` are written only when some request has a
    value. Builds Python lists of every event: memory grows ~100 bytes per event."""
    doc: dict[str, Any] = {"v": 1, **_request_doc(logs)}
    spec = {c: doc.pop(c) for c in (*_SPEC_COLUMNS, "categories", "category") if c in doc}
    doc["ev_dt_ns"] = [d for log in logs for d in _deltas(log).tolist()]
    doc["ev_tokens"] = [n for log in logs for n in log.ev_tokens.tolist()]
    doc["ev_kind"] = [k for log in logs for k in log.ev_kind.tolist()]
    doc.update(spec)
    return zlib.compress(json.dumps(doc, separators=(",", ":")).encode("utf-8"), 9)


def _deltas(log: RequestLog) -> np.ndarray:
    """A request's message times as deltas: the first to its send time, later ones to the previous message."""
    t = log.ev_t_ns
    return np.diff(t, prepend=np.int64(log.send_ns)) if len(t) else _EMPTY_I64


def _narrowest(lo: int, hi: int) -> str:
    """The narrowest little-endian signed integer dtype holding lo..hi."""
    for dt in ("<i1", "<i2", "<i4"):
        info = np.iinfo(np.dtype(dt))
        if info.min <= lo and hi <= info.max:
            return dt
    return "<i8"


def _shuffle(values: np.ndarray) -> bytes:
    """Byte-shuffle a 1-D array: byte 0 of every value, then byte 1, ... (inverse: `_unshuffle`)."""
    width = values.dtype.itemsize
    return values.view(np.uint8).reshape(-1, width).T.tobytes() if width > 1 else values.tobytes()


def _unshuffle(raw: memoryview, count: int, dtype: np.dtype) -> np.ndarray:
    width = dtype.itemsize
    b = np.frombuffer(raw, dtype=np.uint8, count=count * width)
    if width > 1:
        b = np.ascontiguousarray(b.reshape(width, count).T)
    return b.view(dtype).reshape(count)


def encode_logs(logs: list[RequestLog], level: int = ZSTD_LEVEL) -> bytes:
    """Encode request logs into compact bytes (FORMAT_VERSION 2; see the module docstring).

    Layout: `MAGIC`, then a zstandard frame of: a little-endian u32 header length, the header
    (JSON: `v`, `n_events_total`, `block`, `dtypes` {column: numpy dtype string} and the
    per-request columns `_REQUEST_COLUMNS`, plus `_SPEC_COLUMNS` when some request has a
    value), then each of `_EVENT_COLUMNS` in turn (`ev_dt_ns`: message time deltas as in
    version 1; `ev_tokens`; `ev_kind`), in blocks of `block` requests, each block byte-shuffled.
    Streams: the scratch memory is one block, not the run. `level`: zstandard level.
    Inverse: `decode_logs` / `decode_columns`.
    """
    header: dict[str, Any] = {"v": FORMAT_VERSION, **_request_doc(logs)}
    getters = {"ev_dt_ns": _deltas, "ev_tokens": lambda log: log.ev_tokens, "ev_kind": lambda log: log.ev_kind}
    dtypes: dict[str, str] = {}
    for col, get in getters.items():
        lo = hi = 0
        for log in logs:
            v = get(log)
            if len(v):
                lo, hi = min(lo, int(v.min())), max(hi, int(v.max()))
        dtypes[col] = _narrowest(lo, hi)
    header.update(n_events_total=sum(header["n_events"]), block=_BLOCK_REQUESTS, dtypes=dtypes)
    head = msgspec.json.encode(header)
    comp = zstandard.ZstdCompressor(level=level).compressobj()
    out = [MAGIC, comp.compress(struct.pack("<I", len(head)) + head)]
    for col, get in getters.items():
        dtype = np.dtype(dtypes[col])
        for b0 in range(0, len(logs), _BLOCK_REQUESTS):
            parts = [get(log) for log in logs[b0:b0 + _BLOCK_REQUESTS]]
            parts = [p for p in parts if len(p)]
            if parts:
                out.append(comp.compress(_shuffle(np.concatenate(parts).astype(dtype))))
    out.append(comp.flush())
    return b"".join(out)


@dataclass
class LogColumns:
    """Request logs as numpy columns: what `encode_logs` stores, with event times made absolute.

    Per request (length R, in list order): `index`, `warmup`, `send_ns`, `ok`, `error` (a list of
    str), `prompt_tokens` / `completion_tokens` (int64; meaningful where `prompt_known` /
    `completion_known`, the server's `usage` was sent), `tokens_from_text`, `input_len`,
    `output_len`, `end_ns`, `n_events`, `spec` (None, or {spec column: list of values per
    request}, see `_SPEC_COLUMNS`), `category` (None: no request has one; else int32 index per
    request into `categories`, the names). Per event (length E, requests concatenated in order,
    each request's events in arrival order): `t_ns` (int64, perf_counter_ns), `tokens` (int64)
    and `kind` (int8 code: index into KINDS). The metrics (benchkit.measure.metrics) are computed
    on these columns without building an object per event; `to_logs()` gives the RequestLogs.
    """

    index: np.ndarray
    warmup: np.ndarray
    send_ns: np.ndarray
    ok: np.ndarray
    error: list[str]
    prompt_tokens: np.ndarray
    prompt_known: np.ndarray
    completion_tokens: np.ndarray
    completion_known: np.ndarray
    tokens_from_text: np.ndarray
    input_len: np.ndarray
    output_len: np.ndarray
    end_ns: np.ndarray
    n_events: np.ndarray
    t_ns: np.ndarray
    tokens: np.ndarray
    kind: np.ndarray
    spec: dict[str, list] | None = None
    category: np.ndarray | None = None
    categories: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.index)

    def category_names(self) -> list[str]:
        """Each request's category ("" where none), in list order."""
        if self.category is None:
            return [""] * len(self.index)
        return [self.categories[int(c)] for c in self.category]

    def select(self, mask: np.ndarray) -> LogColumns:
        """The LogColumns of the requests where boolean `mask` (length R) is True, in list order
        (message columns copied for those requests)."""
        mask = np.asarray(mask, dtype=bool)
        keep = np.flatnonzero(mask)
        ev = np.repeat(mask, self.n_events)
        return LogColumns(
            index=self.index[keep], warmup=self.warmup[keep], send_ns=self.send_ns[keep], ok=self.ok[keep],
            error=[self.error[i] for i in keep.tolist()], prompt_tokens=self.prompt_tokens[keep],
            prompt_known=self.prompt_known[keep], completion_tokens=self.completion_tokens[keep],
            completion_known=self.completion_known[keep], tokens_from_text=self.tokens_from_text[keep],
            input_len=self.input_len[keep], output_len=self.output_len[keep], end_ns=self.end_ns[keep],
            n_events=self.n_events[keep], t_ns=self.t_ns[ev], tokens=self.tokens[ev], kind=self.kind[ev],
            spec={c: [v[i] for i in keep.tolist()] for c, v in self.spec.items()} if self.spec else None,
            category=None if self.category is None else self.category[keep], categories=list(self.categories))

    def slice(self, a: int, b: int) -> LogColumns:
        """The LogColumns of requests [a, b) (per-event columns are views, no copy)."""
        ends = np.cumsum(self.n_events)
        e0 = int(ends[a - 1]) if a > 0 else 0
        e1 = int(ends[b - 1]) if b > a else e0
        return LogColumns(
            index=self.index[a:b], warmup=self.warmup[a:b], send_ns=self.send_ns[a:b], ok=self.ok[a:b],
            error=self.error[a:b], prompt_tokens=self.prompt_tokens[a:b], prompt_known=self.prompt_known[a:b],
            completion_tokens=self.completion_tokens[a:b], completion_known=self.completion_known[a:b],
            tokens_from_text=self.tokens_from_text[a:b], input_len=self.input_len[a:b],
            output_len=self.output_len[a:b], end_ns=self.end_ns[a:b], n_events=self.n_events[a:b],
            t_ns=self.t_ns[e0:e1], tokens=self.tokens[e0:e1], kind=self.kind[e0:e1],
            spec={c: v[a:b] for c, v in self.spec.items()} if self.spec else None,
            category=None if self.category is None else self.category[a:b], categories=list(self.categories))

    def to_logs(self) -> list[RequestLog]:
        """The same logs as RequestLog objects (the inverse of `columns_of`); each log's message
        columns are views into this object's arrays (no object per message)."""
        ends = np.cumsum(self.n_events).tolist()
        names = self.category_names()
        logs, pos = [], 0
        for i, end in enumerate(ends):
            log = RequestLog(
                index=int(self.index[i]), warmup=bool(self.warmup[i]), send_ns=int(self.send_ns[i]),
                ok=bool(self.ok[i]), error=self.error[i],
                prompt_tokens=int(self.prompt_tokens[i]) if self.prompt_known[i] else None,
                completion_tokens=int(self.completion_tokens[i]) if self.completion_known[i] else None,
                tokens_from_text=bool(self.tokens_from_text[i]), input_len=int(self.input_len[i]),
                output_len=int(self.output_len[i]), end_ns=int(self.end_ns[i]),
                **({c: self.spec[c][i] for c in _SPEC_COLUMNS} if self.spec else {}), category=names[i])
            log.ev_t_ns, log.ev_tokens, log.ev_kind = self.t_ns[pos:end], self.tokens[pos:end], self.kind[pos:end]
            pos = end
            logs.append(log)
        return logs


def _i64(values: list) -> np.ndarray:
    return np.asarray(values, dtype=np.int64) if values else np.zeros(0, np.int64)


def _optional(values: list) -> tuple[np.ndarray, np.ndarray]:
    """(int64 values with 0 for None, known mask) of a column that may hold None."""
    known = np.asarray([v is not None for v in values], dtype=bool)
    return _i64([0 if v is None else v for v in values]), known


def _concat(arrays: list[np.ndarray], empty: np.ndarray) -> np.ndarray:
    arrays = [a for a in arrays if len(a)]
    return np.concatenate(arrays) if arrays else empty


def columns_of(logs: list[RequestLog]) -> LogColumns:
    """The LogColumns of `logs` (the message columns concatenated; no object per message)."""
    prompt, prompt_known = _optional([log.prompt_tokens for log in logs])
    completion, completion_known = _optional([log.completion_tokens for log in logs])
    names, codes = category_codes([log.category for log in logs])
    has_category = any(names)
    return LogColumns(
        index=_i64([log.index for log in logs]), warmup=np.asarray([log.warmup for log in logs], dtype=bool),
        send_ns=_i64([log.send_ns for log in logs]), ok=np.asarray([log.ok for log in logs], dtype=bool),
        error=[log.error for log in logs], prompt_tokens=prompt, prompt_known=prompt_known,
        completion_tokens=completion, completion_known=completion_known,
        tokens_from_text=np.asarray([log.tokens_from_text for log in logs], dtype=bool),
        input_len=_i64([log.input_len for log in logs]), output_len=_i64([log.output_len for log in logs]),
        end_ns=_i64([log.end_ns for log in logs]), n_events=_i64([log.n_events for log in logs]),
        t_ns=_concat([log.ev_t_ns for log in logs], _EMPTY_I64),
        tokens=_concat([log.ev_tokens for log in logs], _EMPTY_I64),
        kind=_concat([log.ev_kind for log in logs], _EMPTY_I8),
        spec=({c: [getattr(log, c) for log in logs] for c in _SPEC_COLUMNS}
              if any(getattr(log, c) is not None for log in logs for c in _SPEC_COLUMNS) else None),
        category=codes if has_category else None, categories=names if has_category else [])


def _parse_v1(data: bytes) -> dict[str, Any]:
    """The column document of a version-1 blob (zlib JSON), event columns as numpy arrays. The
    JSON is decompressed to at most MAX_INFLATED_BYTES (InflateLimitError beyond it)."""
    try:
        text = inflate_zlib(data, "request logs", MAX_INFLATED_BYTES, "MAX_INFLATED_BYTES")
    except zlib.error as exc:
        raise ValueError(f"request logs: not an encoded log blob ({exc})") from exc
    fast = _parse_v1_columns(text)
    if fast is not None:
        return fast
    try:
        # msgspec parses the same JSON about 3x faster than the json module (recompute decodes
        # every stored run); it also rejects invalid UTF-8.
        doc = msgspec.json.decode(text)
    except msgspec.DecodeError as exc:
        raise ValueError(f"request logs: not an encoded log blob ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("v") != 1:
        version = doc.get("v") if isinstance(doc, dict) else None
        raise ValueError(f"request logs: unsupported format version {version!r} (expected 1 or {FORMAT_VERSION})")
    missing = [c for c in _COLUMNS if not isinstance(doc.get(c), list)]
    if missing:
        raise ValueError(f"request logs: missing column(s) {', '.join(missing)}")
    n_ev = sum(doc["n_events"]) if all(isinstance(x, int) for x in doc["n_events"]) else -1
    for c in _EVENT_COLUMNS:
        if len(doc[c]) != n_ev:
            raise ValueError(f"request logs: column {c!r} has {len(doc[c])} entries, expected {n_ev}")
    kinds = np.asarray(doc["ev_kind"]) if n_ev else _EMPTY_I8
    if kinds.dtype.kind not in "iub":
        j, code = next((j, c) for j, c in enumerate(doc["ev_kind"]) if not isinstance(c, int))
        raise ValueError(f"request logs: request {_request_of(doc['n_events'], j)}: bad event kind code {code!r}")
    doc["ev_dt_ns"], doc["ev_tokens"], doc["ev_kind"] = _i64(doc["ev_dt_ns"]), _i64(doc["ev_tokens"]), kinds
    return doc


_INT_TEXT = b"0123456789-, \t\n\r"
_I64 = np.iinfo(np.int64)


def _int_column(raw: msgspec.Raw) -> np.ndarray | None:
    """A JSON array of integers parsed straight into int64 (no Python int per value); None when
    it is anything else (then the full parse gives the same values or the same error)."""
    text = bytes(raw).strip()
    if not (text.startswith(b"[") and text.endswith(b"]")):
        return None
    inner = text[1:-1].strip()
    del text
    if not inner:
        return _EMPTY_I64
    if inner.translate(None, _INT_TEXT) or b",," in inner or inner.startswith(b",") or inner.endswith(b","):
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            values = np.fromstring(inner, dtype=np.int64, sep=",")
    except (ValueError, DeprecationWarning):
        return None
    if values.size != inner.count(b",") + 1 or (values.size and (values.max() == _I64.max or values.min() == _I64.min)):
        return None  # unparsed text, or a value outside int64 (saturated): the full parse decides
    return values


def _parse_v1_columns(text: bytes) -> dict[str, Any] | None:
    """`_parse_v1` of a well-formed version-1 document with its per-message columns parsed
    straight into numpy (a 20 M-message run's lists of Python ints took gigabytes); None for any
    document this does not vouch for (the full parse then gives its figures or its error)."""
    try:
        raw = msgspec.json.decode(text, type=dict[str, msgspec.Raw])
        doc = {k: msgspec.json.decode(v) for k, v in raw.items() if k not in _EVENT_COLUMNS}
    except msgspec.DecodeError:
        return None
    if doc.get("v") != 1 or any(c not in raw for c in _EVENT_COLUMNS):
        return None
    if any(not isinstance(doc.get(c), list) for c in _REQUEST_COLUMNS):
        return None
    if not all(type(x) is int for x in doc["n_events"]):
        return None
    n_ev = sum(doc["n_events"])
    for c in _EVENT_COLUMNS:
        values = _int_column(raw.pop(c))
        if values is None or len(values) != n_ev:
            return None
        doc[c] = values
    if not n_ev:
        doc["ev_kind"] = _EMPTY_I8
    return doc


def _read_into(reader, view: memoryview) -> int:
    """Fill `view` from the zstandard stream reader; how many bytes it held (fewer at its end)."""
    got = 0
    while got < len(view):
        n = reader.readinto(view[got:])
        if not n:
            break
        got += n
    return got


def _open_v2(data: bytes) -> tuple[dict[str, Any], memoryview, dict[str, np.dtype], int, np.ndarray, int]:
    """(header document, decompressed frame, event column dtypes, block, messages per request,
    where the event columns start in the frame) of a version-2 blob, header and sizes checked.

    Bounded: the frame is decompressed as a stream, the header first; the size the header implies
    (4 + header + messages x column widths) must be at most MAX_INFLATED_BYTES (1 GiB,
    benchkit.inflate; else InflateLimitError) and exactly that many bytes are decompressed into
    one buffer, one byte more meaning the frame is longer than its header says (refused without
    reading further)."""
    limit, name = MAX_INFLATED_BYTES, "MAX_INFLATED_BYTES"
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(memoryview(data)[len(MAGIC):], read_across_frames=False)
        (n_head,) = struct.unpack("<I", reader.read(4))
        if 4 + n_head > limit:
            raise InflateLimitError("request logs", limit, name)
        head = reader.read(n_head)
        if len(head) != n_head:
            raise struct.error(f"the header is {len(head)} bytes, its length says {n_head}")
        doc = msgspec.json.decode(head)
    except (zstandard.ZstdError, struct.error, msgspec.DecodeError) as exc:
        raise ValueError(f"request logs: not an encoded log blob ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("v") != FORMAT_VERSION:
        version = doc.get("v") if isinstance(doc, dict) else None
        raise ValueError(f"request logs: unsupported format version {version!r} (expected 1 or {FORMAT_VERSION})")
    missing = [c for c in _REQUEST_COLUMNS if not isinstance(doc.get(c), list)]
    if missing:
        raise ValueError(f"request logs: missing column(s) {', '.join(missing)}")
    try:
        dtypes = {c: np.dtype(doc["dtypes"][c]) for c in _EVENT_COLUMNS}
        block, n_ev = int(doc["block"]), int(doc["n_events_total"])
        counts = _i64(doc["n_events"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"request logs: bad header ({exc!r})") from exc
    if block < 1 or n_ev < 0 or counts.sum() != n_ev or any(d.kind != "i" for d in dtypes.values()):
        raise ValueError("request logs: bad header (block, event count or column types)")
    need = 4 + n_head + n_ev * sum(d.itemsize for d in dtypes.values())
    if need > limit:
        raise InflateLimitError("request logs", limit, name)
    buf = bytearray(need)
    raw = memoryview(buf)
    raw[:4], raw[4:4 + n_head] = struct.pack("<I", n_head), head
    del head
    try:
        got = 4 + n_head + _read_into(reader, raw[4 + n_head:])
        extra = reader.read(1)
    except zstandard.ZstdError as exc:
        raise ValueError(f"request logs: not an encoded log blob ({exc})") from exc
    if got != need or extra:
        have = f"more than {need}" if extra else str(got)
        raise ValueError(f"request logs: {have} bytes of columns, expected {need}")
    return doc, raw, dtypes, block, counts, 4 + n_head


def _parse_v2(data: bytes) -> dict[str, Any]:
    """The column document of a version-2 blob (MAGIC + zstandard), event columns as numpy arrays."""
    doc, raw, dtypes, block, counts, pos = _open_v2(data)
    per_block = [int(counts[b:b + block].sum()) for b in range(0, len(counts), block)]
    for c in _EVENT_COLUMNS:
        dtype, parts = dtypes[c], []
        for count in per_block:
            if count:
                parts.append(_unshuffle(raw[pos:], count, dtype))
                pos += count * dtype.itemsize
        doc[c] = _concat(parts, np.zeros(0, dtype)).astype(np.int64 if c != "ev_kind" else np.int8)
    return doc


def _request_of(n_events: list, j: int) -> int:
    return int(np.searchsorted(np.cumsum(n_events), j, side="right"))


def _request_part(doc: dict[str, Any]) -> dict[str, Any]:
    """The per-request LogColumns fields of a column document (lengths checked)."""
    n = len(doc["index"])
    for c in _REQUEST_COLUMNS:
        if len(doc[c]) != n:
            raise ValueError(f"request logs: column {c!r} has {len(doc[c])} entries, expected {n}")
    send = _i64(doc["send_ns"])
    prompt, prompt_known = _optional(doc["prompt_tokens"])
    completion, completion_known = _optional(doc["completion_tokens"])
    spec = None
    if any(c in doc for c in _SPEC_COLUMNS):
        bad = [c for c in _SPEC_COLUMNS if not isinstance(doc.get(c), list) or len(doc[c]) != n]
        if bad:
            raise ValueError(f"request logs: column(s) {', '.join(bad)} missing or not {n} entries")
        spec = {c: doc[c] for c in _SPEC_COLUMNS}
    category, categories = None, []
    if "category" in doc or "categories" in doc:
        names, codes = doc.get("categories"), doc.get("category")
        if (not isinstance(names, list) or not all(isinstance(x, str) for x in names) or not isinstance(codes, list)
                or len(codes) != n or not all(type(x) is int and 0 <= x < len(names) for x in codes)):
            raise ValueError(f"request logs: bad category columns (names {str(names)[:80]}, {n} index(es) into them "
                             "expected)")
        category, categories = np.asarray(codes, dtype=np.int32), list(names)
    return dict(
        index=_i64(doc["index"]), warmup=np.asarray(doc["warmup"], dtype=bool), send_ns=send,
        ok=np.asarray(doc["ok"], dtype=bool), error=list(doc["error"]), prompt_tokens=prompt,
        prompt_known=prompt_known, completion_tokens=completion, completion_known=completion_known,
        tokens_from_text=np.asarray(doc["tokens_from_text"], dtype=bool), input_len=_i64(doc["input_len"]),
        output_len=_i64(doc["output_len"]), end_ns=send + _i64(doc["end_dns"]), n_events=_i64(doc["n_events"]),
        spec=spec, category=category, categories=categories)


def _check_kinds(kinds: np.ndarray, n_events: Any, offset: int = 0) -> None:
    """Raise ValueError naming the request of the first kind code outside KINDS (`offset`: the
    messages before `kinds` in the run)."""
    if len(kinds) and (kinds.min() < 0 or kinds.max() >= len(KINDS)):
        j = int(np.flatnonzero((kinds < 0) | (kinds >= len(KINDS)))[0])
        raise ValueError(f"request logs: request {_request_of(n_events, offset + j)}: bad event kind code "
                         f"{int(kinds[j])!r}")


def _absolute(dt: np.ndarray, send: np.ndarray, n_events: np.ndarray) -> np.ndarray:
    """Absolute message times: each request's deltas summed from its send time (integers: exact)."""
    if not len(dt):
        return _EMPTY_I64
    req_of = np.repeat(np.arange(len(send)), n_events)
    cum = np.cumsum(dt)
    before = np.concatenate(([0], cum))[np.cumsum(n_events) - n_events]  # sum of earlier requests' deltas
    return send[req_of] + cum - before[req_of]


def decode_columns(data: bytes) -> LogColumns:
    """Decode bytes written by `encode_logs` (version 2) or by the older `encode_logs_v1`
    (version 1) into LogColumns (no object per event).

    Raises ValueError naming the problem when the bytes are neither a zstandard blob with MAGIC
    nor zlib JSON, of an unknown format version, when a column is missing or has the wrong
    length, or an event kind code is unknown.
    """
    data = bytes(data)
    doc = _parse_v2(data) if data.startswith(MAGIC) else _parse_v1(data)
    req = _request_part(doc)
    kinds = doc["ev_kind"]
    _check_kinds(kinds, doc["n_events"])
    t_ns = _absolute(doc["ev_dt_ns"], req["send_ns"], req["n_events"])
    return LogColumns(**req, t_ns=t_ns, tokens=doc["ev_tokens"], kind=kinds.astype(np.int8))


def _spans(counts: Any, max_events: int) -> list[tuple[int, int]]:
    """Consecutive [a, b) ranges of `counts` (messages per item) of at most `max_events` messages
    each; an item with more is a range of its own."""
    spans, a, acc = [], 0, 0
    for i, n in enumerate(np.asarray(counts, dtype=np.int64).tolist()):
        if i > a and acc + n > max_events:
            spans.append((a, i))
            a, acc = i, 0
        acc += n
    if a < len(counts):
        spans.append((a, len(counts)))
    return spans


def _request_slice(req: dict[str, Any], a: int, b: int) -> dict[str, Any]:
    """Requests [a, b) of `_request_part`'s fields."""
    out = {}
    for f, v in req.items():
        if f == "spec":
            out[f] = {c: x[a:b] for c, x in v.items()} if v else None
        elif f == "categories":
            out[f] = list(v)
        else:
            out[f] = None if v is None else v[a:b]
    return out


class LogChunks:
    """A run's request logs walked in chunks of consecutive requests, in order, each chunk a
    LogColumns of at most about `max_events` messages (default CHUNK_EVENTS; a request with
    more is a chunk of its own); iterable any number of times. What the metrics walk
    (benchkit.measure.metrics) so that their scratch memory is one chunk, not the run.

    `LogChunks(logs)`: RequestLogs (each chunk's message columns are copied when it is reached)
    or LogColumns (chunks are views). `LogChunks.decode(data)`: an encoded blob; a version-2 blob
    is decompressed once (about 6 bytes per message here) and each chunk's messages are decoded
    when it is reached, so the run's messages are never held as int64 columns; a version-1 blob's
    columns are parsed whole (straight into numpy where the JSON is plain integer arrays) and
    each chunk's absolute times computed when it is reached. Raises ValueError as decode_columns
    does (for a version-2 blob, a bad kind code when its chunk is reached).
    """

    def __init__(self, logs: list[RequestLog] | LogColumns, max_events: int | None = None):
        self._logs: list[RequestLog] | LogColumns | None = logs
        self._blob: tuple | None = None
        self._v1: tuple | None = None
        counts = logs.n_events if isinstance(logs, LogColumns) else [log.n_events for log in logs]
        self._n = len(counts)
        self.spans = _spans(counts, max_events or CHUNK_EVENTS)

    @classmethod
    def decode(cls, data: bytes, max_events: int | None = None) -> LogChunks:
        """The chunks of an encoded blob (`encode_logs` or `encode_logs_v1`); see the class docstring."""
        self = cls.__new__(cls)
        self._logs, self._blob, self._v1 = None, None, None
        if not bytes(data[:len(MAGIC)]) == MAGIC:  # version 1: the columns at once, times made absolute per chunk
            doc = _parse_v1(bytes(data))
            req = _request_part(doc)
            _check_kinds(doc["ev_kind"], doc["n_events"])
            self._n = len(req["index"])
            self.spans = _spans(req["n_events"], max_events or CHUNK_EVENTS)
            ends = np.concatenate(([0], np.cumsum(req["n_events"]))).tolist()
            self._v1 = (req, doc["ev_dt_ns"], doc["ev_tokens"], doc["ev_kind"].astype(np.int8), ends)
            return self
        doc, raw, dtypes, block, counts, pos = _open_v2(data)
        req = _request_part(doc)
        self._n = len(counts)
        block_counts = [int(counts[b:b + block].sum()) for b in range(0, len(counts), block)]
        ev_before = np.concatenate(([0], np.cumsum(block_counts))).astype(np.int64).tolist()
        bases, at = {}, pos
        for c in _EVENT_COLUMNS:
            bases[c] = at
            at += int(counts.sum()) * dtypes[c].itemsize
        self.spans = [(k0 * block, min(k1 * block, self._n), k0, k1)
                      for k0, k1 in _spans(block_counts, max_events or CHUNK_EVENTS)]
        self._blob = (req, raw, dtypes, bases, block_counts, ev_before, counts)
        return self

    def __len__(self) -> int:
        """How many requests."""
        return self._n

    def __iter__(self) -> Iterator[LogColumns]:
        if self._blob is not None:
            for a, b, k0, k1 in self.spans:
                yield self._decode_span(a, b, k0, k1)
            return
        if self._v1 is not None:
            req, dt, tokens, kinds, ends = self._v1
            for a, b in self.spans:
                part = _request_slice(req, a, b)
                e0, e1 = ends[a], ends[b]
                yield LogColumns(**part, t_ns=_absolute(dt[e0:e1], part["send_ns"], part["n_events"]),
                                 tokens=tokens[e0:e1], kind=kinds[e0:e1])
            return
        logs = self._logs
        for a, b in self.spans:
            yield logs.slice(a, b) if isinstance(logs, LogColumns) else columns_of(logs[a:b])

    def _decode_span(self, a: int, b: int, k0: int, k1: int) -> LogColumns:
        req, raw, dtypes, bases, block_counts, ev_before, counts = self._blob
        cols = {}
        for c in _EVENT_COLUMNS:
            dtype, parts = dtypes[c], []
            for k in range(k0, k1):
                if block_counts[k]:
                    at = bases[c] + ev_before[k] * dtype.itemsize
                    parts.append(_unshuffle(raw[at:], block_counts[k], dtype))
            cols[c] = _concat(parts, np.zeros(0, dtype)).astype(np.int64 if c != "ev_kind" else np.int8)
        _check_kinds(cols["ev_kind"], counts, ev_before[k0])
        part = _request_slice(req, a, b)
        return LogColumns(**part, t_ns=_absolute(cols["ev_dt_ns"], part["send_ns"], part["n_events"]),
                          tokens=cols["ev_tokens"], kind=cols["ev_kind"])


def decode_logs(data: bytes) -> list[RequestLog]:
    """Decode bytes written by `encode_logs` (or `encode_logs_v1`) back into the identical list
    of RequestLog.

    Raises ValueError as `decode_columns` does.
    """
    return decode_columns(data).to_logs()
