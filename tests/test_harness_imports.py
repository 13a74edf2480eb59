"""Importing the other harnesses' real result files (issue 19, "Formats" and "Nothing empty
stored"): AIPerf, GuideLLM (JSON and YAML), genai-bench, inference-perf and `vllm bench sweep`
folders, written by the tools themselves (tests/fixtures/harnesses/, NOTES.md maps each figure).

Every stored figure is compared with the file's own value, converted as the tool's unit says
(seconds x 1000, percent / 100); the figures draftboard recomputes (a request-weighted TPOT from
per-request values, throughputs over the window from the server's token counts) are compared with
the same formula over the file's values; the tool's figures that are not draftboard's (GuideLLM's
token-weighted TPOT, AIPerf's client-count TPOT, inference-perf's pooled token gaps) must be kept
apart in `extra` under their own names, never in a draftboard field. Imports go through the real
service into the real database.
"""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import numpy as np
import pytest
import yaml
from django.core.management import call_command
from django.core.management.base import CommandError

from benchkit.formats.common import DROPPED_KEY, bound_extra
from benchkit.formats.errors import ResultFileError
from benchkit.formats.limits import EXTRA_MAX_BYTES
from benchkit.formats.reader import read_result_file
from runs.models import ResultFile, Run, RunMetrics, RunTransition, Sweep
from runs.services.imports import import_result_file

pytestmark = pytest.mark.django_db
H = Path(__file__).parent / "fixtures" / "harnesses"
AIPERF = H / "aiperf"
GUIDELLM = H / "guidellm"
STATS = ("mean", "median", "std", "p90", "p95", "p99")


def counts() -> dict[str, int]:
    return {t.__name__: t.objects.count() for t in (Sweep, Run, RunMetrics, RunTransition, ResultFile)}


def runs_of(report) -> list[Run]:
    return list(Run.objects.filter(pk__in=report.run_ids).select_related("metrics").order_by("id"))


def numpy_stats(values: list[float]) -> dict[str, float]:
    a = np.asarray(values, dtype=float)
    return {"mean": a.mean(), "median": np.median(a), "std": a.std(), "p90": np.percentile(a, 90),
            "p95": np.percentile(a, 95), "p99": np.percentile(a, 99)}


def stored(m: RunMetrics, metric: str) -> dict[str, float | None]:
    return {s: getattr(m, f"{s}_{metric}_ms") for s in STATS}


# ---------------------------------------------------------------------------------------------
# AIPerf


