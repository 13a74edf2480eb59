"""`python manage.py record_inventory [--host NAME]`: snapshot this machine's hardware."""

from django.core.management.base import BaseCommand

from runs.services.inventory import record_inventory
from runs.services.sweeps import get_or_create_host


class Command(BaseCommand):
    help = "Record this host's hardware inventory (NVML, nvidia-smi topo -m, CPU) as a new snapshot."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=None, help="host name (default: DRAFTBOARD_HOST / hostname)")

    def handle(self, *args, **opts):
        host = get_or_create_host(opts["host"])
        snap = record_inventory(host)
        missing = snap.data.get("missing") or {}
        self.stdout.write(f"host {host.name}: snapshot {snap.pk}, {snap.gpu_count} GPU(s) {snap.gpu_name}, "
                          f"fingerprint {snap.fingerprint[:12]}{' (CHANGED)' if snap.changed else ''}")
        for field, reason in sorted(missing.items()):
            self.stdout.write(f"  not available: {field}: {reason}")
