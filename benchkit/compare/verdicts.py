"""Verdicts (issue 18; MEASUREMENT.md "Comparing runs"; docs/VERDICTS.md): which speedup a page
shows, which points may feed a verdict, and when a configuration may be named the winner.
Pure rules over points (benchkit.point.Point) and speedups (benchkit.compare.speedups.Speedup);
Django-free. analysis.dashboard and analysis.history call them; every constant is here.

**Which speedup** (`figure_for`): *decode speedup* (median TPOT of the baseline / that of the
configuration; equal by construction to tau / relative step cost) or *end-to-end speedup*
(output tok/s ratio; folds in TTFT). The page's choice is `decode`, `e2e` or `auto` (the
default: decode at concurrency 1, end-to-end above it). Where the two differ by more than
DIFFER_SHARE, `ttft_note` says that TTFT (and scheduling) moved.

**Excluded points** (`exclusion_reason`): a point whose figures are degenerate never feeds a
headline, a verdict or the decomposition; figures draw it hollow with the reason:

- median TPOT of 0 ms (more than half of the requests delivered every token in their first
  message: no decoding step was timed);
- a window shorter than MIN_WINDOW_S seconds;
- fewer than MIN_COMPLETED_REQUESTS completed requests (a median of one or two requests);
- a suspect mark that invalidates timing (EXCLUDING_MARKS: `client_saturated`, `client_stalled`,
  `telemetry_gap`): the figures may measure the client or a stalled host, not the server.

A figure that is unknown (None, or not loaded on the point) is not degenerate: unknown is not 0.

**Winners only beyond noise** (`verdict`): the configurations of one cell (TP, concurrency,
output length), the baseline included (its ratio is 1 against itself), ranked by the chosen
speedup. The fastest is named the winner only when both it and the runner-up have a 95 %
bootstrap interval (MIN_REPEATS_FOR_CI repeats on each side) and the winner's lower bound lies
above the runner-up's upper bound; with intervals that overlap, the configurations whose
interval overlaps the fastest one's "tie within noise"; with single runs there is no verdict
("single runs: no verdict") and the ranking is shown greyed; with 2 repeats, likewise ("fewer than
3 repeats: no verdict"). A winner whose outputs differ from AR's keeps its lossless mark
(benchkit.compare.lossless.lossless_mark) in the sentence: never named fastest without it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from benchkit.compare.lossless import LosslessMark, lossless_mark
from benchkit.compare.speedups import DECODE, END_TO_END, MIN_REPEATS_FOR_CI, Speedup, SpeedupFigure
from benchkit.compare.stats import median_ratio_cis
from benchkit.measure.validity import TIMING_CODES
from benchkit.point import Point

#: A window shorter than this (seconds) is too short for its figures to mean anything.
MIN_WINDOW_S = 1.0
#: Fewer completed requests than this: the medians are one or two requests' figures.
MIN_COMPLETED_REQUESTS = 4
#: Suspect marks (the code before ':' in Run.suspect_reasons) that invalidate a point's timing:
#: benchkit.measure.validity.TIMING_CODES plus the GPU sampler's own gaps (a stalled host).
EXCLUDING_MARKS = TIMING_CODES | {"telemetry_gap"}
#: Decode and end-to-end speedups differing by more than this share: "TTFT moved".
DIFFER_SHARE = 0.10
#: The point figures the exclusion rules read (a page loads them with its figures).
EXCLUSION_FIGURES = ("median_tpot_ms", "duration_s", "completed")

#: The `speedup` choices of a page (query parameter) and what each shows.
AUTO_CHOICE, DECODE_CHOICE, E2E_CHOICE = "auto", "decode", "e2e"
SPEEDUP_CHOICES: dict[str, str] = {
    AUTO_CHOICE: "decode speedup at concurrency 1, end-to-end speedup above it (default)",
    DECODE_CHOICE: "decode speedup everywhere (AR median TPOT / median TPOT)",
    E2E_CHOICE: "end-to-end speedup everywhere (output tok/s ratio)",
}

#: Verdict kinds.
WINNER, TIE, SINGLE, FEW, NONE = "winner", "tie", "single", "few", "none"


def mark_codes(p: Point) -> list[str]:
    """The codes of a point's suspect marks (`Point.suspect_reasons`, each "code: message")."""
    return [str(r).split(":", 1)[0].strip() for r in (p.suspect_reasons or ())]


