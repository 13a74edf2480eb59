"""GPU telemetry and client headroom stored with the run (issue 12 phase 2, issue 13 item 4):
GpuTelemetryBlob beside the request logs (failed runs too), the efficiency / client fields of
the metric schema, suspect marks on the run, recompute re-deriving the GPU figures, GpuPrice and
the cost priced when read. Outcomes go through the runner's own `_finish` and
`outcomes.store_outcome`."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest
from django.urls import reverse

from benchkit.execution import runner
from benchkit.execution.outcome import RunOutcome
from benchkit.measure import efficiency
from benchkit.measure.gpu_samples import TelemetryStream, decode_telemetry
from benchkit.measure.gpu_window import NO_GPUS_NOTE
from benchkit.measure.logs import MessageEvent, RequestLog
from benchkit.specs import GpuRef, RunSpec
from runs import selectors
from runs.models import GpuPrice, GpuTelemetryBlob, Run, RunMetrics, RunState
from runs.services.outcomes import store_outcome
from runs.services.recompute import recompute_run
from runs.services.transitions import transition
from tests.factories import make_logs, make_run, make_sweep
from tests.fixtures.telemetry import make_streams

pytestmark = pytest.mark.django_db

FIXTURES = Path(__file__).parent / "fixtures" / "telemetry"
T0 = make_streams.T0_NS
U0, U1 = make_streams.UUIDS
H200 = "NVIDIA H200"


def fixture(name: str) -> TelemetryStream:
    return TelemetryStream.from_dict(json.loads((FIXTURES / f"{name}.json").read_text()))


def shifted(logs: list[RequestLog], by_ns: int) -> list[RequestLog]:
    return [RequestLog(index=r.index, warmup=r.warmup, send_ns=r.send_ns + by_ns,
                       events=[MessageEvent(t_ns=e.t_ns + by_ns, tokens=e.tokens, kind=e.kind) for e in r.events],
                       ok=r.ok, prompt_tokens=r.prompt_tokens, completion_tokens=r.completion_tokens,
                       input_len=r.input_len, output_len=r.output_len, end_ns=r.end_ns + by_ns) for r in logs]


def outcome_for(run: Run, stream: TelemetryStream | None, client: dict | None = None, ok: bool = True,
                gap_ms: float = 37.0) -> RunOutcome:
    """The outcome the runner would return for `run` with `stream`: four requests of 64 tokens
    placed from 4.05 s after the fixtures' first tick (about 9.5 s, inside their loaded span),
    finished by runner._finish (metrics, GPU figures, validity)."""
    logs, t0, _ = make_logs(4, 1, gap_ms, n_tokens=64)
    logs = shifted(logs, T0 + 4_050_000_000 - t0)
    spec = RunSpec.from_dict(run.spec)
    out = RunOutcome(ok=False, argv=["vllm"], logs=logs, window_start_ns=logs[0].send_ns,
                     window_end_ns=logs[-1].end_ns, telemetry=stream, client_headroom=client or {},
                     idle_used_mib={g.uuid: 0 for g in spec.gpus},
                     telemetry_note="" if stream is not None or not spec.gpus else "no GPU telemetry: test")
    if not spec.gpus:
        out.telemetry_note = NO_GPUS_NOTE
    runner._finish(spec, out, {})
    if not ok:
        out.ok, out.reason, out.message = False, "server_died", "the server exited during the run"
    return out


def drive(run: Run) -> Run:
    for state in (RunState.PREFLIGHT, RunState.STARTING, RunState.WARMING, RunState.MEASURING, RunState.STOPPING):
        transition(run, state)
    return run


def gpu_run(gpus=((0, U0),), name=H200) -> Run:
    return drive(make_run(make_sweep(), gpus=[GpuRef(i, u, name=name) for i, u in gpus]))


def test_stored_run_keeps_its_stream_figures_verdicts_and_client_headroom():
    run = gpu_run()
    client = {"processes": 1, "cpu_s": 9.0, "max_core_share": 0.95, "loop_lag_p99_ms": 2.5, "loop_lag_max_ms": 7.0,
              "per_process": [], "event_loop": "asyncio"}
    out = outcome_for(run, fixture("throttle"), client)
    assert out.ok, (out.reason, out.message)
    run = store_outcome(run, out)
    assert run.state == RunState.SUCCEEDED

    blob = GpuTelemetryBlob.objects.get(run=run)
    assert decode_telemetry(bytes(blob.data)) == out.telemetry
    assert (blob.hz, blob.n_ticks, blob.n_gpus, blob.idle_used_mib) == (10.0, 146, 1, {U0: 0})

    m = RunMetrics.objects.get(run=run)
    want = efficiency.efficiency_figures(out.telemetry, out.window_start_ns, out.window_end_ns,
                                         output_tokens=4 * 64, n_gpus=1, gpu_uuids=[U0])
    assert m.energy_j == pytest.approx(want.energy_j) and m.energy_source == "counter"
    assert m.mean_power_w_per_gpu == pytest.approx(want.mean_power_w_per_gpu)
    assert m.energy_per_output_token_j == pytest.approx(want.energy_j / 256)
    assert m.efficiency["gpus"][0]["uuid"] == U0 and m.efficiency["tokens_counted"] == "output"
    assert [v["code"] for v in m.gpu_check["verdicts"]] == ["gpu_throttled", "gpu_clock_drop"]
    # issue 13: the client's figures in the schema's columns, the per-process detail beside them
    assert (m.client_processes, m.client_max_core_share, m.client_loop_lag_p99_ms, m.client_loop_lag_max_ms) == (
        1, 0.95, 2.5, 7.0)
    assert m.client_headroom == client
    # both marks reach the run: the GPU verdicts and the saturated client
    assert run.suspect
    assert any(r.startswith("gpu_throttled: GPU 0 (") for r in run.suspect_reasons)
    assert any(r.startswith("gpu_clock_drop: GPU 0 (") for r in run.suspect_reasons)
    assert any(r.startswith("client_saturated: ") and "95% of one core" in r for r in run.suspect_reasons)


def test_failed_run_keeps_its_stream_for_audit_and_no_metrics():
    run = gpu_run()
    run = store_outcome(run, outcome_for(run, fixture("throttle"), ok=False))
    assert run.state == RunState.FAILED and run.failure_reason == "server_died"
    assert GpuTelemetryBlob.objects.filter(run=run).exists()
    assert not RunMetrics.objects.filter(run=run).exists()


def test_cpu_run_stores_no_stream_and_says_why():
    run = drive(make_run(make_sweep()))
    run = store_outcome(run, outcome_for(run, None))
    m = RunMetrics.objects.get(run=run)
    assert not GpuTelemetryBlob.objects.filter(run=run).exists()
    assert m.energy_j is None and m.output_tok_s_per_gpu is None and m.gpu_check == {}
    assert m.efficiency["notes"][0] == NO_GPUS_NOTE
    assert not run.suspect


def test_recompute_rederives_gpu_figures_from_the_stored_stream_and_keeps_the_client():
    run = gpu_run(gpus=((0, U0), (1, U1)))
    client = {"processes": 2, "cpu_s": 1.0, "max_core_share": 0.4, "loop_lag_p99_ms": 0.5, "loop_lag_max_ms": 1.0}
    run = store_outcome(run, outcome_for(run, fixture("foreign"), client))
    before = RunMetrics.objects.get(run=run)
    assert before.energy_source == "counter" and before.gpu_check["verdicts"]
    RunMetrics.objects.filter(run=run).update(energy_j=None, energy_source=None, output_tok_s_per_kw=None,
                                              efficiency={}, gpu_check={})
    after = recompute_run(run.pk)
    assert after.energy_j == pytest.approx(before.energy_j) and after.energy_source == "counter"
    assert after.output_tok_s_per_kw == pytest.approx(before.output_tok_s_per_kw)
    assert after.gpu_check == before.gpu_check and after.efficiency == before.efficiency
    assert [v["code"] for v in after.gpu_check["verdicts"]] == ["gpu_foreign_process"]
    assert (after.client_processes, after.client_max_core_share, after.client_headroom) == (2, 0.4, client)

    GpuTelemetryBlob.objects.filter(run=run).delete()  # a GPU run stored without a stream
    bare = recompute_run(run.pk)
    assert bare.energy_j is None and bare.gpu_check == {}
    assert bare.output_tok_s_per_gpu == pytest.approx(bare.output_throughput_tok_s / 2)
    assert "no GPU telemetry was recorded for this run" in bare.efficiency["notes"]


def test_price_is_per_gpu_model_and_cost_is_computed_when_read():
    run = gpu_run(gpus=((0, U0), (1, U1)))
    run = store_outcome(run, outcome_for(run, fixture("clean")))
    m = RunMetrics.objects.get(run=run)
    assert selectors.price_for(run) is None and selectors.cost_of(run, m) == (None, None)  # no price: no cost
    GpuPrice.objects.create(gpu_name=H200, usd_per_gpu_hour=None)
    assert selectors.cost_of(run, m) == (None, None)  # an empty price is no price
    GpuPrice.objects.filter(gpu_name=H200).update(usd_per_gpu_hour=Decimal("3.5"))
    cost, price = selectors.cost_of(run, m)
    assert price == 3.5
    assert cost == pytest.approx(3.5 * 2 * m.duration_s / 3600 / m.total_output_tokens * 1e6)
    GpuPrice.objects.filter(gpu_name=H200).update(usd_per_gpu_hour=Decimal("7"))
    assert selectors.cost_of(run, m)[0] == pytest.approx(2 * cost)  # a new price reprices stored runs
    mixed = make_run(make_sweep(name="mixed"), gpus=[GpuRef(0, U0, name=H200), GpuRef(1, U1, name="NVIDIA H100")])
    assert selectors.price_for(mixed) is None  # GPUs of different models: no single price
    assert selectors.price_for(make_run(make_sweep(name="cpu"))) is None


def test_gpu_prices_are_edited_in_the_admin_list(admin_client):
    price = GpuPrice.objects.create(gpu_name=H200)
    url = reverse("admin:runs_gpuprice_changelist")
    page = admin_client.get(url)
    assert page.status_code == 200 and b'name="form-0-usd_per_gpu_hour"' in page.content
    resp = admin_client.post(url, {"form-TOTAL_FORMS": "1", "form-INITIAL_FORMS": "1", "form-MIN_NUM_FORMS": "0",
                                   "form-MAX_NUM_FORMS": "1000", "form-0-id": str(price.pk),
                                   "form-0-usd_per_gpu_hour": "4.25", "form-0-note": "list price", "_save": "Save"})
    assert resp.status_code == 302, resp.content[:2000]
    price.refresh_from_db()
    assert (price.usd_per_gpu_hour, price.note) == (Decimal("4.25"), "list price")
