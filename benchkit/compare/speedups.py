"""Speedups (MEASUREMENT.md "Comparing runs"): pure functions over points (benchkit.point.Point).

Two points are comparable when they differ in the decoding configuration only: equal
`Point.match_key()` (engine name, version and build, model, TP, workload, host and GPUs by UUID;
falling back to GPU model + TP is NOT done here: within one sweep the GPUs are planned per TP),
different `Point.config_key()` (method, k, tree budget, drafter). The baseline is the `auto`
point(s) of that match, or the points of another configuration the caller names by its label
(e.g. `linear`: DDTree against linear DFlash, as the users report it). Repeats are aggregated
by their median; with >= 3 repeats on both sides a 95 % bootstrap confidence interval of the
ratio of medians is given (benchkit.compare.stats). No baseline -> no number (None) and a reason
that names what is missing, never a guess.

A speedup is one or more named ratios (`SPEEDUP_FIGURES`), each dividing one figure of the
points: `end_to_end` = output tok/s of the configuration / that of the baseline (what a batch
job sees); `decode` = median TPOT of the baseline / that of the configuration (DDTree's and
DFlash's decode-only definition). `relative_step_costs` gives the decomposition's other factor,
TPOT x tau / baseline TPOT, so that decode speedup = tau / relative step cost.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from benchkit.compare.stats import median, median_ratio_cis
from benchkit.hosts.allocation import inconsistent_tp_gpus
from benchkit.point import MATCH_FIELDS, SPEED_FIELD, Point

#: The default baseline: autoregressive decoding (benchkit.methods: label `auto`).
AUTO = "auto"
#: Fewest repeats on each side for a confidence interval (MEASUREMENT.md "Repeats").
MIN_REPEATS_FOR_CI = 3


@dataclass(frozen=True)
class SpeedupFigure:
    """One named speedup: the point figure (`field`, a WindowMetrics field) it divides, what
    that figure is called in a reason (`what`), and whether a higher value is faster (then
    ratio = configuration / baseline, else baseline / configuration)."""

    name: str
    title: str
    field: str
    what: str
    higher_is_faster: bool


#: Output tok/s ratio over the windows (MEASUREMENT.md: end-to-end speedup).
END_TO_END = SpeedupFigure("end_to_end", "end-to-end speedup", SPEED_FIELD, "output tok/s", True)
#: Median TPOT of the baseline / median TPOT of the configuration (MEASUREMENT.md: decode speedup).
DECODE = SpeedupFigure("decode", "decode speedup", "median_tpot_ms", "median TPOT", False)
SPEEDUP_FIGURES: dict[str, SpeedupFigure] = {f.name: f for f in (END_TO_END, DECODE)}
_E2E = END_TO_END.name


@dataclass
class Ratio:
    """One named speedup of a configuration at one match key: `value` (None: no number, with
    `reason` saying why), its 95 % bootstrap interval `ci95` (None unless both sides have
    MIN_REPEATS_FOR_CI known values), and the median of the figure on each side (its unit)."""

    value: float | None = None
    ci95: tuple[float, float] | None = None
    median: float | None = None
    baseline_median: float | None = None
    reason: str = ""


@dataclass
class Speedup:
    """The speedups of one configuration over its matched baseline at one match key.

    `point` is the configuration's first point at the key (its configuration and workload, for
    display and grouping: `sp.point.tp`); `key` its `match_key()`, `config` its `config_key()`,
    `label` its label. `ratios`: SpeedupFigure name -> Ratio, for each figure computed
    (`compute_speedups(figures=...)`). `baseline` is the baseline configuration's label (`auto`
    unless chosen) and `baseline_run_ids` the runs used (empty when none matched). `n_repeats`
    counts this configuration's runs at the key. `value`, `ci95`, `reason` and
    `median_output_throughput` are the end-to-end ratio's (the figure every page shows today).
    """

    label: str
    key: tuple
    config: tuple
    point: Point
    n_repeats: int
    run_ids: list[int]
    baseline_run_ids: list[int]
    baseline: str = AUTO
    ratios: dict[str, Ratio] = field(default_factory=dict)

    @property
    def end_to_end(self) -> Ratio:
        """The end-to-end ratio (output tok/s)."""
        return self.ratios[_E2E]

    # the end-to-end figure's parts, read thousands of times per page (one lookup each)
    @property
    def value(self) -> float | None:
        return self.ratios[_E2E].value

    @property
    def ci95(self) -> tuple[float, float] | None:
        return self.ratios[_E2E].ci95

    @property
    def reason(self) -> str:
        return self.ratios[_E2E].reason

    @property
    def median_output_throughput(self) -> float | None:
        """Median output tok/s of this configuration's runs at the key (None: unknown)."""
        return self.ratios[_E2E].median

    @property
    def spread(self) -> str:
        """How sure the end-to-end number is, in words: `95% CI 6.31-6.70, 5 repeats`,
        `single run`, or `2 repeats (median; CI needs 3)`."""
        if self.ci95:
            return f"95% CI {self.ci95[0]:.2f}-{self.ci95[1]:.2f}, {self.n_repeats} repeats"
        return ("single run" if self.n_repeats == 1
                else f"{self.n_repeats} repeats (median; CI needs {MIN_REPEATS_FOR_CI})")


