"""`python manage.py rebuild_summaries [--sweep ID ...]`: build the stored point summary of every
sweep (or the given ones) from its runs (runs.services.summaries): after a bulk load or an upgrade;
the writers keep them current by themselves."""

import time

from django.core.management.base import BaseCommand, CommandError

from runs.models import Sweep
from runs.services import summaries


class Command(BaseCommand):
    help = ("Build each sweep's stored point summary (what the sweep, compare, trend and home pages read) from "
            "its runs: every sweep, or the given ones. Safe to re-run; replaces what is stored.")

    def add_arguments(self, parser):
        parser.add_argument("--sweep", type=int, action="append", help="this sweep (repeatable)")

    def handle(self, *args, **opts):
        ids = opts["sweep"]
        if ids:
            missing = sorted(set(ids) - set(Sweep.objects.filter(pk__in=ids).values_list("pk", flat=True)))
            if missing:
                raise CommandError(f"no sweep {', '.join(map(str, missing))}")
        t0 = time.perf_counter()

        def progress(done: int, total: int) -> None:
            if opts["verbosity"] > 1 or done == total or done % 100 == 0:
                self.stdout.write(f"{done}/{total} sweeps")

        n = summaries.rebuild(ids, progress=progress)
        self.stdout.write(f"rebuilt {n} sweep summar{'y' if n == 1 else 'ies'} in {time.perf_counter() - t0:.1f} s")
