"""The one median and the one bootstrap of benchkit.compare.stats: equal to resampling each pair on
its own, in agreement with SciPy's bootstrap within the bootstrap's own noise, and honest about
coverage."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as scipy_stats

from benchkit.compare.stats import N_RESAMPLES, median, median_ratio_cis


def test_median_skips_unknown_values():
    assert median([3.0, None, 1.0, 2.0]) == 2.0
    assert median([4, 1, 3, 2]) == 2.5 and isinstance(median([1, 3]), float)
    assert median([None, None]) is None and median([]) is None


def _per_pair(num, den, n=N_RESAMPLES, seed=0):
    """The plain bootstrap the batched one must equal: each side's sorted values resampled with
    the same draws, np.median of each resample, the inverted-CDF percentiles of the ratios."""
    rng = np.random.default_rng(seed)
    a, b = np.sort(np.asarray(num, float)), np.sort(np.asarray(den, float))
    ra = np.median(a[rng.integers(0, a.size, size=(n, a.size))], axis=1)
    rb = np.median(b[rng.integers(0, b.size, size=(n, b.size))], axis=1)
    return np.quantile(ra / rb, [0.025, 0.975], method="inverted_cdf")


def test_batched_intervals_equal_the_per_pair_bootstrap():
    rng = np.random.default_rng(7)
    pairs = [(list(rng.uniform(1, 2, n)), list(rng.uniform(1, 2, m)))
             for n, m in [(3, 3), (5, 4), (6, 6), (3, 3), (7, 3), (1, 4), (2, 2), (12, 9), (20, 20)] * 4]
    pairs.append(([1.0, 1.0, 2.0], [2.0, 2.0, 2.0, 3.0]))  # ties
    nums, dens = [a for a, _ in pairs], [b for _, b in pairs]
    for n in (N_RESAMPLES, 999):  # the counted path and (20 vs 20 repeats) the materialised one
        assert (median_ratio_cis(nums, dens, n_resamples=n) == [_per_pair(a, b, n) for a, b in pairs]).all()
    # a pair's interval depends neither on the other pairs nor on the order of its values
    one = median_ratio_cis(nums[:1], dens[:1])[0]
    assert (one == median_ratio_cis([nums[0][::-1]], [dens[0]])[0]).all()
    assert (one == median_ratio_cis(nums, dens)[0]).all()


def test_intervals_agree_with_scipy_within_the_bootstrap_noise():
    """SciPy's percentile bootstrap of the same statistic (independent resampling of each side)
    lands on the same interval up to Monte-Carlo noise (1 % of the ratio here)."""
    rng = np.random.default_rng(11)
    for n_num, n_den in ((9, 9), (15, 11), (25, 25)):
        num, den = rng.normal(200, 10, n_num), rng.normal(100, 5, n_den)
        ours = median_ratio_cis([num], [den])[0]
        theirs = scipy_stats.bootstrap((num, den), lambda a, b, axis: np.median(a, axis) / np.median(b, axis),
                                       vectorized=True, paired=False, n_resamples=N_RESAMPLES,
                                       method="percentile", rng=np.random.default_rng(1)).confidence_interval
        assert ours == pytest.approx([theirs.low, theirs.high], rel=0.01)


def test_interval_covers_the_true_ratio():
    rng = np.random.default_rng(3)
    nums = [rng.normal(200, 10, 9) for _ in range(200)]
    dens = [rng.normal(100, 5, 9) for _ in range(200)]
    cover = sum(lo <= 2.0 <= hi for lo, hi in median_ratio_cis(nums, dens))
    assert 170 <= cover <= 200  # ~95 % nominal (the percentile bootstrap runs a little narrow at n = 9)


def test_identical_samples_give_a_point_and_bad_input_is_named():
    assert median_ratio_cis([[2, 2, 2]], [[1, 1, 1]]).tolist() == [[2.0, 2.0]]
    with pytest.raises(ValueError, match="pair 0: .* at least one value"):
        median_ratio_cis([[]], [[1.0]])
    with pytest.raises(ValueError, match="2 numerator samples but 1"):
        median_ratio_cis([[1.0], [2.0]], [[1.0]])
