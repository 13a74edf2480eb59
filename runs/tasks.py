"""Celery tasks: ids in, one service call each (Django-Styleguide)."""

from __future__ import annotations

from celery import shared_task

from runs.services import dispatch, execution, leases, regressions, sweeps

#: While a run's GPUs are held by another run, retry every GPU_BUSY_RETRY_S seconds, at most
#: GPU_BUSY_MAX_RETRIES times (2 hours), then fail the run with `gpu_busy`.
GPU_BUSY_RETRY_S = 60
GPU_BUSY_MAX_RETRIES = 120


@shared_task(bind=True, name=dispatch.EXECUTE_RUNS_TASK, acks_late=True, max_retries=GPU_BUSY_MAX_RETRIES)
def execute_runs_task(self, run_ids: list[int]) -> list[str]:
    """Execute runs `run_ids` (one server start, see execution.execute_group) on this host's
    worker; returns their final states."""
    try:
        return [r.state for r in execution.execute_group(run_ids)]
    except leases.GpusBusy as exc:
        if self.request.retries >= GPU_BUSY_MAX_RETRIES:
            return [execution.fail_queued(i, "gpu_busy", str(exc)).state for i in run_ids]
        raise self.retry(countdown=GPU_BUSY_RETRY_S) from None


@shared_task(name="runs.start_sweep_from_file")
def start_sweep_from_file_task(path: str, host_name: str = "", substitutions: dict | None = None) -> int:
    """Create a sweep from the YAML file at `path` (placeholders filled from `substitutions`) on
    host `host_name` (default: the worker's host) and enqueue its runs. Scheduled nightly
    through django-celery-beat on the host's queue. Returns the sweep id."""
    return sweeps.create_sweep_from_file(path, host_name=host_name or None, substitutions=substitutions or None).pk


@shared_task(name=dispatch.DETECT_REGRESSIONS_TASK, acks_late=True)
def detect_regressions_task(sweep_id: int) -> list[int]:
    """Judge sweep `sweep_id` against the earlier nights of its series and store regression flags
    (regressions.detect_for_sweep); returns the flag ids. Queued when the sweep's last run finished."""
    return regressions.detect_for_sweep(sweep_id).flagged