def aiperf_expected_tpot(folder: Path) -> list[float]:
    """draftboard's TPOT per profiling record, with the server's n (warmup records left out)."""
    out = []
    for line in (folder / "profile_export.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["metadata"]["benchmark_phase"] != "profiling":
            continue
        m = rec["metrics"]
        assert m["request_latency"]["unit"] == m["time_to_first_token"]["unit"] == "ms"
        n = m["usage_completion_tokens"]["value"]
        out.append((m["request_latency"]["value"] - m["time_to_first_token"]["value"]) / (n - 1))
    return out


def test_aiperf_spec_decode_profile_imports_with_the_files_values():
    doc = json.loads((AIPERF / "draft_model-k2" / "profile_export_aiperf.json").read_text())
    report = import_result_file(AIPERF / "draft_model-k2" / "profile_export_aiperf.json", "h", method="draft_model",
                                num_speculative_tokens=2)
    assert report.files[0].tool == "AIPerf"
    (run,) = runs_of(report)
    m = run.metrics
    assert (m.source_tool, m.definitions["tool_version"]) == ("AIPerf", doc["aiperf_version"])
    assert (run.model, run.concurrency, run.input_len, run.output_len, run.num_prompts) == ("demo", 2, 128, 128, 8)
    # latencies as the file states them (ms); AIPerf's p50 is the median
    for metric, tag in (("ttft", "time_to_first_token"), ("e2el", "request_latency"), ("icl", "inter_chunk_latency")):
        assert doc[tag]["unit"] == "ms"
        assert stored(m, metric) == {"mean": doc[tag]["avg"], "median": doc[tag]["p50"], "std": doc[tag]["std"],
                                     "p90": doc[tag]["p90"], "p95": doc[tag]["p95"], "p99": doc[tag]["p99"]}
    assert m.mean_itl_ms is None  # AIPerf has no per-token gap figure
    # TPOT: recomputed from the profiling records with the server's n; AIPerf's own (client OSL) kept apart
    expected = numpy_stats(aiperf_expected_tpot(AIPERF / "draft_model-k2"))
    assert stored(m, "tpot") == pytest.approx(expected, rel=1e-12)
    assert m.mean_tpot_ms != pytest.approx(doc["inter_token_latency"]["avg"], rel=0.01)  # 15-20 % apart here
    assert m.extra["inter_token_latency"]["avg"] == doc["inter_token_latency"]["avg"]
    assert m.output_tokens_from_text is False
    # warmup records are not in it: with them the mean would differ
    with_warmup = []
    for line in (AIPERF / "draft_model-k2" / "profile_export.jsonl").read_text().splitlines():
        r = json.loads(line)["metrics"]
        with_warmup.append((r["request_latency"]["value"] - r["time_to_first_token"]["value"])
                           / (r["usage_completion_tokens"]["value"] - 1))
    assert m.mean_tpot_ms != pytest.approx(np.mean(with_warmup), rel=1e-9)
    # counts and throughput over the window with the server's tokens; AIPerf's client-count figures kept apart
    assert doc["benchmark_duration"]["unit"] == "sec"
    assert m.duration_s == doc["benchmark_duration"]["avg"]
    assert (m.completed, m.failed) == (doc["completed_request_count"]["avg"], 0)
    assert m.total_output_tokens == doc["total_usage_completion_tokens"]["avg"] != doc["total_osl"]["avg"]
    assert m.output_throughput_tok_s == doc["total_usage_completion_tokens"]["avg"] / doc["benchmark_duration"]["avg"]
    assert m.extra["output_token_throughput"]["avg"] == doc["output_token_throughput"]["avg"]
    assert m.request_throughput_req_s == doc["request_throughput"]["avg"]
    # Spec Decode
    assert m.acceptance_length == m.acceptance_length_token_weighted \
        == doc["spec_decode_token_weighted_acceptance_length"]["avg"]
    assert m.acceptance_length_request_weighted == doc["spec_decode_acceptance_length"]["avg"]
    assert m.spec_requests_reported == doc["spec_decode_acceptance_length"]["count"]
    assert m.acceptance_rate == doc["spec_decode_overall_draft_acceptance_rate"]["avg"] / 100
    assert (m.spec_num_drafts, m.spec_num_draft_tokens, m.spec_num_accepted_tokens) == (927, 1854, 90)
    assert m.per_position_acceptance_rate == [89 / 927, 1 / 927]  # pooled histogram {"0": 838, "1": 88, "2": 1}
    assert "AIPerf" in m.spec_source
    assert len(json.dumps(m.extra)) <= EXTRA_MAX_BYTES and "warmup_metrics" not in m.extra


def test_aiperf_without_its_records_stores_its_tpot_flagged_as_client_counted(tmp_path):
    path = tmp_path / "profile_export_aiperf.json"
    path.write_bytes((AIPERF / "auto" / "profile_export_aiperf.json").read_bytes())
    doc = json.loads(path.read_text())
    (run,) = runs_of(import_result_file(path, "h", method="auto"))
    m = run.metrics
    t = doc["inter_token_latency"]
    assert stored(m, "tpot") == {"mean": t["avg"], "median": t["p50"], "std": t["std"], "p90": t["p90"],
                                 "p95": t["p95"], "p99": t["p99"]}
    assert m.output_tokens_from_text is True  # OSL re-tokenized on the client (usage_*_diff_pct is not 0)
    assert "re-tokenized on the client" in m.definitions["tpot"]
    assert m.acceptance_length is None and m.spec_num_drafts is None


def test_aiperf_is_detected_and_refused_as_vllm_naming_its_markers(tmp_path):
    """Issue 19: the AIPerf file was taken for vLLM on one shared key and refused with a reason
    that never said AIPerf. Auto-detected, it is AIPerf's; forced as vLLM, the refusal names it."""
    path = AIPERF / "draft_model-k2" / "profile_export_aiperf.json"
    read = read_result_file(path)
    assert (read.format, read.tool) == ("aiperf", "AIPerf")
    with pytest.raises(ResultFileError, match=r"total_output_tokens: expected a whole number, got an object; AIPerf "
                                              r"wrote this file \(saw aiperf_version, benchmark_duration, .*\), not "
                                              r"vllm bench serve: import it with --format aiperf or auto"):
        read_result_file(path, "vllm")
    with pytest.raises(CommandError, match=r"AIPerf wrote this file \(saw aiperf_version"):
        call_command("import_results", str(path), "--method", "auto", "--format", "vllm", stdout=StringIO())
    assert counts() == dict.fromkeys(counts(), 0)


# ---------------------------------------------------------------------------------------------
# GuideLLM


def guidellm_expectations(doc: dict, i: int) -> dict:
    b = doc["benchmarks"][i]
    m = {k: v["successful"] if isinstance(v, dict) and isinstance(v.get("successful"), dict) else v
         for k, v in b["metrics"].items()}
    return {"b": b, "m": m, "requests": b["requests"]["successful"]}


def dist(d: dict, scale: float = 1.0) -> dict[str, float]:
    return {"mean": d["mean"] * scale, "median": d["median"] * scale, "std": d["std_dev"] * scale,
            "p90": d["percentiles"]["p90"] * scale, "p95": d["percentiles"]["p95"] * scale,
            "p99": d["percentiles"]["p99"] * scale}


@pytest.mark.parametrize("name", ["benchmarks.json", "benchmarks.yaml"])
def test_guidellm_report_is_one_run_per_benchmark_with_the_files_values(name):
    doc = json.loads((GUIDELLM / "auto" / "benchmarks.json").read_text())
    report = import_result_file(GUIDELLM / "auto" / name, "h", method="auto")
    runs = runs_of(report)
    assert report.files[0].tool == "GuideLLM" and len(runs) == len(doc["benchmarks"]) == 3
    assert [r.spec["imported"] for r in runs] == [f"{GUIDELLM / 'auto' / name}#benchmarks[{i}]" for i in range(3)]
    for i, run in enumerate(runs):
        e = guidellm_expectations(doc, i)
        b, fm, m = e["b"], e["m"], run.metrics
        strategy = b["config"]["strategy"]
        assert strategy["type_"] == "concurrent" and run.concurrency == strategy["streams"] == [1, 2, 4][i]
        assert (m.source_tool, m.definitions["tool_version"]) == ("GuideLLM", doc["metadata"]["guidellm_version"])
        assert (m.completed, m.failed) == (fm["request_totals"]["successful"], fm["request_totals"]["errored"])
        assert m.duration_s == b["duration"]
        assert stored(m, "ttft") == dist(fm["time_to_first_token_ms"])
        assert stored(m, "e2el") == dist(fm["request_latency"], 1000.0)  # seconds in the file
        # TPOT: request-weighted over the per-request values; GuideLLM's token-weighted one kept apart
        assert stored(m, "tpot") == pytest.approx(numpy_stats([r["inter_token_latency_ms"] for r in e["requests"]]),
                                                  rel=1e-12)
        kept = m.extra["inter_token_latency_ms"]
        assert {k: kept[k] for k in STATS} == dist(fm["inter_token_latency_ms"])
        assert "token-weighted" in kept["weighted_by"]
        assert m.mean_itl_ms is None and m.mean_icl_ms is None
        assert m.total_output_tokens == fm["output_token_count"]["total_sum"]
        assert m.output_throughput_tok_s == fm["output_token_count"]["total_sum"] / b["duration"]
        assert m.request_throughput_req_s == fm["request_totals"]["successful"] / b["duration"]
        assert m.extra["requests_per_second"] == fm["requests_per_second"]["mean"]
        assert m.mean_decode_tokens_per_chunk == fm["iter_tokens_per_iteration"]["mean"]
        assert m.mean_tokens_per_chunk == fm["output_tokens_per_iteration"]["mean"]
        assert len(json.dumps(m.extra)) < 4096  # a few figures, never the report


def test_guidellm_spec_decode_from_its_requests():
    doc = json.loads((GUIDELLM / "draft_model-k2" / "benchmarks.json").read_text())
    runs = runs_of(import_result_file(GUIDELLM / "draft_model-k2" / "benchmarks.json", "h", method="draft_model",
                                      num_speculative_tokens=2))
    for i, run in enumerate(runs):
        specs = [r["response_metrics"]["speculative_decoding"] for r in doc["benchmarks"][i]["requests"]["successful"]]
        steps = sum(s["num_spec_steps"] for s in specs)
        accepted = sum(s["num_accepted_draft_tokens"] for s in specs)
        drafted = sum(s["num_draft_tokens"] for s in specs)
        m = run.metrics
        assert (m.spec_num_drafts, m.spec_num_accepted_tokens, m.spec_num_draft_tokens) == (steps, accepted, drafted)
        assert m.acceptance_length == m.acceptance_length_token_weighted == 1 + accepted / steps
        assert m.acceptance_length_request_weighted == pytest.approx(
            np.mean([s["mean_acceptance_length"] for s in specs]), rel=1e-12)
        assert m.acceptance_rate == accepted / drafted and m.spec_requests_reported == len(specs)
        pooled = np.sum([s["acceptance_histogram"] for s in specs], axis=0)
        assert m.per_position_acceptance_rate == pytest.approx([pooled[1:].sum() / steps, pooled[2:].sum() / steps])


def test_guidellm_forced_as_vllm_and_empty_benchmarks_are_refused(tmp_path):
    """Issue 19: `--format vllm` stored a GuideLLM report as a succeeded run with every figure
    unknown and the document in its extra keys; `{"benchmarks": []}` did the same."""
    path = GUIDELLM / "auto" / "benchmarks.json"
    with pytest.raises(CommandError, match=r"GuideLLM wrote this file \(saw metadata\.guidellm_version, "
                                           r"benchmarks\[0\]\.scheduler_metrics, .*\), not vllm bench serve: import "
                                           r"it with --format guidellm or auto"):
        call_command("import_results", str(path), "--method", "auto", "--format", "vllm", stdout=StringIO())
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"benchmarks": []}))
    with pytest.raises(CommandError, match=r"no known result format recognised this file \(keys: benchmarks\); "
                                           r"known formats: vllm .*guidellm \(GuideLLM: "):
        call_command("import_results", str(empty), "--method", "auto", stdout=StringIO())
    with pytest.raises(CommandError, match=r"empty\.json:1: no vllm bench serve figure in this object"):
        call_command("import_results", str(empty), "--method", "auto", "--format", "vllm", stdout=StringIO())
    with pytest.raises(CommandError, match=r"empty\.json:1: benchmarks: no benchmark in benchmarks\[\]"):
        call_command("import_results", str(empty), "--method", "auto", "--format", "guidellm", stdout=StringIO())
    assert counts() == dict.fromkeys(counts(), 0)


