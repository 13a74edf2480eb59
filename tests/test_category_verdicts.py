"""Verdicts per prompt category (issue 33's done-when): a sweep on the synthetic engine build with
category-dependent acceptance, through the real runner and the worker's storage. Prompts of two
categories (a JSON-lines file with `category`): configuration A accepts much more on `code`
than on `prose` (forced tau 3.0 vs 1.2), configuration B accepts the same on both (tau 2.0), each
at a 12 ms verify step against AR's 10 ms token. The costs imply decode speedups of 10 / (12 /
tau): A 2.5x on code and 1.0x on prose, B 1.67x on both, so A must win code and B must win
prose, beyond noise, and the all-prompts headline must say it pools categories that disagree.
The stored per-category figures must equal a hand computation from the stored request logs; a
bad dataset file is refused with its `file:line: field: reason` and stores nothing. Plus the pure
matrix rules on hand-made points."""

from __future__ import annotations

import gc
import json
import statistics
from pathlib import Path

import pytest
from django.urls import reverse

from benchkit.compare import categories as cm
from benchkit.compare import verdicts
from benchkit.compare.speedups import DECODE
from benchkit.hosts.inventory import HostInventory
from benchkit.measure.logs import decode_logs
from benchkit.point import Point
from benchkit.sweeps.sweepfile import SweepError, parse_sweep
from runs.models import RequestLogBlob, Run, RunState, Sweep
from runs.selectors import category_figures, counted_points
from runs.services import dispatch, execution
from runs.services.hosts import get_or_create_host, record_inventory
from runs.services.sweeps import create_sweep
from tests.celeryproc import SYNTHETIC_FLAGS, synthetic_model

PER_CATEGORY, OUT = 5, 24


def dataset(path, per_category: int = 8) -> str:
    rows = [{"prompt": f"{cat}: prompt {i} " + "x" * (8 + i), "category": cat}
            for cat in ("code", "prose") for i in range(per_category)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def sweep_doc(model, data: str) -> dict:
    spec = ["--spec-counters", "--per-request-spec-decode-metrics", "summary"]
    return {
        "name": "categories", "engine": "vllm", "engine_build": "synthetic", "model": str(model),
        "server": {"served_model_name": "synthetic", "load_format": "dummy",
                   "extra_args": ["--ttft-ms", "5", "--gap-ms", "10"]},
        "grid": {"tp": [1], "concurrency": [1], "output_len": [OUT], "input_len": [8], "methods": [
            "auto",
            {"method": "draft_model", "num_speculative_tokens": 4, "drafter": str(model),
             "extra_args": ["--gap-ms", "12", *spec, "--tau-by-prefix", "code:=3.0,prose:=1.2"]},
            {"method": "ngram", "num_speculative_tokens": 4,
             "extra_args": ["--gap-ms", "12", *spec, "--tau-by-prefix", "code:=2.0,prose:=2.0"]}]},
        "workload": {"dataset": "jsonl", "dataset_path": data, "prompts_per_category": PER_CATEGORY,
                     "num_prompts": 2 * PER_CATEGORY, "warmup_requests": 1, "ignore_eos": True, "seed": 0},
        "limits": {"ready_timeout_s": 30, "request_timeout_s": 30, "run_timeout_s": 120, "stop_timeout_s": 5},
        "repeats": 3,
    }


def assert_categories_are_the_logs(r: Run, categories: list[str], per_category: int) -> None:
    """The run's stored figures per category equal a hand computation from its stored request
    logs: requests, median TPOT ((last token message - first) / (output tokens - 1), MEASUREMENT.md),
    output tokens, and tau (1 + accepted / verify steps of the per-request spec figures)."""
    blob = RequestLogBlob.objects.get(run=r)
    logs = [x for x in decode_logs(bytes(blob.data)) if not x.warmup]
    stored = {c["category"]: c for c in r.metrics.categories}
    assert sorted(stored) == categories
    for cat, figs in stored.items():
        mine = [x for x in logs if x.category == cat]
        assert figs["requests"] == len(mine) == per_category
        tpots, tokens = [], 0
        for x in mine:
            times = [e.t_ns for e in x.events if e.tokens > 0]
            n = x.completion_tokens if x.completion_tokens is not None else sum(e.tokens for e in x.events)
            tpots.append((times[-1] - times[0]) / 1e6 / (n - 1))
            tokens += n
        assert figs["median_tpot_ms"] == pytest.approx(statistics.median(tpots), rel=1e-9)
        assert figs["output_tokens"] == tokens == per_category * OUT
        if r.method != "auto":
            steps = sum(x.spec_steps for x in mine)
            accepted = sum(x.spec_accepted_tokens for x in mine)
            assert figs["tau_token_weighted"] == pytest.approx(1 + accepted / steps, rel=1e-9)
        else:
            assert figs["tau_token_weighted"] is None and figs["spec_requests"] == 0


def _run_sweep(spec_doc: dict, host_name: str) -> list[Run]:
    host = get_or_create_host(host_name)
    record_inventory(host, HostInventory(hostname=host_name, gpus=[]))
    sweep = create_sweep(parse_sweep(spec_doc, source=f"test:{host_name}"), host, source="test", enqueue=False)
    for group in dispatch.server_groups(list(Run.objects.filter(sweep=sweep).order_by("id"))):
        execution.execute_group(group)
    gc.collect()
    runs = list(Run.objects.filter(sweep=sweep).select_related("metrics").order_by("id"))
    assert [r.state for r in runs] == [RunState.SUCCEEDED] * len(runs), [(r.failure_reason, r.failure_message)
                                                                          for r in runs]
    return runs


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("kind", "fixture", "cats"), [
    ("speed_bench", "speed_bench_qualitative.jsonl", ["coding", "math", "writing"]),
    ("mt_bench", "spec_bench_question.jsonl", ["coding", "math_reasoning", "writing"]),
])
def test_speed_bench_and_mt_bench_files_store_figures_per_category(kind, fixture, cats, tmp_path, monkeypatch,
                                                                   settings):
    """A SPEED-Bench-layout and an MT-Bench-layout file (tests/fixtures/datasets, to the real
    schemas) through the real runner: every request keeps its file's category and the stored
    figures per category equal the hand computation from the request logs."""
    monkeypatch.setenv("DRAFTBOARD_ENGINE_FLAGS", str(SYNTHETIC_FLAGS))
    settings.DRAFTBOARD_RUNS_DIR = str(tmp_path / "runs")
    monkeypatch.setattr(dispatch, "enqueue_lossless", lambda sid, q: None)
    monkeypatch.setattr(dispatch, "enqueue_detection", lambda sid, q: None)
    model = synthetic_model(tmp_path)
    doc = sweep_doc(model, str(Path(__file__).parent / "fixtures" / "datasets" / fixture))
    doc["grid"]["methods"] = doc["grid"]["methods"][:2]
    doc["workload"].update(dataset=kind, prompts_per_category=2, num_prompts=6, warmup_requests=1)
    doc["repeats"] = 1
    for r in _run_sweep(doc, f"{kind.replace('_', '-')}-box"):
        assert r.dataset.startswith(f"{kind}:")
        assert_categories_are_the_logs(r, cats, 2)


