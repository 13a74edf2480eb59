"""Compare two sweeps point by point (issue 9, "Compare page"): pure functions over point dicts.

A point is one counted run flattened into a dict (`runs.selectors.point_from_run`, or the
lighter `runs.selectors.history_points`) with, beside its configuration and workload,
`hardware_fingerprint` (the host's `HostInventory.fingerprint()` in force when the run
started), `engine_version`, `engine_build` and `engine_commit`.

- **The same point** in two sweeps: equal `identity_key` (engine, model, drafter, decoding
  configuration, TP, workload; not GPUs, not repeat index). Repeats of one identity are pooled.
- **Comparable**: equal environment (`env_key`: hardware fingerprint, engine version, build and
  commit). Where the environments differ the two sides are put apart (`SweepDiff.apart`), with
  the reason, and given no verdict: they are never compared silently.
- **Change** of a metric: median(new) / median(old) - 1, in %. With >= `MIN_REPEATS_FOR_CI`
  repeats on both sides, a 95 % percentile-bootstrap interval of that change (resampling each
  side, MEASUREMENT.md "Repeats"); the verdict is better / worse only when the interval
  excludes 0 (in the metric's good / bad direction), else "no significant change". With fewer
  repeats the verdict compares |change| with `noise_pct` and says "single run".
- The point's verdict is the verdict of its output tok/s (the figure speedups divide,
  MEASUREMENT.md "Comparing runs"); TPOT, TTFT and tau carry their own.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

import numpy as np

#: What makes two runs of two sweeps the same point (everything but environment, GPUs, repeat).
IDENTITY_FIELDS = ("engine", "model", "drafter", "method", "num_speculative_tokens", "tree_budget", "tp", "dataset",
                   "input_len", "output_len", "concurrency", "request_rate", "temperature", "seed")
#: What must also be equal for the two to be compared: same hardware, same engine build.
ENV_FIELDS = ("hardware_fingerprint", "engine_version", "engine_build", "engine_commit")
#: Compared metrics (benchkit.measure.metrics.WindowMetrics fields) -> +1 when higher is better,
#: -1 when lower is better.
COMPARE_METRICS: dict[str, int] = {
    "output_throughput_tok_s": +1,
    "median_tpot_ms": -1,
    "median_ttft_ms": -1,
    "acceptance_length": +1,
}
#: The metric whose verdict is the point's verdict.
PRIMARY_METRIC = "output_throughput_tok_s"
MIN_REPEATS_FOR_CI = 3

BETTER, WORSE, SAME, UNKNOWN = "better", "worse", "no significant change", "unknown"


_identity_getter = itemgetter(*IDENTITY_FIELDS)


def identity_key(p: dict[str, Any]) -> tuple:
    """The point's identity across sweeps (IDENTITY_FIELDS, in order)."""
    return _identity_getter(p)


