"""Every export of draftboard: a sweep's counted runs as CSV, JSON and LaTeX.

CSV and LaTeX come from one table built by `sweep_table` (pandas writes them). JSON gives each
counted run in the key layout of `vllm bench serve --save-result` plus draftboard's keys
(`run_export`, written by benchkit.formats.vllm_bench.export_vllm_layout). Only succeeded runs
are exported as results; failed and invalidated runs are listed in the JSON under `excluded`
with their reasons, for audit.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from analysis.ceilings import CEILING_COLUMNS, CEILING_HEADERS, point_ceiling_row, run_ceiling_row
from analysis.tex import tex_escape
from benchkit.compare import verdicts
from benchkit.compare.speedups import Speedup
from benchkit.formats.vllm_bench import export_vllm_layout
from benchkit.measure.metrics import METRICS, SUMMARY_FIELDS
from benchkit.point import FIELD_GROUP, GROUPS, HEADERS, PRICED_FIGURES, SHAPE_FIELDS, Point
from runs.selectors import cost_of, window_of

#: Efficiency fields of the metric schema in the CSV / LaTeX table (output tokens only).
EFFICIENCY_COLUMNS = ("output_tok_s_per_gpu", "mean_power_w_per_gpu", "peak_power_w_per_gpu",
                      "energy_per_output_token_j", "energy_source", "output_tok_s_per_kw")

#: The point's values in the table: the run, its configuration's label, where it sits in the
#: grid (benchkit.point.SHAPE_FIELDS); then the schema's summary metrics
#: (benchkit.measure.metrics.SUMMARY_FIELDS), the efficiency figures and the cost per million
#: output tokens with the GPU-hour price it used (priced when exported: the points carry
#: benchkit.point.PRICED_FIGURES, runs.selectors.counted_points with prices).
_POINT_COLUMNS = ("run_id", "label", *SHAPE_FIELDS)
_FIGURE_COLUMNS = (*(f.name for f in SUMMARY_FIELDS), *EFFICIENCY_COLUMNS, *PRICED_FIGURES)
#: The point's lossless verdict (benchkit.compare.lossless; empty for an `auto` run, the baseline).
LOSSLESS_COLUMNS = GROUPS["lossless"]
#: (column key, header): the point's values, its two speedups (end-to-end and decode, both named;
#: benchkit.compare.speedups) and the baseline runs, why it is excluded from verdicts when it is
#: (benchkit.compare.verdicts.exclusion_reason; its speedups are then empty), its lossless
#: verdict, then its figures.
COLUMNS = [
    ("run_id", HEADERS["run_id"]), ("label", "method"), *((f, HEADERS[f]) for f in SHAPE_FIELDS),
    ("speedup", "end-to-end speedup (output tok/s ratio)"),
    ("decode_speedup", "decode speedup (baseline median TPOT / median TPOT)"), ("baseline_run_ids", "baseline run"),
    ("excluded", "excluded from verdicts (why)"),
    *((f, HEADERS[f]) for f in LOSSLESS_COLUMNS),
    *((f.name, f.header) for f in SUMMARY_FIELDS),
    *((name, METRICS[name].header) for name in EFFICIENCY_COLUMNS),
    ("cost_usd_per_m_output_tokens", "cost per million output tokens (USD/Mtok)"),
    ("price_usd_per_gpu_hour", "price used (USD per GPU-hour)"),
    *((k, CEILING_HEADERS[k]) for k in CEILING_COLUMNS),
]


def sweep_table(points: list[Point], speedups: list[Speedup], ceiling_inputs=None) -> pd.DataFrame:
    """One row per counted run: configuration, figures, the end-to-end and decode speedups of its
    configuration (medians over repeats; `speedups` from analysis.dashboard.verdict_speedups, which
    leaves excluded points out) and the baseline runs they were computed against, and the
    exclusion reason ("" when the run feeds verdicts). The points need every figure of COLUMNS,
    the priced ones included. The decode-step ceilings (analysis.ceilings, CEILING_COLUMNS) are
    computed from `ceiling_inputs` (runs.ceilings.ceiling_inputs); empty without them or where a
    point has none."""
    by_run = {rid: sp for sp in speedups for rid in sp.run_ids}
    rows = []
    cache: dict = {}
    for p in points:
        sp = by_run.get(p.run_id)
        ceiling = point_ceiling_row(p, ceiling_inputs, cache) if ceiling_inputs is not None else {}
        rows.append({
            **{k: ceiling.get(k) for k in CEILING_COLUMNS},
            **{k: getattr(p, k) for k in (*_POINT_COLUMNS, *LOSSLESS_COLUMNS, *_FIGURE_COLUMNS)},
            "speedup": round(sp.value, 4) if sp and sp.value is not None else None,
            "decode_speedup": _rounded(sp.ratios.get("decode") if sp else None),
            "excluded": verdicts.exclusion_reason(p),
            "baseline_run_ids": " ".join(map(str, sp.baseline_run_ids)) if sp else "",
        })
    table = pd.DataFrame(rows, columns=[k for k, _ in COLUMNS])
    # whole numbers stay whole beside an unknown one (an imported run whose file did not say)
    return table.astype({k: "Int64" for k in WORKLOAD_COLUMNS})


def _rounded(ratio: Any) -> float | None:
    return round(ratio.value, 4) if ratio is not None and ratio.value is not None else None


#: Workload columns an imported run may not know (NULL: "not in the file").
WORKLOAD_COLUMNS = tuple(f for f in SHAPE_FIELDS if FIELD_GROUP[f] == "workload")
NOT_IN_FILE = "not in the file"


def to_csv(table: pd.DataFrame) -> str:
    """CSV text with draftboard's column names (units in the names); an unknown value is an empty
    cell (CSV's missing value, read back as NaN / None)."""
    return table.rename(columns=dict(COLUMNS)).to_csv(index=False)


def to_latex(table: pd.DataFrame, caption: str) -> str:
    """A LaTeX `table` environment (booktabs) of the sweep, two decimals, with only the columns
    that have a value in some row (a CPU sweep has no GPU figures: those columns go); an unknown
    workload value reads "not in the file", an unknown figure "--"; the lossless sentence is left
    out (the verdict code and its figures stay). The caption (the sweep's name: a user's text),
    the headers and every cell go through analysis.tex.tex_escape, the escaping of every TeX
    draftboard writes (pandas' own escaping is off: it leaves the caption raw). The whole
    document, with the figures and the answer, is `manage.py report` (analysis.report)."""
    table = table.drop(columns=["lossless_sentence"]).astype({k: object for k in WORKLOAD_COLUMNS})
    table = table[[c for c in table.columns if c in WORKLOAD_COLUMNS or _has_value(table[c])]]
    for k in WORKLOAD_COLUMNS:
        table[k] = [NOT_IN_FILE if pd.isna(v) else str(v) for v in table[k]]
    cells = pd.DataFrame({c: [_tex_cell(v) for v in table[c]] for c in table.columns}, columns=table.columns)
    cells = cells.rename(columns={k: tex_escape(h) for k, h in COLUMNS})
    return cells.to_latex(index=False, caption=tex_escape(caption), label="tab:draftboard-sweep", escape=False)


def _tex_cell(value: Any) -> str:
    """One cell of `to_latex`: "--" when unknown, a float with two decimals, anything else as
    escaped text."""
    if value is None or value is pd.NA or (isinstance(value, float) and value != value):
        return "--"
    if isinstance(value, float):
        return f"{value:.2f}"
    return tex_escape(value)


def _has_value(col: pd.Series) -> bool:
    """True when some cell of the column is known and not empty text."""
    return any(not (v is None or v is pd.NA or (isinstance(v, float) and v != v) or v == "") for v in col)


def run_export(run, prices: dict[str, float | None] | None = None, ceiling_inputs=None) -> dict[str, Any]:
    """One counted run as benchkit.formats.vllm_bench.export_vllm_layout writes it, with the
    run's configuration (engine, method, TP, GPUs, argv, dataset, lengths) under draftboard.run,
    where the importer reads engine, dataset and lengths back, and there too
    `cost_usd_per_m_output_tokens` with the `price_usd_per_gpu_hour` it used (today's price,
    runs.selectors.cost_of; `prices`: runs.selectors.gpu_prices()). The efficiency figures are
    under draftboard.metrics with the other figures. Unknown values (an imported run's workload
    its file did not give) are null. The run's lossless verdict is under draftboard.run.lossless
    (LosslessCheck's columns, null without one: an `auto` run, or not computed). With
    `ceiling_inputs`, draftboard.run.ceiling holds the decode-step ceilings (analysis.ceilings:
    CEILING_COLUMNS and `ceiling_note`, null figures where there is none). Needs
    `run.metrics` loaded (and `run.lossless`, else one query)."""
    m = run.metrics
    check = getattr(run, "lossless", None)
    cost, price = cost_of(run, m, prices)
    meta = {
        "run_id": run.pk, "sweep_id": run.sweep_id, "model": run.model, "backend": run.engine, "engine": run.engine,
        "dataset": run.dataset or None,
        "label": run.method_label, "date": run.finished_at, "num_prompts": run.num_prompts,
        "concurrency": run.concurrency, "request_rate": run.request_rate,
        "engine_version": run.engine_version, "engine_commit": run.engine_commit, "method": run.method,
        "num_speculative_tokens": run.num_speculative_tokens, "tree_budget": run.tree_budget, "tp": run.tp,
        "gpus": run.gpus, "input_len": run.input_len, "output_len": run.output_len, "argv": run.argv,
        "is_demo_model": run.is_demo_model, "source_tool": m.source_tool,
        "cost_usd_per_m_output_tokens": cost, "price_usd_per_gpu_hour": price,
        "lossless": None if check is None else {
            k: getattr(check, k) for k in ("verdict", "sentence", "reason", "compared", "identical",
                                           "identical_share", "median_first_divergence", "unit", "precision",
                                           "block", "baseline_run_ids", "floor_run_ids", "floor_identical_share",
                                           "p_value")},
    }
    if ceiling_inputs is not None:
        row = run_ceiling_row(run, ceiling_inputs)
        meta["ceiling"] = {k: row[k] for k in (*CEILING_COLUMNS, "ceiling_note")}
    return export_vllm_layout(window_of(m), meta, spec_source=m.spec_source or None)


def sweep_json(sweep, runs, prices: dict[str, float | None] | None = None, ceiling_inputs=None) -> dict[str, Any]:
    """The JSON export of a sweep: {"sweep": {id, name, is_demo, spec}, "runs": [run_export of each
    counted run], "excluded": [{run, state, reason} of every other run]}."""
    return {"sweep": {"id": sweep.pk, "name": sweep.name, "is_demo": sweep.is_demo, "spec": sweep.spec},
            "runs": [run_export(r, prices, ceiling_inputs) for r in runs if r.counts],
            "excluded": [{"run": r.pk, "state": r.state, "reason": r.failure_reason or r.invalidated_reason}
                         for r in runs if not r.counts]}
