"""Issue 9: the sweep page of the users' grid (tests/usersgrid.py, stored through the real
services) in a real headless Chromium, read back from what plotly.js drew
(`document.getElementById(...).data`): the best TP1 cell is b15 at 6.5x autoregressive and 1.63x
linear DFlash end-to-end (switched with the page's own speedup and baseline selectors; single runs:
no verdict, no star), the TP-scaling panel at
concurrency 1 goes down from TP4 to TP8, a figure without data says why, a clicked cell opens
its run, and the browser logs no error. No vLLM server is needed."""

from __future__ import annotations

import pytest

from tests.browserpage import chromium_page
from tests.usersgrid import make_users_grid

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

READ_HEATMAP = """() => document.getElementById('fig-speedup').data.map(
    t => ({meta: t.meta, x: t.x, y: t.y, z: t.z, text: t.text}))"""
READ_SCALING = """() => document.getElementById('fig-tp_scaling').data.map(
    t => ({name: t.name, meta: t.meta, x: t.x, y: t.y}))"""


def best_tp1_cell(traces, conc=1):
    trace = next(t for t in traces if t["meta"]["concurrency"] == conc)
    col = trace["x"].index("TP1")
    value, label = max((row[col], trace["y"][r]) for r, row in enumerate(trace["z"]) if row[col] is not None)
    return label, value, trace["text"][trace["y"].index(label)][col]


@pytest.fixture
def users_grid():
    return make_users_grid().pk  # no ORM inside playwright's event loop


def test_users_grid_sweep_page_reads_right(live_server, users_grid, chromium_path):
    errors: list[str] = []
    with chromium_page(chromium_path, errors, viewport={"width": 1400, "height": 1000}) as page:
        page.goto(f"{live_server.url}/sweeps/{users_grid}/")
        page.wait_for_selector("#sweep-figures[data-state=ready]", timeout=30_000)
        assert page.locator("#sweep-figures .js-plotly-plot").count() == 4  # every figure has data
        # the what-to-run panel arrives after the page, as a fragment of the same selection
        page.wait_for_selector("#what-to-run-slot[data-state=ready]", timeout=30_000)
        assert page.locator("#what-to-run-slot #what-to-run h2").inner_text().startswith("What to run")

        heat = page.evaluate(READ_HEATMAP)
        assert [t["meta"]["speedup"] for t in heat] == ["decode", "end_to_end"]  # the default, stated on the page
        assert best_tp1_cell(heat)[0] == "b15"
        assert "Speedups shown: decode speedup at concurrency 1" in page.locator(".speedup-choice").inner_text()
        assert page.locator("td.verdict-single").first.inner_text().startswith("single runs: no verdict")

        # the speedup selector: end-to-end everywhere; single runs, so no cell is starred
        page.select_option("select[name=speedup]", "e2e")
        page.wait_for_url("**speedup=e2e**")
        page.wait_for_selector("#sweep-figures[data-state=ready]", timeout=30_000)
        label, value, text = best_tp1_cell(page.evaluate(READ_HEATMAP))
        assert (label, round(value, 2), text) == ("b15", 6.5, "6.50×<br>single run")

        scaling = [t for t in page.evaluate(READ_SCALING) if t["meta"]["concurrency"] == 1]
        assert len(scaling) == 6
        for t in scaling:
            y = dict(zip(t["x"], t["y"], strict=True))
            assert y["TP4"] > y["TP8"], t["name"]  # single requests: TP4 beats TP8 (PCIe, two sockets)

        # the baseline selector: the page reloads with ?baseline=linear, the figures follow
        page.select_option("select[name=baseline]", "linear")
        page.wait_for_url("**baseline=linear**")
        page.wait_for_selector("#sweep-figures[data-state=ready]", timeout=30_000)
        label, value, text = best_tp1_cell(page.evaluate(READ_HEATMAP))
        assert (label, round(value, 2)) == ("b15", 1.63) and text.startswith("1.63×")
        assert "speedup=e2e" in page.url  # the selection kept the speedup choice

        # one TP degree selected: the TP-scaling figure says why it draws nothing
        page.goto(f"{live_server.url}/sweeps/{users_grid}/?tp=1")
        page.wait_for_selector("#sweep-figures[data-state=ready]", timeout=30_000)
        assert page.locator("#fig-tp_scaling.figure-empty").inner_text().endswith(
            "One TP degree only (TP1): nothing to scale.")
        assert page.locator("#fig-tp_scaling .main-svg").count() == 0  # no empty axes

        # a cell links to its run: click the best TP1 cell of the concurrency-1 panel
        page.goto(f"{live_server.url}/sweeps/{users_grid}/")
        page.wait_for_selector("#sweep-figures[data-state=ready]", timeout=30_000)
        x, y = page.evaluate("""() => {
            const gd = document.getElementById('fig-speedup'), t = gd.data[0], L = gd._fullLayout;
            gd.scrollIntoView();
            const xa = L[t.xaxis.replace('x', 'xaxis')], ya = L[t.yaxis.replace('y', 'yaxis')];
            const box = gd.getBoundingClientRect();
            return [box.left + xa._offset + xa.l2p(t.x.indexOf('TP1')),
                    box.top + ya._offset + ya.l2p(t.y.indexOf('b15'))];
        }""")
        page.mouse.click(x, y)
        page.wait_for_url("**/runs/*/")
        assert "b15 · TP1 · concurrency 1" in page.locator("h1").inner_text()
    assert errors == []


def test_throughput_figure_y_axis_switch_redraws_in_the_browser(live_server, users_grid, chromium_path):
    """Issue 12: the TP-scaling figure's y-axis selector draws each figure of data.json's
    "throughput_y": the users' grid stores no GPU telemetry or per-GPU figures, so "J per output
    token" says why it draws nothing; back to output tok/s, the lines are there again."""
    errors: list[str] = []
    with chromium_page(chromium_path, errors, viewport={"width": 1400, "height": 1000}) as page:
        page.goto(f"{live_server.url}/sweeps/{users_grid}/")
        page.wait_for_selector("#sweep-figures[data-state=ready]", timeout=30_000)
        options = page.eval_on_selector_all("#throughput-y option", "els => els.map(e => e.value)")
        assert options == ["output_tok_s", "output_tok_s_per_gpu", "j_per_output_token", "usd_per_m_output_tokens"]
        page.select_option("#throughput-y", "j_per_output_token")
        page.wait_for_selector("#sweep-figures[data-state=ready]", timeout=30_000)
        assert page.locator("#fig-tp_scaling.figure-empty").inner_text().startswith(
            "No run in this selection has J per output token")
        assert page.locator("#fig-tp_scaling .main-svg").count() == 0
        page.select_option("#throughput-y", "output_tok_s")
        page.wait_for_selector("#sweep-figures[data-state=ready]", timeout=30_000)
        scaling = [t for t in page.evaluate(READ_SCALING) if t["meta"]["concurrency"] == 1]
        assert len(scaling) == 6
        assert page.locator("#fig-tp_scaling").evaluate("el => el.layout.yaxis.title.text").startswith(
            "output tokens/s")
    assert errors == []
