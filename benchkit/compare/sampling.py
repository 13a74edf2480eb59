"""The lossless check at temperature > 0 (issue 33; docs/LOSSLESS.md, "Sampling (T > 0)"):
a two-sample test that a speculative configuration's outputs are draws from the target's own
sampling distribution, i.e. from what autoregressive (AR) decoding samples. Pure functions over
token id sequences; Django-free; numpy and scipy only.

Input: per prompt, N seeded samples (token id sequences, one output each) of the AR run and M of
the speculative run at the same temperature (and the same prompts); optionally N' of a second AR
run with other seeds (the AR floor).

- **Null hypothesis** (lossless): for each prompt, the spec run's samples and the AR run's are
  independent draws from one distribution over output sequences. Then every function of a
  sequence has the same distribution in both runs, in particular the token at output position t
  (its marginal), whatever happened before t. The per-position marginals are therefore a valid
  statistic without conditioning on an identical prefix (conditioning would keep only the samples
  that agree up to t - 1, a share that falls geometrically with t); what the marginals of one
  sequence do NOT give is independence between positions, which the permutation below keeps.
- **Positions**: `DEFAULT_POSITIONS` = output tokens 1..8 (0-based). Token 0 is left out: every
  speculative method drafts from the target's prefill, so the first output token is the target's
  own sample in a buggy configuration as well (vLLM, SGLang: the prefill samples it), and counting
  it only adds degrees of freedom without signal. Eight positions span two to eight
  verification steps (1 to k + 1 tokens each; k = 4 drafts: 2 to 8 steps), where every draft bug shows; later
  positions add little (their marginals mix over more contexts) and cost output tokens: a check
  run needs max_tokens = 9 only.
- **Tables**: per (prompt, position), the 2 x C table of the two runs' token counts. The C - 1
  tokens with the largest pooled count (ties: smaller id) keep a column each, every other token
  shares one "other" column (an ended output, shorter than the position, counts as token END =
  -1). Pooled counts do not change under the permutation, so the collapse keeps the test exact;
  it bounds the degrees of freedom (a model's long tail of rare tokens would dilute the
  statistic) and keeps the chi-square approximation of the power formula usable.
- **Statistic**: T = the sum over prompts and positions of Pearson's chi-square of each table,
  X^2 = n^2 / (n1 n2) * sum_k (a_k - n1 n_k / n)^2 / n_k (a_k the spec count of column k, n_k the
  pooled count, n1 + n2 = n; Agresti, Categorical Data Analysis, 3rd ed., 3.2.1).
- **p-value**: permutation over whole sequences (Good, Permutation Tests, 2nd ed., 3.1): within
  each prompt the 2N run labels are exchangeable under the null, so relabelling whole sequences
  (which keeps the dependence between a sequence's positions, and between prompts none is
  assumed) gives T's null distribution; p = (1 + #{T_b >= T}) / (B + 1) over B = 999 random
  relabellings (Phipson & Smyth 2010: never 0, a valid p-value). Level alpha = 0.05 exactly, at
  any sample size, vocabulary or sparsity; no chi-square approximation is used for the p-value.
- **Where**: per table, Pearson's asymptotic p (chi2.sf(X^2, df)); the smallest name the prompt,
  the position and the token whose share moved most (`Where`).
- **Power** (`power`): against a stated effect: on every checked (prompt, position) table the
  two token distributions differ by a chi-square distance d^2 = sum_k (s_k - a_k)^2 / m_k =
  EFFECT ** 2 (s, a: the spec and AR column shares, m = (s + a) / 2 the mixture; EFFECT = 0.10 is a
  5-point shift of a 50 % token, d = 2 |delta| for a two-column table; the simulated bugs below
  move d by 0.2 .. 1.0 per table). T is then approximately
  noncentral chi-square with df = G (C - 1) (G tables; the upper bound of the observed df, so
  conservative) and noncentrality lambda = d^2 sum_tables n1 n2 / n (Cohen 1988, 7.2; the
  two-sample form of Pearson's noncentrality), and power = P(ncx2(df, lambda) > chi2.isf(alpha,
  df)). The tables of one prompt are dependent, so this is an approximation; benchmarks/
  sampling_power.py measures the real rates.
- **Floor**: a second AR run with other seeds. AR vs AR is tested first with the same test (it
  rejects in alpha of cases when the check is calibrated: same prompts, independent seeds, and a
  sampling distribution that does not move with the batch); when it rejects, the AR reference is
  itself not one distribution (batch-variant numerics at T > 0, seeds not independent, prompts
  differing) and the spec run is not judged (FLOOR_DIFFERS).

Verdicts (`SamplingVerdict.verdict`): PRESERVED ("distribution preserved": not rejected, power >=
POWER), DIFFERS ("distribution differs (p=..., where: ...)"), NOT_ENOUGH ("not enough samples
(need N per prompt)": not rejected, power < POWER), FLOOR_DIFFERS (AR differs from AR).

The simulator (`BigramModel`, `simulate`, SAMPLERS) draws seeded samples from a known target: a
small-vocabulary bigram p(token | previous token) per prompt and a draft q near it, decoded
autoregressively ("ar") or speculatively with k drafts per step by one of three samplers:

- "speculative": speculative sampling (Leviathan, Kalman & Matias 2023, "Fast Inference from
  Transformers via Speculative Decoding", Algorithm 1; Chen et al. 2023): drafts y ~ q, accept
  y with probability min(1, p(y) / q(y)), on rejection sample from norm(max(0, p - q)), after k
  accepted drafts a bonus token from p. Lossless: its outputs are distributed as p.
- "greedy_draft": the draft proposes argmax q (greedy drafter) but verification runs as if y were
  sampled from q (accept with min(1, p(y) / q(y)), resample from norm(max(0, p - q))):
  z-lab/dflash#74. Biased: a deterministic proposal is not q, so the rejection step corrects a
  distribution that was never drawn; the output puts mass min(1, p(y*)/q(y*)) + ... on y* and
  too little elsewhere.
- "argmax_match": drafts y ~ q, a draft is accepted iff it equals the target's argmax at that
  position (the T = 0 acceptance rule left on at T > 0), else the target's sample x ~ p is taken
  and the step ends. Biased toward the mode: P(argmax) = q(m) + (1 - q(m)) p(m) > p(m).
  The rule of mlx-swift-lm#459 as first reported (accept iff the target's own sample x ~ p equals
  the draft, else keep x) is NOT biased and is not simulated as a failure: every output token is
  then the target's sample in the correct context (a draft is kept only where it equals that
  sample), so the outputs are distributed as p; only the acceptance rate is lower.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.stats import chi2, ncx2

#: Verdict codes.
PRESERVED, DIFFERS, NOT_ENOUGH, FLOOR_DIFFERS = "preserved", "differs", "not_enough", "floor_differs"
VERDICTS = (PRESERVED, DIFFERS, NOT_ENOUGH, FLOOR_DIFFERS)
#: The level of the test (false-alarm rate of a lossless configuration).
ALPHA = 0.05
#: The effect the check must see before it says "preserved": chi-square distance d between the
#: two token distributions at every checked (prompt, position) table (module docstring).
EFFECT = 0.10
#: ... with at least this probability.
POWER = 0.80
#: Output positions compared (0-based token index): 1..8 (module docstring: token 0 is the
#: target's prefill sample).
DEFAULT_POSITIONS = tuple(range(1, 9))
#: Columns per table: the C - 1 most frequent tokens (pooled) and "other".
CATEGORIES = 5
#: Random relabellings of the permutation test.
PERMUTATIONS = 999
#: The token an output shorter than a position has there.
END = -1
#: `samples_needed` looks no further than this many samples per prompt and run.
NEED_MAX = 100_000
#: The sizes docs/LOSSLESS.md recommends: 32 prompts x 100 samples per prompt and run (power 0.85
#: against EFFECT; samples_needed(32, 8) = 93; benchmarks/sampling_power.py).
RECOMMENDED_PROMPTS, RECOMMENDED_SAMPLES = 32, 100
#: At most this many tables are named in `SamplingVerdict.where`.
NAMED_TABLES = 3

PromptKey = Hashable
Samples = Mapping[PromptKey, Sequence[Sequence[int]]]


@dataclass(frozen=True)
class Where:
    """One (prompt, position) table that moved: `prompt` (the input's key), `position` (0-based
    output token), `token` (the column whose share moved most; END for ended outputs, None for
    the "other" column), its share in the tested run (`share`) and in the reference
    (`reference_share`), both 0..1, and the table's own asymptotic Pearson p (`p_value`)."""

    prompt: PromptKey
    position: int
    token: int | None
    share: float
    reference_share: float
    p_value: float

    def words(self, reference: str = "AR") -> str:
        tok = "other tokens" if self.token is None else "end of output" if self.token == END else f"token {self.token}"
        return (f"prompt {self.prompt!r} position {self.position}: {tok} {self.share:.0%} vs "
                f"{self.reference_share:.0%} in {reference} (table p={self.p_value:.2g})")


