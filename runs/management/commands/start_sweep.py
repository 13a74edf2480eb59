"""`python manage.py start_sweep sweeps/FILE.yaml [--host NAME] [--set key=value]`: queue a sweep."""

from django.core.management.base import BaseCommand, CommandError

from benchkit.hosts.allocation import AllocationError
from benchkit.sweeps.sweepfile import SweepError, parse_variables
from runs.services.dispatch import BrokerUnavailable
from runs.services.hosts import HostNameError
from runs.services.sweeps import create_sweep_from_file


class Command(BaseCommand):
    help = "Create a sweep from a YAML file and queue its runs on the host's Celery queue."

    def add_arguments(self, parser):
        parser.add_argument("path")
        parser.add_argument("--host", default=None)
        parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                            help="substitute {KEY} placeholders in the file, e.g. --set model_dir=/models/x")
        parser.add_argument("--no-enqueue", action="store_true", help="store the runs without queueing them")

    def handle(self, *args, **opts):
        try:
            subs = parse_variables(opts["set"])
            sweep = create_sweep_from_file(opts["path"], host_name=opts["host"], substitutions=subs or None,
                                           enqueue=not opts["no_enqueue"])
        except (SweepError, AllocationError, HostNameError, BrokerUnavailable, ValueError) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"sweep {sweep.pk} '{sweep.name}': {sweep.runs.count()} runs "
                          f"{'stored' if opts['no_enqueue'] else 'queued on host.' + sweep.host.name}")
