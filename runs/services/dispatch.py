"""Sending runs to the GPU hosts' workers over the Celery broker.

Services never import the tasks module (dependencies go tasks -> services): runs are sent by
task name with the Celery app Django configured (`celery.current_app`), one message per group
of runs that share a server start.

Each run records when its message was handed to the broker (`Run.sent_at`, written just before
the send, so a send that fails half-way still counts as sent and the reconciler in
runs.services.supervision re-sends it). Messages are acked late and requeued when the worker
process dies (settings: CELERY_TASK_ACKS_LATE, CELERY_TASK_REJECT_ON_WORKER_LOST), so a message
may arrive twice; runs.services.execution claims each run at most once and records the
duplicate in the run's history.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from celery import current_app
from django.utils import timezone
from kombu.exceptions import OperationalError

from benchkit.specs import RunSpec
from benchkit.specs import server_groups as specs_server_groups
from runs.models import Run
from runs.services.leases import total_limit_s

log = logging.getLogger(__name__)

#: The registered name of runs.tasks.execute_runs_task.
EXECUTE_RUNS_TASK = "runs.execute_runs"
#: The registered name of runs.tasks.detect_regressions_task.
DETECT_REGRESSIONS_TASK = "runs.detect_regressions"
#: Regression detection reads a few nights of one series: bounded well below this (seconds).
DETECT_TIME_LIMIT_S = 300
#: The registered name of runs.tasks.check_lossless_task.
CHECK_LOSSLESS_TASK = "runs.check_lossless"
#: The lossless check decodes the output digests of one sweep's runs, a floor at a time (seconds).
LOSSLESS_TIME_LIMIT_S = 600
#: The registered name of runs.tasks.supervise_host_task.
SUPERVISE_TASK = "runs.supervise_host"


class BrokerUnavailable(RuntimeError):
    """The Celery broker does not answer, so runs could not be queued; nothing was stored."""


def check_broker(timeout_s: float = 5.0) -> None:
    """Raise BrokerUnavailable unless the Celery broker accepts a connection within `timeout_s`."""
    url = current_app.conf.broker_url
    try:
        with current_app.connection_for_write(url) as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, timeout=timeout_s)
    except Exception as exc:  # kombu raises OperationalError, OSError, or its own errors
        raise BrokerUnavailable(f"the Celery broker {url} does not answer ({exc}); start it (`make demo` starts a "
                                "private Redis) or store the sweep without queueing it (--no-enqueue)") from None


def server_groups(runs: list[Run], share_server: bool = True) -> list[list[int]]:
    """Run ids grouped for execution: consecutive runs (in id order, which is the sweep's
    expansion order) with the same `RunSpec.server_key()` share one server start when
    `share_server`; otherwise every run is its own group."""
    ordered = sorted(runs, key=lambda r: r.pk)
    groups = specs_server_groups([RunSpec.from_dict(r.spec) for r in ordered], share_server)
    return [[ordered[i].pk for i in group] for group in groups]


def enqueue_runs(run_ids: list[int], queue: str, share_server: bool = True) -> int:
    """Send the runs to `queue` as execute-runs tasks, one per server group (call only after
    the rows are committed); returns how many tasks were sent. Each task has a soft time limit
    of its runs' summed bound (leases.total_limit_s) and a hard one two minutes later.

    Every run's `sent_at` is written before the first send, so when the broker goes away half-way
    (the send raises after kombu's retries) nothing is lost: the failure is logged, the rest is
    not sent, and the reconciler re-sends what did not arrive once a worker runs again."""
    runs = list(Run.objects.filter(pk__in=run_ids).only("id", "spec"))
    by_id = {r.pk: r for r in runs}
    groups = server_groups(runs, share_server)
    Run.objects.filter(pk__in=run_ids).update(sent_at=timezone.now())
    for n, group in enumerate(groups):
        limit = sum(total_limit_s(RunSpec.from_dict(by_id[i].spec).limits) for i in group)
        try:
            current_app.send_task(EXECUTE_RUNS_TASK, args=[group], queue=queue, soft_time_limit=limit,
                                  time_limit=limit + HARD_LIMIT_GRACE_S)
        except (OperationalError, OSError) as exc:
            log.warning("sent %d of %d run task(s) to %s, then the broker failed (%s); the reconciler re-sends "
                        "the rest", n, len(groups), queue, exc)
            return n
    return len(groups)


#: The hard time limit of a run task is its soft limit plus this (seconds): the soft limit lets
#: the runner stop the server and store a `run_timeout`; the hard one kills the process.
HARD_LIMIT_GRACE_S = 120


def expect_redelivery(run_ids: list[int], delay_s: float) -> None:
    """The runs' task will come back in `delay_s` seconds (a retry while their GPUs are busy):
    set their `sent_at` to that time, so the reconciler does not take them for lost meanwhile."""
    Run.objects.filter(pk__in=run_ids).update(sent_at=timezone.now() + timedelta(seconds=delay_s))


def send_supervise(host_name: str, queue: str, checkpoint: datetime | None = None) -> None:
    """Send the supervise task (runs.services.supervision.supervise) for host `host_name` to
    `queue`; with `checkpoint` it is the reconciler's marker (see supervision.reconcile)."""
    kwargs = {"host_name": host_name}
    if checkpoint is not None:
        kwargs["checkpoint"] = checkpoint.isoformat()
    current_app.send_task(SUPERVISE_TASK, kwargs=kwargs, queue=queue)


def enqueue_detection(sweep_id: int, queue: str) -> None:
    """Send the regression-detection task for sweep `sweep_id` to `queue` (the host's queue, whose
    worker just finished the sweep's last run). Publishing is not retried: a broker that does
    not answer raises at once (kombu's OperationalError or OSError)."""
    current_app.send_task(DETECT_REGRESSIONS_TASK, args=[sweep_id], queue=queue, retry=False,
                          soft_time_limit=DETECT_TIME_LIMIT_S, time_limit=DETECT_TIME_LIMIT_S + 60)


def enqueue_lossless(sweep_id: int, queue: str) -> None:
    """Send the lossless-check task for sweep `sweep_id` to `queue` (the host's queue, whose worker
    just finished the sweep's last run). Publishing is not retried: a broker that does not answer
    raises at once (kombu's OperationalError or OSError)."""
    current_app.send_task(CHECK_LOSSLESS_TASK, args=[sweep_id], queue=queue, retry=False,
                          soft_time_limit=LOSSLESS_TIME_LIMIT_S, time_limit=LOSSLESS_TIME_LIMIT_S + 60)