@dataclass(frozen=True)
class TwoSample:
    """The permutation test of one pair of runs (`two_sample`): `statistic` T (sum of the tables'
    Pearson X^2), `p_value` (permutation), `df` (sum of the tables' (columns - 1)), `tables` (G,
    tables with at least one column), `sizes` ((n1, n2) per prompt: tested and reference samples),
    `where` (the tables with the smallest asymptotic p, at most NAMED_TABLES)."""

    statistic: float
    p_value: float
    df: int
    tables: int
    sizes: tuple[tuple[int, int], ...]
    where: tuple[Where, ...]


@dataclass(frozen=True)
class SamplingVerdict:
    """The T > 0 lossless verdict of one speculative configuration (`check_sampling`).

    `verdict`: one of VERDICTS; `sentence`: what a page prints; `p_value`: the permutation p of
    spec vs AR (None when the floor differs and the spec run was not tested); `where`: the tables
    that moved most (Where; of the floor test under FLOOR_DIFFERS); `power`: `power` at this size
    against `effect`; `need`: samples per prompt and run for power >= POWER (None: enough, or not
    within NEED_MAX); `floor_p_value`: AR vs floor's p (None: no floor); `prompts`, `positions`,
    `samples` ((AR, spec) samples, the smallest per prompt), `effect`, `alpha` as used."""

    verdict: str
    sentence: str
    p_value: float | None
    where: tuple[Where, ...]
    power: float
    need: int | None
    floor_p_value: float | None = None
    prompts: int = 0
    positions: tuple[int, ...] = ()
    samples: tuple[int, int] = (0, 0)
    effect: float = EFFECT
    alpha: float = ALPHA
    spec_test: TwoSample | None = field(default=None, compare=False, repr=False)
    floor_test: TwoSample | None = field(default=None, compare=False, repr=False)

    @property
    def marked(self) -> bool:
        """True when the configuration is not shown lossless (anything but PRESERVED)."""
        return self.verdict != PRESERVED


