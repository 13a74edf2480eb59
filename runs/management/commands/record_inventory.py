"""`python manage.py record_inventory [--host NAME]`: snapshot this machine's hardware."""

from django.core.management.base import BaseCommand, CommandError

from runs.services.hosts import HostNameError, get_or_create_host, record_inventory


class Command(BaseCommand):
    help = "Record this host's hardware inventory (NVML, nvidia-smi topo -m, CPU) as a new snapshot."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=None, help="host name (default: DRAFTBOARD_HOST / hostname)")

    def handle(self, *args, **opts):
        try:
            host = get_or_create_host(opts["host"])
        except HostNameError as exc:
            raise CommandError(str(exc)) from None
        snap = record_inventory(host)
        missing = snap.data.get("missing") or {}
        gpus = f"{snap.gpu_count} GPU(s)" + (f" {snap.gpu_name}" if snap.gpu_name else "")
        changed = " (CHANGED)" if snap.changed else ""
        self.stdout.write(f"host {host.name}: snapshot {snap.pk}, {gpus}, fingerprint {snap.fingerprint[:12]}{changed}")
        for field, reason in sorted(missing.items()):
            self.stdout.write(f"  not available: {field}: {reason}")
