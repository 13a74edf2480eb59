"""Run a sweep on a GPU host with no database and no broker, into a bundle folder
(benchkit.execution.bundle): `python -m benchkit run SWEEP.yaml --out bundle/` (benchkit.__main__
reads the sweep file and plans its GPUs on this host's inventory; this module takes the runs).

The same parts as a worker's run: runs grouped by server start (benchkit.specs.server_groups, the
sweep's `share_server`) and executed by benchkit.execution.runner.execute_runs. Each finished run
is written at once (run file, then the manifest listing it); a sweep killed half-way leaves a
bundle of the runs that finished.
"""

from __future__ import annotations

import os
import socket
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from benchkit.execution.bundle import BundleManifest, BundleRun, BundleWriter, to_json_data
from benchkit.execution.outcome import RunOutcome
from benchkit.execution.runner import NullHooks, execute_runs
from benchkit.hosts.inventory import HostInventory
from benchkit.specs import RunSpec, server_groups


def default_host_name() -> str:
    """DRAFTBOARD_HOST when set (the name the dashboard knows this host by), else the hostname."""
    return os.environ.get("DRAFTBOARD_HOST") or socket.gethostname().split(".")[0]


class _Progress(NullHooks):
    """Runner hooks of one run: when it started, and its phase / request progress on the bar."""

    def __init__(self, label: str, show: Callable[[str], None]):
        self.label, self.show = label, show
        self.started_at: datetime | None = None

    def state(self, name: str, note: str = "") -> None:
        if self.started_at is None:
            self.started_at = datetime.now(UTC)
        self.show(f"{self.label}: {name}")

    def progress(self, done: int, total: int) -> None:
        self.show(f"{self.label}: measuring {done}/{total} requests")


@dataclass
class OfflineSummary:
    """What `run_offline` did: the bundle folder, its manifest, and the runs by final state."""

    out: Path
    manifest: BundleManifest
    succeeded: int
    failed: int


def bundle_run(outcome: RunOutcome, spec: RunSpec, run_uuid: uuid.UUID, manifest: BundleManifest,
               inventory: HostInventory, started_at: datetime, finished_at: datetime,
               twin_of: uuid.UUID | None = None, pinned_tau_source: str = "") -> BundleRun:
    """The bundle file of one finished run (see BundleRun): the outcome as it is, plus the run's
    identity (UUID, the manifest's bundle, host and sweep, the spec and its point key), its times
    and the host's inventory; a twin's real run (`twin_of`) and tau source."""
    return BundleRun(**dict(outcome), uuid=run_uuid, bundle_id=manifest.bundle_id, host=manifest.host,
                     sweep_name=manifest.sweep_name, point_key=spec.point_key(), spec=to_json_data(spec.to_dict()),
                     started_at=started_at, finished_at=finished_at, inventory=to_json_data(inventory.to_dict()),
                     twin_of=twin_of, pinned_tau_source=pinned_tau_source)


def run_offline(specs: list[RunSpec], out: str | Path, *, sweep_name: str, sweep_file: str, sweep_text: str,
                share_server: bool, inventory: HostInventory, host: str | None = None,
                progress: bool | None = None, twins: dict[int, tuple[int, str]] | None = None) -> OfflineSummary:
    """Execute `specs` (a sweep's runs, GPUs planned on `inventory`, this host's) and write the
    bundle `out`.

    `twins`: {index of an acceptance-controlled twin in `specs`: (index of its real run, where
    its pinned tau came from)}; each twin's run file names its real run's UUID (`twin_of`).

    `sweep_name`, `sweep_file` (its path), `sweep_text` (the file's text) go to the manifest;
    `share_server`: the sweep's `share_server` (runs with one server key share a start);
    `inventory` is recorded with every run; `host`: the name the dashboard knows this host by
    (default_host_name()). `progress`: a tqdm bar on stderr (default: when stderr is a terminal;
    else one line per finished run). Raises FileExistsError (`out` holds a bundle already),
    pydantic.ValidationError (a host name that is not 1-100 letters, digits, '.', '_', '-');
    never raises for a benchmark failure (the run is written `failed` with its reason)."""
    out = Path(out)
    manifest = BundleManifest(bundle_id=uuid.uuid4(), host=host or default_host_name(),
                              created_at=datetime.now(UTC), sweep_name=sweep_name, sweep_file=sweep_file[-500:],
                              sweep_text=sweep_text)
    writer = BundleWriter(out, manifest)
    twins = twins or {}
    uuids = [uuid.uuid4() for _ in specs]  # known before any run, so a twin can name its real run's
    show_bar = sys.stderr.isatty() if progress is None else progress
    counts = {"succeeded": 0, "failed": 0}
    bar = None
    if show_bar:
        from tqdm import tqdm

        bar = tqdm(total=len(specs), unit="run", desc=sweep_name, file=sys.stderr)

    def show(text: str) -> None:
        if bar is not None:
            bar.set_postfix_str(text, refresh=True)

    try:
        for n, group in enumerate(server_groups(specs, share_server)):
            group_specs = [specs[i] for i in group]
            hooks = [_Progress(f"run {i + 1}/{len(specs)}", show) for i in group]
            t0 = datetime.now(UTC)
            outcomes = execute_runs(group_specs, hooks, out / "work" / f"server-{n:03d}",
                                    server_tag=uuid.uuid4().hex)
            finished = datetime.now(UTC)
            for i, run_spec, hook, outcome in zip(group, group_specs, hooks, outcomes, strict=True):
                real, source = twins.get(i, (None, ""))
                record = bundle_run(outcome, run_spec, uuids[i], manifest, inventory, hook.started_at or t0, finished,
                                    twin_of=uuids[real] if real is not None else None, pinned_tau_source=source)
                writer.add(record)
                counts[record.state] += 1
                line = (f"run {i + 1}/{len(specs)} {record.state}"
                        + (f" ({outcome.reason}: {outcome.message[:200]})" if not outcome.ok else ""))
                if bar is not None:
                    bar.update(1)
                    bar.write(line)
                else:
                    print(line, file=sys.stderr, flush=True)
    finally:
        if bar is not None:
            bar.close()
    return OfflineSummary(out, writer.manifest, counts["succeeded"], counts["failed"])
