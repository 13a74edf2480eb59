"""Change points of nightly series (issue 21; the method: benchkit.compare.changepoints,
docs/CHANGEPOINTS.md), stored as ChangePoint rows, with the drafter / verify path attribution of
each change point and regression flag of a speculative point (benchkit.compare.attribution, from
the point's acceptance-controlled twins).

When: the task that judges a sweep's regression flags when its last run finished
(runs.tasks.detect_regressions_task) runs `detect_for_sweep_logged` after them; `manage.py
detect_change_points` back-fills. Never on a page request.

What: the whole series (host, sweep name; non-demo sweeps, the last MAX_NIGHTS) point by point
(Point.identity_hash, the key regression flags use): per night the figures of the point's counted
runs (repeats kept) and its environment (hardware fingerprint, driver, engine version, build and
commit, drafter). Idempotent: a change point is keyed by (host, series, point, night) and updated
in place (its acknowledgement kept); an unacknowledged one a re-run no longer finds is deleted
(a drift's start can move by a night as nights are added), an acknowledged one is never deleted.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import defaultdict
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from benchkit.compare.attribution import Across, AttributionRule, attribute, attribute_change
from benchkit.compare.changepoints import ChangePointRule, Night, detect_change_points
from benchkit.point import Point
from runs import selectors
from runs.models import ChangePoint, RegressionFlag, Run, Sweep
from runs.selectors import load_points

log = logging.getLogger(__name__)

#: At most this many nights of a series are read (the newest): about half a year. A quiet 240-night
#: point took 0.9 s here (PELT dominates), so a 36-point grid stays well inside the task's 300 s limit.
MAX_NIGHTS = 180
#: The figures a series is analysed on (ChangePointRule's default metrics).
FIGURES = tuple(m.name for m in ChangePointRule().metrics)
#: Environment fields of a point compared night to night (Point fields), plus the driver.
ENV_FIELDS = ("hardware_fingerprint", "engine_version", "engine_build", "engine_commit", "drafter")


@dataclass
class SeriesDetection:
    """What one detection over a series did: the change point ids stored (created or updated),
    unacknowledged ones removed, points analysed, flags given an attribution."""

    host_id: int
    series: str
    stored: list[int]
    removed: int = 0
    points: int = 0
    flags_attributed: int = 0


def _night_of(points: list[Point], sweep_id: int, driver: dict[str, str]) -> Night:
    values: dict[str, tuple[float, ...]] = {}
    for f in FIGURES:
        vals = tuple(float(v) for v in (getattr(p, f) for p in points) if v is not None and v > 0)
        if vals:
            values[f] = vals
    first = points[0]
    env = {name: str(getattr(first, name) or "") for name in ENV_FIELDS}
    env["driver_version"] = driver.get(first.hardware_fingerprint, "")
    return Night(sweep_id, values, env)


def series_nights(host_id: int, name: str) -> tuple[list[Sweep], dict[str, list[Night]], dict[str, list[Night]],
                                                     dict[str, Point]]:
    """(the series' sweeps oldest first, {point key: its Nights}, {point key: its twins' Nights},
    {point key: the point's newest run as a Point}). Three queries plus the snapshots'."""
    sweeps = selectors.series_sweeps(host_id, name, limit=MAX_NIGHTS, include_demo=False)
    ids = [s.pk for s in sweeps]
    snapshots = selectors.snapshot_history([host_id])
    driver = {s["fingerprint"]: s["driver_version"] or "" for lst in snapshots.values() for s in lst}
    points = selectors.history_points(ids, FIGURES, snapshots=snapshots, gpus=False)
    twins = load_points(Run.objects.twins().filter(sweep_id__in=ids).order_by("sweep_id", "id"), FIGURES,
                        gpus=False, snapshots={})
    order = {sid: i for i, sid in enumerate(ids)}

    def group(pts: list[Point]) -> dict[str, list[Night]]:
        by: dict[str, dict[int, list[Point]]] = defaultdict(lambda: defaultdict(list))
        for p in pts:
            by[p.identity_hash()][p.sweep_id].append(p)
        return {k: [_night_of(v[sid], sid, driver) for sid in sorted(v, key=order.__getitem__)]
                for k, v in by.items()}

    latest = {}
    for p in points:
        latest[p.identity_hash()] = p
    return sweeps, group(points), group(twins), latest


def _shift_row(s) -> dict:
    return dataclasses.asdict(s)


def _attribution_row(a) -> dict:
    if a is None:
        return {}
    return {"verdict": a.verdict, "reason": a.reason, "expected_change_pct": a.expected_change_pct,
            "unexplained_pct": a.unexplained_pct,
            **{name: dataclasses.asdict(getattr(a, name)) if getattr(a, name) is not None else None
               for name in ("tau", "speed", "twin_speed", "twin_tau")}}


def detect_for_series(host_id: int, name: str, rule: ChangePointRule | None = None,
                      attribution_rule: AttributionRule | None = None) -> SeriesDetection:
    """Detect and store the change points of every point of the series (host, `name`) over its
    whole stored history (module doc), with each one's attribution (drafter / verify path / both
    / unknown / no twin; {} for a point without tau); then give the series' regression flags of
    speculative points their attribution too (`attribute_flags`). Idempotent."""
    rule = rule or ChangePointRule()
    sweeps, nights, twin_nights, latest = series_nights(host_id, name)
    found = []
    for key, series in nights.items():
        for cp in detect_change_points(series, rule):
            found.append((key, series, cp))
    with transaction.atomic():
        ids = []
        for key, series, cp in found:
            p = latest[key]
            attr = attribute_change(cp, series, twin_nights.get(key), attribution_rule)
            row, _ = ChangePoint.objects.update_or_create(
                host_id=host_id, series=name, point_key=key, sweep_id=cp.sweep_id,
                defaults=dict(label=p.label[:100], tp=p.tp, concurrency=p.concurrency or 0,
                              input_len=p.input_len or 0, output_len=p.output_len or 0, kind=cp.kind,
                              metrics=[s.metric for s in cp.shifts], shifts=[_shift_row(s) for s in cp.shifts],
                              env_changes=[dataclasses.asdict(e) for e in cp.env_changes],
                              found_by=list(cp.found_by), sentence=cp.sentence(),
                              before_sweep_ids=[n.sweep_id for n in series[cp.before[0]:cp.before[1]]],
                              after_sweep_ids=[n.sweep_id for n in series[cp.after[0]:cp.after[1]]],
                              attribution=_attribution_row(attr)))
            ids.append(row.pk)
        removed, _ = (ChangePoint.objects.filter(host_id=host_id, series=name, acknowledged_at__isnull=True)
                      .exclude(pk__in=ids).delete())
    flagged = attribute_flags(host_id, name, nights, twin_nights, attribution_rule)
    return SeriesDetection(host_id, name, ids, removed=removed, points=len(nights), flags_attributed=flagged)


def _mean(nights: list[Night], sweep_ids: set[int], metric: str) -> float | None:
    vals = [v for n in nights if n.sweep_id in sweep_ids for v in n.values.get(metric) or ()]
    return sum(vals) / len(vals) if vals else None


def attribute_flags(host_id: int, name: str, nights: dict[str, list[Night]], twin_nights: dict[str, list[Night]],
                    rule: AttributionRule | None = None) -> int:
    """Store on each regression flag of the series whose point has tau (a speculative point) the
    attribution across it: the flag's baseline nights against its night, for the real run's tau
    and output tok/s and the twin's (benchkit.compare.attribution.attribute). Returns how many
    flags were given one."""
    n = 0
    for flag in RegressionFlag.objects.filter(host_id=host_id, series=name):
        real = nights.get(flag.point_key)
        if not real:
            continue
        before, after = set(flag.baseline_sweep_ids), {flag.sweep_id}
        figs = {m: (_mean(real, before, m), _mean(real, after, m)) for m in ("acceptance_length",
                                                                           "output_throughput_tok_s")}
        if any(v is None for pair in figs.values() for v in pair):
            continue
        twin = twin_nights.get(flag.point_key) or []
        tb, ta = _mean(twin, before, "output_throughput_tok_s"), _mean(twin, after, "output_throughput_tok_s")
        xb, xa = _mean(twin, before, "acceptance_length"), _mean(twin, after, "acceptance_length")
        a = attribute(Across(*figs["acceptance_length"]), Across(*figs["output_throughput_tok_s"]),
                      Across(tb, ta) if tb is not None and ta is not None else None, rule,
                      Across(xb, xa) if xb is not None and xa is not None else None)
        RegressionFlag.objects.filter(pk=flag.pk).update(attribution=_attribution_row(a))
        n += 1
    return n


def detect_for_sweep(sweep_id: int, rule: ChangePointRule | None = None) -> SeriesDetection | None:
    """`detect_for_series` of sweep `sweep_id`'s series; None for a demo sweep (never judged)."""
    sweep = Sweep.objects.only("id", "name", "host_id", "is_demo").get(pk=sweep_id)
    if sweep.is_demo:
        return None
    return detect_for_series(sweep.host_id, sweep.name, rule)


