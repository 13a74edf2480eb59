"""Issue 23: the sweep report. Built from the users' grid (tests/usersgrid.py, stored through the
real services), compiled by the real pdflatex, read back with pdftotext: the PDF says what the
sweep page says (the same builders), its TeX escapes every value and fits the page."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

from analysis import report
from analysis.tex import tex_escape
from runs.models import Run
from tests.usersgrid import make_users_grid

pytestmark = pytest.mark.django_db


@pytest.fixture
def grid():
    return make_users_grid()


def pdf_text(pdf: Path) -> str:
    """The PDF's text as pdftotext reads it (layout kept: one table row per line)."""
    return subprocess.run(["pdftotext", "-layout", str(pdf), "-"], capture_output=True, text=True,
                          check=True).stdout


def squash(text: str) -> str:
    return re.sub(r"\s+", " ", text)


# --- pure parts -------------------------------------------------------------------------------


@pytest.mark.parametrize("raw, tex", [
    ("b15 & 50% of $x_1 #2 {y} ~ ^ \\", r"b15 \& 50\% of \$x{\ttfamily\char95}1 \#2 \{y\} "
                                         r"\textasciitilde{} \textasciicircum{} \textbackslash{}"),
    ("★ 6.50×<br>single run", r"$\star$ 6.50$\times$ single run"),
    ("τ ≈ 7.4 — ≠ AR", r"$\tau$ $\approx$ 7.4 --- $\neq$ AR"),
    ("Qwen/Qwen3-8B café 中", "Qwen/Qwen3-8B cafe ?"),
    (None, "--"),
])
def test_tex_escape(raw, tex):
    assert tex_escape(raw) == tex


def test_read_tex_log_finds_errors_and_overfull_boxes():
    log = report.read_tex_log("x\n! Undefined control sequence.\nOverfull \\hbox (12.5pt too wide) in paragraph at "
                              "lines 3--4\nOverfull \\hbox (0.8pt too wide) detected at line 9\n")
    assert log.errors == ["! Undefined control sequence."]
    assert [pt for pt, _ in log.overfull] == [12.5, 0.8]


def test_wrap_command_keeps_lines_short_and_pastes_back():
    cmd = "python3 -m sglang.launch_server " + " ".join(f"--opt-{i} value{i}" for i in range(30))
    lines = report.wrap_command(cmd, 60)
    assert all(len(ln) <= 60 for ln in lines)
    assert " ".join(ln.removesuffix(" \\").strip() for ln in lines) == cmd
    long = report.wrap_command("x " + "y" * 150, 60)
    assert all(len(ln) <= 60 for ln in long) and "".join(ln.strip().removesuffix("\\\\") for ln in long[1:]) \
        == "y" * 150


# --- the users' grid ----------------------------------------------------------------------------


def test_report_context_says_what_the_sweep_page_says(grid):
    ctx = report.build_report(report.load_inputs(grid))
    best = {(r["tp"], r["concurrency"]): r for r in ctx["answer"]["rows"]}
    assert {r["label"] for r in best.values()} == {"b15"}  # b15 best at every TP and concurrency
    assert best[(1, 1)]["ratios"][0]["value"] == pytest.approx(6.5, abs=5e-3)
    assert best[(4, 8)]["tok_s"] == pytest.approx(1270.8, abs=0.05)
    (c1, c8) = ctx["matrix"]
    assert (c1["concurrency"], c8["concurrency"]) == (1, 8) and c1["tps"] == ["TP1", "TP4", "TP8"]
    rows = {r["label"]: r["cells"] for r in c1["rows"]}
    assert list(rows) == ["auto", "linear", "b15", "b16", "b32", "b64"]
    # single runs: the page names no winner (verdicts), so no cell is starred; b15 ranks first (above)
    assert [c["best"] for c in rows["b15"]] == [False, False, False]
    assert rows["b15"][0]["tau"] == pytest.approx(7.4)
    # speedup ~= tau / relative step cost (the decomposition's identity, from the same library)
    assert rows["b15"][0]["value"] == pytest.approx(rows["b15"][0]["tau"] / rows["b15"][0]["cost"], rel=0.02)
    linear = report.build_report(report.load_inputs(grid, "linear"))
    assert linear["answer"]["rows"][0]["ratios"][0]["value"] == pytest.approx(1.63, abs=5e-3)


