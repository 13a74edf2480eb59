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
    request finished (stream closed, error or timeout).
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
    event) and `end_ns` as `end_dns = end_ns - send_ns`. Inverse: `decode_logs`.
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
    return zlib.compress(json.dumps(doc, separators=(",", ":")).encode("utf-8"), 9)


def decode_logs(data: bytes) -> list[RequestLog]:
    """Decode bytes written by `encode_logs` back into the identical list of RequestLog.

    Raises ValueError naming the problem when the bytes are not zlib data, not JSON, of an
    unknown format version, or when a column is missing or has the wrong length.
    """
    try:
        doc = json.loads(zlib.decompress(data).decode("utf-8"))
    except (zlib.error, UnicodeDecodeError, json.JSONDecodeError) as exc:
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
    n_ev = sum(doc["n_events"])
    for c in ("ev_dt_ns", "ev_tokens", "ev_kind"):
        if len(doc[c]) != n_ev:
            raise ValueError(f"request logs: column {c!r} has {len(doc[c])} entries, expected {n_ev}")
    logs: list[RequestLog] = []
    pos = 0
    for i in range(n):
        send_ns = doc["send_ns"][i]
        events = []
        t = send_ns
        for j in range(pos, pos + doc["n_events"][i]):
            t += doc["ev_dt_ns"][j]
            code = doc["ev_kind"][j]
            if not isinstance(code, int) or not 0 <= code < len(KINDS):
                raise ValueError(f"request logs: request {i}: bad event kind code {code!r}")
            events.append(MessageEvent(t_ns=t, tokens=doc["ev_tokens"][j], kind=KINDS[code]))
        pos += doc["n_events"][i]
        logs.append(
            RequestLog(
                index=doc["index"][i],
                warmup=bool(doc["warmup"][i]),
                send_ns=send_ns,
                events=events,
                ok=bool(doc["ok"][i]),
                error=doc["error"][i],
                prompt_tokens=doc["prompt_tokens"][i],
                completion_tokens=doc["completion_tokens"][i],
                tokens_from_text=bool(doc["tokens_from_text"][i]),
                input_len=doc["input_len"][i],
                output_len=doc["output_len"][i],
                end_ns=send_ns + doc["end_dns"][i],
            )
        )
    return logs
