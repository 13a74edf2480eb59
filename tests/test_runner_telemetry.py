"""The runner's GPU telemetry path (issue 12 phase 2, docs/TELEMETRY.md "Runner"): the real
sampler child process, fed by a stand-in NVML (tests/nvml_series.py), around a run against the
synthetic server. A throttle bit set mid-window marks the run suspect and the efficiency
figures come out; a CPU run records why it has no telemetry; a sampler that cannot start never
fails the run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from benchkit.execution import runner
from benchkit.execution.runner import NullHooks, execute_runs
from benchkit.hosts.telemetry import TelemetrySampler
from benchkit.measure.gpu_samples import TelemetryStream, decode_telemetry
from benchkit.measure.gpu_window import NO_GPUS_NOTE
from benchkit.specs import GpuRef, Limits, RunSpec, ServerConfig, WorkloadSpec
from tests.fixtures.telemetry import make_streams
from tests.synthetic_server import SyntheticConfig, SyntheticServer

FIXTURES = Path(__file__).parent / "fixtures" / "telemetry"
U0 = make_streams.UUIDS[0]
LOADED_TICK, HOT_TICK = 50, 95  # of throttle.json: loaded (0x4, 685 W) and throttled (0x44, 450 W)


def switched_stream(tmp_path: Path) -> Path:
    """throttle.json cut to two readings, tick 0 loaded and tick 1 throttled, with this test
    process listed on the GPU holding the memory (so no memory or use verdict)."""
    doc = json.loads((FIXTURES / "throttle.json").read_text())
    g = doc["gpus"][0]
    g["values"] = {f: [col[LOADED_TICK], col[HOT_TICK]] for f, col in g["values"].items()}
    g["values"]["mem_used_mib"] = [make_streams.SERVER_MIB] * 2
    me = os.getpid()
    g["procs"] = [[0, [[me, make_streams.SERVER_MIB]]]]
    doc["processes"] = [[me, None, ""]]
    doc["t_ns"], doc["query_ns"] = doc["t_ns"][:2], doc["query_ns"][:2]
    TelemetryStream.from_dict(doc)  # still a valid stream
    path = tmp_path / "series.json"
    path.write_text(json.dumps(doc))
    return path


class ThrottleMidWindow(NullHooks):
    """Creates the stand-in's flag after measured request `on`, removes it after `off`."""

    def __init__(self, flag: Path, on: int, off: int):
        self.flag, self.on, self.off = flag, on, off
        self.seen: list[int] = []

    def progress(self, done, total):
        self.seen.append(done)
        if done == self.on:
            self.flag.touch()
        elif done == self.off:
            self.flag.unlink()


def spec(url: str, gpus: list[GpuRef], num_prompts: int = 10) -> RunSpec:
    return RunSpec(server=ServerConfig(engine="external", endpoint_url=url, served_model_name="synthetic"),
                   workload=WorkloadSpec(input_len=8, output_len=16, num_prompts=num_prompts, concurrency=1),
                   limits=Limits(request_timeout_s=30, telemetry_hz=50.0), gpus=gpus)


def stand_in(monkeypatch, arg: str, factory: str = "tests.nvml_series:SwitchedNvml.from_arg") -> list:
    made = []

    def make(sp, path, group_pgid):
        s = TelemetrySampler([g.uuid for g in sp.gpus], path, hz=sp.limits.telemetry_hz, group_pgid=group_pgid,
                             max_duration_s=sp.limits.run_timeout_s, nvml_factory=factory, nvml_arg=arg)
        made.append(s)
        return s

    monkeypatch.setattr(runner, "telemetry_sampler", make)
    return made


