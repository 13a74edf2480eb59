"""GPU telemetry (issue 12): the sample-stream format, the NVML sampler (with a time-series
stand-in NVML, in-process and as the real child process), the efficiency figures and the
validity verdicts, on the sample streams in tests/fixtures/telemetry (built from the H200 readings
in the shared ENVIRONMENT.md; see make_streams.py there for every value).

Expected figures are worked out by hand from those values: the window is 4.05 s .. 14.05 s
after the first tick (10 s, 100 readings inside); a loaded GPU draws 685 / 695 W on alternate
readings and its energy counter grows 69 J per 0.1 s tick (690 W).
"""

from __future__ import annotations

import copy
import json
import os
import threading
import time
from pathlib import Path

import pynvml
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchkit.hosts.telemetry import (
    Recorder,
    TelemetryError,
    TelemetrySampler,
    ThreadSampler,
    load_nvml,
    sample_until,
)
from benchkit.measure.efficiency import (
    cost_usd_per_m_output_tokens,
    counter_energy_j,
    efficiency_figures,
    integrate_power_j,
)
from benchkit.measure.gpu_samples import (
    FIELDS,
    GpuSeries,
    ProcessInfo,
    TelemetryStream,
    decode_telemetry,
    encode_telemetry,
)
from benchkit.measure.gpu_validity import CLOCK_EVENT_BITS, THROTTLE_BITS, bit_names, check_gpu_window
from tests.fixtures.telemetry import make_streams
from tests.nvml_series import SeriesNvml

FIXTURES = Path(__file__).parent / "fixtures" / "telemetry"
T0 = make_streams.T0_NS
START, END = T0 + 4_050_000_000, T0 + 14_050_000_000
U0, U1 = make_streams.UUIDS


def load(name: str) -> TelemetryStream:
    return TelemetryStream.from_dict(json.loads((FIXTURES / f"{name}.json").read_text()))


# ---------------------------------------------------------------------------------------------
# Format


@pytest.mark.parametrize("name", ["clean", "throttle", "no_energy", "foreign"])
def test_fixture_round_trips_exactly(name):
    s = load(name)
    blob = encode_telemetry(s)
    assert decode_telemetry(blob) == s
    assert TelemetryStream.from_dict(s.to_dict()) == s
    assert len(blob) < len((FIXTURES / f"{name}.json").read_bytes()) / 10  # deltas + zlib


def test_fixture_files_are_what_the_generator_writes():
    for name, s in make_streams.streams().items():
        assert (FIXTURES / f"{name}.json").read_text() == make_streams.render(s), name


_value = st.one_of(st.none(), st.integers(min_value=0, max_value=2**62))


@st.composite
def streams(draw):
    n = draw(st.integers(min_value=0, max_value=12))
    gaps = draw(st.lists(st.integers(min_value=1, max_value=10**9), min_size=n, max_size=n))
    t0 = draw(st.integers(min_value=0, max_value=2**60))
    t = [t0 + sum(gaps[:i]) for i in range(n)]
    gpus = []
    pids = set()
    for gi in range(draw(st.integers(min_value=0, max_value=3))):
        g = GpuSeries(index=gi, uuid=f"GPU-{gi}", name=draw(st.text(max_size=8)),
                      power_limit_mw=draw(_value), max_sm_mhz=draw(_value))
        g.values = {f: draw(st.lists(_value, min_size=n, max_size=n)) for f in FIELDS}
        g.missing = {f: {"NVMLError_NotSupported(3)": draw(st.integers(0, 99))}
                     for f in draw(st.sets(st.sampled_from(FIELDS)))}
        if n:
            ticks = sorted(draw(st.sets(st.integers(0, n - 1), max_size=4)) | {0})
            for tick in ticks:
                mib = st.one_of(st.none(), st.integers(0, 2**20))
                plist = tuple(sorted(draw(st.dictionaries(st.integers(1, 2**22), mib, max_size=3)).items()))
                pids |= {p for p, _ in plist}
                g.procs.append((tick, plist))
        gpus.append(g)
    return TelemetryStream(
        hz=draw(st.sampled_from([0.5, 10.0, 50.0])), t_ns=t,
        query_ns=draw(st.lists(st.integers(0, 10**9), min_size=n, max_size=n)), gpus=gpus,
        processes={p: ProcessInfo(p, draw(st.one_of(st.none(), st.integers(1, 2**22))), draw(st.text(max_size=5)))
                   for p in pids},
        group_pgid=draw(st.one_of(st.none(), st.integers(1, 2**22))), truncated=draw(st.booleans()),
        note=draw(st.text(max_size=20)), sampler=draw(st.sampled_from(["process", "thread"])),
        sampler_cpu_ns=draw(st.one_of(st.none(), st.integers(0, 2**40))),
    )


