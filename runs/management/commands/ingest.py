"""`python manage.py ingest BUNDLE [--host NAME]`: store an offline bundle written by
`python -m benchkit run SWEEP.yaml --out BUNDLE` on a GPU host that cannot reach the database
(runs.services.ingest). BUNDLE is the bundle folder or its tar.gz. Prints one line per run
(stored / already ingested / refused with `file: reason`); exits non-zero when a run was refused
(the others are stored) or the bundle cannot be read (nothing stored).
"""

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from benchkit.execution.bundle import BundleError, open_bundle, open_bundle_tar
from runs.services.hosts import HostNameError
from runs.services.ingest import IngestRefused, ingest_bundle


class Command(BaseCommand):
    help = "Store an offline bundle (python -m benchkit run ... --out BUNDLE): the folder, or its tar.gz."

    def add_arguments(self, parser):
        parser.add_argument("bundle", help="bundle folder, or a tar.gz of it")
        parser.add_argument("--host", default=None, help="refuse the bundle unless it comes from this host")

    def handle(self, *args, **o):
        if not o["bundle"].strip():
            raise CommandError("no bundle given: name a bundle folder or its tar.gz")
        path = Path(o["bundle"])
        try:
            if path.is_dir():
                bundle = open_bundle(path)
            else:
                with path.open("rb") as f:
                    bundle = open_bundle_tar(f)
            report = ingest_bundle(bundle, expect_host=o["host"])
        except (BundleError, IngestRefused, HostNameError) as exc:  # before OSError: IngestRefused is one
            raise CommandError(f"{path}: {exc} (nothing stored)") from None
        except OSError as exc:
            raise CommandError(f"{path}: {exc.strerror or exc}") from None
        for r in report.runs:
            if r.status == "stored":
                self.stdout.write(f"stored     {r.file} as run {r.run_id}")
            elif r.status == "existing":
                self.stdout.write(f"existing   {r.file}: ingested before as run {r.run_id}, nothing changed")
            else:
                self.stderr.write(f"refused    {r.reason} (nothing stored for this run)")
        self.stdout.write(f"bundle {report.bundle_id} from {report.host}: {len(report.of('stored'))} stored, "
                          f"{len(report.of('existing'))} ingested before (no-op), {len(report.of('refused'))} "
                          f"refused; sweep {report.sweep_id}")
        if report.of("refused"):
            raise CommandError(f"{len(report.of('refused'))} run file(s) refused")
