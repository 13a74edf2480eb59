"""Offline bundles: a sweep's runs executed on a GPU host that cannot reach the database, as files
the dashboard ingests later (`python -m benchkit run` writes one, `manage.py ingest` and
`POST /api/ingest/` read it; runs/services/ingest.py stores it).

Layout of a bundle folder (format version BUNDLE_FORMAT_VERSION)::

    bundle/
      manifest.json          # BundleManifest: format, bundle id, host, the sweep file's text, and
                             # one entry per finished run: its UUID, file and the sha256 of its bytes
      runs/<run uuid>.json   # BundleRun: the run's RunOutcome (benchkit.execution.outcome: state
                             # and failure reason, metrics, raw request logs, GPU telemetry stream,
                             # per-GPU efficiency figures and verdicts, server argv / env / log
                             # tail, provenance, teardown report) plus its identity: spec, UUID,
                             # times, the host's inventory snapshot
      work/                  # server logs of each server start (not read by ingest)

Every file is written whole to a temporary name and renamed into place (`write_atomic`), run file
first, then the manifest that lists it: a run killed half-way leaves no run file that looks
complete, and a run file the manifest does not list (or whose sha256 differs from the manifest's)
is never ingested. Reading (`open_bundle`, `open_bundle_tar`) validates every file with pydantic
(unknown keys forbidden, no coercion, metric bounds from the metric schema, request logs and
telemetry that decode) and raises BundleError naming the file and the field.

Versions: 2 made the run file the RunOutcome model, which added the GPU telemetry stream,
efficiency figures and GPU verdicts that version 1 lacked; 3 added the run's output digests
(`outputs`, the lossless check's input) and the load client's options (`client_options`); 4
(this code) added acceptance-controlled twins (`twin_of`: the UUID of the real run in the same
bundle, `pinned_tau_source`), which a file may ask for offline with a golden tau. Older bundles
(written by an offline host not yet upgraded) stay readable: a version 3 run file is a version
4 one that is no twin; a version 2 run file is a version 3 one without those two keys (no
outputs: its spec runs are "not checked: outputs not kept"); a version 1 run file is read with
its four renamed keys mapped (`upgrade_v1_run`) and no GPU data. A dashboard older than the
bundle refuses it by its version, never half-reads it.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
import tempfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from benchkit.execution.outcome import RunOutcome, first_error
from benchkit.hosts import HOST_NAME_PATTERN
from benchkit.inflate import MAX_INFLATED_BYTES, InflateLimitError, LimitedReader, human_bytes
from benchkit.specs import RunSpec

#: The bundle layout this code writes; it also reads versions 1 to 3 (see the module docstring).
BUNDLE_FORMAT_VERSION = 4
BUNDLE_FORMAT = "draftboard-bundle"
MANIFEST = "manifest.json"
#: Most bytes one bundle file may have when read (a run's request logs are zlib-compressed); in a
#: tar.gz bundle, bytes actually decompressed (open_bundle_tar).
MAX_FILE_BYTES = 256 * 1024 * 1024
#: Most bytes a whole tar.gz bundle may decompress to (1 GiB; bytes actually decompressed, tar
#: headers and ignored members included, never the sizes the headers claim): bounded work and
#: memory for an upload (open_bundle_tar; the ingest API answers 413 beyond it).
MAX_BUNDLE_BYTES = MAX_INFLATED_BYTES


class BundleError(ValueError):
    """A bundle file that cannot be read: `file` (path inside the bundle) and `reason`; str() is
    `file: reason`."""

    def __init__(self, file: str, reason: str):
        self.file, self.reason = file, reason
        super().__init__(f"{file}: {reason}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ManifestRun(_Strict):
    """One finished run of a bundle: its UUID, its file (`runs/<uuid>.json`), the sha256 (hex) of
    that file's bytes and its final state."""

    uuid: UUID
    file: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    state: Literal["succeeded", "failed"]

    @model_validator(mode="after")
    def _file_of_uuid(self) -> ManifestRun:
        if self.file != run_file_name(self.uuid):
            raise ValueError(f"file {self.file!r} is not {run_file_name(self.uuid)!r}")
        return self