# -- input ----------------------------------------------------------------------------------------

def _matrix(name: str, key: PromptKey, seqs: Sequence[Sequence[int]], positions: tuple[int, ...]) -> np.ndarray:
    """(samples, len(positions)) int64 tokens of one prompt's samples at `positions` (END where a
    sample is shorter). ValueError naming the run and prompt for no samples or a non-integer /
    negative token."""
    if isinstance(seqs, (str, bytes)) or not isinstance(seqs, Sequence):
        raise ValueError(f"{name}[{key!r}]: expected a sequence of token id sequences, got {type(seqs).__name__}")
    if not len(seqs):
        raise ValueError(f"{name}[{key!r}]: no samples")
    out = np.full((len(seqs), len(positions)), END, dtype=np.int64)
    pos = np.asarray(positions)
    for r, s in enumerate(seqs):
        if isinstance(s, (str, bytes)):
            raise ValueError(f"{name}[{key!r}] sample {r}: expected token ids, got {type(s).__name__}")
        a = np.asarray(s)
        if a.ndim != 1 or (a.size and not np.issubdtype(a.dtype, np.integer)):
            raise ValueError(f"{name}[{key!r}] sample {r}: token ids must be a flat sequence of integers")
        if a.size and a.min() < 0:
            raise ValueError(f"{name}[{key!r}] sample {r}: negative token id {int(a.min())}")
        ok = pos < a.size
        out[r, ok] = a[pos[ok]]
    return out


