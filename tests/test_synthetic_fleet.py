"""The synthetic server's cheap paths write what the plain ones wrote: `_ChunkEncoder` the bytes of
`json.dumps` of the chunk dict, the pump the same HTTP bytes on the same schedule (never early) as
a task per request (polling or not); and a SyntheticFleet hands its connections round-robin to
its processes."""

import itertools
import json
import re
import socket

import httpx
import numpy as np
import pytest

from tests.synthetic_server import (
    SyntheticConfig,
    SyntheticFleet,
    SyntheticServer,
    _chunk_dict,
    _ChunkEncoder,
    _sse,
)


@pytest.mark.parametrize("chat,want_ids,usage_prompt", itertools.product((False, True), (False, True), (None, 7)))
def test_chunk_encoder_writes_the_dumped_dict_byte_for_byte(chat, want_ids, usage_prompt):
    cache: dict = {}
    for model, field in (("synthetic", "reasoning"), ('m\u00e9del "q"\\', "reasoning_content")):
        enc = _ChunkEncoder(cache, chat, 12, model, want_ids, field, usage_prompt)
        for text, reasoning, cum, finish in itertools.product(
                ("a", "Zq", "", "[0a1b2c3d]ab", "\u00e9\"\\\n"), (False, True), (0, 1, 129), (None, "length", "stop")):
            want = _sse(_chunk_dict(chat, 12, model, want_ids, field, usage_prompt, text, reasoning, cum, finish))
            assert enc.message(text, reasoning, cum, finish) == want
            assert enc.message(text, reasoning, cum, finish) == want  # from the cache the second time


def _raw_exchanges(config: SyntheticConfig) -> tuple[list[bytes], SyntheticServer]:
    """Raw HTTP/1.1 responses (Date and Server headers cut) to a few streamed requests."""
    out = []
    server = SyntheticServer(config)
    with server as url:
        port = int(url.rsplit(":", 1)[1])
        usage = {"stream_options": {"include_usage": True, "continuous_usage_stats": True}}
        for i, (path, extra) in enumerate(itertools.product(
                ("/v1/completions", "/v1/chat/completions"),
                ({"return_token_ids": True}, usage, {"synthetic_echo_key": True, "max_tokens": 40}))):
            body = {"model": "synthetic", "max_tokens": 9, "stream": True, **extra}
            if "chat" in path:
                body["messages"] = [{"role": "user", "content": f"prompt {i}"}]
            else:
                body["prompt"] = f"prompt {i}"
            data = json.dumps(body).encode()
            with socket.create_connection(("127.0.0.1", port)) as s:
                s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                          b"Connection: close\r\n\r\n%s" % (path.encode(), len(data), data))
                raw = b""
                while chunk := s.recv(65536):
                    raw += chunk
            out.append(re.sub(rb"(Date|Server): [^\r]*\r\n", b"", raw))
    return out, server


@pytest.mark.parametrize("poll_ms", [0.0, 1.0])
def test_the_pump_writes_the_same_bytes_as_a_task_per_request_and_never_early(poll_ms):
    kw = {"ttft_ms": 2.0, "gap_ms": 0.4, "record_sends": True, "spec_k": 3, "spec_metrics": True,
          "tokens_per_message": 2}
    pumped, server = _raw_exchanges(SyntheticConfig(pump=True, pump_poll_ms=poll_ms, **kw))
    tasks, _ = _raw_exchanges(SyntheticConfig(pump=False, **kw))
    assert pumped == tasks
    assert all(b"Transfer-Encoding: chunked" in r and r.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n") for r in pumped)
    n = 0
    for recs in server.sends.values():
        for arrival, sends in recs:
            due = arrival + np.round((kw["ttft_ms"] + kw["gap_ms"] * np.arange(len(sends))) * 1e6)
            # the schedule starts from the loop's clock read just before the arrival stamp
            assert np.all(np.asarray(sends) >= due - 100_000), (np.asarray(sends) - due) / 1e6
            n += len(sends)
    assert n == 2 * (5 + 5 + 20)  # 9 tokens in 5 messages of 2, 40 in 20


@pytest.mark.parametrize("balance", [True, False])
def test_fleet_serves_on_one_port_and_hands_connections_round_robin(balance):
    fleet = SyntheticFleet([None, None, None], balance=balance, ttft_ms=1.0, gap_ms=0.5)
    with fleet as url:
        for i in range(9):
            with httpx.Client(timeout=30) as client:  # a new connection each
                r = client.post(f"{url}/v1/completions", json={"prompt": f"p{i}", "max_tokens": 5, "stream": True})
                assert r.text.count("data: ") == 6
        per_process = [len(records) for records in fleet.collect_each()]
        assert sum(per_process) == 9
        if balance:
            assert per_process == [3, 3, 3]
        assert fleet.collect() == {}  # collected and cleared
