"""Efficiency figures of one measured window: throughput per GPU, power, energy per output token,
tokens per second per kW and cost per million output tokens (issue 12).

Pure functions of a GPU sample stream (`benchkit.measure.gpu_samples.TelemetryStream`, or None
where the host has no GPU telemetry), the window (`window_start_ns`, `window_end_ns`:
perf_counter_ns, as the load client's window), the window's output tokens (sum of `n` over
completed measured requests: the numerator of MEASUREMENT.md's output throughput), the run's
number of GPUs and a price per GPU-hour (USD; None -> no cost figure, never a guess). Every
figure counts OUTPUT tokens only (prompt tokens are not in any numerator here).

Formulas (W = watts, J = joules, T = window seconds = (end - start) / 1e9, N = output tokens,
G = the run's GPUs):

- output tok/s = N / T; output tok/s per GPU = N / T / G.
- Per GPU: mean power (W) = mean of the power readings taken inside the window; peak power (W)
  = their maximum. NVML's power reading is a 1 s average on Ampere and newer (nvml.h,
  nvmlDeviceGetPowerUsage), so peaks shorter than a second are smoothed away.
- Per GPU energy (J), from the energy counter where the GPU has one (`energy_source` =
  `counter`): E(end) - E(start), E linearly interpolated between the two readings around each
  end of the window (nvmlDeviceGetTotalEnergyConsumption, mJ since the driver was loaded). Else
  (`integrated_power`): the trapezoid integral over [start, end] of the power readings, linearly
  interpolated at both ends. The counter is refused (and power integrated) when it went
  backwards (a driver reload) or does not cover the window. The power integral is also kept for
  every GPU (`integrated_energy_j`) as a cross-check of the counter.
- energy J = sum over the run's GPUs (None unless every GPU has one); `energy_source` says
  `counter`, `integrated_power`, or `mixed` when GPUs differ.
- energy per output token (J/token) = energy J / N.
- output tok/s per kW = N / T / (energy J / T / 1000) = 1000 * N / energy J, i.e. the mean
  electrical power of the run's GPUs over the window, from the same energy figure.
- cost per million output tokens (USD) = price per GPU-hour * G * (T / 3600) / N * 1e6.

A figure that cannot be computed is None and `notes` says why (no telemetry, a GPU missing from
the stream, samples that do not cover the window, no output tokens, no price).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from benchkit.measure.gpu_samples import GpuSeries, TelemetryStream

ENERGY_SOURCES = ("counter", "integrated_power", "mixed")


@dataclass
class GpuEnergy:
    """One GPU over the window.

    `n_samples`: power readings inside the window. `mean_power_w`, `peak_power_w`: their mean
    and maximum (W). `energy_j` (J) from `energy_source` (`counter` or `integrated_power`;
    None when neither covers the window, `energy_note` says why). `integrated_energy_j`: the
    power integral (J), kept as a cross-check. `sm_clock_mean_mhz`, `sm_clock_min_mhz`,
    `util_gpu_mean_pct`, `temp_max_c`: over the window's readings. `clock_events_seen`: OR of
    the clock-event masks read in the window. `max_gap_s`: the longest gap between two power
    readings around or inside the window (s).
    """

    index: int
    uuid: str
    n_samples: int = 0
    mean_power_w: float | None = None
    peak_power_w: float | None = None
    energy_j: float | None = None
    energy_source: str | None = None
    energy_note: str = ""
    integrated_energy_j: float | None = None
    sm_clock_mean_mhz: float | None = None
    sm_clock_min_mhz: int | None = None
    util_gpu_mean_pct: float | None = None
    temp_max_c: int | None = None
    clock_events_seen: int = 0
    max_gap_s: float | None = None


@dataclass
class EfficiencyFigures:
    """The window's efficiency figures (see the module docstring for each formula).

    `window_s` (s), `output_tokens`, `n_gpus`; `output_tok_s`, `output_tok_s_per_gpu`;
    `mean_power_w_per_gpu` (mean of the GPUs' mean power), `peak_power_w_per_gpu` (the highest
    GPU peak); `energy_j`, `energy_source`; `energy_per_output_token_j`; `output_tok_s_per_kw`;
    `price_usd_per_gpu_hour`, `cost_usd_per_m_output_tokens`; `gpus`: one GpuEnergy per GPU in
    the stream; `notes`: why a figure is None.
    """

    window_s: float
    output_tokens: int
    n_gpus: int
    output_tok_s: float | None = None
    output_tok_s_per_gpu: float | None = None
    mean_power_w_per_gpu: float | None = None
    peak_power_w_per_gpu: float | None = None
    energy_j: float | None = None
    energy_source: str | None = None
    energy_per_output_token_j: float | None = None
    output_tok_s_per_kw: float | None = None
    price_usd_per_gpu_hour: float | None = None
    cost_usd_per_m_output_tokens: float | None = None
    gpus: list[GpuEnergy] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_flat(self) -> dict[str, Any]:
        """Run-level figures as one flat dict (units in the keys; no per-GPU list), for a
        metrics row or an export. `tokens_counted` names which tokens the figures count."""
        d = asdict(self)
        d.pop("gpus")
        d["tokens_counted"] = "output"
        return d

    def to_dict(self) -> dict[str, Any]:
        """Everything, JSON-ready (`to_flat()` plus `gpus` as dicts)."""
        return {**self.to_flat(), "gpus": [asdict(g) for g in self.gpus]}


def _valid(stream: TelemetryStream, g: GpuSeries, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(times ns as float64 relative to the first tick, values float64) of the non-missing readings."""
    col = g.values[name]
    idx = [i for i, v in enumerate(col) if v is not None]
    t0 = stream.t_ns[0] if stream.t_ns else 0
    return (np.array([stream.t_ns[i] - t0 for i in idx], dtype=np.float64),
            np.array([col[i] for i in idx], dtype=np.float64))


