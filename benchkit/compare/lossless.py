"""The lossless check (issue 18; MEASUREMENT.md "Comparing runs", Lossless; docs/LOSSLESS.md):
at temperature 0 a speculative configuration must produce what autoregressive decoding produces
for the same prompt. Pure functions over points (benchkit.point.Point) and the runs' output
digests (benchkit.measure.outputs.RunOutputs); Django-free.

- **Baseline**: the `auto` runs of the spec run's `Point.match_key()` (same engine build, model,
  GPUs, TP and workload, temperature and seed included; the decoding method differs). Requests
  are paired by prompt hash (`compare_outputs(by="prompt")`), so runs whose warmup differs still
  compare on the prompts they share. A request is *identical* when its output equals the output
  of at least one matched `auto` run for that prompt (when AR differs from AR, each AR output is
  one that AR decoding produces); otherwise it *diverged*, at the latest first divergence over
  the matched `auto` runs (the closest AR output), exact where both runs kept that output whole,
  else to the block (`benchkit.measure.outputs`).
- **AR noise floor**: the `auto` runs that differ from the baseline only where numerics may change
  (`FLOOR_VARIES`: concurrency and request rate, whose batches differ; and repeats), compared
  pairwise: the floor is the smallest identical share over those pairs, i.e. the largest
  divergence rate `q` seen between two AR runs (batch-variant kernels make AR differ from AR).
- **Rule** (issue 31; `pool`, "the pooled rule" below): a configuration's repeats (its spec runs
  of one match key) are judged together. S = prompts that diverge in every repeat at the same
  first-divergence position, of the n compared in every repeat, against Bin(n, q ** R) (the
  floor's divergences move between repeats, a bug's do not); D = diverged requests of all N
  compared, against Bin(N, q). `beyond_floor` when the smaller tail, Bonferroni-adjusted (x 2
  with R >= 2), is < ALPHA (0.05). Not rejected: `lossless` only when the S test's power against
  a divergence on EFFECT (10 %) of prompts in every repeat reaches POWER (0.8) at n, else
  `inconclusive` ("need N prompts", `prompts_needed`). With q = 0 any divergence is beyond the
  floor. With no floor (fewer than two comparable `auto` runs) a divergence is `differs`.

Verdicts (`Verdict.verdict`): `lossless` (no divergence, or within the floor, with power),
`beyond_floor`, `differs`, `inconclusive` (not rejected, no power at this size), `not_checked`
with a reason code of NOT_CHECKED (sampling, no baseline, outputs not
kept, an imported file, synthetic acceptance: not lossless by design, ...). An engine that returns
no token ids is compared on its text (positions in characters), and the sentence says so.
`lossless_mark(point)` is what every figure and headline reads to mark a configuration that is
not shown lossless (`MARKED`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from itertools import combinations

import numpy as np
from scipy.stats import binom

from benchkit.compare import sampling
from benchkit.compare.stats import median
from benchkit.measure.outputs import OutputMatch, RunOutputs, compare_outputs
from benchkit.point import MATCH_FIELDS, Point

#: The baseline configuration's label (benchkit.methods: autoregressive decoding).
AUTO = "auto"
#: Verdict codes.
LOSSLESS, BEYOND_FLOOR, DIFFERS, NOT_CHECKED = "lossless", "beyond_floor", "differs", "not_checked"
INCONCLUSIVE = "inconclusive"
#: The T > 0 verdicts (`judge_sampling`; benchkit.compare.sampling's PRESERVED, DIFFERS, NOT_ENOUGH).
PRESERVED, DISTRIBUTION_DIFFERS, NOT_ENOUGH_SAMPLES = "preserved", "distribution_differs", "not_enough_samples"
VERDICTS = (LOSSLESS, BEYOND_FLOOR, DIFFERS, INCONCLUSIVE, NOT_CHECKED, PRESERVED, DISTRIBUTION_DIFFERS,
            NOT_ENOUGH_SAMPLES)
#: Verdicts whose outputs differ from AR's: the mark MARK, "not lossless".
DIFFERING = (BEYOND_FLOOR, DIFFERS, DISTRIBUTION_DIFFERS)
#: Verdicts of a check that could not judge at this size: the mark UNSURE_MARK.
UNSURE = (INCONCLUSIVE, NOT_ENOUGH_SAMPLES)
#: Verdicts that put a mark on a figure's cell and a headline's winner: not shown lossless
#: (differing: MARK; inconclusive: UNSURE_MARK).
MARKED = (*DIFFERING, *UNSURE)
#: The mark drawn beside a speedup of a configuration whose outputs differ from AR's.
MARK = "≠"
#: The mark drawn beside a speedup of a configuration the check could not judge (too few prompts).
UNSURE_MARK = "?"
#: A verdict in a few words (tables), most severe first.
SHORT = {BEYOND_FLOOR: f"{MARK} beyond AR floor", DISTRIBUTION_DIFFERS: f"{MARK} distribution differs",
         DIFFERS: f"{MARK} differs (no floor)", INCONCLUSIVE: f"{UNSURE_MARK} inconclusive",
         NOT_ENOUGH_SAMPLES: f"{UNSURE_MARK} not enough samples", NOT_CHECKED: "not checked", LOSSLESS: "lossless",
         PRESERVED: "distribution preserved"}
#: Level of the one-sided binomial test of the rule (module docstring).
ALPHA = 0.05
#: Match fields in which AR runs of one floor may differ (their batches differ, numerics may too).
FLOOR_VARIES = ("concurrency", "request_rate")
#: At most this many `auto` runs per floor (the first by run id): at most 66 pairs.
FLOOR_MAX_RUNS = 12
#: At most this many divergence positions are kept per verdict (the run page lists them).
MAX_DIVERGENCES = 500

#: Not-checked reason codes and their sentences (`str.format` fields named).
SYNTHETIC_ACCEPTANCE = "synthetic_acceptance"
IMPORTED = "imported"
SAMPLING = "sampling"
NOT_KEPT = "outputs_not_kept"
NO_BASELINE = "no_baseline"
BASELINE_NOT_KEPT = "baseline_not_kept"
NOT_COMPARABLE = "not_comparable"
UNREADABLE = "unreadable"
SAMPLING_NO_BASELINE = "sampling_no_baseline"
SAMPLING_FLOOR = "sampling_floor"
NOT_CHECKED_REASONS: dict[str, str] = {
    SYNTHETIC_ACCEPTANCE: "synthetic acceptance: the outputs are forced, not the model's (not lossless by design)",
    IMPORTED: "imported file: no outputs kept",
    SAMPLING: "sampling (temperature {temperature:g}): one sample per prompt; set workload.samples_per_prompt "
              "(e.g. 100, with num_prompts = 32 x that and output_len 9) to check the distribution",
    SAMPLING_NO_BASELINE: "sampling (temperature {temperature:g}): the matched auto run(s) {runs} kept no "
                          "multi-sample token ids (the auto run needs the same samples_per_prompt)",
    SAMPLING_FLOOR: "{why}",
    NOT_KEPT: "outputs not kept",
    NO_BASELINE: "no matching auto run (same engine build, model, GPUs, TP and workload)",
    BASELINE_NOT_KEPT: "the matched auto run(s) {runs} kept no outputs",
    NOT_COMPARABLE: "no request comparable with the matched auto run(s): {why}",
    UNREADABLE: "outputs unreadable ({why})",
}


def floor_key(p: Point) -> tuple:
    """MATCH fields but FLOOR_VARIES, in declaration order: the AR runs of one noise floor."""
    return tuple(getattr(p, f) for f in MATCH_FIELDS if f not in FLOOR_VARIES)


@dataclass(frozen=True)
class FloorPair:
    """Two `auto` runs compared: requests compared and identical, their first divergences'
    median (in `unit`, None without divergence)."""

    run_a: int
    run_b: int
    compared: int
    identical: int
    median_first_divergence: float | None = None

    @property
    def identical_share(self) -> float | None:
        return self.identical / self.compared if self.compared else None


@dataclass(frozen=True)
class Floor:
    """The AR noise floor of one floor key: the `auto` runs used, each comparable pair, and the
    smallest identical share over the pairs (None: no pair compared anything)."""

    run_ids: tuple[int, ...] = ()
    pairs: tuple[FloorPair, ...] = ()

    @property
    def identical_share(self) -> float | None:
        shares = [p.identical_share for p in self.pairs if p.compared]
        return min(shares) if shares else None

    @property
    def divergence_rate(self) -> float | None:
        """q = 1 - the floor's identical share (0..1)."""
        s = self.identical_share
        return None if s is None else 1.0 - s