@pytest.mark.django_db(transaction=True)
def test_category_matrix_names_the_winners_the_costs_imply(tmp_path, monkeypatch, settings, client, admin_user):
    monkeypatch.setenv("DRAFTBOARD_ENGINE_FLAGS", str(SYNTHETIC_FLAGS))
    settings.DRAFTBOARD_RUNS_DIR = str(tmp_path / "runs")
    monkeypatch.setattr(dispatch, "enqueue_lossless", lambda sid, q: None)
    monkeypatch.setattr(dispatch, "enqueue_detection", lambda sid, q: None)
    model = synthetic_model(tmp_path)
    runs = _run_sweep(sweep_doc(model, dataset(tmp_path / "prompts.jsonl")), "cat-box")
    assert len(runs) == 9
    sweep = runs[0].sweep

    for r in runs:  # stored per-category figures = a hand computation from the stored request logs
        assert_categories_are_the_logs(r, ["code", "prose"], PER_CATEGORY)

    points = counted_points(runs)
    by_run = category_figures(sweep.pk)
    m = cm.category_matrix(points, by_run, DECODE)
    rows = {r.category: r for r in m.rows}
    table = {cat: {c["label"]: c["ratio"].value for c in r.cells} for cat, r in rows.items()}
    print(f"\ncategory matrix (decode speedup): {table}")
    for r in m.rows:
        print(f"  {r.sentence}")
    print(f"  {m.pooled_note}")
    a, b = "draft_model k=4", "ngram k=4"
    assert table["code"][a] == pytest.approx(2.5, rel=0.15) and table["prose"][a] == pytest.approx(1.0, rel=0.15)
    assert table["code"][b] == pytest.approx(10 / 6, rel=0.15) and table["prose"][b] == pytest.approx(10 / 6, rel=0.15)
    assert rows["code"].verdict.kind == verdicts.WINNER and rows["code"].verdict.winner.label == a
    assert rows["prose"].verdict.kind == verdicts.WINNER and rows["prose"].verdict.winner.label == b
    assert rows["code"].taus[a] == pytest.approx(3.0, rel=0.1) and rows["prose"].taus[a] == pytest.approx(1.2, rel=0.1)
    assert m.disagree and "pools 2 categories" in m.pooled_note and "disagree beyond noise" in m.pooled_note

    # the sweep page shows the matrix and the pooling sentence
    html = client.get(reverse("analysis:sweep_detail", args=[sweep.pk])).content.decode()
    assert 'id="categories"' in html and "on code: draft_model k=4 is fastest" in html
    assert "on prose: ngram k=4 is fastest" in html
    pools = html[html.index('id="headline-pools"'):]
    assert pools.index("disagree beyond noise") < pools.index("</p>")  # the headline itself says it pools


