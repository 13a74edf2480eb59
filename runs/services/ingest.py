"""Ingest offline bundles (benchkit.execution.bundle, written by `python -m benchkit run`) and the
per-host tokens that let a host send them over HTTP.

A bundle becomes one Sweep (source `bundle:<bundle id>`, on the bundle's host) and one Run per
run file. A run file is a RunOutcome (benchkit.execution.bundle.BundleRun), stored by the
writer a worker's run goes through (runs.services.outcomes.store_outcome: request logs, GPU
telemetry stream, metrics with the efficiency figures and GPU verdicts, state and failure
reason, server details, provenance, quarantine when the host's teardown left processes behind),
the run created by the move `ingested -> succeeded | failed` (runs.services.transitions); plus
the host's inventory snapshot (runs.services.hosts.record_inventory, when it differs from the
latest).

Rules:
- Every file is validated before the database is touched (benchkit.execution.bundle: pydantic
  models, sha256 against the manifest, decodable request logs). A manifest that cannot be read
  refuses the whole bundle (BundleError); a run file that cannot be read is refused with its
  reason naming the file, and nothing of that run is stored; the other runs are stored.
- One transaction per run (the host row locked, so two ingests of one host take turns).
- Idempotent on the run UUID (`Run.run_uuid`, unique): a run ingested before is reported
  `existing` and nothing changes.
- An acceptance-controlled twin (a run file with `twin_of`, benchkit.sweeps.twins) is stored
  after the bundle's real runs, linked to its real run (`Run.twin_of`, `pinned_tau` and its
  source), so it never counts as a measurement; a twin whose real run is not stored from the
  same bundle is refused.
- Once the runs are stored, the sweep's lossless check is computed (runs.services.lossless; a
  failure there is logged and never undoes the ingest).
- A token (HTTP) must be active and belong to the bundle's host; `expect_host` (command line)
  must be the bundle's host. Otherwise IngestRefused and nothing is stored.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, field

from django.db import IntegrityError, transaction
from django.utils import timezone

from benchkit.execution.bundle import Bundle, BundleError, BundleRun, ManifestRun
from benchkit.hosts.inventory import HostInventory
from runs.models import HardwareSnapshot, Host, HostToken, Run, Sweep
from runs.services import lossless
from runs.services.hosts import get_or_create_host, record_inventory
from runs.services.outcomes import store_outcome
from runs.services.sweeps import run_fields
from runs.services.transitions import INGESTED

#: Prefix of every host token (recognisable in a leaked log or config file).
TOKEN_PREFIX = "dbh_"


class IngestRefused(PermissionError):
    """The bundle may not be stored by this caller: unknown or revoked token, or a host that is not
    the token's (or the expected) host. Nothing was stored."""


def token_hash(token: str) -> str:
    """sha256 (hex) of a host token, as stored in HostToken.token_sha256."""
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(host: Host, name: str, created_by: str = "") -> tuple[HostToken, str]:
    """A new token for `host`: (the stored row, the token itself). The token (TOKEN_PREFIX + 43
    url-safe characters, 256 random bits) is returned once and never stored, only its sha256."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = HostToken.objects.create(host=host, name=name[:100], token_sha256=token_hash(token),
                                   created_by=created_by[:150])
    return row, token


def revoke_tokens(tokens) -> int:
    """Revoke the active tokens among `tokens` (rows or a queryset); returns how many were revoked."""
    return HostToken.objects.filter(pk__in=[t.pk for t in tokens], revoked_at__isnull=True).update(
        revoked_at=timezone.now())


def authenticate(token: str) -> HostToken:
    """The active HostToken whose hash is `token`'s (its last use recorded). Raises IngestRefused
    for an unknown or revoked token."""
    row = HostToken.objects.select_related("host").filter(token_sha256=token_hash(token or "")).first()
    if row is None:
        raise IngestRefused("unknown host token")
    if row.revoked_at is not None:
        raise IngestRefused(f"host token {row.name!r} of {row.host.name} was revoked at "
                            f"{row.revoked_at:%Y-%m-%d %H:%M} UTC")
    HostToken.objects.filter(pk=row.pk).update(last_used_at=timezone.now())
    return row


@dataclass
class RunIngest:
    """One run file's outcome: `status` stored (run `run_id` created), existing (ingested before as
    `run_id`) or refused (`reason`, `file: reason`; nothing stored)."""

    uuid: str
    file: str
    status: str
    run_id: int | None = None
    reason: str = ""


@dataclass
class IngestReport:
    """What an ingest did: the bundle's id and host, its sweep (None when no run was stored, now
    or before) and one RunIngest per run the manifest lists."""

    bundle_id: str
    host: str
    sweep_id: int | None
    runs: list[RunIngest] = field(default_factory=list)

    def of(self, status: str) -> list[RunIngest]:
        """The runs with `status`."""
        return [r for r in self.runs if r.status == status]

    def to_dict(self) -> dict:
        """JSON-ready form (the HTTP answer)."""
        return {"bundle_id": self.bundle_id, "host": self.host, "sweep_id": self.sweep_id,
                "stored": len(self.of("stored")), "existing": len(self.of("existing")),
                "refused": len(self.of("refused")),
                "runs": [r.__dict__ for r in self.runs]}


def _source(bundle: Bundle) -> str:
    """The Sweep.source of a bundle's sweep."""
    return f"bundle:{bundle.manifest.bundle_id}"


