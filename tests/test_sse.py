"""Event-stream framing (WHATWG rules) and what the load client makes of each framing.

Two parts: the parser alone (`benchkit.measure.sse`, fed byte by byte where splits matter), and a
table of responses as real OpenAI-compatible stacks send them, written byte-exact with set delays
by `tests/rawbytes_server.py`. For each response the table gives the completion status and which
write completed each token-carrying event; expected TTFT, per-token ITL and ICL then follow from
the server's own write stamps (same process, same clock): every event must be stamped no earlier
than the write that completed it and less than one write gap later.
"""

from __future__ import annotations

import json

import pytest

from benchkit.measure.loadgen import run_load_sync
from benchkit.measure.metrics import request_metrics
from benchkit.measure.sse import SSEError, SSEParser
from benchkit.measure.workloads import Prompt
from benchkit.specs import WorkloadSpec
from tests.rawbytes_server import RawBytesServer, Script

# -- the parser alone -------------------------------------------------------------------------


def feed_all(parser: SSEParser, *chunks: bytes) -> list[list[tuple[str, str]]]:
    return [parser.feed(c) for c in chunks]


@pytest.mark.parametrize("sep", [b"\n", b"\r\n", b"\r"])
def test_each_line_ending_ends_lines_and_events(sep):
    p = SSEParser()
    assert p.feed(b"data: a" + sep + sep + b"data: b" + sep + sep) == [("message", "a"), ("message", "b")]
    assert not p.pending


def test_crlf_split_across_reads_is_one_line_end():
    p = SSEParser()
    # "data: a\r" | "\n" | "\n": the LF after the CR belongs to it, so only the second LF ends the event
    assert feed_all(p, b"data: a\r", b"\n", b"\n") == [[], [], [("message", "a")]]
    # a lone CR followed by data in the next read: the CR ended the line on its own
    assert feed_all(p, b"data: b\r", b"\r") == [[], [("message", "b")]]


def test_multi_line_data_is_joined_with_newline_and_one_space_dropped():
    p = SSEParser()
    assert p.feed(b"data: one\ndata:two\ndata:  three\ndata\n\n") == [("message", "one\ntwo\n three\n")]


def test_comments_event_id_retry_and_unknown_fields():
    p = SSEParser()
    events = p.feed(b": hello\nevent: update\nid: 7\nretry: 1500\nfoo: bar\ndata: x\n\n"
                    b"retry: soon\nid: bad\0id\ndata: y\n\n")
    assert events == [("update", "x"), ("message", "y")]  # the event type resets after dispatch
    assert p.last_event_id == "7" and p.retry_ms == 1500  # NUL id and non-digit retry are ignored


def test_blocks_without_data_dispatch_nothing():
    p = SSEParser()
    assert p.feed(b": ping\n\nevent: x\n\nid: 3\n\n") == []
    assert p.feed(b"data: z\n\n") == [("message", "z")]  # the type "x" was reset by the blank line


def test_leading_bom_is_dropped_once_even_when_split():
    p = SSEParser()
    assert feed_all(p, b"\xef", b"\xbb", b"\xbfdata: a\n\n") == [[], [], [("message", "a")]]
    q = SSEParser()
    # a second BOM is not at the stream's start: it stays part of the field name, which is unknown
    assert q.feed(b"\xef\xbb\xbf\xef\xbb\xbfdata: a\n\ndata: b\n\n") == [("message", "b")]


def test_multibyte_character_split_across_reads_is_decoded_once_complete():
    p = SSEParser()
    assert feed_all(p, b"data: \xe4\xb8", b"\xad\n", b"\n") == [[], [], [("message", "\u4e2d")]]


def test_invalid_utf8_raises_and_names_the_bytes():
    p = SSEParser()
    with pytest.raises(SSEError, match="not valid UTF-8.*xe4"):
        p.feed(b'data: {"text":"\xe4\xb8"}\n\n')


def test_unfinished_event_is_pending_not_dispatched():
    p = SSEParser()
    assert p.feed(b"data: a\n") == []
    assert p.pending and p.events_dispatched == 0


# -- the load client over raw bytes -------------------------------------------------------------

GAP_MS = 30.0  # between writes
FIRST_MS = 20.0  # before the first write
TOL_MS = 25.0  # a stamp may lag its write by scheduling; it must stay below one write gap


