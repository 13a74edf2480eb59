"""`python manage.py enqueue_sweep SWEEP_ID`: queue the still-queued runs of a stored sweep
(one created with --no-enqueue, or whose broker was down)."""

from django.core.management.base import BaseCommand, CommandError

from runs.models import RunState, Sweep
from runs.services.dispatch import BrokerUnavailable, check_broker, enqueue_runs


class Command(BaseCommand):
    help = "Send the queued runs of a sweep to its host's Celery queue."

    def add_arguments(self, parser):
        parser.add_argument("sweep_id", type=int)

    def handle(self, *args, **opts):
        sweep = Sweep.objects.select_related("host").filter(pk=opts["sweep_id"]).first()
        if sweep is None:
            raise CommandError(f"no sweep {opts['sweep_id']}")
        ids = list(sweep.runs.filter(state=RunState.QUEUED).order_by("id").values_list("id", flat=True))
        try:
            check_broker()
        except BrokerUnavailable as exc:
            raise CommandError(str(exc)) from None
        enqueue_runs(ids, sweep.host.queue, share_server=sweep.spec.get("share_server", True))
        self.stdout.write(f"sent {len(ids)} queued run(s) of sweep {sweep.pk} to {sweep.host.queue}")
