"""The stand-in engine's server (see the package docstring). Pure standard library.

Answers, on 127.0.0.1 (or --host) and --port:

- `GET /health`, `GET /health_generate` (SGLang's readiness), `GET /v1/models` (the served model
  name: --served-model-name, else --model / --model-path);
- `POST /tokenize`, `POST /detokenize` in vLLM's shapes, one token per character (id = code point);
- `POST /v1/completions` with `stream: true`: Server-Sent Events in vLLM's shapes, exactly
  `max_tokens` output tokens (like `ignore_eos`), cumulative `usage` on every chunk when asked for
  `continuous_usage_stats`, a final usage-only chunk for `include_usage`, then `[DONE]`;
- `GET /metrics`: with `--speculative-config '{"num_speculative_tokens": k, ...}'`, vLLM's
  spec-decode counters as a speculating server counts them: after each request's first message,
  every message is one draft step of k draft tokens carrying ACCEPTED + 1 tokens;
- `POST /reset_prefix_cache`, `POST /flush_cache`: 200.

Timing: first message STANDIN_TTFT_MS after the request (default 5), then one message every
STANDIN_GAP_MS (default 2). The process writes its pid, `sys.executable`, the kernel's
`/proc/self/exe`, its port and CUDA_VISIBLE_DEVICES to the file named by STANDIN_REPORT (when
set), one JSON line per start. With STANDIN_CUDA_MIB=N it first holds N MiB on its first CUDA
device through torch (as a real engine holds its weights) and reports that device's UUID.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

ACCEPTED = 1  # accepted draft tokens per draft step when speculating


class State:
    def __init__(self, model: str, spec_k: int):
        self.model = model
        self.spec_k = spec_k
        self.drafts = 0
        self.draft_tokens = 0
        self.accepted = 0
        self.started = time.time()


def _json_response(obj, status: int = 200) -> bytes:
    body = json.dumps(obj).encode()
    reason = {200: "OK", 404: "Not Found", 400: "Bad Request"}.get(status, "OK")
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: keep-alive\r\n\r\n").encode() + body


def _text_response(text: str) -> bytes:
    body = text.encode()
    return (f"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
            "Connection: keep-alive\r\n\r\n").encode() + body


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _sse(obj) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    return _chunk(f"data: {data}\n\n".encode())


def _metrics(state: State) -> str:
    lines = [f"process_start_time_seconds {state.started}"]
    if state.spec_k:
        for name, value in (("num_drafts", state.drafts), ("num_draft_tokens", state.draft_tokens),
                            ("num_accepted_tokens", state.accepted)):
            lines += [f"# TYPE vllm:spec_decode_{name} counter",
                      f'vllm:spec_decode_{name}_total{{engine="0",model_name="{state.model}"}} {value}.0']
    return "\n".join(lines) + "\n"


async def _stream(writer: asyncio.StreamWriter, state: State, body: dict) -> None:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    ttft = float(os.environ.get("STANDIN_TTFT_MS", "5")) / 1000
    gap = float(os.environ.get("STANDIN_GAP_MS", "2")) / 1000
    prompt = body.get("prompt", "")
    prompt_tokens = len(prompt) if isinstance(prompt, str) else len(prompt)
    n_out = int(body.get("max_tokens", 16))
    opts = body.get("stream_options") or {}
    final_usage, cont = bool(opts.get("include_usage")), bool(opts.get("continuous_usage_stats"))
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
                 b"Connection: keep-alive\r\n\r\n")
    sent, j = 0, 0
    while sent < n_out:
        k = 1 if j == 0 or not state.spec_k else min(ACCEPTED + 1, state.spec_k + 1)
        k = min(k, n_out - sent)
        await asyncio.sleep(max(0.0, t0 + ttft + j * gap - loop.time()))
        sent += k
        msg = {"id": "cmpl-standin", "object": "text_completion", "model": state.model,
               "choices": [{"index": 0, "text": "a" * k, "finish_reason": "length" if sent == n_out else None}]}
        if cont:
            msg["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": sent,
                            "total_tokens": prompt_tokens + sent}
        writer.write(_sse(msg))
        if state.spec_k and j > 0:
            state.drafts += 1
            state.draft_tokens += state.spec_k
            state.accepted += k - 1
        j += 1
        await writer.drain()
    if final_usage:
        writer.write(_sse({"id": "cmpl-standin", "object": "text_completion", "model": state.model, "choices": [],
                           "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": sent,
                                     "total_tokens": prompt_tokens + sent}}))
    writer.write(_sse("[DONE]") + _chunk(b""))
    await writer.drain()


async def _handle(state: State, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            lines = head.decode("latin-1").split("\r\n")
            method, path = lines[0].split(" ")[:2]
            headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
            length = int(headers.get("content-length", "0"))
            body = json.loads(await reader.readexactly(length)) if length else {}
            path = path.split("?")[0]
            if method == "GET" and path in ("/health", "/health_generate"):
                writer.write(_text_response(""))
            elif method == "GET" and path == "/v1/models":
                writer.write(_json_response({"object": "list", "data": [{"id": state.model, "object": "model"}]}))
            elif method == "GET" and path == "/metrics":
                writer.write(_text_response(_metrics(state)))
            elif method == "POST" and path in ("/reset_prefix_cache", "/flush_cache"):
                writer.write(_text_response(""))
            elif method == "POST" and path == "/tokenize":
                ids = [ord(c) for c in body.get("prompt", "")]
                writer.write(_json_response({"count": len(ids), "max_model_len": 1 << 20, "tokens": ids}))
            elif method == "POST" and path == "/detokenize":
                writer.write(_json_response({"prompt": "".join(chr(t) for t in body.get("tokens", []))}))
            elif method == "POST" and path == "/v1/completions":
                await _stream(writer, state, body)
            else:
                writer.write(_json_response({"error": f"no route {method} {path}"}, status=404))
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        return
    finally:
        writer.close()


async def _serve(host: str, port: int, state: State) -> None:
    server = await asyncio.start_server(lambda r, w: _handle(state, r, w), host, port, reuse_address=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="standin_engine")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", "--model-path", dest="model", default="standin")
    parser.add_argument("--served-model-name", default="")
    parser.add_argument("--speculative-config", default="")
    args, _unknown = parser.parse_known_args(argv)
    spec_k = int(json.loads(args.speculative_config).get("num_speculative_tokens") or 0) \
        if args.speculative_config else 0
    held, gpu_uuid = None, None
    if os.environ.get("STANDIN_CUDA_MIB"):
        import torch  # only on a GPU host: the stand-in otherwise needs the standard library alone

        held = torch.empty(int(os.environ["STANDIN_CUDA_MIB"]) << 20, dtype=torch.uint8, device="cuda:0")
        held.fill_(1)
        torch.cuda.synchronize()
        uuid = torch.cuda.get_device_properties(0).uuid
        gpu_uuid = str(uuid) if str(uuid).startswith("GPU-") else f"GPU-{uuid}"
    report = os.environ.get("STANDIN_REPORT")
    if report:
        with open(report, "a", encoding="utf-8") as fh:
            exe = os.readlink("/proc/self/exe") if os.path.exists("/proc/self/exe") else None
            fh.write(json.dumps({"pid": os.getpid(), "executable": sys.executable, "proc_exe": exe, "port": args.port,
                                 "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                                 "gpu_uuid": gpu_uuid}) + "\n")
    asyncio.run(_serve(args.host, args.port, State(args.served_model_name or args.model, spec_k)))


if __name__ == "__main__":
    main()
