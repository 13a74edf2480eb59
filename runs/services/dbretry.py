"""Ride out a database outage in a worker: retry idempotent database work with backoff.

A PostgreSQL restart or a 60 s stop used to end a run's task with the first failed query: the
outcome store rolled back (good), but the lease release in `finally` failed too and the run was
left active until the reaper's deadline + grace (issue 35). The worker's database work after a
run (refresh, the outcome store, the lease release, queuing the checks) and its state moves are
idempotent or conditional, so they are retried here until the database answers again, for at
most DRAFTBOARD_DB_RETRY_MAX_S seconds; then `DatabaseUnavailable` is raised, whose reason is
`database_unavailable`.

Only connection-level errors are retried (django.db.OperationalError, InterfaceError): an
IntegrityError or a bug raises at once. Inside an atomic block nothing can be retried (the
transaction is broken), so the error is raised as it is.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Failure reason of a run whose state or outcome could not be written (the database did not answer).
REASON = "database_unavailable"
#: Errors that mean "the database is not answering" (retried), not "the query is wrong".
TRANSIENT = (OperationalError, InterfaceError)
#: Backoff: first wait, factor and cap (seconds). The cap bounds recovery after the database is
#: back (at most one wait of CAP_S plus a reconnect).
FIRST_S, FACTOR, CAP_S = 0.5, 2.0, 5.0


class DatabaseUnavailable(Exception):
    """The database did not answer `what` for `waited_s` seconds (the last error in `error`)."""

    reason = REASON

    def __init__(self, what: str, waited_s: float, error: Exception):
        self.what, self.waited_s, self.error = what, waited_s, error
        super().__init__(f"{what}: the database did not answer for {waited_s:.0f} s "
                         f"({type(error).__name__}: {str(error).strip()[:300]})")


def max_wait_s() -> float:
    """How long (s) a worker waits for the database before giving up (DRAFTBOARD_DB_RETRY_MAX_S)."""
    return float(getattr(settings, "DRAFTBOARD_DB_RETRY_MAX_S", 900))


def retry(fn: Callable[[], T], what: str, max_s: float | None = None,
          sleep: Callable[[float], None] = time.sleep) -> T:
    """Call `fn()` until it returns without a connection-level database error, waiting 0.5 s, 1 s,
    2 s, then 5 s between tries and reconnecting before each; returns what it returned.

    `what` names the work in the log lines (one when the outage starts, one when it ends) and in
    the error. Raises DatabaseUnavailable after `max_s` seconds (default `max_wait_s()`), and any
    other exception of `fn` at once. Inside an atomic block it calls `fn()` once (no retry)."""
    limit = max_wait_s() if max_s is None else max_s
    start, wait, failures = time.monotonic(), FIRST_S, 0
    while True:
        try:
            result = fn()
        except TRANSIENT as exc:
            if connection.in_atomic_block:
                raise
            waited = time.monotonic() - start
            if failures == 0:
                log.warning("%s: database unavailable (%s: %s); retrying for up to %.0f s",
                            what, type(exc).__name__, str(exc).strip()[:200], limit)
            failures += 1
            if waited + wait > limit:
                raise DatabaseUnavailable(what, waited, exc) from exc
            close_quietly()
            sleep(wait)
            wait = min(wait * FACTOR, CAP_S)
            continue
        if failures:
            log.info("%s: database back after %.1f s (%d failed tries)", what, time.monotonic() - start, failures)
        return result


def close_quietly() -> None:
    """Drop this thread's database connection so the next query opens a new one (never raises)."""
    try:
        connection.close()
    except Exception:  # a dead connection may fail to close: it is gone either way
        pass
