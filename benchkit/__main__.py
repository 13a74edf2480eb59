"""`python -m benchkit run SWEEP.yaml --out bundle/ [--host NAME] [--set KEY=VALUE ...]`: execute a
sweep on this GPU host with no database and no broker and write an offline bundle
(benchkit.execution.offline, benchkit.execution.bundle); ingest it on the dashboard's machine with
`manage.py ingest bundle/` or `POST /api/ingest/` (README, "Offline hosts").

Exit status: 0 when every run succeeded, 1 when some run failed (the bundle holds it with its
reason), 2 for a bad sweep file (runs the host cannot hold included: TP above its GPU count, a
pinned GPU it lacks, a NUMA crossing the file forbids), host name or output folder (nothing run).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from benchkit.execution.offline import OfflineSummary
    from benchkit.hosts.inventory import HostInventory


def run_sweep_offline(sweep_path: str | Path, out: str | Path, host: str | None = None,
                      variables: dict[str, str] | None = None, inventory: HostInventory | None = None,
                      progress: bool | None = None) -> OfflineSummary:
    """Execute every run of the sweep file at `sweep_path` on this host into the bundle `out`
    (benchkit.execution.offline.run_offline): the file read by benchkit.sweeps.sweepfile with its
    `{name}` placeholders filled from `variables`, its GPUs planned on `inventory` (default:
    collect_inventory() now, as a worker plans them on the host's latest snapshot). The
    acceptance-controlled twins the file asks for (`twin:`) run too where the file gives their
    golden `tau:` (benchkit.sweeps.twins; an offline host has no earlier nights for the median),
    each written as the twin of its real run; a point without one is a line on stderr saying why.
    Raises sweepfile.SweepError (bad file; sweepfile.PointsRefused for runs the host cannot hold:
    TP above its GPU count, a pinned GPU it lacks, a NUMA crossing the file forbids) and what
    run_offline raises."""
    from benchkit.execution.offline import default_host_name, run_offline
    from benchkit.hosts.inventory import collect_inventory
    from benchkit.sweeps import sweepfile, twins

    sweep_path = Path(sweep_path)
    text = sweep_path.read_text(encoding="utf-8")
    spec = sweepfile.loads_sweep(text, str(sweep_path), variables)
    spec.require_resolved()
    inventory = inventory if inventory is not None else collect_inventory()
    host = host or default_host_name()
    _plan, specs = spec.expand_on(inventory, host)  # PointsRefused (a SweepError) before anything runs
    twin_of: dict[int, tuple[int, str]] = {}  # a twin's index in the run list -> (its real run's, tau source)
    reals = list(specs)
    for i, plan in twins.plan_twins(spec, reals):  # no earlier nights here: a twin needs the file's golden tau
        r = reals[i]
        where = f"{r.server.method} TP{r.server.tp} c{r.workload.concurrency}"
        if plan.spec is None:
            print(f"{where}: {plan.note} (an offline host has no earlier nights: give `tau:` in the file's twin)",
                  file=sys.stderr)
            continue
        twin_of[len(specs)] = (i, plan.source)
        specs.append(plan.spec)
        print(f"{where}: {plan.note}", file=sys.stderr)
    return run_offline(specs, out, sweep_name=spec.name, sweep_file=str(sweep_path), sweep_text=text,
                       share_server=spec.share_server, inventory=inventory, host=host, progress=progress,
                       twins=twin_of)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` and run the command; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m benchkit", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a sweep file offline into a bundle folder")
    run.add_argument("sweep", help="sweep file (YAML, see sweeps/)")
    run.add_argument("--out", required=True, help="bundle folder to write (empty or new)")
    run.add_argument("--host", default=None,
                     help="the name the dashboard knows this host by (default: DRAFTBOARD_HOST, else the hostname)")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="fill a {KEY} placeholder of the sweep file (repeatable)")
    run.add_argument("--no-progress", action="store_true", help="no progress bar, one line per run")
    args = parser.parse_args(argv)

    from pydantic import ValidationError

    from benchkit.hosts.allocation import AllocationError
    from benchkit.sweeps.sweepfile import SweepError, parse_variables

    try:
        summary = run_sweep_offline(args.sweep, args.out, host=args.host, variables=parse_variables(args.set) or None,
                                    progress=False if args.no_progress else None)
    except (SweepError, AllocationError, FileExistsError, ValueError, OSError) as exc:
        reason = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
        for line in reason.splitlines():  # PointsRefused: one `file:line: field: reason` per TP degree
            print(f"error: {line}", file=sys.stderr)
        print("nothing ran", file=sys.stderr)
        return 2
    m = summary.manifest
    print(f"bundle {summary.out}: {summary.succeeded} succeeded, {summary.failed} failed, host {m.host}, "
          f"bundle id {m.bundle_id}")
    return 0 if summary.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