@settings(max_examples=60, deadline=None)
@given(streams())
def test_any_stream_round_trips_exactly(s):
    assert decode_telemetry(encode_telemetry(s)) == s


def test_decode_names_what_is_wrong():
    with pytest.raises(ValueError, match="not an encoded telemetry stream"):
        decode_telemetry(b"not zlib")
    import zlib

    doc = json.loads(zlib.decompress(encode_telemetry(load("clean"))))
    bad = dict(doc, v=99)
    with pytest.raises(ValueError, match="unsupported format version 99"):
        decode_telemetry(zlib.compress(json.dumps(bad).encode()))
    short = copy.deepcopy(doc)
    short["gpus"][1]["values"]["sm_mhz"].pop()
    with pytest.raises(ValueError, match="column 'sm_mhz' has 145 entries, expected 146"):
        decode_telemetry(zlib.compress(json.dumps(short).encode()))
    unknown_pid = copy.deepcopy(doc)
    unknown_pid["processes"] = []
    with pytest.raises(ValueError, match="pid 4243 listed but not described"):
        decode_telemetry(zlib.compress(json.dumps(unknown_pid).encode()))


# ---------------------------------------------------------------------------------------------
# Sampler, in-process, on a fake clock


class FakeClock:
    """A ns clock that moves only when told; `wait` advances it and never sees a stop."""

    def __init__(self, start: int = 10**12):
        self.now = start
        self.stop_after_waits: int | None = None
        self.waits: list[float] = []

    def __call__(self) -> int:
        return self.now

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        self.now += round(seconds * 1e9)
        return self.stop_after_waits is not None and len(self.waits) >= self.stop_after_waits


def _replay(name: str, n_waits: int, gpus=None):
    fixture = load(name)
    clock = FakeClock()
    nv = SeriesNvml(fixture, clock=clock)
    nv.nvmlInit()
    rec = Recorder(nv, gpus or [g.uuid for g in fixture.gpus], hz=10, group_pgid=4242, clock=clock,
                   describe=lambda pid: fixture.processes[pid], sampler="inline")
    clock.stop_after_waits = n_waits
    stream = sample_until(rec, threading.Event(), clock=clock, wait=clock.wait)
    return fixture, stream, clock


def test_sampler_records_what_nvml_answered_tick_by_tick():
    fixture, s, clock = _replay("foreign", n_waits=145)
    # ticks at 0, 0.1, ..., 14.4 s; the stop comes during the 145th wait: the stop tick at 14.5 s
    assert s.n_ticks == 146
    assert [t - s.t_ns[0] for t in s.t_ns] == [i * 100_000_000 for i in range(146)]
    for g, fg in zip(s.gpus, fixture.gpus, strict=True):
        assert (g.uuid, g.index, g.name, g.power_limit_mw, g.max_sm_mhz) == (
            fg.uuid, fg.index, "NVIDIA H200", 700_000, 1980)
        for f in FIELDS:
            assert g.values[f] == fg.values[f], f
        assert g.missing == {}
        assert g.procs == fg.procs
    assert s.processes == fixture.processes
    assert s.group_pgid == 4242 and not s.truncated and s.sampler == "inline"
    assert all(w == pytest.approx(0.1) for w in clock.waits)


def test_one_unsupported_query_loses_nothing_else():
    fixture, s, _ = _replay("no_energy", n_waits=20)
    g = s.gpus[0]
    assert g.values["energy_mj"] == [None] * s.n_ticks
    assert g.missing == {"energy_mj": {"NVMLError_NotSupported(3)": s.n_ticks}}
    assert g.values["power_mw"][:21] == fixture.gpus[0].values["power_mw"][:21]
    assert g.values["temp_c"][:21] == fixture.gpus[0].values["temp_c"][:21]