def _prepare(a: Samples, b: Samples, names: tuple[str, str], positions: tuple[int, ...]):
    """[(key, a's matrix, b's matrix)] in `a`'s order; ValueError for an empty run or prompts
    that differ (naming those on one side only)."""
    for name, x in zip(names, (a, b), strict=True):
        if not isinstance(x, Mapping):
            raise ValueError(f"{name}: expected a mapping prompt -> samples, got {type(x).__name__}")
        if not x:
            raise ValueError(f"{name}: no prompts")
    only_a = [k for k in a if k not in b]
    only_b = [k for k in b if k not in a]
    if only_a or only_b:
        def show(ks):
            return ", ".join(map(repr, ks[:5])) + (f" (+{len(ks) - 5} more)" if len(ks) > 5 else "")
        parts = [f"only in {names[0]}: {show(only_a)}" if only_a else "",
                 f"only in {names[1]}: {show(only_b)}" if only_b else ""]
        raise ValueError(f"prompts differ between {names[0]} and {names[1]}: " + "; ".join(p for p in parts if p))
    return [(k, _matrix(names[0], k, a[k], positions), _matrix(names[1], k, b[k], positions)) for k in a]


def _positions(positions: Sequence[int]) -> tuple[int, ...]:
    try:
        pos = tuple(int(p) for p in positions)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"positions: expected integers ({exc})") from None
    if not pos:
        raise ValueError("positions: none given")
    if min(pos) < 0:
        raise ValueError(f"positions: negative position {min(pos)}")
    if len(set(pos)) != len(pos):
        raise ValueError("positions: a position is given twice")
    return pos


# -- the test -------------------------------------------------------------------------------------

def _columns(z: np.ndarray, categories: int) -> tuple[np.ndarray, list[list[int | None]]]:
    """Column index (samples, P) of every pooled sample's token per position (0..C-1: the C - 1
    most frequent tokens by pooled count, ties by smaller id, then "other"), and per position
    the columns' tokens (None: "other")."""
    cols = np.empty_like(z)
    names: list[list[int | None]] = []
    for j in range(z.shape[1]):
        toks, counts = np.unique(z[:, j], return_counts=True)
        order = np.lexsort((toks, -counts))[: categories - 1]
        kept = toks[order]
        c = np.full(z.shape[0], categories - 1, dtype=np.int64)
        for i, t in enumerate(kept):
            c[z[:, j] == t] = i
        cols[:, j] = c
        names.append([int(t) for t in kept] + [None] * (categories - 1 - len(kept)) + [None])
    return cols, names


def two_sample(tested: Samples, reference: Samples, *, positions: Sequence[int] = DEFAULT_POSITIONS,
               categories: int = CATEGORIES, permutations: int = PERMUTATIONS, seed: int = 0,
               names: tuple[str, str] = ("spec", "ar")) -> TwoSample:
    """The permutation test (module docstring) of `tested` against `reference` (prompt -> token id
    sequences; the same prompts). `seed` fixes the relabellings (the result is a pure function of
    the input and the seed). ValueError for an empty or mismatched input."""
    pos = _positions(positions)
    if categories < 2:
        raise ValueError(f"categories: at least 2 columns per table, got {categories}")
    if permutations < 1:
        raise ValueError(f"permutations: at least 1, got {permutations}")
    rng = np.random.default_rng(seed)
    rows = _prepare(tested, reference, names, pos)
    t_obs = 0.0
    t_perm = np.zeros(permutations)
    df = tables = 0
    cand: list[tuple] = []
    sizes = []
    npos = len(pos)
    for key, za, zb in rows:
        n1, n2 = len(za), len(zb)
        n = n1 + n2
        sizes.append((n1, n2))
        cols, names_ = _columns(np.vstack([za, zb]), categories)
        onehot = np.zeros((n, npos * categories))
        onehot[np.arange(n)[:, None], np.arange(npos) * categories + cols] = 1.0
        nk = onehot.sum(0)
        live = nk > 0
        scale = n * n / (n1 * n2)
        s = np.r_[np.ones(n1), np.zeros(n2)] - n1 / n  # centred labels: D_k = a_k - n1 n_k / n
        d = s @ onehot
        x2 = np.zeros_like(nk)
        x2[live] = scale * d[live] ** 2 / nk[live]
        t_obs += float(x2.sum())
        perm = rng.permuted(np.tile(s, (permutations, 1)), axis=1)  # relabelled whole sequences
        dp = perm @ onehot[:, live]
        t_perm += scale * (dp ** 2 / nk[live]).sum(1)
        k_live = live.reshape(npos, categories).sum(1)
        tables += int((k_live >= 1).sum())
        df += int(np.maximum(k_live - 1, 0).sum())
        share_a = onehot[:n1].sum(0).reshape(npos, categories) / n1
        share_b = onehot[n1:].sum(0).reshape(npos, categories) / n2
        moved = np.abs(share_a - share_b).argmax(1)
        for j in np.nonzero(k_live >= 2)[0]:
            cand.append((float(x2[j * categories:(j + 1) * categories].sum()), int(k_live[j]) - 1, key, pos[j],
                         names_[j][moved[j]], float(share_a[j, moved[j]]), float(share_b[j, moved[j]])))
    p_value = (1 + int((t_perm >= t_obs * (1 - 1e-12)).sum())) / (permutations + 1)
    where: list[Where] = []
    if cand:
        p_tab = chi2.sf([c[0] for c in cand], [c[1] for c in cand])
        for i in np.argsort(p_tab, kind="stable")[:NAMED_TABLES]:
            _, _, key, p, tok, a, b = cand[i]
            where.append(Where(key, p, tok, a, b, float(p_tab[i])))
    return TwoSample(t_obs, p_value, df, tables, tuple(sizes), tuple(where))


