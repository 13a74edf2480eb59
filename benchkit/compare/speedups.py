"""Speedup matching (MEASUREMENT.md "Comparing runs"), pure functions over point dicts.

A point is one succeeded run flattened into a dict (`runs.selectors.point_from_run` and
`runs.selectors.figure_points` do it for stored runs). Two points are comparable when they
differ in the decoding configuration only: same engine and engine version/build, model, GPUs
(by UUID; falling back to GPU model + TP is NOT done here: within one sweep the GPUs are planned
per TP), TP, and workload (dataset, input and output length, concurrency, request rate,
temperature, seed). The baseline is the `auto` point(s) of that match, or the points of another
configuration the caller names by its label (e.g. `linear`: DDTree against linear DFlash, as the
users report it). Repeats are aggregated by their median; with >= 3 repeats on both sides a 95 %
bootstrap confidence interval of the ratio of medians is given. No baseline -> no number (None)
and a reason that names what is missing, never a guess.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import numpy as np
from numpy.lib._function_base_impl import _lerp  # np.percentile's interpolation: identical figures

from benchkit.hosts.allocation import inconsistent_tp_gpus

#: What must be equal for two points to be compared. `host_id` (the host the run ran on) keeps a
#: sweep over several hosts from pairing runs of different machines where the GPU UUIDs cannot
#: (hosts without GPUs); a point without it (a hand-made dict) counts as host None.
MATCH_FIELDS = ("host_id", "engine", "engine_version", "engine_build", "model", "gpu_uuids", "tp", "dataset",
                "input_len", "output_len", "concurrency", "request_rate", "temperature", "seed")
CONFIG_FIELDS = ("method", "num_speculative_tokens", "tree_budget", "drafter")
#: The figure a speedup divides (MEASUREMENT.md "Comparing runs": output tok/s ratio), a
#: benchkit.measure.metrics.WindowMetrics field.
SPEED_FIELD = "output_throughput_tok_s"
#: The default baseline: autoregressive decoding (benchkit.methods: label `auto`).
AUTO = "auto"
#: Fields a missing baseline is looked for along when explaining why none matched (the grid's
#: own axes); the other MATCH_FIELDS are then compared to name the difference.
_NEAR_FIELDS = ("tp", "input_len", "output_len", "concurrency")
#: Bootstrap resamples per confidence interval.
N_BOOT = 2000


def median(values: Sequence[float]) -> float:
    """The median of a non-empty sequence, as np.median computes it (the mean of the two middle
    values for an even length), without numpy's per-call overhead (a sweep takes thousands)."""
    s = sorted(values)
    n = len(s)
    return float(s[n // 2]) if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


_match_rest = itemgetter(*MATCH_FIELDS[1:])  # after host_id, which a hand-made point may lack
_MATCH_INDEX = {f: i for i, f in enumerate(MATCH_FIELDS)}
_config_getter = itemgetter(*CONFIG_FIELDS)


def match_key(p: dict[str, Any]) -> tuple:
    """What must be equal for two points to be compared (everything but the method)."""
    return (p.get("host_id"), *_match_rest(p))


def config_key(p: dict[str, Any]) -> tuple:
    """The decoding configuration of a point."""
    return _config_getter(p)


@dataclass
class Speedup:
    """Speedup of one configuration over its matched baseline at one match key.

    `value` = median output tok/s of the configuration / median output tok/s of the baseline
    (for concurrency 1 this equals the TPOT ratio up to TTFT); None when there is no number,
    with `reason` saying why. `ci95` is the 95 % bootstrap interval (None unless both sides have
    >= 3 repeats). `baseline` is the baseline configuration's label (`auto` unless chosen) and
    `baseline_run_ids` the runs used (empty when none matched). `n_repeats` counts this
    configuration's runs at the key, `median_output_throughput` their median output tok/s.
    """

    label: str
    key: tuple
    config: tuple
    value: float | None
    ci95: tuple[float, float] | None
    n_repeats: int
    baseline_run_ids: list[int]
    run_ids: list[int]
    median_output_throughput: float | None
    reason: str = ""
    baseline: str = AUTO

    def field(self, name: str) -> Any:
        """The value of match field `name` (one of MATCH_FIELDS) at this speedup's key."""
        return self.key[_MATCH_INDEX[name]]

    @property
    def spread(self) -> str:
        """How sure the number is, in words: `95% CI 6.31-6.70, 5 repeats`, `single run`, or
        `2 repeats (median; CI needs 3)`."""
        if self.ci95:
            return f"95% CI {self.ci95[0]:.2f}-{self.ci95[1]:.2f}, {self.n_repeats} repeats"
        return "single run" if self.n_repeats == 1 else f"{self.n_repeats} repeats (median; CI needs 3)"


def bootstrap_ratio_cis(pairs: Sequence[tuple[Sequence[float], Sequence[float]]], n_boot: int = N_BOOT,
                        seed: int = 0) -> list[tuple[float, float]]:
    """95 % percentile-bootstrap interval of median(num) / median(den) for each (num, den) pair.

    Each side is resampled with replacement `n_boot` times: n indices drawn uniformly with
    replacement, from a generator seeded with `seed`, into the side's values sorted ascending
    (a fixed relabelling of a sample leaves uniform draws uniform, so this is the ordinary
    bootstrap). A pair's interval therefore depends only on its own values and sizes; pairs of
    equal sizes share the draws, and then each resample's median is one order statistic (two
    for an even size) that is found once for all of them (`_median_ranks`): a sweep of hundreds
    of cells costs a few vector operations. Returns (lo, hi) per pair, in order.
    """
    out: list[tuple[float, float] | None] = [None] * len(pairs)
    by_shape: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, (num, den) in enumerate(pairs):
        by_shape[(len(num), len(den))].append(i)
    for (na, nb), idx in by_shape.items():
        rng = np.random.default_rng(seed)
        ranks_a = _median_ranks(rng.integers(0, na, size=(n_boot, na)))
        ranks_b = _median_ranks(rng.integers(0, nb, size=(n_boot, nb)))
        a = np.sort(np.asarray([pairs[i][0] for i in idx], float), axis=1)
        b = np.sort(np.asarray([pairs[i][1] for i in idx], float), axis=1)
        # the n_boot draws name few distinct (rank of a, rank of b) combinations (9 for 3 vs 3
        # repeats): the ratios of a pair are those few values, each repeated `counts` times
        combos, counts = np.unique(np.stack([*ranks_a, *ranks_b], axis=1), axis=0, return_counts=True)
        if len(combos) <= n_boot // 4 and np.isfinite(a).all() and np.isfinite(b).all() and (b > 0).all():
            ratios = (_medians(a, (combos[:, 0], combos[:, 1])) /
                      _medians(b, (combos[:, 2], combos[:, 3])))  # (pairs, combinations)
            lo, hi = _weighted_percentiles(ratios, counts, n_boot)
        else:
            ratios = _medians(a, ranks_a) / _medians(b, ranks_b)  # (pairs, n_boot)
            lo, hi = np.percentile(ratios, [2.5, 97.5], axis=1)
        for j, i in enumerate(idx):
            out[i] = (float(lo[j]), float(hi[j]))
    return out  # type: ignore[return-value]


#: The percentiles of a bootstrap interval, as np.percentile takes them.
_CI_QUANTILES = np.true_divide(np.asarray([2.5, 97.5]), 100)


def _weighted_percentiles(values: np.ndarray, counts: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """np.percentile(..., [2.5, 97.5], axis=1) (its default linear method) of K rows of n values
    given as each row's distinct candidates `values` (K, C) repeated `counts` (C,) times
    (counts sum to n), without materialising the n values: the order statistics the linear
    interpolation reads are found on the cumulative counts. Equal to np.percentile bit for bit
    (the same order statistics, numpy's own interpolation formula)."""
    order = np.argsort(values, axis=1, kind="stable")
    sorted_vals = np.take_along_axis(values, order, axis=1)
    cum = np.cumsum(counts[order], axis=1)  # (K, C): values at sorted positions < cum[k, c]
    virtual = (n - 1) * _CI_QUANTILES
    prev = np.floor(virtual)
    gamma = virtual - prev
    rows = np.arange(values.shape[0])[:, None]
    pos = np.stack([prev, np.minimum(prev + 1, n - 1)], axis=1).astype(np.intp).ravel()  # (4,)
    at = (cum[:, :, None] <= pos[None, None, :]).sum(axis=1)  # (K, 4): column holding each position
    picked = sorted_vals[rows, at].reshape(-1, 2, 2)  # (K, quantile, lower/upper)
    res = _lerp(picked[:, :, 0], picked[:, :, 1], gamma[None, :])
    return res[:, 0], res[:, 1]


def _median_ranks(draws: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For resamples of a sorted sample (draws: (n_boot, n) indices = ranks), the ranks of each
    resample's lower and upper middle element ((n_boot,) each; equal for an odd n): sorting the
    drawn ranks puts them at positions (n - 1) // 2 and n // 2."""
    s = np.sort(draws, axis=1)
    n = draws.shape[1]
    return s[:, (n - 1) // 2], s[:, n // 2]


def _medians(ranked: np.ndarray, ranks: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """(K, n_boot) medians of the resamples of K sorted samples (K, n), as np.median takes them:
    the middle value, or the mean of the two middle values for an even n."""
    lower, upper = ranked[:, ranks[0]], ranked[:, ranks[1]]
    return upper if ranked.shape[1] % 2 else (lower + upper) / 2


def bootstrap_ratio_ci(num: list[float], den: list[float], n_boot: int = N_BOOT, seed: int = 0) -> tuple[float, float]:
    """95 % percentile-bootstrap interval of median(num) / median(den) (see bootstrap_ratio_cis)."""
    return bootstrap_ratio_cis([(num, den)], n_boot, seed)[0]


def compute_speedups(points: list[dict[str, Any]], baseline: str = AUTO, ci: bool = True) -> list[Speedup]:
    """One Speedup per (match key, configuration), the baseline included (value 1.0 against itself).
    `ci=False` skips the bootstrap intervals (pages that show only the medians, e.g. a trend
    over many nights).

    `baseline` is the label (point field `label`, benchkit.methods.method_label) of the
    configuration every other one is divided by: `auto` by default, or any configuration present
    (e.g. `linear`). Where a match key has no point of it, every configuration there gets value
    None and the reason "no matching <baseline> baseline", followed, when a baseline point of the
    same TP and workload shape exists elsewhere, by what differs (e.g. "nearest: run 7, differs in
    engine_build"). Where two configurations at one key share the baseline's label (two drafters),
    the baseline is ambiguous and no number is given. Points whose output tok/s is unknown (None:
    an imported file without it) count for nothing; a configuration with none gets value None and
    reason "output tok/s unknown".
    """
    groups: dict[tuple, dict[tuple, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for p in points:
        groups[match_key(p)][config_key(p)].append(p)
    explain = _missing_baseline_explainer(points, baseline)
    out: list[Speedup] = []
    ci_wanted: list[tuple[Speedup, list[float], list[float]]] = []
    for key, configs in groups.items():
        base_cfgs = [cfg for cfg, ps in configs.items() if ps[0]["label"] == baseline]
        base = configs[base_cfgs[0]] if len(base_cfgs) == 1 else []
        base_tps = [p[SPEED_FIELD] for p in base if p[SPEED_FIELD] is not None]
        base_med = median(base_tps) if base_tps else None
        for cfg, ps in configs.items():
            tps = [p[SPEED_FIELD] for p in ps if p[SPEED_FIELD] is not None]
            med = median(tps) if tps else None
            sp = Speedup(label=ps[0]["label"], key=key, config=cfg, value=None, ci95=None, n_repeats=len(ps),
                         baseline_run_ids=[p["run_id"] for p in base], run_ids=[p["run_id"] for p in ps],
                         median_output_throughput=med, baseline=baseline)
            if med is None:
                sp.reason = "output tok/s unknown"
            elif len(base_cfgs) > 1:
                sp.reason = (f"ambiguous {baseline} baseline: {len(base_cfgs)} configurations labelled "
                             f"{baseline!r} at this point (different drafters)")
            elif not base:
                sp.reason = f"no matching {baseline} baseline" + explain(ps[0])
            elif base_med is None or base_med <= 0:
                sp.reason = f"{baseline} baseline output tok/s unknown"
            else:
                sp.value = med / base_med
                if ci and len(tps) >= 3 and len(base_tps) >= 3:
                    ci_wanted.append((sp, tps, base_tps))
            out.append(sp)
    for (sp, _, _), interval in zip(ci_wanted, bootstrap_ratio_cis([(a, b) for _, a, b in ci_wanted]), strict=True):
        sp.ci95 = interval
    return out


def _missing_baseline_explainer(points: list[dict[str, Any]], baseline: str) -> Callable[[dict], str]:
    """A function point -> text naming the nearest baseline point of the same TP and workload
    shape (`_NEAR_FIELDS`) and the match fields it differs in, or "" when there is none."""
    near: dict[tuple, list[dict]] = defaultdict(list)
    for p in points:
        if p["label"] == baseline:
            near[tuple(p[f] for f in _NEAR_FIELDS)].append(p)

    def explain(p: dict[str, Any]) -> str:
        best: tuple[int, list[str], int] | None = None
        for b in near.get(tuple(p[f] for f in _NEAR_FIELDS), []):
            diff = [f for f in MATCH_FIELDS if b.get(f) != p.get(f)]
            if best is None or len(diff) < len(best[1]):
                best = (b["run_id"], diff, 0)
        if best is None:
            return ""
        return f" (nearest {baseline} run {best[0]} differs in {', '.join(best[1])})"

    return explain


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


def inconsistent_gpu_tps(points: list[dict[str, Any]]) -> list[int]:
    """TP degrees whose runs did not all use the same GPUs (DOMAIN.md: TP1 on GPU1 vs GPU0);
    see benchkit.hosts.allocation.inconsistent_tp_gpus."""
    return inconsistent_tp_gpus([(p["tp"], list(p["gpu_uuids"])) for p in points])