def test_late_ticks_are_skipped_not_bunched():
    fixture = load("clean")
    clock = FakeClock()
    nv = SeriesNvml(fixture, clock=clock)
    nv.nvmlInit()
    rec = Recorder(nv, [U0], hz=10, clock=clock, describe=lambda pid: fixture.processes[pid])
    real_tick = rec.tick

    def slow_tick():  # every tick takes 250 ms
        real_tick()
        clock.now += 250_000_000

    rec.tick = slow_tick
    clock.stop_after_waits = 4
    s = sample_until(rec, threading.Event(), clock=clock, wait=clock.wait)
    offsets = [(t - s.t_ns[0]) / 1e6 for t in s.t_ns]
    # due at 0, then 300 (100 and 200 were missed), 600, 900 ms; the stop comes during the wait
    # for 1200 ms, and the stop tick is taken then
    assert offsets == [0, 300, 600, 900, 1200]
    assert clock.waits == pytest.approx([0.05] * 4)


def test_sampling_stops_at_its_bound_and_says_so():
    fixture = load("clean")
    clock = FakeClock()
    nv = SeriesNvml(fixture, clock=clock)
    nv.nvmlInit()
    rec = Recorder(nv, [U0], hz=10, clock=clock, describe=lambda pid: fixture.processes[pid])
    s = sample_until(rec, threading.Event(), max_duration_s=1.0, clock=clock, wait=clock.wait)
    assert s.truncated and s.n_ticks == 11 and "bound of 1 s" in s.note


def test_unknown_gpu_is_refused_with_its_uuid():
    nv = SeriesNvml(load("clean"))
    nv.nvmlInit()
    with pytest.raises(TelemetryError, match="GPU-nope not found by NVML: NVMLError_NotFound"):
        Recorder(nv, ["GPU-nope"])


def test_thread_sampler_samples_until_stopped():
    nv = SeriesNvml(load("clean"))
    nv.nvmlInit()
    t = ThreadSampler(nv, [U0, U1], hz=50)
    t.start()
    time.sleep(0.3)
    s = t.stop()
    assert 5 <= s.n_ticks <= 25 and s.sampler == "thread" and s.sampler_cpu_ns > 0
    assert s.gpus[1].values["power_mw"][0] == 83_000


def test_load_nvml_names_a_bad_factory():
    with pytest.raises(TelemetryError, match="cannot load NVML stand-in 'tests.nvml_series:Nope'"):
        load_nvml("tests.nvml_series:Nope")


# ---------------------------------------------------------------------------------------------
# Sampler as the real child process


def _own_pid_fixture(tmp_path: Path) -> Path:
    """The clean fixture with this test process listed on GPU 0, so the child resolves a real pgid."""
    doc = load("clean").to_dict()
    me = os.getpid()
    for g in doc["gpus"]:
        g["procs"] = [[0, [[me, make_streams.SERVER_MIB]]]]
    doc["processes"] = [[me, None, ""]]
    path = tmp_path / "series.json"
    path.write_text(json.dumps(doc))
    return path


def test_child_process_sampler_end_to_end(tmp_path):
    series = _own_pid_fixture(tmp_path)
    fixture = json.loads(series.read_text())
    before = time.perf_counter_ns()
    with TelemetrySampler([U0, U1], tmp_path / "gpu.bin", hz=10, group_pgid=os.getpgid(0),
                          nvml_factory="tests.nvml_series:SeriesNvml.from_file", nvml_arg=str(series)) as sampler:
        first = sampler.start()
        time.sleep(1.0)
        stop_at = time.perf_counter_ns()
        s = sampler.stop()
    # one clock for both processes: the child's first tick lies between our two readings
    assert before < first < stop_at and s.t_ns[0] == first
    assert s.t_ns[-1] >= stop_at  # the stop tick covers the window's end
    assert 5 <= s.n_ticks <= 14  # 11 due in 1 s plus the stop tick; fewer if the host is busy
    assert (tmp_path / "gpu.bin").read_bytes() == encode_telemetry(s)  # the raw file is kept
    rows = [tuple(g["values"][f][i] for g in fixture["gpus"] for f in FIELDS) for i in range(len(fixture["t_ns"]))]
    seen = [rows.index(tuple(g.values[f][i] for g in s.gpus for f in FIELDS)) for i in range(s.n_ticks)]
    assert seen == sorted(seen) and seen[0] == 0  # each tick is a recorded row, in time order
    me = os.getpid()
    assert s.processes[me] == ProcessInfo(me, os.getpgid(0), s.processes[me].name) and s.processes[me].name
    assert s.sampler == "process" and s.sampler_cpu_ns > 0 and all(q > 0 for q in s.query_ns)
    assert not check_gpu_window(s, s.t_ns[0], s.t_ns[-1]).verdicts