def measure_floor(ar: Sequence[tuple[int, RunOutputs]]) -> Floor:
    """The Floor of `ar` ((run id, outputs) of the `auto` runs of one floor key; at most
    FLOOR_MAX_RUNS, the first by run id, are used): every pair compared by prompt hash; pairs
    with no comparable request are dropped."""
    ar = sorted(ar, key=lambda x: x[0])[:FLOOR_MAX_RUNS]
    pairs = []
    for (ia, a), (ib, b) in combinations(ar, 2):
        ms = compare_outputs(a, b, by="prompt")
        div = [m.first_divergence for m in ms if m.status == "diverged"]
        ident = sum(1 for m in ms if m.status == "identical")
        if ident + len(div):
            pairs.append(FloorPair(ia, ib, ident + len(div), ident, median(div)))
    return Floor(tuple(i for i, _ in ar), tuple(pairs))


@dataclass(frozen=True)
class Verdict:
    """One spec run's lossless verdict (module docstring).

    `verdict`: one of VERDICTS; `sentence`: what the pages print; `reason`: a NOT_CHECKED_REASONS
    code for `not_checked` ("" otherwise). Counts over the spec run's requests paired with the
    baseline: `compared` (identical + diverged), `identical`, `not_comparable`;
    `identical_share` (0..1); `median_first_divergence` over the diverged requests, in `unit`
    ("token", or "char" when compared on text); `precision` "exact" (every divergence position
    exact) or "block" (some only to the block of `block` units); `divergences`: (prompt index,
    first divergence) of the diverged requests, at most MAX_DIVERGENCES. `baseline_run_ids`:
    the `auto` runs compared with; the floor: `floor_run_ids`, `floor_pairs` ((run a, run b,
    compared, identical) each), `floor_identical_share`; `p_value`: the binomial tail of the
    rule (None without divergence or floor)."""

    verdict: str
    sentence: str
    reason: str = ""
    compared: int = 0
    identical: int = 0
    not_comparable: int = 0
    identical_share: float | None = None
    median_first_divergence: float | None = None
    unit: str | None = None
    precision: str | None = None
    block: int | None = None
    divergences: tuple[tuple[int, int], ...] = ()
    baseline_run_ids: tuple[int, ...] = ()
    floor_run_ids: tuple[int, ...] = ()
    floor_pairs: tuple[tuple[int, int, int, int], ...] = ()
    floor_identical_share: float | None = None
    p_value: float | None = None
    pooled: Pooled | None = field(default=None, compare=False)

    @property
    def marked(self) -> bool:
        """True when the configuration is not shown lossless (MARKED)."""
        return self.verdict in MARKED

    def to_dict(self) -> dict:
        """Plain JSON-able dict (tuples as lists)."""
        return asdict(self)


