"""`python manage.py recompute_metrics [--run ID ...] [--sweep ID]`: re-derive metrics from stored logs."""

from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from runs.models import Run, RunState, Sweep
from runs.services.recompute import recompute_run


class Command(BaseCommand):
    help = "Recompute stored runs' metrics from their raw request logs (after a formula fix)."

    def add_arguments(self, parser):
        parser.add_argument("--run", type=int, action="append", default=[])
        parser.add_argument("--sweep", type=int, default=None)

    def handle(self, *args, **opts):
        qs = Run.objects.filter(state=RunState.SUCCEEDED).select_related("request_logs", "metrics")
        if opts["run"]:
            qs = qs.filter(pk__in=opts["run"])
            missing = set(opts["run"]) - set(qs.values_list("pk", flat=True))
            if missing:
                raise CommandError(f"not succeeded or not found: runs {sorted(missing)}")
        if opts["sweep"] is not None:
            if not Sweep.objects.filter(pk=opts["sweep"]).exists():
                raise CommandError(f"no sweep {opts['sweep']}")
            qs = qs.filter(sweep_id=opts["sweep"])
        done, skipped = 0, []
        for run in tqdm(qs.iterator(chunk_size=100), total=qs.count(), unit="run"):
            if recompute_run(run) is not None:
                done += 1
            else:
                skipped.append(run.pk)
        self.stdout.write(f"recomputed {done} run(s)")
        if skipped:
            self.stdout.write(f"skipped {len(skipped)} run(s) without stored request logs (imported): {skipped[:20]}")