def test_child_process_reports_an_nvml_that_does_not_start(tmp_path):
    sampler = TelemetrySampler([U0], tmp_path / "gpu.bin", nvml_factory="tests.nvml_series:failing",
                               nvml_arg="NVMLError_LibraryNotFound(12)")
    with pytest.raises(TelemetryError, match=r"NVML init failed: NVMLError_LibraryNotFound\(12\)"):
        sampler.start()
    assert sampler.proc.poll() == 2


def test_child_process_stops_when_its_parent_goes(tmp_path):
    series = _own_pid_fixture(tmp_path)
    sampler = TelemetrySampler([U0], tmp_path / "gpu.bin", nvml_factory="tests.nvml_series:SeriesNvml.from_file",
                               nvml_arg=str(series))
    sampler.start()
    sampler.proc.stdin.close()  # as when the parent dies
    assert sampler.proc.wait(20) == 0
    assert decode_telemetry((tmp_path / "gpu.bin").read_bytes()).n_ticks >= 2


def test_sampler_rejects_bad_settings(tmp_path):
    with pytest.raises(ValueError, match="within 0.1..50 Hz"):
        TelemetrySampler([U0], tmp_path / "x.bin", hz=1000)
    with pytest.raises(ValueError, match="at least one GPU"):
        TelemetrySampler([], tmp_path / "x.bin")


# ---------------------------------------------------------------------------------------------
# Figures


def test_clean_tp2_figures():
    f = efficiency_figures(load("clean"), START, END, output_tokens=12_000, n_gpus=2, price_usd_per_gpu_hour=3.5)
    assert f.window_s == 10.0
    assert f.output_tok_s == 1200.0 and f.output_tok_s_per_gpu == 600.0
    # 100 readings inside: 50 x 695 W, 50 x 685 W
    assert f.mean_power_w_per_gpu == pytest.approx(690.0) and f.peak_power_w_per_gpu == 695.0
    # counter: 100 ticks x 69 000 mJ per GPU
    assert f.energy_source == "counter" and f.energy_j == pytest.approx(2 * 6900.0)
    assert f.energy_per_output_token_j == pytest.approx(13_800 / 12_000)  # 1.15 J/token
    assert f.output_tok_s_per_kw == pytest.approx(1200 / 1.38)  # 1380 W mean draw
    assert f.cost_usd_per_m_output_tokens == pytest.approx(3.5 * 2 * (10 / 3600) / 12_000 * 1e6)  # 1.6204
    for g in f.gpus:
        assert g.n_samples == 100 and g.integrated_energy_j == pytest.approx(6900.0)
        assert (g.sm_clock_mean_mhz, g.sm_clock_min_mhz, g.temp_max_c, g.clock_events_seen) == (1500.0, 1485, 62, 0x4)
        assert g.max_gap_s == pytest.approx(0.1)
    assert f.notes == []
    flat = f.to_flat()
    assert flat["tokens_counted"] == "output" and "gpus" not in flat