def not_checked(reason: str, **fields: object) -> Verdict:
    """The `not_checked` Verdict of reason code `reason` (NOT_CHECKED_REASONS; KeyError for an
    unknown code), its sentence filled from `fields`."""
    return Verdict(NOT_CHECKED, "not checked: " + NOT_CHECKED_REASONS[reason].format(**fields), reason)


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %".replace(".0 %", " %")


def _runs(ids: Iterable[int]) -> str:
    ids = list(ids)
    return ("run " if len(ids) == 1 else "runs ") + ", ".join(str(i) for i in ids)


def combine(per_baseline: Sequence[Sequence[OutputMatch]]) -> list[OutputMatch]:
    """Per request of the spec run (by its prompt index), one OutputMatch over several baselines'
    `compare_outputs` answers: identical when identical to any; else diverged at the latest first
    divergence (the closest AR output; ties: an exact position first); else not comparable (the
    first reason)."""
    by_index: dict[int, list[OutputMatch]] = defaultdict(list)
    for ms in per_baseline:
        for m in ms:
            by_index[m.index].append(m)
    out = []
    for idx in sorted(by_index):
        ms = by_index[idx]
        same = [m for m in ms if m.status == "identical"]
        div = [m for m in ms if m.status == "diverged"]
        if same:
            out.append(same[0])
        elif div:
            out.append(max(div, key=lambda m: (m.first_divergence, m.precision == "exact")))
        else:
            out.append(ms[0])
    return out


def match_run(outputs: RunOutputs, baselines: Sequence[tuple[int, RunOutputs]]) -> list[tuple[tuple, OutputMatch]]:
    """(prompt key, OutputMatch) per request of a spec run's `outputs` against its matched `auto`
    runs' `baselines` (`combine`); the key, (prompt hash, occurrence), names the same prompt in
    another repeat of the configuration. Small: what `judge_repeats` needs once the outputs are
    dropped."""
    matches = combine([compare_outputs(outputs, b, by="prompt") for _, b in baselines])
    seen: dict[int, int] = {}
    keys = {}
    for idx in sorted(outputs.records):
        h = outputs.records[idx].prompt
        seen[h] = seen.get(h, -1) + 1
        keys[idx] = (h, seen[h])
    return [(keys[m.index], m) for m in matches]


def judge(outputs: RunOutputs, baselines: Sequence[tuple[int, RunOutputs]], floor: Floor | None,
          alpha: float = ALPHA) -> Verdict:
    """The verdict of one spec run's `outputs` (a configuration of one repeat) against its
    matched `auto` runs' `baselines` ((run id, outputs), at least one) and the AR noise `floor`
    of its floor key (None or empty: no floor): `judge_repeats` of that one run. Pure."""
    return judge_repeats([match_run(outputs, baselines)], tuple(i for i, _ in baselines), floor, alpha)[0]


def _prompt_list(systematic: Sequence[tuple[int, int]], word: str) -> str:
    named = ", ".join(f"#{i} at {word} {pos}" for i, pos in systematic[:NAMED_PROMPTS])
    return named + (f" and {len(systematic) - NAMED_PROMPTS} more" if len(systematic) > NAMED_PROMPTS else "")


