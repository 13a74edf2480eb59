"""`python manage.py detect_regressions [--sweep ID | --series NAME] [--host NAME]`: judge nightly
sweeps against the nights before them and store regression flags (a back-fill; the worker does
it by itself when a sweep's last run finishes)."""

from django.core.management.base import BaseCommand, CommandError

from runs.models import Host, Sweep
from runs.services import regressions


class Command(BaseCommand):
    help = ("Detect regressions in nightly series (settings DRAFTBOARD_REGRESSION_*): one sweep, or every "
            "sweep of a series / host / the site, oldest first. Re-running never duplicates a flag.")

    def add_arguments(self, parser):
        parser.add_argument("--sweep", type=int, help="judge this sweep only")
        parser.add_argument("--series", help="every sweep with this name (a series)")
        parser.add_argument("--host", help="only sweeps of this host")

    def handle(self, *args, **opts):
        if opts["sweep"] is not None:
            if not Sweep.objects.filter(pk=opts["sweep"]).exists():
                raise CommandError(f"no sweep {opts['sweep']}")
            results = [regressions.detect_for_sweep(opts["sweep"])]
        else:
            host_id = None
            if opts["host"]:
                host = Host.objects.filter(name=opts["host"]).first()
                if host is None:
                    raise CommandError(f"no host named {opts['host']!r}")
                host_id = host.pk
            results = regressions.backfill(host_id=host_id, name=opts["series"])
        flagged = 0
        for r in results:
            flagged += len(r.flagged)
            what = r.skipped or f"{len(r.flagged)} flag(s)" + (f", {r.removed} removed" if r.removed else "")
            self.stdout.write(f"sweep {r.sweep_id}: {what}")
        self.stdout.write(f"{len(results)} sweep(s) judged, {flagged} flag(s) stored")