def test_throttled_window_figures():
    f = efficiency_figures(load("throttle"), START, END, output_tokens=5_400, n_gpus=1, price_usd_per_gpu_hour=None)
    # 85 loaded ticks x 69 J + 15 throttled ticks x 45 J
    assert f.energy_j == pytest.approx(85 * 69 + 15 * 45) and f.energy_source == "counter"
    assert f.energy_per_output_token_j == pytest.approx(6540 / 5400)
    assert f.peak_power_w_per_gpu == 695.0
    assert f.mean_power_w_per_gpu == pytest.approx((25 * 695 + 24 * 685 + 18 * 695 + 18 * 685 + 15 * 450) / 100)
    assert f.gpus[0].sm_clock_min_mhz == 990 and f.gpus[0].temp_max_c == 87
    assert f.cost_usd_per_m_output_tokens is None
    assert "no GPU-hour price set for this GPU model: no cost figure" in f.notes


def test_no_energy_counter_integrates_power_and_says_so():
    f = efficiency_figures(load("no_energy"), START, END, output_tokens=6_000, n_gpus=1, price_usd_per_gpu_hour=2.0)
    # trapezoid: 0.05 s x 692.5 W + 99 x 0.1 s x 690 W + 0.05 s x 687.5 W = 6900 J
    assert f.energy_source == "integrated_power" and f.energy_j == pytest.approx(6900.0)
    assert f.gpus[0].energy_source == "integrated_power"
    assert f.energy_per_output_token_j == pytest.approx(1.15)
    assert f.notes == [f"GPU 0 ({U0}): no energy counter (NVMLError_NotSupported(3)): integrated the power "
                       "readings instead"]


def test_cpu_host_has_throughput_but_no_gpu_figures():
    f = efficiency_figures(None, START, END, output_tokens=1000, n_gpus=0, price_usd_per_gpu_hour=None)
    assert f.output_tok_s == 100.0
    assert (f.output_tok_s_per_gpu, f.mean_power_w_per_gpu, f.energy_j, f.cost_usd_per_m_output_tokens) == (
        None, None, None, None)
    assert "the run used no GPU: no per-GPU figure, power or cost" in f.notes
    g = efficiency_figures(None, START, END, output_tokens=1000, n_gpus=1, price_usd_per_gpu_hour=1.0)
    assert "no GPU telemetry was recorded for this run" in g.notes
    assert g.cost_usd_per_m_output_tokens == pytest.approx(1.0 * (10 / 3600) / 1000 * 1e6)


def test_counter_that_went_backwards_falls_back_to_power():
    s = load("clean")
    col = s.gpus[1].values["energy_mj"]
    s.gpus[1].values["energy_mj"] = col[:90] + [v - col[90] for v in col[90:]]  # driver reloaded at tick 90
    f = efficiency_figures(s, START, END, output_tokens=12_000, n_gpus=2)
    assert f.energy_source == "mixed" and f.energy_j == pytest.approx(13_800.0)
    assert f.gpus[1].energy_source == "integrated_power"
    assert "went backwards" in f.gpus[1].energy_note


def test_window_not_covered_gives_no_energy():
    s = load("clean")
    late = END + 5_000_000_000  # the window ends 0.5 s after the last reading
    f = efficiency_figures(s, START, late, output_tokens=12_000, n_gpus=2)
    assert f.energy_j is None and f.energy_per_output_token_j is None and f.output_tok_s_per_kw is None
    assert any("do not cover the window" in n for n in f.notes)
    assert f.mean_power_w_per_gpu is not None  # readings inside the window still give a mean


def test_a_gpu_missing_from_the_stream_gives_no_total():
    s = load("clean")
    s.gpus = s.gpus[:1]
    f = efficiency_figures(s, START, END, output_tokens=12_000, n_gpus=2, gpu_uuids=[U0, U1])
    assert f.energy_j is None and any(U1 in n for n in f.notes)


def test_figure_inputs_are_checked():
    with pytest.raises(ValueError, match="before it starts"):
        efficiency_figures(None, END, START, 1, 1)
    with pytest.raises(ValueError, match="price per GPU-hour must be >= 0"):
        efficiency_figures(None, START, END, 1, 1, -1.0)
    f = efficiency_figures(load("clean"), START, END, output_tokens=0, n_gpus=2, price_usd_per_gpu_hour=1.0)
    assert f.energy_per_output_token_j is None and f.cost_usd_per_m_output_tokens is None
    assert "no output tokens: no cost per token" in f.notes