# -- power ----------------------------------------------------------------------------------------

def power(sizes: Sequence[tuple[int, int]], positions: int, effect: float = EFFECT, alpha: float = ALPHA,
          categories: int = CATEGORIES) -> float:
    """The approximate power of the test (module docstring, Power) with `sizes` ((n1, n2) samples
    of the two runs per prompt) and `positions` positions per prompt, against a chi-square
    distance `effect` on every table: P(ncx2(df, lambda) > chi2.isf(alpha, df)), df = prompts x
    positions x (categories - 1), lambda = effect^2 x positions x sum n1 n2 / (n1 + n2)."""
    if not sizes or positions < 1:
        return 0.0
    df = len(sizes) * positions * (categories - 1)
    lam = effect ** 2 * positions * sum(a * b / (a + b) for a, b in sizes if a + b)
    return float(ncx2.sf(chi2.isf(alpha, df), df, lam)) if lam > 0 else float(alpha)


def samples_needed(prompts: int, positions: int, effect: float = EFFECT, alpha: float = ALPHA,
                   power_: float = POWER, categories: int = CATEGORIES) -> int | None:
    """The fewest samples per prompt (the same in both runs) at which `power` reaches `power_`
    with `prompts` prompts (power grows with the samples here: df is fixed); None when not within
    NEED_MAX."""
    def ok(n: int) -> bool:
        return power([(n, n)] * prompts, positions, effect, alpha, categories) >= power_
    if prompts < 1 or positions < 1 or not ok(NEED_MAX):
        return None
    lo, hi = 1, NEED_MAX
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


# -- the verdict ----------------------------------------------------------------------------------

def halves(samples: Samples) -> tuple[dict, dict]:
    """The AR floor of one run (`check_sampling`'s `floor` pair): per prompt its samples split into
    the first half and the rest (in the given order: occurrence j, seed `seed + j`), so the halves
    hold samples of disjoint seeds; prompts with fewer than 2 samples are left out."""
    a, b = {}, {}
    for key, seqs in samples.items():
        if len(seqs) >= 2:
            h = len(seqs) // 2
            a[key], b[key] = list(seqs[:h]), list(seqs[h:])
    return a, b


