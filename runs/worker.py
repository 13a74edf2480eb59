"""Celery worker hooks (issue 11), connected when the worker imports runs.tasks.

- `worker_ready` (the worker's main process, once it consumes its queues): for every host queue
  it consumes (`host.<name>`), supervision.worker_started records the worker, makes sure beat
  supervises the host, reaps the runs a dead worker left behind (before any task of this worker
  runs) and sends a reconcile marker.
- `heartbeat_sent` (Celery's event heartbeat, every 2 s in the main process, no extra thread):
  at most every DRAFTBOARD_HEARTBEAT_INTERVAL_S, the hosts' `worker_seen_at` is set to now.
  The home page shows a host's worker alive while that is recent. When Celery beat has been
  seen (runs.models.SchedulerHeartbeat) but is silent past DRAFTBOARD_HEARTBEAT_TIMEOUT_S (it
  died, or it cannot reach the database), the worker sends its hosts the supervise task itself,
  at most every DRAFTBOARD_SUPERVISE_INTERVAL_S, so reaping, reconciling and the checks'
  catch-up go on until beat is back (logged once per silence).

Neither hook raises into Celery: a database fault is logged and the next heartbeat tries again.
"""

from __future__ import annotations

import logging
import time

from celery.signals import heartbeat_sent, worker_ready
from django.conf import settings
from django.db import DatabaseError, connection
from django.utils import timezone

from runs.models import SchedulerHeartbeat
from runs.services import dispatch, supervision

log = logging.getLogger(__name__)

#: Host names whose queues this worker consumes (set at worker_ready) and the monotonic time of
#: the last heartbeat written for them.
_served: dict[str, object] = {"hosts": [], "worker": "", "last": 0.0, "supervised": 0.0, "beat_silent": False}


def served_hosts(queue_names) -> list[str]:
    """Host names of the `host.<name>` queues among `queue_names`."""
    return sorted(q[len("host."):] for q in queue_names if q.startswith("host.") and len(q) > len("host."))


@worker_ready.connect
def on_worker_ready(sender=None, **kwargs) -> None:
    """Reap and register for each host this worker serves (see the module docstring)."""
    names = served_hosts(sender.app.amqp.queues.consume_from or {})
    _served.update(hosts=names, worker=sender.hostname, last=time.monotonic())
    for name in names:
        try:
            reaped = supervision.worker_started(name, sender.hostname)
            for r in reaped:
                log.warning("worker start: run %s failed %s (%s)", r.run_id, r.reason, r.message)
        except Exception:  # never stop the worker from starting; the beat entry retries
            log.exception("worker start: supervising host %s failed", name)
            connection.close()


@heartbeat_sent.connect
def on_heartbeat(sender=None, **kwargs) -> None:
    """Record the worker alive, at most every DRAFTBOARD_HEARTBEAT_INTERVAL_S."""
    now = time.monotonic()
    if not _served["hosts"] or now - _served["last"] < settings.DRAFTBOARD_HEARTBEAT_INTERVAL_S:
        return
    _served["last"] = now
    try:
        supervision.touch_worker(_served["hosts"], _served["worker"])
        _stand_in_for_beat(now)
    except DatabaseError as exc:
        log.warning("worker heartbeat not recorded: %s", exc)
        connection.close()


def _stand_in_for_beat(now: float) -> None:
    """Send this worker's hosts the supervise task while beat, once seen, is silent (see the
    module docstring); `now` is time.monotonic()."""
    last = SchedulerHeartbeat.objects.order_by("-beat_at").values_list("beat_at", flat=True).first()
    silent = last is not None and (timezone.now() - last).total_seconds() > settings.DRAFTBOARD_HEARTBEAT_TIMEOUT_S
    if silent != _served["beat_silent"]:
        _served["beat_silent"] = silent
        if silent:
            log.warning("celery beat silent since %s: this worker sends its hosts the supervise task itself", last)
        else:
            log.info("celery beat is back: supervision left to it again")
    if not silent or now - _served["supervised"] < settings.DRAFTBOARD_SUPERVISE_INTERVAL_S:
        return
    _served["supervised"] = now
    for name in _served["hosts"]:
        try:
            dispatch.send_supervise(name, f"host.{name}")
        except Exception as exc:  # the broker is away too: the next heartbeat tries again
            log.warning("supervise for host %s not sent: %s", name, exc)