def test_cost_needs_a_price_gpus_a_window_and_tokens():
    assert cost_usd_per_m_output_tokens(2.0, 4, 36.0, 10_000) == pytest.approx(2.0 * 4 * 0.01 / 10_000 * 1e6)  # $8/Mtok
    assert cost_usd_per_m_output_tokens(None, 4, 36.0, 10_000) is None
    assert cost_usd_per_m_output_tokens(2.0, 0, 36.0, 10_000) is None
    assert cost_usd_per_m_output_tokens(2.0, 4, 0.0, 10_000) is None
    assert cost_usd_per_m_output_tokens(0.0, 4, 36.0, 10_000) == 0.0
    with pytest.raises(ValueError, match="must be >= 0"):
        cost_usd_per_m_output_tokens(-1.0, 4, 36.0, 10_000)


def test_energy_helpers_interpolate_at_the_window_ends():
    import numpy as np

    t = np.array([0.0, 1e9, 2e9])
    assert integrate_power_j(t, np.array([100_000.0, 200_000.0, 200_000.0]), 0.5e9, 2e9) == pytest.approx(
        0.5 * (150 + 200) / 2 + 200)
    assert counter_energy_j(t, np.array([0.0, 1000.0, 3000.0]), 0.5e9, 1.5e9) == pytest.approx(1.5)
    with pytest.raises(ValueError, match="do not cover"):
        counter_energy_j(t, np.array([0.0, 1.0, 2.0]), -1.0, 1e9)


# ---------------------------------------------------------------------------------------------
# Verdicts


def test_nvml_bit_values_match_the_binding():
    """The bits named here are nvml.h's, as NVIDIA's own Python binding defines them."""
    assert pynvml.nvmlClocksEventReasonGpuIdle == 0x1 and CLOCK_EVENT_BITS[0x1] == "gpu_idle"
    assert pynvml.nvmlClocksEventReasonSwPowerCap == 0x4 and CLOCK_EVENT_BITS[0x4] == "sw_power_cap"
    assert pynvml.nvmlClocksThrottleReasonHwSlowdown == 0x8 and CLOCK_EVENT_BITS[0x8] == "hw_slowdown"
    assert pynvml.nvmlClocksEventReasonSwThermalSlowdown == 0x20 and CLOCK_EVENT_BITS[0x20] == "sw_thermal_slowdown"
    assert pynvml.nvmlClocksThrottleReasonHwThermalSlowdown == 0x40 and CLOCK_EVENT_BITS[0x40] == "hw_thermal_slowdown"
    assert pynvml.nvmlClocksThrottleReasonHwPowerBrakeSlowdown == 0x80
    assert THROTTLE_BITS == 0x8 | 0x20 | 0x40 | 0x80
    assert bit_names(0x44) == "0x44 (sw_power_cap, hw_thermal_slowdown)"


def test_clean_window_is_not_suspect_and_records_the_power_cap():
    c = check_gpu_window(load("clean"), START, END)
    assert c.verdicts == [] and not c.suspect and c.notes == []
    assert c.clock_events_seen == {U0: 0x4, U1: 0x4}
    # the idle readings before the warmup (0x1, 345 MHz) are outside the window: not even recorded
    assert check_gpu_window(load("clean"), T0, END).clock_events_seen == {U0: 0x5, U1: 0x5}
    assert check_gpu_window(load("clean"), T0, END).verdicts == []


def test_throttle_mid_window_is_suspect_with_reason_and_gpu():
    c = check_gpu_window(load("throttle"), START, END)
    assert [v.code for v in c.verdicts] == ["gpu_throttled", "gpu_clock_drop"]
    thr, drop = c.verdicts
    assert (thr.gpu_index, thr.gpu_uuid, thr.detail["bits"]) == (0, U0, 0x40)
    assert thr.first_s == pytest.approx(4.95) and thr.duration_s == pytest.approx(1.5)
    assert thr.message == (f"GPU 0 ({U0}) reported clock-event reason 0x40 (hw_thermal_slowdown) in 15 readings "
                           "(1.5 s) from 4.95 s into the window")
    assert drop.detail == {"start_mhz": 1500.0, "lowest_mhz": 990, "share_limit": 0.1}
    assert "34% below its start value 1500 MHz" in drop.message
    assert c.clock_events_seen == {U0: 0x44}
    assert c.messages() == [thr.message, drop.message]


