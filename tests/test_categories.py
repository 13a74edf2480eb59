"""Per-category figures (issue 33): each request keeps its category through the log blob (format
2, old blobs still decode), and `category_figures` equals a hand computation from the logs."""

from __future__ import annotations

import pytest

from benchkit.measure.categories import category_figures, per_position
from benchkit.measure.logs import (
    MessageEvent,
    RequestLog,
    columns_of,
    decode_columns,
    decode_logs,
    encode_logs,
    encode_logs_v1,
)

MS = 1_000_000


def log(i, cat, send_ms, times_ms, tokens, spec=None, warmup=False, ok=True):
    """A request sent at `send_ms` whose messages arrive at `times_ms` carrying `tokens`."""
    steps, acc, hist = spec or (None, None, None)
    return RequestLog(index=i, warmup=warmup, send_ns=send_ms * MS, ok=ok, error="" if ok else "http 500",
                      events=[MessageEvent(t * MS, n) for t, n in zip(times_ms, tokens, strict=True)],
                      completion_tokens=sum(tokens) if ok else None, input_len=10, output_len=9,
                      end_ns=times_ms[-1] * MS if times_ms else send_ms * MS,
                      spec_steps=steps, spec_accepted_tokens=acc, spec_histogram=hist, category=cat)


def run_logs():
    return [
        log(0, "code", 0, [5, 6], [1, 1], warmup=True),
        # code: two requests with per-request spec figures
        log(1, "code", 100, [110, 120, 130], [1, 3, 3], spec=(3, 4, [0, 2, 1])),     # TTFT 10, TPOT 20/6
        log(2, "code", 100, [130, 150], [1, 4], spec=(2, 3, [0, 1, 1])),             # TTFT 30, TPOT 20/4
        # prose: three requests, one failed, no spec figures
        log(3, "prose", 200, [220, 230, 240, 250], [1, 1, 1, 1]),                   # TTFT 20, TPOT 30/3
        log(4, "prose", 200, [240, 260], [1, 1]),                                   # TTFT 40, TPOT 20
        log(5, "prose", 200, [], [], ok=False),
    ]


def test_blob_keeps_categories_and_old_blobs_decode():
    logs = run_logs()
    blob = encode_logs(logs)
    assert decode_logs(blob) == logs
    assert decode_columns(blob).category_names() == [x.category for x in logs]
    assert decode_logs(encode_logs_v1(logs)) == logs
    plain = [log(i, "", 0, [1], [1]) for i in range(3)]
    assert decode_columns(encode_logs(plain)).category is None  # no categories: header unchanged
    assert [x.category for x in decode_logs(encode_logs(plain))] == ["", "", ""]


def test_per_position():
    assert per_position([0, 3, 1]) == [1.0, 0.25]
    assert per_position(None) is None and per_position([0, 0]) is None


@pytest.mark.parametrize("as_columns", [False, True])
def test_category_figures_equal_hand_computation(as_columns):
    logs = run_logs()
    start, end = 100 * MS, 1100 * MS  # a 1 s window
    figs = category_figures(columns_of(logs) if as_columns else logs, start, end)
    code, prose = figs
    assert (code.category, code.requests, code.completed, code.failed) == ("code", 2, 2, 0)
    assert code.median_ttft_ms == pytest.approx(20.0)                   # (10 + 30) / 2
    assert code.median_tpot_ms == pytest.approx((20 / 6 + 20 / 4) / 2)
    # ITL, one sample per token after each request's first message: 10/3 x3, 10/3 x3, 20/4 x4
    assert code.median_itl_ms == pytest.approx(10 / 3)
    assert code.output_tokens == 12 and code.output_throughput_tok_s == pytest.approx(12.0)
    assert code.output_share == pytest.approx(12 / 18)
    assert code.tau_request_weighted == pytest.approx(((1 + 4 / 3) + (1 + 3 / 2)) / 2)
    assert code.tau_token_weighted == pytest.approx(1 + 7 / 5)
    assert code.spec_requests == 2
    assert code.acceptance_per_position == pytest.approx([5 / 5, 2 / 5])  # summed histogram [0, 3, 2]
    assert code.mean_decode_tokens_per_chunk == pytest.approx(10 / 3)
    assert (prose.category, prose.requests, prose.completed, prose.failed) == ("prose", 3, 2, 1)
    assert prose.median_ttft_ms == pytest.approx(30.0)
    assert prose.median_tpot_ms == pytest.approx((10 + 20) / 2)
    assert prose.median_itl_ms == pytest.approx(10.0)                   # samples 10, 10, 10, 20
    assert prose.output_tokens == 6 and prose.output_share == pytest.approx(6 / 18)
    assert prose.tau_request_weighted is None and prose.acceptance_per_position is None and prose.spec_requests == 0


def test_uncategorized_run_is_one_category():
    logs = [log(i, "", 0, [10, 20], [1, 1]) for i in range(2)]
    (only,) = category_figures(logs, 0, 1000 * MS)
    assert only.category == "" and only.requests == 2 and only.output_share == 1.0


@pytest.mark.parametrize("processes", [1, 2])
def test_load_client_carries_each_prompts_category(processes):
    from benchkit.measure.loadgen import run_load_sync
    from benchkit.measure.workloads import Prompt
    from benchkit.specs import WorkloadSpec
    from tests.synthetic_server import SyntheticServer

    ps = [Prompt(f"prompt {i}", 3, 4, category=("code", "prose")[i % 2]) for i in range(6)]
    wl = WorkloadSpec(num_prompts=4, concurrency=2, output_len=4)
    with SyntheticServer() as url:
        res = run_load_sync(url, "synthetic", wl, prompts=ps, processes=processes)
    assert {x.index: x.category for x in res.logs} == {i: p.category for i, p in enumerate(ps)}
    assert [f.category for f in category_figures(res.logs, res.window_start_ns, res.window_end_ns)] == ["code", "prose"]
