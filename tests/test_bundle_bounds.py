"""Decompression is bounded (issue 31: a 0.5 MB gzip ingest bundle took the web server from 207 to
665 MB): a gzip bomb posted to `POST /api/ingest/` is answered 413 naming the limit, stores
nothing and keeps memory small; sizes in tar headers are never trusted; every blob decoder
(request logs v1 and v2, telemetry, outputs) refuses a decompression bomb by name.

The bombs are built without ever holding their decompressed bytes: gzip allows concatenated
members, so one member of 16 MiB of zeros (16 KB compressed) is repeated; zlib and zstandard
bombs are compressed a chunk at a time."""

from __future__ import annotations

import gzip
import io
import resource
import struct
import tarfile
import time
import tracemalloc
import uuid
import zlib
from datetime import UTC, datetime

import msgspec
import pytest
import zstandard

from benchkit import inflate
from benchkit.execution import bundle as bundle_mod
from benchkit.execution.bundle import (
    MANIFEST,
    MAX_BUNDLE_BYTES,
    MAX_FILE_BYTES,
    BundleError,
    BundleManifest,
    BundleTooLarge,
    ManifestRun,
    open_bundle_tar,
    run_file_name,
)
from benchkit.measure import gpu_samples, logs, outputs
from runs.models import HardwareSnapshot, Host, RequestLogBlob, Run, RunMetrics, RunTransition, Sweep
from runs.services import ingest

HOST = "gpu-bomb"
MiB = 1024 * 1024
#: Loose bound on the memory an over-limit upload may take (the old reader held it all: GBs).
MAX_GROWTH = 100 * MiB

_ZEROS = 16 * MiB
_GZ_ZEROS = gzip.compress(bytes(_ZEROS), 6)  # one gzip member of 16 MiB zeros, ~16 KB


def gz_zeros(n: int) -> bytes:
    """gzip members that decompress to `n` zero bytes (never built decompressed)."""
    full, rest = divmod(n, _ZEROS)
    return _GZ_ZEROS * full + (gzip.compress(bytes(rest), 6) if rest else b"")


def _header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o644, 0
    return info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape")


def tar_gz(members: list[tuple[str, bytes | int, int | None]]) -> bytes:
    """A tar.gz of `members` (name, content, size its header claims: None for the true size);
    content is bytes, or an int: that many zero bytes, as concatenated gzip members."""
    out = []
    for name, content, claimed in members:
        size = content if isinstance(content, int) else len(content)
        out.append(gzip.compress(_header(name, size if claimed is None else claimed), 6))
        out.append(gz_zeros(content) if isinstance(content, int) else gzip.compress(content, 6))
        out.append(gzip.compress(bytes(-size % 512), 6))
    out.append(gzip.compress(bytes(1024), 6))  # end of archive
    return b"".join(out)


def manifest(run_uuid: uuid.UUID | None = None) -> bytes:
    runs = [ManifestRun(uuid=run_uuid, file=run_file_name(run_uuid), sha256="0" * 64, state="succeeded")] \
        if run_uuid else []
    return BundleManifest(bundle_id=uuid.uuid4(), host=HOST, created_at=datetime.now(UTC), sweep_name="bomb",
                          sweep_file="bomb.yaml", sweep_text="", runs=runs).model_dump_json().encode()


def _counts() -> tuple[int, ...]:
    return (Run.objects.count(), RunMetrics.objects.count(), RequestLogBlob.objects.count(),
            HardwareSnapshot.objects.count(), RunTransition.objects.count(), Sweep.objects.count())


def _measured(label: str, fn):
    """fn()'s result, its traced peak memory growth (bytes) and its time; printed."""
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    t0 = time.perf_counter()
    try:
        result = fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1] - base
        tracemalloc.stop()
    took = time.perf_counter() - t0
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"\n[{label}] peak traced memory growth {peak / MiB:.1f} MiB, process peak RSS {rss0 / 1024:.0f} -> "
          f"{rss1 / 1024:.0f} MiB, {took:.1f} s")
    return result, peak


def _post(client, data: bytes, token: str):
    return client.post("/api/ingest/", data=data, content_type="application/gzip",
                       HTTP_AUTHORIZATION=f"Bearer {token}")


# --- the ingest endpoint -----------------------------------------------------------------------------

