"""A run's window figures assembled from their parts: the one assembler of a stored
WindowMetrics, used by the runner after a window (benchkit.execution.runner) and by recompute
over stored runs (runs.services.recompute), so both give the same figures for the same parts.

The parts: the request logs' figures (benchkit.measure.metrics.measure_window: latency,
throughput, goodput), the server counters' deltas (group `spec_decode`,
benchkit.measure.counters), the load client's headroom (group `client`) and the GPU window's
figures (group `efficiency`, benchkit.measure.gpu_window, which also gives the GPU verdicts).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from benchkit.measure.gpu_samples import TelemetryStream
from benchkit.measure.gpu_window import GpuWindow, gpu_window
from benchkit.measure.metrics import WindowMetrics


def assemble_window(measured: WindowMetrics, window_start_ns: int, window_end_ns: int, *,
                    spec_decode: Mapping[str, Any] | None = None, client_headroom: Mapping[str, Any] | None = None,
                    telemetry: TelemetryStream | None = None, gpu_uuids: Sequence[str] = (),
                    idle_used_mib: Mapping[str, int] | None = None,
                    telemetry_note: str = "") -> tuple[WindowMetrics, GpuWindow]:
    """(the window's WindowMetrics, its GpuWindow) from its parts.

    `measured`: the logs' figures over [window_start_ns, window_end_ns] (perf_counter_ns);
    `spec_decode`: the counters' figures named as the `spec_decode` fields
    (SpecDecodeMetrics.to_flat(); None: unknown, the fields stay None); `client_headroom`: the
    load client's ClientHeadroom as a dict (None or {}: the `client` fields None);
    `telemetry`, `gpu_uuids`, `idle_used_mib` (MiB per GPU UUID), `telemetry_note` (why there is
    no stream): benchkit.measure.gpu_window.gpu_window's inputs, over the window's output tokens.
    Raises ValueError when the window ends before it starts."""
    window = measured.with_spec_decode(spec_decode or {}).with_client(client_headroom)
    gw = gpu_window(telemetry, window_start_ns, window_end_ns, output_tokens=window.total_output_tokens or 0,
                    gpu_uuids=gpu_uuids, idle_used_mib=idle_used_mib, note=telemetry_note)
    return window.with_group("efficiency", gw.flat), gw
