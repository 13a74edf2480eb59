"""Speculative-decoding counters: parsing real vLLM /metrics text, deltas, cross-check, scraping.

The fixtures `vllm-metrics-specdecode-before.txt` / `vllm-metrics-specdecode.txt` are a real
vLLM 0.32 CPU server's /metrics page (trimmed to a few families) before and after three
completions with `--speculative-config '{"method":"draft_model",...,"num_speculative_tokens":3}'`.
Expected values are read from the fixture lines by a separate, plain line parser.
"""

from __future__ import annotations

import os
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from benchkit.engines.adapters import counters_from_text
from benchkit.engines.kinds import vllm as vk
from benchkit.measure import counters as pc

FIXTURES = Path(__file__).parent / "fixtures" / "results"
AFTER = FIXTURES / "vllm-metrics-specdecode.txt"
BEFORE = FIXTURES / "vllm-metrics-specdecode-before.txt"


def plain_sum(text: str, name: str, **labels: str) -> float:
    """Sum of the samples named exactly `name` whose labels include `labels` (independent oracle)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name + "{"):
            continue
        head, value = line.rsplit(" ", 1)
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def test_real_vllm_page_sums_total_samples_and_ignores_created():
    text = AFTER.read_text()
    c = counters_from_text(text, "vllm")
    assert c.source == "vllm"
    assert c.num_drafts == plain_sum(text, vk.NUM_DRAFTS) > 0
    assert c.num_draft_tokens == plain_sum(text, vk.NUM_DRAFT_TOKENS)
    assert c.num_accepted_tokens == plain_sum(text, vk.NUM_ACCEPTED)
    positions = sorted(c.accepted_per_pos)
    assert positions == [0, 1, 2]  # num_speculative_tokens = 3
    for k in positions:
        assert c.accepted_per_pos[k] == plain_sum(text, vk.ACCEPTED_PER_POS, position=str(k))
    # the `_created` timestamps (about 1.8e9) must not leak into the sums or raw
    assert not any(key.split("{")[0].endswith("_created") for key in c.raw)
    assert c.num_drafts < plain_sum(text, "vllm:spec_decode_num_drafts_created")


def test_auto_detects_vllm_and_to_dict_round_trips():
    c = counters_from_text(AFTER.read_text())
    assert c.source == "vllm"
    assert pc.SpecCounters.from_dict(c.to_dict()) == c


def test_real_before_after_give_window_deltas():
    before_text, after_text = BEFORE.read_text(), AFTER.read_text()
    sd = pc.spec_decode_metrics(counters_from_text(before_text), counters_from_text(after_text))
    assert sd is not None

    def delta(name: str, **labels: str) -> float:
        return plain_sum(after_text, name, **labels) - plain_sum(before_text, name, **labels)

    d_drafts = delta(vk.NUM_DRAFTS)
    d_tokens = delta(vk.NUM_DRAFT_TOKENS)
    d_acc = delta(vk.NUM_ACCEPTED)
    assert sd.num_drafts == d_drafts
    assert sd.acceptance_rate == pytest.approx(d_acc / d_tokens)
    assert sd.acceptance_length == pytest.approx(1 + d_acc / d_drafts)
    assert sd.per_position_acceptance_rate == pytest.approx(
        [delta(vk.ACCEPTED_PER_POS, position=str(k)) / d_drafts for k in range(3)]
    )
    flat = sd.to_flat()
    assert flat["acceptance_length"] == sd.acceptance_length and flat["spec_source"] == "vllm"


MULTI_ENGINE = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 30.0
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 40.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="m"} 120.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 25.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="m"} 55.0
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 9.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="0"} 21.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 7.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="1"} 13.0
"""


