"""Server-sent events, parsed incrementally from raw bytes as the WHATWG event-stream rules say.

Source: HTML Living Standard, "Server-sent events", sections "Parsing an event stream" and
"Interpreting an event stream" (https://html.spec.whatwg.org/multipage/server-sent-events.html).
What this parser does, rule by rule:

- A line ends at CRLF, LF or CR (also when the CR and the LF arrive in different reads).
- One leading byte-order mark (EF BB BF) at the very start of the stream is dropped.
- A blank line dispatches the event being built. An event whose data buffer is empty is not
  dispatched (a block of only comments, `event:` or `id:` lines yields nothing).
- `:` at the start of a line: a comment, ignored.
- `field: value` (one space after the colon dropped; a line without a colon is a field with an
  empty value): `data` appends the value to the event's data lines (several `data:` lines of one
  event are joined with `\\n`), `event` sets the event type (default "message"), `id` sets the
  last event id (ignored when it holds NUL), `retry` sets the reconnection time when the value
  is all ASCII digits. Other fields are ignored.
- At end of stream an event that was not ended by a blank line is discarded (the standard's
  rule); `SSEParser.pending` tells whether bytes were left over.

Bytes are decoded (strict UTF-8) only once an event is complete, so a multi-byte character
split across reads is joined before decoding; invalid UTF-8 raises `SSEError`. The standard
itself would replace bad bytes with U+FFFD; a benchmark must not silently measure a corrupted
stream, so draftboard fails that request instead (`bad_stream`).

Timestamps are the caller's business: `feed(chunk)` returns exactly the events that `chunk`
completed, so each event can be stamped with the time of the read that completed it. Events are
returned as plain `(event type, data)` tuples (the load client's hot path: one per streamed
message); `SSEParser.last_event_id` and `.retry_ms` hold the `id:` and `retry:` state.

Written by hand rather than taken from a library: the SSE clients on the package index
(aiohttp-sse-client, httpx-sse, sseclient) own the HTTP connection or decode the whole stream
with replacement, neither of which lets the load client stamp events per read or fail a request
on invalid UTF-8.
"""

from __future__ import annotations

_BOM = b"\xef\xbb\xbf"


class SSEError(ValueError):
    """The byte stream is not a valid event stream (here: an event's bytes are not UTF-8)."""


class SSEParser:
    """Incremental event-stream parser: `feed(bytes) -> list[(event type, data)]`.

    Keep one parser per response. `feed` returns the events the bytes completed, each as
    (`event type`: "message" unless an `event:` field said otherwise, `data`: the data lines
    joined with "\n"), both decoded strict UTF-8. Raises `SSEError` when a completed event's
    data or type is not valid UTF-8 (the event is dropped; do not feed the parser further).
    `last_event_id`: the last `id:` value (None before any); `retry_ms`: the last valid
    `retry:` value. `events_dispatched` counts events returned so far; `pending` is True while
    bytes of an unfinished line or event are held (at end of stream those bytes are discarded).
    """

    __slots__ = ("_buf", "_skip_lf", "_head", "_data", "_event", "_last_id", "retry_ms", "events_dispatched")

    def __init__(self) -> None:
        self._buf = b""  # bytes of the current, unterminated line (never holds CR or LF)
        self._skip_lf = False  # the previous read ended in CR: a leading LF now belongs to it
        self._head: bytes | None = b""  # bytes seen before the BOM check is decided; None after
        self._data: list[bytes] = []
        self._event = b""
        self._last_id: bytes | None = None
        self.retry_ms: int | None = None
        self.events_dispatched = 0

    @property
    def last_event_id(self) -> str | None:
        """The last event id the stream set (`id:` field), None before any; undecodable bytes are
        replaced (U+FFFD), since the id never feeds a figure."""
        return None if self._last_id is None else self._last_id.decode("utf-8", "replace")

    @property
    def pending(self) -> bool:
        """Bytes of an unfinished line or an undispatched event are held."""
        return bool(self._buf or self._data or self._event or self._head)

    @property
    def idle(self) -> bool:
        """Between events: the BOM check is decided and no line, field or event is held (the
        next bytes start a fresh line of a fresh event)."""
        return (self._head is None and not self._buf and not self._data and not self._event
                and not self._skip_lf)

    def feed(self, chunk: bytes) -> list[tuple[str, str]]:
        """Parse the next bytes of the stream; returns the events they completed, in order."""
        if self._head is not None:  # the stream's first bytes: drop one leading BOM
            head = self._head + chunk
            if len(head) < len(_BOM) and _BOM.startswith(head):
                self._head = head
                return []
            self._head = None
            chunk = head[len(_BOM):] if head.startswith(_BOM) else head
        if self._skip_lf and chunk:
            self._skip_lf = False
            if chunk[0] == 10:  # LF completing a CRLF split across reads
                chunk = chunk[1:]
        buf = self._buf + chunk if self._buf else chunk
        if b"\r" in buf:
            self._skip_lf = buf[-1] == 13
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if b"\n" not in buf:
            self._buf = buf
            return []
        lines = buf.split(b"\n")
        self._buf = lines.pop()
        events: list[tuple[str, str]] = []
        data = self._data
        for line in lines:
            if line[:5] == b"data:":  # the common case first
                data.append(line[6:] if line[5:6] == b" " else line[5:])
            elif not line:
                if data:
                    events.append(self._dispatch())
                    data = self._data
                else:
                    self._event = b""
            elif line[0] == 58:  # ":" comment
                continue
            else:
                colon = line.find(b":")
                if colon < 0:
                    name, value = line, b""
                else:
                    name, value = line[:colon], line[colon + 1:]
                    if value[:1] == b" ":
                        value = value[1:]
                if name == b"data":
                    data.append(value)
                elif name == b"event":
                    self._event = value
                elif name == b"id":
                    if b"\0" not in value:
                        self._last_id = value
                elif name == b"retry":
                    if value and value.isdigit():
                        self.retry_ms = int(value)
        return events

    def _dispatch(self) -> tuple[str, str]:
        raw = self._data[0] if len(self._data) == 1 else b"\n".join(self._data)
        event, self._data, self._event = self._event, [], b""
        self.events_dispatched += 1
        try:
            return (event.decode("utf-8") if event else "message"), raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            bad = exc.object[max(0, exc.start - 20):exc.end + 20]
            raise SSEError(
                f"event {self.events_dispatched} is not valid UTF-8 ({exc.reason} at byte {exc.start}: {bad!r})"
            ) from None
