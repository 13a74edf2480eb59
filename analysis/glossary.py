"""The glossary page's content: every figure draftboard shows, with its formula, its unit and the
tokens it counts (issue 12). Written from the shared MEASUREMENT.md ("Per request", "Per run",
"Notes learned from real runs") and docs/TELEMETRY.md's proposed section "GPU telemetry and
efficiency"; where this repo's figures differ from MEASUREMENT.md, docs/MEASUREMENT-NOTES.md
says how. `fields` names the metric-schema fields (benchkit.measure.metrics.METRIC_FIELDS) an
entry defines: every field has one (tests/test_telemetry_pages.py checks it).
"""

from __future__ import annotations

from dataclasses import dataclass

from benchkit.compare.lossless import ALPHA, MARK
from benchkit.compare.speedups import MIN_REPEATS_FOR_CI
from benchkit.compare.verdicts import DIFFER_SHARE, EXCLUDING_MARKS, MIN_COMPLETED_REQUESTS, MIN_WINDOW_S
from benchkit.measure.gpu_window import TELEMETRY_MAX_GAP_MS, TELEMETRY_MAX_GAP_SHARE
from benchkit.measure.loadclient import STALL_MIN_MS
from benchkit.measure.metrics import COALESCED_GAP_MS, COALESCED_NOTE_SHARE, STAT_NAMES
from benchkit.measure.validity import (
    CLIENT_MAX_CORE_SHARE,
    CLIENT_MAX_LOOP_LAG_P99_MS,
    CLIENT_MAX_STALL_MS,
    CLIENT_MAX_STALLED_SHARE,
)


@dataclass(frozen=True)
class Entry:
    """One figure: `term`, `definition` (formula in words), `unit`, `tokens` (which tokens it
    counts: output, input + output, none), `fields` (metric-schema fields it defines)."""

    term: str
    definition: str
    unit: str
    tokens: str = ""
    fields: tuple[str, ...] = ()


def _stats(metric: str) -> tuple[str, ...]:
    return tuple(f"{s}_{metric}_ms" for s in STAT_NAMES)


