"""GuideLLM's report layouts (issue 31): a real GuideLLM 0.2 report (graz-dev/vllm-benchmark's
`benchmarks.json`, tests/fixtures/results/guidellm-0.2/README.md) is auto-detected and its figures
are stored exactly as the file holds them; an unknown layout is refused naming the known ones.
The 0.8 layout (tests/fixtures/harnesses/guidellm/) is tested in test_harness_imports.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchkit.formats.errors import ResultFileError
from benchkit.formats.reader import read_result_file
from runs.models import Run
from runs.services.imports import import_result_file

pytestmark = pytest.mark.django_db
V02 = Path(__file__).parent / "fixtures" / "results" / "guidellm-0.2" / "benchmarks.json"
STATS = ("mean", "median", "std", "p90", "p95", "p99")


def test_guidellm_02_report_is_detected_and_its_figures_stored_exactly():
    doc = json.loads(V02.read_text())
    b = doc["benchmarks"][0]
    report = import_result_file(V02, "h", method="auto")
    assert report.files[0].tool == "GuideLLM"
    (run,) = Run.objects.filter(pk__in=report.run_ids).select_related("metrics")
    m = run.metrics
    assert (m.completed, m.failed) == (b["request_totals"]["successful"], b["request_totals"]["errored"]) == (1000, 0)
    assert run.model == b["worker"]["backend_model"] == "qwen2.5-7b"
    assert m.duration_s == b["duration"]
    tpot = np.asarray([r["inter_token_latency_ms"] for r in b["requests"]["successful"]], dtype=float)
    assert len(tpot) == 1000
    assert [getattr(m, f"{s}_tpot_ms") for s in STATS] == [
        tpot.mean(), np.median(tpot), tpot.std(), np.percentile(tpot, 90), np.percentile(tpot, 95),
        np.percentile(tpot, 99)]
    fm = {k: v["successful"] for k, v in b["metrics"].items()}
    ttft = fm["time_to_first_token_ms"]
    assert (m.mean_ttft_ms, m.median_ttft_ms, m.std_ttft_ms, m.p99_ttft_ms) == (
        ttft["mean"], ttft["median"], ttft["std_dev"], ttft["percentiles"]["p99"])
    assert m.mean_e2el_ms == fm["request_latency"]["mean"] * 1000.0  # seconds in the file
    assert m.total_output_tokens == fm["output_token_count"]["total_sum"]
    assert m.total_input_tokens == fm["prompt_token_count"]["total_sum"]
    assert m.output_throughput_tok_s == fm["output_token_count"]["total_sum"] / b["duration"]
    assert m.mean_itl_ms is None  # no per-chunk gap in the file; its per-request ITL is the TPOT above
    kept = m.extra["inter_token_latency_ms"]  # GuideLLM's token-weighted one, kept apart
    assert kept["mean"] == fm["inter_token_latency_ms"]["mean"] and "token-weighted" in kept["weighted_by"]
    assert m.extra["request_totals"] == b["request_totals"]
    assert "0.2-0.3" in m.definitions["layout"]
    assert (run.input_len, run.output_len) == (512, 128)  # request_loader.data "prompt_tokens=512,output_tokens=128"


def test_guidellm_02_sampled_requests_leave_tpot_unknown(tmp_path):
    doc = json.loads(V02.read_text())
    b = doc["benchmarks"][0]
    b["requests"]["successful"] = b["requests"]["successful"][:100]
    b["request_samples"] = {"successful": 100, "errored": 0, "incomplete": 0, "total": None}
    path = tmp_path / "benchmarks.json"
    path.write_text(json.dumps(doc))
    (run,) = read_result_file(path).runs
    assert run.metrics.completed == 1000 and run.metrics.mean_tpot_ms is None
    assert "holds 100 of 1000" in run.definitions["tpot"]


def test_an_unknown_guidellm_layout_is_refused_naming_the_known_ones(tmp_path):
    doc = json.loads(V02.read_text())
    del doc["benchmarks"][0]["request_totals"]
    path = tmp_path / "benchmarks.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ResultFileError, match=r"benchmarks\[0\]: a GuideLLM layout draftboard does not know "
                                              r"\(its keys: type_, id_, .*\); expected one of: GuideLLM 0\.7-0\.8: "
                                              r"benchmarks\[\]\.metrics\.request_totals .*GuideLLM 0\.2-0\.3: "
                                              r"benchmarks\[\]\.request_totals"):
        read_result_file(path, "guidellm")
