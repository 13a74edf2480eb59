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
- **Rule** (`beyond_floor`): with `n` requests compared and `d` diverged, the spec run differs
  beyond the floor when the one-sided binomial tail P(X >= d | n, q) < ALPHA (0.05): more
  divergences than AR's own rate explains. With q = 0 (the AR runs agreed on every compared
  request) any divergence is beyond the floor. With no floor (fewer than two comparable `auto`
  runs) a divergence is `differs` ("no AR noise floor to judge it against").

Verdicts (`Verdict.verdict`): `lossless` (no divergence, or within the floor), `beyond_floor`,
`differs`, `not_checked` with a reason code of NOT_CHECKED (sampling, no baseline, outputs not
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

from scipy.stats import binom

from benchkit.compare.stats import median
from benchkit.measure.outputs import OutputMatch, RunOutputs, compare_outputs
from benchkit.point import MATCH_FIELDS, Point

#: The baseline configuration's label (benchkit.methods: autoregressive decoding).
AUTO = "auto"
#: Verdict codes.
LOSSLESS, BEYOND_FLOOR, DIFFERS, NOT_CHECKED = "lossless", "beyond_floor", "differs", "not_checked"
VERDICTS = (LOSSLESS, BEYOND_FLOOR, DIFFERS, NOT_CHECKED)
#: Verdicts that put a mark on a figure's cell and a headline's winner: not shown lossless.
MARKED = (BEYOND_FLOOR, DIFFERS)
#: The mark drawn beside a speedup of a configuration whose outputs differ from AR's.
MARK = "≠"
#: A verdict in a few words (tables), most severe first.
SHORT = {BEYOND_FLOOR: f"{MARK} beyond AR floor", DIFFERS: f"{MARK} differs (no floor)",
         NOT_CHECKED: "not checked", LOSSLESS: "lossless"}
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
NOT_CHECKED_REASONS: dict[str, str] = {
    SYNTHETIC_ACCEPTANCE: "synthetic acceptance: the outputs are forced, not the model's (not lossless by design)",
    IMPORTED: "imported file: no outputs kept",
    SAMPLING: "sampling (temperature {temperature:g}): outputs are random, only temperature 0 compares",
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


def judge(outputs: RunOutputs, baselines: Sequence[tuple[int, RunOutputs]], floor: Floor | None,
          alpha: float = ALPHA) -> Verdict:
    """The verdict of one spec run's `outputs` against its matched `auto` runs' `baselines`
    ((run id, outputs), at least one) and the AR noise `floor` of its floor key (None or empty:
    no floor), by the rule of the module docstring. Pure."""
    base_ids = tuple(i for i, _ in baselines)
    matches = combine([compare_outputs(outputs, b, by="prompt") for _, b in baselines])
    div = [m for m in matches if m.status == "diverged"]
    ident = sum(1 for m in matches if m.status == "identical")
    n_nc = sum(1 for m in matches if m.status == "not_comparable")
    n = ident + len(div)
    if not n:
        reasons = sorted({m.reason for m in matches if m.reason}) or ["no prompt in common"]
        v = not_checked(NOT_COMPARABLE, why="; ".join(reasons[:2]))
        return Verdict(**{**v.to_dict(), "not_comparable": n_nc, "baseline_run_ids": base_ids})
    units = {m.unit for m in matches if m.unit}
    unit = units.pop() if len(units) == 1 else None
    exact = all(m.precision == "exact" for m in div)
    block = next((m.block for m in div if m.precision == "block"), None)
    share = ident / n
    med = median([m.first_divergence for m in div])
    fl_share = floor.identical_share if floor else None
    fl_q = floor.divergence_rate if floor else None
    word = "character" if unit == "char" else "token"
    on_text = "; compared on text: the engine returns no token ids" if unit == "char" else ""
    floor_words = (f"AR vs AR {_pct(fl_share)} identical ({len(floor.pairs)} pair{'s' * (len(floor.pairs) != 1)})"
                   if floor and fl_share is not None else "")
    p_value = None
    if not div:
        verdict = LOSSLESS
        sentence = f"lossless: all {n} requests identical to the auto run's output"
    else:
        at = f"first divergence median at {word} {med:g}" + ("" if exact else f" (to the block of {block})")
        differ = f"{_pct(1 - share)} of requests, {at}"
        if fl_q is None:
            verdict = DIFFERS
            sentence = (f"differs from AR ({differ}); no AR noise floor to judge it against (needs a second "
                        "comparable auto run: a repeat or another concurrency)")
        else:
            p_value = float(binom.sf(len(div) - 1, n, fl_q))
            if p_value < alpha:
                verdict = BEYOND_FLOOR
                sentence = (f"differs beyond the AR noise floor ({differ}); {floor_words}"
                            + (f", p = {p_value:.2g}" if fl_q else ": AR never differed from AR"))
            else:
                verdict = LOSSLESS
                sentence = (f"lossless within the AR noise floor: {ident} of {n} requests identical "
                            f"({_pct(share)}, {at}); {floor_words}, p = {p_value:.2g}")
    if verdict == LOSSLESS and not div and floor_words:
        sentence += f"; {floor_words}"
    if n_nc:
        sentence += f"; {n_nc} request{'s' * (n_nc != 1)} not comparable"
    return Verdict(
        verdict, sentence + on_text, "", n, ident, n_nc, share, med, unit, "exact" if exact else "block",
        block, tuple((m.index, m.first_divergence) for m in div[:MAX_DIVERGENCES]), base_ids,
        floor.run_ids if floor else (), tuple((p.run_a, p.run_b, p.compared, p.identical) for p in floor.pairs)
        if floor else (), fl_share, p_value)


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
        todo = []
        for p in spec:
            if p.run_id in synthetic:
                out[p.run_id] = not_checked(SYNTHETIC_ACCEPTANCE)
            elif p.run_id in imported:
                out[p.run_id] = not_checked(IMPORTED)
            elif p.temperature:
                out[p.run_id] = not_checked(SAMPLING, temperature=p.temperature)
            else:
                todo.append(p)
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
        for p in todo:
            base_ids = auto_by_match.get(p.match_key(), [])
            if not base_ids:
                out[p.run_id] = not_checked(NO_BASELINE)
                continue
            bases = [(i, ar[i]) for i in base_ids if ar.get(i) is not None]
            if not bases:
                v = not_checked(BASELINE_NOT_KEPT, runs=", ".join(map(str, base_ids)))
                out[p.run_id] = Verdict(**{**v.to_dict(), "baseline_run_ids": tuple(base_ids)})
                continue
            try:
                mine = load(p.run_id)
            except ValueError as exc:
                out[p.run_id] = not_checked(UNREADABLE, why=str(exc))
                continue
            if mine is None:
                out[p.run_id] = not_checked(NOT_KEPT)
                continue
            out[p.run_id] = judge(mine, bases, floor, alpha)
    return out


# -- what figures and headlines read --------------------------------------------------------------

@dataclass(frozen=True)
class LosslessMark:
    """A visible mark for a configuration that is not shown lossless: `symbol` (MARK) to put
    beside its number, `text` for its hover or footnote (the verdict's sentence; "k of n runs"
    when only some of a cell's repeats are marked), the `run_ids` marked."""

    symbol: str
    text: str
    run_ids: tuple[int, ...] = field(default=())


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
    verdict (`Point.lossless_verdict`) is in MARKED; else MARK with the first marked point's
    sentence. The one rule the heatmap and the headline use to mark a configuration whose
    outputs differ from AR's."""
    ps = [points] if isinstance(points, Point) else list(points)
    marked = [p for p in ps if p.lossless_verdict in MARKED]
    if not marked:
        return None
    text = f"not lossless: {marked[0].lossless_sentence}"
    if len(marked) < len(ps):
        text += f" ({len(marked)} of {len(ps)} runs)"
    return LosslessMark(MARK, text, tuple(p.run_id for p in marked))