def m(cum: int | None, text: str = "a", finish: str | None = None) -> bytes:
    """A vLLM completion chunk; `cum` = cumulative completion tokens (None: no usage)."""
    doc: dict = {"id": "cmpl-1", "object": "text_completion", "created": 0, "model": "raw",
                 "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}
    if cum is not None:
        doc["usage"] = {"prompt_tokens": 5, "completion_tokens": cum, "total_tokens": 5 + cum}
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def usage_only(cum: int) -> bytes:
    return json.dumps({"id": "cmpl-1", "object": "text_completion", "model": "raw", "choices": [],
                       "usage": {"prompt_tokens": 5, "completion_tokens": cum, "total_tokens": 5 + cum}}).encode()


def ev(payload: bytes, sep: bytes = b"\n") -> bytes:
    return b"data: " + payload + sep + sep


def timeline(*writes: bytes) -> list[tuple[float, bytes]]:
    return [(FIRST_MS if i == 0 else GAP_MS, w) for i, w in enumerate(writes)]


def standard(sep: bytes) -> list[tuple[float, bytes]]:
    """Three token events of 1, 2 and 3 tokens, one per write, then usage and [DONE]."""
    return timeline(ev(m(1), sep), ev(m(3), sep),
                    ev(m(6, finish="length"), sep) + ev(usage_only(6), sep) + ev(b"[DONE]", sep))


STANDARD = [(0, 1), (1, 2), (2, 3)]
JSON_ERROR = (b'{"object":"error","message":"This model\'s maximum context length is 2048 tokens",'
              b'"type":"BadRequestError","param":null,"code":400}')

#: name -> (script, expected status: "ok" or an error prefix, substring the error must hold,
#:          [(index of the write that completes each token event, tokens it carries)])
CASES: dict[str, tuple[Script, str, str, list[tuple[int, int]]]] = {
    "lf": (Script(standard(b"\n")), "ok", "", STANDARD),
    "lf, not chunked": (Script(standard(b"\n"), chunked=False), "ok", "", STANDARD),
    "crlf (sse-starlette)": (Script(standard(b"\r\n")), "ok", "", STANDARD),
    "cr": (Script(standard(b"\r")), "ok", "", STANDARD),
    "mixed endings, CRLF split across writes": (Script(timeline(
        b"data: " + m(1) + b"\r\n\r",
        b"\ndata: " + m(3) + b"\n\r\n",
        b"data: " + m(6, finish="length") + b"\r\rdata: [DONE]\r\n\r\n")), "ok", "", STANDARD),
    "leading BOM": (Script(timeline(b"\xef\xbb\xbf" + ev(m(1)), ev(m(3)),
                                    ev(m(6, finish="length")) + ev(b"[DONE]"))), "ok", "", STANDARD),
    "comments between tokens": (Script(timeline(
        b": keep-alive\n\n", b"data: " + m(1) + b"\n: inside an event\n\n", b": ping\n\n", ev(m(3)),
        ev(m(6, finish="length")) + ev(b"[DONE]"))), "ok", "", [(1, 1), (3, 2), (4, 3)]),
    "event, id and retry lines": (Script(timeline(
        b"retry: 3000\nid: 1\nevent: message\ndata: " + m(1) + b"\n\n",
        b"event: ping\ndata: {}\n\nid: 2\ndata: " + m(3) + b"\n\n",
        b"id: 3\ndata: " + m(6, finish="length") + b"\n\ndata: [DONE]\n\n")), "ok", "", STANDARD),
    "one JSON over several data lines": (Script(timeline(
        ev(m(1)), ev(m(3)).replace(b'"choices"', b'\ndata: "choices"'),
        ev(m(6, finish="length")) + ev(b"[DONE]"))), "ok", "", STANDARD),
    "multi-byte character split across writes": (Script(timeline(
        b"data: " + m(1, text="\u4e2d").split(b"\xad")[0],
        b"\xad" + m(1, text="\u4e2d").split(b"\xad")[1] + b"\n\n",
        ev(m(3)), ev(m(6, finish="length")) + ev(b"[DONE]"))), "ok", "", [(1, 1), (2, 2), (3, 3)]),
    "two events in one write (coalesced)": (Script(timeline(
        ev(m(1)), ev(m(3)) + ev(m(4)), ev(m(6, finish="length")) + ev(b"[DONE]"))),
        "ok", "", [(0, 1), (1, 2), (1, 1), (2, 2)]),
    "finish reason, no usage, no [DONE]": (Script(timeline(
        ev(m(None)), ev(m(None)), ev(m(None, finish="stop")))), "ok", "", [(0, 1), (1, 1), (2, 1)]),
    "invalid UTF-8 in one event": (Script(timeline(
        ev(m(1)), ev(m(3, text="\u4e2d").replace(b"\xe4\xb8\xad", b"\xe4\xb8")), ev(b"[DONE]"))),
        "bad_stream", "not valid UTF-8", []),
    "in-band error object": (Script(timeline(
        ev(m(1)), ev(b'{"error":{"message":"engine overloaded","type":"ServiceUnavailableError","code":503}}'),
        ev(b"[DONE]"))), "stream error", "engine overloaded", []),
    "event: error": (Script(timeline(ev(m(1)), b'event: error\ndata: {"message":"boom"}\n\n')),
                     "stream error", "boom", []),
    "HTTP 200 with a JSON error body": (Script([(5, JSON_ERROR)], content_type="application/json", chunked=False),
                                        "error body", "maximum context length is 2048", []),
    "JSON error body sent as text/event-stream": (Script([(5, JSON_ERROR)]), "error body",
                                                  "maximum context length is 2048", []),
    "stream closed after 2 of 4 tokens": (Script(timeline(ev(m(1)), ev(m(2)))),
                                          "truncated_stream", "after 2 output tokens", []),
    "empty 200 body": (Script([]), "truncated_stream", "empty body", []),
}


def run_case(name: str, script: Script):
    warm = Script([(0, ev(m(1, finish="length")) + ev(b"[DONE]"))])
    server = RawBytesServer({name: script, "warm": warm})
    wl = WorkloadSpec(num_prompts=1, concurrency=1, output_len=6)
    with server as url:
        res = run_load_sync(url, "raw", wl, prompts=[Prompt("warm", 5, 6), Prompt(name, 5, 6)],
                            request_timeout_s=10)
    return res.logs[1], server.write_ns[name][0]


@pytest.mark.parametrize("name", list(CASES))
def test_framing_table(name):
    script, status, needle, chunks = CASES[name]
    log, writes_ns = run_case(name, script)
    rm = request_metrics(log)
    if status != "ok":
        assert not log.ok and not rm.completed
        assert log.error.startswith(status) and needle in log.error, log.error
        return
    assert log.ok and rm.completed, log.error
    assert rm.tokens_per_chunk == [n for _, n in chunks]
    token_events = [e for e in log.events if e.kind != "usage" and e.tokens > 0]
    for event, (w, _) in zip(token_events, chunks, strict=True):
        lag_ms = (event.t_ns - writes_ns[w]) / 1e6
        assert 0 <= lag_ms < TOL_MS, f"event stamped {lag_ms:.2f} ms after write {w}"
    truth_ttft = (writes_ns[chunks[0][0]] - log.send_ns) / 1e6
    assert truth_ttft <= rm.ttft_ms < truth_ttft + TOL_MS
    truth_icl = [(writes_ns[b] - writes_ns[a]) / 1e6 for (a, _), (b, _) in zip(chunks, chunks[1:], strict=False)]
    assert len(rm.icl_ms) == len(truth_icl)
    for got, want, (a, _), (b, _) in zip(rm.icl_ms, truth_icl, chunks, chunks[1:], strict=False):
        if a == b:
            assert got == 0.0  # one read completed both events: one stamp
        else:
            assert got == pytest.approx(want, abs=TOL_MS)
    truth_itl = [gap / n for gap, (_, n) in zip(truth_icl, chunks[1:], strict=True) for _ in range(n)]
    assert rm.itl_ms == pytest.approx(truth_itl, abs=TOL_MS / 2)
    assert rm.n_output_tokens == sum(n for _, n in chunks)


def test_bad_stream_fails_one_request_and_the_others_are_measured():
    good = Script(standard(b"\n"))
    bad = CASES["invalid UTF-8 in one event"][0]
    server = RawBytesServer({"good": good, "bad": bad})
    wl = WorkloadSpec(num_prompts=4, concurrency=2, output_len=6)
    prompts = [Prompt(t, 5, 6) for t in ("good", "good", "good", "bad", "good", "good")]
    with server as url:
        res = run_load_sync(url, "raw", wl, prompts=prompts, request_timeout_s=10)
    measured = res.logs[2:]
    assert [log.ok for log in measured] == [True, False, True, True]
    assert measured[1].error.startswith("bad_stream: ")
    assert all(request_metrics(log).n_output_tokens == 6 for log in measured if log.ok)
