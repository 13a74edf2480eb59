"""Issue 35: Celery beat cannot die silently. runs.scheduler.ResilientScheduler rides out a
database outage (no exception out of `tick`, one warning when it starts, one info line when it
ends, the last schedule kept) and writes its heartbeat (runs.models.SchedulerHeartbeat); the home
page and the host page say "scheduler: alive" / "scheduler: silent since T" / "never seen"
(runs.selectors.scheduler_status)."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

import pytest
from django.conf import settings
from django.db import OperationalError
from django.urls import reverse
from django.utils import timezone
from django_celery_beat.models import IntervalSchedule, PeriodicTask, PeriodicTasks
from django_celery_beat.schedulers import DatabaseScheduler

from benchsite.celery import app
from runs import scheduler as rs
from runs import selectors
from runs.models import SchedulerHeartbeat
from tests.factories import make_host

OUTAGE = OperationalError('connection to server at "127.0.0.1", port 5432 failed: Connection refused\n'
                          '\tIs the server running on that host and accepting TCP/IP connections?')


@pytest.fixture
def entry():
    """One enabled periodic task (every hour, never run: not due in these ticks' seconds)."""
    every = IntervalSchedule.objects.create(every=1, period=IntervalSchedule.HOURS)
    return PeriodicTask.objects.create(name="hourly probe", task="celery.backend_cleanup", interval=every,
                                       last_run_at=timezone.now())


def _database_down(monkeypatch):
    """Every database call beat makes fails as a PostgreSQL outage does."""
    def fail(*a, **kw):
        raise OUTAGE
    monkeypatch.setattr(DatabaseScheduler, "all_as_schedule", fail)   # the schedule read
    monkeypatch.setattr(PeriodicTasks, "last_change", classmethod(fail))  # schedule_changed's query
    monkeypatch.setattr(SchedulerHeartbeat.objects, "update_or_create", fail)


@pytest.mark.django_db(transaction=True)  # the scheduler closes its connection after a failure
def test_outage_does_not_kill_beat_logs_once_and_heartbeat_resumes(entry, monkeypatch, caplog):
    closed = []
    real_close = rs._close_connection
    monkeypatch.setattr(rs, "_close_connection", lambda: (closed.append(1), real_close()))
    read = []
    real_read = DatabaseScheduler.all_as_schedule
    monkeypatch.setattr(DatabaseScheduler, "all_as_schedule", lambda self: (read.append(1), real_read(self))[1])

    s = rs.ResilientScheduler(app=app)
    assert "hourly probe" in s.schedule
    s.tick()
    hb = SchedulerHeartbeat.objects.get()
    assert (hb.name, hb.pid, hb.outages, hb.last_outage) == (s.heartbeat_name, s.pid, 0, "")
    first_beat = hb.beat_at
    reads_before = len(read)

    with monkeypatch.context() as m:
        _database_down(m)
        with caplog.at_level(logging.DEBUG, logger="runs.scheduler"):
            caplog.clear()
            for i in range(8):
                if i == 3:
                    s._last_full_sync = datetime.now() - timedelta(minutes=10)  # the parent's 5-min full read
                if i == 5:
                    s._next_heartbeat = 0  # a heartbeat attempt inside the outage too
                assert 0 < s.tick() <= s.max_interval
            assert "hourly probe" in s.schedule  # the last schedule is kept
        mine = [r for r in caplog.records if r.name == "runs.scheduler"]
        assert [r.levelname for r in mine] == ["WARNING"], [r.getMessage() for r in caplog.records]
        assert "database unavailable" in mine[0].getMessage() and "Connection refused" in mine[0].getMessage()
        assert "\n" not in mine[0].getMessage() and mine[0].exc_info is None
        assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR], caplog.text
        assert closed and s.in_outage and s.outages == 1

    with caplog.at_level(logging.INFO, logger="runs.scheduler"):
        caplog.clear()
        s.tick()
        s.tick()
        ended = [r for r in caplog.records if r.name == "runs.scheduler"]
    assert [r.levelname for r in ended] == ["INFO"] and "database back after" in ended[0].getMessage()
    assert not s.in_outage
    assert len(read) > reads_before  # the whole schedule read again after the outage
    hb.refresh_from_db()
    assert hb.beat_at > first_beat and hb.outages == 1
    assert "OperationalError" in hb.last_outage and " s, first error in " in hb.last_outage

    # a second outage is counted as a second one, again with one warning
    with monkeypatch.context() as m:
        _database_down(m)
        with caplog.at_level(logging.INFO, logger="runs.scheduler"):
            caplog.clear()
            for _ in range(3):
                s.tick()
        assert [r.levelname for r in caplog.records if r.name == "runs.scheduler"] == ["WARNING"]
    s.tick()
    hb.refresh_from_db()
    assert hb.outages == 2 and not s.in_outage


