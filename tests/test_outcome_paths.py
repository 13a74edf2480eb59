"""One outcome, every path (issue 17): a run measured on an offline GPU host reaches the database
with the same GPU data as the same outcome stored by a worker; an older bundle stays readable;
the outcome's text limits; the runs' creation moves."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from pydantic import ValidationError

from benchkit.__main__ import run_sweep_offline
from benchkit.execution import offline
from benchkit.execution.bundle import open_bundle
from benchkit.execution.outcome import RunOutcome
from benchkit.hosts.inventory import GpuInfo, HostInventory
from benchkit.measure.gpu_samples import decode_telemetry
from benchkit.measure.logs import decode_logs
from benchkit.measure.metrics import METRIC_FIELDS
from benchkit.specs import GpuRef, RunSpec
from runs.models import GpuTelemetryBlob, RequestLogBlob, Run, RunMetrics, RunState, RunTransition
from runs.services import ingest
from runs.services.outcomes import store_outcome
from runs.services.transitions import IMPORTED, NEW, IllegalTransition, create, transition
from tests.factories import make_run, make_sweep
from tests.synthetic_server import SyntheticConfig, SyntheticServer
from tests.test_offline import sweep_text
from tests.test_runner_telemetry import U0, stand_in, switched_stream
from tests.test_telemetry_django import fixture, outcome_for

pytestmark = pytest.mark.django_db

HOST = "gpu-offline"
V1_BUNDLE = Path(__file__).parent / "fixtures" / "bundles" / "v1"
EFFICIENCY_FIELDS = [f.name for f in METRIC_FIELDS if f.group == "efficiency"]


def gpu_inventory() -> HostInventory:
    """An offline host with the one GPU the recorded stream holds."""
    return HostInventory(hostname="gpu-offline-box", gpus=[GpuInfo(index=0, uuid=U0, name="NVIDIA H200",
                                                                  pci_bus_id="00000000:19:00.0", numa_node=0)])


def stored_gpu_data(run: Run) -> dict:
    """What the database holds of a run's GPU side: its telemetry blob, its per-GPU efficiency
    rows and GPU verdicts, its efficiency figures and its suspect marks."""
    blob = GpuTelemetryBlob.objects.get(run=run)
    m = RunMetrics.objects.get(run=run)
    run.refresh_from_db()
    return {"stream": decode_telemetry(bytes(blob.data)),
            "blob": (blob.hz, blob.n_ticks, blob.n_gpus, blob.idle_used_mib),
            "efficiency": m.efficiency, "gpu_check": m.gpu_check,
            "figures": {f: getattr(m, f) for f in EFFICIENCY_FIELDS},
            "suspect": (run.suspect, run.suspect_reasons), "state": run.state}


def test_an_offline_gpu_run_ingests_with_the_gpu_data_a_worker_stores(tmp_path, monkeypatch):
    """The done-when test of issue 17: a bundle written with GPU telemetry (the real sampler child
    process over a recorded NVML stream, throttled for the whole run) is ingested, and the run
    holds the same telemetry blob, per-GPU figures, verdicts and suspect marks as the worker
    path stores for the very same outcome."""
    flag = tmp_path / "throttled"
    flag.touch()  # the stand-in answers from the throttled reading all along
    stand_in(monkeypatch, f"{switched_stream(tmp_path)}::{flag}")
    outcomes: list[RunOutcome] = []
    execute_runs = offline.execute_runs

    def keep(*args, **kwargs):
        outcomes.extend(out := execute_runs(*args, **kwargs))
        return out

    monkeypatch.setattr(offline, "execute_runs", keep)
    with SyntheticServer(SyntheticConfig(ttft_ms=5, gap_ms=20, tokens_per_message=4, first_message_tokens=1)) as url:
        (tmp_path / "sweep.yaml").write_text(sweep_text(url, concurrency=(1,), num_prompts=4))
        summary = run_sweep_offline(tmp_path / "sweep.yaml", tmp_path / "bundle", host=HOST,
                                    inventory=gpu_inventory(), progress=False)
    assert (summary.succeeded, summary.failed) == (1, 0)
    (outcome,) = outcomes
    assert outcome.telemetry is not None and outcome.gpu_check["verdicts"]

    report = ingest.ingest_bundle(open_bundle(tmp_path / "bundle"))
    assert [r.status for r in report.runs] == ["stored"]
    ingested = Run.objects.get(pk=report.runs[0].run_id)
    worker = make_run(make_sweep(), method="draft_model", k=3, gpus=[GpuRef(0, U0, name="NVIDIA H200")])
    for state in ("preflight", "starting", "warming", "measuring", "stopping"):
        transition(worker, state)
    worker = store_outcome(worker, outcome)

    got, want = stored_gpu_data(ingested), stored_gpu_data(worker)
    assert got == want
    assert want["stream"] == outcome.telemetry and want["state"] == RunState.SUCCEEDED
    assert "gpu_throttled" in [v["code"] for v in want["gpu_check"]["verdicts"]]
    assert want["efficiency"]["gpus"][0]["uuid"] == U0 and want["figures"]["energy_j"] is not None
    assert any(r.startswith("gpu_throttled: GPU 0 (") for r in want["suspect"][1]) and want["suspect"][0]
    assert [g["uuid"] for g in ingested.gpus] == [U0]  # planned on the offline host's inventory


def test_a_version_1_bundle_still_ingests(tmp_path):
    """A bundle written by the previous format (version 1, no GPU data: made by draftboard before
    issue 17 against the synthetic server) is read with its renamed keys and stored."""
    folder = Path(shutil.copytree(V1_BUNDLE, tmp_path / "bundle"))
    bundle = open_bundle(folder)
    assert bundle.manifest.format_version == 1
    report = ingest.ingest_bundle(bundle)
    assert [r.status for r in report.runs] == ["stored"]
    run = Run.objects.select_related("metrics").get()
    assert run.state == RunState.SUCCEEDED and run.failure_reason == "" and run.provenance["build"] == "external"
    assert run.metrics.acceptance_length == pytest.approx(1 + 11 / 4) and run.metrics.completed == 3
    blob = RequestLogBlob.objects.get(run=run)
    assert len([r for r in decode_logs(bytes(blob.data)) if not r.warmup]) == 3 and blob.window_end_ns > 0
    assert not GpuTelemetryBlob.objects.exists() and run.metrics.gpu_check == {}
    assert list(run.transitions.values_list("from_state", "to_state")) == [("ingested", "succeeded")]


def test_the_run_file_round_trips_an_outcome_and_refuses_a_damaged_stream():
    """JSON of an outcome with logs and a telemetry stream (throttle.json), read back: every field
    equal; a telemetry part whose size disagrees with its data is refused by name."""
    run = make_run(make_sweep(), gpus=[GpuRef(0, U0, name="NVIDIA H200")])
    out = outcome_for(run, fixture("throttle"))
    assert out.ok and out.gpu_check["verdicts"] and out.logs
    again = RunOutcome.model_validate_json(out.model_dump_json())
    assert again == out and again.telemetry == out.telemetry and again.metrics == out.metrics
    doc = json.loads(out.model_dump_json())
    assert doc["logs"]["encoding"] == "draftboard-logs-v1" and doc["telemetry"]["n_gpus"] == 1
    doc["telemetry"]["n_ticks"] += 1
    with pytest.raises(ValidationError, match=r"telemetry\n.*n_ticks"):
        RunOutcome.model_validate_json(json.dumps(doc))
    doc = json.loads(out.model_dump_json())
    doc["gpu_check"]["verdicts"][0]["first_s"] = "soon"
    with pytest.raises(ValidationError, match="gpu_check"):
        RunOutcome.model_validate_json(json.dumps(doc))


def test_texts_are_cut_to_the_database_limits_never_refused():
    out = RunOutcome(ok=False, reason="r" * 80, message="m" * 6000, engine_commit="c" * 70,
                     server_log_tail="x" * 30_000 + "the end")
    assert (len(out.reason), len(out.message), len(out.engine_commit)) == (50, 5000, 64)
    assert len(out.server_log_tail) == 20_000 and out.server_log_tail.endswith("the end")
    out.reason = "s" * 99  # every assignment is validated: the runner fills an outcome as it goes
    assert out.reason == "s" * 50
    with pytest.raises(ValueError, match="port"):
        out.port = 70_000


def test_an_outcome_that_cannot_end_a_run_is_refused_and_nothing_stored():
    run = make_run(make_sweep())
    transition(run, "preflight")
    with pytest.raises(ValueError, match="needs its failure reason"):
        store_outcome(run, RunOutcome(ok=False))
    run.refresh_from_db()
    assert run.state == RunState.PREFLIGHT


def test_runs_are_created_only_by_the_creation_moves():
    sweep = make_sweep()
    spec = RunSpec.from_dict(make_run(sweep).spec)

    def new(key: str) -> Run:
        return Run(sweep=sweep, host=sweep.host, point_key=key, spec=spec.to_dict(), engine="vllm", model="m",
                   method="auto")

    (queued,) = create([new("a")], NEW, RunState.QUEUED, "created from test")
    (imported,) = create([new("b")], IMPORTED, RunState.FAILED, "imported from x.json", failure_reason="all_failed")
    assert (queued.state, queued.started_at) == ("queued", None)
    assert imported.state == "failed" and imported.started_at and imported.finished_at
    history = RunTransition.objects.filter(run__in=[queued, imported]).values_list("from_state", "to_state", "note")
    assert list(history) == [("new", "queued", "created from test"), ("imported", "failed", "imported from x.json")]
    for origin, state in ((NEW, RunState.SUCCEEDED), (IMPORTED, RunState.QUEUED), ("stopping", RunState.SUCCEEDED)):
        with pytest.raises(IllegalTransition):
            create([new(f"{origin}-{state}")], origin, state)
    with pytest.raises(IllegalTransition, match="exists"):
        create([queued], NEW, RunState.QUEUED)
