"""Speedup matching (MEASUREMENT.md "Comparing runs"), pure functions over point dicts.

A point is one succeeded run flattened into a dict (`runs.selectors.point_from_run` does it for
stored runs). Two points are comparable when
they differ in the decoding method only: same engine and engine version/build, model, GPUs
(by UUID; falling back to GPU model + TP is NOT done here: within one sweep the GPUs are
planned per TP), TP, and workload (dataset, input and output length, concurrency, request
rate, temperature, seed). The baseline is the `auto` point(s) of that match. Repeats are
aggregated by their median; with >= 3 repeats on both sides a 95 % bootstrap confidence
interval of the ratio of medians is given. No baseline -> no number (None), never a guess.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchkit.hosts.allocation import inconsistent_tp_gpus

MATCH_FIELDS = ("engine", "engine_version", "engine_build", "model", "gpu_uuids", "tp", "dataset", "input_len",
                "output_len", "concurrency", "request_rate", "temperature", "seed")
CONFIG_FIELDS = ("method", "num_speculative_tokens", "tree_budget", "drafter")
#: The figure a speedup divides (MEASUREMENT.md "Comparing runs": output tok/s ratio), a
#: benchkit.measure.metrics.WindowMetrics field.
SPEED_FIELD = "output_throughput_tok_s"


def match_key(p: dict[str, Any]) -> tuple:
    """What must be equal for two points to be compared (everything but the method)."""
    return tuple(p[f] for f in MATCH_FIELDS)


def config_key(p: dict[str, Any]) -> tuple:
    """The decoding configuration of a point."""
    return tuple(p[f] for f in CONFIG_FIELDS)


@dataclass
class Speedup:
    """Speedup of one configuration over its matched `auto` baseline at one match key.

    `value` = median output tok/s of the configuration / median output tok/s of the
    baseline (for concurrency 1 this equals the TPOT ratio up to TTFT). `ci95` is the 95 %
    bootstrap interval (None unless both sides have >= 3 repeats). `baseline_run_ids` names
    the runs used.
    """

    label: str
    key: tuple
    config: tuple
    value: float | None
    ci95: tuple[float, float] | None
    n_repeats: int
    baseline_run_ids: list[int]
    run_ids: list[int]
    median_output_throughput: float | None
    reason: str = ""


def bootstrap_ratio_ci(num: list[float], den: list[float], n_boot: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95 % percentile-bootstrap interval of median(num) / median(den), resampling each side."""
    rng = np.random.default_rng(seed)
    a, b = np.asarray(num, float), np.asarray(den, float)
    ra = np.median(rng.choice(a, size=(n_boot, a.size)), axis=1)
    rb = np.median(rng.choice(b, size=(n_boot, b.size)), axis=1)
    ratios = ra / rb
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    return float(lo), float(hi)


def compute_speedups(points: list[dict[str, Any]], ci: bool = True) -> list[Speedup]:
    """One Speedup per (match key, configuration), `auto` included (value 1.0 against itself).
    `ci=False` skips the bootstrap intervals (pages that show only the medians, e.g. a trend
    over many nights, where they cost most of the time).

    Where a match key has no `auto` point, every configuration there gets value None and
    reason "no matching auto baseline". Points whose output tok/s is unknown (None: an imported
    file without it) count for nothing; a configuration with none gets value None and reason
    "output tok/s unknown".
    """
    groups: dict[tuple, dict[tuple, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for p in points:
        groups[match_key(p)][config_key(p)].append(p)
    out: list[Speedup] = []
    for key, configs in groups.items():
        base = [p for cfg, ps in configs.items() if cfg[0] == "auto" for p in ps]
        base_tps = [p[SPEED_FIELD] for p in base if p[SPEED_FIELD] is not None]
        for cfg, ps in configs.items():
            tps = [p[SPEED_FIELD] for p in ps if p[SPEED_FIELD] is not None]
            med = float(statistics.median(tps)) if tps else None
            sp = Speedup(label=ps[0]["label"], key=key, config=cfg, value=None, ci95=None, n_repeats=len(ps),
                         baseline_run_ids=[p["run_id"] for p in base], run_ids=[p["run_id"] for p in ps],
                         median_output_throughput=med)
            if med is None:
                sp.reason = "output tok/s unknown"
            elif not base_tps or float(statistics.median(base_tps)) <= 0:
                sp.reason = "no matching auto baseline"
            else:
                sp.value = med / float(statistics.median(base_tps))
                if ci and len(tps) >= 3 and len(base_tps) >= 3:
                    sp.ci95 = bootstrap_ratio_ci(tps, base_tps)
            out.append(sp)
    return out


def inconsistent_gpu_tps(points: list[dict[str, Any]]) -> list[int]:
    """TP degrees whose runs did not all use the same GPUs (DOMAIN.md: TP1 on GPU1 vs GPU0);
    see benchkit.hosts.allocation.inconsistent_tp_gpus."""
    return inconsistent_tp_gpus([(p["tp"], list(p["gpu_uuids"])) for p in points])
