"""Regression flags of nightly series: detect (benchkit.compare.regressions) and store them, and
let an administrator acknowledge them with a reason.

A series is the sweeps of one name on one host (runs.selectors.series_sweeps); demo sweeps
(tiny models trained here, run on a CPU) are never judged. Detection runs when the last run of a sweep reaches a
final state (`runs_finished`, called once by execution after the outcomes are stored; it
queues the task `runs.detect_regressions` on the host's queue) and from
`manage.py detect_regressions` for back-fills.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from benchkit.compare.regressions import RegressionRule, detect_regressions
from runs import selectors
from runs.models import ACTIVE_STATES, RegressionFlag, Run, RunState, Sweep
from runs.services import dispatch, lossless

log = logging.getLogger(__name__)

#: Run states after which a run never changes again (but for an administrator's invalidation).
_UNFINISHED = (RunState.QUEUED, *ACTIVE_STATES)


def rule_from_settings() -> RegressionRule:
    """The RegressionRule of settings.DRAFTBOARD_REGRESSION_* (checked at start-up)."""
    window = settings.DRAFTBOARD_REGRESSION_WINDOW
    return RegressionRule(window=window, threshold_pct=settings.DRAFTBOARD_REGRESSION_THRESHOLD_PCT,
                          test=settings.DRAFTBOARD_REGRESSION_TEST, alpha=settings.DRAFTBOARD_REGRESSION_ALPHA,
                          min_history=min(3, window))


@dataclass
class Detection:
    """What one detection did on one night: flags created or updated, unacknowledged flags that
    no longer hold and were removed, and why nothing was judged (`skipped`, "" when judged)."""

    sweep_id: int
    flagged: list[int]
    removed: int = 0
    skipped: str = ""


def detect_for_sweep(sweep_id: int, rule: RegressionRule | None = None) -> Detection:
    """Judge night `sweep_id` of its series against the nights before it and store the flags.

    Idempotent: a flag is keyed by (sweep, point, metric) and updated in place (its
    acknowledgement kept); an unacknowledged flag of this night that the rule no longer raises
    (a run was invalidated, the settings changed) is deleted; acknowledged flags are never
    deleted. Demo sweeps and a series' first night are skipped. Reads window + 3 nights.
    """
    rule = rule or rule_from_settings()
    sweep = Sweep.objects.only("id", "name", "host_id", "created_at", "is_demo").get(pk=sweep_id)
    if sweep.is_demo:
        return Detection(sweep_id, [], skipped="demo sweep (a tiny demo model on a CPU): not judged")
    nights = selectors.series_sweeps(sweep.host_id, sweep.name, until=sweep, limit=rule.window + 3,
                                     include_demo=False)
    if len(nights) < 2:
        return Detection(sweep_id, [], skipped="first night of its series")
    points = selectors.history_points([s.pk for s in nights], tuple(m for m, _ in rule.metrics))
    by_sweep: dict[int, list] = {s.pk: [] for s in nights}
    for p in points:
        by_sweep[p.sweep_id].append(p)
    findings = detect_regressions([(s.pk, by_sweep[s.pk]) for s in nights], rule)
    with transaction.atomic():
        ids = []
        for f in findings:
            flag, _ = RegressionFlag.objects.update_or_create(
                sweep_id=sweep.pk, point_key=f.point_key, metric=f.metric,
                defaults=dict(host_id=sweep.host_id, series=sweep.name, label=f.label[:100], tp=f.point.tp,
                              concurrency=f.point.concurrency, input_len=f.point.input_len,
                              output_len=f.point.output_len, value=f.value, baseline=f.baseline,
                              change_pct=f.change_pct, previous_change_pct=f.previous_change_pct,
                              p_value=f.p_value, rule=f.rule, run_ids=f.run_ids,
                              baseline_sweep_ids=f.baseline_sweep_ids, note=f.note))
            ids.append(flag.pk)
        removed, _ = (RegressionFlag.objects.filter(sweep_id=sweep.pk, acknowledged_at__isnull=True)
                      .exclude(pk__in=ids).delete())
    return Detection(sweep_id, ids, removed=removed)


def backfill(host_id: int | None = None, name: str | None = None, rule: RegressionRule | None = None
             ) -> list[Detection]:
    """Run `detect_for_sweep` on every non-demo sweep (optionally of one host and/or one series
    name), oldest first, so each night is judged against the nights before it."""
    qs = Sweep.objects.filter(is_demo=False)
    if host_id is not None:
        qs = qs.filter(host_id=host_id)
    if name is not None:
        qs = qs.filter(name=name)
    rule = rule or rule_from_settings()
    return [detect_for_sweep(pk, rule) for pk in qs.order_by("created_at", "pk").values_list("pk", flat=True)]


def acknowledge(flag_ids: list[int], username: str, reason: str) -> int:
    """Acknowledge open flags `flag_ids` with `reason` (kept with who and when, for audit);
    already acknowledged flags keep their first acknowledgement. Returns how many changed.
    Raises ValueError when `reason` is blank or `username` is empty."""
    reason = reason.strip()
    if not reason:
        raise ValueError("acknowledging a regression needs a reason")
    if not username:
        raise ValueError("acknowledging a regression needs the user's name")
    return RegressionFlag.objects.filter(pk__in=flag_ids, acknowledged_at__isnull=True).update(
        acknowledged_at=timezone.now(), acknowledged_by=username[:150], ack_reason=reason[:5000])


def runs_finished(run_ids: list[int]) -> list[int]:
    """Called by every path that ends runs (a worker's outcome store or its refusal to start them,
    the reaper, `execution.fail_queued`) once runs `run_ids` reached a final state: for each of
    their sweeps that has no queued or active run left (its last run just ended), queue on the
    host's queue, after the transaction commits, the lossless check (runs.services.lossless,
    every sweep, demo ones too) and the regression detection (not for demo sweeps).

    Once per sweep: the sweep is stamped (`Sweep.checks_queued_at`, a conditional UPDATE), so a
    second path that ends the same last run (the reaper racing the worker) queues nothing.
    Never raises for the broker: a send that fails is logged and clears the stamp, so the
    supervisor's catch-up (`queue_pending_checks`) sends it later. Database errors propagate
    (callers retry: runs.services.dbretry). Returns the sweep ids sent for detection."""
    sweeps = list(Sweep.objects.filter(runs__pk__in=run_ids, checks_queued_at__isnull=True).distinct()
                  .select_related("host").only("id", "is_demo", "host__name"))
    return _queue_checks(sweeps)


def queue_pending_checks(host_id: int) -> list[int]:
    """The supervisor's catch-up (supervision.supervise, every DRAFTBOARD_SUPERVISE_INTERVAL_S):
    queue the checks of `host_id`'s sweeps whose last run ended but whose checks were never
    queued (a send that failed, a path that died between the store and the send). Returns the
    sweep ids sent for detection."""
    sweeps = list(Sweep.objects.filter(host_id=host_id, checks_queued_at__isnull=True).select_related("host")
                  .only("id", "is_demo", "host__name").order_by("id")[:100])
    return _queue_checks(sweeps)


def _queue_checks(sweeps: list[Sweep]) -> list[int]:
    """Stamp and queue the checks of those of `sweeps` with no unfinished run left (runs_finished)."""
    sent = []
    for s in sweeps:
        if Run.objects.filter(sweep_id=s.pk, state__in=_UNFINISHED).exists():
            continue
        if not Sweep.objects.filter(pk=s.pk, checks_queued_at__isnull=True).update(checks_queued_at=timezone.now()):
            continue  # another path stamped it first
        transaction.on_commit(lambda s=s: _send_checks(s))
        sent.append(s)
    return [s.pk for s in sent if not s.is_demo]


def _send_checks(sweep: Sweep) -> None:
    ok = lossless.send_check(sweep.pk, sweep.host.queue)
    if not sweep.is_demo:
        ok = _send(sweep.pk, sweep.host.queue) and ok
    if not ok:  # the broker did not take it: the supervisor's catch-up sends it again
        Sweep.objects.filter(pk=sweep.pk).update(checks_queued_at=None)


def _send(sweep_id: int, queue: str) -> bool:
    try:
        dispatch.enqueue_detection(sweep_id, queue)
        return True
    except Exception as exc:  # the broker is down: the runs are stored, detection can wait
        log.warning("regression detection for sweep %s not queued (%s); run `manage.py detect_regressions "
                    "--sweep %s`", sweep_id, exc, sweep_id)
        return False
