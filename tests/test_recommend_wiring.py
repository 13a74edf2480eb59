"""`manage.py recommend` and the sweep page's "what to run" panel on the users' grid (issue 20):
the ranking at a measured (TP, B) equals the cost model's over the same points, an unmeasured
(TP 8, B 16) is predicted from the pooled groups, a measured point outside its interval is
marked, and --write-sweep writes a sweep file that loads."""

from __future__ import annotations

import io

import pytest
import yaml
from django.core.management import CommandError, call_command
from django.urls import reverse

from benchkit.compare.costmodel import recommend
from benchkit.sweeps.sweepfile import loads_sweep
from runs.models import GpuSpec
from tests import usersgrid_costs as grid_costs
from tests.usersgrid import make_users_grid

pytestmark = pytest.mark.django_db

MODEL = "/models/Qwen3.5-27B"


def seed():
    call_command("seed_gpu_specs", "--model-config", f"{MODEL}={grid_costs.MODEL_CONFIG}", stdout=io.StringIO())
    GpuSpec.objects.filter(gpu_name=grid_costs.GPU_NAME).update(aliases="RTX PRO 6000")


def run_cmd(*args) -> str:
    out = io.StringIO()
    call_command("recommend", *map(str, args), stdout=out)
    return out.getvalue()


def test_measured_group_matches_the_cost_model(tmp_path):
    sweep = make_users_grid()
    seed()
    text = run_cmd(sweep.pk, "--tp", 1, "--concurrency", 8)
    # the same group through the core, without linear (its k is in no stored drafter config)
    pts = [p for p in grid_costs.groups(grid_costs.grid_points())[(1, 8)] if p.method != "linear"]
    want = recommend(pts, knee_tokens_per_step=grid_costs.knee(8))
    best = want.predictions[0]
    assert text.startswith("TP 1, concurrency 8 (measured)")
    first = text.splitlines()[2].split()
    assert first[0] == best.label and float(first[4]) == pytest.approx(best.speedup.value, abs=0.006)
    rows = {ln.split()[0]: ln for ln in text.splitlines()[2:] if ln and not ln.startswith(("note:", "best "))}
    measured = [p for p in want.predictions if p.measured_speedup is not None and p.label in rows]
    assert measured  # the top rows hold measured configurations too
    for p in measured:
        assert ("OUTSIDE interval" in rows[p.label]) == bool(p.outside_interval)
        assert f"{p.measured_speedup:.2f}" in rows[p.label]


def test_unmeasured_tp8_concurrency_16_and_write_sweep(tmp_path):
    sweep = make_users_grid()
    seed()
    target = tmp_path / "next.yaml"
    text = run_cmd(sweep.pk, "--tp", 8, "--concurrency", 16, "--write-sweep", target)
    assert text.startswith("TP 8, concurrency 16 (not measured)")
    assert "B=16 not measured: cost fitted on B=1, 8 pooled" in text
    spec = loads_sweep(target.read_text())
    assert spec.grid["tp"] == [8] and spec.grid["concurrency"] == [16]
    print(text)
    doc = yaml.safe_load(target.read_text())
    budgets = [m["tree_budget"] for m in doc["grid"]["methods"] if isinstance(m, dict)]
    assert doc["grid"]["methods"][0] == "auto" and len(budgets) == 3
    assert all(m.get("prefix_caching") is False for m in doc["grid"]["methods"] if isinstance(m, dict))


def test_sweep_page_panel_and_ridge_figure(client):
    """The page names the fragment its script loads (same selection); the fragment holds the
    panel and the ceilings figure, and a query the page refuses is refused there too."""
    sweep = make_users_grid()
    seed()
    html = client.get(reverse("analysis:sweep_detail", args=[sweep.pk]) + "?tp=4").content.decode()
    url = reverse("analysis:sweep_what_to_run", args=[sweep.pk])
    assert f'id="what-to-run-slot" data-url="{url}?tp=4"' in html and 'id="what-to-run"' not in html
    fragment = client.get(url).content.decode()
    assert 'id="what-to-run"' in fragment and "TP 4 · concurrency 8" in fragment
    assert 'id="fig-ridge-plot"' in fragment
    only_tp4 = client.get(url + "?tp=4").content.decode()
    assert "TP 4 · concurrency 8" in only_tp4 and "TP 1 · concurrency" not in only_tp4
    assert client.get(url + "?tp=banana").status_code == 400


