"""The lossless check of a sweep's speculative runs (issue 18; the rule: benchkit.compare.lossless,
docs/LOSSLESS.md), stored as one LosslessCheck row per speculative run.

When: the worker queues it when a sweep's last run finished (`send_check`, called by
runs.services.regressions.runs_finished; task `runs.check_lossless` on the host's queue); an
ingest and an import call `check_sweep` themselves once their runs are stored; `manage.py
check_lossless` back-fills. Never on a page request: pages read the stored verdict through
`runs.selectors.load_points` (the point's lossless group) and the run page's related row, never
an outputs blob.

What: the sweep's counted runs (an invalidated run leaves every check: its row is deleted, and
verdicts that used it as a baseline are recomputed with the others), their output digests
(RunOutputsBlob) decoded one floor at a time. Imported runs are "not checked: imported file".
Idempotent: a second call writes the same rows.
"""

from __future__ import annotations

import logging

from django.db import transaction

from benchkit.compare.lossless import Verdict, check_runs
from benchkit.measure.outputs import RunOutputs, decode_outputs
from runs.models import LosslessCheck, Run, RunOutputsBlob
from runs.selectors import load_points
from runs.services import dispatch, summaries

log = logging.getLogger(__name__)

#: LosslessCheck.sentence's length.
SENTENCE_MAX = 500


def _load(run_id: int) -> RunOutputs | None:
    """The run's output digests (one query), None when it kept none; ValueError when they do not
    decode."""
    data = RunOutputsBlob.objects.filter(run_id=run_id).values_list("data", flat=True).first()
    return None if data is None else decode_outputs(bytes(data))


def _row(v: Verdict) -> dict:
    """LosslessCheck columns of a Verdict."""
    return dict(verdict=v.verdict, sentence=v.sentence[:SENTENCE_MAX], reason=v.reason, compared=v.compared,
                identical=v.identical, not_comparable=v.not_comparable, identical_share=v.identical_share,
                median_first_divergence=v.median_first_divergence, unit=v.unit or "", precision=v.precision or "",
                block=v.block, divergences=[list(d) for d in v.divergences],
                baseline_run_ids=list(v.baseline_run_ids), floor_run_ids=list(v.floor_run_ids),
                floor_pairs=[list(p) for p in v.floor_pairs], floor_identical_share=v.floor_identical_share,
                p_value=v.p_value)


def check_sweep(sweep_id: int) -> dict[int, str]:
    """Judge every counted speculative run of sweep `sweep_id` against the sweep's counted `auto`
    runs (benchkit.compare.lossless.check_runs) and store the verdicts; its acceptance-controlled
    twins are "not checked: synthetic acceptance" (not lossless by design) (one transaction; rows of
    runs that no longer count, or got no verdict, are deleted). Returns {run id: verdict code}.
    Reads one outputs blob at a time (each at most once)."""
    runs = (Run.objects.counted() | Run.objects.twins()).filter(sweep_id=sweep_id).order_by("id")
    points = load_points(runs, gpus=True)
    imported = set(runs.filter(result_file__isnull=False).values_list("pk", flat=True))
    twins = set(runs.filter(twin_of__isnull=False).values_list("pk", flat=True))  # forced acceptance
    verdicts = check_runs(points, _load, imported=imported, synthetic=twins)
    with transaction.atomic():
        summaries.mark_stale([sweep_id])  # the points' lossless group changes
        LosslessCheck.objects.filter(run__sweep_id=sweep_id).exclude(run_id__in=list(verdicts)).delete()
        for run_id, v in verdicts.items():
            LosslessCheck.objects.update_or_create(run_id=run_id, defaults=_row(v))
    return {run_id: v.verdict for run_id, v in verdicts.items()}


def check_sweep_logged(sweep_id: int) -> dict[int, str] | None:
    """`check_sweep` for a caller whose own work is stored already (an ingest, an import): an
    error is logged, never raised (`manage.py check_lossless --sweep ID` redoes it); None then."""
    try:
        return check_sweep(sweep_id)
    except Exception:
        log.exception("lossless check of sweep %s failed; run `manage.py check_lossless --sweep %s`",
                      sweep_id, sweep_id)
        return None


def send_check(sweep_id: int, queue: str) -> bool:
    """Queue the check of sweep `sweep_id` on `queue` (after the transaction that finished its last
    run committed); True when the broker took it. Never raises: a broker that does not answer is
    logged, and `manage.py check_lossless --sweep ID` computes it later."""
    try:
        dispatch.enqueue_lossless(sweep_id, queue)
        return True
    except Exception as exc:  # the broker is down: the runs are stored, the check can wait
        log.warning("lossless check for sweep %s not queued (%s); run `manage.py check_lossless --sweep %s`",
                    sweep_id, exc, sweep_id)
        return False
