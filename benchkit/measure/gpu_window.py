"""The GPU side of one measured window: efficiency figures and validity verdicts from a run's
telemetry stream, in the shapes the runner returns and the Django layer stores (issue 12,
docs/TELEMETRY.md "Runner" step 4). Pure: the runner calls it after the window and
runs.services.recompute calls it again on the stored stream.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from benchkit.measure import efficiency, gpu_validity
from benchkit.measure.gpu_samples import TelemetryStream, sampler_gaps
from benchkit.measure.metrics import METRIC_FIELDS

#: What a run without GPUs records instead of a stream (the demo's CPU runs).
NO_GPUS_NOTE = "no GPU telemetry: the run has no GPUs"
#: The GPU sampler's own gaps beyond which the window is suspect (`telemetry_gap`): a second
#: without any reading, or 5 % of the window in gaps longer than two sampling periods (the
#: sampler, or the whole host, stalled; energy and the GPU verdicts then rest on interpolation).
TELEMETRY_MAX_GAP_MS = 1000.0
TELEMETRY_MAX_GAP_SHARE = 0.05


@dataclass
class GpuWindow:
    """`efficiency`: `EfficiencyFigures.to_dict()` (price None: cost is priced when read);
    `flat`: its run-level figures named as the `efficiency` group of
    benchkit.measure.metrics.WindowMetrics (`WindowMetrics.with_group("efficiency", flat)`);
    `gpu_check`: `GpuWindowCheck.to_dict()`, None without a stream; `suspect_messages`: one line
    per verdict, `<code>: <message>` (for `validity.check_run(suspect_messages=...)`), including
    `telemetry_gap` when the sampler's own gaps pass TELEMETRY_MAX_GAP_MS / _SHARE (their figures
    are in `flat`: `telemetry_gap_max_ms`, `telemetry_gap_share`)."""

    efficiency: dict[str, Any]
    flat: dict[str, Any]
    gpu_check: dict[str, Any] | None = None
    suspect_messages: list[str] = field(default_factory=list)


def gpu_window(stream: TelemetryStream | None, window_start_ns: int, window_end_ns: int, output_tokens: int,
               gpu_uuids: Sequence[str], idle_used_mib: Mapping[str, int] | None = None,
               note: str = "") -> GpuWindow:
    """Figures and verdicts of the window [window_start_ns, window_end_ns] (perf_counter_ns).

    `output_tokens`: the window's output tokens (WindowMetrics.total_output_tokens, the numerator
    of output throughput); `gpu_uuids`: the run's GPUs (their count is G); `idle_used_mib`: the
    preflight's memory baseline per GPU (MiB) for `gpu_unexplained_memory`; `note`: why there is
    no stream (added to the efficiency notes). The verdicts use the stream's process group.
    Raises ValueError when the window ends before it starts (efficiency_figures)."""
    eff = efficiency.efficiency_figures(stream, window_start_ns, window_end_ns, output_tokens=max(output_tokens, 0),
                                        n_gpus=len(gpu_uuids), gpu_uuids=list(gpu_uuids) if gpu_uuids else None)
    if note and note not in eff.notes:
        eff.notes.insert(0, note)
    check = None
    if stream is not None and stream.t_ns:
        check = gpu_validity.check_gpu_window(stream, window_start_ns, window_end_ns,
                                              idle_used_mib=dict(idle_used_mib or {}))
    flat = eff.to_flat()
    suspects = [f"{v.code}: {v.message}" for v in check.verdicts] if check else []
    gaps = sampler_gaps(stream, window_start_ns, window_end_ns) if stream is not None else None
    if gaps is not None:
        flat["telemetry_gap_max_ms"], flat["telemetry_gap_share"] = gaps
        if gaps[0] > TELEMETRY_MAX_GAP_MS or gaps[1] > TELEMETRY_MAX_GAP_SHARE:
            suspects.append(f"telemetry_gap: the GPU sampler's longest gap inside the window was {gaps[0]:.0f} ms "
                            f"and gaps took {gaps[1]:.1%} of it (bounds {TELEMETRY_MAX_GAP_MS:g} ms, "
                            f"{TELEMETRY_MAX_GAP_SHARE:.0%}): the sampler or the host stalled")
    return GpuWindow(
        efficiency=eff.to_dict(),
        flat={f.name: flat.get(f.name) for f in METRIC_FIELDS if f.group == "efficiency"},
        gpu_check=check.to_dict() if check else None,
        suspect_messages=suspects,
    )