@pytest.mark.parametrize("bit", [0x8, 0x20, 0x40, 0x80])
def test_each_throttle_bit_is_flagged(bit):
    s = load("clean")
    s.gpus[1].values["clock_events"][60] = 0x4 | bit  # one reading, clocks unchanged
    c = check_gpu_window(s, START, END)
    assert [(v.code, v.gpu_uuid, v.detail["bits"]) for v in c.verdicts] == [("gpu_throttled", U1, bit)]
    assert CLOCK_EVENT_BITS[bit] in c.verdicts[0].message


@pytest.mark.parametrize("bit", [0x1, 0x2, 0x4, 0x10, 0x100])
def test_normal_bits_are_recorded_not_flagged(bit):
    s = load("clean")
    s.gpus[0].values["clock_events"][60] = bit
    c = check_gpu_window(s, START, END)
    assert c.verdicts == [] and c.clock_events_seen[U0] == 0x4 | bit


def test_short_clock_dips_and_idle_readings_are_not_a_drop():
    s = load("clean")
    sm, ev = s.gpus[0].values["sm_mhz"], s.gpus[0].values["clock_events"]
    for i in range(60, 69):  # 0.9 s at 1200 MHz: shorter than the 1 s that counts
        sm[i] = 1200
    for i in range(80, 100):  # 2 s idle between requests: 345 MHz, reason 0x1
        sm[i], ev[i] = 345, 0x1
    assert check_gpu_window(s, START, END).verdicts == []
    sm[69] = 1200  # now 1.0 s
    c = check_gpu_window(s, START, END)
    assert [v.code for v in c.verdicts] == ["gpu_clock_drop"] and c.verdicts[0].duration_s == pytest.approx(1.0)
    assert check_gpu_window(s, START, END, clock_drop_share=0.25).verdicts == []  # 20 % below: within 25 %


def test_foreign_process_is_suspect_with_pid_and_gpu():
    c = check_gpu_window(load("foreign"), START, END)
    assert [(v.code, v.gpu_uuid) for v in c.verdicts] == [("gpu_foreign_process", U1)]
    v = c.verdicts[0]
    assert v.detail == {"pid": 5555, "pgid": 5555, "name": "python3", "used_mib": 8000}
    assert v.first_s == pytest.approx(3.95) and v.duration_s == pytest.approx(3.0)
    assert "pid 5555 (python3, process group 5555), holding 8000 MiB, outside the run's process group 4242" in v.message
    # a pid the caller vouches for is not foreign
    assert check_gpu_window(load("foreign"), START, END, allowed_pids=[5555]).verdicts == []


def test_invisible_pid_is_foreign_and_unknown_group_is_said():
    s = load("foreign")
    s.processes[5555] = ProcessInfo(5555, None, "")
    c = check_gpu_window(s, START, END)
    assert "not visible from the sampler" in c.verdicts[0].message
    s.group_pgid = None
    c = check_gpu_window(s, START, END)
    assert c.verdicts == []
    assert c.notes == ["the run's process group is unknown (external server?): foreign-process check skipped"]


def test_memory_no_listed_process_explains_is_suspect():
    s = load("clean")
    used = s.gpus[0].values["mem_used_mib"]
    for i in range(70, 90):  # 2 s: 4 GiB more than the server's worker holds
        used[i] += 4096
    c = check_gpu_window(s, START, END)
    assert [(v.code, v.gpu_uuid, v.detail["unexplained_mib"]) for v in c.verdicts] == [
        ("gpu_unexplained_memory", U0, 4096)]
    assert check_gpu_window(s, START, END, idle_used_mib={U0: 3500}).verdicts == []  # 596 MiB over: tolerated


def test_busy_gpu_listing_no_process_is_suspect():
    s = load("clean")
    s.gpus[1].procs = [(0, ())]  # NVML lists nothing on GPU 1 (another container's work), yet it is busy
    s.gpus[1].values["mem_used_mib"] = [0] * s.n_ticks
    c = check_gpu_window(s, START, END)
    assert [(v.code, v.gpu_uuid) for v in c.verdicts] == [("gpu_unexplained_use", U1)]
    assert c.verdicts[0].duration_s == pytest.approx(10.0)