def judge_repeats(runs: Sequence[Sequence[tuple[tuple, OutputMatch]]], base_ids: tuple[int, ...],
                  floor: Floor | None, alpha: float = ALPHA) -> list[Verdict]:
    """The verdicts of a configuration's repeats (`match_run` of each, against the matched
    `auto` runs `base_ids`) judged together by the pooled rule (`pool`; module docstring): every
    repeat gets the configuration's verdict, its sentence, p and the floor, with its own counts.
    A repeat with no comparable request is `not_checked` and left out of the pool. Pure."""
    out: list[Verdict | None] = [None] * len(runs)
    judged = []
    for k, ms in enumerate(runs):
        matches = [m for _, m in ms]
        if not any(m.status in ("identical", "diverged") for m in matches):
            n_nc = sum(1 for m in matches if m.status == "not_comparable")
            reasons = sorted({m.reason for m in matches if m.reason}) or ["no prompt in common"]
            v = not_checked(NOT_COMPARABLE, why="; ".join(reasons[:2]))
            out[k] = Verdict(**{**v.to_dict(), "not_comparable": n_nc, "baseline_run_ids": base_ids})
        else:
            judged.append(k)
    if not judged:
        return out  # type: ignore[return-value]
    compared = [[(key, m) for key, m in runs[k] if m.status in ("identical", "diverged")] for k in judged]
    fl_share = floor.identical_share if floor else None
    fl_q = floor.divergence_rate if floor else None
    pooled = pool(compared, fl_q, alpha)
    all_div = [m for ms in compared for _, m in ms if m.status == "diverged"]
    units = {m.unit for ms in compared for _, m in ms if m.unit}
    unit = units.pop() if len(units) == 1 else None
    word = "character" if unit == "char" else "token"
    on_text = "; compared on text: the engine returns no token ids" if unit == "char" else ""
    floor_words = (f"AR vs AR {_pct(fl_share)} identical ({len(floor.pairs)} pair{'s' * (len(floor.pairs) != 1)})"
                   if floor and fl_share is not None else "")
    r, n = pooled.repeats, pooled.prompts
    over = f"{r} repeats" if r > 1 else "1 run"
    power_words = (f"power {pooled.power:.2f} to detect a divergence on {_pct(EFFECT)} of prompts in every "
                   f"repeat at {n} prompts x {over}")
    p_words = f", p = {pooled.p_value:.2g}" if pooled.p_value is not None and fl_q else ""
    if pooled.verdict == BEYOND_FLOOR and not fl_q:
        head = f"; {floor_words}: AR never differed from AR"
    elif pooled.verdict == BEYOND_FLOOR:
        sys_sig = pooled.p_systematic is not None and pooled.p_systematic <= (pooled.p_pooled or 1.0) and r >= 2
        if sys_sig:
            head = (f"; {len(pooled.systematic)} of {n} prompts diverge at the same {word} in all {r} repeats "
                    f"({_prompt_list(pooled.systematic, word)}) where AR's rate {_pct(fl_q)} expects "
                    f"{n * fl_q ** r:.2g}")
        else:
            head = (f"; over {over} {pooled.diverged} of {pooled.requests} requests diverged where AR's rate "
                    f"{_pct(fl_q)} expects {pooled.requests * fl_q:.2g}")
        head += f"{p_words}; {floor_words}"
    elif pooled.verdict == INCONCLUSIVE:
        need = (f"need {pooled.need} prompts at {over}" if pooled.need else
                f"more prompts will not do at {over}: more repeats are needed")
        head = (f"inconclusive ({need}): {pooled.diverged} of {pooled.requests} requests over {over} diverged"
                + (f", {len(pooled.systematic)} prompts in every repeat at one position" if r > 1 else "")
                + f"{p_words}; only {power_words} (< {POWER:g})" + (f"; {floor_words}" if floor_words else ""))
    else:
        head = ""
    verdicts = []
    for k, ms in zip(judged, compared, strict=True):
        matches = [m for _, m in runs[k]]
        div = [m for _, m in ms if m.status == "diverged"]
        ident = len(ms) - len(div)
        n_nc = sum(1 for m in matches if m.status == "not_comparable")
        n_k = len(ms)
        exact = all(m.precision == "exact" for m in div)
        block = next((m.block for m in div if m.precision == "block"), None)
        share = ident / n_k
        med = median([m.first_divergence for m in div])
        at = (f"first divergence median at {word} {med:g}" + ("" if exact else f" (to the block of {block})")
              if div else "")
        differ = f"{_pct(1 - share)} of requests, {at}"
        if pooled.verdict == DIFFERS:
            sentence = (f"differs from AR ({differ}" + (f"; {pooled.diverged} of {pooled.requests} over {over}"
                                                         if r > 1 else "")
                        + "); no AR noise floor to judge it against (needs a second comparable auto run: a "
                        "repeat or another concurrency)")
        elif pooled.verdict == BEYOND_FLOOR:
            sentence = f"differs beyond the AR noise floor ({differ}){head}"
        elif pooled.verdict == INCONCLUSIVE:
            sentence = head + (f"; this run: {ident} of {n_k} identical" + (f", {at}" if div else ""))
        elif not all_div:
            sentence = (f"lossless: all {n_k} requests identical to the auto run's output"
                        + (f" (all {pooled.requests} over {over})" if r > 1 else "") + f"; {power_words}"
                        + (f"; {floor_words}" if floor_words else ""))
        else:
            sentence = (f"lossless within the AR noise floor: {ident} of {n_k} requests identical ({_pct(share)}"
                        + (f", {at}" if div else "") + f"); {floor_words}{p_words}"
                        + (f"; {len(pooled.systematic)} prompts in every repeat at one position" if r > 1 else "")
                        + f"; {power_words}")
        if n_nc:
            sentence += f"; {n_nc} request{'s' * (n_nc != 1)} not comparable"
        verdicts.append(Verdict(
            pooled.verdict, sentence + on_text, "", n_k, ident, n_nc, share, med, unit,
            "exact" if exact else "block", block, tuple((m.index, m.first_divergence) for m in div[:MAX_DIVERGENCES]),
            base_ids, floor.run_ids if floor else (),
            tuple((p.run_a, p.run_b, p.compared, p.identical) for p in floor.pairs) if floor else (), fl_share,
            pooled.p_value, pooled))
    for k, v in zip(judged, verdicts, strict=True):
        out[k] = v
    return out  # type: ignore[return-value]