def test_counters_are_summed_over_engines_and_positions_kept_apart():
    c = counters_from_text(MULTI_ENGINE)
    assert (c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens) == (40.0, 160.0, 80.0)
    assert c.accepted_per_pos == {0: 30.0, 1: 20.0}
    zero = pc.SpecCounters(num_drafts=0.0, num_draft_tokens=0.0, num_accepted_tokens=0.0, source="vllm")
    sd = pc.spec_decode_metrics(zero, c)
    assert sd.acceptance_rate == pytest.approx(0.5)
    assert sd.acceptance_length == pytest.approx(3.0)
    assert sd.per_position_acceptance_rate == pytest.approx([0.75, 0.5])


def test_no_drafts_in_window_or_no_counters_gives_none():
    c = counters_from_text(AFTER.read_text())
    assert pc.spec_decode_metrics(c, c) is None  # nothing happened between the readings
    plain = counters_from_text("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0.0\n")
    assert plain.source == "none" and plain.num_drafts == 0
    assert pc.spec_decode_metrics(plain, plain) is None
    assert pc.spec_decode_metrics(None, c) is None


def test_counter_going_down_is_a_restart():
    c = counters_from_text(AFTER.read_text())
    zero = counters_from_text(BEFORE.read_text())
    with pytest.raises(pc.CounterResetError, match=r"spec_decode_num_accepted_tokens_per_pos_total.*went down") as exc:
        pc.spec_decode_metrics(c, zero)
    assert exc.value.code == "counters_restarted"


def test_created_samples_and_process_start_are_kept_apart_from_the_sums():
    c = counters_from_text(AFTER.read_text())
    text = AFTER.read_text()
    key = next(k for k in c.created if k.startswith(vk.NUM_DRAFTS))
    assert c.created[key] == plain_sum(text, "vllm:spec_decode_num_drafts_created")
    assert c.process_start_time_s is None  # the trimmed fixture has no process collector
    page = RESTART_PAGE.format(drafts=1, tokens=3, accepted=1, p0=1, p1=0, p2=0, created=100.0, start=50.0)
    parsed = counters_from_text(page)
    assert parsed.process_start_time_s == 50.0 and set(parsed.created.values()) == {100.0}
    assert pc.SpecCounters.from_dict(parsed.to_dict()) == parsed


# The failing input of issue 13: before, drafts 500 / draft tokens 1500 / accepted 300 from a
# process created at T; after, 1200 / 3600 / 2400 from a new process (created T + 3600). Naive
# deltas give acceptance rate 1.0 and tau 4.0 (true window: 0.667 and 3.0), per-position rates
# 1.14 / 1.03 / 0.83.
RESTART_PAGE = """\
# TYPE process_start_time_seconds gauge
process_start_time_seconds {start}
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {drafts}
vllm:spec_decode_num_drafts_created{{engine="0",model_name="m"}} {created}
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {tokens}
vllm:spec_decode_num_draft_tokens_created{{engine="0",model_name="m"}} {created}
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {accepted}
vllm:spec_decode_num_accepted_tokens_created{{engine="0",model_name="m"}} {created}
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="0"}} {p0}
vllm:spec_decode_num_accepted_tokens_per_pos_created{{engine="0",model_name="m",position="0"}} {created}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="1"}} {p1}
vllm:spec_decode_num_accepted_tokens_per_pos_created{{engine="0",model_name="m",position="1"}} {created}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="2"}} {p2}
vllm:spec_decode_num_accepted_tokens_per_pos_created{{engine="0",model_name="m",position="2"}} {created}
"""
T = 1_796_015_824.0


def restart_pages(created_after: float = T + 3600, start_after: float = T + 3590):
    before = RESTART_PAGE.format(drafts=500, tokens=1500, accepted=300, p0=102, p1=79, p2=119,
                                 created=T, start=T - 10)
    after = RESTART_PAGE.format(drafts=1200, tokens=3600, accepted=2400, p0=900, p1=800, p2=700,
                                created=created_after, start=start_after)
    return counters_from_text(before), counters_from_text(after)


