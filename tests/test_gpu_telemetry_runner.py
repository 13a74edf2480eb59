"""On a real NVIDIA GPU host (issue 12 phase 2): the runner's own telemetry path (the real
TelemetrySampler child started by `benchkit.execution.runner._measure` around the warmup and the
window) while a child process runs a bf16 matrix-multiply loop on GPU 0, then the outcome stored
by `outcomes.store_outcome`. The stored efficiency figures must be present and plausible: power
well above the GPU's idle power read just before, energy from the energy counter (Volta+), J per
output token consistent with the energy and the tokens.

Run on the device machine (`nvidia-h200` or `-x2`); skipped wherever NVML finds no GPU. Needs
PyTorch with CUDA for the load process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from benchkit.execution.runner import NullHooks, execute_runs
from benchkit.hosts.inventory import collect_inventory
from benchkit.hosts.telemetry import TelemetrySampler
from benchkit.measure.efficiency import gpu_energy
from benchkit.measure.gpu_samples import decode_telemetry
from benchkit.specs import GpuRef, Limits, RunSpec, ServerConfig, WorkloadSpec
from runs.models import GpuTelemetryBlob, RunMetrics, RunState
from runs.services.outcomes import store_outcome
from runs.services.transitions import transition
from tests.factories import make_run, make_sweep
from tests.synthetic_server import SyntheticConfig, SyntheticServer
from tests.test_gpu_device import LOADER, _nvml_gpu_count, _wait_for

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_nvml_gpu_count() == 0, reason="no NVIDIA GPU visible to NVML"),
    pytest.mark.django_db,
]


def test_runner_stores_plausible_efficiency_figures_of_a_real_cuda_load(tmp_path):
    gpu = collect_inventory().gpus[0]
    # the GPU's idle power, read by the same sampler before any load
    with TelemetrySampler([gpu.uuid], tmp_path / "idle.bin", hz=10) as sampler:
        first = sampler.start()
        time.sleep(3.0)
        idle_window = (first + 1_000_000_000, time.perf_counter_ns())
        idle_stream = sampler.stop()
    idle = gpu_energy(idle_stream, idle_stream.gpus[0], *idle_window)
    print("idle:", idle)

    script = tmp_path / "loader.py"
    script.write_text(LOADER)
    env = dict(os.environ, CUDA_DEVICE_ORDER="PCI_BUS_ID", CUDA_VISIBLE_DEVICES=gpu.uuid)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=env, start_new_session=True)
    try:
        _wait_for(tmp_path / "imported", proc)
        (tmp_path / "go").touch()
        _wait_for(tmp_path / "warm", proc)
        time.sleep(2.0)  # NVML's power reading is a 1 s average: let it settle under load
        # ~8 requests x 16 tokens x 50 ms: a window of about 6-7 s, the warmup before it
        cfg = SyntheticConfig(ttft_ms=5, gap_ms=50, tokens_per_message=1)
        with SyntheticServer(cfg) as url:
            spec = RunSpec(server=ServerConfig(engine="external", endpoint_url=url, served_model_name="synthetic"),
                           workload=WorkloadSpec(input_len=8, output_len=16, num_prompts=8, concurrency=1),
                           limits=Limits(request_timeout_s=30, telemetry_hz=10.0),
                           gpus=[GpuRef(gpu.index, gpu.uuid, gpu.pci_bus_id or "", gpu.numa_node, gpu.name or "")])
            out = execute_runs([spec], [NullHooks()], tmp_path / "run")[0]
        (tmp_path / "stop").touch()
        proc.wait(60)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert out.ok, (out.reason, out.message)
    assert out.telemetry is not None, out.telemetry_note
    print("efficiency:", {k: v for k, v in out.efficiency.items() if k != "gpus"})
    print("per GPU:", out.efficiency["gpus"])
    print("GPU check:", out.gpu_check)
    print("suspect reasons:", out.suspect_reasons)

    run = make_run(make_sweep(), gpus=spec.gpus)
    for state in (RunState.PREFLIGHT, RunState.STARTING, RunState.WARMING, RunState.MEASURING, RunState.STOPPING):
        transition(run, state)
    run = store_outcome(run, out)
    m = RunMetrics.objects.get(run=run)
    blob = GpuTelemetryBlob.objects.get(run=run)
    assert decode_telemetry(bytes(blob.data)) == out.telemetry and blob.n_gpus == 1
    print(f"stored: {blob.n_ticks} ticks, {len(blob.data)} bytes ({len(blob.data) / blob.n_ticks:.1f} B per GPU-tick)")

    assert m.mean_power_w_per_gpu > idle.mean_power_w + 100, (m.mean_power_w_per_gpu, idle.mean_power_w)
    assert m.peak_power_w_per_gpu >= m.mean_power_w_per_gpu
    assert m.energy_source == "counter"
    g = m.efficiency["gpus"][0]
    assert g["energy_j"] == pytest.approx(g["integrated_energy_j"], rel=0.10)
    assert m.energy_j == pytest.approx(m.mean_power_w_per_gpu * m.duration_s, rel=0.15)
    assert m.energy_per_output_token_j == pytest.approx(m.energy_j / m.total_output_tokens)
    assert m.output_tok_s_per_kw == pytest.approx(1000 * m.total_output_tokens / m.energy_j)
    assert m.output_tok_s_per_gpu == pytest.approx(m.output_throughput_tok_s)
    assert g["util_gpu_mean_pct"] > 50 and g["sm_clock_mean_mhz"] > 0
    assert m.gpu_check["clock_events_seen"][gpu.uuid] is not None