def test_a_large_guidellm_report_never_lands_in_extra(tmp_path):
    """A 3.9 MB report (the real one, its benchmarks repeated) imports one run per benchmark,
    each keeping a few of GuideLLM's own figures, far below the bound on kept keys."""
    doc = json.loads((GUIDELLM / "auto" / "benchmarks.json").read_text())
    doc["benchmarks"] = [doc["benchmarks"][i % 3] for i in range(33)]
    path = tmp_path / "benchmarks.json"
    path.write_text(json.dumps(doc))
    assert path.stat().st_size > 3_900_000
    runs = runs_of(import_result_file(path, "h", method="auto"))
    assert len(runs) == 33
    assert max(len(json.dumps(r.metrics.extra)) for r in runs) < 4096


def test_kept_keys_are_bounded():
    extra = {"small": 1, "big": "x" * (EXTRA_MAX_BYTES + 10), "after": [1, 2]}
    out = bound_extra(extra)
    assert out["small"] == 1 and out["after"] == [1, 2] and "big" not in out
    assert out[DROPPED_KEY]["keys"] == {"big": len(json.dumps({"big": extra["big"]}))}
    assert len(json.dumps(out)) <= EXTRA_MAX_BYTES
    assert bound_extra({"a": 1}) == {"a": 1}


