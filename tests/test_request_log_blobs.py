"""Request-log blobs (issue 22): the compact version-2 layout (binary delta columns, zstandard)
round-trips exactly; blobs stored before it (version 1, zlib JSON, written by the encoder of
commit 5fd05cc: tests/fixtures/request_logs/) still decode exactly, and recompute gives the same
figures from either; a request's messages are columns, not objects."""

from __future__ import annotations

import pickle
import struct
from array import array
from pathlib import Path

import msgspec
import numpy as np
import pytest
import zstandard

from benchkit.measure.logs import (
    MAGIC,
    MessageEvent,
    RequestLog,
    decode_columns,
    decode_logs,
    encode_logs,
    encode_logs_v1,
)
from runs.models import RequestLogBlob, RunMetrics
from runs.selectors import window_of
from runs.services.recompute import recompute_runs
from tests.factories import finish_run, make_run, make_sweep
from tests.request_log_samples import sample_logs

FIXTURES = Path(__file__).parent / "fixtures" / "request_logs"


@pytest.mark.parametrize("spec", [False, True])
def test_version1_blobs_written_before_issue_22_decode_exactly(spec):
    blob = (FIXTURES / f"v1_{'spec' if spec else 'plain'}.bin").read_bytes()
    logs = sample_logs(spec)
    assert decode_logs(blob) == logs
    assert encode_logs_v1(logs) == blob  # the kept v1 writer is byte for byte the old one
    assert (decode_columns(blob).spec is None) is (not spec)


@pytest.mark.parametrize("spec", [False, True])
def test_version1_columns_are_parsed_straight_into_numpy(spec):
    """Issue 22: a version-1 blob's message columns are read without a Python int per value, and
    give the same document as the full parse; a document that is not plain integer arrays takes
    the full parse (same figures, same errors)."""
    import json
    import zlib

    from benchkit.measure import logs as logs_mod

    blob = (FIXTURES / f"v1_{'spec' if spec else 'plain'}.bin").read_bytes()
    text = zlib.decompress(blob)
    fast = logs_mod._parse_v1_columns(text)
    assert fast is not None
    full = msgspec.json.decode(text)
    for c in ("ev_dt_ns", "ev_tokens", "ev_kind"):
        assert fast[c].dtype == np.int64 and fast[c].tolist() == full[c]
    assert {k: v for k, v in fast.items() if not k.startswith("ev_")} == {
        k: v for k, v in full.items() if not k.startswith("ev_")}
    doc = json.loads(text)
    doc["ev_dt_ns"][0] = float(doc["ev_dt_ns"][0])  # 1e6-style values: numpy casts them, as before
    odd = json.dumps(doc).encode()
    assert logs_mod._parse_v1_columns(odd) is None
    assert decode_logs(zlib.compress(odd)) == decode_logs(blob)
    doc["ev_kind"][3] = "content"
    with pytest.raises(ValueError, match="bad event kind code 'content'"):
        decode_logs(zlib.compress(json.dumps(doc).encode()))
    assert logs_mod.LogChunks.decode(blob, max_events=7) is not None
    assert [c for chunk in logs_mod.LogChunks.decode(blob, max_events=7) for c in chunk.t_ns.tolist()] == \
        decode_columns(blob).t_ns.tolist()


@pytest.mark.parametrize("spec", [False, True])
def test_version2_round_trip_is_exact_and_smaller(spec):
    logs = sample_logs(spec, n=60)
    blob = encode_logs(logs)
    assert blob.startswith(MAGIC)
    assert decode_logs(blob) == logs
    assert len(blob) < len(encode_logs_v1(logs))
    cols = decode_columns(blob)
    assert cols.t_ns.dtype == np.int64 and cols.kind.dtype == np.int8
    assert int(cols.n_events.sum()) == sum(log.n_events for log in logs) == len(cols.t_ns)


def test_version2_blocks_wide_deltas_and_empty_logs():
    """More requests than one shuffle block, a delta that needs 64 bits, requests without messages."""
    logs = []
    for i in range(600):
        log = RequestLog(index=i, warmup=False, send_ns=-5 + i, end_ns=i + 9)
        if i % 3:
            log.events = [MessageEvent(i + j * (1 << 40 if i == 7 else 1_000_003), j % 4, "content")
                          for j in range(i % 11)]
        logs.append(log)
    assert decode_logs(encode_logs(logs)) == logs
    assert decode_logs(encode_logs([])) == []


def test_version2_decode_errors():
    blob = encode_logs(sample_logs(False))
    with pytest.raises(ValueError, match="not an encoded log blob"):
        decode_logs(MAGIC + b"not zstd")
    with pytest.raises(ValueError, match="not an encoded log blob"):
        decode_logs(blob[:-9])  # truncated frame
    payload = zstandard.ZstdDecompressor().decompressobj().decompress(blob[len(MAGIC):])
    with pytest.raises(ValueError, match="bytes of columns"):
        decode_logs(MAGIC + zstandard.ZstdCompressor().compress(payload[:-1]))
    (n,) = struct.unpack_from("<I", payload)
    head = payload[4:4 + n].replace(b'"v":2', b'"v":7')
    with pytest.raises(ValueError, match="format version 7"):
        decode_logs(MAGIC + zstandard.ZstdCompressor().compress(payload[:4] + head + payload[4 + n:]))
    kinds_at = len(payload) - int(sum(log.n_events for log in sample_logs(False)))  # ev_kind is int8, last
    bad = payload[:kinds_at] + b"\x05" + payload[kinds_at + 1:]
    with pytest.raises(ValueError, match="bad event kind code 5"):
        decode_logs(MAGIC + zstandard.ZstdCompressor().compress(bad))


def test_messages_are_columns_wrapped_without_a_copy():
    t, n, k = array("q", [5, 9, 12]), array("q", [1, 2, 0]), bytearray([1, 1, 2])
    log = RequestLog(index=0, warmup=False, send_ns=1)
    log.set_columns(t, n, k)
    assert np.shares_memory(log.ev_t_ns, np.frombuffer(t, dtype=np.int64))
    assert log.events == [MessageEvent(5, 1, "content"), MessageEvent(9, 2, "content"), MessageEvent(12, 0, "usage")]
    assert pickle.loads(pickle.dumps(log)) == log
    with pytest.raises(ValueError, match="lengths"):
        log.set_columns(t, n, bytearray([1]))
    with pytest.raises(ValueError, match="bad event kind code"):
        log.set_columns(t, n, bytearray([1, 3, 1]))
    other = RequestLog(index=0, warmup=False, send_ns=1, events=log.events[:2])
    assert other != log


@pytest.mark.django_db
def test_recompute_reads_old_and_new_blobs_to_the_same_figures():
    sweep = make_sweep()
    runs = [finish_run(make_run(sweep, repeat=r), gap_ms=7.0) for r in range(2)]
    blob = RequestLogBlob.objects.get(run=runs[0])
    assert bytes(blob.data).startswith(MAGIC)  # the storing path writes version 2
    logs = decode_logs(bytes(blob.data))
    RequestLogBlob.objects.filter(run=runs[1]).update(data=encode_logs_v1(logs))  # as stored before issue 22
    stored = window_of(RunMetrics.objects.get(run=runs[0])).to_dict()
    RunMetrics.objects.filter(run__in=runs).update(mean_ttft_ms=None, output_throughput_tok_s=None)
    assert recompute_runs([r.pk for r in runs]) == 2
    new, old = (RunMetrics.objects.get(run=r) for r in runs)
    assert window_of(new).to_dict() == window_of(old).to_dict() == stored
    assert new.distributions == old.distributions
