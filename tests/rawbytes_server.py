"""An HTTP server that answers with exact bytes at set times, for the load client's framing tests.

Unlike `synthetic_server.py` (which streams well-formed vLLM events), this one writes whatever
byte strings a test gives it, so it can send what other OpenAI-compatible stacks send: CRLF or
CR line endings, a byte-order mark, comments, split multi-byte characters, invalid UTF-8, a
JSON error body with status 200, a stream that stops early.

A `Script` is the response: status, content type, and a list of `(delay_ms, bytes)` writes; each
write is sent after its delay (counted from the previous write, the first from the request's
arrival) as its own TCP segment (TCP_NODELAY) and, with `chunked`, as one HTTP chunk. The server
picks the script by the request's prompt text (`/v1/completions` `prompt`, or the last chat
message's content) and records, per script name, the `time.perf_counter_ns()` just before each
write (`write_ns[name]`: one list per request). The server runs in this process, so those
stamps share the client's clock: they are the ground truth for TTFT and ICL.

Each response closes its connection (`Connection: close`).

Usage::

    with RawBytesServer({"lf": Script([(20, b"data: {...}\\n\\n"), ...])}) as url:
        ...  # send prompt "lf" to url + "/v1/completions"
"""

from __future__ import annotations

import json
import socket
import socketserver
import threading
import time
from dataclasses import dataclass, field


@dataclass
class Script:
    """One response: `writes` are (delay before this write in ms, bytes) pairs."""

    writes: list[tuple[float, bytes]]
    status: int = 200
    content_type: str = "text/event-stream"
    chunked: bool = True
    headers: dict[str, str] = field(default_factory=dict)


class _Handler(socketserver.BaseRequestHandler):
    server: _TCPServer

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        data = b""
        while b"\r\n\r\n" not in data:
            part = sock.recv(65536)
            if not part:
                return
            data += part
        head, body = data.split(b"\r\n\r\n", 1)
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        while len(body) < length:
            part = sock.recv(65536)
            if not part:
                return
            body += part
        doc = json.loads(body) if body else {}
        prompt = doc.get("prompt") or (doc.get("messages") or [{}])[-1].get("content", "")
        owner = self.server.owner
        script = owner.scripts[prompt]
        stamps: list[int] = []
        with owner.lock:
            owner.write_ns.setdefault(prompt, []).append(stamps)
        lines = [f"HTTP/1.1 {script.status} X", f"Content-Type: {script.content_type}", "Connection: close"]
        if script.chunked:
            lines.append("Transfer-Encoding: chunked")
        lines += [f"{k}: {v}" for k, v in script.headers.items()]
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        t = time.perf_counter()
        for delay_ms, payload in script.writes:
            t += delay_ms / 1000.0
            pause = t - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            frame = f"{len(payload):x}\r\n".encode() + payload + b"\r\n" if script.chunked else payload
            stamps.append(time.perf_counter_ns())
            sock.sendall(frame)
        if script.chunked:
            sock.sendall(b"0\r\n\r\n")
        sock.shutdown(socket.SHUT_WR)


class _TCPServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    owner: RawBytesServer


class RawBytesServer:
    """`start() -> base_url`, `stop()`, or a context manager. `scripts`: prompt -> Script.
    `write_ns`: prompt -> one list of write stamps (perf_counter_ns) per request served."""

    def __init__(self, scripts: dict[str, Script]):
        self.scripts = scripts
        self.write_ns: dict[str, list[list[int]]] = {}
        self.lock = threading.Lock()
        self._server: _TCPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> str:
        self._server = _TCPServer(("127.0.0.1", 0), _Handler)
        self._server.owner = self
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.01,), name="rawbytes",
                                        daemon=True)
        self._thread.start()
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
