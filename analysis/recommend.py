"""What to run next (issue 20): the fitted cost model (benchkit.compare.costmodel) over a sweep's
stored points, per TP and concurrency; no queries here.

Groups are (host, GPU model, TP, engine build, model, input and output length) x concurrency B,
as the cost model wants them: TPOT grows with the context, so a relative step cost is only
measured against the AR runs of the same workload shape. Where a TP has several groups (a grid
over output or input lengths, several hosts) the one with the most runs is fitted, ties going
to the longest output and then the longest input (the headline reads the longest output too);
a note names it, and the page's output-length filter picks another. At a measured B the group
is fitted on its own (`recommend`); at a B the sweep never measured the cost is fitted on the
group's measured concurrencies pooled (`fit_pooled_step_cost`) and the acceptance from all its
points. The knee is the roofline ridge of the group (analysis.ceilings) where the GPU and model
are known, else a single line.

`recommend_for(points, inputs, tp, concurrency)` returns a `PanelEntry` (the ranking or why
there is none); `panel(points, inputs)` one entry per measured (TP, B); `sweep_file_for(...)`
the YAML of the top candidates to measure next.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from analysis.ceilings import ceiling_of
from benchkit.compare.costmodel import (
    CostModelError,
    MeasuredPoint,
    Prediction,
    Recommendation,
    fit_pooled_step_cost,
    recommend,
)
from benchkit.methods import METHODS

#: The figures the cost model reads from each point: the sweep page's "what to run" panel and
#: `manage.py recommend` load exactly these (issue 32: the panel once lacked the per-position
#: acceptance the command fitted, and the two ranked differently).
POINT_FIELDS = ("median_tpot_ms", "acceptance_length", "per_position_acceptance_rate")

#: How many candidates the panel and the command list per (TP, B).
TOP = 5


def _draft_tokens(p) -> int:
    if p.method == "auto":
        return 0
    return (p.tree_budget if METHODS.get(p.method) and METHODS[p.method].needs_budget else
            p.num_speculative_tokens) or 0


def _drafter_k(p, inputs) -> int:
    """k of a chain method that names none (DFlash linear drafts its block): the stored drafter
    config's block_size - 1; 0 when unknown."""
    cfg = (inputs.configs.get(p.drafter) if inputs is not None and p.drafter else None) or {}
    dflash = cfg.get("dflash_config") if isinstance(cfg.get("dflash_config"), dict) else {}
    block = dflash.get("block_size", cfg.get("block_size"))
    return block - 1 if isinstance(block, int) and block >= 2 else 0


def measured_point(p, inputs=None) -> MeasuredPoint | None:
    """The cost-model input of a benchkit.point.Point (None without a median TPOT, a speculative
    point without tau, or a chain method whose k is not known: neither set nor in a stored
    drafter config)."""
    tpot, tau = getattr(p, "median_tpot_ms", None), getattr(p, "acceptance_length", None)
    if not tpot or (p.method != "auto" and (tau is None or tau < 1)) or not p.concurrency:
        return None
    k = _draft_tokens(p) or (_drafter_k(p, inputs) if p.method != "auto" else 0)
    if p.method != "auto" and not k:
        return None
    rates = tuple(getattr(p, "per_position_acceptance_rate", None) or ())
    return MeasuredPoint(p.method, k, p.concurrency, float(tpot), tau if p.method != "auto" else None,
                         rates, label=p.label)


@dataclass
class PanelEntry:
    """One (TP, B) of the panel: the ranking (`rec`, None with `error`), whether B was measured,
    the group's configuration in words and notes."""

    tp: int
    concurrency: int
    measured: bool
    rec: Recommendation | None = None
    error: str = ""
    notes: list[str] = field(default_factory=list)
    #: the fitted group's workload shape (tokens; None where the points do not say)
    input_len: int | None = None
    output_len: int | None = None

    @property
    def top(self) -> list[Prediction]:
        """The TOP best candidates."""
        return list(self.rec.predictions[:TOP]) if self.rec else []

    @property
    def measured_outside(self) -> list[Prediction]:
        """Measured configurations whose measurement falls outside their predicted interval."""
        return [p for p in self.rec.predictions if p.outside_interval] if self.rec else []


def _knee(points, inputs, concurrency: int) -> float | None:
    """The roofline ridge at B (tokens per step) of the group's first point, None where no ceiling."""
    if inputs is None or not points:
        return None
    p = points[0]
    answer = ceiling_of(gpu_names=p.gpu_names, model=p.model, drafter=p.drafter, tp=p.tp, concurrency=concurrency,
                        draft_tokens=0, input_len=p.input_len, output_len=p.output_len, tau=None, tpot_ms=None,
                        inputs=inputs, host_id=p.host_id)
    return answer.ceiling.ridge_tokens_per_step if answer.ceiling else None


