"""Celery tasks: ids in, one service call each (Django-Styleguide)."""

from __future__ import annotations

from celery import shared_task

from runs.services import execution, sweeps


@shared_task(name="runs.execute_run", acks_late=True)
def execute_run_task(run_id: int) -> str:
    """Execute run `run_id` on this host's worker; returns the final state."""
    return execution.execute(run_id).state


@shared_task(name="runs.start_sweep_from_file")
def start_sweep_from_file_task(path: str, host_name: str = "") -> int:
    """Create a sweep from the YAML file at `path` on host `host_name` (default: the worker's
    host) and enqueue its runs. Scheduled nightly through django-celery-beat. Returns the sweep id."""
    return sweeps.create_sweep_from_file(path, host_name=host_name or None).pk
