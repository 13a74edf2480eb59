"""Importing other tools' result files into runs, exporting runs, recomputing from logs."""

import io
import json
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test.utils import CaptureQueriesContext

from analysis.exports import run_export
from benchkit.formats.errors import ResultFileError
from runs.models import Run, RunMetrics, Sweep
from runs.selectors import window_of
from runs.services.imports import import_result_file
from runs.services.recompute import recompute_run, recompute_runs
from tests.factories import finish_run, make_host, make_run, make_sweep

pytestmark = pytest.mark.django_db
RESULTS = Path(__file__).parent / "fixtures" / "results"


def test_import_sglang_jsonl_records_source_definitions():
    sweep = import_result_file(RESULTS / "sglang-bench-serving.jsonl", make_host(), "sglang import",
                               method="draft_model", num_speculative_tokens=4).sweep
    runs = list(sweep.runs.select_related("metrics"))
    assert len(runs) == 2
    m = runs[0].metrics
    assert runs[0].engine == "sglang"  # from the tool that wrote the file
    assert m.source_tool == "sglang.bench_serving"
    assert "itl" in m.definitions  # their ITL is per chunk, stored as our ICL
    assert m.median_itl_ms is None and m.median_icl_ms is not None
    assert m.failed == 0 and runs[1].metrics.failed is None  # the older line has no errors list: unknown, not 0
    assert runs[1].metrics.total_token_throughput_tok_s == pytest.approx(224 / runs[1].metrics.duration_s)  # derived
    assert m.acceptance_length is not None and "server-wide" in m.spec_source
    assert "concurrency" in m.extra  # a key without a column is kept
    assert runs[0].state == "succeeded" and runs[0].transitions.get().from_state == "imported"


def test_malformed_file_stores_nothing(tmp_path):
    bad = tmp_path / "bad.jsonl"
    good = (RESULTS / "sglang-bench-serving.jsonl").read_text().splitlines()[0]
    bad.write_text(good + "\n" + '{"completed": "many"\n')
    with pytest.raises(CommandError, match=r"bad.jsonl:2: truncated \(ends inside an object\)"):
        call_command("import_results", str(bad), "--sweep-name", "x", "--format", "sglang", "--method", "auto")
    assert Sweep.objects.count() == 0 and Run.objects.count() == 0


def test_export_round_trips_through_the_importer(tmp_path):
    run = finish_run(make_run(make_sweep(), "draft_model", 4), tokens_per_msg=3,
                     spec_decode={"acceptance_length": 3.0, "acceptance_rate": 0.5})
    exported = run_export(run)
    assert exported["completed"] == 4 and exported["median_ttft_ms"] == pytest.approx(20.0)
    # top-level ITL keys carry vLLM's definition (per chunk, our ICL)
    assert exported["median_itl_ms"] == pytest.approx(run.metrics.median_icl_ms)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(exported, default=str))
    with pytest.raises(ResultFileError, match="acceptance_length: the file records speculative decoding"):
        import_result_file(path, make_host(), "round trip", method="auto")
    back = import_result_file(path, make_host(), "round trip", method="draft_model", num_speculative_tokens=4
                              ).sweep.runs.get().metrics
    assert back.median_itl_ms == pytest.approx(run.metrics.median_itl_ms)
    assert back.output_throughput_tok_s == pytest.approx(run.metrics.output_throughput_tok_s)
    assert window_of(back) == window_of(run.metrics)  # every figure survives export -> import
    assert back.spec_source == run.metrics.spec_source == "vllm"


def test_recompute_rederives_metrics_from_stored_logs():
    run = finish_run(make_run(make_sweep()), tokens_per_msg=2, gap_ms=8)
    before = window_of(run.metrics)
    RunMetrics.objects.filter(run=run).update(output_throughput_tok_s=0.0, median_ttft_ms=999.0)
    run = Run.objects.select_related("metrics", "request_logs").get(pk=run.pk)
    m = recompute_run(run)
    assert m.output_throughput_tok_s == pytest.approx(before.output_throughput_tok_s)
    assert m.median_ttft_ms == pytest.approx(before.median_ttft_ms)
    assert window_of(m) == before