def compute_speedups(points: Iterable[Point], baseline: str = AUTO, ci: bool = True,
                     figures: Sequence[SpeedupFigure] = (END_TO_END,)) -> list[Speedup]:
    """One Speedup per (match key, configuration), the baseline included (value 1.0 against
    itself), with a Ratio per SpeedupFigure in `figures` (the points must carry each one's
    field). `ci=False` skips the bootstrap intervals (pages that show only the medians, e.g. a
    trend over many nights).

    `baseline` is the label (`Point.label`) of the configuration every other one is divided by:
    `auto` by default, or any configuration present (e.g. `linear`). Where a match key has no
    point of it, every configuration there gets value None and the reason "no matching
    <baseline> baseline", followed, when a baseline point of the same TP and workload shape
    exists elsewhere, by what differs (e.g. "nearest auto run 7 differs in engine_build"). Where
    two configurations at one key share the baseline's label (two drafters), the baseline is
    ambiguous and no number is given. Points whose figure is unknown (None: an imported file
    without it) count for nothing; a configuration with none gets value None and the reason
    "<what> unknown" (e.g. "output tok/s unknown"); a zero denominator gives no number either.
    """
    points = list(points)
    groups: dict[tuple, dict[tuple, list[Point]]] = defaultdict(lambda: defaultdict(list))
    match, config = Point.match_key, Point.config_key
    for p in points:
        groups[match(p)][config(p)].append(p)
    getters = [(fig, attrgetter(fig.field)) for fig in figures]
    explain = _missing_baseline_explainer(points, baseline)
    out: list[Speedup] = []
    ci_wanted: list[tuple[Ratio, list[float], list[float]]] = []
    for key, configs in groups.items():
        base_cfgs = [cfg for cfg, ps in configs.items() if ps[0].label == baseline]
        base = configs[base_cfgs[0]] if len(base_cfgs) == 1 else []
        no_base = ""
        if len(base_cfgs) > 1:
            no_base = (f"ambiguous {baseline} baseline: {len(base_cfgs)} configurations labelled {baseline!r} at "
                       "this point (different drafters)")
        for cfg, ps in configs.items():
            sp = Speedup(label=ps[0].label, key=key, config=cfg, point=ps[0], n_repeats=len(ps),
                         run_ids=[p.run_id for p in ps], baseline_run_ids=[p.run_id for p in base], baseline=baseline)
            for fig, get in getters:
                mine = [v for v in map(get, ps) if v is not None]
                theirs = [v for v in map(get, base) if v is not None]
                r = sp.ratios[fig.name] = Ratio(median=median(mine), baseline_median=median(theirs))
                num, den = (mine, theirs) if fig.higher_is_faster else (theirs, mine)
                num_med, den_med = ((r.median, r.baseline_median) if fig.higher_is_faster
                                    else (r.baseline_median, r.median))
                if r.median is None:
                    r.reason = f"{fig.what} unknown"
                elif no_base:
                    r.reason = no_base
                elif not base:
                    r.reason = f"no matching {baseline} baseline" + explain(ps[0])
                elif r.baseline_median is None:
                    r.reason = f"{baseline} baseline {fig.what} unknown"
                elif den_med <= 0:
                    r.reason = f"{fig.what} of the {'baseline' if den is theirs else 'configuration'} is 0"
                else:
                    r.value = num_med / den_med
                    if ci and len(num) >= MIN_REPEATS_FOR_CI and len(den) >= MIN_REPEATS_FOR_CI:
                        ci_wanted.append((r, num, den))
            out.append(sp)
    if ci_wanted:
        cis = median_ratio_cis([num for _, num, _ in ci_wanted], [den for _, _, den in ci_wanted])
        for (r, _, _), (lo, hi) in zip(ci_wanted, cis.tolist(), strict=True):
            r.ci95 = (lo, hi)
    return out