def _groups(points) -> dict[tuple, dict[int, list]]:
    """{(host, GPU names, TP, build, model, input length, output length): {B: [Point]}}."""
    out: dict[tuple, dict[int, list]] = defaultdict(lambda: defaultdict(list))
    for p in points:
        if p.concurrency:
            out[(p.host_id, tuple(sorted(set(p.gpu_names))), p.tp, p.engine_build, p.model, p.input_len,
                 p.output_len)][p.concurrency].append(p)
    return out


def _fitted_first(kv: tuple[tuple, dict[int, list]]) -> tuple:
    """Sort key of a group: its number of runs, then its output and input length (module doc)."""
    key, by_b = kv
    return sum(len(v) for v in by_b.values()), key[6] or 0, key[5] or 0


def _shape(input_len: int | None, output_len: int | None) -> str:
    """A workload shape in words ('?' for a length the points do not say)."""
    def said(n: int | None) -> str:
        return "?" if n is None else str(n)
    return f"input {said(input_len)}, output {said(output_len)} tokens"


def recommend_for(points, inputs, tp: int, concurrency: int, grouped: dict | None = None) -> PanelEntry:
    """The ranking at (TP, B) from `points` (benchkit.point.Points with median_tpot_ms and
    acceptance_length; several hosts or models: the group with the most points at this TP).
    `grouped`: `_groups(points)` when the caller already has it (panel asks once per page)."""
    grouped = _groups(points) if grouped is None else grouped
    groups = [(key, by_b) for key, by_b in grouped.items() if key[2] == tp]
    if not groups:
        return PanelEntry(tp, concurrency, False, error=f"no counted run at TP {tp}")
    key, by_b = max(groups, key=_fitted_first)
    shape = {"input_len": key[5], "output_len": key[6]}
    notes = [] if len(groups) == 1 else [
        f"{len(groups)} groups at TP {tp} (hosts, GPUs, builds, models or workload shapes): fitted on the one with "
        f"the most runs, {_shape(key[5], key[6])}; another output length: the page's filter or --output-len"]
    all_pts = [p for ps in by_b.values() for p in ps]
    try:
        if concurrency in by_b:
            mps = [m for m in (measured_point(p, inputs) for p in by_b[concurrency]) if m]
            rec = recommend(mps, knee_tokens_per_step=_knee(by_b[concurrency], inputs, concurrency))
            return PanelEntry(tp, concurrency, True, rec, notes=notes + list(rec.notes), **shape)
        per_b = [[m for m in (measured_point(p, inputs) for p in ps) if m] for _, ps in sorted(by_b.items())]
        cost = fit_pooled_step_cost(per_b, concurrency, lambda b: _knee(all_pts, inputs, b))
        rec = recommend([m for g in per_b for m in g], cost_fit=cost)
        return PanelEntry(tp, concurrency, False, rec, notes=notes + list(rec.notes), **shape)
    except CostModelError as exc:
        return PanelEntry(tp, concurrency, concurrency in by_b, error=str(exc), notes=notes, **shape)


def panel(points, inputs) -> list[PanelEntry]:
    """One entry per measured (TP, B) of `points`, TP then B ascending."""
    pairs = sorted({(p.tp, p.concurrency) for p in points if p.concurrency})
    grouped = _groups(points)
    return [recommend_for(points, inputs, tp, b, grouped) for tp, b in pairs]


def _interval(e) -> str:
    return f"[{e.low:.2f}, {e.high:.2f}]" if e.low is not None else "no interval"


def entry_rows(entry: PanelEntry) -> list[dict[str, Any]]:
    """Rows of the panel / command table: the TOP candidates, then every measured speculative
    configuration beside its prediction: label, V, predicted tau, relative cost, speedup with
    interval, measured speedup, and marks (outside the interval, extrapolated, tied with the best)."""
    rows = []
    measured = [p for p in entry.rec.predictions if p.measured_speedup is not None and p.method != "auto"] \
        if entry.rec else []
    preds = entry.top + [p for p in measured if p not in entry.top]
    for p in preds:
        rows.append({"label": p.label, "verified_tokens_per_step": p.verified_tokens_per_step,
                     "tau": p.tau.value, "relative_cost": p.relative_cost.value, "speedup": p.speedup.value,
                     "interval": _interval(p.speedup), "measured_speedup": p.measured_speedup,
                     "outside_interval": bool(p.outside_interval), "extrapolated": p.extrapolated,
                     "overlaps_best": p.overlaps_best})
    return rows


