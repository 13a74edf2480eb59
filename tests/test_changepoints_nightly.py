"""Issue 21's planted changes stored through the real services (tests/nightly.py with
`changes=ISSUE21_CHANGES`: 14 nights of the users' grid, 504 runs), read back from the database
and given to the change-point detector: each found at its night with its metric, next to what
the existing nightly rule (rolling median, runs.services.regressions) flagged on the same
series. The Django wiring (models, pages, back-fill) is not here yet: the nights are read with
a plain ORM query."""

from __future__ import annotations

import pytest

from benchkit.compare.changepoints import DRIFT, STEP, Night, detect_change_points
from benchkit.methods import method_label
from runs.models import RegressionFlag, RunMetrics, RunState
from tests.nightly import build_nightly_series
from tests.nightly_figures import ISSUE21_CHANGES, PLANTED

pytestmark = pytest.mark.django_db

FIGURES = ("output_throughput_tok_s", "median_tpot_ms", "acceptance_length")


def stored_nights(series, label: str, tp: int, concurrency: int) -> list[Night]:
    """The point's succeeded runs per night, oldest first, as Nights (environment: the engine
    version each run recorded)."""
    rows = RunMetrics.objects.filter(run__sweep__in=series.sweeps, run__tp=tp, run__concurrency=concurrency,
                                     run__state=RunState.SUCCEEDED).values(
        "run__sweep_id", "run__method", "run__num_speculative_tokens", "run__tree_budget", "run__engine_version",
        *FIGURES)
    by_sweep = {r["run__sweep_id"]: r for r in rows
                if method_label(r["run__method"], r["run__num_speculative_tokens"], r["run__tree_budget"]) == label}
    return [Night(s.pk, {f: (by_sweep[s.pk][f],) for f in FIGURES if by_sweep[s.pk][f] is not None},
                  {"engine_version": by_sweep[s.pk]["run__engine_version"]}) for s in series.sweeps]


def test_planted_changes_through_the_real_services_are_found_beside_the_existing_flags():
    series = build_nightly_series(nights=14, changes=ISSUE21_CHANGES, tau_noise_pct=2.0)
    found = {}
    for label, tp, c in [(ch.label, ch.tp, ch.concurrency) for ch in ISSUE21_CHANGES] + [
            (PLANTED.label, PLANTED.tp, PLANTED.concurrency), ("b32", 1, 8), ("auto", 4, 1)]:
        nights = stored_nights(series, label, tp, c)
        assert len(nights) == 14
        found[label, tp, c] = [(cp.index + 1, cp.kind, {s.metric for s in cp.shifts}, cp.sweep_id)
                               for cp in detect_change_points(nights)]
    step, drift, drop = ISSUE21_CHANGES
    night = {i + 1: s.pk for i, s in enumerate(series.sweeps)}
    [(n, kind, moved, sweep_id)] = found[step.label, step.tp, step.concurrency]
    assert (n, kind, sweep_id) == (9, STEP, night[9]) and "median_tpot_ms" in moved and "acceptance_length" not in moved
    [(n, kind, moved, _)] = found[drift.label, drift.tp, drift.concurrency]
    assert kind == DRIFT and abs(n - 5) <= 2 and "acceptance_length" in moved
    [(n, kind, moved, _)] = found[drop.label, drop.tp, drop.concurrency]
    assert (n, kind) == (7, STEP) and "acceptance_length" in moved
    assert [(n, kind) for n, kind, _, _ in found[PLANTED.label, PLANTED.tp, PLANTED.concurrency]] == [(13, STEP)]
    assert found["b32", 1, 8] == [] and found["auto", 4, 1] == []  # the one-night dip; a quiet point
    # Beside them, the existing rule (rolling median of output tok/s, 10 %, flagged on the second
    # worse night): the old planted regression, and the TPOT step (-9 % tok/s, past 10 % with
    # this seed's noise) a night late; the drift and the 8 % tau drop stay under it.
    flags = {(f.label, f.tp, f.concurrency, f.sweep_id) for f in RegressionFlag.objects.filter(host=series.host)}
    assert flags == {(PLANTED.label, PLANTED.tp, PLANTED.concurrency, night[14]),
                     (step.label, step.tp, step.concurrency, night[10])}
