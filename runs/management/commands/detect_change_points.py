"""`python manage.py detect_change_points [--sweep ID | --series NAME] [--host NAME]`: find and
store the change points of nightly series over their whole history (a back-fill; the worker does
it by itself when a sweep's last run finishes, after the regression flags)."""

from django.core.management.base import BaseCommand

from runs.management.series import add_series_arguments, series_choice
from runs.services import changepoints


class Command(BaseCommand):
    help = ("Detect change points in nightly series (benchkit.compare.changepoints, docs/CHANGEPOINTS.md): the "
            "series of one sweep, or every series of a host / name / the site. Re-running never duplicates one.")

    def add_arguments(self, parser):
        add_series_arguments(parser, "the series of this sweep only", "every series with this name",
                             "only series of this host")

    def handle(self, *args, **opts):
        choice = series_choice(opts)
        if choice.sweep_id is not None:
            results = [r for r in [changepoints.detect_for_sweep(choice.sweep_id)] if r is not None]
        else:
            results = changepoints.backfill(host_id=choice.host_id, name=choice.series)
        total = 0
        for r in results:
            total += len(r.stored)
            removed = f", {r.removed} removed" if r.removed else ""
            self.stdout.write(f"series {r.series!r} (host {r.host_id}): {r.points} point(s), "
                              f"{len(r.stored)} change point(s){removed}, {r.flags_attributed} flag(s) attributed")
        self.stdout.write(f"{len(results)} series analysed, {total} change point(s) stored")
