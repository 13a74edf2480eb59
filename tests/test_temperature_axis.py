"""Temperature as a grid axis (issue 33): `grid.temperature` expands like the other workload
axes and is part of the point key; it is given in one place; the sweep page's temperature figure
draws tau and decode speedup per configuration against it (matched AR at the same temperature),
and says why it is empty for a sweep at one temperature."""

from __future__ import annotations

import pytest

from analysis import figures
from benchkit.compare.speedups import DECODE, compute_speedups
from benchkit.point import Point
from benchkit.sweeps.sweepfile import SweepError, parse_sweep


def doc(**workload_or_grid) -> dict:
    d = {"name": "t", "engine": "external", "model": "m", "server": {"endpoint_url": "http://127.0.0.1:1"},
         "grid": {"tp": [1], "methods": ["auto", {"method": "ngram", "num_speculative_tokens": 4}]},
         "workload": {"num_prompts": 4}}
    for key, value in workload_or_grid.items():
        section, name = key.split("__")
        d[section][name] = value
    return d


def test_grid_temperature_expands_and_keys_the_point():
    spec = parse_sweep(doc(grid__temperature=[0.0, 0.7, 1.0]), source="t.yaml")
    runs = spec.expand()
    assert spec.n_runs() == len(runs) == 6
    assert sorted({r.workload.temperature for r in runs}) == [0.0, 0.7, 1.0]
    assert len({r.point_key() for r in runs}) == 6  # temperature is part of the point
    one = parse_sweep(doc(workload__temperature=0.7), source="t.yaml").expand()
    assert {r.workload.temperature for r in one} == {0.7} and len(one) == 2


@pytest.mark.parametrize(("changes", "message"), [
    ({"grid__temperature": [0.7], "workload__temperature": 0.7}, "also given as grid.temperature"),
    ({"grid__temperature": [-0.1]}, "grid.temperature[0]: must be >= 0.0, got -0.1"),
    ({"grid__temperature": [0.7, 0.7]}, "duplicate values"),
])
def test_grid_temperature_is_checked(changes, message):
    with pytest.raises(SweepError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_sweep(doc(**changes), source="t.yaml")


def _pts() -> list[Point]:
    out, rid = [], 0
    # auto TPOT 10 ms; ngram TPOT falls from 5 ms at T=0 to 8 ms at T=1 (acceptance falls with T)
    for temp, spec_tpot, tau in ((0.0, 5.0, 3.0), (1.0, 8.0, 1.4)):
        for rep in range(3):
            for method, k, tpot, t in (("auto", None, 10.0, None), ("ngram", 4, spec_tpot + 0.01 * rep, tau)):
                rid += 1
                out.append(Point(method=method, num_speculative_tokens=k, temperature=temp, repeat_index=rep,
                                 run_id=rid, figures_={"median_tpot_ms": tpot, "acceptance_length": t,
                                                       "output_throughput_tok_s": 1000 / tpot}))
    return out


def test_temperature_figure_draws_tau_and_decode_speedup_per_configuration():
    pts = _pts()
    fig = figures.temperature_figure(pts, compute_speedups(pts, figures=(DECODE,)))
    assert "empty" not in fig
    tau = next(t for t in fig["data"] if t["name"] == "ngram k=4" and t["yaxis"] == "y")
    speed = next(t for t in fig["data"] if t["name"] == "ngram k=4" and t["yaxis"] == "y2")
    assert tau["x"] == [0.0, 1.0] and tau["y"] == [3.0, 1.4]
    assert speed["y"] == [pytest.approx(10 / 5.01, rel=1e-3), pytest.approx(10 / 8.01, rel=1e-3)]
    assert all(v is not None for v in speed["error_y"]["array"])  # 3 repeats each side: intervals
    one = figures.temperature_figure([p for p in pts if p.temperature == 0.0])
    assert one["empty"].startswith("One temperature only (0)")
