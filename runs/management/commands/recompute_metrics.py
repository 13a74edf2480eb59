"""`python manage.py recompute_metrics [--run ID ...] [--sweep ID] [--jobs N]`: re-derive metrics from stored logs."""

import os

from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from runs.models import Run, RunState, Sweep
from runs.services.recompute import recomputable, recompute_runs


class Command(BaseCommand):
    help = "Recompute stored runs' metrics from their raw request logs (after a formula fix)."

    def add_arguments(self, parser):
        parser.add_argument("--run", type=int, action="append", default=[])
        parser.add_argument("--sweep", type=int, default=None)
        parser.add_argument("--jobs", type=int, default=1,
                            help=f"worker processes computing metrics (this machine has {os.cpu_count()} CPUs)")

    def handle(self, *args, **opts):
        if opts["jobs"] < 1:
            raise CommandError(f"--jobs {opts['jobs']}: must be >= 1")
        qs = Run.objects.filter(state=RunState.SUCCEEDED)
        if opts["run"]:
            qs = qs.filter(pk__in=opts["run"])
            missing = set(opts["run"]) - set(qs.values_list("pk", flat=True))
            if missing:
                raise CommandError(f"not succeeded or not found: runs {sorted(missing)}")
        if opts["sweep"] is not None:
            if not Sweep.objects.filter(pk=opts["sweep"]).exists():
                raise CommandError(f"no sweep {opts['sweep']}")
            qs = qs.filter(sweep_id=opts["sweep"])
        with_logs, skipped = recomputable(qs)
        with tqdm(total=len(with_logs), unit="run", file=self.stderr, disable=None) as bar:
            done = recompute_runs(with_logs, jobs=opts["jobs"], progress=bar.update)
        self.stdout.write(f"recomputed {done} run(s)")
        if skipped:
            self.stdout.write(f"skipped {len(skipped)} run(s) without stored request logs (imported): {skipped[:20]}")