def test_a_vllm_file_with_large_unknown_lists_keeps_them_bounded(tmp_path):
    doc = json.loads((H / "vllm-bench-sweep" / "sweep" / "SERVE--auto-BENCH--max_concurrency=1" / "run=0.json")
                     .read_text())
    doc["queue_times"] = [0.25] * 20_000  # an unknown per-request list: 120 KB
    path = tmp_path / "big.json"
    path.write_text(json.dumps(doc))
    (run,) = runs_of(import_result_file(path, "h", method="auto"))
    assert "queue_times" not in run.metrics.extra and run.metrics.extra[DROPPED_KEY]["keys"]["queue_times"] > 100_000
    assert len(json.dumps(run.metrics.extra)) <= EXTRA_MAX_BYTES


# ---------------------------------------------------------------------------------------------
# genai-bench


def test_genai_bench_experiment_folder_is_one_run_per_run_file():
    folder = H / "genai-bench" / "draft_model-k2"
    meta = json.loads((folder / "experiment_metadata.json").read_text())
    files = sorted(p for p in folder.glob("*.json") if p.name != "experiment_metadata.json")
    report = import_result_file(folder, "h", method="draft_model", num_speculative_tokens=2)
    runs = runs_of(report)
    assert report.files[0].tool == "genai-bench" and len(runs) == len(files) == 3
    for path, run in zip(files, runs, strict=True):
        doc = json.loads(path.read_text())
        a, m = doc["aggregated_metrics"], run.metrics
        assert doc["_time_unit"] == "s" and run.spec["imported"] == str(path)
        assert run.concurrency == a["num_concurrency"] and (run.input_len, run.output_len) == (128, 128)
        assert (run.engine, run.engine_version, m.definitions["tool_version"]) == (
            "vllm", meta["server_version"], meta["benchmark_version"])
        for metric, key in (("ttft", "ttft"), ("tpot", "tpot"), ("e2el", "e2e_latency")):
            s = a["stats"][key]
            assert stored(m, metric) == {"mean": s["mean"] * 1000.0, "median": s["p50"] * 1000.0,
                                         "std": s["stddev"] * 1000.0, "p90": s["p90"] * 1000.0,
                                         "p95": s["p95"] * 1000.0, "p99": s["p99"] * 1000.0}
        assert (m.completed, m.failed, m.duration_s) == (a["num_completed_requests"], a["num_error_requests"],
                                                         a["run_duration"])
        assert m.output_throughput_tok_s == a["mean_output_throughput_tokens_per_s"]
        assert m.total_output_tokens == a["stats"]["num_output_tokens"]["sum"]
        assert "wider than draftboard's window" in m.definitions["duration"]
        assert m.mean_itl_ms is None and m.mean_icl_ms is None and m.acceptance_length is None
        assert "output_inference_speed" in m.extra["stats"]


