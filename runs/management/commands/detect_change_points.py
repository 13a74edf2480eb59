"""`python manage.py detect_change_points [--sweep ID | --series NAME] [--host NAME]`: find and
store the change points of nightly series over their whole history (a back-fill; the worker does
it by itself when a sweep's last run finishes, after the regression flags)."""

from django.core.management.base import BaseCommand, CommandError

from runs.models import Host, Sweep
from runs.services import changepoints


class Command(BaseCommand):
    help = ("Detect change points in nightly series (benchkit.compare.changepoints, docs/CHANGEPOINTS.md): the "
            "series of one sweep, or every series of a host / name / the site. Re-running never duplicates one.")

    def add_arguments(self, parser):
        parser.add_argument("--sweep", type=int, help="the series of this sweep only")
        parser.add_argument("--series", help="every series with this name")
        parser.add_argument("--host", help="only series of this host")

    def handle(self, *args, **opts):
        if opts["sweep"] is not None:
            if not Sweep.objects.filter(pk=opts["sweep"]).exists():
                raise CommandError(f"no sweep {opts['sweep']}")
            results = [r for r in [changepoints.detect_for_sweep(opts["sweep"])] if r is not None]
        else:
            host_id = None
            if opts["host"]:
                host = Host.objects.filter(name=opts["host"]).first()
                if host is None:
                    raise CommandError(f"no host named {opts['host']!r}")
                host_id = host.pk
            results = changepoints.backfill(host_id=host_id, name=opts["series"])
        total = 0
        for r in results:
            total += len(r.stored)
            removed = f", {r.removed} removed" if r.removed else ""
            self.stdout.write(f"series {r.series!r} (host {r.host_id}): {r.points} point(s), "
                              f"{len(r.stored)} change point(s){removed}, {r.flags_attributed} flag(s) attributed")
        self.stdout.write(f"{len(results)} series analysed, {total} change point(s) stored")
