"""HTTP/1.1 POST with a streamed answer over plain non-blocking sockets, every read stamped with
the time its bytes reached the host (the kernel's receive timestamp), for the load client.

Why not aiohttp: a transport library reads the socket with `recv`, so the only time a caller can
take is when Python got round to the bytes. When a continuous-batching server emits one token
for each of 256 streams in one step, the messages reach the client together and the last one
read is late by the whole burst's processing time (issue 22). Here each socket is read with
`recvmsg`, and the kernel's software receive stamp of the bytes comes with them as ancillary
data (`SO_TIMESTAMPNS`): how long Python took to get to the socket no longer moves the stamp.

Clock (Linux, net/core/dev.c `net_timestamp_check`, net/ipv4/tcp.c `tcp_recv_timestamp`): the
kernel stamps each received packet with `ktime_get_real()` (CLOCK_REALTIME) when it enters the
stack (on loopback, right after the sender's write); a TCP `recvmsg` reports the stamp of the
last packet it consumed (`tcp_update_recv_tstamps` per packet read; packets merged in the
receive queue keep the newest stamp). draftboard's clock is `time.perf_counter_ns()`
(CLOCK_MONOTONIC). Both clocks are the same timekeeper with an offset that changes only when
the wall clock is stepped (NTP slewing changes both rates alike), so `KernelClock` measures
offset = CLOCK_REALTIME - CLOCK_MONOTONIC by reading monotonic, realtime, monotonic back to back
and keeping the narrowest of 64 tries (its error is half that width, about 0.1 us here), and
measures it again at most every `KernelClock.REFRESH_NS`; a change above `STEP_NS` is counted
as a clock step (`KernelClock.steps`) and the new offset is used from then on.

Fallback: where the kernel gives no stamp (not Linux, the option refused, a read before the
kernel turned stamping on, which the pool's `_stamping_keeper` avoids, a stamp outside [send
time, now]) the read is stamped with `perf_counter_ns()` when Python read it, as before;
`ReadStats` counts reads of each kind so a run records how it was timed.

Coalescing: one read = one stamp. Several SSE messages in one read (the server wrote them in
one send, or the client fell behind one stream by more than one message gap and the kernel
merged the packets) all get the stamp of the last bytes read; metrics' `coalesced_share` shows
how often that happened. Bursts ACROSS streams, the case above, are exact.

Per read (the client's hot path, issue 22): one `recvmsg_into` into the pool's one preallocated
buffer, the bytes copied out, the stamp taken from the control message, then the framing. Chunks
that arrive whole (the common case: one SSE message per chunk per read) are cut out by
`_Body._whole_chunks` without the general state machine, which takes over at the first chunk
that is split, carries an extension or ends the body. On the 2-core dev machine `recvmsg` with
a 256 KiB size cost about 20 us per read against 5 us for `recvmsg_into` (Python allocates the
whole size and shrinks it each time; benchmarks/read_cost.py). With both changes and the load
client's typed fast path, eight client processes on the 16-core H200 machine kept 1 ms timing at
2.1x the streamed rate they kept before at 256 streams (benchmarks/README.md, "Client
capacity").

Protocol: HTTP/1.1 keep-alive, request with `Content-Length`, answer framed by
`Transfer-Encoding: chunked`, `Content-Length`, or the connection's end (RFC 9112 section 6.3);
1xx answers are skipped. Plain http only (the servers under test listen on the host or the
local network). A reused connection that the server had closed (an idle keep-alive timeout,
e.g. uvicorn's 5 s) is noticed before sending (a non-blocking peek sees its end) or, at the
latest, when it answers nothing at all; then the request is sent once more on a fresh
connection, never after any byte of an answer arrived.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

#: Linux's SO_TIMESTAMPNS (asm-generic/socket.h: 35); the control message type is the same value.
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
#: Bytes asked for per read, and room for the control message (a cmsghdr and a timespec).
READ_SIZE = 256 * 1024
_ANC_SIZE = socket.CMSG_SPACE(16) if hasattr(socket, "CMSG_SPACE") else 64
#: A kernel stamp may precede the request's send stamp, or follow "now", by this much before it
#: is refused (ns): the offset's own error is well below it.
_STAMP_SLACK_NS = 200_000
#: Longest status line, header block and chunk-size line accepted (bytes).
_MAX_HEAD = 64 * 1024
_MAX_LINE = 4096
_TIMESPEC = struct.Struct("qq")


class HttpError(Exception):
    """The connection failed or the answer broke HTTP/1.1 framing; `str()` says how."""


def measure_clock_offset(tries: int = 64) -> tuple[int, int]:
    """(CLOCK_REALTIME - perf_counter_ns offset in ns, width in ns of the narrowest read
    sandwich): `time.time_ns()` read between two `time.perf_counter_ns()`; the offset is realtime
    minus the midpoint of the two monotonic readings, from the try with the smallest width."""
    mono, real = time.perf_counter_ns, time.time_ns
    best_w, best = 1 << 62, 0
    for _ in range(tries):
        a = mono()
        r = real()
        b = mono()
        if b - a < best_w:
            best_w, best = b - a, r - (a + b) // 2
    return best, best_w


class KernelClock:
    """Turns kernel receive stamps (CLOCK_REALTIME ns) into perf_counter_ns (module docstring).

    `offset_ns`: the current offset; `width_ns`: the read sandwich it came from (its error is at
    most half of it); `steps`: how often the offset moved by more than STEP_NS between two
    measurements (the wall clock was stepped). `refresh()` measures again when REFRESH_NS has
    passed since the last measurement.
    """

    STEP_NS = 20_000
    REFRESH_NS = 200_000_000

    def __init__(self) -> None:
        self.offset_ns, self.width_ns = measure_clock_offset()
        self.steps = 0
        self._at = time.perf_counter_ns()

    def refresh(self, now_ns: int | None = None) -> None:
        now = time.perf_counter_ns() if now_ns is None else now_ns
        if now - self._at < self.REFRESH_NS:
            return
        self._at = now
        off, width = measure_clock_offset(8)
        if abs(off - self.offset_ns) > self.STEP_NS + width:
            self.steps += 1
            self.offset_ns, self.width_ns = off, width


@dataclass
class ReadStats:
    """Reads of one client process: `kernel` stamped by the kernel, `fallback` stamped when Python
    read them (no stamp came, or stamping is off), `refused` kernel stamps outside [send, now]
    (then stamped as fallback too). `delay_ns`: for kernel-stamped reads, how long after the
    bytes arrived Python read them (one int per read; the client's lag behind the wire)."""

    kernel: int = 0
    fallback: int = 0
    refused: int = 0

    def __post_init__(self) -> None:
        from array import array

        self.delay_ns = array("q")

    @property
    def source(self) -> str:
        """"kernel", "read", "mixed" or "" (no read)."""
        if self.kernel and not self.fallback:
            return "kernel"
        if self.fallback and not self.kernel:
            return "read"
        return "mixed" if self.kernel else ""


class _Body:
    """Response framing state: head, then chunked / length / until-close body."""

    __slots__ = ("state", "buf", "remaining", "mode", "status", "headers", "keep_alive", "body_bytes")

    HEAD, SIZE, DATA, CRLF, TRAILERS, DONE = range(6)

    def __init__(self) -> None:
        self.state = self.HEAD
        self.buf = b""
        self.remaining = 0
        self.mode = ""
        self.status = 0
        self.headers: dict[str, str] = {}
        self.keep_alive = True
        self.body_bytes = 0

    def _head(self, block: bytes) -> bool:
        """Parse a header block; False for a 1xx answer (another head follows)."""
        lines = block.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise HttpError(f"not an HTTP/1.x status line: {lines[0][:100]!r}")
        status = int(parts[1])
        if 100 <= status < 200:
            return False
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                raise HttpError(f"bad header line {line[:100]!r}")
            key = name.strip().decode("latin-1").lower()
            val = value.strip().decode("latin-1")
            headers[key] = f"{headers[key]}, {val}" if key in headers else val
        self.status, self.headers = status, headers
        conn = headers.get("connection", "").lower()
        self.keep_alive = parts[0] == b"HTTP/1.1" and "close" not in conn
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self.mode, self.state = "chunked", self.SIZE
        elif "content-length" in headers:
            try:
                self.remaining = int(headers["content-length"])
            except ValueError:
                raise HttpError(f"bad Content-Length {headers['content-length']!r}") from None
            self.mode, self.state = "length", (self.DATA if self.remaining else self.DONE)
        else:
            self.mode, self.state, self.keep_alive = "close", self.DATA, False
        return True

    def feed(self, data: bytes, out: list[bytes]) -> None:
        """Append the body bytes `data` completes to `out`; raises HttpError on bad framing."""
        pos = 0
        if self.state == self.SIZE and not self.buf:  # the read starts at a chunk (the common case)
            pos = self._whole_chunks(data, out)
            if pos == len(data):
                return
        buf = self.buf + data if self.buf else data
        n = len(buf)
        while pos < n or self.state == self.DONE:
            st = self.state
            if st == self.DATA:
                if self.mode == "close":
                    out.append(buf[pos:] if pos else buf)
                    self.body_bytes += n - pos
                    pos = n
                    break
                take = min(self.remaining, n - pos)
                out.append(buf[pos:pos + take])
                self.body_bytes += take
                pos += take
                self.remaining -= take
                if self.remaining:
                    break
                self.state = self.CRLF if self.mode == "chunked" else self.DONE
            elif st == self.SIZE:
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    if n - pos > _MAX_LINE:
                        raise HttpError("chunk-size line too long")
                    break
                field = buf[pos:end].split(b";", 1)[0].strip()
                try:
                    size = int(field, 16)
                except ValueError:
                    raise HttpError(f"bad chunk size {field[:40]!r}") from None
                pos = end + 2
                if size:
                    self.remaining, self.state = size, self.DATA
                else:
                    self.state = self.TRAILERS
            elif st == self.CRLF:
                if n - pos < 2:
                    break
                if buf[pos:pos + 2] != b"\r\n":
                    raise HttpError("chunk data not followed by CRLF")
                pos += 2
                self.state = self.SIZE
            elif st == self.TRAILERS:
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    if n - pos > _MAX_HEAD:
                        raise HttpError("trailer section too long")
                    break
                line_empty = end == pos
                pos = end + 2
                if line_empty:
                    self.state = self.DONE
            elif st == self.HEAD:
                end = buf.find(b"\r\n\r\n", pos)
                if end < 0:
                    if n - pos > _MAX_HEAD:
                        raise HttpError("response head too long")
                    break
                block = buf[pos:end]
                pos = end + 4
                self._head(block)
            else:  # DONE
                if pos < n:
                    self.keep_alive = False  # bytes after the answer: do not trust this connection
                pos = n
                break
        self.buf = buf[pos:] if pos < n else b""

    def _whole_chunks(self, data: bytes, out: list[bytes]) -> int:
        """Fast path of `feed` for chunks that arrive whole: each `size CRLF data CRLF` (hex size,
        no extension) is appended to `out`; returns where it stopped (at the first chunk that is
        not whole or not plain, the last one included, for the general loop to take on)."""
        pos, n = 0, len(data)
        while pos < n:
            end = data.find(b"\r\n", pos, pos + 10)
            if end < 0:
                return pos
            try:
                size = int(data[pos:end], 16)
            except ValueError:
                return pos
            start = end + 2
            stop = start + size
            if size <= 0 or stop + 2 > n or data[stop:stop + 2] != b"\r\n":
                return pos
            out.append(data[start:stop])
            self.body_bytes += size
            pos = stop + 2
        return pos

    def eof(self) -> None:
        """The connection ended: fine for an until-close body, else HttpError."""
        if self.state == self.DONE:
            return
        if self.state == self.DATA and self.mode == "close":
            self.state = self.DONE
            return
        if self.state == self.HEAD:
            raise HttpError("the server closed the connection before answering" if not self.buf
                            else "the server closed the connection inside the response head")
        raise HttpError(f"the server closed the connection after {self.body_bytes} body bytes, "
                        f"before the end of the {self.mode} body")


class Sink:
    """What a response is handed to (the load client's per-request stream implements this).

    `head(status, headers)` once the head is read (header names lower case);
    `data(body bytes, t_ns) -> bool` for each piece of the body (every piece of one read carries
    that read's stamp), True once the sink needs nothing more (the connection is then drained in
    the background and reused if its answer ends properly); `end()` when the body ended."""

    def head(self, status: int, headers: dict[str, str]) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def data(self, piece: bytes, t_ns: int) -> bool:  # pragma: no cover - interface
        raise NotImplementedError

    def end(self) -> None:  # pragma: no cover - interface
        raise NotImplementedError


class _Conn:
    """One keep-alive connection and the response being read on it."""

    __slots__ = ("sock", "fd", "pool", "body", "sink", "fut", "send_ns", "draining", "got_bytes", "reused")

    def __init__(self, sock: socket.socket, pool: ConnectionPool):
        self.sock, self.fd, self.pool = sock, sock.fileno(), pool
        self.body: _Body | None = None
        self.sink: Sink | None = None
        self.fut: asyncio.Future | None = None
        self.send_ns = 0
        self.draining = False
        self.got_bytes = False
        self.reused = False

    def closed_by_peer(self) -> bool:
        """An idle connection whose server has closed it (a non-blocking peek sees the end or an
        error)."""
        try:
            return self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True

    def close(self) -> None:
        if self.fd >= 0:
            try:
                self.pool.loop.remove_reader(self.fd)
            except (ValueError, OSError, RuntimeError):
                pass
            self.sock.close()
            self.fd = -1

    def _finish(self, exc: BaseException | None) -> None:
        fut = self.fut
        if fut is not None and not fut.done():
            if exc is None:
                fut.set_result(None)
            else:
                fut.set_exception(exc)

    def on_readable(self) -> None:
        """Reader callback: one recvmsg, stamped, fed to the framing and the sink."""
        pool = self.pool
        try:
            # into the pool's one buffer: `recvmsg(READ_SIZE)` would allocate READ_SIZE bytes per
            # read and shrink them (module docstring, benchmarks/read_cost.py)
            size, anc, _flags, _addr = self.sock.recvmsg_into(pool.read_view, _ANC_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._fail(HttpError(f"{type(exc).__name__}: {exc}"))
            return
        data = bytes(pool.read_view[0][:size])
        now = time.perf_counter_ns()
        t_ns = now
        stats = pool.stats
        if anc:
            for level, kind, raw in anc:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(raw) >= 16:
                    sec, nsec = _TIMESPEC.unpack_from(raw)
                    k = sec * 1_000_000_000 + nsec - pool.clock.offset_ns
                    if self.send_ns - _STAMP_SLACK_NS <= k <= now + _STAMP_SLACK_NS:
                        t_ns = k if k <= now else now
                        stats.kernel += 1
                        stats.delay_ns.append(now - t_ns)
                    else:
                        stats.refused += 1
                        stats.fallback += 1
                    break
            else:
                stats.fallback += 1
        elif data:
            stats.fallback += 1
        body = self.body
        if body is None:  # idle and readable: the server closed it (or sent junk)
            self.pool.discard(self)
            return
        if not data:
            try:
                body.eof()
            except HttpError as exc:
                self._fail(exc)
                return
            self._complete()
            return
        self.got_bytes = True
        pieces: list[bytes] = []
        try:
            was_head = body.state == body.HEAD
            body.feed(data, pieces)
            sink = self.sink
            if was_head and body.state != body.HEAD and sink is not None:
                sink.head(body.status, body.headers)
            if sink is not None:
                for piece in pieces:
                    if piece and sink.data(piece, t_ns):
                        self.sink = None  # the sink has what it needs
                        self._finish(None)
                        break
        except HttpError as exc:
            self._fail(exc)
            return
        except Exception as exc:  # noqa: BLE001 - a sink failure must reach the waiting request
            self._fail(exc)
            return
        if body.state == body.DONE:
            self._complete()

    def _complete(self) -> None:
        body = self.body
        sink = self.sink
        self.body, self.sink = None, None
        if sink is not None:
            sink.end()
        self._finish(None)
        if body is not None and body.keep_alive and body.state == body.DONE:
            self.pool.release(self)
        else:
            self.pool.discard(self)

    def _fail(self, exc: BaseException) -> None:
        self.body, self.sink = None, None
        self._finish(exc)
        self.pool.discard(self)


def _stamping_keeper(wait_s: float = 0.1) -> socket.socket | None:
    """A loopback TCP socket that asks for receive stamps, held for as long as a pool is open, so
    the kernel's receive stamping is already on when the pool's first connection reads. Linux
    turns stamping on when the first socket asks for it and off when the last one that asked
    closes (net/core/dev.c `net_enable_timestamp`), and the turning on runs later, in a work item:
    a packet that arrives before it has run has no stamp. So the keeper's peer sends it one byte
    at a time until one comes with a stamp (at most `wait_s` seconds). TCP, not UDP: a UDP read
    of an unstamped packet is stamped at read time (`__sock_recv_timestamp`), so it would prove
    nothing; TCP reports only the stamp taken on arrival (`tcp_recv_timestamp`). Measured here
    under load, the first packet on a fresh stamped TCP socket came without a stamp 22 times in
    1 000 while no other stamped socket was open, 0 in 2 000 with a keeper held. None where the
    option is refused or no stamp came within `wait_s`."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    keeper = peer = None
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        keeper = socket.create_connection(listener.getsockname(), timeout=wait_s)
        keeper.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        peer, _ = listener.accept()
        end = time.monotonic() + wait_s
        while True:
            peer.send(b"k")
            _, anc, _, _ = keeper.recvmsg(1, _ANC_SIZE)
            if anc:
                break
            if time.monotonic() > end:
                raise TimeoutError("no receive stamp")
            time.sleep(0.001)
    except OSError:  # TimeoutError included
        if keeper is not None:
            keeper.close()
        keeper = None
    finally:
        listener.close()
        if peer is not None:
            peer.close()
    return keeper


class ConnectionPool:
    """Keep-alive connections to one `http://host:port` (at most `limit` open; the caller bounds
    concurrency), each read with kernel receive stamps (`kernel_stamps=False`: stamped when read,
    the old way). `stats`: ReadStats of every read; `clock`: the KernelClock in use.

    `post(path, body, sink, on_send)` sends one request and hands the answer to `sink`; it
    returns when the sink has what it needs or the answer ended, and raises HttpError (or
    OSError while connecting) for a transport failure. Close with `close()`.
    """

    def __init__(self, base_url: str, *, kernel_stamps: bool = True, limit: int = 1024):
        parts = urlsplit(base_url)
        if parts.scheme != "http":
            raise ValueError(f"the load client speaks plain http only, not {parts.scheme!r} ({base_url})")
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.host_header = parts.netloc
        self.kernel_stamps = kernel_stamps
        self.limit = limit
        self.loop = asyncio.get_running_loop()
        self.clock = KernelClock()
        self.stats = ReadStats()
        self._keeper = _stamping_keeper() if kernel_stamps else None
        #: every read of the pool's connections lands here first (one process, one read at a time)
        self.read_view = [memoryview(bytearray(READ_SIZE))]
        self._idle: list[_Conn] = []
        self._open: set[_Conn] = set()
        self._addr: tuple | None = None
        self._family = socket.AF_INET

    async def _resolve(self) -> None:
        infos = await self.loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        if not infos:
            raise OSError(f"cannot resolve {self.host}")
        self._family, _, _, _, self._addr = infos[0]

    async def _connect(self) -> _Conn:
        if self._addr is None:
            await self._resolve()
        sock = socket.socket(self._family, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.kernel_stamps:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
                except OSError:
                    pass  # no kernel stamps here: reads are stamped when Python reads them
            await self.loop.sock_connect(sock, self._addr)
        except BaseException:
            sock.close()
            raise
        conn = _Conn(sock, self)
        self._open.add(conn)
        return conn

    def release(self, conn: _Conn) -> None:
        """An answer ended cleanly: keep the connection for the next request."""
        conn.draining = False
        try:
            self.loop.remove_reader(conn.fd)
        except (ValueError, OSError, RuntimeError):
            pass
        if conn.fd >= 0:
            self._idle.append(conn)

    def discard(self, conn: _Conn) -> None:
        conn.close()
        self._open.discard(conn)
        if conn in self._idle:
            self._idle.remove(conn)

    async def _take(self) -> _Conn:
        while self._idle:
            conn = self._idle.pop()
            if conn.closed_by_peer():
                self.discard(conn)
                continue
            conn.reused = True
            return conn
        return await self._connect()

    async def post(self, path: str, body: bytes, sink: Sink, on_send: Callable[[], int]) -> None:
        """POST `body` (JSON) to `path`, the answer to `sink`. `on_send()` is called just before
        the request's bytes are written and returns the send stamp (perf_counter_ns), which bounds
        the kernel stamps accepted. Raises HttpError or OSError (connect) on transport failure."""
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host_header}\r\nContent-Type: application/json\r\n"
                f"Accept: text/event-stream, application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        payload = head + body
        for attempt in (0, 1):
            conn = await self._take()
            try:
                await self._exchange(conn, payload, sink, on_send)
                return
            except HttpError:
                if attempt == 0 and conn.reused and not conn.got_bytes:
                    continue  # the server had closed this idle connection: once more on a fresh one
                raise
            except BaseException:
                self.discard(conn)  # cancelled (timeout) or anything else: never reuse it
                raise

    async def _exchange(self, conn: _Conn, payload: bytes, sink: Sink, on_send: Callable[[], int]) -> None:
        body = _Body()
        conn.body, conn.sink, conn.got_bytes = body, sink, False
        conn.fut = fut = self.loop.create_future()
        conn.draining = False
        self.loop.add_reader(conn.fd, conn.on_readable)
        conn.send_ns = on_send()
        try:
            sent = conn.sock.send(payload)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            conn._fail(HttpError(f"{type(exc).__name__}: {exc}"))
            sent = len(payload)
        if sent < len(payload):
            await self.loop.sock_sendall(conn.sock, payload[sent:])
        await fut
        # The sink is done but the answer goes on: the reader drains it and then reuses the
        # connection. (By now the connection may already be back in the pool and serving the
        # next request: compare with this request's own body, never touch the next one's.)
        if conn.body is body:
            conn.draining = True

    def refresh_clock(self) -> None:
        """Measure the clock offset again if it is due (KernelClock.refresh)."""
        self.clock.refresh()

    def close(self) -> None:
        for conn in list(self._open):
            conn.close()
        self._open.clear()
        self._idle.clear()
        if self._keeper is not None:
            self._keeper.close()
            self._keeper = None