def test_failed_and_suspect_runs_are_listed_with_their_reasons(grid):
    run = Run.objects.filter(sweep=grid, tree_budget=64, tp=8, concurrency=8).get()
    Run.objects.filter(pk=run.pk).update(state="failed", failure_reason="server_start_failed",
                                         failure_message="CUDA out of memory & 50% of $HOME_dir")
    Run.objects.filter(sweep=grid, tree_budget=32, tp=1, concurrency=1).update(
        suspect=True, suspect_reasons=["clock_throttled: SM clock below 80 % of max"])
    ctx = report.build_report(report.load_inputs(grid))
    (ex,) = ctx["problems"]["excluded"]
    assert (ex["run"], ex["reason"], ex["label"]) == (run.pk, "server_start_failed", "b64")
    assert ctx["problems"]["suspect"][0]["reasons"].startswith("clock_throttled")
    tex = report.render_tex(ctx, {})
    assert r"CUDA out of memory \& 50\% of \$HOME{\ttfamily\char95}dir" in tex


def test_unknown_baseline_is_refused(grid):
    with pytest.raises(CommandError, match="baseline: 'eagle3' is not a configuration"):
        call_command("report", str(grid.pk), "--baseline", "eagle3", "--format", "tex", "--out", "/tmp/x")


def test_report_link_and_html_view(client, grid):
    page = client.get(reverse("analysis:sweep_detail", args=[grid.pk])).content.decode()
    assert f'href="/sweeps/{grid.pk}/report/"' in page
    html = client.get(reverse("analysis:sweep_report", args=[grid.pk])).content.decode()
    text = squash(re.sub(r"<[^>]+>", " ", html))
    assert "At TP4 and concurrency 8: b15" in text and "1270.8 tok/s" in text
    assert client.get(reverse("analysis:sweep_report", args=[grid.pk]) + "?baseline=nope").status_code == 400


# --- compiled by the real pdflatex -----------------------------------------------------------------

needs_tex = pytest.mark.skipif(not (shutil.which("pdflatex") and shutil.which("pdftotext")),
                               reason="needs pdflatex and pdftotext: bash scripts/system_deps.sh")


@pytest.mark.pdflatex
@needs_tex
def test_users_grid_report_compiles_and_reads_back_the_headline(grid, tmp_path):
    pytest.importorskip("kaleido")
    out = tmp_path / "report"
    call_command("report", str(grid.pk), "--out", str(out))
    pdf = out / f"sweep-{grid.pk}-report.pdf"
    assert pdf.is_file()
    log = report.read_tex_log((out / f"sweep-{grid.pk}-report.log").read_text(errors="replace"))
    assert log.errors == [] and all(pt <= report.OVERFULL_LIMIT_PT for pt, _ in log.overfull), log.overfull
    for key in ("speedup", "decomposition", "tp_scaling", "tradeoff"):  # vector figures, included
        assert (out / f"fig-{key}.pdf").read_bytes().startswith(b"%PDF")
    text = pdf_text(pdf)
    flat = squash(text)
    for tp in (1, 4, 8):
        for conc in (1, 8):
            assert re.search(rf"At TP{tp} and concurrency {conc}: b15[ ,]", flat), (tp, conc)
    # single runs: the highest point estimate is named, not in bold as a winner
    assert "At TP1 and concurrency 1: b15, the highest point estimate but no winner beyond noise (DDTree" in flat
    # pdftotext may drop a hyphen at a line break
    assert re.search(r"end-?\s*to-end speedup 6\.50× auto", flat), flat[flat.find("At TP1"):][:300]
    assert re.search(r"At TP4 and concurrency 8: b15[ ,][^;]*?, 1270\.8 tok/s", flat)
    row = next(ln for ln in text.splitlines() if re.match(r"\s*4\s+8\s+b15\s", ln))
    assert "2.89" in row and "1270.8" in row
    assert "GPU-" in text and "NUMA" in text  # the inventory, UUIDs
    assert "python3 -m sglang.launch_server" in flat or "sglang" in flat  # the exact command lines

    vs_linear = call_command_path(grid, tmp_path / "linear", "--baseline", "linear")
    assert "end-to-end speedup 1.63× linear" in squash(pdf_text(vs_linear))