def test_recompute_keeps_the_counters_acceptance_figures():
    run = finish_run(make_run(make_sweep(), "draft_model", 4), tokens_per_msg=3,
                     spec_decode={"acceptance_length": 3.0, "acceptance_rate": 0.5, "spec_num_drafts": 80.0,
                                  "per_position_acceptance_rate": [0.7, 0.5, 0.3]})
    run = Run.objects.select_related("metrics", "request_logs").get(pk=run.pk)
    m = recompute_run(run)
    assert (m.acceptance_length, m.spec_num_drafts, m.per_position_acceptance_rate) == (3.0, 80.0, [0.7, 0.5, 0.3])
    assert m.spec_source == "vllm"


def _spoil(runs):
    RunMetrics.objects.filter(run__in=runs).update(output_throughput_tok_s=0.0, median_ttft_ms=999.0,
                                                   distributions={})


@pytest.mark.parametrize("jobs", [1, 2])
def test_recompute_command_streams_light_columns_and_can_use_processes(jobs):
    sweep = make_sweep()
    runs = [finish_run(make_run(sweep, "auto", concurrency=c), tokens_per_msg=1 + c % 3) for c in (1, 2, 3)]
    before = {r.pk: (window_of(r.metrics), r.metrics.distributions) for r in runs}
    imported = import_result_file(RESULTS / "sglang-bench-serving.jsonl", make_host(), "imported", method="ngram").sweep
    _spoil(runs)
    with CaptureQueriesContext(connection) as ctx:
        out = io.StringIO()
        call_command("recompute_metrics", "--jobs", str(jobs), stdout=out, stderr=io.StringIO())
    assert "recomputed 3 run(s)" in out.getvalue()
    skipped = sorted(imported.runs.values_list("pk", flat=True))
    assert f"skipped 2 run(s) without stored request logs (imported): {skipped}" in out.getvalue()
    for r in runs:
        m = RunMetrics.objects.get(run=r)
        assert (window_of(m), m.distributions) == before[r.pk]
    reads = [q["sql"] for q in ctx.captured_queries if q["sql"].lstrip().upper().startswith("SELECT")]
    for heavy in ("server_log_tail", "server_env", "argv", '"distributions"'):
        assert not any(heavy in sql for sql in reads), heavy  # no run is loaded in full


def test_recompute_computes_each_request_once(monkeypatch):
    from benchkit.measure import metrics

    run = finish_run(make_run(make_sweep()), tokens_per_msg=2)
    calls = []
    real = metrics._requests
    monkeypatch.setattr(metrics, "_requests", lambda cols: calls.append(len(cols)) or real(cols))
    assert recompute_run(run.pk) is not None
    assert calls == [4]  # one pass over the 4 requests gives the window figures and the samples


def test_recompute_queries_do_not_grow_per_run(django_assert_max_num_queries):
    sweep = make_sweep()
    for c in range(1, 7):
        finish_run(make_run(sweep, "auto", concurrency=c))
    ids = list(Run.objects.filter(sweep=sweep).values_list("pk", flat=True))
    # one load per chunk of runs, one UPDATE per run (no read of the old row), a savepoint per chunk
    with django_assert_max_num_queries(1 + len(ids) + 2):
        assert recompute_runs(ids) == 6


@pytest.mark.parametrize("args, message", [
    (["--method", "bogus"], "unknown"), (["--method", "auto", "--tp", "0"], "--tp 0"),
    (["--method", "ddtree"], "needs --tree-budget"), (["--method", "b0"], "must be >= 1"),
    (["--method", "b15", "--tree-budget", "16"], "contradicts"),
    (["--method", "auto", "--tree-budget", "15"], "does not speculate"),
    (["--method", "ngram", "--num-speculative-tokens", "-3"], "must be >= 1"),
    (["--method", "auto", "--host", "a/b"], "host name"),
])
def test_import_options_are_checked(args, message):
    with pytest.raises(CommandError, match=message):
        call_command("import_results", str(RESULTS / "sglang-bench-serving.jsonl"), "--sweep-name", "x", *args)
    assert Sweep.objects.count() == 0
