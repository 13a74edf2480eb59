"""Dashboard pages, exports and the admin invalidate action against the real database."""

import json
import re

import pytest
from django.urls import reverse

from runs.models import Run, RunState
from runs.services.invalidation import invalidate_runs
from tests.factories import finish_run, make_run, make_sweep

pytestmark = pytest.mark.django_db

SD = {"acceptance_length": 2.5, "acceptance_rate": 0.375, "spec_num_drafts": 10, "spec_num_draft_tokens": 40,
      "spec_num_accepted_tokens": 15}


@pytest.fixture
def sweep():
    sw = make_sweep(is_demo=True)
    finish_run(make_run(sw, "auto"), tokens_per_msg=1, gap_ms=10)
    finish_run(make_run(sw, "draft_model", 4), tokens_per_msg=3, gap_ms=12, spec_decode=SD)
    failed = make_run(sw, "ngram", 4)
    finish_run(failed, ok=False, reason="error_rate_exceeded")
    return sw


def test_sweep_page_shows_speedup_and_demo_label(client, sweep, django_assert_num_queries):
    with django_assert_num_queries(7):  # the sweep's hosts; its (absent) stored summary (the ceilings: the fragment)
        resp = client.get(reverse("analysis:sweep_detail", args=[sweep.pk]))
    html = resp.content.decode()
    assert resp.status_code == 200
    assert "Demo model" in html
    assert 'id="fig-speedup"' in html and f'data-url="/sweeps/{sweep.pk}/data.json"' in html
    assert "error_rate_exceeded" in html  # the failed run is named, not drawn
    # the headline: single runs name no winner; the ranking by decode speedup at concurrency 1 (10 ms vs 4 ms TPOT)
    assert "single runs: no verdict</span>" in html and "(decode speedup: draft_model k=4 2.50×" in html
    data = client.get(reverse("analysis:sweep_data", args=[sweep.pk])).json()
    (trace,) = data["figures"]["speedup"]["data"]
    # 3 tokens every 12 ms vs 1 token every 10 ms: 2.4x output tok/s (same TTFT, 64 tokens)
    assert trace["y"] == ["auto", "draft_model k=4"] and trace["x"] == ["TP1"]
    assert trace["z"][1][0] == pytest.approx(2.5, rel=0.01) and trace["text"][1][0] == "2.50×<br>single run"
    assert trace["meta"]["speedup"] == "decode"  # concurrency 1: decode speedup by default
    assert data["figures"]["tp_scaling"]["empty"] == "One TP degree only (TP1): nothing to scale."
    assert data["figures"]["tradeoff"]["empty"].startswith("One concurrency level only")


def test_invalidated_run_leaves_charts_but_stays_stored(client, sweep):
    spec_run = Run.objects.get(sweep=sweep, method="draft_model")
    n, skipped = invalidate_runs([spec_run], "drafter path was wrong")
    assert (n, skipped) == (1, [])
    data = client.get(reverse("analysis:sweep_data", args=[sweep.pk]) + "?points=1").json()
    assert [row[0] for row in data["points"]["rows"]] == [Run.objects.get(sweep=sweep, method="auto").pk]
    assert data["points"]["columns"][0] == "run_id"
    spec_run.refresh_from_db()
    assert spec_run.state == RunState.INVALIDATED and spec_run.invalidated_reason == "drafter path was wrong"


def test_invalidate_needs_reason(sweep):
    with pytest.raises(ValueError, match="reason"):
        invalidate_runs(list(Run.objects.filter(sweep=sweep)), "  ")


def test_admin_invalidate_action_asks_reason(admin_client, sweep):
    run = Run.objects.get(sweep=sweep, method="auto")
    url = reverse("admin:runs_run_changelist")
    first = admin_client.post(url, {"action": "invalidate", "_selected_action": [run.pk]})
    assert first.status_code == 200 and b"reason" in first.content
    run.refresh_from_db()
    assert run.state == RunState.SUCCEEDED  # nothing happens before a reason is given
    admin_client.post(url, {"action": "invalidate", "_selected_action": [run.pk], "apply": "1",
                            "reason": "GPU was throttling"})
    run.refresh_from_db()
    assert run.state == RunState.INVALIDATED and run.invalidated_reason == "GPU was throttling"
    assert admin_client.get(url).status_code == 200


def test_admin_pages_list_every_model(admin_client, sweep):
    for name in ("host", "hardwaresnapshot", "gpu", "sweep", "run", "runmetrics", "requestlogblob", "gpulease",
                 "runtransition"):
        assert admin_client.get(reverse(f"admin:runs_{name}_changelist")).status_code == 200, name


def test_run_page_and_exports(client, sweep, django_assert_num_queries):
    run = Run.objects.get(sweep=sweep, method="draft_model")
    with django_assert_num_queries(5):  # the run with sweep, host and metrics; its transitions; 3 for the ceilings
        html = client.get(reverse("analysis:run_detail", args=[run.pk])).content.decode()
    assert "fig-ttft_ms" in html and "python -m vllm.entrypoints.openai.api_server" in html
    assert len(html) < 60_000  # histograms are binned on the server, not 4 x 5000 samples
    csv = client.get(reverse("analysis:sweep_export", args=[sweep.pk, "csv"])).content.decode()
    assert csv.splitlines()[0].startswith("run,method,TP") and len(csv.splitlines()) == 3
    tex = client.get(reverse("analysis:sweep_export", args=[sweep.pk, "tex"])).content.decode()
    assert "\\begin{tabular}" in tex and "draft{\\ttfamily\\char95}model k=4" in tex
    body = json.loads(client.get(reverse("analysis:sweep_export", args=[sweep.pk, "json"])).content)
    assert len(body["runs"]) == 2 and body["excluded"][0]["reason"] == "error_rate_exceeded"
    assert client.get(reverse("analysis:sweep_export", args=[sweep.pk, "xls"])).status_code == 404


def test_sweep_list_query_count(client, sweep, django_assert_max_num_queries):
    make_sweep(name="another")
    with django_assert_max_num_queries(3):
        resp = client.get(reverse("analysis:sweep_list"))
    assert b"test sweep" in resp.content and b"another" in resp.content


def test_sweep_page_before_any_run_succeeds_and_of_imported_runs(client):
    queued = make_sweep(name="queued")
    make_run(queued, "auto")
    html = client.get(reverse("analysis:sweep_detail", args=[queued.pk])).content.decode()
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", html))
    assert "No succeeded runs yet" in text and "0 of 1 succeeded, 1 queued or running" in text
    assert 'class="filters"' not in html  # nothing to filter yet
    from pathlib import Path

    from runs.services.imports import import_result_file
    from tests.factories import make_host

    results = Path(__file__).parent / "fixtures" / "results"
    imported = import_result_file(results / "vllm-bench-serve-full.json", make_host(), "imported",
                                  method="ngram").sweep
    assert client.get(reverse("analysis:sweep_detail", args=[imported.pk])).status_code == 200
    data = client.get(reverse("analysis:sweep_data", args=[imported.pk])).json()
    assert set(data["figures"]) == {"speedup", "decomposition", "tp_scaling", "tradeoff", "temperature"}
    run = imported.runs.get()
    html = client.get(reverse("analysis:run_detail", args=[run.pk])).content.decode()
    assert "No sweep file reproduces this run: it was imported" in html
