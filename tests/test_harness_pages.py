"""Issue 19, done when: a fresh clone imports one real file of each tool (the folder fixtures
included) with values equal to the file's, shows them on the sweep and run pages side by side
with a draftboard-measured run of the same configuration, and exports them.

A sweep holds one run measured by draftboard (logs through benchkit.measure.metrics, stored by
the real services as tests/factories.py does) of the demo model at concurrency 2, 128 input and
128 output tokens; the real result files of AIPerf, GuideLLM, genai-bench, inference-perf and
`vllm bench sweep` of the same model and workload are imported into it (`--into-sweep`). The
sweep page, its data and run list, every run page and the CSV / JSON exports are rendered and
read back.
"""

from __future__ import annotations

import csv
import io
import json
import re
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.template.defaultfilters import floatformat
from django.urls import reverse

from benchkit.execution.outcome import RunOutcome
from benchkit.measure import metrics
from benchkit.specs import RunSpec, ServerConfig, WorkloadSpec
from runs.models import Run, RunState
from runs.services.outcomes import store_outcome
from runs.services.sweeps import run_fields
from runs.services.transitions import transition
from tests.factories import make_logs, make_sweep

pytestmark = pytest.mark.django_db
H = Path(__file__).parent / "fixtures" / "harnesses"
#: (source, --method or None, tool as the run page names it, its version there).
SOURCES = [
    (H / "aiperf" / "auto" / "profile_export_aiperf.json", "auto", "AIPerf", "0.13.0"),
    (H / "guidellm" / "auto" / "benchmarks.json", "auto", "GuideLLM", "0.8.1"),
    (H / "genai-bench" / "auto", "auto", "genai-bench", "0.0.5"),
    (H / "inference-perf" / "auto", "auto", "inference-perf", None),
    (H / "vllm-bench-sweep" / "sweep", None, "vllm bench sweep", None),
]


def measured_run(sweep) -> Run:
    """A draftboard-measured auto run of the demo model at concurrency 2, 128 in / 128 out."""
    spec = RunSpec(server=ServerConfig(engine="vllm", model="demo", method="auto", tp=1),
                   workload=WorkloadSpec(concurrency=2, output_len=128, input_len=128, num_prompts=8))
    run = Run.objects.create(sweep=sweep, host=sweep.host, point_key="measured", spec=spec.to_dict(),
                             **run_fields(spec))
    for state in (RunState.PREFLIGHT, RunState.STARTING, RunState.WARMING, RunState.MEASURING, RunState.STOPPING):
        transition(run, state)
    logs, t0, t1 = make_logs(8, 1, 6.0, n_tokens=128, input_len=128)
    window = metrics.compute_run_metrics(logs, t0, t1, None)
    return store_outcome(run, RunOutcome(ok=True, logs=logs, window_start_ns=t0, window_end_ns=t1, metrics=window,
                                         argv=["python", "-m", "vllm.entrypoints.openai.api_server"]))


def text_of(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def test_every_tool_imports_beside_a_measured_run_and_shows_and_exports(client):
    sweep = make_sweep(name="side by side")
    measured = measured_run(sweep)
    for path, method, tool, _ in SOURCES:
        out = StringIO()
        args = ["--method", method] if method else []
        call_command("import_results", str(path), *args, "--into-sweep", str(sweep.pk), stdout=out)
        assert f"({tool}):" in out.getvalue() and f"into sweep {sweep.pk}" in out.getvalue()
    runs = list(Run.objects.filter(sweep=sweep).select_related("metrics").order_by("id"))
    imported = [r for r in runs if r.pk != measured.pk]
    # one run per AIPerf profile, GuideLLM benchmark, genai-bench run file, inference-perf stage, sweep run file
    assert len(imported) == 1 + 3 + 3 + 2 + 4
    assert all(r.state == RunState.SUCCEEDED and r.model == "demo" for r in runs)

    # the sweep page: every run counted, the measured one and the imported ones in one grid
    html = client.get(reverse("analysis:sweep_detail", args=[sweep.pk])).content.decode()
    text = text_of(html)
    assert "auto" in text and "draft_model k=2" in text
    total_auto = sum(1 for r in runs if r.method == "auto")
    assert f"{total_auto} of {total_auto} succeeded" in text and "2 of 2 succeeded" in text
    assert "None" not in text
    # its data: every run a point with its stored output tok/s, the measured one among them
    data = client.get(reverse("analysis:sweep_data", args=[sweep.pk]) + "?points=1").json()
    cols = data["points"]["columns"]
    points = {row[cols.index("run_id")]: row for row in data["points"]["rows"]}
    assert set(points) == {r.pk for r in runs}
    for r in runs:
        assert points[r.pk][cols.index("output_throughput_tok_s")] == r.metrics.output_throughput_tok_s
    # the run list shows each run's figures side by side
    listing = text_of(client.get(reverse("analysis:sweep_runs", args=[sweep.pk])).content.decode())
    for r in runs:
        assert floatformat(r.metrics.median_ttft_ms, 2) in listing

    # every run page: its figures and where they came from (tool and version, its definitions)
    for r in runs:
        page = text_of(client.get(reverse("analysis:run_detail", args=[r.pk])).content.decode())
        m = r.metrics
        assert f"{floatformat(m.output_throughput_tok_s, 1)} tok/s" in page
        assert floatformat(m.median_ttft_ms, 2) in page
        if r.pk == measured.pk:
            assert "source draftboard" in page and "Imported from a result file" not in page
            continue
        path, _, tool, version = next(s for s in SOURCES if r.spec["imported"].startswith(str(s[0])))
        assert f"written by {tool}{f' {version}' if version else ''}" in page
        assert f"How {tool} defines these figures" in page and m.definitions["ttft"] in page
    genai = next(r for r in imported if r.metrics.source_tool == "genai-bench")
    assert "(engine version 0.32.0)" in text_of(client.get(reverse("analysis:run_detail",
                                                                   args=[genai.pk])).content.decode())

    # exports: every run, its figures as stored, the tool it came from
    rows = list(csv.DictReader(io.StringIO(client.get(
        reverse("analysis:sweep_export", args=[sweep.pk, "csv"])).content.decode())))
    by_id = {int(row["run"]): row for row in rows}
    assert set(by_id) == {r.pk for r in runs}
    header = next(h for h in rows[0] if h.startswith("output throughput"))
    for r in runs:
        assert float(by_id[r.pk][header]) == pytest.approx(r.metrics.output_throughput_tok_s, rel=1e-12)
    exported = json.loads(client.get(reverse("analysis:sweep_export", args=[sweep.pk, "json"])).content)
    tools = {e["draftboard"]["run"]["run_id"]: e["draftboard"]["run"]["source_tool"] for e in exported["runs"]}
    assert tools == {r.pk: r.metrics.source_tool for r in runs}
    for e in exported["runs"]:
        r = next(x for x in runs if x.pk == e["draftboard"]["run"]["run_id"])
        assert e["median_ttft_ms"] == r.metrics.median_ttft_ms
        assert e["draftboard"]["metrics"]["median_tpot_ms"] == r.metrics.median_tpot_ms