# -- temperature > 0: the sampling check (benchkit.compare.sampling; docs/LOSSLESS.md) -----------

#: benchkit.compare.sampling's verdict -> the stored verdict code.
SAMPLING_VERDICTS = {sampling.PRESERVED: PRESERVED, sampling.DIFFERS: DISTRIBUTION_DIFFERS,
                     sampling.NOT_ENOUGH: NOT_ENOUGH_SAMPLES}


def run_samples(outputs: RunOutputs) -> dict[int, list[list[int]]]:
    """{prompt hash: the whole token ids of its requests, in prompt-index order} of a run's kept
    outputs (occurrence j is the sample of seed `workload.seed + j`, benchkit.measure.workloads.
    repeat_samples); only requests whose ids were kept whole."""
    out: dict[int, list[list[int]]] = {}
    for idx in sorted(outputs.records):
        r = outputs.records[idx]
        if r.kind == "ids" and isinstance(r.full, list):
            out.setdefault(r.prompt, []).append(r.full)
    return out


def multi_sample(samples: dict[int, list[list[int]]]) -> bool:
    """True when the run sent several samples of its prompts (samples_per_prompt > 1): the T > 0
    check can judge it."""
    return bool(samples) and min(len(v) for v in samples.values()) >= 2


def judge_sampling(spec: dict[int, list[list[int]]], ar: dict[int, list[list[int]]], ar_id: int,
                   alpha: float = ALPHA) -> Verdict:
    """The T > 0 verdict of a spec run's samples (`run_samples`) against its matched `auto` run's
    (`ar_id`): `sampling.check_sampling` on the prompts both sent, the AR floor being the AR run's
    own samples split in halves (`sampling.halves`: occurrences j < N/2 against the rest, disjoint
    seeds; another `auto` repeat reuses the same seeds, so its samples are copies, not independent
    draws). Verdicts: PRESERVED, DISTRIBUTION_DIFFERS, NOT_ENOUGH_SAMPLES; `not_checked`
    (SAMPLING_FLOOR) when AR differs from AR; NOT_COMPARABLE when no prompt is shared. Pure."""
    common = [k for k in spec if k in ar]
    if not common:
        v = not_checked(NOT_COMPARABLE, why="no prompt in common with the auto run's samples")
        return Verdict(**{**v.to_dict(), "baseline_run_ids": (ar_id,)})
    spec_c, ar_c = {k: spec[k] for k in common}, {k: ar[k] for k in common}
    fa, fb = sampling.halves(ar_c)
    sv = sampling.check_sampling(ar_c, spec_c, (fa, fb) if fa else None, alpha=alpha)
    n_spec = sum(len(v) for v in spec_c.values())
    base = dict(compared=n_spec, unit="token", baseline_run_ids=(ar_id,), floor_run_ids=(ar_id,) if fa else (),
                p_value=sv.p_value)
    if sv.verdict == sampling.FLOOR_DIFFERS:
        v = not_checked(SAMPLING_FLOOR, why=sv.sentence.removeprefix("not checked: "))
        return Verdict(**{**v.to_dict(), **base, "p_value": sv.floor_p_value})
    sentence = sv.sentence + f"; {n_spec} spec samples vs {sum(len(v) for v in ar_c.values())} of auto run {ar_id}"
    if sv.floor_p_value is not None:
        sentence += f"; AR halves p={sv.floor_p_value:.3g}"
    return Verdict(SAMPLING_VERDICTS[sv.verdict], sentence, **base)


def _check_sampling_runs(todo: Sequence[Point], ps: Sequence[Point], load: Loader, imported: Collection[int],
                         alpha: float) -> dict[int, Verdict]:
    """The verdicts of one floor key's T > 0 spec points `todo` (`judge_sampling`): each against the
    first (lowest run id) `auto` run of its match key that kept several samples per prompt. A spec
    run with one sample per prompt stays "not checked (sampling)", with how to enable the check."""
    out: dict[int, Verdict] = {}
    ar_cache: dict[int, dict | None] = {}

    def ar_samples(run_id: int) -> dict | None:
        if run_id not in ar_cache:
            try:
                o = None if run_id in imported else load(run_id)
            except ValueError:
                o = None
            s = run_samples(o) if o is not None else None
            ar_cache[run_id] = s if s and multi_sample(s) else None
        return ar_cache[run_id]

    autos = sorted((p for p in ps if p.label == AUTO), key=lambda p: p.run_id)
    for p in sorted(todo, key=lambda p: p.run_id):
        mine = _load_or_mark(load, p.run_id, out)
        if mine is _UNREADABLE_RUN:
            continue
        spec = run_samples(mine) if mine is not None else {}
        if not multi_sample(spec):
            out[p.run_id] = not_checked(SAMPLING, temperature=p.temperature)
            continue
        base_ids = [a.run_id for a in autos if a.match_key() == p.match_key()]
        if not base_ids:
            out[p.run_id] = not_checked(NO_BASELINE)
            continue
        ar_id = next((i for i in base_ids if ar_samples(i) is not None), None)
        if ar_id is None:
            v = not_checked(SAMPLING_NO_BASELINE, temperature=p.temperature, runs=", ".join(map(str, base_ids)))
            out[p.run_id] = Verdict(**{**v.to_dict(), "baseline_run_ids": tuple(base_ids)})
            continue
        out[p.run_id] = judge_sampling(spec, ar_samples(ar_id), ar_id, alpha)
    return out