# ---------------------------------------------------------------------------------------------
# inference-perf


def test_inference_perf_report_folder_is_one_run_per_stage():
    folder = H / "inference-perf" / "auto"
    config = yaml.safe_load((folder / "config.yaml").read_text())
    runs = runs_of(import_result_file(folder, "h", method="auto"))
    assert len(runs) == 2
    for n, run in enumerate(runs):
        doc = json.loads((folder / f"stage_{n}_lifecycle_metrics.json").read_text())
        s, m = doc["successes"], run.metrics
        assert run.concurrency == doc["load_summary"]["concurrency"] == config["load"]["stages"][n][
            "concurrency_level"]
        assert (run.engine, run.model, run.input_len, run.output_len) == ("vllm", "demo", 128, 128)
        for metric, key in (("ttft", "time_to_first_token"), ("tpot", "time_per_output_token"),
                            ("e2el", "request_latency")):
            d = s["latency"][key]
            assert stored(m, metric) == {"mean": d["mean"] * 1000.0, "median": d["median"] * 1000.0, "std": None,
                                         "p90": d["p90"] * 1000.0, "p95": d["p95"] * 1000.0, "p99": d["p99"] * 1000.0}
        assert m.output_tokens_from_text is True  # its TPOT uses the client's re-tokenized n (config default)
        assert (m.completed, m.failed, m.duration_s) == (s["count"], doc["failures"]["count"],
                                                         doc["benchmark_time_seconds"])
        assert m.total_output_tokens == s["output_tokens"]["total"]
        assert m.output_throughput_tok_s == s["output_tokens"]["total"] / doc["benchmark_time_seconds"]
        assert m.request_throughput_req_s == s["throughput"]["requests_per_sec"]
        # its inter_token_latency is neither ITL nor ICL: kept apart, in seconds, under its own name
        assert m.mean_itl_ms is None and m.mean_icl_ms is None
        assert m.extra["successes.latency"]["inter_token_latency"] == s["latency"]["inter_token_latency"]
        assert m.extra["successes.throughput"]["output_tokens_per_sec"] == s["throughput"]["output_tokens_per_sec"]


