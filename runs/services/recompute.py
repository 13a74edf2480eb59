"""Recompute stored runs' metrics from their raw request logs (a formula fix reaches old runs)."""

from __future__ import annotations

from django.db import transaction

from benchkit.measure import metrics
from benchkit.measure.logs import decode_logs
from runs.models import Run, RunMetrics, RunState
from runs.selectors import window_of
from runs.services.metrics_store import store_metrics


def recompute_run(run: Run) -> RunMetrics | None:
    """Recompute `run`'s metrics from its stored logs and window; keeps its spec-decode figures
    (they come from the server's counters, not from the logs) and their source.

    Only succeeded runs have metrics; returns None for others or runs without stored logs.
    Imported runs (source_tool other than draftboard) have no logs and are left as they are."""
    if run.state != RunState.SUCCEEDED or not hasattr(run, "request_logs"):
        return None
    blob = run.request_logs
    logs = decode_logs(bytes(blob.data))
    slo = (run.spec.get("workload") or {}).get("slo") or None
    window = metrics.compute_run_metrics(logs, blob.window_start_ns, blob.window_end_ns, slo)
    kept = {}
    old = getattr(run, "metrics", None)
    if old is not None:
        window = window.with_spec_decode(window_of(old).to_dict())
        kept = dict(spec_source=old.spec_source, source_tool=old.source_tool, definitions=old.definitions,
                    extra=old.extra)
    with transaction.atomic():
        return store_metrics(run, window, distributions=metrics.distributions(logs), **kept)
