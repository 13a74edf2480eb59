"""`python manage.py detect_regressions [--sweep ID | --series NAME] [--host NAME]`: judge nightly
sweeps against the nights before them and store regression flags (a back-fill; the worker does
it by itself when a sweep's last run finishes)."""

from django.core.management.base import BaseCommand

from runs.management.series import add_series_arguments, series_choice
from runs.services import regressions


class Command(BaseCommand):
    help = ("Detect regressions in nightly series (settings DRAFTBOARD_REGRESSION_*): one sweep, or every "
            "sweep of a series / host / the site, oldest first. Re-running never duplicates a flag.")

    def add_arguments(self, parser):
        add_series_arguments(parser, "judge this sweep only", "every sweep with this name (a series)",
                             "only sweeps of this host")

    def handle(self, *args, **opts):
        choice = series_choice(opts)
        if choice.sweep_id is not None:
            results = [regressions.detect_for_sweep(choice.sweep_id)]
        else:
            results = regressions.backfill(host_id=choice.host_id, name=choice.series)
        flagged = 0
        for r in results:
            flagged += len(r.flagged)
            what = r.skipped or f"{len(r.flagged)} flag(s)" + (f", {r.removed} removed" if r.removed else "")
            self.stdout.write(f"sweep {r.sweep_id}: {what}")
        self.stdout.write(f"{len(results)} sweep(s) judged, {flagged} flag(s) stored")