@pytest.mark.django_db
def test_a_gzip_bomb_run_file_is_413_naming_the_limit_stores_nothing_in_small_memory(client):
    _, token = ingest.create_token(Host.objects.create(name=HOST), "lab")
    run_uuid = uuid.uuid4()
    data = tar_gz([(MANIFEST, manifest(run_uuid), None), (run_file_name(run_uuid), 10**9, None)])
    assert len(data) < 2 * MiB  # 1 GB of zeros
    resp, peak = _measured("1 GB run-file bomb", lambda: _post(client, data, token))
    assert resp.status_code == 413, resp.content
    error = resp.json()["error"]
    assert f"runs/{run_uuid}.json: decompresses to more than {MAX_FILE_BYTES} bytes (256 MiB, MAX_FILE_BYTES" \
        in error and error.endswith("(nothing stored)")
    assert resp.json()["limit_bytes"] == MAX_FILE_BYTES
    assert _counts() == (0, 0, 0, 0, 0, 0)
    assert peak < MAX_GROWTH


@pytest.mark.django_db
def test_a_bundle_decompressing_past_max_bundle_bytes_is_413_even_in_members_never_kept(client):
    """Every decompressed byte counts, also those of members ingest ignores (work/ logs)."""
    _, token = ingest.create_token(Host.objects.create(name=HOST), "lab")
    data = tar_gz([(MANIFEST, manifest(), None), ("work/server.log", MAX_BUNDLE_BYTES + MiB, None)])
    resp, peak = _measured("1 GiB + 1 MiB bomb in an ignored member", lambda: _post(client, data, token))
    assert resp.status_code == 413, resp.content
    error = resp.json()["error"]
    assert f"<archive>: decompresses to more than {MAX_BUNDLE_BYTES} bytes (1 GiB, MAX_BUNDLE_BYTES)" in error
    assert "refused without reading further" in error and error.endswith("(nothing stored)")
    assert _counts() == (0, 0, 0, 0, 0, 0)
    assert peak < MAX_GROWTH


def test_reading_stops_at_the_limit_counting_bytes_not_header_sizes():
    """The limit counts decompressed bytes: tar headers and all; reading stops one chunk past it."""
    data = tar_gz([(MANIFEST, manifest(), None), ("work/a.log", 3 * MiB, None)])
    with pytest.raises(BundleTooLarge, match=r"<archive>: decompresses to more than 2097152 bytes \(2 MiB, MAX_BUN"):
        open_bundle_tar(io.BytesIO(data), max_bytes=2 * MiB)
    assert open_bundle_tar(io.BytesIO(data), max_bytes=4 * MiB).manifest.host == HOST


@pytest.mark.django_db
def test_a_header_that_under_reports_a_run_files_size_gets_only_its_claimed_bytes(client):
    """A run file whose header says 100 bytes but is followed by 4 MiB more (and a gigabyte of
    zeros after that): only the 100 claimed bytes are read as the file (its sha256 is not the
    manifest's: refused, nothing stored); the rest is not a tar header, so reading ends there
    and the gigabyte is never decompressed."""
    run_uuid = uuid.uuid4()
    body = b'{"format_version": 4, ' + b"x" * (4 * MiB)
    data = tar_gz([(MANIFEST, manifest(run_uuid), None), (run_file_name(run_uuid), body, 100),
                   ("work/after.log", 10**9, None)])
    opened, peak = _measured("under-reported header", lambda: open_bundle_tar(io.BytesIO(data)))
    assert opened.read(run_file_name(run_uuid)) == body[:100]
    assert peak < MAX_GROWTH
    with pytest.raises(BundleError, match="is not the manifest's"):
        opened.run(opened.manifest.runs[0])
    _, token = ingest.create_token(Host.objects.create(name=HOST), "lab")
    resp = _post(client, data, token)
    assert resp.status_code == 422 and resp.json()["refused"] == 1, resp.content
    assert _counts()[:5] == (0, 0, 0, 0, 0)


def test_a_header_that_over_reports_a_size_is_a_cut_archive():
    data = tar_gz([(MANIFEST, manifest(), 10 * MiB)])
    with pytest.raises(BundleError, match=r"<archive>: not a complete tar.gz"):
        open_bundle_tar(io.BytesIO(data))


def test_a_manifest_past_max_file_bytes_is_refused_by_name():
    data = tar_gz([(MANIFEST, 2 * MiB, None)])
    with pytest.raises(BundleTooLarge, match=r"manifest.json: decompresses to more than 1048576 bytes \(1 MiB"):
        open_bundle_tar(io.BytesIO(data), max_file_bytes=MiB)


def test_limits_are_the_documented_ones():
    assert MAX_BUNDLE_BYTES == inflate.MAX_INFLATED_BYTES == 1 << 30
    assert MAX_FILE_BYTES == inflate.MAX_BLOB_BYTES == 256 * MiB
    assert bundle_mod.open_bundle_tar.__defaults__ == (MAX_BUNDLE_BYTES, MAX_FILE_BYTES)


# --- the blob decoders -------------------------------------------------------------------------------

