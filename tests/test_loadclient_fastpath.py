"""The load client's fast paths (issue 22) record exactly what the general paths record.

- `RequestStream.data`: whole `data:` events decoded into typed structs, against the SSE parser
  and the dict rules (`RequestStream._message`), for every message shape the client reads and
  for the shapes the fast path must hand back (usage-only, errors, engine extras, bad types,
  invalid UTF-8 in a field the typed decoder skips, [DONE], comments, CRLF, split events).
- `_Body.feed`: whole chunks taken without the state machine, against the state machine alone,
  over random splits of chunked bodies with extensions, trailers and odd sizes.
"""

from __future__ import annotations

import json
import random

import pytest

from benchkit.measure import httpstream
from benchkit.measure.loadclient import RequestStream
from benchkit.measure.logs import RequestLog
from benchkit.measure.sse import SSEError, SSEParser


def _sse(obj) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


def _cmpl(text, ids=None, finish=None, usage=None, **extra):
    choice = {"index": 0, "text": text, "finish_reason": finish}
    if ids is not None:
        choice["token_ids"] = ids
    msg = {"id": "cmpl-1", "object": "text_completion", "model": "m", "choices": [choice], **extra}
    if usage is not None:
        msg["usage"] = usage
    return msg


def _chat(delta, finish=None, usage=None, **choice_extra):
    msg = {"id": "c-1", "object": "chat.completion.chunk", "model": "m",
           "choices": [{"index": 0, "delta": delta, "finish_reason": finish, **choice_extra}]}
    if usage is not None:
        msg["usage"] = usage
    return msg


