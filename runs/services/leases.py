"""GPU reservations in the database: two runs never hold the same GPU at once.

A lease row is unique per (host, GPU UUID), so the database refuses a second holder even
with several workers on one host. A lease expires GRACE_S seconds after the run's own time
limit (the Celery task's soft time limit is that same bound, see `total_limit_s`), so a worker
that crashes leaves leases that free themselves; `acquire` deletes expired ones first, but for
leases the reaper kept because their server is not known stopped (`GpuLease.unconfirmed`,
runs.services.supervision.clean_up): those go only when the host's worker confirms.
"""

from __future__ import annotations

from datetime import timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from runs.models import GpuLease, Run

#: How long (seconds) a lease outlives the run's own time limit.
GRACE_S = 300


def total_limit_s(limits) -> float:
    """Upper bound of one run's wall time (s): server readiness + the run + the stop
    (benchkit.specs.Limits). The task's soft time limit and the GPU leases use it."""
    return limits.ready_timeout_s + limits.run_timeout_s + limits.stop_timeout_s


class GpusBusy(Exception):
    """Another live run holds at least one of the requested GPUs."""


def acquire(run: Run, gpu_uuids: list[str], ttl_s: float) -> None:
    """Lease every GPU in `gpu_uuids` to `run` for `ttl_s` + GRACE_S seconds, all or none.

    Raises GpusBusy naming the GPUs and holding runs when any is held by an unexpired lease.
    """
    if not gpu_uuids:
        return
    now = timezone.now()
    expires = now + timedelta(seconds=ttl_s + GRACE_S)
    try:
        with transaction.atomic():
            (GpuLease.objects.filter(host=run.host, gpu_uuid__in=gpu_uuids, expires_at__lt=now)
             .filter(unconfirmed="").delete())  # a kept lease (server not known stopped) never expires
            GpuLease.objects.bulk_create(
                [GpuLease(host=run.host, gpu_uuid=u, run=run, expires_at=expires) for u in gpu_uuids]
            )
    except IntegrityError:
        held = GpuLease.objects.filter(host=run.host, gpu_uuid__in=gpu_uuids).values_list("gpu_uuid", "run_id")
        raise GpusBusy("GPUs held by other runs: " + ", ".join(f"{u} (run {r})" for u, r in held)) from None


def release(run: Run) -> None:
    """Drop every lease `run` holds."""
    GpuLease.objects.filter(run=run).delete()
