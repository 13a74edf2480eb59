"""Speculative-decoding counters from an inference server's Prometheus `/metrics` page.

draftboard reads the counters just before and just after a run's measured window and turns the
deltas into acceptance figures (MEASUREMENT.md, "Per run"):

- acceptance rate            = d accepted tokens / d draft tokens          (fraction, 0..1)
- mean acceptance length tau = 1 + d accepted tokens / d drafts            (tokens per step)
- per-position rate k        = d accepted_per_pos[k] / d drafts            (fraction, 0..1)

Every counter is summed over all of its label sets (engine index, model name, DP/TP rank), so
a server with several engine cores or ranks gives one figure.

Metric names, by engine:

vLLM (v1 engine, `vllm/v1/spec_decode/metrics.py`; the same four names are read by
`vllm/benchmarks/serve.py::fetch_spec_decode_metrics`), Prometheus counters:
    vllm:spec_decode_num_drafts_total
    vllm:spec_decode_num_draft_tokens_total
    vllm:spec_decode_num_accepted_tokens_total
    vllm:spec_decode_num_accepted_tokens_per_pos_total{position="k"}

SGLang (`--enable-metrics`; sgl-project/sglang `python/sglang/srt/observability/metrics_collector.py`,
earlier `python/sglang/srt/metrics/collector.py`): there is no draft-token counter. Newer builds
have the counter `sglang:spec_verify_calls_total` (incremented by each finished request's
`spec_verify_ct`, i.e. target verify passes) beside `sglang:generation_tokens_total` and
`sglang:num_requests_total` (also counted per finished request). Every build has the gauges
`sglang:spec_accept_length` and `sglang:spec_accept_rate`, which describe only the most recent
logging interval and so cannot give a per-run delta; they are kept in `SpecCounters.raw` for
reference only. From the counters draftboard derives, per request of `n` output tokens with
`V` verify passes (the first token comes from prefill, each verify pass emits its accepted
draft tokens plus one bonus token, so `n = 1 + V + accepted`):
    drafts   = sglang:spec_verify_calls_total
    accepted = sglang:generation_tokens_total - sglang:spec_verify_calls_total
               - sglang:num_requests_total
so that tau = 1 + accepted / drafts is the same quantity as vLLM's. (SGLang's own
`avg_spec_accept_length` is generation tokens / verify calls, which counts the prefill token
too and is larger by requests / verify calls.) Draft tokens and per-position counts are not
exposed by SGLang, so its acceptance rate and per-position rates are None.

Note on parsing: `prometheus_client.parser.text_string_to_metric_families` strips `_total`
from a counter *family* name but the *sample* names keep it, so this module matches samples
by their full names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

VLLM_NUM_DRAFTS = "vllm:spec_decode_num_drafts_total"
VLLM_NUM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
VLLM_NUM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
VLLM_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"

SGLANG_VERIFY_CALLS = "sglang:spec_verify_calls_total"
SGLANG_GENERATION_TOKENS = "sglang:generation_tokens_total"
SGLANG_NUM_REQUESTS = "sglang:num_requests_total"
#: Interval gauges (most recent logging interval only): recorded, never used for deltas.
SGLANG_GAUGES = ("sglang:spec_accept_length", "sglang:spec_accept_rate", "sglang:spec_num_draft_tokens")

ENGINES = ("auto", "vllm", "sglang")


class ScrapeError(Exception):
    """The metrics page could not be fetched, or its text could not be parsed."""


class CounterResetError(ValueError):
    """Two readings do not fit together: different engines, or a counter went down (the
    server restarted inside the window)."""


@dataclass
class SpecCounters:
    """One reading of a server's speculative-decoding counters (cumulative since server start).

    Counts are summed over all label sets. `num_drafts` is the number of draft/verify steps,
    `num_draft_tokens` the tokens proposed (None where the engine does not expose it: SGLang),
    `num_accepted_tokens` the draft tokens the target accepted, `accepted_per_pos` maps a draft
    position k (0-based) to the tokens accepted at k (empty where not exposed).
    `source` is "vllm", "sglang" or "none" (the page has no speculative-decoding counter: an
    autoregressive server). `raw` maps every relevant sample, written as `name{labels}`, to its
    value, so a later formula fix can re-derive the figures.
    """

    num_drafts: float = 0.0
    num_draft_tokens: float | None = 0.0
    num_accepted_tokens: float = 0.0
    accepted_per_pos: dict[int, float] = field(default_factory=dict)
    source: str = "none"
    raw: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (position keys become strings); inverse of `from_dict`."""
        return {
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "accepted_per_pos": {str(k): v for k, v in sorted(self.accepted_per_pos.items())},
            "source": self.source,
            "raw": dict(self.raw),
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


def _relevant(name: str) -> bool:
    return (
        name.startswith("vllm:spec_decode")
        or name.startswith("sglang:spec_")
        or name in (SGLANG_GENERATION_TOKENS, SGLANG_NUM_REQUESTS)
    )


def parse_metrics_text(text: str, engine: str = "auto") -> SpecCounters:
    """Parse a Prometheus text page into `SpecCounters`.

    `engine` is "vllm", "sglang" or "auto" (vLLM names win when both are present). Samples
    ending in `_created` are ignored. Raises ScrapeError for text the Prometheus parser
    rejects or a per-position sample without an integer `position` label, ValueError for an
    unknown `engine`. A page without speculative-decoding counters gives `source="none"` and
    zero counts.
    """
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; expected one of {ENGINES}")
    sums: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    raw: dict[str, float] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as exc:  # the parser raises ValueError and others for bad lines
        raise ScrapeError(f"cannot parse Prometheus metrics text: {exc}") from exc
    for family in families:
        for sample in family.samples:
            name = sample.name
            if not _relevant(name) or name.endswith("_created"):
                continue
            value = float(sample.value)
            raw[_sample_key(name, sample.labels)] = value
            if name == VLLM_ACCEPTED_PER_POS:
                try:
                    pos = int(sample.labels["position"])
                except (KeyError, ValueError) as exc:
                    raise ScrapeError(
                        f"{name} sample without an integer 'position' label: {sample.labels}"
                    ) from exc
                per_pos[pos] = per_pos.get(pos, 0.0) + value
            sums[name] = sums.get(name, 0.0) + value

    has_vllm = any(n in sums for n in (VLLM_NUM_DRAFTS, VLLM_NUM_DRAFT_TOKENS, VLLM_NUM_ACCEPTED))
    has_sglang = SGLANG_VERIFY_CALLS in sums
    use = engine
    if engine == "auto":
        use = "vllm" if has_vllm else ("sglang" if has_sglang else "none")
    if use == "vllm" and has_vllm:
        return SpecCounters(
            num_drafts=sums.get(VLLM_NUM_DRAFTS, 0.0),
            num_draft_tokens=sums.get(VLLM_NUM_DRAFT_TOKENS, 0.0),
            num_accepted_tokens=sums.get(VLLM_NUM_ACCEPTED, 0.0),
            accepted_per_pos=per_pos,
            source="vllm",
            raw=raw,
        )
    if use == "sglang" and has_sglang:
        verify = sums[SGLANG_VERIFY_CALLS]
        generated = sums.get(SGLANG_GENERATION_TOKENS, 0.0)
        requests = sums.get(SGLANG_NUM_REQUESTS, 0.0)
        return SpecCounters(
            num_drafts=verify,
            num_draft_tokens=None,
            num_accepted_tokens=generated - verify - requests,
            accepted_per_pos={},
            source="sglang",
            raw=raw,
        )
    return SpecCounters(num_draft_tokens=None if use == "sglang" else 0.0, source="none", raw=raw)


def scrape(metrics_url: str, timeout_s: float = 5.0, engine: str = "auto") -> SpecCounters:
    """GET `metrics_url` (e.g. http://127.0.0.1:8000/metrics) and parse it with
    `parse_metrics_text`.

    Raises ScrapeError naming the URL on a transport error, a timeout after `timeout_s`
    seconds, or a non-200 answer (SGLang answers 404 without `--enable-metrics`).
    """
    try:
        response = httpx.get(metrics_url, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise ScrapeError(f"cannot read {metrics_url}: {type(exc).__name__}: {exc}") from exc
    if response.status_code != 200:
        raise ScrapeError(f"{metrics_url} answered HTTP {response.status_code}")
    return parse_metrics_text(response.text, engine)


def spec_decode_metrics(
    before: SpecCounters | None, after: SpecCounters | None
) -> SpecDecodeMetrics | None:
    """Acceptance figures of the window between two readings (formulas in the module doc).

    Returns None when no draft step happened in the window (an autoregressive server,
    `source == "none"` in either reading, or a reading is None). Raises CounterResetError when
    the readings come from different engines or a vLLM counter went down (the server restarted
    inside the window).
    """
    if before is None or after is None or before.source == "none" or after.source == "none":
        return None
    if before.source != after.source:
        raise CounterResetError(f"counter sources differ: before={before.source!r}, after={after.source!r}")
    d_drafts = after.num_drafts - before.num_drafts
    d_accepted = after.num_accepted_tokens - before.num_accepted_tokens
    d_tokens = None
    if before.num_draft_tokens is not None and after.num_draft_tokens is not None:
        d_tokens = after.num_draft_tokens - before.num_draft_tokens
    for label, delta in (("num_drafts", d_drafts), ("num_draft_tokens", d_tokens)):
        if delta is not None and delta < 0:
            raise CounterResetError(
                f"counter {label} went down by {-delta:g}: the server restarted in the window"
            )
    if d_accepted < 0 and after.source == "vllm":
        raise CounterResetError(f"counter num_accepted_tokens went down by {-d_accepted:g}: server restarted")
    if d_drafts <= 0:
        return None
    positions = sorted(set(before.accepted_per_pos) | set(after.accepted_per_pos))
    per_pos = []
    if positions:
        for k in range(max(positions) + 1):
            delta = after.accepted_per_pos.get(k, 0.0) - before.accepted_per_pos.get(k, 0.0)
            per_pos.append(delta / d_drafts)
    rate = d_accepted / d_tokens if d_tokens else None
    return SpecDecodeMetrics(
        num_drafts=d_drafts,
        num_draft_tokens=d_tokens,
        num_accepted_tokens=d_accepted,
        acceptance_rate=rate,
        acceptance_length=1.0 + d_accepted / d_drafts,
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
