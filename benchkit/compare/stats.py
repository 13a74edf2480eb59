"""The statistics every comparison uses, one of each: the median of repeats and the 95 % bootstrap
interval of a ratio of two medians (MEASUREMENT.md "Repeats").

- `median(values)`: the middle known value, or the mean of the two middle ones (as np.median and
  statistics.median compute it); None values are unknown and skipped.
- `median_ratio_cis(nums, dens)`: for each pair i, the percentile-bootstrap interval of
  median(nums[i]) / median(dens[i]): each side resampled with replacement N_RESAMPLES times
  (independently, from a generator seeded with `seed`), the ratio of the resamples' medians,
  and its 2.5th and 97.5th percentiles by the inverted empirical CDF (numpy's
  `quantile(method="inverted_cdf")`: an interval's ends are ratios that occurred). Speedups
  (benchkit.compare.speedups) take it as is; a sweep comparison (benchkit.compare.sweepdiff)
  subtracts 1 for a change.

Speed: a sweep page asks for hundreds of intervals per request, a compare page for thousands.
Resampling n values with replacement and taking the median depends only on n once the values are
sorted: a resample is n drawn ranks, and its median is the value at one rank (two for an even
n). So pairs of equal sizes share their draws, which name only a few distinct (rank of num,
rank of den) combinations for the small repeat counts of benchmarks (9 for 3 vs 3 repeats):
the N ratios of a pair are those few values, each repeated as often as it was drawn, and the
percentiles are read off their cumulative counts. The result equals resampling each pair on
its own with the same draws and `np.quantile(..., method="inverted_cdf")` (tests check it).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence

import numpy as np

#: Bootstrap resamples per interval (every interval in draftboard).
N_RESAMPLES = 10_000
#: The interval's coverage and the percentiles that bound it.
CONFIDENCE = 0.95
_QUANTILES = (0.025, 0.975)  # (1 - CONFIDENCE) / 2 and its complement, written exactly


def median(values: Iterable[float | None]) -> float | None:
    """The median of the known values (None skipped) as a float: the middle one, or the mean of
    the two middle ones for an even count; None when no value is known. Plain Python: a page
    takes thousands of medians of a few repeats, where numpy's per-call cost dominates."""
    s = [v for v in values if v is not None]
    s.sort()
    n = len(s)
    if not n:
        return None
    return float(s[n // 2]) if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def median_ratio_cis(nums: Sequence[Sequence[float]], dens: Sequence[Sequence[float]],
                     n_resamples: int = N_RESAMPLES, seed: int = 0) -> np.ndarray:
    """95 % percentile-bootstrap intervals of median(nums[i]) / median(dens[i]) for every pair i
    (see the module docstring). Each side needs at least one value. A pair's interval depends
    only on its own values and the two sizes (not on the order of its values nor on the other
    pairs). Returns an array (len(nums), 2) of [lo, hi]; a ratio with a zero denominator is inf
    or nan (no warning). Raises ValueError when the two lists differ in length or a side is empty.
    """
    if len(nums) != len(dens):
        raise ValueError(f"{len(nums)} numerator samples but {len(dens)} denominator samples")
    out = np.full((len(nums), 2), np.nan)
    groups: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, (a, b) in enumerate(zip(nums, dens, strict=True)):
        if not len(a) or not len(b):
            raise ValueError(f"pair {i}: a bootstrap interval needs at least one value on each side")
        groups[(len(a), len(b))].append(i)
    for (na, nb), idx in groups.items():
        rng = np.random.default_rng(seed)
        ranks_a = _median_ranks(rng.integers(0, na, size=(n_resamples, na)))
        ranks_b = _median_ranks(rng.integers(0, nb, size=(n_resamples, nb)))
        a = np.sort(np.asarray([nums[i] for i in idx], float), axis=1)
        b = np.sort(np.asarray([dens[i] for i in idx], float), axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            # the draws name few distinct (ranks of num, ranks of den): each a value repeated `counts` times
            # (one integer per draw: the four ranks in mixed radix na, na, nb, nb)
            codes, counts = np.unique(((ranks_a[0] * na + ranks_a[1]) * nb + ranks_b[0]) * nb + ranks_b[1],
                                      return_counts=True)
            if len(codes) <= n_resamples // 4:
                rest, hi_b = np.divmod(codes, nb)
                rest, lo_b = np.divmod(rest, nb)
                lo_a, hi_a = np.divmod(rest, na)
                ratios = _medians(a, lo_a, hi_a) / _medians(b, lo_b, hi_b)
                out[idx] = _counted_quantiles(ratios, counts, n_resamples)
            else:
                ratios = _medians(a, *ranks_a) / _medians(b, *ranks_b)  # (pairs, n_resamples)
                out[idx] = np.quantile(ratios, _QUANTILES, axis=1, method="inverted_cdf").T
    return out


def _median_ranks(draws: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For resamples of a sorted sample (draws: (N, n) ranks), the ranks of each resample's lower
    and upper middle value ((N,) each; equal for an odd n)."""
    s = np.sort(draws, axis=1)
    n = draws.shape[1]
    return s[:, (n - 1) // 2], s[:, n // 2]


def _medians(ranked: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """(K, M) medians of K sorted samples (K, n) at M (lower, upper) rank pairs: the middle value,
    or the mean of the two middle values for an even n (as np.median)."""
    lo, hi = ranked[:, lower], ranked[:, upper]
    return hi if ranked.shape[1] % 2 else (lo + hi) / 2


def _counted_quantiles(values: np.ndarray, counts: np.ndarray, n: int) -> np.ndarray:
    """np.quantile(x, _QUANTILES, axis=1, method="inverted_cdf").T for the K rows x of n values
    given as distinct candidates `values` (K, C) each repeated `counts` (C,) times (summing to
    n), without materialising x: the position numpy reads (ceil(n q) - 1, its formula) is found
    on the cumulative counts. Returns (K, 2)."""
    order = np.argsort(values, axis=1, kind="stable")
    ordered = np.take_along_axis(values, order, axis=1)
    cum = np.cumsum(counts[order], axis=1)  # (K, C): sorted positions < cum[k, c] hold candidate c
    pos = np.asarray([min(max(math.ceil(n * q - 1), 0), n - 1) for q in _QUANTILES])
    at = (cum[:, :, None] <= pos[None, None, :]).sum(axis=1)  # (K, 2): candidate at each position
    return np.take_along_axis(ordered, at, axis=1)