def test_output_len_picks_the_fitted_shape():
    """`--output-len` fits on the runs of that output length; one the sweep lacks is a clear error."""
    sweep = make_users_grid()
    seed()
    out_len = sweep.runs.values_list("output_len", flat=True).first()
    assert run_cmd(sweep.pk, "--tp", 1, "--concurrency", 8, "--output-len", out_len) == \
        run_cmd(sweep.pk, "--tp", 1, "--concurrency", 8)
    with pytest.raises(CommandError, match=f"sweep {sweep.pk} has no counted run of output length 7"):
        run_cmd(sweep.pk, "--output-len", 7)


def test_bad_arguments_are_clear_errors(tmp_path):
    """Found by a new user's trial: a TP the sweep lacks printed nothing and exited 0, a negative
    concurrency printed negative speedups, --top 0 wrote every candidate, and an unwritable
    --write-sweep ended in a traceback. Each is now a CommandError naming what is wrong."""
    sweep = make_users_grid()
    seed()
    with pytest.raises(CommandError, match=f"sweep {sweep.pk} has no counted run at TP 99 \\(its TPs: 1, 4, 8\\)"):
        run_cmd(sweep.pk, "--tp", 99)
    for flag in ("--tp", "--concurrency", "--output-len", "--top"):
        for bad in ("0", "-5"):
            with pytest.raises(CommandError, match="must be >= 1"):
                run_cmd(sweep.pk, flag, bad)
    with pytest.raises(CommandError, match=f"--write-sweep {tmp_path}/no/such/dir/x.yaml: No such file or directory"):
        run_cmd(sweep.pk, "--tp", 8, "--concurrency", 16, "--write-sweep", tmp_path / "no/such/dir/x.yaml")
    with pytest.raises(CommandError, match="Is a directory"):
        run_cmd(sweep.pk, "--tp", 8, "--concurrency", 16, "--write-sweep", tmp_path)


def test_panel_and_command_give_the_same_rows_with_per_position_acceptance(client):
    """Issue 32: the what-to-run panel and `manage.py recommend` read the same fields
    (analysis.recommend.POINT_FIELDS), so with per-position acceptance stored they give the same
    rows and figures (the panel once lacked per_position_acceptance_rate and ranked otherwise)."""
    from analysis import recommend as rec
    from runs import selectors
    from runs.ceilings import ceiling_inputs
    from runs.models import Run, RunMetrics
    from runs.services import summaries

    sweep = make_users_grid()
    seed()
    # a chain drafter at k=4 (the demo's draft_model): per-position acceptance predicts other k
    Run.objects.filter(sweep=sweep, method="linear").update(method="draft_model", num_speculative_tokens=4)
    RunMetrics.objects.filter(run__sweep=sweep, run__method="draft_model").update(
        per_position_acceptance_rate=[0.9, 0.7, 0.55, 0.4], acceptance_length=3.55)
    summaries.mark_stale([sweep.pk])
    resp = client.get(reverse("analysis:sweep_what_to_run", args=[sweep.pk]))
    panel = resp.context["what_to_run"]
    points = selectors.figure_points(sweep.pk, rec.POINT_FIELDS, None)
    assert points and all(p.per_position_acceptance_rate for p in points if p.method == "draft_model")
    inputs = ceiling_inputs({p.model for p in points} | {p.drafter for p in points}, {p.host_id for p in points})
    command = rec.panel_context(points, inputs)
    assert [(e["tp"], e["concurrency"], e["rows"]) for e in panel] == \
        [(e["tp"], e["concurrency"], e["rows"]) for e in command]
    text = run_cmd(sweep.pk, "--tp", 4, "--concurrency", 8)
    first = next(e for e in panel if (e["tp"], e["concurrency"]) == (4, 8))["rows"][0]
    assert f"{first['label']:<16}" in text and f"{first['speedup']:>9.2f}" in text