def _covers(t: np.ndarray, a: float, b: float) -> bool:
    return t.size > 0 and t[0] <= a and t[-1] >= b


def _span(stream: TelemetryStream, t: np.ndarray) -> str:
    if t.size == 0:
        return "no readings"
    return f"readings from {t[0] / 1e9:.3f} s to {t[-1] / 1e9:.3f} s after the first tick"


def integrate_power_j(t_ns: np.ndarray, power_mw: np.ndarray, a_ns: float, b_ns: float) -> float:
    """Trapezoid integral (J) of power readings `power_mw` (mW) at times `t_ns` (ns, increasing)
    over [a_ns, b_ns], the readings linearly interpolated at both ends. The readings must cover
    [a_ns, b_ns] (t_ns[0] <= a_ns, t_ns[-1] >= b_ns; ValueError otherwise)."""
    if not _covers(t_ns, a_ns, b_ns):
        raise ValueError("power readings do not cover the interval")
    inside = (t_ns > a_ns) & (t_ns < b_ns)
    ts = np.concatenate(([a_ns], t_ns[inside], [b_ns]))
    ps = np.concatenate(([np.interp(a_ns, t_ns, power_mw)], power_mw[inside], [np.interp(b_ns, t_ns, power_mw)]))
    return float(np.trapezoid(ps, ts)) / 1e3 / 1e9  # mW * ns -> J


def counter_energy_j(t_ns: np.ndarray, energy_mj: np.ndarray, a_ns: float, b_ns: float) -> float:
    """E(b) - E(a) in J from an energy counter `energy_mj` (mJ) read at `t_ns` (ns, increasing),
    E linearly interpolated between readings. ValueError when the readings do not cover
    [a_ns, b_ns] or the counter went backwards between the readings that bracket it."""
    if not _covers(t_ns, a_ns, b_ns):
        raise ValueError("energy readings do not cover the window")
    lo = int(np.searchsorted(t_ns, a_ns, side="right")) - 1
    hi = int(np.searchsorted(t_ns, b_ns, side="left"))
    if np.any(np.diff(energy_mj[lo:hi + 1]) < 0):
        raise ValueError("the energy counter went backwards inside the window (driver reloaded?)")
    return float(np.interp(b_ns, t_ns, energy_mj) - np.interp(a_ns, t_ns, energy_mj)) / 1e3


