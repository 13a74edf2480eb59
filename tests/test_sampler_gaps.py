"""The GPU telemetry sampler's own gaps inside a window, and the `telemetry_gap` mark."""

from __future__ import annotations

import pytest

from benchkit.measure.gpu_samples import TelemetryStream, sampler_gaps
from benchkit.measure.gpu_window import gpu_window

MS = 1_000_000


def stream_at(times_ms: list[float], hz: float = 10.0) -> TelemetryStream:
    return TelemetryStream(hz=hz, t_ns=[round(t * MS) for t in times_ms], query_ns=[0] * len(times_ms))


def test_gaps_count_the_window_edges_and_only_long_intervals():
    s = stream_at([0, 100, 200, 300, 1800, 1900, 2000])  # 1.5 s without a reading
    longest, share = sampler_gaps(s, 50 * MS, 2000 * MS)
    assert longest == pytest.approx(1500.0)
    assert share == pytest.approx((1500 - 100) / 1950)
    steady = stream_at([i * 100 for i in range(21)])
    assert sampler_gaps(steady, 0, 2000 * MS) == (pytest.approx(100.0), 0.0)
    assert sampler_gaps(stream_at([]), 0, 10 * MS) is None  # unknown, not 0
    assert sampler_gaps(steady, 5 * MS, 5 * MS) is None


def test_a_stalled_sampler_marks_the_window():
    gappy = gpu_window(stream_at([0, 100, 200, 300, 1800, 1900, 2000]), 0, 2000 * MS, output_tokens=100,
                       gpu_uuids=[])
    assert gappy.flat["telemetry_gap_max_ms"] == pytest.approx(1500.0)
    assert any(m.startswith("telemetry_gap: ") and "1500 ms" in m for m in gappy.suspect_messages)
    steady = gpu_window(stream_at([i * 100 for i in range(21)]), 0, 2000 * MS, output_tokens=100, gpu_uuids=[])
    assert not [m for m in steady.suspect_messages if m.startswith("telemetry_gap")]
    assert gpu_window(None, 0, 2000 * MS, output_tokens=1, gpu_uuids=[]).flat["telemetry_gap_max_ms"] is None