def test_throttle_mid_window_marks_the_run_suspect_and_figures_come_out(tmp_path, monkeypatch):
    flag = tmp_path / "throttled"
    made = stand_in(monkeypatch, f"{switched_stream(tmp_path)}::{flag}")
    hooks = ThrottleMidWindow(flag, on=3, off=7)
    # ~4 messages x 40 ms per request: ~0.8 s of the ~2 s window is throttled (~40 readings at 50 Hz)
    cfg = SyntheticConfig(ttft_ms=5, gap_ms=40, tokens_per_message=4, first_message_tokens=1)
    with SyntheticServer(cfg) as url:
        out = execute_runs([spec(url, [GpuRef(0, U0, name="NVIDIA H200")])], [hooks], tmp_path)[0]
    assert out.ok, (out.reason, out.message)
    assert len(made) == 1 and made[0].proc.poll() == 0  # the child ended by itself
    assert out.telemetry is not None and out.telemetry_note == ""
    assert decode_telemetry((tmp_path / "telemetry-0.bin").read_bytes()) == out.telemetry  # raw file kept
    s = out.telemetry
    assert s.t_ns[0] < out.window_start_ns and s.t_ns[-1] >= out.window_end_ns  # warmup and window sampled

    # validity: the throttle verdict, inside the window, reaches the run's suspect reasons
    codes = [v["code"] for v in out.gpu_check["verdicts"]]
    assert "gpu_throttled" in codes
    v = out.gpu_check["verdicts"][codes.index("gpu_throttled")]
    window_s = (out.window_end_ns - out.window_start_ns) / 1e9
    assert 0 < v["first_s"] < window_s and v["detail"]["bits"] == 0x40 and v["gpu_uuid"] == U0
    assert any(r.startswith("gpu_throttled: GPU 0 (") and "0x40 (hw_thermal_slowdown)" in r
               for r in out.suspect_reasons), out.suspect_reasons
    assert out.gpu_check["clock_events_seen"][U0] == 0x44  # the power cap recorded, not flagged
    assert not {"gpu_foreign_process", "gpu_unexplained_memory", "gpu_unexplained_use"} & set(codes)

    # figures: power between the throttled 450 W and the loaded 685 W, energy from the counter
    m, e = out.metrics, out.efficiency
    assert e["energy_source"] == "counter" and m.energy_source == "counter"
    assert 450 < m.mean_power_w_per_gpu < 685 and m.peak_power_w_per_gpu == 685
    gpu = e["gpus"][0]
    assert gpu["energy_j"] == pytest.approx(gpu["integrated_energy_j"], rel=0.05)
    assert m.energy_j == pytest.approx(gpu["energy_j"])
    assert m.energy_per_output_token_j == pytest.approx(m.energy_j / m.total_output_tokens)
    assert m.output_tok_s_per_kw == pytest.approx(1000 * m.total_output_tokens / m.energy_j)
    assert m.output_tok_s_per_gpu == pytest.approx(m.output_throughput_tok_s)  # one GPU
    assert e["price_usd_per_gpu_hour"] is None and e["cost_usd_per_m_output_tokens"] is None


def test_cpu_run_records_no_telemetry_and_nothing_breaks(tmp_path, monkeypatch):
    made = stand_in(monkeypatch, "unused")
    with SyntheticServer(SyntheticConfig(ttft_ms=2, gap_ms=2)) as url:
        out = execute_runs([spec(url, [], num_prompts=3)], [NullHooks()], tmp_path)[0]
    assert out.ok, (out.reason, out.message)
    assert made == [] and out.telemetry is None and out.telemetry_note == NO_GPUS_NOTE
    assert out.gpu_check is None and out.efficiency["notes"][0] == NO_GPUS_NOTE
    assert all(getattr(out.metrics, f) is None for f in out.metrics.group_values("efficiency"))
    assert not any(r.startswith("gpu_") for r in out.suspect_reasons)
    # the client's headroom is in the metric schema's fields
    assert out.metrics.client_processes == out.client_headroom["processes"] == 1
    assert out.metrics.client_max_core_share == out.client_headroom["max_core_share"]


def test_sampler_that_cannot_start_never_fails_the_run(tmp_path, monkeypatch):
    stand_in(monkeypatch, "NVMLError_LibraryNotFound(12)", factory="tests.nvml_series:failing")
    with SyntheticServer(SyntheticConfig(ttft_ms=2, gap_ms=2)) as url:
        out = execute_runs([spec(url, [GpuRef(0, U0)], num_prompts=3)], [NullHooks()], tmp_path)[0]
    assert out.ok, (out.reason, out.message)
    assert out.telemetry is None
    assert out.telemetry_note.startswith("no GPU telemetry: ") and "NVMLError_LibraryNotFound(12)" in out.telemetry_note
    assert out.metrics.energy_j is None and out.metrics.output_tok_s_per_gpu == pytest.approx(
        out.metrics.output_throughput_tok_s)
    assert out.telemetry_note in out.efficiency["notes"]


def test_a_run_that_fails_mid_window_keeps_its_stream(tmp_path, monkeypatch):
    """The counters cannot be read at the window's start: the run fails `metrics_unavailable`, and
    the sampler is still stopped cleanly, its stream kept for audit (stored with the failed run)."""
    from benchkit.measure import counters

    flag = tmp_path / "never"
    stand_in(monkeypatch, f"{switched_stream(tmp_path)}::{flag}")

    def refuse(url, timeout_s):
        raise counters.ScrapeError(f"{url}: refused for the test")

    monkeypatch.setattr(counters, "fetch_metrics_text", refuse)
    with SyntheticServer(SyntheticConfig(ttft_ms=2, gap_ms=2)) as url:
        out = execute_runs([spec(url, [GpuRef(0, U0)], num_prompts=3)], [NullHooks()], tmp_path)[0]
    assert not out.ok and out.reason == "metrics_unavailable" and "refused for the test" in out.message
    assert out.telemetry is not None and out.telemetry.n_ticks >= 2 and out.telemetry_note == ""
    assert decode_telemetry((tmp_path / "telemetry-0.bin").read_bytes()) == out.telemetry