def test_issue_13_restart_seen_from_created_and_process_start():
    before, after = restart_pages()
    with pytest.raises(pc.CounterResetError, match="process_start_time_seconds moved") as exc:
        pc.spec_decode_metrics(before, after, max_accepted=3)
    assert exc.value.code == "counters_restarted"
    # the process collector missing (or unchanged, e.g. an API server in front of a restarted
    # engine core): the counters' own _created samples still show the restart
    before.process_start_time_s = after.process_start_time_s = None
    with pytest.raises(pc.CounterResetError, match="re-created"):
        pc.spec_decode_metrics(before, after, max_accepted=3)


def test_issue_13_deltas_out_of_bounds_give_no_figures():
    # same numbers, no restart signal at all (no _created, no process start): the per-position
    # rates 798/700 = 1.14 and 721/700 = 1.03 are impossible
    before, after = restart_pages(created_after=T, start_after=T - 10)
    problem = r"per-position rate\(s\) outside \[0, 1\] \(0: 1.140, 1: 1.030\)"
    with pytest.raises(pc.AcceptanceBoundsError, match=problem) as exc:
        pc.spec_decode_metrics(before, after, max_accepted=3)
    assert exc.value.code == "acceptance_out_of_bounds"


@pytest.mark.parametrize(
    ("d_drafts", "d_tokens", "d_accepted", "bound", "problem"),
    [
        (100, 300, 200, 3, None),  # tau 3.0, rate 0.667
        (100, 300, 300, 3, None),  # tau 4.0 = 1 + k: every draft fully accepted
        (100, 300, 301, 3, "acceptance rate 1.003 outside"),
        (100, 300, 250, 2, "tau 3.500 outside \\[1, 3\\]"),  # k = 2 allows at most 3
        (100, 300, -5, 3, "accepted tokens went negative"),
    ],
)
def test_rates_and_tau_are_bounded(d_drafts, d_tokens, d_accepted, bound, problem):
    zero = pc.SpecCounters(num_drafts=0.0, num_draft_tokens=0.0, num_accepted_tokens=10.0, source="vllm")
    after = pc.SpecCounters(num_drafts=d_drafts, num_draft_tokens=d_tokens, num_accepted_tokens=10.0 + d_accepted,
                            source="vllm")
    if problem is None:
        sd = pc.spec_decode_metrics(zero, after, max_accepted=bound)
        assert sd.acceptance_length == pytest.approx(1 + d_accepted / d_drafts)
    else:
        with pytest.raises(pc.AcceptanceBoundsError, match=problem):
            pc.spec_decode_metrics(zero, after, max_accepted=bound)


def test_max_accepted_per_step():
    assert pc.max_accepted_per_step("draft_model", 4, None) == 4
    assert pc.max_accepted_per_step("ddtree", None, 15) == 15  # B nodes: at most a chain of B
    assert pc.max_accepted_per_step("ddtree", 15, 64) == 15  # no path deeper than the block
    assert pc.max_accepted_per_step("ngram", None, None) is None
    assert pc.max_accepted_per_step("auto", 4, None) is None


# SGLang: shaped like metrics_collector.py's output (counters with _total, labels model_name /
# engine_type / tp_rank). Ground truth: request A had 10 verify passes and 20 accepted draft
# tokens (n = 1 + 10 + 20 = 31), request B 5 passes and 5 accepted (n = 11).
SGLANG_PAGE = """\
# HELP sglang:spec_accept_length The average acceptance length of speculative decoding.
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{engine_type="unified",model_name="m",tp_rank="0"} 2.9
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="m"} {gen}
# HELP sglang:num_requests_total Number of requests processed.
# TYPE sglang:num_requests_total counter
sglang:num_requests_total{model_name="m"} {req}
# HELP sglang:spec_verify_calls_total Number of speculative decoding verification calls.
# TYPE sglang:spec_verify_calls_total counter
sglang:spec_verify_calls_total{model_name="m"} {ver}
"""


