"""Issue 2: a vLLM server killed mid-run leaves the run `failed` with a reason, no metrics
counted, and no process of that server behind."""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest

from runs.models import Run, RunMetrics, RunState
from runs.services import execution
from runs.services.sweeps import create_sweep, get_or_create_host
from tests.realserver import tiny_sweep, vllm_server_pids

pytestmark = [pytest.mark.vllm, pytest.mark.django_db(transaction=True)]


def test_server_killed_mid_run_fails_cleanly(demo_models, settings, tmp_path):
    settings.DRAFTBOARD_RUNS_DIR = tmp_path
    host = get_or_create_host("kill-test")
    spec = tiny_sweep(demo_models, "kill", ["auto"], concurrency=2, output_len=1000, num_prompts=40)
    run = Run.objects.get(sweep=create_sweep(spec, host, source="test", enqueue=False))
    worker = threading.Thread(target=execution.execute, args=(run.pk,))
    worker.start()

    deadline = time.monotonic() + 600
    while Run.objects.get(pk=run.pk).state != RunState.MEASURING:
        assert time.monotonic() < deadline, "run never reached measuring"
        assert Run.objects.get(pk=run.pk).state != RunState.FAILED, Run.objects.get(pk=run.pk).failure_message
        time.sleep(0.5)
    time.sleep(2)  # let some measured requests stream
    (pid,) = vllm_server_pids(demo_models.target, leaders_only=True)
    group = os.getpgid(pid)
    os.kill(pid, signal.SIGKILL)
    worker.join(timeout=300)
    assert not worker.is_alive()

    run.refresh_from_db()
    assert run.state == RunState.FAILED
    assert run.failure_reason in ("server_died", "metrics_unavailable"), (run.failure_reason, run.failure_message)
    assert "exit" in run.failure_message or "cannot read" in run.failure_message
    assert not RunMetrics.objects.filter(run=run).exists()
    assert run.server_log_tail  # the log tail is kept for diagnosis
    left = [p.pid for p in psutil.process_iter() if _pgid(p.pid) == group and p.status() != psutil.STATUS_ZOMBIE]
    assert left == [], f"processes of the killed server's group remain: {left}"
    assert vllm_server_pids(demo_models.target) == []


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None