def test_bad_dataset_files_are_refused_with_file_line_and_store_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTBOARD_ENGINE_FLAGS", str(SYNTHETIC_FLAGS))
    model = synthetic_model(tmp_path)
    cases = {
        "empty category": ('{"prompt": "a", "category": "code"}\n{"prompt": "b", "category": ""}\n',
                           ":2: category:"),
        "missing prompt": ('{"category": "code"}\n', ":1: prompt:"),
        "too few per category": ("".join(json.dumps({"prompt": f"p{i}", "category": "code"}) + "\n" for i in range(3)),
                                 "code"),
    }
    for name, (text, expected) in cases.items():
        path = tmp_path / f"{name.replace(' ', '_')}.jsonl"
        path.write_text(text)
        spec = parse_sweep(sweep_doc(model, str(path)), source="test:bad")
        with pytest.raises(SweepError) as err:
            spec.check_datasets()
        assert str(path) in str(err.value) and expected in str(err.value), (name, str(err.value))
        assert "workload.dataset_path" in str(err.value)
    missing = parse_sweep(sweep_doc(model, str(tmp_path / "nope.jsonl")), source="test:bad")
    with pytest.raises(SweepError, match="nope.jsonl"):
        missing.check_datasets()
    assert missing.check_datasets(missing_ok=True) == 0  # left to the GPU host's preflight


@pytest.mark.django_db
def test_create_sweep_refuses_a_bad_dataset_and_stores_nothing(tmp_path, monkeypatch, settings):
    monkeypatch.setenv("DRAFTBOARD_ENGINE_FLAGS", str(SYNTHETIC_FLAGS))
    model = synthetic_model(tmp_path)
    host = get_or_create_host(settings.DRAFTBOARD_HOST)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "category": 3}\n')
    spec = parse_sweep(sweep_doc(model, str(bad)), source="test:bad")
    with pytest.raises(SweepError, match=r"bad\.jsonl:1: category"):
        create_sweep(spec, host, source="test", enqueue=False)
    assert Sweep.objects.count() == 0 and Run.objects.count() == 0


def test_sweep_file_refuses_category_options_on_random_prompts(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTBOARD_ENGINE_FLAGS", str(SYNTHETIC_FLAGS))
    doc = sweep_doc(synthetic_model(tmp_path), "x")
    doc["workload"] = {"dataset": "random", "prompts_per_category": 4}
    with pytest.raises(SweepError, match="prompts_per_category: dataset 'random' has no categories"):
        parse_sweep(doc, source="test:bad")
    doc["workload"] = {"dataset": "jsonl", "dataset_path": "x", "dataset_split": "qualitative"}
    with pytest.raises(SweepError, match="dataset_split: only dataset speed_bench has splits"):
        parse_sweep(doc, source="test:bad")


def _point(run_id: int, label_method: str, k: int | None, rep: int, tpot: float) -> Point:
    return Point(method=label_method, num_speculative_tokens=k, run_id=run_id, repeat_index=rep,
                 figures_={"median_tpot_ms": tpot, "output_throughput_tok_s": 1000 / tpot})


def test_matrix_rules_on_hand_made_points():
    """A category with too few requests gives no figure and says so; a run without categories
    gives none; single runs give no verdict; agreeing categories are not 'disagree'."""
    pts, figs = [], {}
    rid = 0
    for method, k, code, chat in (("auto", None, 10.0, 10.0), ("ngram", 4, 5.0, 8.0)):
        for rep in range(3):
            rid += 1
            pts.append(_point(rid, method, k, rep, 9.0))
            figs[rid] = [{"category": "code", "requests": 6, "median_tpot_ms": code + 0.01 * rep,
                          "output_throughput_tok_s": 1000 / code, "tau_token_weighted": None},
                         {"category": "chat", "requests": 2, "median_tpot_ms": chat,
                          "output_throughput_tok_s": 1000 / chat, "tau_token_weighted": None}]
    m = cm.category_matrix(pts, figs, DECODE)
    rows = {r.category: r for r in m.rows}
    assert rows["code"].verdict.kind == verdicts.WINNER and rows["code"].verdict.winner.label == "ngram k=4"
    assert rows["code"].ratios["ngram k=4"].value == pytest.approx(2.0, rel=0.01)
    assert "too few for a figure" in rows["chat"].sentence and rows["chat"].ratios["ngram k=4"].value is None
    assert not m.disagree and "pools 2 categories" in m.pooled_note
    assert cm.category_matrix(pts, {}, DECODE) is None
    single = cm.category_matrix([p for p in pts if p.repeat_index == 0], figs, DECODE)
    assert {r.category: r.verdict.kind for r in single.rows}["code"] == verdicts.SINGLE