def sglang_page(gen: int, req: int, ver: int) -> str:
    return SGLANG_PAGE.replace("{gen}", f"{gen}.0").replace("{req}", f"{req}.0").replace("{ver}", f"{ver}.0")


def test_sglang_counters_give_tau_from_verify_calls():
    before = counters_from_text(sglang_page(0, 0, 0), "sglang")
    after = counters_from_text(sglang_page(31 + 11, 2, 15))
    assert after.source == "sglang" and after.num_draft_tokens is None
    sd = pc.spec_decode_metrics(before, after)
    assert sd.num_drafts == 15
    assert sd.num_accepted_tokens == 25
    assert sd.acceptance_length == pytest.approx(1 + 25 / 15)
    assert sd.acceptance_rate is None and sd.per_position_acceptance_rate == []
    assert any(k.startswith("sglang:spec_accept_length") for k in after.raw)  # gauge kept for reference


def test_sglang_restart_and_bounds():
    before = counters_from_text(sglang_page(31 + 11, 2, 15))
    # a restarted server that already counted past the first reading: only _created shows it
    text = sglang_page(100, 5, 40)
    created = "".join(f'{n}_created{{model_name="m"}} {T + 60}\n' for n in (
        "sglang:generation_tokens", "sglang:num_requests", "sglang:spec_verify_calls"))
    with_created_before = sglang_page(31 + 11, 2, 15) + "".join(
        f'{n}_created{{model_name="m"}} {T}\n' for n in (
            "sglang:generation_tokens", "sglang:num_requests", "sglang:spec_verify_calls"))
    with pytest.raises(pc.CounterResetError, match="re-created"):
        pc.spec_decode_metrics(counters_from_text(with_created_before), counters_from_text(text + created))
    with pytest.raises(pc.CounterResetError, match="went down"):
        pc.spec_decode_metrics(before, counters_from_text(sglang_page(20, 1, 16)))
    # more requests than tokens generated beyond the verify passes: negative accepted tokens
    with pytest.raises(pc.AcceptanceBoundsError, match="accepted tokens went negative"):
        pc.spec_decode_metrics(before, counters_from_text(sglang_page(31 + 11 + 20, 2 + 10, 15 + 15)))
    # tau beyond the chain length k = 3: 25 accepted in 5 verify passes is 6 per pass
    with pytest.raises(pc.AcceptanceBoundsError, match="tau 6.000"):
        pc.spec_decode_metrics(before, counters_from_text(sglang_page(31 + 11 + 31, 2 + 1, 15 + 5)), 3)


def test_sglang_gauges_only_give_no_counters():
    text = SGLANG_PAGE.split("# HELP sglang:generation_tokens_total")[0]
    c = counters_from_text(text)
    assert c.source == "none"
    assert pc.spec_decode_metrics(c, c) is None


def test_bad_text_and_bad_arguments_are_named():
    with pytest.raises(pc.ScrapeError, match="cannot parse"):
        counters_from_text('vllm:spec_decode_num_drafts_total{engine="0"} not-a-number\n')
    with pytest.raises(pc.ScrapeError, match="position"):
        counters_from_text('vllm:spec_decode_num_accepted_tokens_per_pos_total{position="x"} 1.0\n')
    with pytest.raises(ValueError, match="unknown engine"):
        counters_from_text("", "trtllm")


@pytest.mark.parametrize(
    ("tau", "chunk", "ratio", "n_messages"),
    [
        (3.0, 3.0, 3.0, 0),
        (3.0, 3.4, 2.6, 0),  # both within 15 %
        (3.0, 3.5, 3.0, 1),  # tokens per chunk 16.7 % off
        (3.0, 3.0, 2.0, 1),  # ICL / TPOT 33 % off
        (3.0, 1.0, 6.0, 2),
        (3.0, None, None, 0),  # nothing to compare
        (None, 1.0, 9.0, 0),  # no tau (autoregressive)
    ],
)
def test_cross_check(tau, chunk, ratio, n_messages):
    messages = pc.cross_check(tau, chunk, ratio)
    assert len(messages) == n_messages
    for m in messages:
        assert "tau" in m and "%" in m


