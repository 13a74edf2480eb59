"""Issue 20 wired into the product: GPU specs in the admin table (seeded from the file, edited like
prices, used by the ceilings), the users' grid's ceilings on the run page, in the exports and in
the sweep page's verified-tokens-per-step figure, per-request acceptance on the run page and the
per-request / counters cross-check."""

from __future__ import annotations

import csv
import io
import re
from html import unescape

import pytest
from django.core.management import call_command
from django.urls import reverse

from analysis import ceilings
from benchkit.ceilings.gpus import load_gpu_specs
from benchkit.ceilings.roofline import DecodePoint, decode_ceiling
from benchkit.measure.validity import per_request_tau_gap
from runs.ceilings import ceiling_inputs, gpu_spec_rows
from runs.models import GpuSpec, Run
from runs.services.ceilings import store_model_config
from tests import usersgrid_costs as grid_costs
from tests.usersgrid import make_users_grid

pytestmark = pytest.mark.django_db

MODEL = "/models/Qwen3.5-27B"  # sweeps/users-grid-sglang.yaml
SERVER_EDITION = grid_costs.GPU_NAME


def text(html: str) -> str:
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", html)))


def seed_for_grid():
    """What an administrator does for the users' host: seed the table, name the inventory's
    "RTX PRO 6000" as the Server Edition (alias), store the model's config.json."""
    call_command("seed_gpu_specs", "--model-config", f"{MODEL}={grid_costs.MODEL_CONFIG}", stdout=io.StringIO())
    GpuSpec.objects.filter(gpu_name=SERVER_EDITION).update(aliases="RTX PRO 6000")


def test_seed_keeps_admin_edits_and_the_ceilings_read_the_table():
    out = io.StringIO()
    call_command("seed_gpu_specs", stdout=out)
    shipped = load_gpu_specs()
    assert f"{len(shipped)} created" in out.getvalue()
    assert GpuSpec.objects.count() == len(shipped)
    GpuSpec.objects.filter(gpu_name="NVIDIA H200").update(memory_bandwidth_tb_s=2.4)  # an admin edit
    call_command("seed_gpu_specs", stdout=out)  # kept
    assert GpuSpec.objects.get(gpu_name="NVIDIA H200").memory_bandwidth_tb_s == 2.4
    rows, source = gpu_spec_rows()
    assert source.startswith("admin table")
    edited = next(r for r in rows if r.gpu_name == "NVIDIA H200")
    file_row = next(r for r in shipped if r.gpu_name == "NVIDIA H200")
    _, model = grid_costs.gpu_and_model()
    point = DecodePoint(1, 0, grid_costs.CONTEXT_TOKENS)
    # half the bandwidth: twice the memory time, half the memory ceiling
    assert decode_ceiling(edited, model, point).memory_ceiling_tok_s == pytest.approx(
        decode_ceiling(file_row, model, point).memory_ceiling_tok_s / 2)
    call_command("seed_gpu_specs", "--overwrite", stdout=out)
    assert GpuSpec.objects.get(gpu_name="NVIDIA H200").memory_bandwidth_tb_s == file_row.memory_bandwidth_tb_s


def test_empty_table_falls_back_to_the_file():
    rows, source = gpu_spec_rows()
    assert source == "benchkit/ceilings/gpu_specs.yaml" and len(rows) == len(load_gpu_specs())


def test_users_grid_run_page_shows_binding_ceiling_and_achieved(client):
    sweep = make_users_grid()
    run = Run.objects.get(sweep=sweep, tp=1, concurrency=1, tree_budget=15)
    # before the admin names the GPU: the inventory's "RTX PRO 6000" is ambiguous, no ceiling
    store_model_config(MODEL, grid_costs.MODEL_CONFIG)
    page = text(client.get(reverse("analysis:run_detail", args=[run.pk])).content.decode())
    assert "No ceiling: GPU name 'RTX PRO 6000' is ambiguous" in page
    seed_for_grid()
    page = text(client.get(reverse("analysis:run_detail", args=[run.pk])).content.decode())
    gp = next(p for p in grid_costs.grid_points() if (p.tp, p.concurrency, p.point.label) == (1, 1, "b15"))
    want = grid_costs.ceiling(gp)  # the same point computed from the file's row and the fixture config
    assert f"binding {want.binding} ({want.ceiling_tok_s:.1f} output tok/s)" in page
    assert f"achieved {want.achieved_pct:.1f} % of the binding ceiling" in page
    assert "the drafter's own passes are not modelled" in page and "all-reduce" in page