#: What `check_runs` asks for a run's outputs: its RunOutputs, None when it kept none; it may
#: raise ValueError for outputs that do not decode.
Loader = Callable[[int], RunOutputs | None]


def check_runs(points: Iterable[Point], load: Loader, *, imported: Collection[int] = (),
               synthetic: Collection[int] = (), alpha: float = ALPHA) -> dict[int, Verdict]:
    """{run id: Verdict} of every speculative point of `points` (one sweep's counted runs; the
    `auto` points are the baselines and the floor, and get no verdict). `load(run_id)` gives a
    run's outputs (Loader); it is called at most once per run, and only for runs that can be
    judged, one floor key at a time (its `auto` runs', then each spec run's), so at most one
    floor's AR outputs and one spec run's are held at once. `imported`: run ids of imported
    files; `synthetic`: run ids whose acceptance was forced (twin runs): both not checked."""
    groups: dict[tuple, list[Point]] = defaultdict(list)
    for p in points:
        groups[floor_key(p)].append(p)
    out: dict[int, Verdict] = {}
    for ps in groups.values():
        spec = [p for p in ps if p.label != AUTO]
        todo, sampled = [], []
        for p in spec:
            if p.run_id in synthetic:
                out[p.run_id] = not_checked(SYNTHETIC_ACCEPTANCE)
            elif p.run_id in imported:
                out[p.run_id] = not_checked(IMPORTED)
            elif p.temperature:
                sampled.append(p)
            else:
                todo.append(p)
        if sampled:
            out.update(_check_sampling_runs(sampled, ps, load, imported, alpha))
        if not todo:
            continue
        ar: dict[int, RunOutputs | None] = {}
        broken: dict[int, str] = {}
        for p in sorted((p for p in ps if p.label == AUTO), key=lambda p: p.run_id):
            if p.run_id in imported:
                ar[p.run_id] = None
                continue
            try:
                ar[p.run_id] = load(p.run_id)
            except ValueError as exc:
                ar[p.run_id], broken[p.run_id] = None, str(exc)
        kept = [(i, o) for i, o in ar.items() if o is not None]
        floor = measure_floor(kept) if len(kept) >= 2 else None
        floor = floor if floor and floor.pairs else None
        auto_by_match: dict[tuple, list[int]] = defaultdict(list)
        for p in ps:
            if p.label == AUTO:
                auto_by_match[p.match_key()].append(p.run_id)
        configs: dict[tuple, list[Point]] = defaultdict(list)
        for p in todo:
            configs[(p.match_key(), p.config_key())].append(p)
        for reps in configs.values():  # one configuration's repeats, judged together (pool)
            base_ids = auto_by_match.get(reps[0].match_key(), [])
            if not base_ids:
                out.update({p.run_id: not_checked(NO_BASELINE) for p in reps})
                continue
            bases = [(i, ar[i]) for i in base_ids if ar.get(i) is not None]
            if not bases:
                v = not_checked(BASELINE_NOT_KEPT, runs=", ".join(map(str, base_ids)))
                out.update({p.run_id: Verdict(**{**v.to_dict(), "baseline_run_ids": tuple(base_ids)}) for p in reps})
                continue
            judged: list[tuple[int, list]] = []
            for p in sorted(reps, key=lambda p: p.run_id):
                mine = _load_or_mark(load, p.run_id, out)
                if mine is _UNREADABLE_RUN:
                    continue
                if mine is None:
                    out[p.run_id] = not_checked(NOT_KEPT)
                    continue
                judged.append((p.run_id, match_run(mine, bases)))  # the outputs are dropped here
            if judged:
                vs = judge_repeats([ms for _, ms in judged], tuple(i for i, _ in bases), floor, alpha)
                out.update({rid: v for (rid, _), v in zip(judged, vs, strict=True)})
    return out


# -- what figures and headlines read --------------------------------------------------------------

@dataclass(frozen=True)
class LosslessMark:
    """A visible mark for a configuration that is not shown lossless: `symbol` (MARK where the
    outputs differ from AR's, UNSURE_MARK where the check was inconclusive) to put beside its
    number, `words` to print beside the symbol ("not lossless" / "lossless inconclusive"),
    `text` for its hover or footnote (the verdict's sentence; "k of n runs" when only some of a
    cell's repeats are marked), the `run_ids` marked."""

    symbol: str
    text: str
    run_ids: tuple[int, ...] = field(default=())
    words: str = "not lossless"