def identity_hash(p: dict[str, Any]) -> str:
    """`identity_key` as 32 hex digits of SHA-256 over canonical JSON (stable; stored as a
    regression flag's natural key)."""
    blob = json.dumps({f: p[f] for f in IDENTITY_FIELDS}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def env_key(p: dict[str, Any]) -> tuple:
    """The point's environment (ENV_FIELDS, in order); missing keys count as ""."""
    g = p.get  # ENV_FIELDS, in order (spelled out: this runs once per point of every history page)
    return (g("hardware_fingerprint") or "", g("engine_version") or "", g("engine_build") or "",
            g("engine_commit") or "")


def env_difference(old: tuple, new: tuple) -> str:
    """Human sentence naming what differs between two `env_key`s ("" when equal), e.g.
    `engine version 0.9.1 -> 0.10.0; hardware fingerprint 3fa2.. -> 77c1..`."""
    parts = []
    for name, a, b in zip(ENV_FIELDS, old, new, strict=True):
        if a != b:
            if name == "hardware_fingerprint":
                a, b = (a or "?")[:8], (b or "?")[:8]
            parts.append(f"{name.replace('_', ' ')} {a or '?'} -> {b or '?'}")
    return "; ".join(parts)


#: Repeats up to this many use the rank-space bootstrap (`_median_rank_pmf`); more use resampling.
EXACT_MAX_REPEATS = 12


@functools.lru_cache(maxsize=32)
def _median_rank_pmf(n: int, draws: int = 200_000) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distribution of the median of a bootstrap resample of n sorted values, in rank space:
    (lower ranks, upper ranks, probabilities); the resample's median is the mean of the
    values at the two ranks (equal for odd n). It depends on n only, so it is estimated once
    per n from `draws` resamples of the ranks (seed 0; the support has at most n(n+1)/2 pairs)."""
    rng = np.random.default_rng(0)
    ranks = np.sort(rng.integers(0, n, size=(draws, n)), axis=1)
    lo, hi = ranks[:, (n - 1) // 2], ranks[:, n // 2]
    pairs, counts = np.unique(lo * n + hi, return_counts=True)
    return pairs // n, pairs % n, counts / draws


def bootstrap_change_ci(old: Sequence[Sequence[float]], new: Sequence[Sequence[float]], n_boot: int = 1000,
                        seed: int = 0) -> np.ndarray:
    """95 % percentile-bootstrap intervals of median(new_i) / median(old_i) - 1 (a fraction),
    for many pairs at once. `old[i]`, `new[i]`: the repeats of pair i (1-D arrays or lists of floats).
    Returns an array of shape (len(old), 2), [lo, hi] per pair.

    Same estimator as benchkit.compare.speedups.bootstrap_ratio_ci (resample each side, ratio
    of the resamples' medians, 2.5th and 97.5th percentiles), computed without resampling
    values when both sides have <= EXACT_MAX_REPEATS repeats: a resample's median is one of
    few (pairs of) order statistics whose probabilities depend only on the number of repeats
    (`_median_rank_pmf`), so each pair's bootstrap distribution of the ratio is a small weighted
    set of values, and its percentiles are read off the weighted CDF (1 000 matched points in a
    few ms). Larger samples are resampled `n_boot` times (seed `seed`).
    """
    out = np.full((len(old), 2), np.nan)
    groups: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, (a, b) in enumerate(zip(old, new, strict=True)):
        groups[(len(a), len(b))].append(i)
    rng = np.random.default_rng(seed)
    for (na, nb), idx in sorted(groups.items()):
        a = np.sort(np.asarray([old[i] for i in idx], float), axis=1)  # (P, na)
        b = np.sort(np.asarray([new[i] for i in idx], float), axis=1)  # (P, nb)
        with np.errstate(divide="ignore", invalid="ignore"):
            if max(na, nb) <= EXACT_MAX_REPEATS:
                alo, ahi, aw = _median_rank_pmf(na)
                blo, bhi, bw = _median_rank_pmf(nb)
                ma = (a[:, alo] + a[:, ahi]) / 2  # (P, Ka): the old side's possible medians
                mb = (b[:, blo] + b[:, bhi]) / 2  # (P, Kb)
                ratio = (mb[:, None, :] / ma[:, :, None] - 1.0).reshape(len(idx), -1)
                w = (aw[:, None] * bw[None, :]).ravel()
                order = np.argsort(ratio, axis=1)
                cdf = np.cumsum(w[order], axis=1)
                rows = np.arange(len(idx))
                lo = ratio[rows, order[rows, np.argmax(cdf >= 0.025, axis=1)]]
                hi = ratio[rows, order[rows, np.argmax(cdf >= 0.975 - 1e-12, axis=1)]]
                out[idx] = np.stack([lo, hi], axis=1)
            else:
                ia = rng.integers(0, na, size=(n_boot, na))
                ib = rng.integers(0, nb, size=(n_boot, nb))
                ratio = np.median(b[:, ib], axis=2) / np.median(a[:, ia], axis=2) - 1.0
                out[idx] = np.percentile(ratio, [2.5, 97.5], axis=1).T
    return out


@dataclass
class MetricChange:
    """One metric of one matched point: medians of each side (the metric's unit), change in %
    (new vs old), its 95 % CI in % (None without enough repeats) and the verdict."""

    metric: str
    old: float | None
    new: float | None
    change_pct: float | None = None
    ci95_pct: tuple[float, float] | None = None
    verdict: str = UNKNOWN


@dataclass
class PointDiff:
    """One point present in both sweeps. `changes`: metric -> MetricChange (COMPARE_METRICS);
    `verdict`: the primary metric's; `single_run`: fewer than MIN_REPEATS_FOR_CI repeats on a
    side (verdict by the noise threshold). `apart_reason` is non-empty when the environments
    differ (then every verdict is "unknown")."""

    key: tuple
    label: str
    fields: dict[str, Any]
    old_run_ids: list[int]
    new_run_ids: list[int]
    changes: dict[str, MetricChange]
    verdict: str
    single_run: bool
    old_env: tuple
    new_env: tuple
    apart_reason: str = ""


@dataclass
class SweepDiff:
    """Result of `compare_sweeps`: `matched` (comparable, with verdicts), `apart` (same point,
    different environment: values side by side, no verdict), `only_old` / `only_new` (points
    one sweep lacks, as label + fields), and `counts` of matched verdicts."""

    matched: list[PointDiff] = field(default_factory=list)
    apart: list[PointDiff] = field(default_factory=list)
    only_old: list[dict[str, Any]] = field(default_factory=list)
    only_new: list[dict[str, Any]] = field(default_factory=list)

    @property
    def counts(self) -> dict[str, int]:
        """{better, worse, no significant change, unknown: count} over `matched`."""
        out = {BETTER: 0, WORSE: 0, SAME: 0, UNKNOWN: 0}
        for d in self.matched:
            out[d.verdict] += 1
        return out


def _verdict(change: float, lo: float | None, hi: float | None, direction: int, noise: float) -> str:
    """better / worse / no significant change for a change (fraction), its CI (or None) and the
    metric's direction (+1 higher is better)."""
    if lo is not None and hi is not None:
        if lo > 0 or hi < 0:
            return BETTER if (lo > 0) == (direction > 0) else WORSE
        return SAME
    if abs(change) < noise:
        return SAME
    return BETTER if (change > 0) == (direction > 0) else WORSE


def _median(values: list[float]) -> float:
    """statistics.median of a non-empty list, as a float (without its per-call overhead)."""
    s = sorted(values)
    n = len(s)
    return float(s[n // 2]) if n % 2 else float((s[n // 2 - 1] + s[n // 2]) / 2)


def _group(points: list[dict[str, Any]]) -> dict[tuple, list[dict[str, Any]]]:
    out: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for p in points:
        out[identity_key(p)].append(p)
    return out


def _columns(ps: list[dict[str, Any]], names: tuple[str, ...]) -> dict[str, list[float]]:
    """{metric: its known values over the points `ps`, in order} (None left out)."""
    return {m: [v for p in ps if (v := p.get(m)) is not None] for m in names}


def compare_sweeps(old_points: list[dict[str, Any]], new_points: list[dict[str, Any]], noise_pct: float = 5.0,
                   metrics: dict[str, int] | None = None, n_boot: int = 1000) -> SweepDiff:
    """Compare the counted points of sweep `old` with those of sweep `new` (see module doc).

    `noise_pct`: with fewer than MIN_REPEATS_FOR_CI repeats on a side, a change smaller than
    this (in %) is "no significant change". `metrics`: name -> direction (default
    COMPARE_METRICS). A point whose repeats span several environments on one side takes the
    environment of its first run and is put apart if the sides differ. Output lists are in
    (tp, concurrency, output_len, label) order. Raises KeyError when a point lacks an
    IDENTITY_FIELDS key.
    """
    metrics = metrics or COMPARE_METRICS
    noise = noise_pct / 100.0
    names = tuple(metrics)
    old_g, new_g = _group(old_points), _group(new_points)
    diff = SweepDiff()
    values: dict[tuple, tuple[dict[str, list[float]], dict[str, list[float]]]] = {}
    for key, new_ps in new_g.items():
        old_ps = old_g.get(key)
        fields_ = dict(zip(IDENTITY_FIELDS, key, strict=True))
        if old_ps is None:
            diff.only_new.append({"label": new_ps[0]["label"], **fields_, "run_ids": [p["run_id"] for p in new_ps]})
            continue
        oe, ne = env_key(old_ps[0]), env_key(new_ps[0])
        ov, nv = _columns(old_ps, names), _columns(new_ps, names)
        values[key] = (ov, nv)
        changes = {}
        for m in metrics:
            c = changes[m] = MetricChange(m, _median(ov[m]) if ov[m] else None,
                                          _median(nv[m]) if nv[m] else None)
            if c.old is not None and c.new is not None and c.old > 0:
                c.change_pct = (c.new / c.old - 1.0) * 100.0
        d = PointDiff(key=key, label=new_ps[0]["label"], fields=fields_, old_run_ids=[p["run_id"] for p in old_ps],
                      new_run_ids=[p["run_id"] for p in new_ps], changes=changes, verdict=UNKNOWN,
                      single_run=min(len(old_ps), len(new_ps)) < MIN_REPEATS_FOR_CI, old_env=oe, new_env=ne,
                      apart_reason=env_difference(oe, ne) if oe != ne else "")
        (diff.apart if d.apart_reason else diff.matched).append(d)
    for key, old_ps in old_g.items():
        if key not in new_g:
            diff.only_old.append({"label": old_ps[0]["label"], **dict(zip(IDENTITY_FIELDS, key, strict=True)),
                                  "run_ids": [p["run_id"] for p in old_ps]})
    # bootstrap CIs for every matched (metric, point) with enough repeats, vectorised per metric
    for m, direction in metrics.items():
        todo, olds, news = [], [], []
        for d in diff.matched:
            c = d.changes[m]
            if c.change_pct is None:
                continue
            ov, nv = values[d.key][0][m], values[d.key][1][m]
            if len(ov) >= MIN_REPEATS_FOR_CI and len(nv) >= MIN_REPEATS_FOR_CI:
                todo.append(c)
                olds.append(ov)
                news.append(nv)
            else:
                c.verdict = _verdict(c.change_pct / 100.0, None, None, direction, noise)
        if todo:
            cis = bootstrap_change_ci(olds, news, n_boot=n_boot)
            for c, (lo, hi) in zip(todo, cis.tolist(), strict=True):
                c.ci95_pct = (lo * 100.0, hi * 100.0)
                c.verdict = _verdict(c.change_pct / 100.0, lo, hi, direction, noise)
    for d in diff.matched:
        d.verdict = d.changes[PRIMARY_METRIC].verdict if PRIMARY_METRIC in d.changes else UNKNOWN

    def order(x: Any) -> tuple:
        f = x.fields if isinstance(x, PointDiff) else x
        return (f["tp"], f["concurrency"], f["output_len"], f["input_len"], x.label if isinstance(x, PointDiff)
                else x["label"])

    for lst in (diff.matched, diff.apart, diff.only_old, diff.only_new):
        lst.sort(key=order)
    return diff