def check_sampling(ar: Samples, spec: Samples, floor: Samples | tuple[Samples, Samples] | None = None, *,
                   positions: Sequence[int] = DEFAULT_POSITIONS, alpha: float = ALPHA, effect: float = EFFECT,
                   power_: float = POWER, categories: int = CATEGORIES, permutations: int = PERMUTATIONS,
                   seed: int = 0) -> SamplingVerdict:
    """The T > 0 verdict of a speculative run `spec` against the AR run `ar` (prompt key -> that
    prompt's sampled outputs as token id sequences; the same prompt keys, the same temperature;
    any number of samples per prompt, at least one), `floor` a second AR run with other seeds
    (the same prompts; tested against `ar`), or a pair of disjoint AR samples (`halves(ar)`: tested
    against each other), or None. Module docstring for the test; `seed` fixes the permutations.

    FLOOR_DIFFERS when AR vs floor rejects at `alpha`; else DIFFERS when spec vs AR rejects; else
    PRESERVED when `power` at these sizes reaches `power_` against `effect`, else NOT_ENOUGH with
    the samples per prompt needed (`samples_needed` at these prompts and positions). ValueError
    naming what is wrong for an empty run, a prompt without samples, prompts that differ, bad
    tokens or positions, or alpha / effect / power_ outside their ranges."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha: must be in (0, 1), got {alpha}")
    if not effect > 0:
        raise ValueError(f"effect: must be > 0, got {effect}")
    if not 0 < power_ < 1:
        raise ValueError(f"power_: must be in (0, 1), got {power_}")
    pos = _positions(positions)
    kw = dict(positions=pos, categories=categories, permutations=permutations)
    floor_test = None
    if isinstance(floor, tuple):  # two disjoint halves of the AR samples, tested against each other
        floor_test = two_sample(floor[1], floor[0], seed=seed + 1, names=("floor", "ar"), **kw)
    elif floor is not None:
        floor_test = two_sample(floor, ar, seed=seed + 1, names=("floor", "ar"), **kw)
    spec_test = two_sample(spec, ar, seed=seed, names=("spec", "ar"), **kw)
    sizes = spec_test.sizes
    pw = power(sizes, len(pos), effect, alpha, categories)
    smallest = (min(b for _, b in sizes), min(a for a, _ in sizes))
    common = dict(power=pw, floor_p_value=floor_test.p_value if floor_test else None, prompts=len(sizes),
                  positions=pos, samples=smallest, effect=effect, alpha=alpha, spec_test=spec_test,
                  floor_test=floor_test)
    if floor_test is not None and floor_test.p_value < alpha:
        where = floor_test.where
        said = f", where: {where[0].words('the AR run')}" if where else ""
        return SamplingVerdict(FLOOR_DIFFERS, "not checked: AR differs from AR "
                               f"(floor p={floor_test.p_value:.3g}{said}); the AR runs are not one distribution"
                               " (seeds, batch-variant numerics, prompts)",
                               None, where, need=None, **common)
    p = spec_test.p_value
    if p < alpha:
        where = spec_test.where
        said = "; ".join(w.words() for w in where[:1])
        return SamplingVerdict(DIFFERS, f"distribution differs (p={p:.3g}, where: {said or 'spread over the tables'})",
                               p, where, need=None, **common)
    tail = (f"{len(sizes)} prompts x positions {pos[0]}..{pos[-1]}" if pos == tuple(range(pos[0], pos[-1] + 1))
            else f"{len(sizes)} prompts x {len(pos)} positions")
    if pw >= power_:
        return SamplingVerdict(PRESERVED, f"distribution preserved (p={p:.3g}; power {pw:.2f} against a shift of "
                               f"d={effect:g} at every position, {tail})", p, (), need=None, **common)
    need = samples_needed(len(sizes), len(pos), effect, alpha, power_, categories)
    needs = f"need {need}" if need is not None else f"need more than {NEED_MAX}"
    return SamplingVerdict(NOT_ENOUGH, f"not enough samples ({needs} per prompt and run; {smallest[1]} spec / "
                           f"{smallest[0]} AR: power {pw:.2f} against d={effect:g}, {tail}; p={p:.3g})",
                           p, (), need=need, **common)


# -- the simulator (benchmarks/sampling_power.py, tests/test_sampling_check.py) ----------------------

#: Samplers of `simulate`: "ar" and the three speculative ones (module docstring).
SAMPLERS = ("ar", "speculative", "greedy_draft", "argmax_match")
#: The samplers whose outputs are distributed as the target's (the check must pass them).
LOSSLESS_SAMPLERS = ("ar", "speculative")


@dataclass(frozen=True)
class BigramModel:
    """A known target and draft over a small vocabulary: `target[a]` = p(. | previous token a)
    and `draft[a]` = q(. | a), (V, V) rows summing to 1 (already at the temperature), and the
    prompt's last token `start`."""

    target: np.ndarray
    draft: np.ndarray
    start: int

    @classmethod
    def random(cls, seed: int, vocab: int = 8, temperature: float = 1.0, draft_noise: float = 1.0,
               spread: float = 1.5) -> BigramModel:
        """Target logits ~ N(0, spread^2) per (previous, next) pair, draft logits = target's +
        N(0, draft_noise^2), both softmax(logits / temperature); start token drawn uniformly.
        One prompt's model, a pure function of `seed`."""
        rng = np.random.default_rng(seed)
        lt = rng.normal(0, spread, (vocab, vocab))
        ld = lt + rng.normal(0, draft_noise, (vocab, vocab))
        return cls(_softmax(lt / temperature), _softmax(ld / temperature), int(rng.integers(vocab)))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _draw(rng: np.random.Generator, probs: np.ndarray) -> np.ndarray:
    """One categorical draw per row of `probs` (rows need not be normalised)."""
    c = np.cumsum(probs, axis=1)
    u = rng.random(len(probs)) * c[:, -1]
    return np.minimum((c <= u[:, None]).sum(1), probs.shape[1] - 1)


