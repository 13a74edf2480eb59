"""Importing other tools' result files into runs, exporting runs, recomputing from logs."""

import json
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from analysis.exports import run_export
from benchkit.formats.common import ResultFileError
from runs.models import Run, RunMetrics, Sweep
from runs.selectors import window_of
from runs.services.imports import import_result_file
from runs.services.recompute import recompute_run
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
    with pytest.raises(CommandError, match=r"bad.jsonl:2: not valid JSON"):
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