def zlib_zeros(n: int, prefix: bytes = b"") -> bytes:
    c = zlib.compressobj(6)
    parts = [c.compress(prefix)]
    full, rest = divmod(n, _ZEROS)
    zeros = bytes(_ZEROS)
    parts += [c.compress(zeros) for _ in range(full)]
    parts += [c.compress(bytes(rest)), c.flush()]
    return b"".join(parts)


def test_telemetry_bomb_is_refused_at_max_blob_bytes():
    bomb = zlib_zeros(inflate.MAX_BLOB_BYTES + MiB)
    assert len(bomb) < MiB
    with pytest.raises(inflate.InflateLimitError, match=r"^telemetry: decompresses to more than 268435456 bytes "
                                                        r"\(256 MiB, MAX_BLOB_BYTES\); refused"):
        _measured("telemetry bomb", lambda: gpu_samples.decode_telemetry(bomb))


def test_outputs_bomb_is_refused_at_max_blob_bytes():
    bomb = zlib_zeros(inflate.MAX_BLOB_BYTES + MiB)
    with pytest.raises(inflate.InflateLimitError, match=r"^outputs: decompresses to more than 268435456 bytes "
                                                        r"\(256 MiB, MAX_BLOB_BYTES\)"):
        outputs.decode_outputs(bomb)


def test_version1_log_bomb_is_refused_at_max_inflated_bytes(monkeypatch):
    monkeypatch.setattr(logs, "MAX_INFLATED_BYTES", 8 * MiB)  # the real 1 GiB works the same, slower
    bomb = zlib_zeros(64 * MiB, b'{"v": 1, "index": [')
    for decode in (logs.decode_logs, logs.decode_columns, logs.LogChunks.decode):
        with pytest.raises(ValueError, match=r"^request logs: decompresses to more than 8388608 bytes \(8 MiB, "
                                             r"MAX_INFLATED_BYTES\)"):
            decode(bomb)


def _v2(head: dict, body_zeros: int) -> bytes:
    """A version-2 log blob: MAGIC, then a zstandard frame of the header and `body_zeros` zeros."""
    h = msgspec.json.encode(head)
    c = zstandard.ZstdCompressor(level=3).compressobj()
    parts = [logs.MAGIC, c.compress(struct.pack("<I", len(h)) + h)]
    full, rest = divmod(body_zeros, _ZEROS)
    zeros = bytes(_ZEROS)
    parts += [c.compress(zeros) for _ in range(full)]
    parts += [c.compress(bytes(rest)), c.flush()]
    return b"".join(parts)


def _v2_head(n_events: int) -> dict:
    blob = logs.encode_logs([logs.RequestLog(0, False, 0)])  # one request, no messages
    raw = zstandard.ZstdDecompressor().decompressobj().decompress(blob[len(logs.MAGIC):])
    (n,) = struct.unpack_from("<I", raw)
    doc = msgspec.json.decode(raw[4:4 + n])
    doc["n_events"], doc["n_events_total"] = [n_events], n_events
    doc["dtypes"] = {c: "<i8" for c in doc["dtypes"]}
    return doc


def test_version2_log_frame_longer_than_its_header_says_stops_one_byte_past():
    """A header of 0 messages followed by 1 GiB of zeros: exactly the header's size is
    decompressed, then one byte more says the frame is longer: refused, memory small."""
    bomb = _v2(_v2_head(0), inflate.MAX_INFLATED_BYTES)
    with pytest.raises(ValueError, match=r"request logs: more than \d+ bytes of columns, expected \d+"):
        _measured("v2 log frame bomb", lambda: logs.decode_columns(bomb))
    tracemalloc.start()
    with pytest.raises(ValueError, match="bytes of columns"):
        logs.LogChunks.decode(bomb)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < MAX_GROWTH


def test_version2_log_header_claiming_more_than_max_inflated_bytes_is_refused_before_reading():
    bomb = _v2(_v2_head(2**27), 0)  # 2^27 messages x 24 bytes = 3 GiB
    tracemalloc.start()
    with pytest.raises(inflate.InflateLimitError, match=r"^request logs: decompresses to more than 1073741824 "
                                                        r"bytes \(1 GiB, MAX_INFLATED_BYTES\)"):
        logs.decode_columns(bomb)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < MAX_GROWTH


def test_truncated_zlib_is_still_an_error_and_trailing_bytes_still_ignored():
    blob = zlib.compress(b"abc")
    assert inflate.inflate_zlib(blob + b"junk", "x", 10) == b"abc"
    with pytest.raises(zlib.error, match="truncated"):
        inflate.inflate_zlib(blob[:-3], "x", 10)
    assert inflate.inflate_zlib(zlib.compress(b"a" * 10), "x", 10) == b"a" * 10
    with pytest.raises(inflate.InflateLimitError, match=r"x: decompresses to more than 9 bytes \(9 bytes\)"):
        inflate.inflate_zlib(zlib.compress(b"a" * 10), "x", 9)