STREAMS = {
    "completions with token ids": [_sse(_cmpl("a", [1])), _sse(_cmpl("bc", [2, 3])), _sse(_cmpl("", [], "length")),
                                   _sse({"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 3}}),
                                   b"data: [DONE]\n\n"],
    "completions, text only": [_sse(_cmpl("a")), _sse(_cmpl("")), _sse(_cmpl("b", finish="stop")), b"data: [DONE]\n\n"],
    "usage on every message": [_sse(_cmpl("a", usage={"prompt_tokens": 5, "completion_tokens": 2})),
                               _sse(_cmpl("b", usage={"prompt_tokens": 5, "completion_tokens": 5})),
                               _sse(_cmpl("c", usage={"prompt_tokens": None, "completion_tokens": 6},
                                          finish="length"))],
    "chat content, reasoning, reasoning_content, delta ids": [
        _sse(_chat({"role": "assistant", "content": ""})), _sse(_chat({"reasoning": "think"})),
        _sse(_chat({"reasoning_content": "more", "token_ids": [7, 8]})),
        _sse(_chat({"content": "x", "reasoning": "y"})),
        _sse(_chat({"content": "z"}, token_ids=[9])), _sse(_chat({}, finish="stop")), b"data: [DONE]\n\n"],
    "several events per read, and a split event": [
        _sse(_cmpl("a", [1])) + _sse(_cmpl("b", [2])), _sse(_cmpl("c", [3]))[:20], _sse(_cmpl("c", [3]))[20:],
        _sse(_cmpl("d", [4], "stop")) + b"data: [DONE]\n\n"],
    "CRLF lines, comments, event types": [
        b": keep-alive\n\n", _sse(_cmpl("a", [1])).replace(b"\n", b"\r\n"), _sse(_cmpl("b", [2])),
        b"event: message\n" + _sse(_cmpl("c", [3])), b"data: " + json.dumps(_cmpl("d", [4])).encode() + b"\r\n\r\n"],
    "engine extras go the general way": [
        _sse(_cmpl("a", [1])),
        _sse(_cmpl("b", [2], "stop", metrics={"speculative_decoding": {"num_spec_steps": 2,
                                                                       "num_accepted_draft_tokens": 3}})),
        _sse({"choices": [{"index": 0, "text": "c", "finish_reason": None}],
              "sglext": {"spec_tokens_details": {"spec_verify_ct": 4, "spec_num_correct_drafts": 5}}}),
        _sse({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2},
              "metrics": {"speculative_decoding": {"num_spec_steps": 1, "num_accepted_draft_tokens": 1}}})],
    "in-band error object": [_sse(_cmpl("a", [1])), _sse({"error": {"message": "boom", "code": 500}}),
                             _sse(_cmpl("b", [2]))],
    "error event type": [_sse(_cmpl("a", [1])), b"event: error\ndata: {\"message\": \"bad\"}\n\n"],
    "object error": [_sse({"object": "error", "message": "nope", "choices": []})],
    "not JSON": [_sse(_cmpl("a", [1])), b"data: {not json\n\n"],
    "not an object": [_sse(b"[1, 2]")],
    "empty data": [b"data: \n\n"],
    "finish reason of another type": [_sse(_cmpl("a", [1])), _sse(b'{"choices":[{"text":"b","finish_reason":7}]}')],
    "token ids of another type": [_sse(b'{"choices":[{"text":"b","token_ids":["x"]}]}')],
    "delta that is not an object": [_sse(b'{"choices":[{"delta":"text","text":"t","finish_reason":null}]}')],
    "usage that is not an object": [_sse(b'{"choices":[{"text":"t"}],"usage":[1]}')],
    "completion tokens as a float": [_sse(b'{"choices":[{"text":"t","token_ids":[1]}],'
                                          b'"usage":{"prompt_tokens":2,"completion_tokens":3.0}}')],
    "choices that are not objects": [_sse(b'{"choices":[5]}')],
    "invalid UTF-8 in a skipped field": [_sse(_cmpl("a", [1])), b'data: {"id":"\xff","choices":[{"text":"b"}]}\n\n'],
    "an error, then invalid UTF-8, in one read": [_sse(_cmpl("a", [1])), _sse({"error": {"message": "x"}})
                                                  + b'data: {"choices":[{"text":"\xff"}]}\n\n'],
    "invalid UTF-8 in the text": [b'data: {"choices":[{"text":"\xe4\xb8"}]}\n\n'],
    "non-ASCII text": [_sse(_cmpl("h\u00e9llo \u4e16", [1, 2])), _sse(_cmpl("\U0001f600", [3], "stop"))],
    "duplicate keys": [_sse(b'{"choices":[{"text":"a","token_ids":[1]}],"choices":[{"text":"b","token_ids":[2,3]}]}')],
    "no choices key, usage only": [_sse({"usage": {"prompt_tokens": 3, "completion_tokens": 0}})],
}


def _run(pieces: list[bytes], fast: bool) -> dict:
    stream = RequestStream(RequestLog(index=0, warmup=False, send_ns=0))
    stream.head(200, {"content-type": "text/event-stream"})
    returned, raised = [], ""
    for i, piece in enumerate(pieces):
        if not fast:
            stream.fast = False
        try:
            returned.append(stream.data(piece, 1000 + i))
        except SSEError as exc:  # what send_request records as bad_stream
            raised = str(exc)
            break
        if returned[-1]:
            break
    if not raised:
        stream.conclude()
    log = stream.log
    return {
        "returned": returned, "raised": raised,
        "t_ns": list(stream.t_ns), "tokens": list(stream.tokens), "kinds": bytes(stream.kinds),
        "ids": list(stream.ids), "text": stream.text, "ids_complete": stream.ids_complete, "cum": stream.cum,
        "finished": stream.finished, "error": stream.error, "events_seen": stream.events_seen,
        "dispatched": stream.parser.events_dispatched, "ok": log.ok, "log_error": log.error,
        "prompt_tokens": log.prompt_tokens, "completion_tokens": log.completion_tokens,
        "tokens_from_text": log.tokens_from_text, "spec": (log.spec_steps, log.spec_draft_tokens,
                                                           log.spec_accepted_tokens, log.spec_histogram),
    }


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_fast_path_records_what_the_general_path_records(name):
    pieces = STREAMS[name]
    assert _run(pieces, fast=True) == _run(pieces, fast=False)


def test_fast_path_is_taken_for_the_common_message():
    stream = RequestStream(RequestLog(index=0, warmup=False, send_ns=0))
    stream.head(200, {"content-type": "text/event-stream"})
    assert not stream.fast  # the first bytes go through the parser (byte-order mark check)
    stream.data(_sse(_cmpl("a", [1])), 1)
    assert stream.fast

    class NoFeed(SSEParser):
        def feed(self, chunk):
            raise AssertionError("the fast path went through the SSE parser")

    stream.parser = NoFeed()
    stream.parser._head = None  # past the byte-order mark check, as the real parser is by now
    assert stream.data(_sse(_cmpl("b", [2])), 2) is False
    assert list(stream.tokens) == [1, 1] and list(stream.t_ns) == [1, 2]


def test_invalid_utf8_in_a_field_the_typed_decoder_skips_is_still_refused():
    pieces = [_sse(_cmpl("a", [1])), b'data: {"model":"\xc3","choices":[{"text":"b","token_ids":[2]}]}\n\n']
    fast, slow = _run(pieces, True), _run(pieces, False)
    assert fast == slow
    assert fast["raised"].startswith("event 2 is not valid UTF-8") and fast["tokens"] == [1]


# -- chunked framing --------------------------------------------------------------------------------

def _chunked(datas: list[bytes], rng: random.Random) -> bytes:
    out = b""
    for d in datas:
        size = f"{len(d):x}".encode()
        style = rng.random()
        if style < 0.1:
            size = size.upper()
        elif style < 0.2:
            size += b";ext=1"
        elif style < 0.25:
            size = b"000" + size
        out += size + b"\r\n" + d + b"\r\n"
    trailer = b"X-Trailer: 1\r\n" if rng.random() < 0.3 else b""
    return out + b"0\r\n" + trailer + b"\r\n"


def _feed_all(raw: bytes, cuts: list[int], fast: bool, monkeypatch) -> tuple[bytes, int, int, bytes]:
    body = httpstream._Body()
    body.state, body.mode = body.SIZE, "chunked"
    if not fast:
        monkeypatch.setattr(httpstream._Body, "_whole_chunks", lambda self, data, out: 0)
    out: list[bytes] = []
    prev = 0
    for cut in cuts + [len(raw)]:
        body.feed(raw[prev:cut], out)
        prev = cut
    monkeypatch.undo()
    return b"".join(out), body.state, body.body_bytes, body.buf


@pytest.mark.parametrize("seed", range(40))
def test_whole_chunk_fast_path_frames_like_the_state_machine(seed, monkeypatch):
    rng = random.Random(seed)
    datas = [bytes(rng.randrange(256) for _ in range(rng.choice([1, 2, 15, 16, 17, 200, 5000])))
             for _ in range(rng.randrange(1, 12))]
    raw = _chunked(datas, rng)
    cuts = sorted(rng.sample(range(1, len(raw)), k=min(len(raw) - 1, rng.randrange(0, 8))))
    fast = _feed_all(raw, cuts, True, monkeypatch)
    slow = _feed_all(raw, cuts, False, monkeypatch)
    assert fast == slow
    assert fast[0] == b"".join(datas) and fast[1] == httpstream._Body.DONE


def test_whole_chunk_fast_path_leaves_bad_framing_to_the_state_machine():
    for raw, message in ((b"zz\r\nab\r\n", "bad chunk size"), (b"2\r\nabXY", "not followed by CRLF")):
        body = httpstream._Body()
        body.state, body.mode = body.SIZE, "chunked"
        with pytest.raises(httpstream.HttpError, match=message):
            body.feed(raw, [])


# -- random streams: every shape above, mixed, cut into reads at random places ----------------------

def _random_pieces(rng: random.Random) -> list[bytes]:
    pool = [piece for name in sorted(STREAMS) for piece in STREAMS[name] if b"[DONE]" not in piece]
    events = [rng.choice(pool) for _ in range(rng.randrange(1, 12))]
    if rng.random() < 0.5:
        events.append(b"data: [DONE]\n\n")
    raw = b"".join(events)
    if rng.random() < 0.2:
        raw = b"\xef\xbb\xbf" + raw  # a byte-order mark first
    # reads: mostly whole events (the fast path's case), sometimes several, sometimes cut anywhere
    pieces, at = [], 0
    while at < len(raw):
        if rng.random() < 0.6:
            end = raw.find(b"\n\n", at)
            end = len(raw) if end < 0 else end + 2
            while rng.random() < 0.2 and end < len(raw):
                nxt = raw.find(b"\n\n", end)
                end = len(raw) if nxt < 0 else nxt + 2
        else:
            end = min(len(raw), at + rng.randrange(1, 200))
        pieces.append(raw[at:end])
        at = end
    return pieces


@pytest.mark.parametrize("seed", range(300))
def test_random_streams_record_the_same_on_both_paths(seed):
    pieces = _random_pieces(random.Random(seed))
    assert _run(pieces, fast=True) == _run(pieces, fast=False)
