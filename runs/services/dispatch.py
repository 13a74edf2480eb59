"""Sending runs to the GPU hosts' workers over the Celery broker.

Services never import the tasks module (dependencies go tasks -> services): runs are sent by
task name with the Celery app Django configured (`celery.current_app`), one message per group
of runs that share a server start.
"""

from __future__ import annotations

from celery import current_app

from benchkit.specs import RunSpec
from benchkit.specs import server_groups as specs_server_groups
from runs.models import Run
from runs.services.leases import total_limit_s

#: The registered name of runs.tasks.execute_runs_task.
EXECUTE_RUNS_TASK = "runs.execute_runs"


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
