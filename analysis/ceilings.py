"""Decode-step ceilings of stored points, for pages and exports (issue 20, docs/CEILINGS.md); no
queries here: the GPU rows and config.json come in a `runs.ceilings.CeilingInputs`.

`ceiling_of(...)` computes one point's ceilings from its configuration (GPU names, model,
drafter, TP, concurrency B, k or tree budget, input and output lengths) and its measured tau and
median TPOT; `point_ceiling_row(point, inputs)` / `run_ceiling_row(run, inputs)` give the flat
dict a page or an export shows (CEILING_COLUMNS, None where unknown, and `ceiling_note` saying
why there is none). `ridge_figure(points, inputs)` is the sweep page's figure: verified tokens
per step B x (k + 1) (or B x (budget + 1)) against the ridge, per configuration.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from analysis import figures
from benchkit.ceilings.modelconfig import (
    DrafterFootprint,
    ModelConfigError,
    ModelFootprint,
    read_drafter_config,
    read_model_config,
)
from benchkit.ceilings.roofline import IGNORED, CeilingAnswer, DecodePoint, point_ceiling
from benchkit.methods import config_order

#: Flat columns of one point's ceilings (pages, CSV/JSON exports, compare rows), units in the names.
CEILING_COLUMNS = ("ceiling_memory_tok_s", "ceiling_compute_tok_s", "ceiling_binding", "ceiling_tok_s",
                   "ceiling_achieved_pct", "ceiling_ridge_tokens_per_step", "verified_tokens_per_step")
#: The column headers of the exports / pages.
CEILING_HEADERS = {
    "ceiling_memory_tok_s": "memory ceiling (tok/s)", "ceiling_compute_tok_s": "compute ceiling (tok/s)",
    "ceiling_binding": "binding ceiling", "ceiling_tok_s": "binding ceiling (tok/s)",
    "ceiling_achieved_pct": "achieved (% of binding ceiling)", "ceiling_ridge_tokens_per_step": "ridge (tokens/step)",
    "verified_tokens_per_step": "verified tokens/step",
}


def context_tokens(input_len: int | None, output_len: int | None) -> float | None:
    """Mean context per sequence while decoding: input length + half the output length (tokens);
    None when either is unknown."""
    if input_len is None or output_len is None:
        return None
    return input_len + output_len / 2


def _footprints(model: str, drafter: str, inputs, cache: dict) -> tuple[ModelFootprint | None,
                                                                          DrafterFootprint | None, str]:
    key = (model, drafter)
    if key in cache:
        return cache[key]
    target, draft, note = None, None, ""
    cfg = inputs.configs.get(model)
    if cfg is None:
        note = f"no config.json stored for model {model!r} (admin: Model configs): no ceiling"
    else:
        try:
            target = read_model_config(cfg)
        except ModelConfigError as exc:
            note = f"model config.json not readable: {exc}: no ceiling"
    if target is not None and drafter and drafter in inputs.configs:
        try:
            draft = read_drafter_config(inputs.configs[drafter], target)
        except ModelConfigError:
            draft = None
    cache[key] = (target, draft, note)
    return cache[key]


def ceiling_of(*, gpu_names: Iterable[str], model: str, drafter: str, tp: int, concurrency: int | None,
               draft_tokens: int, input_len: int | None, output_len: int | None, tau: float | None,
               tpot_ms: float | None, inputs, cache: dict | None = None,
               host_id: int | None = None) -> CeilingAnswer:
    """The ceilings of one point (benchkit.ceilings.roofline.point_ceiling), or no ceiling with a
    note: GPUs of several models or none, an unknown GPU, no stored config.json, an unknown
    concurrency or length. GPU names: the run's own, else its host's latest snapshot's
    (`inputs.host_gpus[host_id]`). `draft_tokens`: k, or the tree budget; 0 for autoregressive. `tau`
    is used only for a speculative point (>= 1)."""
    names = {n for n in gpu_names if n}
    if not names and host_id is not None and inputs.host_gpus.get(host_id):
        names = {inputs.host_gpus[host_id]}  # the run's GPU entries carry no name: its host's snapshot
    if len(names) != 1:
        return CeilingAnswer(None, "GPUs of several models: no ceiling" if names else "no GPU model recorded: "
                             "no ceiling")
    if not concurrency:
        return CeilingAnswer(None, "concurrency unknown: no ceiling")
    ctx = context_tokens(input_len, output_len)
    if ctx is None:
        return CeilingAnswer(None, "input or output length unknown: no ceiling")
    target, draft, note = _footprints(model, drafter, inputs, {} if cache is None else cache)
    if target is None:
        return CeilingAnswer(None, note)
    if draft_tokens and (tau is None or tau < 1):
        return CeilingAnswer(None, "acceptance length tau unknown: no ceiling for a speculative point")
    point = DecodePoint(concurrency, draft_tokens, ctx, tp=tp or 1, tau=tau if draft_tokens else None)
    return point_ceiling(names.pop(), target, point, rows=inputs.rows, drafter=draft, measured_tpot_ms=tpot_ms)


def _draft_tokens(method: str, k: int | None, budget: int | None) -> int:
    if method == "auto":
        return 0
    return budget or k or 0


def answer_row(answer: CeilingAnswer) -> dict[str, Any]:
    """The flat CEILING_COLUMNS dict (+ `ceiling_note`, `ceiling_notes`) of one answer."""
    c = answer.ceiling
    if c is None:
        return {**dict.fromkeys(CEILING_COLUMNS), "ceiling_note": answer.note, "ceiling_notes": []}
    return {"ceiling_memory_tok_s": c.memory_ceiling_tok_s, "ceiling_compute_tok_s": c.compute_ceiling_tok_s,
            "ceiling_binding": c.binding, "ceiling_tok_s": c.ceiling_tok_s, "ceiling_achieved_pct": c.achieved_pct,
            "ceiling_ridge_tokens_per_step": c.ridge_tokens_per_step,
            "verified_tokens_per_step": c.verified_tokens_per_step, "ceiling_note": "",
            "ceiling_notes": list(c.notes)}


def point_ceiling_row(p, inputs, cache: dict | None = None) -> dict[str, Any]:
    """answer_row of a benchkit.point.Point (its `acceptance_length` and `median_tpot_ms`
    figures where loaded; a figure not loaded counts as unknown)."""
    return answer_row(ceiling_of(
        gpu_names=p.gpu_names, model=p.model, drafter=p.drafter, tp=p.tp, concurrency=p.concurrency,
        draft_tokens=_draft_tokens(p.method, p.num_speculative_tokens, p.tree_budget), input_len=p.input_len,
        output_len=p.output_len, tau=getattr(p, "acceptance_length", None), tpot_ms=getattr(p, "median_tpot_ms", None),
        inputs=inputs, cache=cache, host_id=p.host_id))


def run_ceiling_row(run, inputs, cache: dict | None = None) -> dict[str, Any]:
    """answer_row of a stored Run (its GPUs' names, its metrics' tau and median TPOT)."""
    m = getattr(run, "metrics", None)
    return answer_row(ceiling_of(
        gpu_names=[g.get("name") or "" for g in run.gpus or [] if isinstance(g, dict)], model=run.model,
        drafter=run.drafter, tp=run.tp, concurrency=run.concurrency,
        draft_tokens=_draft_tokens(run.method, run.num_speculative_tokens, run.tree_budget),
        input_len=run.input_len, output_len=run.output_len, tau=getattr(m, "acceptance_length", None),
        tpot_ms=getattr(m, "median_tpot_ms", None), inputs=inputs, cache=cache, host_id=run.host_id))


def run_section(run, inputs) -> dict[str, Any]:
    """The run page's ceilings section: the row, the assumptions left out (roofline.IGNORED) and
    where the GPU figures came from."""
    row = run_ceiling_row(run, inputs)
    return {**row, "ignored": IGNORED, "rows_source": inputs.rows_source}


def ridge_figure(points, inputs) -> dict[str, Any] | None:
    """The sweep page's "verified tokens per step against the ridge" figure (a Plotly spec): per
    configuration one line of V = B x (k + 1) over concurrency B, one panel per TP (x offset by
    the TP in the hover), and the ridge of each (TP, B) as a dashed line; a point above the
    ridge is compute-bound. None when no point has a ceiling (unknown GPU, no config.json)."""
    cache: dict = {}
    by_cfg: dict[tuple, dict[tuple[int, int], tuple[int, float]]] = {}
    ridge: dict[tuple[int, int], float] = {}
    order: dict[tuple, tuple] = {}
    for p in points:
        row = point_ceiling_row(p, inputs, cache)
        if row["ceiling_binding"] is None:
            continue
        key = (p.label, p.tp)
        by_cfg.setdefault(key, {})[(p.tp, p.concurrency)] = (row["verified_tokens_per_step"],
                                                            row["ceiling_ridge_tokens_per_step"])
        ridge[(p.tp, p.concurrency)] = row["ceiling_ridge_tokens_per_step"]
        order[key] = (p.tp, config_order(p.method, p.num_speculative_tokens, p.tree_budget))
    if not by_cfg:
        return None
    data = []
    for key in sorted(by_cfg, key=lambda k: order[k]):
        label, tp = key
        cells = sorted(by_cfg[key].items())
        data.append({"type": "scatter", "mode": "lines+markers", "name": f"{label} TP{tp}",
                     "x": [b for (_, b), _ in cells], "y": [v for _, (v, _) in cells],
                     "customdata": [[r, "compute-bound" if v > r else "memory-bound"] for _, (v, r) in cells],
                     "hovertemplate": f"{label} TP{tp}<br>B=%{{x}}: %{{y}} verified tokens/step<br>"
                                      "ridge %{customdata[0]:.0f}: %{customdata[1]}<extra></extra>"})
    for tp in sorted({t for t, _ in ridge}):
        cells = sorted((b, r) for (t, b), r in ridge.items() if t == tp)
        data.append({"type": "scatter", "mode": "lines", "name": f"ridge TP{tp}", "line": {"dash": "dash"},
                     "x": [b for b, _ in cells], "y": [r for _, r in cells],
                     "hovertemplate": f"ridge TP{tp}<br>B=%{{x}}: %{{y:.0f}} tokens/step<extra></extra>"})
    layout = figures._layout(420, xaxis={"title": {"text": "concurrency B"}, "type": "log"},
                             yaxis={"title": {"text": "verified tokens per step, B x (k + 1)"}, "type": "log"},
                             legend={"orientation": "h"})
    return figures._figure(data, layout, "Verified tokens per step against the ridge",
                           "Per configuration, B x (k + 1) verified tokens per step (B x (budget + 1) for DDTree); "
                           "the dashed line is the roofline ridge at that TP and concurrency: above it the step is "
                           "compute-bound, and a wider draft costs time in proportion (docs/CEILINGS.md).")


def crossing_configs(points, inputs, concurrency: int) -> list[str]:
    """Labels (with TP) of the configurations whose verified tokens per step exceed the ridge at
    `concurrency` (compute-bound there), in configuration order."""
    cache: dict = {}
    out = []
    for p in sorted(points, key=lambda p: (p.tp, config_order(p.method, p.num_speculative_tokens, p.tree_budget))):
        if p.concurrency != concurrency:
            continue
        row = point_ceiling_row(p, inputs, cache)
        ridge = row["ceiling_ridge_tokens_per_step"]
        if row["ceiling_binding"] is not None and row["verified_tokens_per_step"] > ridge:
            name = f"{p.label} TP{p.tp}"
            if name not in out:
                out.append(name)
    return out


def _side(points: list, inputs, cache: dict) -> dict[str, Any] | None:
    """{"achieved_pct": median over the runs with one, "binding": the first run's} or None."""
    rows = [point_ceiling_row(p, inputs, cache) for p in points]
    rows = [r for r in rows if r["ceiling_binding"] is not None]
    if not rows:
        return None
    pcts = sorted(r["ceiling_achieved_pct"] for r in rows if r["ceiling_achieved_pct"] is not None)
    pct = None if not pcts else (pcts[len(pcts) // 2] if len(pcts) % 2 else (pcts[len(pcts) // 2 - 1]
                                                                           + pcts[len(pcts) // 2]) / 2)
    return {"achieved_pct": pct, "binding": rows[0]["ceiling_binding"], "ceiling_tok_s": rows[0]["ceiling_tok_s"]}


def annotate_compare(data: dict[str, Any], points: list, inputs) -> None:
    """Add `ceiling` {"old", "new"} (each `_side`: achieved % of the binding ceiling, median over
    the side's runs, and which ceiling binds; None where there is none) to every matched and
    put-apart row of analysis.history.build_compare's `data`, in place."""
    by_run = {p.run_id: p for p in points}
    cache: dict = {}
    for r in (*data.get("points", []), *data.get("apart", [])):
        r["ceiling"] = {side: _side([by_run[i] for i in r[f"{side}_run_ids"] if i in by_run], inputs, cache)
                        for side in ("old", "new")}