class BundleManifest(_Strict):
    """manifest.json: format and version, the bundle's id, the host that ran it (its name as the
    dashboard knows it), when it was created, the sweep's name and file (path and text), the
    finished runs."""

    format: Literal["draftboard-bundle"] = BUNDLE_FORMAT
    format_version: Literal[1, 2, 3, 4] = BUNDLE_FORMAT_VERSION
    bundle_id: UUID
    host: str = Field(pattern=HOST_NAME_PATTERN)
    created_at: datetime
    sweep_name: str = Field(min_length=1, max_length=200)
    sweep_file: str = Field(max_length=500)
    sweep_text: str
    runs: list[ManifestRun] = Field(default_factory=list)

    @model_validator(mode="after")
    def _distinct(self) -> BundleManifest:
        uuids = [r.uuid for r in self.runs]
        if len(set(uuids)) != len(uuids):
            raise ValueError("a run UUID is listed twice")
        return self


class BundleRun(RunOutcome):
    """runs/<uuid>.json: one executed run, its RunOutcome (benchkit.execution.outcome) plus its
    identity.

    `spec` is benchkit.specs.RunSpec.to_dict() and `point_key` its RunSpec.point_key() (checked);
    `state` is succeeded (`ok`, metrics set) or failed (`reason`, a runner code, and `message`);
    `inventory` the host's benchkit.hosts.inventory.HostInventory.to_dict() taken when the sweep
    started; times are UTC. An acceptance-controlled twin (its spec's `server.acceptance_tau`
    set, benchkit.sweeps.twins) names its real run's UUID in `twin_of` and where its tau came
    from in `pinned_tau_source`; a run with pinned acceptance and no real run is refused, as is
    `twin_of` on a run that pins nothing (ingest would otherwise count a forced acceptance)."""

    model_config = ConfigDict(frozen=True, validate_assignment=False)

    format_version: Literal[2, 3, 4] = BUNDLE_FORMAT_VERSION
    uuid: UUID
    bundle_id: UUID
    host: str
    sweep_name: str
    point_key: str = Field(pattern=r"^[0-9a-f]{64}$")
    spec: dict[str, Any]
    started_at: datetime
    finished_at: datetime
    inventory: dict[str, Any] | None = None
    twin_of: UUID | None = None
    pinned_tau_source: Literal["", "golden", "median"] = ""

    @property
    def state(self) -> str:
        """`succeeded` or `failed` (the manifest's word for `ok`)."""
        return "succeeded" if self.ok else "failed"

    @model_validator(mode="after")
    def _consistent(self) -> BundleRun:
        try:
            run_spec = RunSpec.from_dict(self.spec)
            key = run_spec.point_key()
        except (TypeError, ValueError) as exc:
            raise ValueError(f"spec: not a run spec ({exc})") from None
        if key != self.point_key:
            raise ValueError("point_key does not match the spec (the spec was changed)")
        pinned = run_spec.server.acceptance_tau is not None
        if pinned and self.twin_of is None:
            raise ValueError("spec.server.acceptance_tau is set (forced acceptance) but twin_of names no real run: "
                             "a pinned run is only stored as the twin of a real one")
        if self.twin_of is not None and not pinned:
            raise ValueError("twin_of is set but the spec pins no acceptance (server.acceptance_tau)")
        if self.twin_of == self.uuid:
            raise ValueError("twin_of names the run itself")
        problem = self.problem()
        if problem:
            raise ValueError(problem)
        return self

    def run_spec(self) -> RunSpec:
        """The run's RunSpec."""
        return RunSpec.from_dict(self.spec)


def upgrade_v1_run(doc: dict[str, Any]) -> dict[str, Any]:
    """A version 1 run file (a JSON object) in the version 2 layout: `state` becomes `ok`,
    `failure_reason` / `failure_message` become `reason` / `message`, `request_logs` becomes
    `logs` with its window moved to `window_start_ns` / `window_end_ns`; every other key is
    the same in both. Keys a damaged file lacks stay absent (validation names them)."""
    doc = dict(doc)
    doc["format_version"] = 2
    renamed = {"failure_reason": "reason", "failure_message": "message"}
    for old, new in renamed.items():
        if old in doc:
            doc[new] = doc.pop(old)
    if "state" in doc:
        doc["ok"] = doc.pop("state") == "succeeded"
    logs = doc.pop("request_logs", None)
    if isinstance(logs, dict):
        for key in ("window_start_ns", "window_end_ns"):
            if key in logs:
                doc[key] = logs.pop(key)
    doc["logs"] = logs
    return doc


class _Version(BaseModel):
    format_version: int


def read_run_file(data: bytes) -> BundleRun:
    """The BundleRun of a run file's bytes, version 1 upgraded (upgrade_v1_run). Raises
    pydantic.ValidationError (or ValueError for a version 1 file that is not JSON)."""
    if _Version.model_validate_json(data).format_version == 1:
        data = json.dumps(upgrade_v1_run(json.loads(data))).encode()
    return BundleRun.model_validate_json(data)


