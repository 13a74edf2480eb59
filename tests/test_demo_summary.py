"""`manage.py demo`'s printed table: per configuration, decode and end-to-end speedups with their
bootstrap intervals (3 repeats), tau, acceptance per draft position and the lossless verdicts."""

from __future__ import annotations

import io

import pytest

from runs.management.commands.demo import Command, _ratio
from runs.models import LosslessCheck
from tests.factories import finish_run, make_run, make_sweep

pytestmark = pytest.mark.django_db


def test_table_shows_decode_speedup_ci_tau_and_lossless():
    sweep = make_sweep(is_demo=True)
    for rep, gap in enumerate((10.0, 10.5, 9.5)):
        finish_run(make_run(sweep, "auto", repeat=rep), gap_ms=gap)
    for rep, gap in enumerate((6.0, 6.2, 5.8)):
        run = finish_run(make_run(sweep, "draft_model", k=2, repeat=rep), gap_ms=gap, spec_decode={
            "acceptance_length": 2.4 + rep / 100, "per_position_acceptance_rate": [0.8, 0.6]})
        LosslessCheck.objects.create(run=run, verdict="lossless" if rep else "beyond_floor", sentence="x")
    out = io.StringIO()
    cmd = Command(stdout=out)
    cmd._summary(sweep)
    text = out.getvalue()
    assert "sweep" in text and "6 of 6 runs counted" in text
    line = next(x for x in text.splitlines() if x.startswith("draft_model k=2"))
    # decode speedup = auto median TPOT (10 ms) / config median TPOT (6 ms), with its interval
    assert "1.67x [" in line
    assert " 2.41 " in line and "0.80 0.60" in line
    assert "beyond_floor 1/3" in line and "lossless 2/3" in line
    auto = next(x for x in text.splitlines() if x.startswith("auto"))
    assert "1.00x" in auto and "baseline" in auto
    # the sweep page's verdict: 3 repeats each, draft_model k=2's interval clear of auto's
    verdict = next(x for x in text.splitlines() if x.startswith("Verdict at TP1, concurrency 1"))
    assert "decode speedup" in verdict and "draft_model k=2" in verdict and "tie" not in verdict


def test_ratio_formats():
    from benchkit.compare.speedups import Ratio

    assert _ratio(Ratio()) == "-"
    assert _ratio(Ratio(value=1.234)) == "1.23x"
    assert _ratio(Ratio(value=1.234, ci95=(1.1, 1.3))) == "1.23x [1.10-1.30]"
    # the baseline's median TPOT is 0 (everything in the first message): no 0.00x drawn as data
    assert _ratio(Ratio(value=0.0, ci95=(0.0, 0.0), median=1.6, baseline_median=0.0)) == "- (median 0)"


def test_every_draft_position_is_printed_and_the_columns_stay_aligned():
    """k=8 has eight acceptance rates; the table once cut the column at 24 characters (five)."""
    sweep = make_sweep(is_demo=True)
    finish_run(make_run(sweep, "auto"), gap_ms=10.0)
    rates = [0.9, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1]
    run = finish_run(make_run(sweep, "draft_model", k=8), gap_ms=5.0,
                     spec_decode={"acceptance_length": 4.6, "per_position_acceptance_rate": rates})
    LosslessCheck.objects.create(run=run, verdict="lossless", sentence="x")
    out = io.StringIO()
    Command(stdout=out)._summary(sweep)
    lines = out.getvalue().splitlines()
    line = next(x for x in lines if x.startswith("draft_model k=8"))
    assert "0.90 0.70 0.60 0.50 0.40 0.30 0.20 0.10" in line and line.endswith("lossless 1/1")
    head = next(x for x in lines if x.startswith("config"))
    assert head.index("lossless") == line.index("lossless 1/1")
