"""Celery beat's scheduler for draftboard (issue 35): django-celery-beat's DatabaseScheduler that
rides out database outages and leaves a heartbeat the dashboard shows.

Run beat with it (README, "GPU hosts" step 5; runs.localstack for the demo):

    .venv/bin/celery -A benchsite beat -S runs.scheduler:ResilientScheduler

Plain DatabaseScheduler lets an OperationalError out of its schedule read (`all_as_schedule`,
reached from `tick` through the `schedule` property), which ends the beat process ("beat raised
exception OperationalError"), and logs a full traceback on every tick from `schedule_changed`
and `sync` while the database is away. ResilientScheduler instead:

* catches django.db OperationalError / InterfaceError (and, in `schedule_changed` and `sync`,
  where the parent swallowed them already, any DatabaseError) in `setup_schedule`, the
  `schedule` property (the schedule read), `schedule_changed`, `sync` and `tick`;
* closes the Django connection after each failure, so the next query opens a new one;
* keeps the last schedule it read and keeps sending it (the messages go to the broker, not the
  database); entries it could not write back (`sync`) stay dirty and are written later;
* logs ONE warning line when an outage starts and ONE info line when it ends (with its
  duration in seconds), never a traceback per tick; after an outage it re-reads the whole
  schedule (and re-runs `setup_schedule` if that never reached the database);
* writes its heartbeat, runs.models.SchedulerHeartbeat (one row per "node:pid"), while the
  database answers: at most every HEARTBEAT_EVERY_S seconds (fewer when
  DRAFTBOARD_HEARTBEAT_TIMEOUT_S is short, so a live beat never looks silent), with the number
  of outages it rode out and a line describing the last one. The heartbeat write never raises.

A beat that dies anyway (SIGKILL, OOM) stops writing its heartbeat; the home page and the host
page then say "scheduler: silent since T" (runs.selectors.scheduler_status). Run beat under a
supervisor that restarts it (systemd `Restart=always`).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from datetime import datetime

from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist
from django.db import DatabaseError, InterfaceError, OperationalError, close_old_connections, connection, transaction
from django.utils import timezone
from django_celery_beat.schedulers import DatabaseScheduler

from runs.models import SchedulerHeartbeat

logger = logging.getLogger(__name__)

#: Errors that mean "the database is not answering now": beat waits them out.
OUTAGE_ERRORS = (OperationalError, InterfaceError)
#: What `schedule_changed` and `sync` treat as an outage (the parent swallowed all of these,
#: with a traceback each time).
SYNC_ERRORS = (DatabaseError, InterfaceError)
#: Longest gap between two heartbeat writes while the database answers (seconds).
HEARTBEAT_EVERY_S = 5.0


def _close_connection() -> None:
    """Close this thread's Django connection so the next query reconnects; never raises (a
    connection to a dead server can fail to close, too)."""
    try:
        connection.close()
    except Exception:  # noqa: BLE001 - closing a broken connection must not take beat down
        pass


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


class ResilientScheduler(DatabaseScheduler):
    """DatabaseScheduler that survives database outages and writes a heartbeat (module doc).

    State, all per process: `outages` (int, outages since start), `outage_since` (aware
    datetime while an outage lasts, else None), `last_outage` (str, "" until one ended)."""

    def __init__(self, *args, **kwargs):
        # Scheduler.__init__ calls setup_schedule, which may already fail: state first.
        self.node = socket.gethostname()
        self.pid = os.getpid()
        self.heartbeat_name = f"{self.node}:{self.pid}"
        self.started_at = timezone.now()
        self.outages = 0
        self.outage_since: datetime | None = None
        self.last_outage = ""
        self._outage_t0 = 0.0            # time.monotonic() at the outage's first error
        self._outage_error = ""          # "where: first line of the first error"
        self._failed_this_tick = False
        self._reload_pending = False     # re-read the whole schedule once the database is back
        self._setup_pending = False      # setup_schedule never reached the database
        self._next_heartbeat = 0.0       # time.monotonic() of the next heartbeat write
        super().__init__(*args, **kwargs)

    # --- outage bookkeeping -------------------------------------------------------------------

    @property
    def in_outage(self) -> bool:
        return self.outage_since is not None

    def _db_failed(self, exc: BaseException, where: str) -> None:
        """A database call in `where` failed: start an outage (one warning) unless one is on,
        close the connection, and re-read the schedule when it is back."""
        self._failed_this_tick = True
        self._reload_pending = True
        _close_connection()
        if self.in_outage:
            return
        self.outage_since = timezone.now()
        self._outage_t0 = time.monotonic()
        self._outage_error = f"{where}: {_first_line(exc)}"
        self.outages += 1
        n = len(self._schedule or {})
        logger.warning("beat: database unavailable (%s); keeping the last schedule (%d entries), "
                       "retrying every tick", self._outage_error, n)

    def _db_ok(self) -> None:
        """A database call worked: end the outage (one info line) unless a call of this same
        tick failed."""
        if not self.in_outage or self._failed_this_tick:
            return
        duration_s = time.monotonic() - self._outage_t0
        since = self.outage_since
        self.last_outage = (f"from {since:%Y-%m-%d %H:%M:%S} UTC for {duration_s:.1f} s, "
                            f"first error in {self._outage_error}")
        self.outage_since = None
        self._next_heartbeat = 0.0  # tell the database about it at once
        logger.info("beat: database back after %.1f s (outage %d since beat started); re-reading the schedule",
                    duration_s, self.outages)

    # --- DatabaseScheduler's database calls, guarded ------------------------------------------

    def setup_schedule(self):
        """Install the default and configured entries (as the parent); when the database does
        not answer, start with an empty schedule and do it again once it does."""
        try:
            close_old_connections()
            self.Changes.last_change()  # probe: the parent would log a traceback per entry
            super().setup_schedule()
        except OUTAGE_ERRORS as exc:
            self._db_failed(exc, "setup_schedule")
            self._setup_pending = True
            if self._schedule is None:
                self._schedule = {}
        else:
            self._setup_pending = self._failed_this_tick  # the schedule read inside it failed
            self._db_ok()

    @property
    def schedule(self):
        """The schedule (the parent's property: read from the database when it changed, at
        least every 5 min); the last one read while the database does not answer ({} if none
        was ever read)."""
        try:
            s = DatabaseScheduler.schedule.fget(self)
        except OUTAGE_ERRORS as exc:
            self._db_failed(exc, "schedule read")
            if self._schedule is None:
                self._schedule = {}
            return self._schedule
        return s

    def all_as_schedule(self):
        """Read every enabled entry (the parent's query); raises what the query raises, which the
        `schedule` property catches."""
        s = super().all_as_schedule()
        self._reload_pending = False
        self._db_ok()
        return s

    def schedule_changed(self):
        """True when the schedule changed in the database (PeriodicTasks.last_update moved), or
        when an outage made beat miss changes; False while the database does not answer."""
        try:
            close_old_connections()
            try:
                transaction.commit()  # MySQL REPEATABLE-READ, as the parent
            except transaction.TransactionManagementError:
                pass
            last, ts = self._last_timestamp, self.Changes.last_change()
        except SYNC_ERRORS as exc:
            self._db_failed(exc, "schedule_changed")
            return False
        self._db_ok()
        self._last_timestamp = ts
        if self._reload_pending:
            return True
        return bool(ts and ts > (last or ts))

    def sync(self):
        """Write the run counts and last-run times of the entries sent since the last sync (as
        the parent); while the database does not answer they stay pending."""
        failed: set[str] = set()
        try:
            close_old_connections()
            while self._dirty:
                name = self._dirty.pop()
                try:
                    self._schedule[name].save()
                except (KeyError, TypeError, ObjectDoesNotExist):
                    failed.add(name)
                except BaseException:
                    failed.add(name)  # not written: try again next sync
                    raise
        except SYNC_ERRORS as exc:
            self._db_failed(exc, "sync")
        else:
            self._db_ok()
        finally:
            self._dirty |= failed

    def tick(self, *args, **kwargs):
        """One pass of beat (Scheduler.tick): returns the delay in seconds to the next pass; a
        database error inside it costs one max_interval, never the process. Then the heartbeat."""
        self._failed_this_tick = False
        if self._setup_pending:
            self.setup_schedule()
        try:
            delay = super().tick(*args, **kwargs)
        except OUTAGE_ERRORS as exc:
            self._db_failed(exc, "tick")
            self._heap = None  # rebuilt from the kept schedule next pass
            delay = self.max_interval
        self.write_heartbeat()
        return delay

    # --- heartbeat ------------------------------------------------------------------------------

    def heartbeat_every_s(self) -> float:
        """Seconds between heartbeat writes: HEARTBEAT_EVERY_S, or a third of
        DRAFTBOARD_HEARTBEAT_TIMEOUT_S when that is shorter."""
        return min(HEARTBEAT_EVERY_S, settings.DRAFTBOARD_HEARTBEAT_TIMEOUT_S / 3)

    def write_heartbeat(self, force: bool = False) -> bool:
        """Write this beat's SchedulerHeartbeat row (update_or_create on "node:pid") if the last
        write is HEARTBEAT_EVERY_S old (or `force`). Returns True when it wrote. Never raises:
        a database error counts as (or extends) an outage, any other error is logged."""
        now_m = time.monotonic()
        if not force and now_m < self._next_heartbeat:
            return False
        self._next_heartbeat = now_m + self.heartbeat_every_s()
        for _ in range(2):  # a second write when this one ended an outage, to record it
            try:
                SchedulerHeartbeat.objects.update_or_create(name=self.heartbeat_name, defaults={
                    "node": self.node, "pid": self.pid, "started_at": self.started_at, "beat_at": timezone.now(),
                    "outages": self.outages, "last_outage": self.last_outage})
            except SYNC_ERRORS as exc:
                self._db_failed(exc, "heartbeat")
                return False
            except Exception:  # noqa: BLE001 - the heartbeat must never take beat down
                logger.warning("beat: heartbeat not written", exc_info=True)
                return False
            was_out = self.in_outage
            self._db_ok()
            if not (was_out and not self.in_outage):
                return True
        return True
