"""Pages of issue 12 phase 2 and issue 13 item 4/5, through Django's test client: the run page's
GPU figure and per-GPU table, client headroom, coalesced-arrivals note and tau wording; the sweep
page's throughput y-axis switch (data.json "throughput_y"); the glossary; export columns with
cost and the price used."""

from __future__ import annotations

import csv
import io
import json
import re
from decimal import Decimal

import pytest
from django.urls import reverse

from analysis import glossary
from benchkit.measure.gpu_window import NO_GPUS_NOTE
from benchkit.measure.metrics import METRIC_FIELDS
from benchkit.specs import GpuRef
from runs import selectors
from runs.models import GpuPrice, Run, RunMetrics
from runs.services.outcomes import store_outcome
from tests.factories import make_run, make_sweep
from tests.test_telemetry_django import H200, U0, U1, drive, fixture, outcome_for

pytestmark = pytest.mark.django_db


def page(client, run: Run) -> str:
    resp = client.get(reverse("analysis:run_detail", args=[run.pk]))
    assert resp.status_code == 200
    return resp.content.decode()


def json_script(html: str, element_id: str) -> dict:
    m = re.search(rf'<script id="{element_id}" type="application/json">(.*?)</script>', html, re.S)
    assert m, f"no json_script {element_id}"
    return json.loads(m.group(1))


def stored(sweep, stream, gpus, tp=1, method="auto", k=None, client=None, gap_ms=37.0) -> Run:
    run = drive(make_run(sweep, method=method, k=k, tp=tp, gpus=[GpuRef(i, u, name=H200) for i, u in gpus]))
    out = outcome_for(run, stream, client, gap_ms=gap_ms)
    assert out.ok, (out.reason, out.message)
    return store_outcome(run, out)


def test_run_page_draws_gpu_power_clock_and_utilisation_with_the_window_shaded(client):
    run = stored(make_sweep(), fixture("throttle"), [(0, U0)])
    html = page(client, run)
    fig = json_script(html, "fig-gpu")
    assert fig["title"] == "GPU power, SM clock and utilisation"
    lines = [t for t in fig["data"] if t["mode"] == "lines"]
    assert sorted((t["meta"]["quantity"], t["yaxis"]) for t in lines) == [
        ("power_w", "y"), ("sm_mhz", "y2"), ("util_pct", "y3")]
    power = next(t for t in lines if t["meta"]["quantity"] == "power_w")
    m = RunMetrics.objects.get(run=run)
    assert power["x"][0] < 0 < power["x"][-1]  # the warmup before the window shows at negative x
    (shade,) = fig["layout"]["shapes"]
    assert shade["x0"] == 0 and shade["x1"] == pytest.approx(m.duration_s)
    hot = next(t for t in fig["data"] if t["meta"]["quantity"] == "throttled")
    # throttle.json: ticks 90-104 report 0x44, i.e. 9.0-10.4 s after the first tick
    first_tick_s = power["x"][0]
    assert len(hot["x"]) == 15 and hot["x"][0] == pytest.approx(first_tick_s + 9.0, abs=1e-3)
    assert max(power["y"]) == pytest.approx(695) and min(power["y"]) == pytest.approx(83)

    # per-GPU table: power, energy and its source, clock events named, the verdicts
    table = html[html.index('id="gpu-table"'):]
    assert f"GPU 0 <code>{U0}</code>" in table and "counter" in table
    assert "0x44 (sw_power_cap, hw_thermal_slowdown)" in table
    assert "gpu_throttled: GPU 0 (" in table and "gpu_clock_drop: GPU 0 (" in table
    assert "suspect" in html[:html.index("<h2>Configuration")]


def test_gpu_series_downsamples_and_keeps_throttle_marks():
    run = stored(make_sweep(), fixture("throttle"), [(0, U0)])
    full = selectors.gpu_series(run)
    assert len(full["t_s"]) == full["n_ticks"] == 146 and full["bin_ticks"] == 1
    small = selectors.gpu_series(run, max_points=20)
    assert small["bin_ticks"] == 8 and len(small["t_s"]) == 19  # ceil(146 / 20) = 8 ticks per point
    g_full, g = full["gpus"][0], small["gpus"][0]
    assert g["power_w"][0] == pytest.approx(sum(g_full["power_w"][:8]) / 8)
    # readings 90-104 are throttled: points 11, 12 and 13 (ticks 88-111) say so
    assert [i for i, t in enumerate(g["throttled"]) if t] == [11, 12, 13]