def test_unreadable_process_list_is_said_not_assumed_fine():
    s = load("foreign")
    s.gpus[1].procs = []
    s.gpus[1].missing["procs"] = {"NVMLError_NoPermission(4)": s.n_ticks}
    c = check_gpu_window(s, START, END)
    assert c.verdicts == []
    assert c.notes == [
        f"GPU 1 ({U1}): process list never read (NVMLError_NoPermission(4) x146): process checks skipped"]


def test_per_process_memory_not_reported_is_said():
    s = load("clean")
    s.gpus[0].procs = [(0, ((4243, None),))]
    c = check_gpu_window(s, START, END)
    assert c.verdicts == [] and c.notes == [f"GPU 0 ({U0}): NVML reports no per-process memory: memory check skipped"]


def test_window_without_readings_says_so():
    c = check_gpu_window(load("clean"), END + 10**10, END + 2 * 10**10)
    assert c.verdicts == [] and c.notes == ["no GPU reading inside the window: nothing checked"]


# ---------------------------------------------------------------------------------------------
# The GPU check script, without a GPU (stand-in NVML; its CUDA phase needs the GPU machine)


def test_gpu_check_script_runs_on_the_stand_in(tmp_path):
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, "benchmarks/gpu_telemetry_check.py", "--stand-in", str(FIXTURES / "foreign.json"),
         "--rounds", "1", "--num-prompts", "8", "--output-len", "32", "--concurrency", "4", "--rate", "2000"],
        cwd=repo, env=dict(os.environ, OUT=str(tmp_path)), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_telemetry.json").read_text())
    stream = decode_telemetry((tmp_path / "gpu_telemetry.bin").read_bytes())
    assert report["stream"] == stream.to_dict() and [g.uuid for g in stream.gpus] == [U0, U1]
    assert set(report["overhead"]["summary"]) == {"none", "thread", "process", "process_same_core"}
    assert all(s["samples"] > 0 and s["failed"] == 0 for s in report["overhead"]["summary"].values())
    assert "sampler cost (process, 10 Hz, 2 GPUs" in proc.stdout


def test_real_h200_recording_gives_the_figures_and_verdicts_seen_on_the_gpu():
    """The raw stream the sampler wrote on the 2 x H200 machine (benchmarks/gpu_telemetry_check.py,
    tests/fixtures/telemetry/h200x2-matmul-check.log): idle ~77 W at 345 MHz with reason 0x1; under
    the bf16 matmul loop ~690 W, reason 0x4 only (normal: not flagged), energy counter and
    integrated power within 1 %; a foreign process on GPU 0 flagged, nothing else."""
    from benchkit.measure.efficiency import gpu_energy

    here = Path(__file__).parent / "fixtures" / "telemetry"
    meta = json.loads((here / "h200x2-matmul.json").read_text())
    stream = decode_telemetry((here / "h200x2-matmul.bin").read_bytes())
    assert len(stream.gpus) == 2
    idle, loaded, foreign = (meta["windows_ns"][k] for k in ("idle", "loaded", "foreign"))
    for g in stream.gpus:
        e_idle = gpu_energy(stream, g, *idle)
        e = gpu_energy(stream, g, *loaded)
        assert 60 < e_idle.mean_power_w < 100 and e_idle.sm_clock_min_mhz == 345
        assert 650 < e.mean_power_w < 700 and e.peak_power_w <= 700
        assert e.energy_source == "counter"
        assert abs(e.energy_j / e.integrated_energy_j - 1) < 0.01
        assert 1400 <= e.sm_clock_min_mhz <= 1600
    clean = check_gpu_window(stream, *loaded, group_pgid=meta["run_pgid"])
    assert clean.verdicts == []
    dirty = check_gpu_window(stream, *foreign, group_pgid=meta["run_pgid"])
    assert [(v.code, v.gpu_index, v.detail["pid"]) for v in dirty.verdicts] == [
        ("gpu_foreign_process", 0, meta["foreign_pid"])]
