"""`python manage.py check_lossless [--sweep ID ...] [--host NAME]`: judge the speculative runs of
sweeps against their `auto` runs and store the lossless verdicts (a back-fill; the worker does it
by itself when a sweep's last run finishes, an ingest and an import when they store runs)."""

from collections import Counter

from django.core.management.base import BaseCommand, CommandError

from runs.models import Host, Sweep
from runs.services import lossless


class Command(BaseCommand):
    help = ("Compute the lossless verdict of every speculative run (docs/LOSSLESS.md): the given sweeps, or "
            "every sweep of a host / the site, oldest first. Re-running overwrites the verdicts, never duplicates.")

    def add_arguments(self, parser):
        parser.add_argument("--sweep", type=int, action="append", help="this sweep (repeatable)")
        parser.add_argument("--host", help="only sweeps of this host")

    def handle(self, *args, **opts):
        sweeps = Sweep.objects.order_by("created_at", "id")
        if opts["sweep"]:
            missing = sorted(set(opts["sweep"]) - set(Sweep.objects.filter(pk__in=opts["sweep"])
                                                      .values_list("pk", flat=True)))
            if missing:
                raise CommandError(f"no sweep {', '.join(map(str, missing))}")
            sweeps = sweeps.filter(pk__in=opts["sweep"])
        if opts["host"]:
            host = Host.objects.filter(name=opts["host"]).first()
            if host is None:
                raise CommandError(f"no host named {opts['host']!r}")
            sweeps = sweeps.filter(host=host)
        total: Counter[str] = Counter()
        ids = list(sweeps.values_list("pk", flat=True))
        for sweep_id in ids:
            got = Counter(lossless.check_sweep(sweep_id).values())
            total.update(got)
            self.stdout.write(f"sweep {sweep_id}: " + (", ".join(f"{n} {v}" for v, n in sorted(got.items()))
                                                       or "no speculative run"))
        self.stdout.write(f"{len(ids)} sweep(s) checked: "
                          + (", ".join(f"{n} {v}" for v, n in sorted(total.items())) or "no verdict"))