def test_exports_carry_the_ceiling_columns():
    sweep = make_users_grid()
    seed_for_grid()
    from django.test import Client
    body = Client().get(reverse("analysis:sweep_export", args=[sweep.pk, "csv"])).content.decode()
    rows = list(csv.DictReader(io.StringIO(body)))
    assert len(rows) == 36
    assert {r["binding ceiling"] for r in rows} <= {"memory", "compute"} and all(r["binding ceiling"] for r in rows)
    by = {(r["TP"], r["concurrency"], r["method"]): r for r in rows}
    gp = next(p for p in grid_costs.grid_points() if (p.tp, p.concurrency, p.point.label) == (4, 8, "b64"))
    want = grid_costs.ceiling(gp)
    got = by[("4", "8", "b64")]
    assert float(got["binding ceiling (tok/s)"]) == pytest.approx(want.ceiling_tok_s)
    assert float(got["achieved (% of binding ceiling)"]) == pytest.approx(want.achieved_pct, rel=1e-6)
    js = Client().get(reverse("analysis:sweep_export", args=[sweep.pk, "json"])).json()
    ceil = {(r["draftboard"]["run"]["tp"], r["draftboard"]["run"]["concurrency"], r["draftboard"]["run"]["label"]):
            r["draftboard"]["run"]["ceiling"] for r in js["runs"]}
    assert ceil[(4, 8, "b64")]["ceiling_tok_s"] == pytest.approx(want.ceiling_tok_s)
    assert ceil[(4, 8, "b64")]["ceiling_binding"] == want.binding and ceil[(4, 8, "b64")]["ceiling_note"] == ""


def test_sweep_figure_shows_which_budgets_cross_the_ridge_at_concurrency_8():
    sweep = make_users_grid()
    seed_for_grid()
    from runs import selectors
    points = selectors.figure_points(sweep.pk, ("median_tpot_ms", "acceptance_length"), None)
    inputs = ceiling_inputs()
    crossing = ceilings.crossing_configs(points, inputs, 8)
    ridge = grid_costs.knee(8)
    want = [f"{lab} TP{tp}" for tp in (1, 4, 8) for lab in grid_costs.LABELS
            if 8 * (1 + {"auto": 0, "linear": 15, "b15": 15, "b16": 16, "b32": 32, "b64": 64}[lab]) > ridge]
    assert crossing == want and "b64 TP1" in crossing and "b15 TP1" not in crossing
    fig = ceilings.ridge_figure(points, inputs)
    names = [t["name"] for t in fig["data"]]
    assert "ridge TP1" in names and "b64 TP1" in names
    b64 = next(t for t in fig["data"] if t["name"] == "b64 TP1")
    assert b64["x"] == [1, 8] and b64["y"] == [65, 520]


def test_unknown_gpu_gives_a_note_not_a_number():
    store_model_config(MODEL, grid_costs.MODEL_CONFIG)
    answer = ceilings.ceiling_of(gpu_names=["NVIDIA Z9000"], model=MODEL, drafter="", tp=1, concurrency=1,
                                 draft_tokens=0, input_len=512, output_len=1024, tau=None, tpot_ms=10.0,
                                 inputs=ceiling_inputs())
    assert answer.ceiling is None and "no specification" in answer.note
    row = ceilings.answer_row(answer)
    assert row["ceiling_tok_s"] is None and row["ceiling_binding"] is None


def test_per_request_tau_against_counters_bound():
    assert per_request_tau_gap(4.0, 4.2) is None  # 5 %: inside
    msg = per_request_tau_gap(4.0, 5.0)
    assert msg and "25.0%" in msg
    assert per_request_tau_gap(None, 5.0) is None and per_request_tau_gap(4.0, None) is None


def test_compare_page_has_the_ceiling_column(client):
    old, new = make_users_grid(), make_users_grid()
    seed_for_grid()
    resp = client.get(reverse("analysis:compare") + f"?old={old.pk}&new={new.pk}")
    page = text(resp.content.decode())
    assert "% of ceiling" in page
    gp = next(p for p in grid_costs.grid_points() if (p.tp, p.concurrency, p.point.label) == (8, 8, "b32"))
    pct = f"{grid_costs.ceiling(gp).achieved_pct:.1f}"
    assert f"{pct} → {pct} %" in page


def test_run_page_draws_per_request_acceptance_or_says_unknown(client):
    sweep = make_users_grid()
    run = Run.objects.get(sweep=sweep, tp=1, concurrency=1, tree_budget=15)
    page = text(client.get(reverse("analysis:run_detail", args=[run.pk])).content.decode())
    assert "unknown: the engine returned no per-request spec-decode figures" in page  # never 0
    m = run.metrics
    m.acceptance_length_request_weighted, m.acceptance_length_token_weighted, m.spec_requests_reported = 5.25, 7.0, 2
    m.distributions = {**(m.distributions or {}), "tau_per_request": [3.5, 7.0],
                       "accepted_per_step_histogram": [1.0, 0.0, 2.0, 0.0, 5.0]}
    m.save()
    html = client.get(reverse("analysis:run_detail", args=[run.pk])).content.decode()
    page = text(html)
    assert "request-weighted 5.250 · token-weighted 7.000 over 2 requests" in page
    assert f"token-weighted vs counters {100 * (7.0 - 7.4) / 7.4:.1f} %" in page  # TAU[b15] = 7.4 (counters)
    assert 'id="fig-acc-tau_per_request-plot"' in html and 'id="fig-acc-accepted_per_step-plot"' in html
    assert "8 verify steps; mean 3.000 accepted per step" in page  # (2 x 2 + 4 x 5) / 8