#: (section title, entries), in page order.
SECTIONS: tuple[tuple[str, tuple[Entry, ...]], ...] = (
    ("Per request", (
        Entry("TTFT", "first message carrying at least one output token (reasoning counts) minus send time; "
                      "statistics request-weighted", "ms", "output", _stats("ttft")),
        Entry("E2EL", "last message carrying tokens minus send time; statistics request-weighted", "ms", "output",
              _stats("e2el")),
        Entry("output tokens n", "server usage.completion_tokens; the client's count of streamed tokens only as a "
                                 "flagged fallback", "tokens", "output",
              ("total_output_tokens", "output_tokens_from_text")),
        Entry("TPOT", "(E2EL - TTFT) / (n - 1), defined for n >= 2; statistics request-weighted", "ms/token",
              "output", _stats("tpot")),
        Entry("ITL (per token)", "each gap between consecutive token-carrying messages divided by the tokens the "
                                 "later message carried, one sample per token (token-weighted)", "ms/token", "output",
              _stats("itl")),
        Entry("ICL (per chunk)", "the raw gaps between consecutive token-carrying messages (what vllm bench serve "
                                 "calls ITL)", "ms", "output", _stats("icl")),
        Entry("tokens per chunk (all chunks)", "mean tokens per token-carrying message, every message of completed "
                                               "measured requests", "tokens", "output", ("mean_tokens_per_chunk",)),
        Entry("tau estimate (client)", "mean tokens per token-carrying message, each request's FIRST message left "
                                       "out (it holds the prefill token, no draft step); coalesced arrivals bias "
                                       "it high", "tokens/step", "output", ("mean_decode_tokens_per_chunk",)),
        Entry("coalesced arrivals", f"share of gaps between token-carrying messages below {COALESCED_GAP_MS:g} ms "
                                    "(several messages in one read); above "
                                    f"{COALESCED_NOTE_SHARE:.0%} the run page says ITL / ICL medians mislead and "
                                    "points to TPOT", "fraction", "", ("coalesced_share",)),
    )),
    ("Per run (the measured window only)", (
        Entry("window", "first measured send to last measured completion; warmup requests count nowhere", "s", "",
              ("duration_s",)),
        Entry("completed, failed, error rate", "failed: non-2xx, transport error, timeout, a truncated or bad "
                                               "stream, or a 2xx with zero output tokens; error rate = failed / "
                                               "measured", "requests, fraction", "",
              ("completed", "failed", "error_rate")),
        Entry("input tokens", "prompt tokens of completed requests (the server's count where given)", "tokens",
              "input", ("total_input_tokens",)),
        Entry("output throughput", "sum of n over completed requests / window seconds", "tok/s", "output",
              ("output_throughput_tok_s",)),
        Entry("total token throughput", "(input + output tokens of completed requests) / window seconds", "tok/s",
              "input + output", ("total_token_throughput_tok_s",)),
        Entry("request throughput", "completed requests / window seconds", "req/s", "",
              ("request_throughput_req_s",)),
        Entry("peak output throughput", "largest one-second bucket of output tokens (token-weighted)", "tok/s",
              "output", ("max_output_tokens_per_s",)),
        Entry("goodput", "completed requests meeting every SLO of the sweep, per second", "req/s", "",
              ("request_goodput_req_s",)),
    )),
    ("Speculative decoding (server counters, deltas over the window)", (
        Entry("acceptance length tau", "1 + d accepted / d drafts; bounded to [1, k + 1]", "tokens/step", "output",
              ("acceptance_length",)),
        Entry("acceptance rate", "d accepted / d draft tokens; bounded to [0, 1]", "fraction", "output",
              ("acceptance_rate",)),
        Entry("per-position acceptance rate", "d accepted at position k / d drafts", "fraction", "output",
              ("per_position_acceptance_rate",)),
        Entry("drafts, draft tokens, accepted tokens", "the counters' deltas over the window", "drafts, tokens",
              "output", ("spec_num_drafts", "spec_num_draft_tokens", "spec_num_accepted_tokens")),
    )),
    ("Speculative decoding per request (the engine's own per-request figures, completed requests)", (
        Entry("tau, per-request mean", "mean over requests of 1 + accepted / verify steps (vLLM's "
                                       "mean_acceptance_length; every request counts once); unknown where the engine "
                                       "returned no per-request figures", "tokens/step", "output",
              ("acceptance_length_request_weighted",)),
        Entry("tau, per verify step", "1 + sum of accepted draft tokens / sum of verify steps over the requests "
                                      "(every step counts once, as the server's pooled counters count; long "
                                      "completions weigh more)", "tokens/step", "output",
              ("acceptance_length_token_weighted",)),
        Entry("requests with per-request spec figures", "completed measured requests whose answer carried them",
              "requests", "", ("spec_requests_reported",)),
    )),
    ("Decode-step ceilings (computed when read, docs/CEILINGS.md; no ceiling for an unknown GPU or model)", (
        Entry("verified tokens per step V", "concurrency B x (k + 1) drafted tokens plus the root (B x (budget + 1) "
                                             "for DDTree); B for autoregressive", "tokens/step"),
        Entry("memory ceiling", "B x tau / (bytes one step reads: weights, KV cache over the mean context, "
                                "recurrent state / (TP x memory bandwidth)); weights from config.json", "tok/s",
              "output"),
        Entry("compute ceiling", "B x tau / (2 x active parameters x V / (TP x dense peak FLOP/s of the compute "
                                 "dtype))", "tok/s", "output"),
        Entry("ridge", "the V at which the step's compute time equals its memory time; above it a step is "
                       "compute-bound and a wider draft costs time in proportion", "tokens/step"),
        Entry("binding ceiling, achieved %", "the smaller of the two ceilings; achieved = B x 1000 / median TPOT as "
                                             "% of it. Ignored: all-reduce, launch overhead, attention FLOPs, and the "
                                             "drafter's passes where its config is not stored", "% of tok/s",
              "output"),
    )),
    ("GPU telemetry and efficiency (NVML, the measured window only)", (
        Entry("output tok/s per GPU", "output tokens / window s / GPUs of the run", "tok/s/GPU", "output",
              ("output_tok_s_per_gpu",)),
        Entry("mean, peak power per GPU", "mean and max of each GPU's power readings inside the window (NVML's "
                                          "1 s average); the run shows the mean of the GPUs' means and the "
                                          "highest peak; board power only (not CPUs, host, network, cooling)",
              "W", "", ("mean_power_w_per_gpu", "peak_power_w_per_gpu")),
        Entry("energy", "sum over the run's GPUs of the energy counter's rise over the window (interpolated at its "
                        "ends); where a GPU has no counter, the trapezoid integral of its power readings; the run "
                        "says which (counter, integrated_power, mixed)", "J", "", ("energy_j", "energy_source")),
        Entry("energy per output token", "energy / output tokens", "J/token", "output",
              ("energy_per_output_token_j",)),
        Entry("output tok/s per kW", "1000 x output tokens / energy (the window's mean GPU power)", "tok/s/kW",
              "output", ("output_tok_s_per_kw",)),
        Entry("cost per million output tokens", "price per GPU-hour x GPUs x window s / 3600 / output tokens x "
                                                "10^6, at the GPU model's price set in the admin today (no price: "
                                                "no figure); shown with the price it used", "USD/Mtok", "output"),
        Entry("GPU suspect marks", "inside the window a GPU reported clock-event reason 0x8 (HW slowdown), 0x20 "
                                   "(SW thermal), 0x40 (HW thermal) or 0x80 (power brake); or its SM clock stayed "
                                   "more than 10 % below its start value for at least 1 s of non-idle readings; or "
                                   "it listed a compute process outside the server's process group; or it held "
                                   "memory, or was busy, beyond what its listed processes explain. 0x4 (software "
                                   "power cap) and 0x1 (idle) are normal and only recorded", ""),
    )),
    ("Load client (its own headroom over the window)", (
        Entry("client processes", "load-client processes that sent the requests", "processes", "",
              ("client_processes",)),
        Entry("client CPU (busiest process)", "CPU seconds / window seconds of the busiest client process; above "
                                              f"{CLIENT_MAX_CORE_SHARE:.0%} of one core the run is marked "
                                              "client_saturated", "fraction of one core", "",
              ("client_max_core_share",)),
        Entry("client event-loop lag", "how late a timer due every 5 ms ran (worst process); p99 above "
                                       f"{CLIENT_MAX_LOOP_LAG_P99_MS:g} ms marks the run client_saturated",
              "ms", "", ("client_loop_lag_p99_ms", "client_loop_lag_max_ms")),
        Entry("client longest stall", "the longest time a client process ran nothing (its largest event-loop lag "
                                      f"sample); above {CLIENT_MAX_STALL_MS:g} ms the run is marked client_stalled",
              "ms", "", ("client_stall_max_ms",)),
        Entry("client stalled share", f"share of the window a client process spent in stalls of at least "
                                      f"{STALL_MIN_MS:g} ms (worst process); above {CLIENT_MAX_STALLED_SHARE:.0%} "
                                      "the run is marked client_stalled", "fraction", "", ("client_stalled_share",)),
        Entry("client read delay", "how long received bytes waited in the socket before the client read them: "
                                   "read time minus the kernel's receive stamp, p99 over reads (worst process); the "
                                   "stamps themselves are the kernel's, so this delay does not move them",
              "ms", "", ("client_read_delay_p99_ms",)),
        Entry("reads stamped by the kernel", "share of reads whose messages carry the kernel's receive time "
                                             "(SO_TIMESTAMPNS); the others are stamped when Python read them",
              "fraction", "", ("client_kernel_stamped_share",)),
        Entry("GPU sampler gaps", "the telemetry sampler's longest interval without a reading inside the window "
                                  "(its edges included), and the share of the window in intervals longer than two "
                                  f"sampling periods; above {TELEMETRY_MAX_GAP_MS:g} ms or "
                                  f"{TELEMETRY_MAX_GAP_SHARE:.0%} the run is marked suspect (telemetry_gap)",
              "ms, fraction", "", ("telemetry_gap_max_ms", "telemetry_gap_share")),
    )),
    ("Lossless check (docs/LOSSLESS.md)", (
        Entry("identical share", "share of a speculative run's requests whose output (token ids, else text) equals "
                                 "the output of a matched auto run for the same prompt (same engine build, model, "
                                 "GPUs, TP and workload, temperature 0, same seed; requests paired by prompt hash)",
              "fraction", "output"),
        Entry("first divergence", "for a request whose output differs: the first position where it differs from "
                                  "the closest auto output; exact where both runs kept the output whole (the first "
                                  "32 prompts), else to the block of 64 tokens (256 characters on text); the run "
                                  "shows the median", "tokens (characters on text)", "output"),
        Entry("AR noise floor", "auto runs that differ only where numerics may change (repeats, another concurrency "
                                "or request rate) compared pairwise: the smallest identical share over the pairs, "
                                "i.e. the largest rate q at which AR differs from AR", "fraction", "output"),
        Entry("lossless verdict", "lossless: no divergence, or no more than AR's own rate explains; differs beyond "
                                  f"the AR noise floor ({MARK}): with n requests compared and d diverged, the "
                                  f"one-sided binomial tail P(X >= d | n, q) < {ALPHA:g} (with q = 0 any "
                                  f"divergence); differs ({MARK}): divergence but no floor to judge it; not checked: "
                                  "sampling (temperature > 0), no matched auto run, outputs not kept, an imported "
                                  "file, synthetic acceptance (not lossless by design)", ""),
    )),
    ("Speedups and verdicts (docs/VERDICTS.md)", (
        Entry("decode speedup", "median TPOT of the matched baseline runs / median TPOT of the configuration's "
                                "runs (decode-only: TTFT left out); equal by construction to tau / relative step "
                                "cost, so the decomposition and the heatmap show one number", "x", "output"),
        Entry("end-to-end speedup", "output tok/s of the configuration / that of the matched baseline (medians "
                                    "over repeats; what a batch job sees: includes TTFT and scheduling)", "x",
              "output"),
        Entry("relative step cost", "TPOT x tau / baseline TPOT: the cost of one decoding step relative to an "
                                    "autoregressive step (over medians: tau / decode speedup)", "x", "output"),
        Entry("speedup shown", "the page's `speedup` choice: decode speedup at concurrency 1 and end-to-end above "
                               "it (default), or one of them everywhere; where the two differ by more than "
                               f"{DIFFER_SHARE:.0%} the cell says TTFT moved", ""),
        Entry("winner", f"with >= {MIN_REPEATS_FOR_CI} repeats on each side, the fastest configuration whose 95 % "
                        "bootstrap interval lies above the runner-up's interval (the baseline itself included); "
                        "a winner not shown lossless keeps its mark", ""),
        Entry("tie within noise", "the fastest configuration's interval overlaps another's: both are named as "
                                  "tied, no winner", ""),
        Entry("single runs: no verdict", f"fewer than {MIN_REPEATS_FOR_CI} repeats: no interval, so the headline "
                                         "names no winner and shows the ranking greyed", ""),
        Entry("excluded", "a point whose figures are degenerate never feeds a headline, verdict or the "
                          f"decomposition: median TPOT 0 ms, a window shorter than {MIN_WINDOW_S:g} s, fewer than "
                          f"{MIN_COMPLETED_REQUESTS} completed requests, or a suspect mark that invalidates timing "
                          f"({', '.join(sorted(EXCLUDING_MARKS))}); drawn hollow with the reason, counted in the "
                          "page's excluded line", ""),
    )),
)


def covered_fields() -> set[str]:
    """Every metric-schema field some glossary entry defines."""
    return {f for _, entries in SECTIONS for e in entries for f in e.fields}