def run_file_name(run_uuid: UUID | str) -> str:
    """The bundle-relative file of run `run_uuid`: `runs/<uuid>.json`."""
    return f"runs/{UUID(str(run_uuid))}.json"


def sha256_hex(data: bytes) -> str:
    """sha256 of `data`, hex."""
    return hashlib.sha256(data).hexdigest()


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` whole or not at all: a temporary file in the same folder, fsynced,
    then renamed over `path` (a kill mid-write leaves only a `.tmp-*` file, never read)."""
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _dump(model: BaseModel) -> bytes:
    return (model.model_dump_json(indent=1, fallback=str) + "\n").encode()


class BundleWriter:
    """Writes a bundle folder run by run (see the module docstring). Raises FileExistsError when
    `out` already holds a manifest (a bundle is never appended to by a second sweep)."""

    def __init__(self, out: Path, manifest: BundleManifest):
        self.out = Path(out)
        if (self.out / MANIFEST).exists():
            raise FileExistsError(f"{self.out / MANIFEST} exists: give an empty --out folder")
        (self.out / "runs").mkdir(parents=True, exist_ok=True)
        self.manifest = manifest
        write_atomic(self.out / MANIFEST, _dump(self.manifest))

    def add(self, run: BundleRun) -> Path:
        """Write `run`'s file, then the manifest listing it; returns the run file's path."""
        data = _dump(run)
        path = self.out / run_file_name(run.uuid)
        write_atomic(path, data)
        entry = ManifestRun(uuid=run.uuid, file=run_file_name(run.uuid), sha256=sha256_hex(data), state=run.state)
        self.manifest = self.manifest.model_copy(update={"runs": [*self.manifest.runs, entry]})
        write_atomic(self.out / MANIFEST, _dump(self.manifest))
        return path


@dataclass
class Bundle:
    """A bundle opened for reading: its validated manifest and a reader of its files
    (`read(name) -> bytes`, KeyError / OSError when absent). `origin` names it (a folder path or
    'upload')."""

    manifest: BundleManifest
    read: Callable[[str], bytes]
    origin: str

    def run(self, entry: ManifestRun) -> BundleRun:
        """Run file `entry`, checked: present, its sha256 the manifest's, valid JSON of a
        BundleRun (read_run_file: request logs and telemetry decoded) whose UUID, bundle, host and
        state are the manifest's. Raises BundleError naming the file."""
        try:
            data = self.read(entry.file)
        except (KeyError, OSError):
            raise BundleError(entry.file, "missing (the manifest lists it)") from None
        if len(data) > MAX_FILE_BYTES:
            raise BundleError(entry.file, f"{len(data)} bytes, more than {MAX_FILE_BYTES}")
        if sha256_hex(data) != entry.sha256:
            raise BundleError(entry.file, f"sha256 {sha256_hex(data)[:12]}... is not the manifest's "
                                          f"{entry.sha256[:12]}... (the file is truncated or was changed; "
                                          f"{len(data)} bytes)")
        try:
            run = read_run_file(data)
        except ValidationError as exc:
            raise BundleError(entry.file, first_error(exc)) from None
        except ValueError as exc:  # a version 1 file that is not JSON
            raise BundleError(entry.file, f"not JSON ({exc})") from None
        m = self.manifest
        for name, got, want in (("uuid", run.uuid, entry.uuid), ("bundle_id", run.bundle_id, m.bundle_id),
                                ("host", run.host, m.host), ("state", run.state, entry.state)):
            if got != want:
                raise BundleError(entry.file, f"{name}: {got} is not the manifest's {want}")
        return run


def _manifest(data: bytes) -> BundleManifest:
    try:
        return BundleManifest.model_validate_json(data)
    except ValidationError as exc:
        raise BundleError(MANIFEST, first_error(exc)) from None


def open_bundle(folder: str | Path) -> Bundle:
    """Open the bundle folder `folder`. Raises BundleError (manifest.json missing or invalid)."""
    folder = Path(folder)
    try:
        data = (folder / MANIFEST).read_bytes()
    except OSError as exc:
        raise BundleError(MANIFEST, f"cannot read it in {folder} ({exc.strerror or exc})") from None

    def read(name: str) -> bytes:
        path = (folder / name).resolve()
        if folder.resolve() not in path.parents:
            raise KeyError(name)
        return path.read_bytes()

    return Bundle(_manifest(data), read, str(folder))


class BundleTooLarge(BundleError):
    """A tar.gz bundle that decompresses to more than its limit (the whole archive beyond
    MAX_BUNDLE_BYTES, or one run file or the manifest beyond MAX_FILE_BYTES), counted in bytes
    actually decompressed; `limit` is the limit in bytes. The ingest API answers 413."""

    def __init__(self, file: str, reason: str, limit: int):
        self.limit = limit
        super().__init__(file, reason)


_COPY_CHUNK = 1024 * 1024
#: Kept files of an uploaded bundle are held in memory up to this many bytes, then on disk.
_SPOOL_IN_MEMORY = 16 * 1024 * 1024


def open_bundle_tar(fileobj: io.BufferedIOBase | io.BytesIO, max_bytes: int = MAX_BUNDLE_BYTES,
                    max_file_bytes: int = MAX_FILE_BYTES) -> Bundle:
    """Open a bundle sent as a tar.gz of its folder (`tar czf b.tgz -C bundle .`; a single top
    folder inside is also accepted). Only manifest.json and runs/*.json are kept (regular files;
    links and other entries are ignored).

    Streamed and bounded: the gzip stream is decompressed as the tar is read (tar stream mode),
    and every decompressed byte counts, headers and ignored members included (never the sizes the
    tar headers claim): past `max_bytes` (MAX_BUNDLE_BYTES, 1 GiB) reading stops and
    BundleTooLarge is raised; a kept file of more than `max_file_bytes` (MAX_FILE_BYTES, 256 MiB)
    likewise. Kept files are copied in 1 MiB pieces to a temporary file (in memory up to 16 MiB,
    then on disk), so memory stays small whatever the archive holds; the Bundle reads them back
    one at a time. Raises BundleError (`<archive>`) for an archive that is not a readable tar.gz
    or is truncated."""
    spool = tempfile.SpooledTemporaryFile(max_size=_SPOOL_IN_MEMORY)  # noqa: SIM115 (the Bundle's reader owns it)
    where: dict[str, tuple[int, int]] = {}
    try:
        gz = gzip.GzipFile(fileobj=fileobj, mode="rb")
        stream = LimitedReader(gz, "<archive>", max_bytes, "MAX_BUNDLE_BYTES")
        with tarfile.open(fileobj=stream, mode="r|", bufsize=_COPY_CHUNK) as tar:
            for member in tar:
                if not member.isfile():
                    continue
                parts = [p for p in member.name.split("/") if p not in ("", ".")]
                if parts and parts[0] not in (MANIFEST, "runs"):
                    parts = parts[1:]  # a single top folder: bundle/manifest.json
                name = "/".join(parts)
                if name != MANIFEST and not (len(parts) == 2 and parts[0] == "runs" and parts[1].endswith(".json")):
                    continue
                f = tar.extractfile(member)
                start = spool.seek(0, io.SEEK_END)
                size = 0
                while f is not None and (chunk := f.read(_COPY_CHUNK)):
                    size += len(chunk)
                    if size > max_file_bytes:
                        raise BundleTooLarge(name, f"decompresses to more than {max_file_bytes} bytes "
                                                   f"({human_bytes(max_file_bytes)}, MAX_FILE_BYTES, the most one "
                                                   f"bundle file may hold); refused without reading further",
                                             max_file_bytes)
                    spool.write(chunk)
                where[name] = (start, size)
    except InflateLimitError as exc:
        spool.close()
        raise BundleTooLarge("<archive>", str(exc).removeprefix("<archive>: "), exc.limit) from None
    except (tarfile.TarError, EOFError, OSError, ValueError, zlib.error) as exc:
        spool.close()
        if isinstance(exc, BundleError):
            raise
        raise BundleError("<archive>", f"not a complete tar.gz ({type(exc).__name__}: {exc})") from None
    if MANIFEST not in where:
        spool.close()
        raise BundleError(MANIFEST, "not in the archive")

    def read(name: str) -> bytes:
        start, size = where[name]
        spool.seek(start)
        return spool.read(size)

    return Bundle(_manifest(read(MANIFEST)), read, "upload")


def tar_bundle(folder: str | Path) -> bytes:
    """The tar.gz of a bundle folder's manifest and run files (what `POST /api/ingest/` takes)."""
    folder = Path(folder)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(folder / MANIFEST, arcname=MANIFEST)
        for path in sorted((folder / "runs").glob("*.json")):
            tar.add(path, arcname=f"runs/{path.name}")
    return buf.getvalue()


def to_json_data(value: Any) -> Any:
    """`value` through a JSON round trip (tuples become lists, keys strings)."""
    return json.loads(json.dumps(value, default=str))