def test_cross_check_tolerance_is_a_parameter():
    assert pc.cross_check(2.0, 2.5, None) != []
    assert pc.cross_check(2.0, 2.5, None, tolerance=0.3) == []


class _MetricsHandler(BaseHTTPRequestHandler):
    body = b""

    def do_GET(self):  # noqa: N802 (http.server API)
        if self.path == "/metrics":
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(self.body)))
            self.end_headers()
            self.wfile.write(self.body)
        else:
            self.send_response(404)
            self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture()
def metrics_server():
    _MetricsHandler.body = AFTER.read_bytes()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _MetricsHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_scrape_over_http(metrics_server):
    c = vk.Vllm().scrape_counters(f"{metrics_server}/metrics")
    assert c == counters_from_text(AFTER.read_text()) == counters_from_text(AFTER.read_text(), "vllm")
    assert c.source == "vllm" and c.num_drafts > 0


def test_scrape_errors_name_the_url(metrics_server):
    with pytest.raises(pc.ScrapeError, match=r"/nometrics answered HTTP 404"):
        pc.fetch_metrics_text(f"{metrics_server}/nometrics")
    port = metrics_server.rsplit(":", 1)[1]
    # a port nothing listens on: take one from a closed socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    free = s.getsockname()[1]
    s.close()
    assert str(free) != port
    with pytest.raises(pc.ScrapeError, match=f"127.0.0.1:{free}/metrics"):
        pc.fetch_metrics_text(f"http://127.0.0.1:{free}/metrics", timeout_s=2.0)


@pytest.mark.vllm
def test_real_vllm_server_counters_move(demo_models, tmp_path):
    """A real vLLM CPU server with a draft model: counters are read before and after real
    completions and give a consistent window (invariants only: the demo weights are random)."""
    import sys

    from benchkit.engines.server import ManagedServer

    port = int(os.environ.get("DRAFTBOARD_TEST_VLLM_PORT", "8199"))
    k = 3
    argv = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(demo_models.target), "--load-format", "dummy", "--dtype", "float32",
        "--max-model-len", "512", "--port", str(port), "--host", "127.0.0.1",
        "--speculative-config",
        f'{{"method":"draft_model","model":"{demo_models.draft}","num_speculative_tokens":{k}}}',
    ]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    base = f"http://127.0.0.1:{port}"
    with ManagedServer(argv, env, tmp_path / "vllm.log") as server:
        server.wait_ready([f"{base}/health", f"{base}/v1/models"], timeout_s=600)
        before = vk.Vllm().scrape_counters(f"{base}/metrics")
        total = 0
        for prompt in ("def f(x):", "import os\n"):
            r = httpx.post(f"{base}/v1/completions", timeout=120, json={
                "model": str(demo_models.target), "prompt": prompt, "max_tokens": 32,
                "ignore_eos": True, "temperature": 0})
            r.raise_for_status()
            total += r.json()["usage"]["completion_tokens"]
        after = vk.Vllm().scrape_counters(f"{base}/metrics")
    assert server.teardown is not None and server.teardown.clean
    assert before.source == after.source == "vllm"
    sd = pc.spec_decode_metrics(before, after)
    assert sd is not None and sd.num_drafts > 0
    assert sd.num_drafts <= total  # at most one draft step per output token
    assert sd.num_drafts <= sd.num_draft_tokens <= k * sd.num_drafts
    assert 0.0 <= sd.acceptance_rate <= 1.0
    assert 1.0 <= sd.acceptance_length <= 1 + k
    rates = sd.per_position_acceptance_rate
    assert len(rates) == k
    assert all(a >= b for a, b in zip(rates, rates[1:], strict=False))  # position k accepted only after k-1
