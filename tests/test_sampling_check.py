"""The T > 0 lossless check (benchkit.compare.sampling, issue 33), Django-free: the simulator's
samplers against their known targets, the permutation test's statistic against scipy's Pearson
chi-square, the verdicts at the recommended sizes (fixed seeds), the power rule's "need N", and
the input errors."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chi2_contingency

from benchkit.compare import sampling as sp

PROMPTS, SAMPLES = sp.RECOMMENDED_PROMPTS, sp.RECOMMENDED_SAMPLES


def runs(sampler: str, prompts: int = PROMPTS, samples: int = SAMPLES, seed: int = 7):
    """(ar, floor, spec) of `prompts` known bigram targets, `samples` outputs each, own seeds."""
    models = sp.prompt_models(prompts, seed=seed)
    return (sp.simulate_run(models, "ar", samples, seed=10 * seed + 1),
            sp.simulate_run(models, "ar", samples, seed=10 * seed + 2),
            sp.simulate_run(models, sampler, samples, seed=10 * seed + 3))


# -- the simulator ----------------------------------------------------------------------------------

def exact_marginal(model: sp.BigramModel, position: int) -> np.ndarray:
    m = model.target[model.start]
    for _ in range(position):
        m = m @ model.target
    return m


@pytest.mark.parametrize("sampler,lossless", [("ar", True), ("speculative", True), ("greedy_draft", False),
                                              ("argmax_match", False)])
def test_samplers_against_the_known_target(sampler, lossless):
    """Marginals at positions 1..3 of 20 000 samples: within 4 standard errors of the chain's
    exact marginal for the lossless samplers; some token off by more than 0.03 for the biased."""
    model = sp.BigramModel.random(3)
    x = sp.simulate(model, sampler, 20_000, 4, np.random.default_rng(0))
    assert x.shape == (20_000, 4) and x.min() >= 0 and x.max() < 8
    worst = 0.0
    for t in (1, 2, 3):
        p = exact_marginal(model, t)
        f = np.bincount(x[:, t], minlength=8) / len(x)
        se = np.sqrt(p * (1 - p) / len(x)) + 1e-9
        if lossless:
            assert np.all(np.abs(f - p) < 4 * se + 1e-3), (t, f, p)
        worst = max(worst, float(np.abs(f - p).max()))
    if not lossless:
        assert worst > 0.03
    # token 0 is the target's prefill sample for every sampler
    p0 = model.target[model.start]
    assert np.abs(np.bincount(x[:, 0], minlength=8) / len(x) - p0).max() < 0.015


def test_simulate_refuses_an_unknown_sampler():
    with pytest.raises(ValueError, match="sampler"):
        sp.simulate(sp.BigramModel.random(0), "typical", 4, 4, np.random.default_rng(0))


# -- the statistic ----------------------------------------------------------------------------------

def test_statistic_is_pearsons_chi_square_per_table():
    """One prompt, one position: T equals scipy's Pearson X^2 of the collapsed 2 x C table."""
    rng = np.random.default_rng(1)
    a = [[0, int(t)] for t in rng.integers(0, 3, 60)]
    b = [[0, int(t)] for t in rng.choice(3, 40, p=[0.6, 0.3, 0.1])]
    r = sp.two_sample({"x": a}, {"x": b}, positions=[1])
    table = np.array([np.bincount([s[1] for s in a], minlength=3), np.bincount([s[1] for s in b], minlength=3)])
    x2 = chi2_contingency(table, correction=False)[0]
    assert r.statistic == pytest.approx(x2)
    assert r.df == 2 and r.tables == 1 and r.sizes == ((60, 40),)
    assert 0 < r.p_value <= 1


def test_identical_runs_give_p_one_and_the_p_value_is_never_zero():
    x = {"a": [[1, 2, 3]] * 10 + [[1, 4, 3]] * 10}
    assert sp.two_sample(x, x, positions=[1, 2]).p_value == 1.0
    y = {"a": [[1, 5, 3]] * 20}
    r = sp.two_sample(y, x, positions=[1, 2], permutations=99)
    assert r.p_value == pytest.approx(1 / 100)  # (1 + 0) / (B + 1): the observed split is the extreme one


def test_permutation_seed_fixes_the_result():
    ar, floor, spec = runs("speculative", prompts=4, samples=20)
    assert sp.two_sample(spec, ar, seed=3) == sp.two_sample(spec, ar, seed=3)


# -- verdicts ---------------------------------------------------------------------------------------

def test_correct_speculative_sampling_is_preserved_at_the_recommended_size():
    ar, floor, spec = runs("speculative")
    v = sp.check_sampling(ar, spec, floor)
    assert v.verdict == sp.PRESERVED, v.sentence
    assert v.sentence.startswith("distribution preserved")
    assert v.p_value >= 0.05 and v.floor_p_value >= 0.05
    assert v.power >= 0.8 and v.need is None and not v.marked
    assert v.prompts == PROMPTS and v.samples == (SAMPLES, SAMPLES) and v.positions == sp.DEFAULT_POSITIONS


