"""Hosts: their names, their hardware snapshots, and quarantine (set by a teardown that could not
clean up, cleared by an administrator). Every write about a host goes through here."""

from __future__ import annotations

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from benchkit.hosts import HOST_NAME_RE
from benchkit.hosts.inventory import HostInventory, collect_inventory
from runs.models import Gpu, HardwareSnapshot, Host


class HostNameError(ValueError):
    """A host name that cannot name a Celery queue and a URL (letters, digits, . _ -; <= 100)."""


def host_name(name: str | None = None) -> str:
    """`name` (default: settings.DRAFTBOARD_HOST), checked. Raises HostNameError for a name
    that is not 1-100 letters, digits, '.', '_' or '-' (it becomes the queue `host.<name>` and
    a URL path segment)."""
    name = name or settings.DRAFTBOARD_HOST
    if not HOST_NAME_RE.match(name):
        raise HostNameError(f"host name {name!r} (DRAFTBOARD_HOST or --host): use 1-100 letters, digits, "
                            "'.', '_' or '-', starting with a letter or digit")
    return name


def get_or_create_host(name: str | None = None) -> Host:
    """The Host row for `name` (default: settings.DRAFTBOARD_HOST), created on first use.
    Raises HostNameError (see host_name)."""
    host, _ = Host.objects.get_or_create(name=host_name(name))
    return host


def record_inventory(host: Host, inventory: HostInventory | None = None) -> HardwareSnapshot:
    """Store `inventory` (default: collected now on this machine) as a new snapshot of `host`.

    The snapshot is flagged `changed` when its fingerprint differs from the host's previous
    one (new driver, GPU swapped, topology changed), which is when results stop comparing.
    """
    inv = inventory if inventory is not None else collect_inventory()
    data = inv.to_dict()
    fingerprint = inv.fingerprint()
    previous = HardwareSnapshot.objects.filter(host=host).order_by("-taken_at").only("fingerprint").first()
    gpu0 = inv.gpus[0] if inv.gpus else None
    with transaction.atomic():
        snap = HardwareSnapshot.objects.create(
            host=host,
            fingerprint=fingerprint,
            changed=previous is not None and previous.fingerprint != fingerprint,
            gpu_count=len(inv.gpus),
            gpu_name=(gpu0.name or "") if gpu0 else "",
            driver_version=inv.driver_version or "",
            cuda_version=inv.cuda_driver_version or "",
            cpu_model=inv.cpu_model or "",
            data=data,
        )
        Gpu.objects.bulk_create([
            Gpu(snapshot=snap, index=g.index, uuid=g.uuid, pci_bus_id=g.pci_bus_id or "", name=g.name or "",
                memory_total_mib=g.memory_total_mib, numa_node=g.numa_node if g.numa_node is not None else -1)
            for g in inv.gpus
        ])
    return snap


def quarantine(host_id: int, reason: str) -> None:
    """Stop `host_id` from taking runs (a teardown left processes or GPU memory behind) until an
    administrator clears it. Idempotent; the first reason is kept."""
    Host.objects.filter(pk=host_id, quarantined=False).update(
        quarantined=True, quarantined_at=timezone.now(), quarantine_reason=reason[:2000])


def clear_quarantine(hosts) -> int:
    """Let quarantined `hosts` (Host rows or a queryset) take runs again. Returns how many were
    cleared."""
    return Host.objects.filter(pk__in=[h.pk for h in hosts], quarantined=True).update(
        quarantined=False, quarantine_reason="", quarantined_at=None)
