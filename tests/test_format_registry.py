"""The format registry (benchkit.formats.registry): a result format is one module plus one
registry entry. The stand-in formats of tests/standin_format.py are registered by these tests
alone (no other project file names them) and import through the real `import_results` command
into the real database: detection, the `--format` choices and the importer all derive from the
registry."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from benchkit.formats.registry import FORMATS, format_choices
from runs.models import ResultFile, Run, RunMetrics, RunTransition, Sweep
from tests import standin_format

pytestmark = pytest.mark.django_db
TABLES = (Sweep, Run, RunMetrics, RunTransition, ResultFile)

BENCH = [
    {"concurrency": 1, "requests": {"completed": 8, "failed": 0}, "duration_s": 4.0, "input_tokens": 2048,
     "output_tokens": 1024, "ttft_ms": {"mean": 21.5, "median": 20.25, "p99": 40.0}, "tpot_ms": {"mean": 3.125},
     "rate_note": "closed loop"},
    {"concurrency": 4, "requests": {"completed": 30, "failed": 2}, "duration_s": 5.0, "input_tokens": 7680,
     "output_tokens": 3840, "ttft_ms": {"mean": 35.0, "median": 33.5, "p99": 80.25}, "tpot_ms": {"mean": 4.5}},
]
DOC = {"loadtool": {"version": "0.3.1"}, "model": "demo/tiny", "benchmarks": BENCH}


def counts() -> dict[str, int]:
    return {t.__name__: t.objects.count() for t in TABLES}


def run_cmd(path: Path, *args: str) -> str:
    out = StringIO()
    call_command("import_results", str(path), "--method", "auto", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def loadtool(monkeypatch):
    """The stand-in document format, registered for this test only (one registry entry)."""
    monkeypatch.setitem(FORMATS, standin_format.FORMAT.name, standin_format.FORMAT)
    return standin_format.FORMAT


def test_a_new_format_imports_through_the_command(tmp_path, monkeypatch):
    """Done when (issue 17): a stand-in format, one module and a registry entry made here,
    imports through the real `import_results` into the database, several runs from one document."""
    path = tmp_path / "report.json"
    path.write_text(json.dumps(DOC, indent=2))
    # not registered: not a choice, and detection lists only the real formats
    with pytest.raises(CommandError, match="invalid choice: 'loadtool'"):
        run_cmd(path, "--format", "loadtool")
    with pytest.raises(CommandError, match=r"no known result format recognised this file \(keys: loadtool, model, "
                                           r"benchmarks\); known formats: vllm .*; sglang "):
        run_cmd(path)
    assert counts() == dict.fromkeys(counts(), 0)

    monkeypatch.setitem(FORMATS, standin_format.FORMAT.name, standin_format.FORMAT)
    assert format_choices() == ["auto", "vllm", "sglang", "aiperf", "guidellm", "genai-bench", "inference-perf",
                                "vllm-sweep", "loadtool"]
    out = run_cmd(path)  # auto: the registry's formats are asked, the stand-in recognises its file
    assert f"imported          {path} (loadtool): 2 run(s)" in out

    runs = list(Run.objects.select_related("metrics").order_by("id"))
    assert [r.spec["imported"] for r in runs] == [f"{path}#benchmarks[0]", f"{path}#benchmarks[1]"]
    for run, src in zip(runs, BENCH, strict=True):
        m = run.metrics
        assert (run.concurrency, run.model, run.engine_version) == (src["concurrency"], "demo/tiny", "0.3.1")
        assert (m.completed, m.failed, m.duration_s) == (src["requests"]["completed"], src["requests"]["failed"],
                                                         src["duration_s"])
        assert (m.total_input_tokens, m.total_output_tokens) == (src["input_tokens"], src["output_tokens"])
        assert (m.mean_ttft_ms, m.median_ttft_ms, m.p99_ttft_ms) == tuple(src["ttft_ms"].values())
        assert m.mean_tpot_ms == src["tpot_ms"]["mean"] and m.mean_itl_ms is None  # not in the file: unknown
        # derived by the shared rules (finish_window), and said so
        assert m.output_throughput_tok_s == pytest.approx(src["output_tokens"] / src["duration_s"])
        assert m.error_rate == pytest.approx(src["requests"]["failed"] / (src["requests"]["failed"]
                                                                         + src["requests"]["completed"]))
        assert "output_throughput_tok_s = total_output_tokens / duration_s" in m.definitions["derived"]
        assert m.source_tool == "loadtool"
        assert run.num_prompts == src["requests"]["completed"] + src["requests"]["failed"]
    assert runs[0].metrics.extra == {"rate_note": "closed loop"}  # an unknown key is kept
    assert ResultFile.objects.get().source_tool == "loadtool"

    # forced by name: the same bytes, reported as imported before
    before = counts()
    again = run_cmd(path, "--format", "loadtool", "--sweep-name", "again")
    assert "already imported" in again and "(loadtool)" in again and counts() == before
    # a forced format still validates what it requires: vLLM finds none of its figures here
    other = tmp_path / "report-copy.json"
    other.write_text(json.dumps(DOC))
    with pytest.raises(CommandError, match=r"report-copy\.json:1: no vllm bench serve figure in this object"):
        run_cmd(other, "--format", "vllm")
    assert counts() == before


def test_a_new_format_refuses_bad_values_with_file_line_field(tmp_path, loadtool):
    bad = json.loads(json.dumps(DOC))
    bad["benchmarks"][1]["ttft_ms"]["mean"] = -3.0
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad, indent=2))
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if '"benchmarks"' in text)
    with pytest.raises(CommandError, match=rf"bad\.json:{line}: benchmarks\[1\]\.ttft_ms\.mean: must be >= 0"):
        run_cmd(path)
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"loadtool": {}, "benchmarks": []}))
    with pytest.raises(CommandError, match=r"empty\.json:1: benchmarks: no benchmark in the document"):
        run_cmd(empty)
    nothing = tmp_path / "nothing.json"  # a benchmark with no figure at all: refused, not an empty run
    nothing.write_text(json.dumps({"loadtool": {}, "benchmarks": [{"concurrency": 2}]}))
    with pytest.raises(CommandError, match=r"nothing\.json#benchmarks\[0\]: no measured figure could be read from "
                                           r"this loadtool run"):
        run_cmd(nothing)
    assert counts() == dict.fromkeys(counts(), 0)


def write_sweep_folder(folder: Path) -> Path:
    (folder / "points").mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"sweeptool": "1.2", "model": "demo/tiny"}))
    for bench in BENCH:
        (folder / "points" / f"c{bench['concurrency']}.json").write_text(json.dumps(bench))
    (folder / "notes.txt").write_text("not a result")
    return folder


def test_a_folder_format_imports_a_folder_as_one_source(tmp_path, monkeypatch):
    folder = write_sweep_folder(tmp_path / "sweep-out")
    with pytest.raises(CommandError, match=r"no known result format recognised this folder .*; a folder of result "
                                           r"files, one per configuration, is imported with --name-pattern"):
        run_cmd(folder)
    monkeypatch.setitem(FORMATS, standin_format.FOLDER_FORMAT.name, standin_format.FOLDER_FORMAT)
    out = run_cmd(folder)
    assert f"imported          {folder} (sweeptool): 2 run(s)" in out
    runs = list(Run.objects.select_related("metrics").order_by("id"))
    assert [r.spec["imported"] for r in runs] == [str(folder / "points" / f"c{c}.json") for c in (1, 4)]
    assert [r.metrics.completed for r in runs] == [8, 30] and runs[0].engine_version == "1.2"
    assert Sweep.objects.get().name == "sweep-out"

    # the key covers the files the format read: a file it does not read changes nothing ...
    (folder / "more-notes.txt").write_text("still not a result")
    assert "already imported" in run_cmd(folder)
    # ... a point file it reads does
    point = folder / "points" / "c4.json"
    point.write_text(point.read_text().replace('"completed": 30', '"completed": 31'))
    assert "imported          " in run_cmd(folder, "--sweep-name", "rerun")
    assert Run.objects.count() == 4 and ResultFile.objects.count() == 2
    with pytest.raises(CommandError, match=r"format 'sweeptool' \(sweeptool\) reads a folder, and this is a file"):
        run_cmd(point, "--format", "sweeptool")
