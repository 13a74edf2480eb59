"""Speculative-decoding counters from an inference server's Prometheus `/metrics` page.

draftboard reads the counters just before and just after a run's measured window and turns the
deltas into acceptance figures (MEASUREMENT.md, "Per run"):

- acceptance rate            = d accepted tokens / d draft tokens          (fraction, 0..1)
- mean acceptance length tau = 1 + d accepted tokens / d drafts            (tokens per step)
- per-position rate k        = d accepted_per_pos[k] / d drafts            (fraction, 0..1)

Every counter is summed over all of its label sets (engine index, model name, DP/TP rank), so
a server with several engine cores or ranks gives one figure.

Which metric names hold an engine's counters, and how they become `SpecCounters`, is the
engine's own fact: each engine module (benchkit/engines/kinds/, registered in
benchkit/engines/registry.py) declares `counter_prefixes` and `read_counters(page)` (vLLM's
`vllm:spec_decode_*` counters; SGLang's `sglang:spec_verify_calls_total` with its generation and
request counters, which give accepted tokens but no draft-token count), and
benchkit.engines.adapters (`EngineAdapter.scrape_counters`, `counters_from_text`) puts the two
halves together. This module knows no engine: it fetches the page (`fetch_metrics_text`), parses
it into a `MetricsPage` (`parse_page`) and turns two readings into a window's figures.

Restarts and bounds (MEASUREMENT.md, "Counters can restart between two readings"): a server that
restarted between the two readings may already have counted past the first reading's values, so
a decrease alone cannot reveal it. Each reading also keeps the counters' `_created` samples (the
Unix time each series was created, which prometheus_client exports beside every counter) and
`process_start_time_seconds`; `spec_decode_metrics` reports a restart when any counter series
went down, when a series present in both readings has a different `_created` time, or when the
process start time moved. The derived figures must also lie in their physical range: acceptance
rate and every per-position rate in [0, 1], accepted tokens >= 0, tau in [1, 1 + L] where L is
the most draft tokens one step can accept (`max_accepted_per_step`). Either problem raises a
`CounterWindowError` whose `code` names it (`counters_restarted`, `acceptance_out_of_bounds`);
the run keeps no acceptance figures and is marked suspect (benchkit.measure.validity).

Note on parsing: `prometheus_client.parser.text_string_to_metric_families` strips `_total`
from a counter *family* name but the *sample* names keep it, so this module matches samples
by their full names.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

#: prometheus_client's process collector: start time of the process serving /metrics (Unix s).
PROCESS_START = "process_start_time_seconds"
#: Two start times (or `_created` times) closer than this (s) are the same process (series).
SAME_TIME_S = 1e-3


class ScrapeError(Exception):
    """The metrics page could not be fetched, or its text could not be parsed."""


class CounterWindowError(ValueError):
    """Two readings cannot give acceptance figures for the window; `code` says why (a key of
    benchkit.measure.validity.REASON_CODES)."""

    code = "counters_restarted"


class CounterResetError(CounterWindowError):
    """The readings do not come from one server life: different engines, a counter went down,
    a counter series was re-created (`_created` moved) or the process start time moved."""

    code = "counters_restarted"


class AcceptanceBoundsError(CounterWindowError):
    """A derived figure lies outside its physical range (a rate outside [0, 1], tau outside
    [1, 1 + max accepted per step], negative accepted tokens)."""

    code = "acceptance_out_of_bounds"


@dataclass
class SpecCounters:
    """One reading of a server's speculative-decoding counters (cumulative since server start).

    Counts are summed over all label sets. `num_drafts` is the number of draft/verify steps,
    `num_draft_tokens` the tokens proposed (None where the engine does not expose it: SGLang),
    `num_accepted_tokens` the draft tokens the target accepted, `accepted_per_pos` maps a draft
    position k (0-based) to the tokens accepted at k (empty where not exposed). `source` is the
    engine whose counters they are (a registry name, e.g. "vllm") or "none" (the page has no
    speculative-decoding counter: an autoregressive server). `raw` maps every relevant sample,
    written as `name{labels}`, to its value, so a later formula fix can re-derive the figures.
    `created` maps a relevant counter series (`name_total{labels}`) to its `_created` sample
    (Unix s) where the page has one; `process_start_time_s` is the page's
    `process_start_time_seconds` (Unix s; the earliest when several processes report one), None
    when absent.
    """

    num_drafts: float = 0.0
    num_draft_tokens: float | None = 0.0
    num_accepted_tokens: float = 0.0
    accepted_per_pos: dict[int, float] = field(default_factory=dict)
    source: str = "none"
    raw: dict[str, float] = field(default_factory=dict)
    created: dict[str, float] = field(default_factory=dict)
    process_start_time_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (position keys become strings); inverse of `from_dict`."""
        return {
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "accepted_per_pos": {str(k): v for k, v in sorted(self.accepted_per_pos.items())},
            "source": self.source,
            "raw": dict(self.raw),
            "created": dict(self.created),
            "process_start_time_s": self.process_start_time_s,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpecCounters:
        """Build from `to_dict` output."""
        return cls(
            num_drafts=data.get("num_drafts", 0.0),
            num_draft_tokens=data.get("num_draft_tokens"),
            num_accepted_tokens=data.get("num_accepted_tokens", 0.0),
            accepted_per_pos={int(k): v for k, v in (data.get("accepted_per_pos") or {}).items()},
            source=data.get("source", "none"),
            raw=dict(data.get("raw") or {}),
            created=dict(data.get("created") or {}),
            process_start_time_s=data.get("process_start_time_s"),
        )


@dataclass
class SpecDecodeMetrics:
    """Acceptance figures of one measured window, from two `SpecCounters` readings.

    `acceptance_rate` is a fraction in 0..1 (vLLM's `bench serve` prints it in percent);
    `acceptance_length` is tau, tokens per target step (>= 1); `per_position_acceptance_rate[k]`
    is the fraction of drafts whose position k was accepted. Counts are window deltas.
    """

    num_drafts: float
    num_draft_tokens: float | None
    num_accepted_tokens: float
    acceptance_rate: float | None
    acceptance_length: float
    per_position_acceptance_rate: list[float]
    source: str

    def to_flat(self) -> dict[str, Any]:
        """Flat dict with draftboard key names (rate as a fraction, not percent)."""
        return {
            "spec_num_drafts": self.num_drafts,
            "spec_num_draft_tokens": self.num_draft_tokens,
            "spec_num_accepted_tokens": self.num_accepted_tokens,
            "acceptance_rate": self.acceptance_rate,
            "acceptance_length": self.acceptance_length,
            "per_position_acceptance_rate": list(self.per_position_acceptance_rate),
            "spec_source": self.source,
        }


def _sample_key(name: str, labels: dict[str, str]) -> str:
    if not labels:
        return name
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


@dataclass
class MetricsPage:
    """One parsed Prometheus page, reduced to the samples some registered engine's counter reader
    names (its `counter_prefixes`): `samples` as (name, labels, value), `raw` the same as
    `name{labels}` -> value, `created` each such counter series' `_created` sample (Unix s, keyed
    `name_total{labels}`), `process_start_time_s` the earliest `process_start_time_seconds`
    (None when absent)."""

    samples: list[tuple[str, dict[str, str], float]] = field(default_factory=list)
    raw: dict[str, float] = field(default_factory=dict)
    created: dict[str, float] = field(default_factory=dict)
    process_start_time_s: float | None = None

    def has(self, name: str) -> bool:
        """True when the page has a sample named `name` (full sample name, `_total` kept)."""
        return any(n == name for n, _, _ in self.samples)

    def total(self, name: str) -> float:
        """The sum of sample `name` over all its label sets (engine cores, ranks); 0.0 when absent."""
        return sum(v for n, _, v in self.samples if n == name)

    def reading(self, counts: SpecCounters) -> SpecCounters:
        """`counts` (an engine reader's figures) with this page's raw samples, `_created` times and
        process start attached, so a later formula fix can re-derive them and restarts show."""
        return dataclasses.replace(counts, raw=dict(self.raw), created=dict(self.created),
                                   process_start_time_s=self.process_start_time_s)


def parse_page(text: str, prefixes: tuple[str, ...]) -> MetricsPage:
    """Parse a Prometheus text page, keeping the samples whose names start with one of
    `prefixes` (the counter names of the registered engines). Samples ending in `_created` go to
    `created` (keyed by their `_total` series), never into the samples;
    `process_start_time_seconds` to `process_start_time_s`. Raises ScrapeError for text the
    Prometheus parser rejects."""
    page = MetricsPage()
    starts: list[float] = []
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as exc:  # the parser raises ValueError and others for bad lines
        raise ScrapeError(f"cannot parse Prometheus metrics text: {exc}") from exc
    for family in families:
        for sample in family.samples:
            name = sample.name
            if name == PROCESS_START:
                starts.append(float(sample.value))
            elif name.endswith("_created"):
                series = name[: -len("_created")] + "_total"
                if series.startswith(prefixes):
                    page.created[_sample_key(series, sample.labels)] = float(sample.value)
            elif name.startswith(prefixes):
                page.samples.append((name, dict(sample.labels), float(sample.value)))
                page.raw[_sample_key(name, sample.labels)] = float(sample.value)
    page.process_start_time_s = min(starts) if starts else None
    return page


def fetch_metrics_text(metrics_url: str, timeout_s: float = 5.0) -> str:
    """GET `metrics_url` (e.g. http://127.0.0.1:8000/metrics) and return the page's text.

    Raises ScrapeError naming the URL on a transport error, a timeout after `timeout_s`
    seconds, or a non-200 answer (SGLang answers 404 without `--enable-metrics`).
    """
    try:
        response = httpx.get(metrics_url, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise ScrapeError(f"cannot read {metrics_url}: {type(exc).__name__}: {exc}") from exc
    if response.status_code != 200:
        raise ScrapeError(f"{metrics_url} answered HTTP {response.status_code}")
    return response.text


def max_accepted_per_step(method: str, num_speculative_tokens: int | None, tree_budget: int | None) -> int | None:
    """The most draft tokens one target step can accept, L, so that tau <= 1 + L (tokens).

    Chains (draft_model, eagle, eagle3, mtp, ngram, linear/DFlash): L = k, the draft length.
    Tree methods (DDTree with node budget B, root not counted): the accepted tokens form one
    root-to-leaf path of the tree, and B nodes make at most a chain of B, so L = B; when the
    draft length k (block size - 1) is known too, L = min(B, k), since no path is deeper than
    the drafter's block. This is the loosest bound that is always true; the tree's real depth
    (which the best-first heap decides per step) is not known to the client. Returns None when
    neither is known (the engine's default k) or for `auto`.
    """
    if method == "auto":
        return None
    known = [x for x in (num_speculative_tokens, tree_budget if method == "ddtree" else None) if x]
    return min(known) if known else None


def _restart_reason(before: SpecCounters, after: SpecCounters) -> str | None:
    """Why the two readings cannot come from one server life, or None."""
    if before.source != after.source:
        return f"counter sources differ: before={before.source!r}, after={after.source!r}"
    b, a = before.process_start_time_s, after.process_start_time_s
    if b is not None and a is not None and abs(a - b) > SAME_TIME_S:
        return f"process_start_time_seconds moved from {b:.3f} to {a:.3f}: the server restarted between the readings"
    for key in sorted(set(before.created) & set(after.created)):
        b, a = before.created[key], after.created[key]
        if abs(a - b) > SAME_TIME_S:
            return f"counter {key} was re-created ({key.rsplit('_total', 1)[0]}_created moved from {b:.3f} to {a:.3f})"
    for key in sorted(set(before.raw) & set(after.raw)):
        if key.split("{", 1)[0].endswith("_total") and after.raw[key] < before.raw[key]:
            return f"counter {key} went down from {before.raw[key]:g} to {after.raw[key]:g}: the server restarted"
    return None


def spec_decode_metrics(
    before: SpecCounters | None, after: SpecCounters | None, max_accepted: int | None = None
) -> SpecDecodeMetrics | None:
    """Acceptance figures of the window between two readings (formulas in the module doc).

    `max_accepted`: the most draft tokens one step can accept (`max_accepted_per_step`), the
    upper bound of tau - 1; when None it is the number of per-position counters the page has
    (vLLM exposes one per draft position), else only the lower bounds are checked.
    Returns None when no draft step happened in the window (an autoregressive server,
    `source == "none"` in either reading, or a reading is None). Raises CounterResetError when
    the readings do not come from one server life (different engines, a counter went down, a
    `_created` time or the process start time moved), AcceptanceBoundsError when a figure lies
    outside its physical range (acceptance rate or a per-position rate outside [0, 1], negative
    accepted tokens, tau outside [1, 1 + max_accepted]).
    """
    if before is None or after is None or before.source == "none" or after.source == "none":
        return None
    reason = _restart_reason(before, after)
    if reason is not None:
        raise CounterResetError(reason)
    d_drafts = after.num_drafts - before.num_drafts
    d_accepted = after.num_accepted_tokens - before.num_accepted_tokens
    d_tokens = None
    if before.num_draft_tokens is not None and after.num_draft_tokens is not None:
        d_tokens = after.num_draft_tokens - before.num_draft_tokens
    if d_drafts <= 0:
        return None
    positions = sorted(set(before.accepted_per_pos) | set(after.accepted_per_pos))
    per_pos = []
    if positions:
        for k in range(max(positions) + 1):
            delta = after.accepted_per_pos.get(k, 0.0) - before.accepted_per_pos.get(k, 0.0)
            per_pos.append(delta / d_drafts)
    rate = d_accepted / d_tokens if d_tokens else None
    tau = 1.0 + d_accepted / d_drafts
    bound = max_accepted if max_accepted is not None else (len(positions) or None)
    problems = []
    if d_accepted < 0:
        problems.append(f"accepted tokens went negative ({d_accepted:g})")
    if rate is not None and not 0.0 <= rate <= 1.0:
        problems.append(f"acceptance rate {rate:.3f} outside [0, 1]")
    bad_pos = [f"{k}: {r:.3f}" for k, r in enumerate(per_pos) if not 0.0 <= r <= 1.0]
    if bad_pos:
        problems.append(f"per-position rate(s) outside [0, 1] ({', '.join(bad_pos)})")
    if tau < 1.0 or (bound is not None and tau > 1.0 + bound):
        upper = f"{1 + bound:g}" if bound is not None else "inf"
        problems.append(f"acceptance length tau {tau:.3f} outside [1, {upper}]")
    if problems:
        raise AcceptanceBoundsError(
            f"window deltas (drafts {d_drafts:g}, draft tokens {d_tokens if d_tokens is None else f'{d_tokens:g}'}, "
            f"accepted {d_accepted:g}) give " + "; ".join(problems)
        )
    return SpecDecodeMetrics(
        num_drafts=d_drafts,
        num_draft_tokens=d_tokens,
        num_accepted_tokens=d_accepted,
        acceptance_rate=rate,
        acceptance_length=tau,
        per_position_acceptance_rate=per_pos,
        source=after.source,
    )


def cross_check(
    tau: float | None,
    mean_tokens_per_chunk: float | None,
    icl_over_tpot: float | None,
    tolerance: float = 0.15,
) -> list[str]:
    """Compare the server's tau with two client-side estimates (MEASUREMENT.md, "Per run").

    `mean_tokens_per_chunk` is the client's mean tokens per streamed message; `icl_over_tpot`
    is mean ICL (ms) / mean TPOT (ms). Both estimate tokens per target step, so each should lie
    within `tolerance` (relative to tau, default 15 %) of tau. Returns one message per
    disagreement (empty when all agree or a value is missing/non-finite); any message marks the
    run `suspect`. A typical cause is a server that coalesces several steps into one message.
    """
    problems: list[str] = []
    if tau is None or not math.isfinite(tau) or tau <= 0:
        return problems
    for label, value in (("mean tokens per chunk", mean_tokens_per_chunk), ("ICL / TPOT", icl_over_tpot)):
        if value is None or not math.isfinite(value):
            continue
        rel = abs(value - tau) / tau
        if rel > tolerance:
            problems.append(
                f"{label} = {value:.3f} differs from server acceptance length tau = {tau:.3f} "
                f"by {rel:.1%} (> {tolerance:.0%})"
            )
    return problems
