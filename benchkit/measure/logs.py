"""Raw per-request event logs: what the load client saw, before any metric is computed.

Every draftboard metric is a pure function of these logs plus the run's window
(docs/MEASUREMENT.md, "Raw data first"), so they are stored with the run and a formula fix can
recompute old runs. Times are `time.perf_counter_ns()` integers (ns, monotonic, only meaningful
relative to each other within one process run).

The stored form (`encode_logs`) is zlib-compressed JSON of column arrays, with every time kept
as an integer delta (event times relative to the previous event, the first to the send time;
end time relative to the send time), so the round trip is exact.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field

import msgspec
import numpy as np

#: Message kinds. `reasoning` and `content` messages may carry output tokens; a `usage` message
#: is the final usage-only message (empty `choices`) and carries none.
KINDS = ("reasoning", "content", "usage")

#: Version tag of the encoded layout; `decode_logs` refuses others.
FORMAT_VERSION = 1

_KIND_CODE = {k: i for i, k in enumerate(KINDS)}


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


@dataclass
class RequestLog:
    """Everything the client recorded for one request.

    `index`: position of the request's prompt in the run's prompt list (warmup first).
    `warmup`: sent before the measured window; counts nowhere. `send_ns`: when the request was
    sent. `events`: streamed messages in arrival order. `ok`: the server answered 2xx and the
    stream ended without an error (a 2xx with zero output tokens is still `ok` here; the metrics
    count it as failed). `error`: reason when not ok ("http 500: ...", "timeout after 300.0 s",
    "transport: ..."). `prompt_tokens` / `completion_tokens`: the server's final `usage`, None
    when the server sent none. `tokens_from_text`: at least one message's token count was
    estimated from its text because the server sent no cumulative usage with it.
    `input_len` / `output_len`: the workload's intended lengths (tokens). `end_ns`: when the
    request finished (stream closed, error or timeout). `spec_steps`, `spec_draft_tokens`,
    `spec_accepted_tokens`, `spec_histogram`: the engine's per-request speculative-decoding
    figures where it returned them (`benchkit.measure.specrequests`), else None (unknown).
    """

    index: int
    warmup: bool
    send_ns: int
    events: list[MessageEvent] = field(default_factory=list)
    ok: bool = True
    error: str = ""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    tokens_from_text: bool = False
    input_len: int = 0
    output_len: int = 0
    end_ns: int = 0
    spec_steps: int | None = None
    spec_draft_tokens: int | None = None
    spec_accepted_tokens: int | None = None
    spec_histogram: list[int] | None = None


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


def encode_logs(logs: list[RequestLog]) -> bytes:
    """Encode request logs into compact bytes (zlib level 9 over JSON column arrays).

    Layout (FORMAT_VERSION 1): one JSON object with `v` and the columns in `_COLUMNS`; per-event
    columns are concatenated over requests in order, `n_events` says how many belong to each.
    Event times are stored as deltas (first event to `send_ns`, later ones to the previous
    event) and `end_ns` as `end_dns = end_ns - send_ns`. The `_SPEC_COLUMNS` are written only
    when some request has a value. Inverse: `decode_logs`.
    """
    cols: dict[str, list] = {c: [] for c in _COLUMNS}
    for log in logs:
        cols["index"].append(log.index)
        cols["warmup"].append(int(log.warmup))
        cols["send_ns"].append(log.send_ns)
        cols["ok"].append(int(log.ok))
        cols["error"].append(log.error)
        cols["prompt_tokens"].append(log.prompt_tokens)
        cols["completion_tokens"].append(log.completion_tokens)
        cols["tokens_from_text"].append(int(log.tokens_from_text))
        cols["input_len"].append(log.input_len)
        cols["output_len"].append(log.output_len)
        cols["end_dns"].append(log.end_ns - log.send_ns)
        cols["n_events"].append(len(log.events))
        prev = log.send_ns
        for ev in log.events:
            cols["ev_dt_ns"].append(ev.t_ns - prev)
            prev = ev.t_ns
            cols["ev_tokens"].append(ev.tokens)
            cols["ev_kind"].append(_KIND_CODE[ev.kind])
    doc = {"v": FORMAT_VERSION, **cols}
    if any(getattr(log, c) is not None for log in logs for c in _SPEC_COLUMNS):
        doc.update({c: [getattr(log, c) for log in logs] for c in _SPEC_COLUMNS})
    return zlib.compress(json.dumps(doc, separators=(",", ":")).encode("utf-8"), 9)


@dataclass
class LogColumns:
    """Request logs as numpy columns: what `encode_logs` stores, with event times made absolute.

    Per request (length R, in list order): `index`, `warmup`, `send_ns`, `ok`, `error` (a list of
    str), `prompt_tokens` / `completion_tokens` (int64; meaningful where `prompt_known` /
    `completion_known`, the server's `usage` was sent), `tokens_from_text`, `input_len`,
    `output_len`, `end_ns`, `n_events`, `spec` (None, or {spec column: list of values per
    request}, see `_SPEC_COLUMNS`). Per event (length E, requests concatenated in order,
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

    def __len__(self) -> int:
        return len(self.index)

    def to_logs(self) -> list[RequestLog]:
        """The same logs as RequestLog objects (the inverse of `columns_of`)."""
        t, tok, kind = self.t_ns.tolist(), self.tokens.tolist(), self.kind.tolist()
        logs, pos = [], 0
        for i, n in enumerate(self.n_events.tolist()):
            events = [MessageEvent(t_ns=t[j], tokens=tok[j], kind=KINDS[kind[j]]) for j in range(pos, pos + n)]
            pos += n
            logs.append(RequestLog(
                index=int(self.index[i]), warmup=bool(self.warmup[i]), send_ns=int(self.send_ns[i]), events=events,
                ok=bool(self.ok[i]), error=self.error[i],
                prompt_tokens=int(self.prompt_tokens[i]) if self.prompt_known[i] else None,
                completion_tokens=int(self.completion_tokens[i]) if self.completion_known[i] else None,
                tokens_from_text=bool(self.tokens_from_text[i]), input_len=int(self.input_len[i]),
                output_len=int(self.output_len[i]), end_ns=int(self.end_ns[i]),
                **({c: self.spec[c][i] for c in _SPEC_COLUMNS} if self.spec else {})))
        return logs


def _i64(values: list) -> np.ndarray:
    return np.asarray(values, dtype=np.int64) if values else np.zeros(0, np.int64)


def _optional(values: list) -> tuple[np.ndarray, np.ndarray]:
    """(int64 values with 0 for None, known mask) of a column that may hold None."""
    known = np.asarray([v is not None for v in values], dtype=bool)
    return _i64([0 if v is None else v for v in values]), known


def columns_of(logs: list[RequestLog]) -> LogColumns:
    """The LogColumns of `logs` (one pass over the events)."""
    prompt, prompt_known = _optional([log.prompt_tokens for log in logs])
    completion, completion_known = _optional([log.completion_tokens for log in logs])
    return LogColumns(
        index=_i64([log.index for log in logs]), warmup=np.asarray([log.warmup for log in logs], dtype=bool),
        send_ns=_i64([log.send_ns for log in logs]), ok=np.asarray([log.ok for log in logs], dtype=bool),
        error=[log.error for log in logs], prompt_tokens=prompt, prompt_known=prompt_known,
        completion_tokens=completion, completion_known=completion_known,
        tokens_from_text=np.asarray([log.tokens_from_text for log in logs], dtype=bool),
        input_len=_i64([log.input_len for log in logs]), output_len=_i64([log.output_len for log in logs]),
        end_ns=_i64([log.end_ns for log in logs]), n_events=_i64([len(log.events) for log in logs]),
        t_ns=_i64([e.t_ns for log in logs for e in log.events]),
        tokens=_i64([e.tokens for log in logs for e in log.events]),
        kind=np.asarray([_KIND_CODE[e.kind] for log in logs for e in log.events], dtype=np.int8),
        spec=({c: [getattr(log, c) for log in logs] for c in _SPEC_COLUMNS}
              if any(getattr(log, c) is not None for log in logs for c in _SPEC_COLUMNS) else None))


def decode_columns(data: bytes) -> LogColumns:
    """Decode bytes written by `encode_logs` into LogColumns (no object per event).

    Raises ValueError naming the problem when the bytes are not zlib data, not JSON, of an
    unknown format version, when a column is missing or has the wrong length, or an event kind
    code is unknown.
    """
    try:
        # msgspec parses the same JSON about 3x faster than the json module (recompute decodes
        # every stored run); it also rejects invalid UTF-8.
        doc = msgspec.json.decode(zlib.decompress(data))
    except (zlib.error, msgspec.DecodeError) as exc:
        raise ValueError(f"request logs: not an encoded log blob ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("v") != FORMAT_VERSION:
        version = doc.get("v") if isinstance(doc, dict) else None
        raise ValueError(f"request logs: unsupported format version {version!r} (expected {FORMAT_VERSION})")
    missing = [c for c in _COLUMNS if not isinstance(doc.get(c), list)]
    if missing:
        raise ValueError(f"request logs: missing column(s) {', '.join(missing)}")
    n = len(doc["index"])
    for c in _COLUMNS[:12]:
        if len(doc[c]) != n:
            raise ValueError(f"request logs: column {c!r} has {len(doc[c])} entries, expected {n}")
    n_events = _i64(doc["n_events"])
    n_ev = int(n_events.sum())
    for c in ("ev_dt_ns", "ev_tokens", "ev_kind"):
        if len(doc[c]) != n_ev:
            raise ValueError(f"request logs: column {c!r} has {len(doc[c])} entries, expected {n_ev}")
    kinds = np.asarray(doc["ev_kind"]) if n_ev else np.zeros(0, np.int8)
    if kinds.dtype.kind not in "iub" or (n_ev and (kinds.min() < 0 or kinds.max() >= len(KINDS))):
        j, code = next((j, c) for j, c in enumerate(doc["ev_kind"])
                       if not isinstance(c, int) or not 0 <= c < len(KINDS))
        req = int(np.searchsorted(np.cumsum(n_events), j, side="right"))
        raise ValueError(f"request logs: request {req}: bad event kind code {code!r}")
    send = _i64(doc["send_ns"])
    # absolute times: each request's deltas summed from its send time (integers: exact)
    dt = _i64(doc["ev_dt_ns"])
    req_of = np.repeat(np.arange(n), n_events)
    cum = np.cumsum(dt)
    before = np.concatenate(([0], cum))[np.cumsum(n_events) - n_events]  # sum of earlier requests' deltas
    t_ns = send[req_of] + cum - before[req_of] if n_ev else np.zeros(0, np.int64)
    prompt, prompt_known = _optional(doc["prompt_tokens"])
    completion, completion_known = _optional(doc["completion_tokens"])
    spec = None
    if any(c in doc for c in _SPEC_COLUMNS):
        bad = [c for c in _SPEC_COLUMNS if not isinstance(doc.get(c), list) or len(doc[c]) != n]
        if bad:
            raise ValueError(f"request logs: column(s) {', '.join(bad)} missing or not {n} entries")
        spec = {c: doc[c] for c in _SPEC_COLUMNS}
    return LogColumns(
        index=_i64(doc["index"]), warmup=np.asarray(doc["warmup"], dtype=bool), send_ns=send,
        ok=np.asarray(doc["ok"], dtype=bool), error=list(doc["error"]), prompt_tokens=prompt,
        prompt_known=prompt_known, completion_tokens=completion, completion_known=completion_known,
        tokens_from_text=np.asarray(doc["tokens_from_text"], dtype=bool), input_len=_i64(doc["input_len"]),
        output_len=_i64(doc["output_len"]), end_ns=send + _i64(doc["end_dns"]), n_events=n_events, t_ns=t_ns,
        tokens=_i64(doc["ev_tokens"]), kind=kinds.astype(np.int8), spec=spec)


def decode_logs(data: bytes) -> list[RequestLog]:
    """Decode bytes written by `encode_logs` back into the identical list of RequestLog.

    Raises ValueError as `decode_columns` does.
    """
    return decode_columns(data).to_logs()
