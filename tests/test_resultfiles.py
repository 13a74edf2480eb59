"""Import of `vllm bench serve` / `sglang.bench_serving` result files, and export in vLLM's layout.

Fixtures (tests/fixtures/results/):
- vllm-bench-serve-full.json: written by the real `vllm bench serve` (vLLM 0.32 CPU, demo-sized
  random model, draft_model speculation) with --save-result --save-detailed.
- vllm-bench-serve-appended.json: two real runs written with --append-result (no details).
- vllm-benchmark-serving-old.json: the older benchmarks/benchmark_serving.py layout (no failed,
  burstiness, max_concurrency, e2el, max_output_tokens_per_s; has best_of).
- sglang-bench-serving.jsonl: two lines in sglang.bench_serving's layout, a recent one with
  server_info, total_throughput, accept_length and --output-details lists, and an older one.
- draftboard-export-format1.json: written by draftboard's export at commit 021632b (before the
  metric schema) from the logs of `real_window` below.
Expected values are read from the fixture JSON itself.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from benchkit.formats.base import Source
from benchkit.formats.common import TOOL_DRAFTBOARD, TOOL_SGLANG, TOOL_VLLM
from benchkit.formats.errors import ResultFileError
from benchkit.formats.reader import load_result_file, read_result_file
from benchkit.formats.registry import FORMATS, detect, format_choices
from benchkit.formats.vllm_bench import export_vllm_layout
from benchkit.measure.metrics import METRIC_FIELDS, WindowMetrics, compute_run_metrics
from tests.test_validity import make_log

FIXTURES = Path(__file__).parent / "fixtures" / "results"
VLLM_FULL = FIXTURES / "vllm-bench-serve-full.json"
VLLM_APPENDED = FIXTURES / "vllm-bench-serve-appended.json"
VLLM_OLD = FIXTURES / "vllm-benchmark-serving-old.json"
SGLANG = FIXTURES / "sglang-bench-serving.jsonl"
DRAFTBOARD_FORMAT1 = FIXTURES / "draftboard-export-format1.json"


def test_full_vllm_file():
    src = json.loads(VLLM_FULL.read_text())
    [run] = load_result_file(VLLM_FULL)
    assert run.source_tool == TOOL_VLLM and run.origin == str(VLLM_FULL)
    m = run.metrics.to_dict()
    for key, vllm_key in (("completed", "completed"), ("failed", "failed"), ("duration_s", "duration"),
                          ("total_input_tokens", "total_input_tokens"), ("total_output_tokens", "total_output_tokens"),
                          ("request_throughput_req_s", "request_throughput"),
                          ("output_throughput_tok_s", "output_throughput"),
                          ("total_token_throughput_tok_s", "total_token_throughput"),
                          ("max_output_tokens_per_s", "max_output_tokens_per_s")):
        assert m[key] == src[vllm_key], key
    for stat in ("mean", "median", "std", "p90", "p95", "p99"):
        for metric in ("ttft", "tpot", "e2el"):
            assert m[f"{stat}_{metric}_ms"] == src[f"{stat}_{metric}_ms"]
        # vLLM's ITL is per chunk: it becomes draftboard's ICL, per-token ITL stays unknown
        assert m[f"{stat}_icl_ms"] == src[f"{stat}_itl_ms"]
        assert m[f"{stat}_itl_ms"] is None
    assert m["error_rate"] == src["failed"] / (src["completed"] + src["failed"])
    assert m["request_goodput_req_s"] is None  # request_goodput is null: no --goodput given
    assert m["output_tokens_from_text"] is None  # the file does not say
    chunks = sum(len(x) + 1 for x in src["itls"])
    assert m["mean_tokens_per_chunk"] == pytest.approx(sum(src["output_lens"]) / chunks)
    assert "per chunk" in run.definitions["itl"]

    w = run.workload
    assert (w["model"], w["num_prompts"], w["concurrency"]) == (src["model_id"], src["num_prompts"],
                                                               src["max_concurrency"])
    assert w["request_rate"] is None and src["request_rate"] == "inf"  # unbounded
    assert w["input_len"] is None  # vLLM does not record the intended lengths

    # percent in the file, a fraction in draftboard
    assert m["acceptance_rate"] == pytest.approx(src["spec_decode_acceptance_rate"] / 100)
    assert m["acceptance_length"] == src["spec_decode_acceptance_length"]
    assert m["spec_num_drafts"] == src["spec_decode_num_drafts"]
    assert m["spec_num_draft_tokens"] == src["spec_decode_draft_tokens"]
    assert m["spec_num_accepted_tokens"] == src["spec_decode_accepted_tokens"]
    assert m["per_position_acceptance_rate"] == src["spec_decode_per_position_acceptance_rates"]
    assert "window delta" in run.spec_source

    pr = run.per_request
    assert pr["ttfts_ms"] == pytest.approx([t * 1000 for t in src["ttfts"]])
    assert pr["icls_ms"][0] == pytest.approx([t * 1000 for t in src["itls"][0]])
    assert pr["e2els_ms"] == pytest.approx([t * 1000 for t in src["latencies"]])
    assert pr["output_lens"] == src["output_lens"] and pr["errors"] == src["errors"]
    assert {"start_times", "queue_times", "date", "max_concurrent_requests"} <= set(run.source_extra)
    assert "generated_texts" not in run.source_extra


def test_appended_vllm_file_gives_one_run_per_line():
    lines = [json.loads(x) for x in VLLM_APPENDED.read_text().splitlines() if x.strip()]
    runs = load_result_file(VLLM_APPENDED)
    assert len(runs) == len(lines) == 2
    for i, (run, src) in enumerate(zip(runs, lines, strict=True), start=1):
        assert run.origin == f"{VLLM_APPENDED}:{i}"
        assert run.workload["concurrency"] == src["max_concurrency"]
        assert run.metrics.mean_icl_ms == src["mean_itl_ms"]
        assert run.metrics.p90_ttft_ms is None  # only the default p99 was asked for
        assert run.per_request == {"e2els_ms": pytest.approx([t * 1000 for t in src["latencies"]])}


def test_old_vllm_file_missing_keys_imports_as_none():
    src = json.loads(VLLM_OLD.read_text())
    assert "failed" not in src and "mean_e2el_ms" not in src and "max_concurrency" not in src
    [run] = load_result_file(VLLM_OLD)
    m = run.metrics.to_dict()
    assert m["failed"] == sum(1 for e in src["errors"] if e)  # counted from the per-request errors
    assert m["max_output_tokens_per_s"] is None
    assert all(m[f"{s}_e2el_ms"] is None for s in ("mean", "median", "std", "p90", "p95", "p99"))
    assert m["mean_icl_ms"] == src["mean_itl_ms"]
    assert run.workload["concurrency"] is None and run.workload["burstiness"] is None
    assert not run.metrics.has_spec_decode and run.spec_source is None
    assert run.source_extra["best_of"] == src["best_of"]


def test_sglang_jsonl_two_versions():
    lines = [json.loads(x) for x in SGLANG.read_text().splitlines()]
    new, old = load_result_file(SGLANG)
    assert new.source_tool == old.source_tool == TOOL_SGLANG
    assert (new.origin, old.origin) == (f"{SGLANG}:1", f"{SGLANG}:2")
    src = lines[0]
    assert new.source_version == src["server_info"]["version"]
    assert new.metrics.total_token_throughput_tok_s == src["total_throughput"]
    assert new.metrics.mean_e2el_ms == src["mean_e2e_latency_ms"]
    assert new.metrics.p95_icl_ms == src["p95_itl_ms"]
    assert new.metrics.failed == 0 and new.metrics.error_rate == 0.0
    assert new.metrics.acceptance_length == src["accept_length"]
    assert new.metrics.acceptance_rate is None and new.metrics.spec_num_drafts is None  # SGLang has no counts
    assert "server-wide" in new.definitions["acceptance_length"] and "server-wide" in new.spec_source
    assert new.workload["input_len"] == src["random_input_len"]
    assert new.workload["output_len"] == src["random_output_len"]
    assert new.workload["num_prompts"] == len(src["input_lens"])
    assert new.workload["request_rate"] is None  # Infinity
    assert new.workload["model"] == src["server_info"]["model_path"]

    src = lines[1]
    assert old.source_version is None
    # older SGLang: no total_throughput; derived from the token counts and the duration, and said so
    assert old.metrics.total_token_throughput_tok_s == pytest.approx(
        (src["total_input_tokens"] + src["total_output_tokens"]) / src["duration"])
    assert "total_token_throughput_tok_s" in old.definitions["derived"]
    assert old.metrics.failed is None and old.metrics.error_rate is None
    assert old.metrics.max_output_tokens_per_s is None
    assert not old.metrics.has_spec_decode and old.spec_source is None  # accept_length null: no speculation
    assert old.workload["output_len"] == src["sharegpt_output_len"] and old.workload["input_len"] is None
    assert old.workload["request_rate"] == src["request_rate"]
    assert old.per_request is None


def test_detection_names_the_tool_it_recognised():
    for path, name, tool, marker in ((VLLM_FULL, "vllm", TOOL_VLLM, "endpoint_type"),
                                     (VLLM_OLD, "vllm", TOOL_VLLM, "best_of"),
                                     (SGLANG, "sglang", TOOL_SGLANG, "server_info"),
                                     (DRAFTBOARD_FORMAT1, "vllm", f"{TOOL_DRAFTBOARD} export", "model_id")):
        form, recognised = detect(Source(path))
        assert (form.name, form) == (name, FORMATS[name])
        assert recognised.tool.startswith(tool) and marker in recognised.markers, (path, recognised)
        read = read_result_file(path)
        assert (read.format, read.tool) == (name, recognised.tool)
    assert format_choices() == ["auto", "vllm", "sglang", "aiperf", "guidellm", "genai-bench", "inference-perf",
                                "vllm-sweep"]
    assert [r.source_tool for r in load_result_file(SGLANG, fmt="sglang")] == [TOOL_SGLANG] * 2
    with pytest.raises(ResultFileError, match=r"unknown format 'csv'; expected one of auto, vllm, sglang, aiperf"):
        load_result_file(SGLANG, fmt="csv")


def test_an_unknown_document_is_refused_naming_the_known_formats(tmp_path):
    path = write(tmp_path, "other.json", json.dumps({"benchmarks": [], "metadata": {"version": 1}}))
    with pytest.raises(ResultFileError) as exc:
        load_result_file(path)
    message = str(exc.value)
    assert message.startswith(f"{path}: no known result format recognised this file (keys: benchmarks, metadata)")
    for form in FORMATS.values():  # the formats that read a file, not those that read a folder
        assert (f"{form.name} ({form.tool}: " in message) == (form.takes == "file"), form.name
    assert "endpoint_type" in message and "server_info" in message  # the markers each format looks for


def test_a_tie_names_both_tools(tmp_path):
    path = write(tmp_path, "tie.json", json.dumps({"model_id": "m", "concurrency": 2, "completed": 3}))
    with pytest.raises(ResultFileError, match=r"cannot tell whether vllm bench serve \(saw model_id\) or "
                                              r"sglang.bench_serving \(saw concurrency\) wrote this file; "
                                              r"pass --format vllm \(fmt='vllm' in Python\) or --format sglang"):
        load_result_file(path)
    assert load_result_file(path, fmt="sglang")[0].source_tool == TOOL_SGLANG


def test_every_object_must_carry_the_markers(tmp_path):
    """Detection is per source: a JSON lines file whose second line has none of vLLM's markers is
    not taken for vLLM because its first line is."""
    lines = VLLM_APPENDED.read_text().splitlines()
    path = write(tmp_path, "mixed.jsonl", lines[0] + "\n" + json.dumps({"completed": 3, "duration": 1.0}) + "\n")
    with pytest.raises(ResultFileError, match="no known result format recognised this file"):
        load_result_file(path)
    assert len(load_result_file(path, fmt="vllm")) == 2  # named, it reads: the second line has vLLM figures


@pytest.mark.parametrize("fmt", ["vllm", "sglang"])
@pytest.mark.parametrize("doc", [
    {"benchmarks": []},
    {"benchmarks": [{"type_": "generative_benchmark", "metrics": {"requests_per_second": {"mean": 2.0}}}],
     "metadata": {"version": 1}},
    {"model_id": "m", "server_info": {"version": "1"}},  # setup keys only, no figure
])
def test_a_forced_format_still_validates_what_it_requires(tmp_path, fmt, doc):
    """`--format vllm` on another tool's document stored a succeeded run with every figure
    unknown; now the object is refused naming the figures the format expected."""
    path = write(tmp_path, "forced.json", json.dumps(doc))
    tool = FORMATS[fmt].tool
    with pytest.raises(ResultFileError, match=rf"forced\.json:1: no {tool} figure in this object: expected at "
                                              rf"least one of .*; it has {', '.join(doc)}$"):
        load_result_file(path, fmt=fmt)


def test_a_run_with_every_figure_unknown_is_refused(tmp_path):
    """A figure key present but null gives no figure: refused, not stored as an empty run."""
    path = write(tmp_path, "nulls.json", json.dumps({"model_id": "m", "completed": None, "mean_ttft_ms": None}))
    with pytest.raises(ResultFileError, match=r"nulls\.json:1: no measured figure could be read from this "
                                              r"vllm bench serve run: every figure is unknown"):
        load_result_file(path)


def test_a_folder_is_read_by_folder_formats_only(tmp_path):
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "a.json").write_text(VLLM_FULL.read_text())
    with pytest.raises(ResultFileError, match=r"runs: no known result format recognised this folder "
                                              r"\(files: a\.json\); known formats: genai-bench \(genai-bench: an "
                                              r"experiment folder .*\); inference-perf \(.*\); vllm-sweep \(vllm bench "
                                              r"sweep: .*\)\. If it is one of these"):
        load_result_file(tmp_path / "runs")
    with pytest.raises(ResultFileError, match=r"format 'vllm' \(vllm bench serve\) reads a file, and this is a folder"):
        load_result_file(tmp_path / "runs", fmt="vllm")


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_bad_json_names_file_and_line(tmp_path):
    good = SGLANG.read_text().splitlines()
    path = write(tmp_path, "broken.jsonl", good[0] + "\n" + good[1][:-20] + "\n")
    with pytest.raises(ResultFileError) as exc:
        load_result_file(path)
    assert exc.value.line == 2 and str(exc.value).startswith(f"{path}:2: truncated")

    path = write(tmp_path, "broken.json", '{"completed": 3,\n "failed": }\n')
    with pytest.raises(ResultFileError, match=r"broken.json:2: not valid JSON"):
        load_result_file(path)


@pytest.mark.parametrize(
    ("key", "value", "field", "fragment"),
    [
        ("completed", "four", "completed", "expected a whole number"),
        ("completed", 3.5, "completed", "whole number"),
        ("mean_ttft_ms", True, "mean_ttft_ms", "expected a number"),
        ("request_rate", "fast", "request_rate", "number or 'inf'"),
        ("model_id", 7, "model_id", "expected a string"),
        ("ttfts", 0.5, "ttfts", "expected a list"),
        ("itls", [[0.1], ["x"]], "itls[1][0]", "expected a number"),
        ("output_lens", [24, 24], "output_lens", "has 2 entries"),
        ("spec_decode_num_drafts", [3], "spec_decode_num_drafts", "expected a number"),
        ("spec_decode_per_position_acceptance_rates", "1,1", "spec_decode_per_position_acceptance_rates",
         "list"),
    ],
)
def test_wrong_field_type_names_the_field(tmp_path, key, value, field, fragment):
    obj = json.loads(VLLM_FULL.read_text())
    obj[key] = value
    path = write(tmp_path, "bad.json", json.dumps(obj))
    with pytest.raises(ResultFileError) as exc:
        load_result_file(path)
    assert exc.value.field == field
    assert str(exc.value).startswith(f"{path}:1: {field}: ") and fragment in str(exc.value)


def test_wrong_field_in_a_later_line_returns_nothing(tmp_path):
    lines = SGLANG.read_text().splitlines()
    second = json.loads(lines[1])
    second["max_concurrency"] = "eight"
    path = write(tmp_path, "bad.jsonl", lines[0] + "\n" + json.dumps(second) + "\n")
    with pytest.raises(ResultFileError) as exc:
        load_result_file(path)
    assert (exc.value.line, exc.value.field) == (2, "max_concurrency")
    assert str(exc.value).startswith(f"{path}:2: max_concurrency: expected a whole number")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [("", "empty"), ("[1, 2]", "got a list"), ('{"completed": 3}', "no known result format recognised"),
     ("\xff", None)],
)
def test_other_malformed_files(tmp_path, text, fragment):
    path = tmp_path / "x.json"
    if text == "\xff":
        path.write_bytes(b"\xff\xfe{")
        fragment = "not UTF-8"
    else:
        path.write_text(text)
    with pytest.raises(ResultFileError, match=fragment):
        load_result_file(path)
    with pytest.raises(ResultFileError, match="cannot read"):
        load_result_file(tmp_path / "missing.json")


SPEC = {"spec_num_drafts": 50, "spec_num_draft_tokens": 150, "spec_num_accepted_tokens": 90,
        "acceptance_rate": 0.6, "acceptance_length": 2.8, "per_position_acceptance_rate": [0.8, 0.6, 0.4]}


def real_window(spec: dict | None = SPEC) -> WindowMetrics:
    logs = [make_log(i, n=16, per_chunk=3) for i in range(6)] + [make_log(6, ok=False)]
    m = compute_run_metrics(logs, 0, 700_000_000, slo={"ttft_ms": 25.0})
    return m.with_spec_decode(spec) if spec else m


def test_export_uses_vllm_names_and_vllm_itl_definition():
    window = real_window()
    out = export_vllm_layout(window, {"model": "/models/t", "concurrency": 2, "num_prompts": 7,
                                      "request_rate": None, "run_id": 42}, spec_source="vllm")
    vllm_keys = set(json.loads(VLLM_FULL.read_text()))
    per_request = {"input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "queue_times",
                   "generated_texts", "errors", "max_concurrent_requests", "rtfx"}
    assert vllm_keys - per_request <= set(out)  # every summary key vLLM writes is there
    assert out["mean_itl_ms"] == window.mean_icl_ms != window.mean_itl_ms  # vLLM's ITL = our ICL
    assert out["p99_e2el_ms"] == window.p99_e2el_ms
    assert out["request_goodput"] == window.request_goodput_req_s
    assert out["duration"] == window.duration_s and out["output_throughput"] == window.output_throughput_tok_s
    assert out["request_rate"] == "inf" and out["max_concurrency"] == 2 and out["model_id"] == "/models/t"
    assert out["spec_decode_acceptance_rate"] == pytest.approx(60.0)  # percent, as vLLM writes it
    assert out["spec_decode_draft_tokens"] == 150
    db = out["draftboard"]
    assert db["metrics"]["mean_itl_ms"] == window.mean_itl_ms and db["spec_source"] == "vllm"
    assert db["run"]["run_id"] == 42 and "per chunk" in db["definitions"]["export_itl_keys"]
    json.dumps(out, allow_nan=False)  # plain JSON
    # no acceptance figures (autoregressive): no spec_decode_* keys, as vLLM writes it
    plain = export_vllm_layout(real_window(None))
    assert not [k for k in plain if k.startswith("spec_decode")] and plain["draftboard"]["spec_source"] is None


def test_export_then_import_round_trips(tmp_path):
    window = real_window()
    meta = {"model": "/models/t", "concurrency": 2, "num_prompts": 7, "request_rate": 4.0}
    out = export_vllm_layout(window, meta, spec_source="vllm")
    path = write(tmp_path, "export.json", json.dumps(out))
    [run] = load_result_file(path)
    assert run.source_tool == TOOL_DRAFTBOARD
    assert run.metrics == window
    assert run.spec_source == "vllm"
    assert run.workload["request_rate"] == 4.0 and run.workload["concurrency"] == 2

    # without the draftboard block the file is a plain vLLM file: ICL comes back, per-token ITL does not
    out.pop("draftboard")
    [plain] = load_result_file(write(tmp_path, "plain.json", json.dumps(out)))
    assert plain.source_tool == TOOL_VLLM
    for stat in ("mean", "median", "std", "p90", "p95", "p99"):
        assert getattr(plain.metrics, f"{stat}_icl_ms") == getattr(window, f"{stat}_icl_ms")
        assert getattr(plain.metrics, f"{stat}_itl_ms") is None
        assert getattr(plain.metrics, f"{stat}_ttft_ms") == getattr(window, f"{stat}_ttft_ms")
    assert plain.metrics.acceptance_rate == pytest.approx(SPEC["acceptance_rate"])
    for f in METRIC_FIELDS:  # every figure with a vLLM key comes back (acceptance rate via percent)
        if f.vllm_key and f.name != "acceptance_rate":
            assert getattr(plain.metrics, f.name) == getattr(window, f.name), f.name


def test_format1_export_still_imports(tmp_path):
    """A file exported before the metric schema (draftboard block format 1: old key names,
    acceptance figures under draftboard.spec_decode), written by draftboard at 021632b from the
    same logs as `real_window`, imports as the identical WindowMetrics."""
    [run] = load_result_file(DRAFTBOARD_FORMAT1)
    assert run.source_tool == TOOL_DRAFTBOARD and run.source_version == "export format 1"
    # figures the schema gained later (runs 0010) are unknown in the old file, never guessed
    later = {"mean_decode_tokens_per_chunk": None, "coalesced_share": None}
    assert run.metrics == dataclasses.replace(real_window(), **later) and run.spec_source == "vllm"
    assert run.source_extra["draftboard_run"]["run_id"] == 7
    out = json.loads(DRAFTBOARD_FORMAT1.read_text())
    out["draftboard"]["metrics"]["a_later_key"] = 1.5
    [run] = load_result_file(write(tmp_path, "format1.json", json.dumps(out)))
    assert run.source_extra["draftboard_metrics"] == {"a_later_key": 1.5}  # kept, not lost
    out["draftboard"]["format"] = 9
    with pytest.raises(ResultFileError, match="unknown export format 9"):
        load_result_file(write(tmp_path, "format9.json", json.dumps(out)))


def test_bad_draftboard_block_names_the_field(tmp_path):
    out = export_vllm_layout(real_window())
    out["draftboard"]["metrics"]["mean_ttft_ms"] = "fast"
    with pytest.raises(ResultFileError) as exc:
        load_result_file(write(tmp_path, "bad-export.json", json.dumps(out)))
    assert exc.value.field == "draftboard.metrics.mean_ttft_ms"


def test_vllm_bench_serve_result_reads_back_after_export(tmp_path):
    """Import a real vLLM file, export it, import again: the same numbers under the same names."""
    [first] = load_result_file(VLLM_FULL)
    meta = {"model": first.workload["model"], "concurrency": first.workload["concurrency"],
            "num_prompts": first.workload["num_prompts"]}
    path = write(tmp_path, "again.json", json.dumps(export_vllm_layout(first.metrics, meta, first.spec_source)))
    [second] = load_result_file(path)
    assert second.metrics == first.metrics
    assert second.spec_source == first.spec_source


def test_a_truncated_file_is_called_truncated(tmp_path):
    """Issue 31: a file cut short says so, and what it ends inside; other bad JSON stays 'not valid JSON'."""
    path = write(tmp_path, "cut.json", '{\n "completed": 3,\n "ttfts": [1.0, 2.0,\n')
    with pytest.raises(ResultFileError) as exc:
        load_result_file(path)
    assert str(exc.value).startswith(f"{path}:3: truncated (ends inside a list)")
    path = write(tmp_path, "cut2.json", '{\n "completed": 3,\n "model_id": "m')
    with pytest.raises(ResultFileError, match=r"cut2.json:3: truncated \(ends inside a string\)"):
        load_result_file(path)
    path = write(tmp_path, "bad.json", '{"completed": 3,\n "failed": }\n')
    with pytest.raises(ResultFileError, match=r"bad.json:2: not valid JSON"):
        load_result_file(path)


def test_a_huge_number_names_its_line_and_length(tmp_path):
    """Issue 31: an integer over Python's conversion limit is refused at its own line (not line 1),
    with its length, and no advice to raise the interpreter's limit."""
    path = write(tmp_path, "huge.json", '{\n "model_id": "m",\n "completed": 3,\n "failed": ' + "9" * 5000 + "\n}\n")
    with pytest.raises(ResultFileError) as exc:
        load_result_file(path, fmt="vllm")
    assert exc.value.line == 4
    assert "a number too long to read: an integer of 5000 digits" in str(exc.value)
    assert "set_int_max_str_digits" not in str(exc.value)