def detect_for_sweep_logged(sweep_id: int) -> SeriesDetection | None:
    """`detect_for_sweep` for the task that stored the flags already: an error is logged, never
    raised (`manage.py detect_change_points --sweep ID` redoes it)."""
    try:
        return detect_for_sweep(sweep_id)
    except Exception:
        log.exception("change-point detection for sweep %s failed; run `manage.py detect_change_points --sweep %s`",
                      sweep_id, sweep_id)
        return None


def backfill(host_id: int | None = None, name: str | None = None) -> list[SeriesDetection]:
    """`detect_for_series` over every non-demo series (optionally of one host and/or name)."""
    qs = Sweep.objects.filter(is_demo=False)
    if host_id is not None:
        qs = qs.filter(host_id=host_id)
    if name is not None:
        qs = qs.filter(name=name)
    pairs = qs.order_by("host_id", "name").values_list("host_id", "name").distinct()
    return [detect_for_series(h, n) for h, n in pairs]


def acknowledge(ids: list[int], username: str, reason: str) -> int:
    """Acknowledge open change points `ids` with `reason` (who, when and why kept; the first
    acknowledgement stays). Returns how many changed. Raises ValueError for a blank reason or
    an empty username."""
    reason = reason.strip()
    if not reason:
        raise ValueError("acknowledging a change point needs a reason")
    if not username:
        raise ValueError("acknowledging a change point needs the user's name")
    return ChangePoint.objects.filter(pk__in=ids, acknowledged_at__isnull=True).update(
        acknowledged_at=timezone.now(), acknowledged_by=username[:150], ack_reason=reason[:5000])
