"""Issue 2 integration: a sweep through a real Celery worker (subprocess), a real Redis and a
real vLLM CPU server, then the stored runs, metrics and spec-decode counters. Two server
configurations (auto, draft_model k=3) at concurrency 1 and 2: four runs, two server starts
(runs differing only in concurrency share one)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from benchkit.measure.logs import decode_logs
from runs import localstack
from runs.models import Run, RunState, RunTransition
from runs.services.hosts import record_inventory
from runs.services.sweeps import create_sweep, get_or_create_host
from tests.realserver import tiny_sweep, vllm_server_pids

pytestmark = [pytest.mark.vllm, pytest.mark.celery, pytest.mark.django_db(transaction=True)]
REPO = Path(__file__).resolve().parents[1]


def _test_database_url() -> str:
    s = connection.settings_dict
    if s["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{s['NAME']}"
    return f"postgres://{s['USER']}:{s['PASSWORD'] or ''}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


@contextlib.contextmanager
def running_worker(tmp_path: Path, host_name: str | None = None):
    """A real `celery worker` process consuming the queue of `host_name` (a fresh one when None);
    yields (host_name, log path) and stops the whole process group on exit. The worker reaps its
    host's lost active runs when it starts (runs.worker), so store in-flight synthetic runs of
    that host only after it is up, or finish them before."""
    was_up = localstack.ping(settings.CELERY_BROKER_URL)
    broker = localstack.ensure_redis(settings.CELERY_BROKER_URL, Path(settings.VAR_DIR))
    host_name = host_name or f"ci-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "DATABASE_URL": _test_database_url(), "CELERY_BROKER_URL": broker,
           "DRAFTBOARD_HOST": host_name, "DRAFTBOARD_RUNS_DIR": str(tmp_path / "runs")}
    log = open(tmp_path / "worker.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "celery", "-A", "benchsite", "worker", "-Q", f"host.{host_name}",
                             "-c", "1", "--loglevel", "INFO", "-n", f"{host_name}@%h"],
                            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield host_name, tmp_path / "worker.log"
    finally:
        from benchkit.hosts.teardown import stop_process_group

        stop_process_group(proc.pid, term_timeout_s=20)
        proc.wait(timeout=10)
        log.close()
        if not was_up:  # the private Redis this test started
            localstack.stop_redis(Path(settings.VAR_DIR))


@pytest.fixture
def worker(tmp_path):
    """A real `celery worker` process consuming a fresh host queue; stopped (whole group) after."""
    with running_worker(tmp_path) as started:
        yield started


def test_two_run_sweep_through_celery(worker, demo_models):
    host_name, worker_log = worker
    host = get_or_create_host(host_name)
    record_inventory(host)
    spec = tiny_sweep(demo_models, "ci shared", ["auto", {"method": "draft_model", "num_speculative_tokens": 3}],
                      concurrency=[1, 2])
    sweep = create_sweep(spec, host, source="test", enqueue=True)
    runs = list(Run.objects.filter(sweep=sweep))
    assert len(runs) == 4

    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        states = set(Run.objects.filter(sweep=sweep).values_list("state", flat=True))
        if states <= {RunState.SUCCEEDED, RunState.FAILED}:
            break
        time.sleep(2)
    all_runs = list(Run.objects.filter(sweep=sweep).select_related("metrics").order_by("id"))
    for r in all_runs:
        assert r.state == RunState.SUCCEEDED, (r.failure_reason, r.failure_message, worker_log.read_text()[-3000:])
        assert list(RunTransition.objects.filter(run=r).values_list("from_state", "to_state")) == [
            ("new", "queued"), ("queued", "preflight"), ("preflight", "starting"), ("starting", "warming"),
            ("warming", "measuring"), ("measuring", "stopping"), ("stopping", "succeeded")]
        assert r.server_shared
    # the concurrency-2 run of each configuration reused the server of the concurrency-1 run
    for first, second in (all_runs[0:2], all_runs[2:4]):
        assert (first.method, first.concurrency, second.method, second.concurrency) == (
            first.method, 1, first.method, 2)
        assert first.argv == second.argv
        assert RunTransition.objects.get(run=second, to_state="starting").note == "server already running"
    runs = {r.method: r for r in all_runs if r.concurrency == 2}
    for r in runs.values():
        m = r.metrics
        assert (m.completed, m.failed) == (8, 0)
        assert m.total_output_tokens == 8 * 32  # ignore_eos: every request ran its full length
        assert m.output_throughput_tok_s > 0 and m.median_ttft_ms > 0
        assert r.argv[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
        assert r.engine_version == "0.32.0"
        assert r.is_demo_model

    auto, spec_run = runs["auto"], runs["draft_model"]
    assert auto.metrics.acceptance_length is None  # no drafts without speculation
    sd = spec_run.metrics
    assert sd.spec_num_drafts > 0 and sd.spec_num_draft_tokens == 3 * sd.spec_num_drafts and sd.spec_source == "vllm"
    assert sd.acceptance_length == pytest.approx(1 + sd.spec_num_accepted_tokens / sd.spec_num_drafts)
    assert sd.acceptance_rate == pytest.approx(sd.spec_num_accepted_tokens / sd.spec_num_draft_tokens)
    # counters are deltas over this run's own window, not the shared server's lifetime: the
    # window's decode tokens (all but each request's first) per draft step come out at tau
    decode_tokens = spec_run.metrics.total_output_tokens - 8
    assert decode_tokens / sd.spec_num_drafts == pytest.approx(spec_run.metrics.acceptance_length, rel=0.15)
    # the client's tokens per streamed decode chunk agrees with the server's tau (MEASUREMENT.md
    # cross-check; each request's first chunk is the prefill token and is left out)
    logs = [r for r in decode_logs(bytes(spec_run.request_logs.data)) if not r.warmup]
    chunks = [e.tokens for r in logs for e in r.events if e.tokens > 0][1:]
    per_request = [[e.tokens for e in r.events if e.tokens > 0][1:] for r in logs]
    decode_chunks = [t for req in per_request for t in req]
    assert len(chunks) > len(decode_chunks)
    assert sum(decode_chunks) / len(decode_chunks) == pytest.approx(spec_run.metrics.acceptance_length, rel=0.15)
    # no cross-check disagreement; a `client_saturated` mark may appear on this 2-core machine, where
    # the vLLM CPU server at times keeps the client process off the CPU for 40-150 ms (seen with a
    # separate probe thread stalled at the same moments) and the mark says so honestly
    assert not [r for r in spec_run.suspect_reasons if not r.startswith("client_saturated: ")], spec_run.suspect_reasons
    assert vllm_server_pids(demo_models.target) == []
