"""Export a sweep's counted runs as CSV, JSON (vllm bench serve layout + draftboard keys) and LaTeX.

All three come from one table built by `sweep_table`; pandas writes the CSV and LaTeX.
Only succeeded runs are exported as results; failed and invalidated runs are listed in the
JSON under `excluded` with their reasons, for audit.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from analysis.speedups import Speedup

COLUMNS = [
    ("run_id", "run"), ("label", "method"), ("tp", "TP"), ("concurrency", "concurrency"),
    ("output_len", "output tokens"), ("output_throughput", "output tok/s"), ("speedup", "speedup"),
    ("baseline_run_ids", "baseline run"), ("acceptance_length", "tau"), ("median_ttft_ms", "median TTFT ms"),
    ("median_tpot_ms", "median TPOT ms"),
]


def sweep_table(points: list[dict[str, Any]], speedups: list[Speedup]) -> pd.DataFrame:
    """One row per counted run: configuration, output tok/s, the speedup of its configuration
    (median over repeats) and the baseline runs it was computed against."""
    by_run = {rid: sp for sp in speedups for rid in sp.run_ids}
    rows = []
    for p in points:
        sp = by_run.get(p["run_id"])
        rows.append({
            **{k: p.get(k) for k, _ in COLUMNS if k in p},
            "speedup": round(sp.value, 4) if sp and sp.value is not None else None,
            "baseline_run_ids": " ".join(map(str, sp.baseline_run_ids)) if sp else "",
        })
    return pd.DataFrame(rows, columns=[k for k, _ in COLUMNS])


def to_csv(table: pd.DataFrame) -> str:
    """CSV text with draftboard's column names (units in the names)."""
    return table.rename(columns=dict(COLUMNS)).to_csv(index=False)


def to_latex(table: pd.DataFrame, caption: str) -> str:
    """A LaTeX `table` environment (booktabs) of the sweep, two decimals."""
    return table.rename(columns=dict(COLUMNS)).to_latex(index=False, float_format="%.2f", caption=caption,
                                                        label="tab:draftboard-sweep", na_rep="--", escape=True)