def _bundle_sweep(bundle: Bundle, host: Host) -> Sweep:
    m = bundle.manifest
    source = _source(bundle)
    sweep = Sweep.objects.filter(source=source, host=host).first()
    if sweep is None:
        from benchkit.sweeps.sweepfile import SweepError, loads_sweep

        try:
            spec = loads_sweep(m.sweep_text, m.sweep_file).to_dict()
        except SweepError:  # a build or flags file this machine does not know: keep the text
            spec = {}
        sweep = Sweep.objects.create(name=m.sweep_name, host=host, source=source, checks_queued_at=timezone.now(),
                                     description=f"ran offline on {m.host} from {m.sweep_file}, "
                                                 f"bundle created {m.created_at:%Y-%m-%d %H:%M} UTC",
                                     spec={**spec, "offline_bundle": {"bundle_id": str(m.bundle_id),
                                                                      "sweep_text": m.sweep_text}})
    return sweep


def _record_snapshot(host: Host, inventory: dict | None) -> None:
    """Store the bundle's inventory as a snapshot of `host` unless the latest one holds the same."""
    if not inventory:
        return
    inv = HostInventory.from_dict(inventory)
    latest = HardwareSnapshot.objects.filter(host=host).order_by("-taken_at").only("data").first()
    if latest is None or latest.data != inv.to_dict():
        record_inventory(host, inv)


def _store_run(bundle: Bundle, entry: ManifestRun, run: BundleRun, host: Host) -> RunIngest:
    """Store one validated run file in one transaction (see the module docstring). A twin is
    linked to its real run (`twin_of`, stored first from the same bundle) or refused."""
    with transaction.atomic():
        Host.objects.select_for_update().filter(pk=host.pk).first()  # ingests of one host take turns
        before = Run.objects.filter(run_uuid=run.uuid).values_list("pk", flat=True).first()
        if before is not None:
            return RunIngest(str(run.uuid), entry.file, "existing", before, "ingested before")
        run_spec = run.run_spec()
        real = None
        if run.twin_of is not None:
            real = Run.objects.filter(run_uuid=run.twin_of, host=host, sweep__source=_source(bundle),
                                      twin_of__isnull=True).values_list("pk", flat=True).first()
            if real is None:
                return RunIngest(str(run.uuid), entry.file, "refused",
                                 reason=f"{entry.file}: twin of run {run.twin_of}, which is not a stored run of this "
                                        "bundle (its file is missing or was refused)")
        sweep = _bundle_sweep(bundle, host)
        _record_snapshot(host, run.inventory)
        row = Run(sweep=sweep, host=host, point_key=run.point_key, spec=run.spec, run_uuid=run.uuid,
                  started_at=run.started_at, finished_at=run.finished_at, twin_of_id=real,
                  pinned_tau=run_spec.server.acceptance_tau if real is not None else None,
                  pinned_tau_source=run.pinned_tau_source if real is not None else "", **run_fields(run_spec))
        row = store_outcome(row, run, origin=INGESTED,
                            note=f"ingested from offline bundle {bundle.manifest.bundle_id} ({bundle.origin}, host "
                                 f"{bundle.manifest.host}, run {run.uuid})")
        return RunIngest(str(run.uuid), entry.file, "stored", row.pk)


def _store_once(bundle: Bundle, entry: ManifestRun, run: BundleRun, host: Host) -> RunIngest:
    """`_store_run`, reporting a run that a concurrent ingest stored first as existing."""
    try:
        return _store_run(bundle, entry, run, host)
    except IntegrityError:  # a concurrent ingest stored this UUID first
        before = Run.objects.filter(run_uuid=run.uuid).values_list("pk", flat=True).first()
        if before is None:
            raise
        return RunIngest(str(run.uuid), entry.file, "existing", before, "ingested before")


def ingest_bundle(bundle: Bundle, *, token: HostToken | None = None, expect_host: str | None = None) -> IngestReport:
    """Store every run of `bundle` not ingested before (see the module docstring).

    `token`: the HostToken the bundle was sent with (HTTP); `expect_host`: a host name the caller
    requires (command line `--host`). Raises IngestRefused when the bundle's host is not the
    token's or the expected one (nothing stored) and HostNameError for a host name the dashboard
    refuses. Never raises for a run file: a refused one is reported with `file: reason`."""
    m = bundle.manifest
    if token is not None and token.host.name != m.host:
        raise IngestRefused(f"the bundle is from host {m.host!r} but the token belongs to host {token.host.name!r}"
                             " (send each host's bundles with that host's own token)")
    if expect_host is not None and expect_host != m.host:
        raise IngestRefused(f"the bundle is from host {m.host!r}, not {expect_host!r}")
    host = token.host if token is not None else get_or_create_host(m.host)
    report = IngestReport(str(m.bundle_id), m.host, None)
    twins: list[ManifestRun] = []  # stored after every real run, which they link to
    for entry in m.runs:
        try:
            run = bundle.run(entry)
        except BundleError as exc:
            report.runs.append(RunIngest(str(entry.uuid), entry.file, "refused", reason=str(exc)))
            continue
        if run.twin_of is not None:
            twins.append(entry)
            continue
        report.runs.append(_store_once(bundle, entry, run, host))
    for entry in twins:
        report.runs.append(_store_once(bundle, entry, bundle.run(entry), host))
    report.sweep_id = Sweep.objects.filter(source=_source(bundle), host=host).values_list("pk", flat=True).first()
    if report.sweep_id is not None and report.of("stored"):
        lossless.check_sweep_logged(report.sweep_id)
    return report