def format_entry(entry: PanelEntry) -> str:
    """Plain-text table of one entry (manage.py recommend)."""
    head = f"TP {entry.tp}, concurrency {entry.concurrency} ({'measured' if entry.measured else 'not measured'})"
    if entry.rec is None:
        return f"{head}: no prediction: {entry.error}"
    lines = [head, f"{'config':<16}{'V':>6}{'tau':>7}{'cost':>7}{'speedup':>9}  {'95% interval':<16}{'measured':>9}  "
             "marks"]
    for r in entry_rows(entry):
        marks = [m for m, on in (("OUTSIDE interval", r["outside_interval"]), ("extrapolated", r["extrapolated"]),
                                 ("ties the top row within noise", r["overlaps_best"])) if on]
        meas = f"{r['measured_speedup']:.2f}" if r["measured_speedup"] is not None else "-"
        lines.append(f"{r['label']:<16}{r['verified_tokens_per_step']:>6}{r['tau']:>7.2f}{r['relative_cost']:>7.2f}"
                     f"{r['speedup']:>9.2f}  {r['interval']:<16}{meas:>9}  {', '.join(marks)}")
    if entry.rec.best.extrapolated:
        b = entry.rec.best_within_range
        lines.append("top prediction within what was measured (a prediction, not a verdict): "
                     f"{b.label} {b.speedup.value:.2f} {_interval(b.speedup)}")
    lines += [f"note: {n}" for n in entry.notes]
    return "\n".join(lines)


def candidate_points(entry: PanelEntry, n: int = 3) -> list[dict[str, Any]]:
    """The top `n` speculative candidates not measured at this (TP, B), as sweep-file method
    tokens: [{"method", "k" or "tree_budget"}]."""
    out = []
    for p in entry.rec.predictions if entry.rec else []:
        if p.method == "auto" or p.measured_speedup is not None:
            continue
        info = METHODS.get(p.method)
        out.append({"method": p.method, ("tree_budget" if info and info.needs_budget else "k"): p.draft_tokens,
                    "label": p.label})
        if len(out) == n:
            break
    return out


def sweep_file_for(sweep_spec: dict[str, Any], entry: PanelEntry, n: int = 3) -> dict[str, Any]:
    """A sweep file (as a dict in the sweep-file layout, Sweep.spec) that measures the top `n`
    unmeasured candidates of `entry` at its TP and concurrency, beside `auto` (the baseline),
    keeping the sweep's other settings and each method's options. Raises ValueError when there
    is no candidate left to measure."""
    cands = candidate_points(entry, n)
    if not cands:
        raise ValueError(f"TP {entry.tp}, concurrency {entry.concurrency}: every ranked candidate is measured")
    spec = {k: v for k, v in sweep_spec.items()}
    grid = dict(spec.get("grid") or {})
    options: dict[str, dict[str, Any]] = {}
    for m in grid.get("methods") or []:
        if isinstance(m, dict):
            options[m["method"]] = {k: v for k, v in m.items() if k not in ("method", "tree_budget",
                                                                          "num_speculative_tokens")}
    methods: list[Any] = ["auto"]
    for c in cands:
        item = {"method": c["method"], **options.get(c["method"], {})}
        item["tree_budget" if "tree_budget" in c else "num_speculative_tokens"] = c.get("tree_budget", c.get("k"))
        methods.append(item)
    grid.update(tp=[entry.tp], concurrency=[entry.concurrency], methods=methods)
    for axis in ("output_len", "input_len"):  # the workload shape the model was fitted on
        if getattr(entry, axis) is not None:
            grid[axis] = [getattr(entry, axis)]
    spec["grid"] = grid
    spec["name"] = f"{sweep_spec.get('name', 'sweep')}-next-tp{entry.tp}-c{entry.concurrency}"
    spec["description"] = (f"Top {len(cands)} candidates of the cost model at TP {entry.tp}, concurrency "
                           f"{entry.concurrency} (manage.py recommend): {', '.join(c['label'] for c in cands)}")
    return spec


def panel_context(points, inputs) -> list[dict[str, Any]]:
    """The sweep page's panel: per measured (TP, B) {tp, concurrency, rows (entry_rows), error,
    notes, best_in_range (label and speedup of the best non-extrapolated candidate when the best
    is an extrapolation)}."""
    out = []
    for e in panel(points, inputs):
        best_in_range = ""
        if e.rec is not None and e.rec.best.extrapolated:
            b = e.rec.best_within_range
            best_in_range = f"{b.label} {b.speedup.value:.2f}x {_interval(b.speedup)}"
        out.append({"tp": e.tp, "concurrency": e.concurrency, "rows": entry_rows(e), "error": e.error,
                    "notes": e.notes, "best_in_range": best_in_range})
    return out
