"""Stored per-sweep point summaries (issue 22): what the sweep page, its data.json, compare,
trend and home read instead of every run of a sweep (runs.models.SweepSummary; the codec and the
readers are runs.selectors').

Kept current by the writers: whatever changes a sweep's counted runs (a run entering or leaving
`succeeded`: runs.services.transitions; its figures: runs.services.metrics_store, recompute; its
lossless verdict: runs.services.lossless; a Run saved or deleted through the ORM: the signals
below) calls `mark_stale`, which deletes the sweep's summary in the
writer's transaction (readers then read the runs, as before) and rebuilds it once after that
transaction commits. `manage.py rebuild_summaries` builds them all (after a bulk load, or an
upgrade)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from django.db import transaction
from django.db.models.signals import post_delete, post_save

from runs import selectors
from runs.models import Run, Sweep, SweepSummary, SweepSummaryColumn

log = logging.getLogger(__name__)


def build(sweep_id: int) -> SweepSummary:
    """Read the sweep's counted runs (selectors.summary_columns) and store its summary and its
    columns, replacing those stored (a few queries: the sweep row locked, so that two rebuilds of
    a sweep do not interleave, the runs, the writes). Returns the stored row."""
    _pending().pop(sweep_id, None)  # built now: a later write in this transaction must delete it again
    with transaction.atomic():
        list(Sweep.objects.select_for_update().filter(pk=sweep_id).values_list("pk", flat=True))
        cols = selectors.summary_columns(sweep_id)
        row, _ = SweepSummary.objects.update_or_create(
            sweep_id=sweep_id, defaults={"format": selectors.SUMMARY_FORMAT, "n_points": len(cols["run_id"])})
        SweepSummaryColumn.objects.filter(summary=row).delete()
        SweepSummaryColumn.objects.bulk_create([SweepSummaryColumn(summary=row, name=name, data=data)
                                                for name, data in selectors.pack_summary(cols).items()])
    return row


def rebuild(sweep_ids: Iterable[int] | None = None, progress: Callable[[int, int], None] | None = None) -> int:
    """Build the summaries of `sweep_ids` (default: every sweep), one transaction each; sweeps
    that no longer exist are skipped. `progress(done, total)` after each. Returns how many were
    built."""
    ids = list(Sweep.objects.order_by("pk").values_list("pk", flat=True)) if sweep_ids is None else sorted(
        set(Sweep.objects.filter(pk__in=list(sweep_ids)).values_list("pk", flat=True)))
    for i, pk in enumerate(ids, 1):
        build(pk)
        if progress:
            progress(i, len(ids))
    return len(ids)


def mark_stale(sweep_ids: Iterable[int | None]) -> None:
    """The summaries of `sweep_ids` no longer hold: delete them now (in the caller's
    transaction, one query) and rebuild each once after the outermost transaction commits (right
    away outside one). None entries are ignored."""
    ids = {pk for pk in sweep_ids if pk is not None}
    conn = transaction.get_connection()
    pending = _pending()
    if pending:  # keep only marks whose rebuild is still queued (a rolled-back savepoint drops it)
        queued = {id(entry[1]) for entry in conn.run_on_commit}
        for pk in [pk for pk, func in pending.items() if id(func) not in queued]:
            del pending[pk]
    new = ids - pending.keys()  # a sweep marked earlier in this transaction: its summary is gone already
    if not new:
        return
    SweepSummary.objects.filter(sweep_id__in=new).delete()

    def rebuild_pending() -> None:
        for pk in new:
            if pending.get(pk) is rebuild_pending:
                del pending[pk]
        try:
            rebuild(new)
        except Exception:  # the writer's work is committed: never fail it; readers use the runs meanwhile
            log.exception("summary of sweep(s) %s not rebuilt; run `manage.py rebuild_summaries --sweep ID`",
                          sorted(new))

    if conn.in_atomic_block:
        pending.update(dict.fromkeys(new, rebuild_pending))
    transaction.on_commit(rebuild_pending)


def _pending() -> dict[int, Callable[[], None]]:
    """{sweep id: its queued rebuild}: the sweeps whose summary this connection's open
    transaction deleted and will rebuild when it commits."""
    return transaction.get_connection().__dict__.setdefault("_draftboard_summary_pending", {})


def _run_saved(sender, instance: Run, update_fields=None, **kwargs) -> None:
    if update_fields is None or not set(update_fields) <= _RUN_FIELDS_UNREAD:
        mark_stale([instance.sweep_id])


#: Run columns no point reads: a save of only these leaves the summary as it is.
_RUN_FIELDS_UNREAD = frozenset({"progress_done", "progress_total", "heartbeat_at", "server_log_tail", "server_env",
                                "argv", "spec", "failure_message"})


def connect_signals() -> None:
    """Mark a sweep's summary stale when one of its runs is saved or deleted through the ORM (the
    admin, a shell); the writers of runs' states, figures and verdicts (transitions,
    metrics_store, recompute, lossless) call `mark_stale` themselves. Called by the app's
    ready()."""
    post_save.connect(_run_saved, sender=Run, dispatch_uid="summary-run-saved")
    post_delete.connect(_run_saved, sender=Run, dispatch_uid="summary-run-deleted")