def exclusion_reason(p: Point) -> str:
    """Why point `p` may not feed a verdict (the module docstring's rules, each that applies,
    joined by '; '), or '' when it may. Reads `median_tpot_ms`, `duration_s`, `completed` (an
    unknown or unloaded figure is not degenerate) and the suspect marks."""
    tpot, window, done = (getattr(p, "median_tpot_ms", None), getattr(p, "duration_s", None),
                          getattr(p, "completed", None))
    if (not p.suspect_reasons and (tpot is None or tpot > 0) and (window is None or window >= MIN_WINDOW_S)
            and (done is None or done >= MIN_COMPLETED_REQUESTS)):
        return ""  # the common case, read first: a page asks this of thousands of points
    why = []
    if tpot is not None and tpot <= 0:
        why.append("median TPOT 0 ms (most requests got every token in their first message: no decoding step "
                   "was timed)")
    if window is not None and window < MIN_WINDOW_S:
        why.append(f"window {window:.2f} s, shorter than the minimum {MIN_WINDOW_S:g} s")
    if done is not None and done < MIN_COMPLETED_REQUESTS:
        why.append(f"{done} completed request{'s' if done != 1 else ''}, fewer than the minimum "
                   f"{MIN_COMPLETED_REQUESTS}")
    marks = [c for c in mark_codes(p) if c in EXCLUDING_MARKS]
    if marks:
        why.append(f"suspect mark{'s' if len(marks) > 1 else ''} {', '.join(dict.fromkeys(marks))} (timing not "
                   "the server's)")
    return "; ".join(why)


def split_excluded(points: Iterable[Point]) -> tuple[list[Point], dict[int, str]]:
    """(the points that may feed a verdict, {run id: exclusion reason} of the others), in order."""
    kept, excluded = [], {}
    for p in points:
        why = exclusion_reason(p)
        if why:
            excluded[p.run_id] = why
        else:
            kept.append(p)
    return kept, excluded


def excluded_line(points: Sequence[Point], excluded: Mapping[int, str], limit: int = 6) -> str:
    """The page's "excluded" line: '' when nothing is excluded, else e.g. "Excluded from verdicts
    and figures: 1 run: run 12 (ngram k=4, TP1, concurrency 1): median TPOT 0 ms (...)." (at
    most `limit` runs named, the count covers all)."""
    out = [p for p in points if p.run_id in excluded]
    if not out:
        return ""
    parts = [f"run {p.run_id} ({p.label}, TP{p.tp}, concurrency {p.concurrency}): {excluded[p.run_id]}"
             for p in out[:limit]]
    more = f"; and {len(out) - limit} more" if len(out) > limit else ""
    return (f"Excluded from verdicts and the decomposition (drawn hollow): {len(out)} run{'s' if len(out) > 1 else ''}"
            f" — " + "; ".join(parts) + more + ".")


def figure_for(choice: str, concurrency: int | None) -> SpeedupFigure:
    """The speedup a page shows for `choice` (SPEEDUP_CHOICES) at `concurrency`: DECODE or
    END_TO_END; `auto` gives DECODE at concurrency 1 (or unknown) and END_TO_END above it.
    Raises ValueError for another choice."""
    if choice == DECODE_CHOICE:
        return DECODE
    if choice == E2E_CHOICE:
        return END_TO_END
    if choice == AUTO_CHOICE:
        return END_TO_END if concurrency is not None and concurrency > 1 else DECODE
    raise ValueError(f"unknown speedup choice {choice!r} (known: {', '.join(SPEEDUP_CHOICES)})")


def choice_sentence(choice: str) -> str:
    """What the page says it shows, e.g. "Speedups shown: decode speedup at concurrency 1, ..."."""
    return f"Speedups shown: {SPEEDUP_CHOICES[choice]}."


def ttft_note(sp: Speedup, ttft_ms: float | None = None, baseline_ttft_ms: float | None = None) -> str:
    """'' unless both speedups of `sp` are known and differ by more than DIFFER_SHARE (relative to
    the decode speedup); then which part moved, e.g. "decode 1.45× vs end-to-end 0.90×: TTFT moved
    (median TTFT 21 ms vs 138 ms for auto)". `sp` needs both ratios (compute_speedups with
    figures=(END_TO_END, DECODE))."""
    d, e = sp.ratios.get(DECODE.name), sp.ratios.get(END_TO_END.name)
    if d is None or e is None or d.value is None or e.value is None or d.value <= 0:
        return ""
    if abs(e.value - d.value) / d.value <= DIFFER_SHARE:
        return ""
    text = f"decode {d.value:.2f}× vs end-to-end {e.value:.2f}×: TTFT moved"
    if ttft_ms is not None and baseline_ttft_ms is not None:
        text += f" (median TTFT {ttft_ms:.0f} ms vs {baseline_ttft_ms:.0f} ms for {sp.baseline})"
    return text


