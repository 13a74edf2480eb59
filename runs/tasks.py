"""Celery tasks: ids in, one service call each (Django-Styleguide).

Importing this module (the worker autodiscovers it) also connects the worker hooks of
runs.worker (reaper at worker start, the worker's heartbeat on its Host row).
"""

from __future__ import annotations

from datetime import date, datetime

from celery import shared_task

from runs import worker  # noqa: F401  (connects the worker signal handlers)
from runs.services import changepoints, dbretry, dispatch, execution, leases, lossless, regressions, supervision, sweeps

#: While a run's GPUs are held by another run, retry every GPU_BUSY_RETRY_S seconds, at most
#: GPU_BUSY_MAX_RETRIES times (2 hours), then fail the run with `gpu_busy`.
GPU_BUSY_RETRY_S = 60
GPU_BUSY_MAX_RETRIES = 120
#: The check tasks are retried through a database outage: backoff up to CHECK_RETRY_MAX_S s
#: between tries, at most CHECK_MAX_RETRIES tries (about 20 minutes in all).
CHECK_RETRY_MAX_S, CHECK_MAX_RETRIES = 120, 12
#: A run task that met a database outage before it claimed its runs comes back after this (s).
DB_RETRY_S = 10


@shared_task(bind=True, name=dispatch.EXECUTE_RUNS_TASK, acks_late=True, max_retries=GPU_BUSY_MAX_RETRIES)
def execute_runs_task(self, run_ids: list[int]) -> list[str]:
    """Execute runs `run_ids` (one server start, see execution.execute_group) on this host's
    worker; returns their final states."""
    try:
        return [r.state for r in execution.execute_group(run_ids)]
    except leases.GpusBusy as exc:
        if self.request.retries >= GPU_BUSY_MAX_RETRIES:
            return [execution.fail_queued(i, "gpu_busy", str(exc)).state for i in run_ids]
        dispatch.expect_redelivery(run_ids, GPU_BUSY_RETRY_S)
        raise self.retry(countdown=GPU_BUSY_RETRY_S) from None
    except dbretry.TRANSIENT as exc:  # before the claim (reap, lease): the runs are still queued
        dbretry.close_quietly()
        raise self.retry(countdown=DB_RETRY_S, exc=exc) from None


@shared_task(bind=True, name="runs.start_sweep_from_file")
def start_sweep_from_file_task(self, path: str, host_name: str = "", substitutions: dict | None = None) -> int:
    """Create a sweep from the YAML file at `path` (placeholders filled from `substitutions`) on
    host `host_name` (default: the worker's host) and enqueue its runs. Scheduled nightly
    through django-celery-beat on the host's queue; a message from beat carries its schedule
    window (headers `periodic_task_name` and `schedule_window`, see benchsite.celery), and a
    second message of one window creates nothing. Returns the sweep id."""
    window = getattr(self.request, "schedule_window", None)
    sweep, _ = sweeps.create_sweep_for_window(
        path, host_name=host_name or None, substitutions=substitutions or None,
        schedule=getattr(self.request, "periodic_task_name", None) or "",
        window=date.fromisoformat(window) if window else None)
    return sweep.pk


@shared_task(name=dispatch.SUPERVISE_TASK, acks_late=True)
def supervise_host_task(host_name: str, checkpoint: str = "") -> dict:
    """Reap lost runs of host `host_name` and reconcile its lost messages (supervision.supervise);
    sent by beat to every host queue, and by itself as the reconcile marker (`checkpoint`)."""
    return supervision.supervise(host_name, datetime.fromisoformat(checkpoint) if checkpoint else None)


@shared_task(name=dispatch.DETECT_REGRESSIONS_TASK, acks_late=True, autoretry_for=dbretry.TRANSIENT, retry_backoff=True,
             retry_backoff_max=CHECK_RETRY_MAX_S, max_retries=CHECK_MAX_RETRIES)
def detect_regressions_task(sweep_id: int) -> list[int]:
    """Judge sweep `sweep_id` against the earlier nights of its series and store regression flags
    (regressions.detect_for_sweep), then the change points of its whole series with their
    attributions (changepoints.detect_for_sweep_logged: an error there is logged, the flags stay);
    returns the flag ids. Queued when the sweep's last run finished."""
    flagged = regressions.detect_for_sweep(sweep_id).flagged
    changepoints.detect_for_sweep_logged(sweep_id)
    return flagged


@shared_task(name=dispatch.CHECK_LOSSLESS_TASK, acks_late=True, autoretry_for=dbretry.TRANSIENT, retry_backoff=True,
             retry_backoff_max=CHECK_RETRY_MAX_S, max_retries=CHECK_MAX_RETRIES)
def check_lossless_task(sweep_id: int) -> dict[int, str]:
    """Judge the speculative runs of sweep `sweep_id` against its auto runs and store the verdicts
    (lossless.check_sweep); returns {run id: verdict}. Queued when the sweep's last run finished."""
    return lossless.check_sweep(sweep_id)