# ---------------------------------------------------------------------------------------------
# vllm bench sweep


def test_vllm_sweep_folder_is_one_sweep_with_each_runs_method():
    folder = H / "vllm-bench-sweep" / "sweep"
    out = StringIO()
    call_command("import_results", str(folder), stdout=out)  # no --method: each run file states its own
    assert f"imported          {folder} (vllm bench sweep): 4 run(s)" in out.getvalue()
    runs = list(Run.objects.select_related("metrics").order_by("id"))
    assert len({r.sweep_id for r in runs}) == 1
    assert [(r.method_label, r.concurrency) for r in runs] == [
        ("auto", 1), ("auto", 2), ("draft_model k=2", 1), ("draft_model k=2", 2)]
    for run in runs:
        doc = json.loads(Path(run.spec["imported"]).read_text())
        m = run.metrics
        assert (run.engine, m.source_tool) == ("vllm", "vllm bench sweep")
        for s in ("mean", "median", "std", "p99"):
            assert getattr(m, f"{s}_icl_ms") == doc[f"{s}_itl_ms"]  # vLLM's ITL is per chunk: draftboard's ICL
            assert getattr(m, f"{s}_tpot_ms") == doc[f"{s}_tpot_ms"]
        assert m.mean_itl_ms is None
        if "speculative_config" in doc:
            assert m.acceptance_length == doc["spec_decode_acceptance_length"]
            assert m.acceptance_rate == doc["spec_decode_acceptance_rate"] / 100
            assert m.extra["speculative_config"] == doc["speculative_config"]
        else:
            assert m.acceptance_length is None


def test_vllm_sweep_method_disagreeing_with_the_folder_is_refused():
    folder = H / "vllm-bench-sweep" / "sweep"
    with pytest.raises(ResultFileError, match=r"run=0\.json:\d+: speculative_config: the file says 'draft_model "
                                              r"k=2', --method says 'auto'"):
        import_result_file(folder, "h", method="auto")
    assert counts() == dict.fromkeys(counts(), 0)


def test_a_file_that_states_no_method_needs_one():
    with pytest.raises(CommandError, match=r"profile_export_aiperf\.json: the AIPerf file does not say which decoding "
                                           r"method produced this run: give --method"):
        call_command("import_results", str(AIPERF / "auto" / "profile_export_aiperf.json"), stdout=StringIO())


def test_vllm_sweep_servers_are_configurations_and_repeats_are_numbered(tmp_path):
    """Issue 31: `vllm bench sweep serve --serve-params '[{"max_num_seqs": 4}, {"max_num_seqs":
    8}]' --num-runs 2` (folders named by vllm/benchmarks/sweep/serve.py `_get_comb_base_path`,
    run files `run=<n>.json` with the serve parameters and `run_number` added by
    `_update_run_data`): two servers, each two repeats."""
    base = json.loads((H / "vllm-bench-sweep" / "sweep" / "SERVE--auto-BENCH--max_concurrency=1" / "run=0.json")
                      .read_text())
    for seqs in (4, 8):
        folder = tmp_path / "sweep" / f"SERVE--max_num_seqs={seqs}-BENCH--max_concurrency=1"
        folder.mkdir(parents=True)
        for n in (0, 1):
            doc = {k: v for k, v in base.items() if k != "_benchmark_name"}
            doc.update(run_number=n, max_num_seqs=seqs, max_concurrency=1, duration=base["duration"] + n + seqs)
            (folder / f"run={n}.json").write_text(json.dumps(doc, indent=4))
    import_result_file(tmp_path / "sweep", "h")
    runs = list(Run.objects.order_by("id"))
    assert [(r.spec["server"]["extra_args"], r.repeat_index) for r in runs] == [
        (["--max-num-seqs", "4"], 0), (["--max-num-seqs", "4"], 1),
        (["--max-num-seqs", "8"], 0), (["--max-num-seqs", "8"], 1)]