@dataclass(frozen=True)
class Candidate:
    """One configuration of a verdict's cell: its label, the chosen speedup `value` (×) and its
    95 % interval `ci95` (None without MIN_REPEATS_FOR_CI repeats on each side), its repeats, its
    Speedup, and its lossless mark (None unless its outputs differ from AR's)."""

    label: str
    value: float
    ci95: tuple[float, float] | None
    n_repeats: int
    speedup: Speedup
    mark: LosslessMark | None = None

    @property
    def run_ids(self) -> list[int]:
        return self.speedup.run_ids


@dataclass
class Verdict:
    """The verdict of one cell: `kind` (WINNER, TIE, SINGLE, FEW, NONE), the speedup `figure`
    it ranks by, the `ranking` (fastest first), the `winner` (WINNER only), the configurations
    that `tied` (TIE: the fastest and those whose interval overlaps its interval), and the
    `sentence` a page prints. `greyed`: the ranking is shown but names no winner."""

    kind: str
    figure: SpeedupFigure
    ranking: list[Candidate] = field(default_factory=list)
    winner: Candidate | None = None
    tied: list[Candidate] = field(default_factory=list)
    sentence: str = ""

    @property
    def greyed(self) -> bool:
        return self.kind in (SINGLE, FEW)

    @property
    def top(self) -> Candidate | None:
        """The fastest configuration measured (named a winner only when kind is WINNER)."""
        return self.ranking[0] if self.ranking else None


def _article(noun: str) -> str:
    """'an' before a vowel ("an end-to-end speedup"), else 'a'."""
    return "an" if noun[:1].lower() in "aeiou" else "a"


def _names(cands: Sequence[Candidate], limit: int = 3) -> str:
    labels = [c.label + (f" {c.mark.symbol}" if c.mark else "") for c in cands[:limit]]
    if len(cands) > limit:
        labels.append(f"{len(cands) - limit} more")
    return ", ".join(labels[:-1]) + " and " + labels[-1] if len(labels) > 1 else labels[0]


def verdict(speedups: Iterable[Speedup], figure: SpeedupFigure,
            points_by_run: Mapping[int, Point] | None = None) -> Verdict:
    """The verdict over the Speedups of one cell (the baseline's own included), ranked by
    `figure`'s ratio (the Speedups must carry it), by the rules of the module docstring.
    `points_by_run` gives the lossless marks (none without it). Speedups without a number take
    no part; NONE when fewer than two have one."""
    ranking = []
    for sp in speedups:
        r = sp.ratios.get(figure.name)
        if r is None or r.value is None:
            continue
        mark = lossless_mark([points_by_run[i] for i in sp.run_ids if i in points_by_run]) if points_by_run else None
        ranking.append(Candidate(sp.label, r.value, r.ci95, sp.n_repeats, sp, mark))
    ranking.sort(key=lambda c: -c.value)
    out = Verdict(NONE, figure, ranking)
    if len(ranking) < 2:
        title = figure.title
        out.sentence = "nothing to compare: " + (f"only {ranking[0].label} has {_article(title)} {title}" if ranking
                                                 else f"no {title}")
        return out
    a, b = ranking[0], ranking[1]
    if a.ci95 is None or b.ci95 is None:
        counts = (a.n_repeats, b.n_repeats, *(len(c.speedup.baseline_run_ids) or 1 for c in (a, b)))
        out.kind = SINGLE if min(counts) == 1 else FEW
        # "single runs" only where every side has one run (issue 31: two repeats were called single)
        out.sentence = ("single runs: no verdict" if max(counts) == 1
                        else f"fewer than {MIN_REPEATS_FOR_CI} repeats: no verdict")
        return out
    if a.ci95[0] > b.ci95[1]:
        out.kind, out.winner = WINNER, a
        out.sentence = (f"{a.label} is fastest: {figure.title} {a.value:.2f}× (95% CI {a.ci95[0]:.2f}–{a.ci95[1]:.2f}),"
                        f" separated from {b.label} ({b.ci95[0]:.2f}–{b.ci95[1]:.2f})")
        if a.mark:
            out.sentence += f"; {a.mark.symbol} {a.mark.text}"
        return out
    out.kind = TIE
    out.tied = [c for c in ranking if c.ci95 is not None and c.ci95[1] >= a.ci95[0]]
    out.sentence = f"{_names(out.tied)} tie within noise ({figure.title}, overlapping 95% CIs)"
    return out


def separated(a: Sequence[float], b: Sequence[float]) -> bool | None:
    """Whether the values `a` are faster than `b` beyond noise: the 95 % bootstrap interval of
    median(a) / median(b) lies above 1 (benchkit.compare.stats.median_ratio_cis). None when
    either side has fewer than MIN_REPEATS_FOR_CI values (no interval: no verdict)."""
    if len(a) < MIN_REPEATS_FOR_CI or len(b) < MIN_REPEATS_FOR_CI:
        return None
    lo, _ = median_ratio_cis([list(a)], [list(b)])[0].tolist()
    return bool(lo > 1.0)