def call_command_path(sweep, out: Path, *args: str) -> Path:
    from io import StringIO

    buf = StringIO()
    call_command("report", str(sweep.pk), "--out", str(out), *args, stdout=buf)
    return Path(buf.getvalue().strip())


def test_export_tex_keeps_only_the_columns_with_values(client, grid):
    tex = client.get(reverse("analysis:sweep_export", args=[grid.pk, "tex"])).content.decode()
    header = next(ln for ln in tex.splitlines() if ln.startswith("run id") or ln.startswith("run"))
    assert "output throughput (tok/s)" in header and len(header.split(" & ")) < 16
    # no GPU telemetry and no lossless check in the users' grid: those columns are left out
    assert "J per output token" not in header and "lossless" not in header.lower()
    assert "\\midrule" in tex and "b15" in tex


@pytest.mark.pdflatex
def test_html_report_file_is_self_contained(grid, tmp_path):
    pytest.importorskip("kaleido")
    path = call_command_path(grid, tmp_path, "--format", "html")
    html = path.read_text()
    assert path.suffix == ".html" and html.count("<svg") >= 4 and "plotly.min.js" not in html
    assert "At TP4 and concurrency 8: b15, the highest point estimate but no winner beyond noise" in html \
        and "1270.8 tok/s" in html


def test_answer_renders_a_headline_cell_in_any_of_its_shapes(grid):
    """The headline is dashboard.headline's to define (pairs today; a dict with a tie or a verdict
    sentence tomorrow): the report prints what it gets, the extra text included."""
    inp = report.load_inputs(grid)
    from analysis import dashboard

    page = dashboard.build_sweep_page(inp.points, inp.dims, inp.selection, inp.state_rows, inp.failures)
    head = page["headline"]
    v = head["rows"][0]["cells"][0]  # a verdicts.Verdict today
    by_run = {p.run_id: p for p in inp.points}
    got = report.answer(head, by_run)["rows"][0]
    assert got["label"] == "b15" and any(v.sentence in n for n in got["notes"])
    sp, mark = v.top.speedup, v.top.mark
    head["rows"][0]["cells"][0] = (sp, mark)
    assert report.answer(head, by_run)["rows"][0]["label"] == "b15"
    head["rows"][0]["cells"][0] = {"speedup": sp, "mark": mark, "tie": "within noise of b16"}
    got = report.answer(head, by_run)["rows"][0]
    assert got["label"] == "b15" and got["notes"] == ["within noise of b16"]
    head["rows"][0]["cells"][0] = sp
    assert report.answer(head, by_run)["rows"][0]["label"] == "b15"


@pytest.mark.pdflatex
@needs_tex
def test_a_demo_sweep_with_no_counted_run_still_compiles(tmp_path):
    """Nothing succeeded (a CPU host, no inventory): the report says so, lists the failures, and
    pdflatex compiles it (no figure to export: no browser needed)."""
    from tests.factories import finish_run, make_run, make_sweep

    sweep = make_sweep(name="demo_sweep #1 & 100% {bad}", is_demo=True)
    finish_run(make_run(sweep), ok=False, reason="server_start_failed")
    finish_run(make_run(sweep, "draft_model", k=4), ok=False, reason="server_start_failed")
    # many long reasons (a loaded 2-core demo marks every run): the list breaks across pages, where
    # a table of them was one box taller than a page (overfull \vbox: no PDF)
    for i in range(30):
        run = finish_run(make_run(sweep, "ngram", k=4, concurrency=i + 2), ok=False, reason="run_timeout")
        Run.objects.filter(pk=run.pk).update(failure_message="the load client was not scheduled in time " * 5)
    pdf = call_command_path(sweep, tmp_path)
    flat = squash(pdf_text(pdf))
    assert "demo_sweep #1 & 100% {bad}" in flat and "demo model (tiny, trained locally)" in flat
    assert "No counted run yet: nothing to answer." in flat
    assert flat.count("server_start_failed") >= 2 and "draft_model k=4" in flat


