"""Bounded decompression: every compressed thing benchkit reads from a user or from storage (an
ingest bundle's tar.gz, a run's request-log, telemetry and outputs blobs) is inflated through
here, so that a few compressed bytes (a "decompression bomb": 1 GB of zeros gzips to about 1 MB)
cannot expand without bound in the reading process (issue 31: a 0.5 MB gzip bundle took the web
server from 207 to 665 MB).

The limits count the bytes actually produced by the decompressor, never a size a header claims,
and reading stops at the limit (at most the limit plus one read's worth is ever produced):

- MAX_INFLATED_BYTES (1 GiB): a whole ingest bundle (benchkit.execution.bundle.MAX_BUNDLE_BYTES)
  and one run's request logs (benchkit.measure.logs: a 10 000-request x 2 000-token run is about
  140 MB decompressed in format 2, 300 MB in format 1);
- MAX_BLOB_BYTES (256 MiB, the largest file a bundle holds, bundle.MAX_FILE_BYTES): one run's GPU
  telemetry stream (benchkit.measure.gpu_samples: an hour at 50 Hz on 8 GPUs is about 80 MB of
  JSON) or output digests (benchkit.measure.outputs: about 1.6 MB per 10 000 requests).

Beyond a limit the readers raise InflateLimitError (a ValueError) naming what was read and the
limit in bytes.
"""

from __future__ import annotations

import io
import zlib

#: Most bytes a bundle or one run's request-log blob may decompress to (1 GiB).
MAX_INFLATED_BYTES = 1024 * 1024 * 1024
#: Most bytes one run's telemetry or outputs blob may decompress to (256 MiB).
MAX_BLOB_BYTES = 256 * 1024 * 1024


def human_bytes(n: int) -> str:
    """`n` bytes as '1 GiB', '256 MiB', '8 KiB' or '17 bytes' (exact powers only get the unit)."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} bytes"


class InflateLimitError(ValueError):
    """Decompressed data beyond its limit: `what` (the blob or file), `limit` (bytes)."""

    def __init__(self, what: str, limit: int, name: str = ""):
        self.what, self.limit = what, limit
        named = f", {name}" if name else ""
        super().__init__(f"{what}: decompresses to more than {limit} bytes ({human_bytes(limit)}{named}); refused "
                         f"without reading further (a decompression bomb, or more data than draftboard stores)")


def inflate_zlib(data: bytes | bytearray | memoryview, what: str, limit: int, name: str = "") -> bytes:
    """zlib.decompress(data) that stops at `limit` bytes of output: InflateLimitError beyond it
    (`name`: the limit's constant, for the message). Like zlib.decompress, bytes after the end of
    the stream are ignored and a truncated stream raises zlib.error."""
    d = zlib.decompressobj()
    out = d.decompress(data, limit + 1)
    if len(out) > limit:
        raise InflateLimitError(what, limit, name)
    if not d.eof:
        if d.unconsumed_tail:  # output exactly at the limit with input left: more would follow
            raise InflateLimitError(what, limit, name)
        raise zlib.error("Error -5 while decompressing data: incomplete or truncated stream")
    return out


class LimitedReader(io.RawIOBase):
    """A read-only stream over `raw` (e.g. a gzip.GzipFile: decompressed bytes) that counts the
    bytes read through it and raises InflateLimitError once more than `limit` have been asked
    for and produced. `count`: bytes read so far."""

    def __init__(self, raw, what: str, limit: int, name: str = ""):
        super().__init__()
        self._raw, self.what, self.limit, self.name, self.count = raw, what, limit, name, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        # never ask for more than one byte past the limit: the decompressor produces what is asked
        want = min(len(b), self.limit + 1 - self.count)
        if want <= 0:
            raise InflateLimitError(self.what, self.limit, self.name)
        chunk = self._raw.read(want)
        n = len(chunk)
        b[:n] = chunk
        self.count += n
        if self.count > self.limit:
            raise InflateLimitError(self.what, self.limit, self.name)
        return n
