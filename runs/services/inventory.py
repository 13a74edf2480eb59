"""Record hardware inventories of hosts as snapshots (history kept) and read the latest back."""

from __future__ import annotations

from django.db import transaction

from benchkit.inventory import HostInventory, collect_inventory
from runs.models import Gpu, HardwareSnapshot, Host


def record_inventory(host: Host, inventory: HostInventory | None = None) -> HardwareSnapshot:
    """Store `inventory` (default: collected now on this machine) as a new snapshot of `host`.

    The snapshot is flagged `changed` when its fingerprint differs from the host's previous
    one (new driver, GPU swapped, topology changed), which is when results stop comparing.
    """
    inv = inventory if inventory is not None else collect_inventory()
    data = inv.to_dict()
    fingerprint = inv.fingerprint()
    previous = HardwareSnapshot.objects.filter(host=host).order_by("-taken_at").first()
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


def latest_inventory(host: Host) -> HostInventory | None:
    """The host's most recent inventory, or None if it was never recorded."""
    snap = HardwareSnapshot.objects.filter(host=host).order_by("-taken_at").first()
    return HostInventory.from_dict(snap.data) if snap else None
