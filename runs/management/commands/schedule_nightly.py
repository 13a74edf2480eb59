"""`python manage.py schedule_nightly sweeps/FILE.yaml --hour 2 [--host NAME] [--set k=v]`:
a Celery-beat nightly sweep (django-celery-beat), sent to the host's own queue."""

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from django_celery_beat.models import CrontabSchedule, PeriodicTask

from benchkit.sweeps.sweepfile import SweepError, load_sweep_file, parse_variables
from runs.services.hosts import HostNameError, host_name


class Command(BaseCommand):
    help = "Schedule a sweep file to be queued every night by Celery beat on the host's own queue."

    def add_arguments(self, parser):
        parser.add_argument("path")
        parser.add_argument("--hour", type=int, default=2, help="UTC hour (0-23)")
        parser.add_argument("--minute", type=int, default=0)
        parser.add_argument("--host", default="", help="host name (default: DRAFTBOARD_HOST / hostname)")
        parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                            help="substitute {KEY} placeholders in the file")
        parser.add_argument("--disable", action="store_true", help="store the schedule disabled")

    def handle(self, *args, **opts):
        path = Path(opts["path"]).resolve()
        if not 0 <= opts["hour"] <= 23 or not 0 <= opts["minute"] <= 59:
            raise CommandError("--hour must be 0-23 and --minute 0-59")
        try:  # refuse a broken file now, not at 02:00
            host = host_name(opts["host"])
            subs = parse_variables(opts["set"])
            spec = load_sweep_file(path, variables=subs or None)
            spec.require_resolved()
        except (SweepError, HostNameError, ValueError) as exc:
            raise CommandError(str(exc)) from None
        cron, _ = CrontabSchedule.objects.get_or_create(minute=str(opts["minute"]), hour=str(opts["hour"]),
                                                        day_of_week="*", day_of_month="*", month_of_year="*",
                                                        timezone="UTC")
        task, created = PeriodicTask.objects.update_or_create(
            name=f"nightly sweep: {spec.name} ({path.name}) on {host}",
            defaults=dict(task="runs.start_sweep_from_file", crontab=cron, enabled=not opts["disable"],
                          queue=f"host.{host}",  # the host's worker creates the sweep and runs it
                          kwargs=json.dumps({"path": str(path), "host_name": host, "substitutions": subs})),
        )
        self.stdout.write(f"{'created' if created else 'updated'} periodic task '{task.name}' at "
                          f"{opts['hour']:02d}:{opts['minute']:02d} UTC on queue host.{host}"
                          f"{' (disabled)' if opts['disable'] else ''}; the file is read on {host} at that time: "
                          f"{path}")
