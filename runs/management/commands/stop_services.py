"""`python manage.py stop_services`: stop what `manage.py demo` started (web, worker, beat, Redis)."""

from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand

from runs.localstack import stop_all


class Command(BaseCommand):
    help = "Stop the demo's background services."

    def handle(self, *args, **opts):
        stopped = stop_all(Path(settings.VAR_DIR))
        self.stdout.write("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