def worst(points: Iterable[Point]) -> Point | None:
    """Of a configuration's points (its repeats), the one whose stored verdict is the most severe
    (SHORT's order; the lowest identical share among equals), None when none has a verdict (an
    `auto` point, or not computed)."""
    order = {v: i for i, v in enumerate(SHORT)}
    ps = [p for p in points if p.lossless_verdict in order]
    if not ps:
        return None
    return min(ps, key=lambda p: (order[p.lossless_verdict], p.lossless_identical_share
                                  if p.lossless_identical_share is not None else 2.0))


def lossless_mark(points: Point | Iterable[Point]) -> LosslessMark | None:
    """The mark of one point, or of a cell's points (its repeats): None unless a point's stored
    verdict (`Point.lossless_verdict`) is in MARKED; MARK ("not lossless") with the first
    differing point's sentence when one differs (DIFFERING), else UNSURE_MARK ("lossless
    inconclusive") with the first inconclusive one's. The one rule the heatmap and the headline
    use to mark a configuration not shown lossless."""
    ps = [points] if isinstance(points, Point) else list(points)
    marked = [p for p in ps if p.lossless_verdict in DIFFERING]
    symbol, words = MARK, "not lossless"
    if not marked:
        marked = [p for p in ps if p.lossless_verdict in UNSURE]
        symbol, words = UNSURE_MARK, "lossless inconclusive"
    if not marked:
        return None
    text = f"{words}: {marked[0].lossless_sentence}"
    if len(marked) < len(ps):
        text += f" ({len(marked)} of {len(ps)} runs)"
    return LosslessMark(symbol, text, tuple(p.run_id for p in marked), words)


# -- the pooled rule over a configuration's repeats (issue 31) ------------------------------------

#: The effect the check must be able to detect before it says "lossless": a systematic divergence
#: (the same prompts diverging at the same position in every repeat) on this share of the prompts.
EFFECT = 0.10
#: ... with at least this probability (the power of the systematic test at the sample size).
POWER = 0.80
#: The sizes docs/LOSSLESS.md recommends: 48 prompts x 3 repeats (power >= 0.92 at a floor q up
#: to 0.15, the worst of 3 AR pairs of a ~10 % floor; benchmarks/lossless_power.py).
RECOMMENDED_PROMPTS, RECOMMENDED_REPEATS = 48, 3
#: `prompts_needed` looks no further than this many prompts.
NEED_MAX = 100_000
#: At most this many systematic prompts are named in a sentence (all are kept in `systematic`).
NAMED_PROMPTS = 6


def _level(repeats: int, alpha: float) -> float:
    """The level of each of the two tests: alpha / 2 (Bonferroni) with two or more repeats, alpha
    with one (then the two statistics are the same)."""
    return alpha / 2 if repeats >= 2 else alpha


def _null_rate(repeats: int, q: float) -> float:
    """Under the null, the chance that one prompt diverges in every one of `repeats` repeats: at
    most q ** repeats (each repeat diverges independently with probability at most q; requiring
    the same position as well only lowers it)."""
    return q ** repeats


def critical(n, p0: float, level: float):
    """The smallest count c >= 1 with P(Bin(n, p0) >= c) <= level: the test rejects at c or more.
    `n` may be an int or a numpy array (vectorised); c > n means it can never reject."""
    n = np.asarray(n)
    c = np.asarray(binom.isf(level, n, p0), dtype=float) + 1.0
    c = np.where(np.isnan(c), n + 1, c)
    c = np.maximum(c, 1.0)
    return c.astype(int) if c.ndim else int(c)


def systematic_power(n, repeats: int, q: float, effect: float = EFFECT, alpha: float = ALPHA):
    """The power of the systematic test (`pool`) with `n` prompts compared in every one of
    `repeats` repeats and the floor's rate q, against a divergence on a share `effect` of the
    prompts at one position in every repeat: P(Bin(n, p1) >= c), c = critical(n, q ** repeats,
    level). p1 = effect with two or more repeats (the noise's own prompts are not counted: a lower
    bound), effect + (1 - effect) q with one repeat (the test is then the count of diverged
    requests). A lower bound of the whole rule's power (it also rejects on the pooled count)."""
    n = np.asarray(n)
    c = critical(n, _null_rate(repeats, q), _level(repeats, alpha))
    p1 = effect if repeats >= 2 else effect + (1 - effect) * q
    out = np.where(c > n, 0.0, binom.sf(c - 1, n, p1))
    return out if out.ndim else float(out)