@pytest.mark.parametrize("sampler", ["greedy_draft", "argmax_match"])
def test_each_bias_is_detected_at_the_recommended_size(sampler):
    ar, floor, spec = runs(sampler)
    v = sp.check_sampling(ar, spec, floor)
    assert v.verdict == sp.DIFFERS, v.sentence
    assert v.p_value < 0.05 and v.marked
    assert v.sentence.startswith(f"distribution differs (p={v.p_value:.3g}, where: prompt ")
    w = v.where[0]
    assert w.prompt in ar and w.position in sp.DEFAULT_POSITIONS and w.p_value < 1e-3
    assert f"position {w.position}" in v.sentence and abs(w.share - w.reference_share) > 0.1


def test_bias_is_detected_without_a_floor_too():
    ar, _, spec = runs("greedy_draft", prompts=8, samples=40)
    v = sp.check_sampling(ar, spec)
    assert v.verdict == sp.DIFFERS and v.floor_p_value is None


def test_tiny_sample_is_not_enough_and_says_how_many():
    ar, floor, spec = runs("speculative", prompts=4, samples=5)
    v = sp.check_sampling(ar, spec, floor)
    need = sp.samples_needed(4, len(sp.DEFAULT_POSITIONS))
    assert v.verdict == sp.NOT_ENOUGH, v.sentence
    assert v.need == need and need > 5
    assert v.sentence.startswith(f"not enough samples (need {need} per prompt and run")
    assert v.power < 0.8 and v.marked


def test_power_rule():
    pos = len(sp.DEFAULT_POSITIONS)
    need = sp.samples_needed(PROMPTS, pos)
    assert sp.power([(need, need)] * PROMPTS, pos) >= sp.POWER > sp.power([(need - 1, need - 1)] * PROMPTS, pos)
    assert need <= SAMPLES  # the recommended size has the power it claims
    assert sp.samples_needed(8, pos) > sp.samples_needed(32, pos)  # more prompts, fewer samples each
    assert sp.power([(50, 50)] * 8, pos, effect=0.3) > sp.power([(50, 50)] * 8, pos, effect=0.1)


def test_floor_that_differs_from_ar_means_not_checked():
    """A 'floor' from another sampler: AR vs AR rejects, so the spec run is not judged."""
    ar, _, spec = runs("speculative", prompts=8, samples=60)
    _, _, biased = runs("argmax_match", prompts=8, samples=60)
    v = sp.check_sampling(ar, spec, biased)
    assert v.verdict == sp.FLOOR_DIFFERS, v.sentence
    assert v.p_value is None and v.floor_p_value < 0.05
    assert v.sentence.startswith("not checked: AR differs from AR") and "the AR run" in v.sentence


def test_shorter_outputs_count_as_end_of_output():
    ar, _, _ = runs("ar", prompts=6, samples=60)
    cut = {k: [s[:3] for s in seqs] for k, seqs in ar.items()}
    _, floor, _ = runs("ar", prompts=6, samples=60)
    v = sp.check_sampling(floor, cut)
    assert v.verdict == sp.DIFFERS
    assert v.where[0].token == sp.END and v.where[0].share == 1.0 and "end of output" in v.sentence


# -- input errors -----------------------------------------------------------------------------------

GOOD = {"a": [[1, 2, 3]] * 4, "b": [[1, 2]] * 4}


@pytest.mark.parametrize("ar,spec,floor,kw,match", [
    ({}, GOOD, None, {}, "ar: no prompts"),
    (GOOD, {}, None, {}, "spec: no prompts"),
    (GOOD, {"a": GOOD["a"], "c": GOOD["b"]}, None, {},
     r"prompts differ between spec and ar: only in spec: 'c'; only in ar: 'b'"),
    (GOOD, GOOD, {"a": GOOD["a"]}, {}, r"prompts differ between floor and ar: only in ar: 'b'"),
    (GOOD, {"a": GOOD["a"], "b": []}, None, {}, r"spec\['b'\]: no samples"),
    (GOOD, {"a": GOOD["a"], "b": "12"}, None, {}, r"spec\['b'\]: expected a sequence"),
    (GOOD, {"a": GOOD["a"], "b": [[1, -2]]}, None, {}, r"spec\['b'\] sample 0: negative token id -2"),
    (GOOD, {"a": GOOD["a"], "b": [[1.5, 2]]}, None, {}, r"spec\['b'\] sample 0: token ids must be"),
    (GOOD, {"a": GOOD["a"], "b": ["ab"]}, None, {}, r"spec\['b'\] sample 0: expected token ids"),
    ([1, 2], GOOD, None, {}, "ar: expected a mapping"),
    (GOOD, GOOD, None, {"positions": []}, "positions: none given"),
    (GOOD, GOOD, None, {"positions": [1, 1]}, "positions: a position is given twice"),
    (GOOD, GOOD, None, {"positions": [-1]}, "positions: negative"),
    (GOOD, GOOD, None, {"alpha": 1.5}, "alpha"),
    (GOOD, GOOD, None, {"effect": 0}, "effect"),
])
def test_bad_input_raises_naming_what_is_wrong(ar, spec, floor, kw, match):
    with pytest.raises(ValueError, match=match):
        sp.check_sampling(ar, spec, floor, **kw)


def test_good_input_of_the_error_cases_is_accepted():
    """The error cases' baseline input itself is fine (so each case fails for its own reason)."""
    v = sp.check_sampling(GOOD, GOOD, GOOD)
    assert v.verdict == sp.NOT_ENOUGH and v.p_value == 1.0
