"""The sweep page of the users' grid (tests/usersgrid.py, stored through the real services):
what a user reads off it (headline, figures' data, filters in the URL), how a point is
reproduced from its run page, and what the pages cost (SQL queries that do not grow with the
number of runs, bounded bytes)."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from analysis import views
from benchkit.specs import GpuRef, RunSpec
from benchkit.sweeps.sweepfile import loads_sweep
from runs.models import Run
from runs.services.hosts import record_inventory
from tests.test_allocation import pcie8_inventory
from tests.usersgrid import make_users_grid

pytestmark = pytest.mark.django_db


@pytest.fixture
def grid():
    return make_users_grid()


def data(client, sweep, query=""):
    resp = client.get(reverse("analysis:sweep_data", args=[sweep.pk]) + query)
    assert resp.status_code == 200, resp.content
    return resp.json()


def heat(fig, conc):
    """{(label, 'TP<n>'): (speedup, cell text)} of the heatmap panel at concurrency `conc`."""
    trace = next(t for t in fig["data"] if t["meta"]["concurrency"] == conc)
    return {(lab, tp): (trace["z"][r][c], trace["text"][r][c])
            for r, lab in enumerate(trace["y"]) for c, tp in enumerate(trace["x"])}


def best_in_column(cells, tp):
    return max(((v, lab) for (lab, t), (v, _) in cells.items() if t == tp and v is not None))


def _headline_text(client, sweep, query=""):
    html = client.get(reverse("analysis:sweep_detail", args=[sweep.pk]) + query).content.decode()
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", html[html.index('<section class="headline">'):]))


def test_headline_single_runs_name_no_winner_and_show_the_ranking(client, grid):
    text = _headline_text(client, grid)
    assert "Speedups shown: decode speedup at concurrency 1, end-to-end speedup above it (default)." in text
    assert "TP1single runs: no verdict (decode speedup: b15 " in text  # ranked, greyed, no winner
    assert "single runs: no verdict (end-to-end speedup: b15 2.89×" in text  # TP4, 8 concurrent
    assert "at concurrency 1 TP4 · b15 (281.8 tok/s" in text and "single runs: no verdict over TP4 · b16" in text
    text = _headline_text(client, grid, "?speedup=e2e")
    assert "TP1single runs: no verdict (end-to-end speedup: b15 6.50×, b16 6.31×" in text  # DOMAIN.md: 6.5x at TP1
    html = client.get(reverse("analysis:sweep_detail", args=[grid.pk]) + "?speedup=e2e").content.decode()
    assert "<strong>b15</strong>" not in html.split('<section class="headline">')[1].split("Highest output")[0]


def test_headline_says_which_budget_at_which_tp_by_how_much(client):
    grid = make_users_grid(repeats=3)  # repeats measure the same figures: intervals of zero width, separated
    text = _headline_text(client, grid, "?speedup=e2e")
    assert "TP1b15 6.50× end-to-end speedup (95% CI 6.50–6.50, 3 repeats; runner-up b16 6.31×" in text  # DOMAIN.md
    assert "b15 2.89× end-to-end speedup (95% CI" in text  # TP4, 8 concurrent: 1270.8 tok/s aggregate
    assert "at concurrency 1 TP4 · b15 (281.8 tok/s" in text  # single requests: TP4 beats TP8
    assert "TP1b15 " in _headline_text(client, grid) and "× decode speedup (95% CI" in _headline_text(client, grid)
    linear = client.get(reverse("analysis:sweep_detail", args=[grid.pk]) + "?baseline=linear&speedup=e2e")
    assert "<strong>b15</strong> 1.63× end-to-end speedup" in linear.content.decode()  # DOMAIN.md: 1.63x linear


def test_heatmap_best_tp1_cell_is_b15_at_six_and_a_half(client, grid):
    fig = data(client, grid, "?speedup=e2e")["figures"]["speedup"]
    cells = heat(fig, 1)
    assert best_in_column(cells, "TP1") == (pytest.approx(6.5, abs=5e-3), "b15")
    assert cells[("b15", "TP1")][1] == "6.50×<br>single run"  # single runs: no ★
    assert [t["meta"]["concurrency"] for t in fig["data"]] == [1, 8]
    assert [t["meta"]["speedup"] for t in fig["data"]] == ["end_to_end", "end_to_end"]
    assert fig["data"][0]["y"] == ["auto", "linear", "b15", "b16", "b32", "b64"]
    default = data(client, grid)["figures"]["speedup"]
    assert [t["meta"]["speedup"] for t in default["data"]] == ["decode", "end_to_end"]
    assert "decode speedup" in default["layout"]["annotations"][0]["text"]
    vs_linear = heat(data(client, grid, "?baseline=linear&speedup=e2e")["figures"]["speedup"], 1)
    assert best_in_column(vs_linear, "TP1") == (pytest.approx(1.63, abs=5e-3), "b15")
    assert vs_linear[("linear", "TP1")][0] == 1.0


def test_tp_scaling_at_concurrency_one_goes_down_from_tp4_to_tp8(client, grid):
    fig = data(client, grid)["figures"]["tp_scaling"]
    c1 = {t["name"]: dict(zip(t["x"], t["y"], strict=True)) for t in fig["data"] if t["meta"]["concurrency"] == 1}
    assert set(c1) == {"auto", "linear", "b15", "b16", "b32", "b64"}
    assert all(y["TP4"] > y["TP8"] for y in c1.values())
    c8 = {t["name"]: dict(zip(t["x"], t["y"], strict=True)) for t in fig["data"] if t["meta"]["concurrency"] == 8}
    assert c8["b15"]["TP4"] == pytest.approx(1270.8, abs=0.01)


def test_every_figure_has_data_or_says_why(client, grid):
    figs = data(client, grid)["figures"]
    assert all("data" in f for k, f in figs.items() if k != "temperature")
    assert figs["temperature"]["empty"].startswith("One temperature only (0)")  # the grid has one
    one_tp = data(client, grid, "?tp=1&concurrency=1")["figures"]
    assert one_tp["tp_scaling"]["empty"] == "One TP degree only (TP1): nothing to scale."
    assert one_tp["tradeoff"]["empty"].startswith("One concurrency level only (concurrency 1)")
    only_auto = data(client, grid, "?method=auto")["figures"]
    assert "only autoregressive" in only_auto["decomposition"]["empty"]


def test_filters_live_in_the_url(client, grid):
    got = data(client, grid, "?tp=1&tp=4&method=ddtree&concurrency=8")
    (trace,) = got["figures"]["speedup"]["data"]
    assert trace["x"] == ["TP1", "TP4"] and trace["y"] == ["auto", "b15", "b16", "b32", "b64"]  # + baseline row
    assert got["selection"] == {"tp": [1, 4], "concurrency": [8], "output_len": [], "method": ["ddtree"],
                                "host": [], "baseline": "auto", "speedup": "auto"}
    html = client.get(reverse("analysis:sweep_detail", args=[grid.pk]) + "?tp=1&tp=4&method=ddtree").content.decode()
    assert f'data-url="/sweeps/{grid.pk}/data.json?tp=1&amp;tp=4&amp;method=ddtree"' in html
    assert 'name="tp" value="4" checked' in html and 'name="tp" value="8">' in html
    labels = data(client, grid, "?method=b15&method=linear&baseline=linear")["figures"]["speedup"]["data"][0]["y"]
    assert labels == ["linear", "b15"]


@pytest.mark.parametrize("query, message", [
    ("?tp=abc", "tp: expected whole numbers, got 'abc'"),
    ("?concurrency=-1", "concurrency: must be >= 0"),
    ("?tp=0", "tp: must be >= 1"),
    ("?method=bogus", "method: unknown method token 'bogus'"),
    ("?baseline=eagle3", "baseline: 'eagle3' is not a configuration of this sweep's counted runs (present: auto, "
                         "linear, b15, b16, b32, b64)"),
])
def test_bad_filters_are_refused_with_the_parameter_named(client, grid, query, message):
    for name in ("sweep_detail", "sweep_data"):
        resp = client.get(reverse(f"analysis:{name}", args=[grid.pk]) + query)
        assert resp.status_code == 400 and message in resp.content.decode()


def test_run_page_reproduces_the_point(client, grid):
    run = Run.objects.get(sweep=grid, method="ddtree", tree_budget=15, tp=4, concurrency=8)
    html = client.get(reverse("analysis:run_detail", args=[run.pk])).content.decode()
    fragment = re.search(r'<pre class="fragment" id="sweep-fragment">(.*?)</pre>', html, re.S).group(1)
    fragment = fragment.replace("&#x27;", "'").replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">")
    spec = RunSpec.from_dict(run.spec)
    (again,) = loads_sweep(fragment, "fragment").expand(assign_gpus=lambda tp: [GpuRef(**g) for g in run.gpus])
    assert again.point_fields() == spec.point_fields() and again.gpus == spec.gpus
    assert "gpus:\n  4: [0, 1, 2, 3]" in fragment
    assert "--speculative-algorithm DDTREE" in html and "--speculative-ddtree-budget 15" in html
    assert "CUDA_VISIBLE_DEVICES=" in html and "python3 -m sglang.launch_server" in html


def test_run_list_is_paginated_and_filtered(client, grid, monkeypatch):
    monkeypatch.setattr(views, "RUNS_PER_PAGE", 10)
    url = reverse("analysis:sweep_runs", args=[grid.pk])
    page1 = client.get(url).content.decode()
    assert "page 1 of 4" in page1 and page1.count('<tr class="state-') == 10
    assert client.get(url + "?method=b15&tp=4").content.decode().count('<tr class="state-') == 2
    assert "No runs." in client.get(url + "?state=failed").content.decode()
    assert client.get(url + "?state=nonsense").status_code == 400


#: Unfiltered, the sweep page's filter dimensions are read off its points (no query of their
#: own); filtered (`?tp=4&method=b15`), they come first: one query more. sweep_data: + the
#: GPU-hour price table (one query, for the cost axis of the throughput figure); sweep_detail
#: and sweep_runs: + one query reading the sweep's hosts. Points and dimensions: the sweep's stored
#: summary first (runs.models.SweepSummary; none here: the services rebuild it on commit, and a
#: test's transaction never commits), then the runs: one query more each.
#: sweep_detail and run_detail: + 3 for the ceilings (GPU specs, model configs, hosts' GPU models).
QUERIES = {"sweep_detail": 7, "sweep_data": 4, "sweep_what_to_run": 6, "sweep_runs": 4, "run_detail": 5}
FILTERED_QUERIES = {"sweep_detail": 9, "sweep_data": 6, "sweep_what_to_run": 8}


def test_query_counts_do_not_grow_with_runs(client, admin_client, django_assert_num_queries):
    small = make_users_grid("ws-small")
    big = make_users_grid("ws-big", repeats=3)  # 108 runs
    assert big.runs.count() == 3 * small.runs.count()
    sizes = {}
    for sweep in (small, big):
        for name, n in QUERIES.items():
            args = [Run.objects.filter(sweep=sweep).first().pk] if name == "run_detail" else [sweep.pk]
            with django_assert_num_queries(n):
                resp = client.get(reverse(f"analysis:{name}", args=args))
            assert resp.status_code == 200
            sizes[(name, sweep.pk)] = len(resp.content)
        for name, n in FILTERED_QUERIES.items():
            with django_assert_num_queries(n):
                resp = client.get(reverse(f"analysis:{name}", args=[sweep.pk]), {"tp": "4", "method": "b15"})
            assert resp.status_code == 200
        with django_assert_num_queries(7):  # session, user, 3 filter choices, count, the page of runs
            assert admin_client.get(reverse("admin:runs_run_changelist") + f"?sweep={sweep.pk}").status_code == 200
    # no row per run: 3x the runs, the same page (the headline names a few more run ids and CIs)
    assert sizes[("sweep_detail", big.pk)] < 1.25 * sizes[("sweep_detail", small.pk)]
    host = big.host
    for _ in range(10):
        record_inventory(host, pcie8_inventory())
    with django_assert_num_queries(5):  # host, latest snapshot + its GPUs, history (not per snapshot), scheduler
        assert client.get(reverse("analysis:host_detail", args=[host.name])).status_code == 200


def test_admin_finds_a_run_by_id_without_casting_ids_to_text(admin_client, grid):
    run = Run.objects.filter(sweep=grid).last()
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as ctx:
        html = admin_client.get(reverse("admin:runs_run_changelist") + f"?q={run.pk}").content.decode()
    assert f'href="/admin/runs/run/{run.pk}/change/' in html
    assert not any("CAST" in q["sql"].upper() or "::TEXT" in q["sql"].upper() for q in ctx.captured_queries)
    assert not any('"distributions"' in q["sql"] or "server_log_tail" in q["sql"] for q in ctx.captured_queries)


def test_dimensions_read_off_the_points_equal_the_dimensions_query(grid):
    from runs import selectors

    key = lambda d: tuple(str(v) for v in d.values())  # noqa: E731
    by_query = sorted(selectors.sweep_dimensions(grid.pk), key=key)
    off_points = sorted(selectors.dimensions_of(selectors.figure_points(grid.pk, ())), key=key)
    assert len(by_query) > 10 and off_points == by_query