def _missing_baseline_explainer(points: list[Point], baseline: str) -> Callable[[Point], str]:
    """A function point -> text naming the nearest baseline point of the same TP and workload
    shape (`Point.shape_key`) and the match fields it differs in, or "" when there is none."""
    near: dict[tuple, list[Point]] = defaultdict(list)
    for p in points:
        if p.label == baseline:
            near[p.shape_key()].append(p)

    def explain(p: Point) -> str:
        best: tuple[int, list[str]] | None = None
        for b in near.get(p.shape_key(), []):
            diff = [f for f in MATCH_FIELDS if getattr(b, f) != getattr(p, f)]
            if best is None or len(diff) < len(best[1]):
                best = (b.run_id, diff)
        if best is None:
            return ""
        return f" (nearest {baseline} run {best[0]} differs in {', '.join(best[1])})"

    return explain


def relative_step_costs(points: Iterable[Point], baseline: str = AUTO) -> dict[int, float | None]:
    """{run id: relative step cost} of each point: TPOT x tau / the median TPOT of the matched
    `baseline` runs (MEASUREMENT.md "Comparing runs": the cost of one decoding step relative to an
    autoregressive one; decode speedup = tau / relative step cost). tau is the server counters'
    acceptance length, else the client's mean tokens per chunk. None where tau, the TPOT or a
    matched baseline TPOT is unknown (the baseline's own runs: no tau). The points need
    `median_tpot_ms`, `acceptance_length` and `mean_tokens_per_chunk`."""
    points = list(points)
    base_tpot: dict[tuple, list[float]] = defaultdict(list)
    for p in points:
        if p.label == baseline and p.median_tpot_ms is not None:
            base_tpot[p.match_key()].append(p.median_tpot_ms)
    out: dict[int, float | None] = {}
    for p in points:
        tau = p.acceptance_length if p.acceptance_length is not None else p.mean_tokens_per_chunk
        ar = median(base_tpot.get(p.match_key(), ()))
        out[p.run_id] = p.median_tpot_ms * tau / ar if tau is not None and ar and p.median_tpot_ms is not None \
            else None
    return out


def best_by(speedups: Iterable[Speedup], group: Callable[[Speedup], Any]) -> dict[Any, Speedup]:
    """The fastest configuration of each group: {group(sp): the Speedup with the highest value}.

    Speedups without a number are never best. Configurations are ranked by speed, never by
    acceptance length (MEASUREMENT.md "Comparing runs"); ties keep the first one seen."""
    best: dict[Any, Speedup] = {}
    for sp in speedups:
        if sp.value is None:
            continue
        g = group(sp)
        if g not in best or sp.value > best[g].value:
            best[g] = sp
    return best


def inconsistent_gpu_tps(points: Iterable[Point]) -> list[int]:
    """TP degrees whose runs did not all use the same GPUs (DOMAIN.md: TP1 on GPU1 vs GPU0);
    see benchkit.hosts.allocation.inconsistent_tp_gpus."""
    return inconsistent_tp_gpus([(p.tp, p.gpu_uuids) for p in points])