@pytest.mark.pdflatex
@needs_tex
def test_pdf_download(client, grid):
    pytest.importorskip("kaleido")
    resp = client.get(reverse("analysis:sweep_report_pdf", args=[grid.pk]) + "?baseline=linear")
    assert resp.status_code == 200 and resp["Content-Type"] == "application/pdf"
    assert resp.content.startswith(b"%PDF") and f"sweep-{grid.pk}-report-vs-linear.pdf" in resp["Content-Disposition"]


def test_gpu_efficiency_shows_the_cost_with_the_price_used(grid):
    from runs.models import GpuPrice
    from runs.selectors import cost_of

    assert report.build_report(report.load_inputs(grid))["efficiency"] == []  # no telemetry, no price
    name = "NVIDIA RTX PRO 6000 Blackwell Server Edition"  # the grid's runs record no GPU name: give one
    for r in Run.objects.filter(sweep=grid):
        r.gpus = [{**g, "name": name} for g in r.gpus]
        r.save(update_fields=["gpus"])
    GpuPrice.objects.create(gpu_name=name, usd_per_gpu_hour="2.5")
    run = Run.objects.select_related("metrics").get(sweep=grid, tree_budget=15, tp=4, concurrency=8)
    rows = {r["run"]: r for r in report.build_report(report.load_inputs(grid))["efficiency"]}
    assert len(rows) == 36 and rows[run.pk]["price_usd_per_gpu_hour"] == 2.5
    assert rows[run.pk]["cost_usd_per_m_output_tokens"] == pytest.approx(cost_of(run, run.metrics)[0])


@pytest.mark.pdflatex
@needs_tex
def test_demo_shaped_sweep_report_reads_back_the_page_headline(tmp_path):
    """The demo sweep's shape (sweeps/demo.yaml: a CPU host without GPUs, auto, draft_model k=2 and
    k=4, ngram k=4 x concurrency 1 and 4, demo model) built with the factories: the PDF compiles and
    says, for every headline cell, the configuration and speedup the sweep page's headline gives."""
    pytest.importorskip("kaleido")
    from analysis import dashboard
    from benchkit.hosts.inventory import HostInventory
    from runs.services.hosts import record_inventory
    from tests.factories import finish_run, make_host, make_run, make_sweep

    host = make_host("cpu-box")
    record_inventory(host, HostInventory(hostname="cpu-box"))
    sweep = make_sweep(host, name="demo", is_demo=True)
    for conc in (1, 4):
        finish_run(make_run(sweep, concurrency=conc), gap_ms=10.0)
        for method, k, per_msg, gap in (("draft_model", 2, 2, 11.0), ("draft_model", 4, 3, 12.0),
                                        ("ngram", 4, 2, 10.5)):
            finish_run(make_run(sweep, method, k=k, concurrency=conc), tokens_per_msg=per_msg, gap_ms=gap,
                       spec_decode={"acceptance_length": float(per_msg)})
    # the demo's model paths sit in a deep var dir: a long path must break, not overrun the text
    deep = "/tmp/pytest-of-root/pytest-105/models0"  # as a CI run had them: an overfull line without breaks
    Run.objects.filter(sweep=sweep).update(model=f"{deep}/target")
    Run.objects.filter(sweep=sweep).exclude(method="auto").update(drafter=f"{deep}/draft")
    pdf = call_command_path(sweep, tmp_path)
    flat = squash(pdf_text(pdf))
    inp = report.load_inputs(sweep)
    page = dashboard.build_sweep_page(inp.points, inp.dims, inp.selection, inp.state_rows, inp.failures)
    for row in page["headline"]["rows"]:
        for conc, v in zip(page["headline"]["concurrency"], row["cells"], strict=True):
            sp = (v.winner or v.top).speedup
            assert re.search(rf"At TP{row['tp']} and concurrency {conc}: {re.escape(sp.label)}[ ,]", flat), flat
            assert f"end-to-end speedup {sp.value:.2f}× auto" in flat
    assert "No GPUs: this host runs CPU servers only." in flat and "demo model (tiny, trained locally)" in flat
