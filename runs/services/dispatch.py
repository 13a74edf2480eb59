"""Sending runs to the GPU hosts' workers over the Celery broker.

Services never import the tasks module (dependencies go tasks -> services): runs are sent by
task name with the Celery app Django configured (`celery.current_app`), one message per group
of runs that share a server start.
"""

from __future__ import annotations

from celery import current_app

from benchkit.specs import RunSpec
from runs.models import Run
from runs.services.leases import total_limit_s

#: The registered name of runs.tasks.execute_runs_task.
EXECUTE_RUNS_TASK = "runs.execute_runs"
#: The registered name of runs.tasks.detect_regressions_task.
DETECT_REGRESSIONS_TASK = "runs.detect_regressions"
#: Regression detection reads a few nights of one series: bounded well below this (seconds).
DETECT_TIME_LIMIT_S = 300


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
    groups: list[list[int]] = []
    last_key = None
    for run in sorted(runs, key=lambda r: r.pk):
        key = RunSpec.from_dict(run.spec).server_key()
        if share_server and groups and key == last_key:
            groups[-1].append(run.pk)
        else:
            groups.append([run.pk])
        last_key = key
    return groups


def enqueue_runs(run_ids: list[int], queue: str, share_server: bool = True) -> None:
    """Send the runs to `queue` as execute-runs tasks, one per server group (call only after
    the rows are committed). Each task has a soft time limit of its runs' summed bound
    (leases.total_limit_s) and a hard one two minutes later."""
    runs = list(Run.objects.filter(pk__in=run_ids).only("id", "spec"))
    by_id = {r.pk: r for r in runs}
    for group in server_groups(runs, share_server):
        limit = sum(total_limit_s(RunSpec.from_dict(by_id[i].spec).limits) for i in group)
        current_app.send_task(EXECUTE_RUNS_TASK, args=[group], queue=queue, soft_time_limit=limit,
                              time_limit=limit + 120)


def enqueue_detection(sweep_id: int, queue: str) -> None:
    """Send the regression-detection task for sweep `sweep_id` to `queue` (the host's queue, whose
    worker just finished the sweep's last run). Publishing is not retried: a broker that does
    not answer raises at once (kombu's OperationalError or OSError)."""
    current_app.send_task(DETECT_REGRESSIONS_TASK, args=[sweep_id], queue=queue, retry=False,
                          soft_time_limit=DETECT_TIME_LIMIT_S, time_limit=DETECT_TIME_LIMIT_S + 60)