def test_cpu_run_page_says_it_has_no_gpu_telemetry(client):
    run = stored(make_sweep(), None, [])
    html = page(client, run)
    assert NO_GPUS_NOTE in html and 'id="fig-gpu"' not in html and 'id="gpu-table"' not in html
    # no GPU model to price: the cost row says so rather than asking for a price
    assert "no GPUs, so no GPU-hour cost" in html and "no GPU-hour price set" not in html


def test_telemetry_message_of_imported_gpu_and_cpu_runs():
    from types import SimpleNamespace

    from analysis.dashboard import telemetry_message

    imported = SimpleNamespace(gpus=[], spec={"imported": "bench.json"})
    assert telemetry_message(imported, None, False) == ("no GPU telemetry: the run was imported from another "
                                                        "tool's result file")
    assert telemetry_message(SimpleNamespace(gpus=[], spec={}), None, False) == NO_GPUS_NOTE
    gpu_run = SimpleNamespace(gpus=[{"uuid": U0}], spec={})
    assert telemetry_message(gpu_run, None, False) == "no GPU telemetry was recorded for this run"
    assert telemetry_message(gpu_run, None, True) == ""


def test_run_page_shows_cost_with_the_price_it_used(client):
    run = stored(make_sweep(), fixture("clean"), [(0, U0), (1, U1)])
    html = page(client, run)
    assert "no GPU-hour price set for this GPU model" in html
    GpuPrice.objects.create(gpu_name=H200, usd_per_gpu_hour=Decimal("3.5"))
    cost, price = selectors.cost_of(run, RunMetrics.objects.get(run=run))
    html = page(client, run)
    assert f"{cost:.4f} USD at 3.5 USD per GPU-hour" in html


def test_run_page_client_headroom_coalesced_note_and_tau_wording(client):
    headroom = {"processes": 2, "cpu_s": 3.0, "max_core_share": 0.42, "loop_lag_p99_ms": 1.25, "loop_lag_max_ms": 4.5,
                "event_loop": "uvloop"}
    coalesced = stored(make_sweep(), None, [], client=headroom, gap_ms=0.05)  # 0.05 ms gaps: all coalesced
    html = page(client, coalesced)
    row = html[html.index('id="client-headroom"'):]
    assert "2 processes; busiest process 0.42 of one core; event-loop lag p99 1.25 ms, max 4.50 ms (uvloop)" in row
    assert 'id="coalesced-note"' in html and "read TPOT instead" in html
    assert "<th>ITL (ms/token) · coalesced arrivals: read TPOT</th>" in html
    assert "<th>ICL (ms) · coalesced arrivals: read TPOT</th>" in html and "<th>TPOT (ms/token)</th>" in html
    assert "1.000 of the gaps between messages below 0.1 ms" in html
    tau = html[html.index('id="tau-client"'):]
    assert "each request's first chunk left out" in tau[:600]

    spaced = stored(make_sweep(name="spaced"), None, [], gap_ms=37.0)
    html = page(client, spaced)
    assert 'id="coalesced-note"' not in html and "0.000 of the gaps between messages below 0.1 ms" in html
    assert "<th>ITL (ms/token)</th>" in html
    assert "load client</th><td>not recorded" in html


def throughput_y(client, sweep, query=""):
    resp = client.get(reverse("analysis:sweep_data", args=[sweep.pk]) + query)
    assert resp.status_code == 200
    return resp.json()["throughput_y"]


