"""Store a run's window metrics: the one place a `WindowMetrics` becomes a RunMetrics row.

Used by execution (a measured run), imports (another tool's result file) and recompute (new
formulas over stored logs). Every WindowMetrics field goes to its column of the same name
(runs.models derives the columns from the same schema); None stays NULL.
"""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from benchkit.formats.common import TOOL_DRAFTBOARD, json_safe
from benchkit.measure.metrics import WindowMetrics
from runs.models import Run, RunMetrics
from runs.services import summaries


def store_metrics(run: Run, window: WindowMetrics, *, spec_source: str | None = None,
                  distributions: dict[str, list[float]] | None = None, source_tool: str = TOOL_DRAFTBOARD,
                  definitions: dict[str, str] | None = None, extra: dict[str, Any] | None = None,
                  efficiency: dict[str, Any] | None = None, gpu_check: dict[str, Any] | None = None,
                  client_headroom: dict[str, Any] | None = None,
                  categories: list[dict[str, Any]] | None = None) -> None:
    """Create or overwrite `run`'s RunMetrics row from `window` (one row per run).

    `spec_source`: where the acceptance figures came from (the counters' engine, or the source
    tool's sentence); `distributions`: the run page's samples (benchkit.measure.metrics.distributions);
    `source_tool` and `definitions`: who computed the figures and how (imports); `extra`: a source
    file's keys without a column (non-finite floats become null, JSON has no NaN); `efficiency`
    (EfficiencyFigures.to_dict(), the per-GPU rows and notes behind the window's `efficiency`
    fields), `gpu_check` (GpuWindowCheck.to_dict()) and `client_headroom` (ClientHeadroom as a
    dict): the JSON beside the figures ({} when not given); `categories`: the figures per prompt
    category (benchkit.measure.categories.CategoryFigures dicts; [] when not given). Call it inside
    the caller's transaction when the row must change together with the run's state.
    """
    values = {
        **window.to_dict(),
        "spec_source": spec_source or "",
        "distributions": distributions or {},
        "source_tool": source_tool,
        "definitions": definitions or {},
        "extra": json_safe(extra or {}),
        "efficiency": json_safe(efficiency or {}),
        "gpu_check": json_safe(gpu_check or {}),
        "client_headroom": json_safe(client_headroom or {}),
        "categories": json_safe(categories or []),
        "computed_at": timezone.now(),
    }
    # One UPDATE when the row exists (recompute: no read of the old row and its samples first);
    # else INSERT, and UPDATE after all if another writer inserted it meanwhile.
    summaries.mark_stale([run.sweep_id])  # None for a Run(pk=...) stand-in: its caller marks
    if not RunMetrics.objects.filter(run_id=run.pk).update(**values):
        try:
            with transaction.atomic():
                RunMetrics.objects.create(run_id=run.pk, **values)
        except IntegrityError:
            RunMetrics.objects.filter(run_id=run.pk).update(**values)