@pytest.mark.django_db(transaction=True)
def test_plain_database_scheduler_dies_on_the_same_outage(entry, monkeypatch):
    """What the test above guards against: django-celery-beat's own scheduler lets the schedule
    read's OperationalError out of `tick` (beat exits: "beat raised exception OperationalError")."""
    s = DatabaseScheduler(app=app)
    s.tick()
    with monkeypatch.context() as m:
        _database_down(m)
        s._last_full_sync = datetime.now() - timedelta(minutes=10)
        with pytest.raises(OperationalError):
            s.tick()


@pytest.mark.django_db(transaction=True)
def test_beat_starting_during_an_outage_sets_up_when_the_database_is_back(entry, monkeypatch, caplog):
    with monkeypatch.context() as m:
        _database_down(m)
        with caplog.at_level(logging.INFO, logger="runs.scheduler"):
            s = rs.ResilientScheduler(app=app)
            assert s.tick() > 0 and s.schedule == {}
        assert [r.levelname for r in caplog.records if r.name == "runs.scheduler"] == ["WARNING"]
    s.tick()
    assert "hourly probe" in s.schedule and not s.in_outage and not s._setup_pending
    assert SchedulerHeartbeat.objects.get(name=s.heartbeat_name).outages == 1


@pytest.mark.django_db(transaction=True)
def test_heartbeat_write_never_raises(monkeypatch):
    s = rs.ResilientScheduler(app=app)

    def boom(*a, **kw):
        raise RuntimeError("unexpected")
    monkeypatch.setattr(SchedulerHeartbeat.objects, "update_or_create", boom)
    assert s.write_heartbeat(force=True) is False
    assert not s.in_outage  # not a database outage, only logged


# --- the pages -------------------------------------------------------------------------------------

def _heartbeat(age_s: float) -> SchedulerHeartbeat:
    t = timezone.now() - timedelta(seconds=age_s)
    return SchedulerHeartbeat.objects.create(name="beat-node:4242", node="beat-node", pid=4242, started_at=t,
                                             beat_at=t)


def _pages(client) -> list[str]:
    host = make_host("sched-host")
    return [client.get(url).content.decode() for url in
            (reverse("analysis:home"), reverse("analysis:host_detail", args=[host.name]))]


@pytest.mark.django_db
def test_pages_say_never_seen_without_a_heartbeat(client):
    assert selectors.scheduler_status() == {"alive": False, "seen_at": None, "name": None, "outages": 0,
                                            "last_outage": ""}
    for html in _pages(client):
        assert "scheduler: never seen" in html and "scheduler: alive" not in html


@pytest.mark.django_db
def test_pages_say_alive_with_a_fresh_heartbeat(client):
    hb = _heartbeat(1)
    st = selectors.scheduler_status()
    assert st["alive"] and st["seen_at"] == hb.beat_at and st["name"] == "beat-node:4242"
    for html in _pages(client):
        assert "scheduler: alive" in html and "silent since" not in html


@pytest.mark.django_db
def test_pages_say_silent_since_with_an_old_heartbeat(client):
    hb = _heartbeat(settings.DRAFTBOARD_HEARTBEAT_TIMEOUT_S + 30)
    assert not selectors.scheduler_status()["alive"]
    assert selectors.scheduler_status(now=hb.beat_at + timedelta(seconds=1))["alive"]
    since = timezone.localtime(hb.beat_at).strftime("%Y-%m-%d %H:%M:%S")
    for html in _pages(client):
        assert f"scheduler: silent since {since} UTC" in html and "scheduler: alive" not in html


# --- a real beat ------------------------------------------------------------------------------------

@pytest.mark.celery
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_real_beat_writes_its_heartbeat(tmp_path):
    """`celery beat -S runs.scheduler:ResilientScheduler` (tests/celeryproc.start_beat) against the
    test database writes its heartbeat row within seconds. No broker is needed: nothing is due."""
    from tests import celeryproc as cp

    env = cp.child_env(f"redis://127.0.0.1:{cp.free_port()}/0", "sched-real", tmp_path / "runs")
    beat = cp.start_beat(env, tmp_path / "beat.log")
    try:
        hb = cp.wait_for(lambda: SchedulerHeartbeat.objects.filter(pid=beat.pid).first(), 60,
                         lambda: "beat's heartbeat:\n" + beat.log())
        assert hb.name.endswith(f":{beat.pid}") and hb.outages == 0
        assert selectors.scheduler_status()["alive"], beat.log()
        assert beat.proc.poll() is None, beat.log()
    finally:
        beat.stop()
    assert "Traceback" not in beat.log(20000), beat.log(20000)