def gpu_energy(stream: TelemetryStream, g: GpuSeries, window_start_ns: int, window_end_ns: int) -> GpuEnergy:
    """Power, energy and clock figures of one GPU over the window (see GpuEnergy)."""
    out = GpuEnergy(index=g.index, uuid=g.uuid)
    t0 = stream.t_ns[0] if stream.t_ns else 0
    a, b = float(window_start_ns - t0), float(window_end_ns - t0)
    ticks = stream.ticks_between(window_start_ns, window_end_ns)

    def inside(name: str) -> list[int]:
        return [v for v in (g.values[name][i] for i in ticks) if v is not None]

    powers = inside("power_mw")
    out.n_samples = len(powers)
    if powers:
        out.mean_power_w = float(np.mean(powers)) / 1e3
        out.peak_power_w = max(powers) / 1e3
    sm = inside("sm_mhz")
    if sm:
        out.sm_clock_mean_mhz, out.sm_clock_min_mhz = float(np.mean(sm)), min(sm)
    util = inside("util_gpu_pct")
    if util:
        out.util_gpu_mean_pct = float(np.mean(util))
    temp = inside("temp_c")
    if temp:
        out.temp_max_c = max(temp)
    for m in inside("clock_events"):
        out.clock_events_seen |= m

    tp, pw = _valid(stream, g, "power_mw")
    if _covers(tp, a, b):
        out.integrated_energy_j = integrate_power_j(tp, pw, a, b)
        lo = int(np.searchsorted(tp, a, side="right")) - 1
        hi = int(np.searchsorted(tp, b, side="left"))
        out.max_gap_s = float(np.max(np.diff(tp[lo:hi + 1]))) / 1e9 if hi > lo else 0.0
    te, en = _valid(stream, g, "energy_mj")
    counter_problem = ""
    if te.size == 0:
        reasons = ", ".join(sorted(g.missing.get("energy_mj", {}))) or "no readings"
        counter_problem = f"no energy counter ({reasons})"
    else:
        try:
            out.energy_j = counter_energy_j(te, en, a, b)
            out.energy_source = "counter"
        except ValueError as exc:
            counter_problem = f"energy counter refused: {exc}; {_span(stream, te)}"
    if out.energy_j is None:
        if out.integrated_energy_j is not None:
            out.energy_j, out.energy_source = out.integrated_energy_j, "integrated_power"
            out.energy_note = f"{counter_problem}: integrated the power readings instead"
        else:
            out.energy_note = f"{counter_problem}; power readings do not cover the window ({_span(stream, tp)})"
    return out


def cost_usd_per_m_output_tokens(price_usd_per_gpu_hour: float | None, n_gpus: int, window_s: float,
                                 output_tokens: int) -> float | None:
    """price per GPU-hour (USD) * n_gpus * (window_s / 3600) / output_tokens * 1e6: what the run's
    GPUs cost per million output tokens at the window's throughput. None when there is no price,
    no GPU, no window or no output token (never a guess). Raises ValueError on a negative price.
    Kept separate so a price set later (per GPU model, in the admin) prices stored runs."""
    if price_usd_per_gpu_hour is not None and price_usd_per_gpu_hour < 0:
        raise ValueError(f"price per GPU-hour must be >= 0, got {price_usd_per_gpu_hour}")
    if price_usd_per_gpu_hour is None or n_gpus <= 0 or window_s <= 0 or output_tokens <= 0:
        return None
    return price_usd_per_gpu_hour * n_gpus * (window_s / 3600.0) / output_tokens * 1e6