def test_sweep_throughput_figure_switches_y_axis_and_counts_points_left_out(client):
    sweep = make_sweep()
    one = stored(sweep, fixture("throttle"), [(0, U0)], tp=1)
    two = stored(sweep, fixture("clean"), [(0, U0), (1, U1)], tp=2)
    bare = stored(sweep, None, [(0, U0), (1, U1)], tp=2, method="draft_model", k=4)  # no telemetry stored
    ty = throughput_y(client, sweep)
    assert [o["key"] for o in ty["options"]] == ["output_tok_s", "output_tok_s_per_gpu", "j_per_output_token",
                                                 "usd_per_m_output_tokens"]
    figs = ty["figures"]
    assert set(figs) == {o["key"] for o in ty["options"]}
    for key, fig in figs.items():
        if "data" in fig:
            titles = [v["title"]["text"] for k, v in fig["layout"].items() if k.startswith("yaxis") and "title" in v]
            assert titles and all("output token" in t for t in titles), (key, titles)

    metrics = {r.pk: RunMetrics.objects.get(run=r) for r in (one, two, bare)}

    def ys(fig):
        return {(t["name"], x): y for t in fig["data"] for x, y in zip(t["x"], t["y"], strict=True)}

    per_gpu = ys(figs["output_tok_s_per_gpu"])
    assert per_gpu[("auto", "TP2")] == pytest.approx(metrics[two.pk].output_throughput_tok_s / 2, rel=1e-4)
    assert ("draft_model k=4", "TP2") in per_gpu  # per GPU needs no telemetry
    energy = figs["j_per_output_token"]
    assert ys(energy)[("auto", "TP1")] == pytest.approx(metrics[one.pk].energy_per_output_token_j, rel=1e-4)
    assert ("draft_model k=4", "TP2") not in ys(energy)
    assert f"1 run without J per output token left out (no GPU energy recorded), run {bare.pk}" in energy["caption"]
    assert figs["usd_per_m_output_tokens"]["empty"].startswith(
        "No run in this selection has USD per million output tokens (no GPU-hour price set")

    GpuPrice.objects.create(gpu_name=H200, usd_per_gpu_hour=Decimal("2"))
    usd = ys(throughput_y(client, sweep)["figures"]["usd_per_m_output_tokens"])
    m = metrics[two.pk]
    assert usd[("auto", "TP2")] == pytest.approx(2 * 2 * m.duration_s / 3600 / m.total_output_tokens * 1e6, rel=1e-4)


def test_sweep_page_script_has_the_switch():
    from django.contrib.staticfiles import finders

    script = open(finders.find("draftboard/sweep.js")).read()
    assert "throughput_y" in script and 'sel.id = "throughput-y"' in script


def test_glossary_defines_every_schema_field_and_is_linked_from_every_page(client):
    assert {f.name for f in METRIC_FIELDS} <= glossary.covered_fields()
    resp = client.get(reverse("analysis:glossary"))
    html = resp.content.decode()
    assert resp.status_code == 200
    for _, entries in glossary.SECTIONS:
        for e in entries:
            assert f"<th>{e.term}</th>" in html, e.term
    assert "1000 x output tokens / energy" in html and "energy / output tokens" in html
    for name in ("home", "sweep_list", "compare", "trend"):
        assert f'href="{reverse("analysis:glossary")}"' in client.get(reverse(f"analysis:{name}")).content.decode()


def test_exports_carry_efficiency_columns_and_cost_with_its_price(client):
    sweep = make_sweep()
    run = stored(sweep, fixture("clean"), [(0, U0), (1, U1)])
    GpuPrice.objects.create(gpu_name=H200, usd_per_gpu_hour=Decimal("3.5"))
    m = RunMetrics.objects.get(run=run)
    cost, _ = selectors.cost_of(run, m)
    text = client.get(reverse("analysis:sweep_export", args=[sweep.pk, "csv"])).content.decode()
    (row,) = list(csv.DictReader(io.StringIO(text)))
    assert float(row["cost per million output tokens (USD/Mtok)"]) == pytest.approx(cost)
    assert float(row["price used (USD per GPU-hour)"]) == 3.5
    assert float(row["energy per output token (J/token)"]) == pytest.approx(m.energy_per_output_token_j)
    assert float(row["output throughput per GPU (tok/s/GPU)"]) == pytest.approx(m.output_tok_s_per_gpu)
    assert row["energy source"] == "counter"
    for header in ("mean power per GPU (W)", "peak power per GPU (W)", "output tok/s per kW (tok/s/kW)"):
        assert float(row[header]) > 0, header
    data = client.get(reverse("analysis:sweep_export", args=[sweep.pk, "json"])).json()
    block = data["runs"][0]["draftboard"]
    assert block["run"]["cost_usd_per_m_output_tokens"] == pytest.approx(cost)
    assert block["run"]["price_usd_per_gpu_hour"] == 3.5
    assert block["metrics"]["energy_per_output_token_j"] == pytest.approx(m.energy_per_output_token_j)
    assert block["metrics"]["energy_source"] == "counter"
