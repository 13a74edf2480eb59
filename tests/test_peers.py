"""The peer-client plumbing of benchmarks/client_capacity.py (benchmarks/peers.py): the synthetic
server names a request in its first message when asked (`synthetic_echo_key`), and an SGLang
client's per-request TTFT/ITL lists are matched to the server's ground truth through that name."""

import importlib.util
import json
import sys
from pathlib import Path

import httpx

from tests.synthetic_server import SyntheticConfig, SyntheticServer

_BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(_BENCH))  # peers.py reads its sibling _common.py
_spec = importlib.util.spec_from_file_location("peers", _BENCH / "peers.py")
peers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(peers)


def _stream_texts(url: str, prompt: str, echo: bool) -> str:
    body = {"model": "synthetic", "prompt": prompt, "max_tokens": 4, "stream": True, "synthetic_echo_key": echo}
    out = []
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                msg = json.loads(line[6:])
                out += [c["text"] for c in msg.get("choices", [])]
    return "".join(out)


def test_echo_key_names_the_request_and_only_when_asked():
    with SyntheticServer(SyntheticConfig(ttft_ms=1, gap_ms=1)) as url:
        assert _stream_texts(url, "hello prompt", echo=False) == "abcd"
        assert _stream_texts(url, "hello prompt", echo=True) == peers.echo_key("hello prompt") + "abcd"


def test_sglang_errors_match_requests_by_echo_key_not_by_order():
    ms = 1_000_000
    records = {"p0": [(0, [5 * ms, 7 * ms, 9 * ms])], "p1": [(0, [6 * ms, 10 * ms, 14 * ms])]}
    # results in the other order: p1 first (its true gaps are 4 ms, p0's 2 ms)
    result = {"generated_texts": [peers.echo_key("p1") + "abc", peers.echo_key("p0") + "abc", "abc"],
              "ttfts": [0.006, 0.005, 0.004], "itls": [[0.004, 0.0045], [0.002, 0.002], [0.001, 0.001]],
              "errors": ["", "", ""]}
    out = peers.sglang_errors(result, records)
    assert out["missing"] == 1  # the third names no request
    assert sorted(round(x, 6) for x in out["icl_err_ms"]) == [0.0, 0.0, 0.0, 0.5]
