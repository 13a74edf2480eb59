"""Regression detection through a real Celery worker and Redis (no vLLM): when the last run of a
nightly sweep is final, `regressions.runs_finished` (the one call execution makes) queues
`runs.detect_regressions` on the host's queue after commit, and the host's worker stores the
flag of the planted regression."""

from __future__ import annotations

import time
import uuid

import pytest
from django.db import transaction

from runs.models import RegressionFlag, Run
from runs.services import regressions
from tests.nightly import build_nightly_series
from tests.test_e2e_celery import running_worker

pytestmark = [pytest.mark.celery, pytest.mark.django_db(transaction=True)]


def test_last_run_of_a_night_queues_detection_on_the_hosts_worker(tmp_path):
    # The series is stored (every run final) before the host's worker starts: a worker that
    # starts reaps its host's active runs with no live claimer, which the series' runs would be
    # while they are being driven through their states (CI saw exactly that race).
    host_name = f"ci-{uuid.uuid4().hex[:8]}"
    series = build_nightly_series(nights=6, host_name=host_name, detect=False)
    with running_worker(tmp_path, host_name) as (_, worker_log):
        _detect_on_the_worker(series, worker_log)


def _detect_on_the_worker(series, worker_log):
    assert not RegressionFlag.objects.exists()
    last = series.sweeps[-1]
    with transaction.atomic():  # as execution does: the task is sent only after the commit
        sent = regressions.runs_finished(list(Run.objects.filter(sweep=last).values_list("pk", flat=True)))
    assert sent == [last.pk]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not RegressionFlag.objects.exists():
        time.sleep(1)
    flags = list(RegressionFlag.objects.values_list("sweep_id", "label", "tp", "concurrency"))
    assert flags == [(last.pk, "linear", 8, 1)], worker_log.read_text()[-3000:]
    assert "runs.detect_regressions" in worker_log.read_text()
