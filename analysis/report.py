"""The sweep report (issue 23): one document from the database that says what the sweep page says,
in the shape the users wrote by hand. `manage.py report SWEEP` writes it; the sweep page links its
HTML variant (`analysis.views.sweep_report`).

load -> build -> render, like the pages:

- `load_inputs` reads the sweep through runs.selectors (the sweep page's queries plus the runs'
  light columns and each host's latest hardware snapshot);
- `build_report` (no queries) calls the page builders of analysis.dashboard (`build_sweep_page`
  for the headline, `sweep_figures` for the four figures and the speedups) and lays their
  results out as tables: the answer (`dashboard.headline`, rendered as it is returned), the
  speedup matrix (read off the heatmap figure's cells, so its numbers, best-cell stars and
  lossless marks are the page's), tau and the relative step cost beside it
  (benchkit.compare.speedups.relative_step_costs, medians by benchkit.compare.stats.median),
  inventory, engine builds, workload, failed / invalidated / suspect runs, GPU efficiency and
  the exact command lines. No figure is computed here.
- `render_tex` / `render_html` fill templates/report/report.tex / report.html (Django
  templates; every value in the TeX goes through analysis.tex.tex_escape, the one escaping of
  every TeX draftboard writes); `export_figures` writes the
  figures as vector PDF (or SVG) through plotly's static export (kaleido, which drives the
  system's Chromium); `compile_pdf` runs the real `pdflatex` and reads its log
  (errors, overfull boxes). `write_report` does all of it into a folder.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analysis.tex import verbatim_lines
from benchkit.compare.lossless import LOSSLESS, MARK, SHORT, lossless_mark
from benchkit.compare.speedups import relative_step_costs
from benchkit.compare.stats import median
from benchkit.compare.verdicts import Verdict
from benchkit.methods import config_order, method_title
from benchkit.point import SPEED_FIELD, Point

#: Formats `write_report` makes.
FORMATS = ("pdf", "tex", "html")
#: The figure file format per report format (the HTML variant inlines SVG).
FIGURE_FORMAT = {"pdf": "pdf", "tex": "pdf", "html": "svg"}
#: Width (px) a figure is exported at when its layout gives none (plotly's default is 700).
EXPORT_WIDTH = 1200
#: Characters per line of a command line in the TeX appendix (verbatim, \footnotesize).
COMMAND_WIDTH = 92
#: Characters of a failure message kept in the report (the run page has the whole message).
MESSAGE_CHARS = 240
#: An overfull box wider than this (pt) in pdflatex's log is an error of `compile_pdf`.
OVERFULL_LIMIT_PT = 3.0
#: Seconds one pdflatex pass may take.
PDFLATEX_TIMEOUT_S = 180


class ReportError(Exception):
    """The report could not be built: the message says what failed (pdflatex's error lines,
    a missing program or package)."""


# --------------------------------------------------------------------------------------------
# formatting (the template filters of analysis.templatetags.report_tex; escaping: analysis.tex)


def fmt_num(value: Any, digits: int = 2) -> str:
    """`value` with `digits` decimals ('--' for None); a non-number as its text."""
    if value is None:
        return "--"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    return f"{value:.{digits}f}"


# --------------------------------------------------------------------------------------------
# load


@dataclass
class ReportInputs:
    """What the report reads from the database (`load_inputs`): the sweep, the selection (only
    the baseline is chosen), the figure points (priced), the sweep's dimensions, per
    configuration-and-TP state counts, failure counts, every run's light columns (in grid
    order) and the latest hardware snapshot of each host the runs are on ({name: snapshot or
    None})."""

    sweep: Any
    selection: Any
    points: list[Point]
    dims: list[dict[str, Any]]
    state_rows: list[dict[str, Any]]
    failures: dict[str, int]
    runs: list[Any]
    snapshots: dict[str, Any] = field(default_factory=dict)


def load_inputs(sweep, baseline: str = "auto") -> ReportInputs:
    """Read a sweep for its report (the sweep page's selectors). Raises
    analysis.filters.QueryError (`baseline`) when the baseline is not a configuration of the
    sweep's counted runs."""
    from analysis import dashboard, figures
    from analysis.filters import parse_selection
    from runs import selectors

    selection = parse_selection({"baseline": [baseline]})
    points = selectors.figure_points(sweep.pk, figures.POINT_METRICS + figures.EFFICIENCY_POINT_FIELDS,
                                     selectors.gpu_prices())
    dims = selectors.dimensions_of(points)
    dashboard.baseline_config(selection, dims)
    runs = list(selectors.report_runs(sweep.pk))
    hosts = {r.host.name: r.host for r in runs} or {sweep.host.name: sweep.host}
    return ReportInputs(sweep=sweep, selection=selection, points=points, dims=dims,
                        state_rows=selectors.config_state_counts(sweep.pk),
                        failures=selectors.failure_counts(sweep.pk), runs=runs,
                        snapshots={name: selectors.latest_snapshot(h) for name, h in sorted(hosts.items())})


# --------------------------------------------------------------------------------------------
# build (no queries)


def _verdict_words(points: list[Point]) -> str:
    """The lossless verdict of a cell's runs in words: the mark's text where
    benchkit.compare.lossless.lossless_mark marks them, else 'lossless' / the verdicts' short
    names / 'not computed'."""
    mark = lossless_mark(points)
    if mark:
        return f"{mark.symbol} {mark.text}"
    verdicts = sorted({p.lossless_verdict for p in points})
    if verdicts == [LOSSLESS]:
        return "lossless"
    if not any(verdicts):
        return "autoregressive baseline" if all(p.method == "auto" for p in points) else "not computed"
    return ", ".join(SHORT.get(v) or v or "not computed" for v in verdicts)


def _ratios(sp) -> list[dict[str, Any]]:
    """Every named ratio of a Speedup ({"name", "title", "value", "ci95", "reason"}), the end-to-end
    one first: what benchkit.compare.speedups computed for it, however many figures that was."""
    from benchkit.compare.speedups import SPEEDUP_FIGURES

    out = []
    for name, r in sorted((getattr(sp, "ratios", None) or {}).items(), key=lambda kv: kv[0] != "end_to_end"):
        fig = SPEEDUP_FIGURES.get(name)
        out.append({"name": name, "title": fig.title if fig else name.replace("_", " "), "value": r.value,
                    "ci95": r.ci95, "reason": r.reason})
    return out


def _cell_parts(cell: Any) -> tuple[Any, Any, list[str]]:
    """(Speedup or None, lossless mark or None, [notes]) of one cell of dashboard.headline's
    table: a verdicts.Verdict (its winner, else its fastest, with the verdict's sentence and the
    speedup it ranks by as notes), a (speedup, mark) pair, a bare Speedup, or a dict with
    "speedup"/"sp" and "mark" whose other text values (a tie, a sentence) become notes beside it."""
    if isinstance(cell, Verdict):
        top = cell.winner or cell.top
        if top is None:
            return None, None, [cell.sentence] if cell.sentence else []
        notes = [f"{cell.figure.title}: {cell.sentence}" if cell.sentence else cell.figure.title]
        if top.ci95:
            notes.append(f"95% CI {top.ci95[0]:.2f}-{top.ci95[1]:.2f} over {top.n_repeats} repeats")
        return top.speedup, top.mark, notes
    if isinstance(cell, dict):
        sp = cell.get("speedup", cell.get("sp"))
        notes = [f"{k.replace('_', ' ')}: {v}" if not isinstance(v, str) else v for k, v in cell.items()
                 if k not in ("speedup", "sp", "mark") and isinstance(v, str | int | float) and v != ""
                 and not isinstance(v, bool)]
        return sp, cell.get("mark"), notes
    if isinstance(cell, tuple | list):
        parts = list(cell) + [None, None]
        return parts[0], parts[1], [str(x) for x in parts[2:] if isinstance(x, str) and x]
    return cell, None, []


def answer(headline: dict[str, Any] | None, by_run: dict[int, Point]) -> dict[str, Any] | None:
    """The report's answer from `dashboard.headline` (whatever it returns, rendered): one row
    per (TP, concurrency) cell of its table {"tp", "concurrency", "label", "title", "ratios",
    "spread", "tok_s", "runs", "baseline_runs", "verdict", "mark"} (a cell without a speedup:
    label None and its reason), its `fastest` list as it is, and any other key it adds
    ("extra": {key: value}) printed as text."""
    if not headline:
        return None
    rows = []
    concs = headline.get("concurrency") or []
    for row in headline.get("rows") or []:
        for conc, cell in zip(concs, row.get("cells") or [], strict=False):
            sp, mark, notes = _cell_parts(cell)
            if sp is None:
                rows.append({"tp": row.get("tp"), "concurrency": conc, "label": None, "notes": notes})
                continue
            pts = [by_run[r] for r in sp.run_ids if r in by_run]
            rows.append({"tp": row.get("tp"), "concurrency": conc, "label": sp.label,
                         "winner": not isinstance(cell, Verdict) or cell.winner is not None,
                         "title": method_title(sp.point.method), "ratios": _ratios(sp), "spread": sp.spread,
                         "tok_s": sp.median_output_throughput, "runs": sp.run_ids, "baseline_runs": sp.baseline_run_ids,
                         "verdict": _verdict_words(pts) if pts else "not computed", "mark": mark,
                         "notes": notes})
    known = {"output_len", "concurrency", "rows", "fastest", "baseline", "figures"}  # figures: `choice` says it
    fastest = [{**f, "verdict": _verdict_words([by_run[r] for r in f.get("runs", []) if r in by_run])}
               for f in headline.get("fastest") or []]
    return {"output_len": headline.get("output_len"), "baseline": headline.get("baseline"), "rows": rows,
            "fastest": fastest, "extra": {k: v for k, v in headline.items() if k not in known},
            "ratio_titles": list(dict.fromkeys(r["title"] for row in rows if row.get("label")
                                               for r in row["ratios"]))}


def _cell_median(points: list[Point], attr: str) -> float | None:
    return median(getattr(p, attr) for p in points)


def speedup_tables(heatmap: dict[str, Any], points: list[Point], baseline: str) -> list[dict[str, Any]]:
    """The speedup matrix, one table per panel of the sweep page's heatmap
    (analysis.figures.speedup_heatmap: one per concurrency and output length): rows =
    configurations, per TP the speedup as the page prints it (value, best-cell star, lossless
    mark, CI or 'single run'), tau (server counters, else the client's tokens per chunk;
    median over the cell's runs) and the relative step cost (step time / AR TPOT,
    relative_step_costs; median). [] when the heatmap has no number ("empty")."""
    if "empty" in heatmap:
        return []
    costs = relative_step_costs(points)
    cells: dict[tuple, list[Point]] = defaultdict(list)
    for p in points:
        cells[(p.concurrency, p.output_len, p.label, f"TP{p.tp}")].append(p)
    tables = []
    for trace in heatmap["data"]:
        meta = trace.get("meta") or {}
        conc, out_len = meta.get("concurrency"), meta.get("output_len")
        rows = []
        for r, label in enumerate(trace["y"]):
            out = []
            for c, tp in enumerate(trace["x"]):
                z, text = trace["z"][r][c], trace["text"][r][c] or ""
                pts = cells.get((conc, out_len, label, tp), [])
                tau = _cell_median(pts, "acceptance_length")
                if tau is None:
                    tau = _cell_median(pts, "mean_tokens_per_chunk") if label != "auto" else None
                lines = text.split("<br>")
                second = lines[1] if len(lines) > 1 else ""
                out.append({"value": z, "best": text.startswith("★"), "marked": MARK in text,
                            "spread": "" if second == "single run" else second,
                            "note": "; ".join(x for x in lines[2:] if x),
                            "measured": bool(pts), "tau": tau,
                            "cost": median(costs.get(p.run_id) for p in pts),
                            "tok_s": _cell_median(pts, SPEED_FIELD)})
            rows.append({"label": label, "cells": out})
        single = all(not cell["spread"] for row in rows for cell in row["cells"])
        tps = list(trace["x"])
        tables.append({"concurrency": conc, "output_len": out_len, "tps": tps, "rows": rows, "all_single": single,
                       "groups": [{"tp": tp, "cmid": f"{{{2 + 3 * i}-{4 + 3 * i}}}"} for i, tp in enumerate(tps)],
                       "colspec": "{l" + "rrr" * len(tps) + "}"})
    several_len = len({t["output_len"] for t in tables}) > 1
    for t in tables:
        t["several_len"] = several_len
    return tables


def inventory(snapshots: dict[str, Any], runs: list[Any]) -> list[dict[str, Any]]:
    """Per host: its latest snapshot's facts (driver, CUDA, CPU, taken), GPUs (index, name, UUID,
    PCI bus id, memory, NUMA node), the GPU-to-GPU link matrix (`nvidia-smi topo -m` codes) and the
    GPUs each TP degree's runs used (with whether they crossed NUMA nodes)."""
    from benchkit.hosts.topology import TopoMatrix

    used: dict[str, dict[int, set]] = defaultdict(lambda: defaultdict(set))
    for r in runs:
        idx = tuple(g.get("index") for g in r.gpus or [] if isinstance(g, dict))
        if idx:
            used[r.host.name][r.tp].add((idx, r.gpus_cross_numa))
    hosts = []
    for name, snap in snapshots.items():
        tp_gpus = [{"tp": tp, "groups": sorted(groups)} for tp, groups in sorted(used[name].items())]
        h: dict[str, Any] = {"name": name, "snapshot": snap, "gpus": [], "links": None, "tp_gpus": tp_gpus}
        if snap is not None:
            h["gpus"] = list(snap.gpus.all())
            topo = (snap.data or {}).get("topology")
            if topo:
                t = TopoMatrix.from_dict(topo)
                n = len(t.gpus)
                h["links"] = {"gpus": list(t.gpus), "rows": [(t.gpus[i], [t.links.get((i, j), "") for j in range(n)])
                                                             for i in range(n)],
                              "source": (snap.data or {}).get("topology_source", "")}
        hosts.append(h)
    return hosts


def _distinct(runs: list[Any], key) -> list[dict[str, Any]]:
    """[{"key": key(run), "runs": [ids], "n": count}] in first-seen order."""
    seen: dict[Any, list[int]] = {}
    for r in runs:
        seen.setdefault(key(r), []).append(r.pk)
    return [{"key": k, "runs": ids, "n": len(ids)} for k, ids in seen.items()]


def _provenance(r) -> str:
    p = r.provenance or {}
    parts = [f"{k} {p[k]}" for k in ("torch", "torch_version", "cuda", "cuda_version", "launcher", "distribution")
             if p.get(k)]
    return ", ".join(parts)


def setup_tables(runs: list[Any]) -> dict[str, list[dict[str, Any]]]:
    """What was measured with: engine builds (engine, build, version, commit, what its
    environment said), models (target, drafter, demo model), workloads (dataset, input and
    output length, prompts, request rate, temperature, seed; the concurrency levels of each),
    each with the runs that used it."""
    builds = _distinct(runs, lambda r: (r.engine, r.engine_build, r.engine_version, r.engine_commit, _provenance(r)))
    models = _distinct(runs, lambda r: (r.model, r.drafter, r.is_demo_model))
    workloads = _distinct(runs, lambda r: (r.dataset, r.input_len, r.output_len, r.num_prompts, r.request_rate,
                                           r.temperature, r.seed))
    concs: dict[tuple, set] = defaultdict(set)
    for r in runs:
        concs[(r.dataset, r.input_len, r.output_len, r.num_prompts, r.request_rate, r.temperature, r.seed)].add(
            r.concurrency)
    for w in workloads:
        w["concurrency"] = sorted(concs[w["key"]], key=lambda c: (c is None, c or 0))
    return {"builds": builds, "models": models, "workloads": workloads}


def wrap_command(line: str, width: int = COMMAND_WIDTH) -> list[str]:
    """A shell command line as lines of at most `width` characters for the TeX appendix: broken
    between words with a shell continuation (` \\`), so the lines paste back as the same command;
    a single word longer than a line is cut, and its pieces are marked with a trailing `\\\\`
    (then the pieces must be joined by hand: the HTML variant and the run page have it whole);
    a `\\end{verbatim}` inside is cut the same way (analysis.tex.verbatim_lines)."""
    line = "".join(c if 32 <= ord(c) < 127 else "?" for c in line)  # verbatim: printable ASCII only
    out, cur = [], ""
    for word in line.split(" "):
        cand = f"{cur} {word}" if cur else word
        if len(cand) <= width - 2 or not cur:
            cur = cand
        else:
            out.append(cur + " \\")
            cur = "    " + word
        while len(cur) > width:
            out.append(cur[:width - 2] + "\\\\")
            cur = "    " + cur[width - 2:]
    if cur:
        out.append(cur)
    return verbatim_lines(out)


def command_lines(runs: list[Any]) -> list[dict[str, Any]]:
    """The exact server command of each run, as the run page gives it (`env K=V ... argv`),
    identical ones merged: [{"command", "lines" (wrap_command), "runs"}]. Runs without an argv
    (imported) are left out."""
    def cmd(r) -> str:
        env = " ".join(shlex.quote(f"{k}={v}") for k, v in sorted((r.server_env or {}).items()))
        line = shlex.join(r.argv or [])
        return f"env {env} {line}" if env else line

    out = []
    for d in _distinct([r for r in runs if r.argv], cmd):
        out.append({"command": d["key"], "lines": wrap_command(d["key"]), "runs": d["runs"]})
    return out


def problem_runs(runs: list[Any]) -> dict[str, list[dict[str, Any]]]:
    """Failed and invalidated runs with their reasons, and suspect runs with their marks:
    {"excluded": [{"run", "label", "tp", "concurrency", "state", "reason", "message"}],
     "suspect": [{"run", "label", "tp", "concurrency", "reasons"}]}."""
    excluded, suspect = [], []
    for r in runs:
        base = {"run": r.pk, "label": r.method_label, "tp": r.tp, "concurrency": r.concurrency}
        if r.state in ("failed", "invalidated"):
            reason = r.failure_reason if r.state == "failed" else "invalidated"
            message = r.failure_message if r.state == "failed" else r.invalidated_reason
            msg = " ".join((message or "").split())
            excluded.append({**base, "state": r.state, "reason": reason or "unknown",
                             "message": msg[:MESSAGE_CHARS] + ("..." if len(msg) > MESSAGE_CHARS else "")})
        if r.suspect:
            reasons = [x if isinstance(x, str) else (x.get("message") or x.get("code") or str(x))
                       for x in (r.suspect_reasons or [])]
            suspect.append({**base, "reasons": "; ".join(reasons) or "marked suspect"})
    return {"excluded": excluded, "suspect": suspect}


def efficiency_rows(points: list[Point]) -> list[dict[str, Any]]:
    """GPU efficiency where the runs have telemetry or a price: one row per counted run with any
    of output tok/s per GPU, J per output token, USD per million output tokens (and the USD per
    GPU-hour that cost used); [] when no run has one."""
    rows = []
    for p in points:
        vals = {f: getattr(p, f, None) for f in ("output_tok_s_per_gpu", "energy_per_output_token_j",
                                                 "cost_usd_per_m_output_tokens", "price_usd_per_gpu_hour")}
        if any(vals[f] is not None for f in ("output_tok_s_per_gpu", "energy_per_output_token_j",
                                             "cost_usd_per_m_output_tokens")):
            rows.append({"run": p.run_id, "label": p.label, "tp": p.tp, "concurrency": p.concurrency, **vals})
    return rows


def run_rows(points: list[Point], speedups: list) -> list[dict[str, Any]]:
    """The appendix table: one row per counted run (grid order) with its speedup vs the baseline
    (its configuration's median over repeats, as the exports give it) and the figures the page
    plots."""
    by_run = {rid: sp for sp in speedups for rid in sp.run_ids}
    rows = []
    for p in points:
        sp = by_run.get(p.run_id)
        rows.append({"run": p.run_id, "label": p.label, "tp": p.tp, "concurrency": p.concurrency,
                     "output_len": p.output_len, "repeat": p.repeat_index, "tok_s": getattr(p, SPEED_FIELD),
                     "tpot": p.median_tpot_ms, "ttft": p.median_ttft_ms, "tau": p.acceptance_length,
                     "chunk": p.mean_tokens_per_chunk, "speedup": sp.value if sp else None})
    return rows


def figure_list(figs: dict[str, dict[str, Any]], keys) -> list[dict[str, Any]]:
    """The figures in page order: {"key", "title", "caption", "empty" (the reason, or "")}."""
    out = []
    for key in keys:
        f = figs[key]
        out.append({"key": key, "title": f.get("title", key), "caption": re.sub(r"<[^>]+>", " ", f.get("caption", "")),
                    "empty": f.get("empty", "")})
    return out


def build_report(inp: ReportInputs) -> dict[str, Any]:
    """The report's context from loaded inputs: the sweep page's own builders
    (dashboard.build_sweep_page, dashboard.sweep_figures) and the tables above. "figures" holds
    the figure dicts to export ({key: plotly figure}), "figure_list" what the document says of
    each."""
    from analysis import dashboard

    sel = inp.selection
    page = dashboard.build_sweep_page(inp.points, inp.dims, sel, inp.state_rows, inp.failures)
    figs, speedups = dashboard.sweep_figures(inp.points, sel)
    by_run = {p.run_id: p for p in inp.points}
    hosts = inventory(inp.snapshots, inp.runs)
    return {
        "sweep": inp.sweep, "baseline": sel.baseline, "headline": page["headline"],
        "answer": answer(page["headline"], by_run), "legend": page["legend"], "config_table": page["config_table"],
        "progress": page["progress_counts"], "n_counted": page["n_counted"],
        "excluded_line": page.get("excluded_line") or "",
        "inconsistent_tps": page["inconsistent_tps"], "failures": inp.failures,
        "matrix": speedup_tables(figs["speedup"], inp.points, sel.baseline),
        "figures": figs, "figure_list": figure_list(figs, dashboard.SWEEP_FIGURES),
        "hosts": hosts, "setup": setup_tables(inp.runs), "commands": command_lines(inp.runs),
        "problems": problem_runs(inp.runs), "efficiency": efficiency_rows(inp.points),
        "run_rows": run_rows(inp.points, speedups),
        "configs": sorted({p.label: p for p in inp.points}.items(), key=lambda kv: config_order(
            kv[1].method, kv[1].num_speculative_tokens, kv[1].tree_budget)),
    }


# --------------------------------------------------------------------------------------------
# render


def _chunks(rows: list, n: int) -> list[list]:
    return [rows[i:i + n] for i in range(0, len(rows), n)] or [[]]


def render_tex(ctx: dict[str, Any], figure_files: dict[str, str]) -> str:
    """The report's TeX source (templates/report/report.tex). `figure_files`: {figure key: file
    name beside the .tex} of the figures exported (a figure not in it is described, not drawn)."""
    from django.template.loader import render_to_string

    return render_to_string("report/report.tex", {**ctx, "figure_files": figure_files,
                                                  "run_chunks": _chunks(ctx["run_rows"], 45)})


def render_html(ctx: dict[str, Any], svgs: dict[str, str] | None = None, request=None) -> str:
    """The report's HTML (templates/report/report.html): `svgs` {figure key: inline SVG markup}
    for a self-contained file; without them the figures are drawn by plotly.js from their JSON
    (the web view)."""
    from django.template.loader import render_to_string

    return render_to_string("report/report.html", {**ctx, "svgs": svgs or {}}, request=request)


def _static_figure(fig: dict[str, Any]):
    import plotly.graph_objects as go

    layout = dict(fig["layout"])
    layout.setdefault("width", EXPORT_WIDTH)
    layout["hovermode"] = False
    return go.Figure(data=fig["data"], layout=layout)


def export_figures(figs: dict[str, dict[str, Any]], out_dir: Path, fmt: str = "pdf") -> dict[str, str]:
    """Write each drawn figure (not the "empty" ones) to `out_dir/fig-<key>.<fmt>` through plotly's
    static export (kaleido; one Chromium session for all: the system's `chromium`, e.g. Debian's
    /usr/bin/chromium, unless BROWSER_PATH names another). Returns {key: file name}. Raises
    ReportError when kaleido or a browser for it is missing."""
    import plotly.io as pio

    drawn = {k: f for k, f in figs.items() if "empty" not in f}
    if not drawn:
        return {}
    try:
        import kaleido  # noqa: F401
    except ImportError as exc:
        raise ReportError("figures need the `kaleido` package (requirements/web.txt)") from exc
    if not os.environ.get("BROWSER_PATH") and (chromium := shutil.which("chromium")):
        os.environ["BROWSER_PATH"] = chromium  # Debian's, as the browser tests use (choreographer reads it)
    names = {k: f"fig-{k}.{fmt}" for k in drawn}
    try:
        pio.write_images([_static_figure(f) for f in drawn.values()], [out_dir / names[k] for k in drawn],
                         format=fmt)
    except Exception as exc:  # kaleido's errors (no Chromium, a browser crash) have many types
        raise ReportError(f"plotly static export failed: {exc} (kaleido drives Chromium: "
                          "`bash scripts/system_deps.sh` installs Debian's chromium)") from exc
    return names


@dataclass
class TexLog:
    """What pdflatex's log says: error lines ('! ...') and overfull boxes as (points, line)."""

    errors: list[str]
    overfull: list[tuple[float, str]]


def read_tex_log(text: str) -> TexLog:
    """Parse a pdflatex log: lines starting with '!' are errors; 'Overfull \\hbox (12.3pt too
    wide) ...' / '\\vbox' lines give the overfull boxes."""
    errors = [ln for ln in text.splitlines() if ln.startswith("!")]
    overfull = [(float(m.group(1)), m.group(0)) for m in re.finditer(r"Overfull \\[hv]box \(([\d.]+)pt too \w+\)[^\n]*",
                                                                      text)]
    return TexLog(errors, overfull)


def compile_pdf(tex_path: Path, overfull_limit_pt: float = OVERFULL_LIMIT_PT) -> tuple[Path, TexLog]:
    """Run `pdflatex` twice (outline and references) on `tex_path` in its folder. Returns the PDF
    and the parsed log. Raises ReportError when pdflatex is missing, fails, or the log has an
    error or an overfull box wider than `overfull_limit_pt`."""
    exe = shutil.which("pdflatex")
    if exe is None:
        raise ReportError("pdflatex not found: `bash scripts/system_deps.sh` installs Debian's texlive-latex-base "
                          "and texlive-latex-recommended")
    tex_path = Path(tex_path)
    cmd = [exe, "-interaction=nonstopmode", "-halt-on-error", "-no-shell-escape", tex_path.name]
    for _ in range(2):
        try:
            proc = subprocess.run(cmd, cwd=tex_path.parent, capture_output=True, text=True, errors="replace",
                                  timeout=PDFLATEX_TIMEOUT_S, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            raise ReportError(f"pdflatex ran past {PDFLATEX_TIMEOUT_S} s on {tex_path}") from exc
        log_path = tex_path.with_suffix(".log")
        log = read_tex_log(log_path.read_text(errors="replace") if log_path.exists() else proc.stdout)
        if proc.returncode != 0 or log.errors:
            raise ReportError(f"pdflatex failed on {tex_path} (exit {proc.returncode}): "
                              + " | ".join(log.errors[:5] or proc.stdout.splitlines()[-5:]))
    wide = [line for pt, line in log.overfull if pt > overfull_limit_pt]
    if wide:
        raise ReportError(f"{tex_path}: {len(wide)} overfull box(es) wider than {overfull_limit_pt} pt: {wide[0]}")
    return tex_path.with_suffix(".pdf"), log


def write_report(sweep, out_dir: Path, fmt: str = "pdf", baseline: str = "auto") -> Path:
    """Build the report of `sweep` into `out_dir` (created): `sweep-<id>-report.tex` with its
    figure PDFs, compiled to `.pdf` for fmt "pdf"; `sweep-<id>-report.html` (figures inline as
    SVG) for "html". Returns the main file. Raises ReportError (see export_figures,
    compile_pdf) and analysis.filters.QueryError for a baseline the sweep does not have."""
    if fmt not in FORMATS:
        raise ReportError(f"unknown report format {fmt!r}: use {', '.join(FORMATS)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ctx = build_report(load_inputs(sweep, baseline))
    stem = f"sweep-{sweep.pk}-report" + ("" if baseline == "auto" else f"-vs-{re.sub(r'[^A-Za-z0-9]+', '', baseline)}")
    files = export_figures(ctx["figures"], out_dir, FIGURE_FORMAT[fmt])
    if fmt == "html":
        svgs = {k: (out_dir / name).read_text() for k, name in files.items()}
        path = out_dir / f"{stem}.html"
        path.write_text(render_html(ctx, svgs))
        return path
    tex_path = out_dir / f"{stem}.tex"
    tex_path.write_text(render_tex(ctx, files), encoding="ascii")
    if fmt == "tex":
        return tex_path
    pdf, _ = compile_pdf(tex_path)
    return pdf