def efficiency_figures(
    stream: TelemetryStream | None,
    window_start_ns: int,
    window_end_ns: int,
    output_tokens: int,
    n_gpus: int,
    price_usd_per_gpu_hour: float | None = None,
    gpu_uuids: list[str] | None = None,
) -> EfficiencyFigures:
    """All figures of the window (formulas in the module docstring).

    `stream`: the run's samples, None where none were taken (a CPU host; the notes say so).
    `n_gpus`: the run's GPU count G. `gpu_uuids`: the run's GPUs; when given, the energy total
    needs each of them in the stream (default: every GPU of the stream, and G of them).
    Raises ValueError when the window ends before it starts, `output_tokens` or `n_gpus` is
    negative, or the price is negative.
    """
    if window_end_ns < window_start_ns:
        raise ValueError(f"window ends ({window_end_ns}) before it starts ({window_start_ns})")
    if output_tokens < 0 or n_gpus < 0:
        raise ValueError(f"output_tokens ({output_tokens}) and n_gpus ({n_gpus}) must be >= 0")
    if price_usd_per_gpu_hour is not None and price_usd_per_gpu_hour < 0:
        raise ValueError(f"price per GPU-hour must be >= 0, got {price_usd_per_gpu_hour}")
    window_s = (window_end_ns - window_start_ns) / 1e9
    f = EfficiencyFigures(window_s=window_s, output_tokens=output_tokens, n_gpus=n_gpus,
                          price_usd_per_gpu_hour=price_usd_per_gpu_hour)
    if window_s <= 0:
        f.notes.append("empty window: no rate can be computed")
        return f
    f.output_tok_s = output_tokens / window_s
    if n_gpus:
        f.output_tok_s_per_gpu = f.output_tok_s / n_gpus
    else:
        f.notes.append("the run used no GPU: no per-GPU figure, power or cost")

    if stream is None or not stream.t_ns:
        if n_gpus:
            f.notes.append("no GPU telemetry was recorded for this run")
    else:
        f.gpus = [gpu_energy(stream, g, window_start_ns, window_end_ns) for g in stream.gpus]
        wanted = list(gpu_uuids) if gpu_uuids is not None else [g.uuid for g in stream.gpus]
        by_uuid = {g.uuid: g for g in f.gpus}
        absent = [u for u in wanted if u not in by_uuid]
        run_gpus = [by_uuid[u] for u in wanted if u in by_uuid]
        means = [g.mean_power_w for g in run_gpus if g.mean_power_w is not None]
        peaks = [g.peak_power_w for g in run_gpus if g.peak_power_w is not None]
        if means:
            f.mean_power_w_per_gpu = float(np.mean(means))
            f.peak_power_w_per_gpu = max(peaks)
        if absent:
            f.notes.append(f"GPU(s) {absent} of the run are not in the telemetry: no energy total")
        elif len(run_gpus) != n_gpus:
            f.notes.append(f"telemetry has {len(run_gpus)} GPUs, the run {n_gpus}: no energy total")
        elif any(g.energy_j is None for g in run_gpus):
            f.notes += [f"GPU {g.index} ({g.uuid}): {g.energy_note}" for g in run_gpus if g.energy_j is None]
        else:
            f.energy_j = sum(g.energy_j for g in run_gpus)  # type: ignore[misc]
            sources = {g.energy_source for g in run_gpus}
            f.energy_source = sources.pop() if len(sources) == 1 else "mixed"
            f.notes += [f"GPU {g.index} ({g.uuid}): {g.energy_note}" for g in run_gpus if g.energy_note]
        if f.energy_j is not None:
            if output_tokens > 0 and f.energy_j > 0:
                f.energy_per_output_token_j = f.energy_j / output_tokens
                f.output_tok_s_per_kw = 1000.0 * output_tokens / f.energy_j
            elif output_tokens == 0:
                f.notes.append("no output tokens: no energy per token")

    f.cost_usd_per_m_output_tokens = cost_usd_per_m_output_tokens(price_usd_per_gpu_hour, n_gpus, window_s,
                                                                  output_tokens)
    if price_usd_per_gpu_hour is None:
        f.notes.append("no GPU-hour price set for this GPU model: no cost figure")
    elif n_gpus and output_tokens == 0:
        f.notes.append("no output tokens: no cost per token")
    return f
