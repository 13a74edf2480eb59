"""Celery worker hooks (issue 11), connected when the worker imports runs.tasks.

- `worker_ready` (the worker's main process, once it consumes its queues): for every host queue
  it consumes (`host.<name>`), supervision.worker_started records the worker, makes sure beat
  supervises the host, reaps the runs a dead worker left behind (before any task of this worker
  runs) and sends a reconcile marker.
- `heartbeat_sent` (Celery's event heartbeat, every 2 s in the main process, no extra thread):
  at most every DRAFTBOARD_HEARTBEAT_INTERVAL_S, the hosts' `worker_seen_at` is set to now.
  The home page shows a host's worker alive while that is recent.

Neither hook raises into Celery: a database fault is logged and the next heartbeat tries again.
"""

from __future__ import annotations

import logging
import time

from celery.signals import heartbeat_sent, worker_ready
from django.conf import settings
from django.db import DatabaseError, connection

from runs.services import supervision

log = logging.getLogger(__name__)

#: Host names whose queues this worker consumes (set at worker_ready) and the monotonic time of
#: the last heartbeat written for them.
_served: dict[str, object] = {"hosts": [], "worker": "", "last": 0.0}


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
    except DatabaseError as exc:
        log.warning("worker heartbeat not recorded: %s", exc)
        connection.close()
