"""Recompute stored runs' metrics from their raw request logs (a formula fix reaches old runs)."""

from __future__ import annotations

from django.db import transaction

from benchkit.measure import metrics
from benchkit.measure.logs import decode_logs
from runs.models import Run, RunMetrics, RunState


def recompute_run(run: Run) -> RunMetrics | None:
    """Recompute `run`'s metrics from its stored logs and window; keeps its spec-decode counters.

    Only succeeded runs have metrics; returns None for others or runs without stored logs.
    Imported runs (source_tool other than draftboard) have no logs and are left as they are."""
    if run.state != RunState.SUCCEEDED or not hasattr(run, "request_logs"):
        return None
    blob = run.request_logs
    logs = decode_logs(bytes(blob.data))
    slo = (run.spec.get("workload") or {}).get("slo") or None
    flat = metrics.compute_run_metrics(logs, blob.window_start_ns, blob.window_end_ns, slo).to_flat()
    from runs.services.execution import metrics_fields

    old = getattr(run, "metrics", None)
    fields = metrics_fields(flat, old.spec_decode if old else None, metrics.distributions(logs))
    with transaction.atomic():
        m, _ = RunMetrics.objects.update_or_create(run=run, defaults=fields)
    return m