def prompts_needed(repeats: int, q: float, effect: float = EFFECT, alpha: float = ALPHA,
                   power: float = POWER) -> int | None:
    """The fewest prompts n (compared in every one of `repeats` repeats) from which
    `systematic_power` stays at `power` or more up to 2 n (power is not monotone in n: the
    critical count moves in steps); None when none within NEED_MAX (more repeats are needed)."""
    hi = 256
    while True:
        ns = np.arange(1, 2 * hi + 1)
        ok = systematic_power(ns, repeats, q, effect, alpha) >= power
        # next_bad[i]: the smallest n' >= ns[i] whose power falls short (2 hi + 1: none)
        bad = np.where(ok, 2 * hi + 1, ns)
        next_bad = np.minimum.accumulate(bad[::-1])[::-1]
        good = np.nonzero(ok[:hi] & (next_bad[:hi] > 2 * ns[:hi]))[0]
        if good.size:
            return int(ns[good[0]])
        if hi >= NEED_MAX:
            return None
        hi = min(4 * hi, NEED_MAX)


@dataclass(frozen=True)
class Pooled:
    """The pooled test of one configuration's repeats (`pool`; docs/LOSSLESS.md, "The rule").

    `repeats`: runs pooled; `prompts`: prompts compared in every repeat (n); `requests` /
    `diverged`: requests compared and diverged over all repeats (N, D); `systematic`: (prompt
    index, position) of the prompts that diverged in every repeat at the same first-divergence
    position (S = its length); `q`: the floor's rate (None: no floor); `p_systematic` =
    P(Bin(n, q ** repeats) >= S), `p_pooled` = P(Bin(N, q) >= D); `p_value`: the smaller,
    Bonferroni-adjusted (x 2 with two or more repeats, at most 1); `power`: `systematic_power` at
    n; `need`: `prompts_needed` (None: enough, or not within NEED_MAX); `verdict`: LOSSLESS,
    BEYOND_FLOOR, DIFFERS (divergence, no floor) or INCONCLUSIVE."""

    verdict: str
    repeats: int
    prompts: int
    requests: int
    diverged: int
    systematic: tuple[tuple[int, int], ...]
    q: float | None
    p_systematic: float | None
    p_pooled: float | None
    p_value: float | None
    power: float
    need: int | None


def pool(runs: Sequence[Sequence[tuple[tuple, OutputMatch]]], q: float | None, alpha: float = ALPHA,
         effect: float = EFFECT, power: float = POWER) -> Pooled:
    """The verdict over a configuration's repeats. `runs`: per repeat, (prompt key, OutputMatch)
    of its compared requests (identical or diverged; the key names the same prompt across
    repeats: (prompt hash, occurrence)); `q`: the AR floor's divergence rate (None: no floor).

    Null hypothesis: the configuration is lossless, so each of its requests diverges from AR
    only as AR diverges from AR, independently between repeats (batch-variant numerics move with
    the batch), with probability at most q. Then S (prompts diverging in every repeat at the same
    position, among the n compared in every repeat) is at most Bin(n, q ** R) and D (diverged
    requests of N) at most Bin(N, q). Rejected (BEYOND_FLOOR) when the adjusted p < alpha; with
    q = 0 any divergence rejects; with no floor any divergence is DIFFERS. Not rejected: LOSSLESS
    when the systematic test's power at n reaches `power` against `effect`, else INCONCLUSIVE
    with the prompts needed. Pure."""
    r = len(runs)
    per = [dict(ms) for ms in runs]
    n_req = sum(len(d) for d in per)
    d_req = sum(1 for d in per for m in d.values() if m.status == "diverged")
    common = set(per[0]).intersection(*per[1:]) if per else set()
    systematic = []
    for key in sorted(common, key=lambda k: per[0][k].index):
        ms = [d[key] for d in per]
        if all(m.status == "diverged" for m in ms) and len({m.first_divergence for m in ms}) == 1:
            systematic.append((ms[0].index, ms[0].first_divergence))
    n = len(common)
    q_power = q if q is not None else 0.0
    pw = float(systematic_power(n, r, q_power, effect, alpha)) if n else 0.0
    need = None if pw >= power else prompts_needed(r, q_power, effect, alpha, power)
    p_sys = p_pool = p = None
    if q is None:
        verdict = DIFFERS if d_req else (LOSSLESS if pw >= power else INCONCLUSIVE)
    else:
        p_sys = float(binom.sf(len(systematic) - 1, n, _null_rate(r, q))) if n else 1.0
        p_pool = float(binom.sf(d_req - 1, n_req, q)) if n_req else 1.0
        p = min(1.0, (2 if r >= 2 else 1) * min(p_sys, p_pool))
        verdict = BEYOND_FLOOR if p < alpha else LOSSLESS if pw >= power else INCONCLUSIVE
    return Pooled(verdict, r, n, n_req, d_req, tuple(systematic), q, p_sys, p_pool, p, pw,
                  need if verdict == INCONCLUSIVE else None)


#: What `_load_or_mark` returns for a run whose outputs could not be read (its verdict is set).
_UNREADABLE_RUN = object()


def _load_or_mark(load, run_id: int, out: dict):
    """`load(run_id)` (a run's outputs, or None when none were kept); when it raises ValueError
    (a blob that does not decode), set the run's verdict in `out` to not checked, outputs
    unreadable, and return `_UNREADABLE_RUN`."""
    try:
        return load(run_id)
    except ValueError as exc:
        out[run_id] = not_checked(UNREADABLE, why=str(exc))
        return _UNREADABLE_RUN
