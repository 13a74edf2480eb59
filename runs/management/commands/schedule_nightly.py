"""`python manage.py schedule_nightly sweeps/FILE.yaml --hour 2`: a Celery-beat nightly sweep."""

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from django_celery_beat.models import CrontabSchedule, PeriodicTask

from benchkit.sweepspec import SweepError, load_sweep_file


class Command(BaseCommand):
    help = "Schedule a sweep file to be queued every night by Celery beat (django-celery-beat)."

    def add_arguments(self, parser):
        parser.add_argument("path")
        parser.add_argument("--hour", type=int, default=2, help="UTC hour (0-23)")
        parser.add_argument("--minute", type=int, default=0)
        parser.add_argument("--host", default="", help="host name (default: the worker's)")
        parser.add_argument("--disable", action="store_true", help="store the schedule disabled")

    def handle(self, *args, **opts):
        path = Path(opts["path"]).resolve()
        if not 0 <= opts["hour"] <= 23 or not 0 <= opts["minute"] <= 59:
            raise CommandError("--hour must be 0-23 and --minute 0-59")
        try:
            spec = load_sweep_file(path)  # refuse a broken file now, not at 02:00
        except (SweepError, FileNotFoundError) as exc:
            raise CommandError(str(exc)) from None
        cron, _ = CrontabSchedule.objects.get_or_create(minute=str(opts["minute"]), hour=str(opts["hour"]),
                                                        day_of_week="*", day_of_month="*", month_of_year="*",
                                                        timezone="UTC")
        task, created = PeriodicTask.objects.update_or_create(
            name=f"nightly sweep: {spec.name} ({path.name})",
            defaults=dict(task="runs.start_sweep_from_file", crontab=cron, enabled=not opts["disable"],
                          kwargs=json.dumps({"path": str(path), "host_name": opts["host"]})),
        )
        self.stdout.write(f"{'created' if created else 'updated'} periodic task '{task.name}' at "
                          f"{opts['hour']:02d}:{opts['minute']:02d} UTC{' (disabled)' if opts['disable'] else ''}")