def simulate(model: BigramModel, sampler: str, samples: int, length: int, rng: np.random.Generator,
             k: int = 4) -> np.ndarray:
    """`samples` outputs of `length` tokens, (samples, length) int64, decoded by `sampler` (SAMPLERS)
    with `k` drafts per verification step. Token 0 is the target's prefill sample for every
    sampler; vectorised over samples (each advances by 1..k+1 tokens a step)."""
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler: one of {', '.join(SAMPLERS)}, got {sampler!r}")
    p, q = model.target, model.draft
    out = np.zeros((samples, length + k + 1), dtype=np.int64)
    out[:, 0] = _draw(rng, np.tile(p[model.start], (samples, 1)))
    if sampler == "ar":
        for t in range(1, length):
            out[:, t] = _draw(rng, p[out[:, t - 1]])
        return out[:, :length]
    lens = np.ones(samples, dtype=np.int64)
    p_argmax = p.argmax(1)
    while (lens < length).any():
        rows = np.nonzero(lens < length)[0]
        ctx = out[rows, lens[rows] - 1]
        drafts = np.empty((len(rows), k), dtype=np.int64)
        c = ctx
        for j in range(k):
            drafts[:, j] = q[c].argmax(1) if sampler == "greedy_draft" else _draw(rng, q[c])
            c = drafts[:, j]
        going = np.ones(len(rows), dtype=bool)
        c = ctx
        for j in range(k):
            g = np.nonzero(going)[0]
            y, cg = drafts[g, j], c[g]
            if sampler == "argmax_match":
                acc = y == p_argmax[cg]
                fix = _draw(rng, p[cg])
            else:  # speculative sampling's test (greedy_draft: as if y had been sampled from q)
                py, qy = p[cg, y], q[cg, y]
                acc = rng.random(len(g)) < np.minimum(1.0, py / qy)
                resid = np.maximum(0.0, p[cg] - q[cg])
                resid[resid.sum(1) <= 0] = p[cg][resid.sum(1) <= 0]
                fix = _draw(rng, resid)
            r = rows[g]
            out[r, lens[r]] = np.where(acc, y, fix)
            lens[r] += 1
            going[g[~acc]] = False
            c = drafts[:, j]
        g = np.nonzero(going)[0]
        if g.size:  # every draft accepted: the bonus token from p
            r = rows[g]
            out[r, lens[r]] = _draw(rng, p[drafts[g, k - 1]])
            lens[r] += 1
    return out[:, :length]


def simulate_run(models: Sequence[BigramModel], sampler: str, samples: int, seed: int,
                 length: int = DEFAULT_POSITIONS[-1] + 1, k: int = 4) -> dict[int, list[list[int]]]:
    """One run's input to `check_sampling`: {prompt index: `samples` outputs} of `models` (one per
    prompt) decoded by `sampler`, seeded by `seed` (another seed: another run)."""
    rng = np.random.default_rng(seed)
    return {i: simulate(m, sampler, samples, length, rng, k).tolist() for i, m in enumerate(models)}


def prompt_models(prompts: int, seed: int = 0, **kw) -> list[BigramModel]:
    """`prompts` BigramModel.random models, prompt i's from seed (seed, i)."""
    return [BigramModel.random(int(np.random.SeedSequence([seed, i]).generate_state(1)[0]), **kw)
            for i in range(prompts)]

