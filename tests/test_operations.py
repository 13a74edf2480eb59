"""Issue 11 on the Django side without a Celery worker: the reaper against real processes, the
heartbeat thread, the reconciler, duplicate deliveries, one sweep per schedule window, least
privilege in the admin, and the home page's worker status. The same faults through real
workers, signals and Redis are in tests/test_faults.py (marked celery)."""

from __future__ import annotations

import html
import os
import subprocess
import sys
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User
from django.db import IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone

from benchkit.engines.server import ManagedServer
from benchkit.hosts.teardown import SERVER_TAG_ENV, tagged_processes
from benchkit.sweeps.sweepfile import loads_sweep
from runs.models import GpuLease, Host, Run, RunState, RunTransition, Sweep
from runs.services import execution, supervision
from runs.services.transitions import transition
from tests import celeryproc as cp
from tests.factories import finish_run, make_host, make_run, make_sweep

pytestmark = pytest.mark.django_db
SWEEPS = Path(__file__).resolve().parents[1] / "sweeps"
REPO = Path(__file__).resolve().parents[1]


# --- the reaper --------------------------------------------------------------------------------

def _active(run: Run, **claim) -> Run:
    """Claim `run` as execution does (this process, a 600 s bound; `claim` overrides those
    fields) and drive it to measuring."""
    transition(run, RunState.PREFLIGHT, **{**supervision.claim_fields(600), **claim})
    for state in (RunState.STARTING, RunState.WARMING, RunState.MEASURING):
        transition(run, state)
    return Run.objects.get(pk=run.pk)


def _dead_pid() -> int:
    """The pid of a process that existed and has exited (reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_reaper_fails_a_dead_workers_run_and_stops_its_whole_server(tmp_path):
    host = make_host("reap-a")
    run = make_run(make_sweep(host))
    port = cp.free_port()
    tag = f"reap-{os.getpid()}-{time.monotonic_ns()}"
    server = ManagedServer([sys.executable, "-m", "tests.synthetic_server", "--port", str(port)],
                           {SERVER_TAG_ENV: tag}, tmp_path / "server.log", cwd=REPO)
    server.start()
    try:
        server.wait_ready([f"http://127.0.0.1:{port}/health"], 30, 0.1)
        cp.wait_for(lambda: len(tagged_processes(tag)) == 2, 10, "the server's forked child")
        run = _active(run, worker_pid=_dead_pid(), server_tag=tag)
        supervision.record_server([run.pk], server.pgid, tag)
        GpuLease.objects.create(host=host, gpu_uuid="GPU-a", run=run, expires_at=timezone.now() + timedelta(hours=1))
        reaped = supervision.reap(host)
    finally:
        server.stop(term_timeout_s=2)
    assert [r.run_id for r in reaped] == [run.pk]
    run.refresh_from_db()
    assert (run.state, run.failure_reason) == (RunState.FAILED, "worker_lost")
    assert "is gone" in run.failure_message
    assert tagged_processes(tag) == {} and cp.port_free(port)
    assert not GpuLease.objects.exists()
    notes = " | ".join(RunTransition.objects.filter(run=run).values_list("note", flat=True))
    assert "stopped its server's processes" in notes and "released 1 GPU lease" in notes
    assert not Host.objects.get(pk=host.pk).quarantined  # everything stopped: no quarantine
    assert supervision.reap(host) == []  # idempotent


def test_reaper_leaves_a_live_workers_run_alone_even_with_a_stale_heartbeat():
    host = make_host("reap-b")
    run = _active(make_run(make_sweep(host)), heartbeat_at=timezone.now() - timedelta(hours=1))
    assert run.worker_pid == os.getpid()  # this process: alive, older than the claim
    assert supervision.reap(host) == []
    assert Run.objects.get(pk=run.pk).state == RunState.MEASURING


def test_reaper_reasons_timeout_stuck_worker_other_machine_and_reused_pid():
    host = make_host("reap-c")
    sweep = make_sweep(host)
    past = timezone.now() - timedelta(hours=2)
    overdue = _active(make_run(sweep, "auto"), worker_pid=_dead_pid(), deadline_at=past)
    stuck = _active(make_run(sweep, "linear"), deadline_at=past)  # this live process, far past its bound
    elsewhere = _active(make_run(sweep, "ngram"), worker_node="other-machine", worker_pid=1,
                        heartbeat_at=timezone.now() - timedelta(minutes=5))
    recent = _active(make_run(sweep, "eagle"), worker_node="other-machine", worker_pid=1)
    later = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])  # created after the claim
    reused = _active(make_run(sweep, "mtp"), worker_pid=later.pid)
    Run.objects.filter(pk=reused.pk).update(started_at=timezone.now() - timedelta(minutes=1))
    try:
        reaped = {r.run_id: r for r in supervision.reap(host)}
    finally:
        later.kill()
        later.wait()
    assert set(reaped) == {overdue.pk, stuck.pk, elsewhere.pk, reused.pk}
    assert reaped[overdue.pk].reason == "run_timeout" and "bound ended" in reaped[overdue.pk].message
    assert reaped[stuck.pk].reason == "run_timeout" and "stuck past its hard time limit" in reaped[stuck.pk].message
    assert reaped[elsewhere.pk].reason == "worker_lost" and "no heartbeat for" in reaped[elsewhere.pk].message
    assert "not on this machine" in reaped[elsewhere.pk].cleanup[0]
    assert reaped[reused.pk].reason == "worker_lost"
    assert Run.objects.get(pk=recent.pk).state == RunState.MEASURING


@pytest.mark.django_db(transaction=True)
def test_heartbeat_thread_writes_while_the_block_runs():
    run = _active(make_run(make_sweep(make_host("hb"))), heartbeat_at=timezone.now() - timedelta(hours=1))
    with supervision.Heartbeat([run.pk], interval_s=0.2):
        cp.wait_for(lambda: Run.objects.get(pk=run.pk).heartbeat_at > timezone.now() - timedelta(seconds=5), 10,
                    "a heartbeat")
    first = Run.objects.get(pk=run.pk).heartbeat_at
    time.sleep(0.5)
    assert Run.objects.get(pk=run.pk).heartbeat_at == first  # stopped with the block


# --- delivery ------------------------------------------------------------------------------------

@pytest.fixture
def sent(monkeypatch):
    """Messages sent through Celery (captured, not published)."""
    from celery import current_app

    out = []
    monkeypatch.setattr(current_app, "send_task", lambda name, **kw: out.append((name, kw)))
    return out


def test_enqueue_records_when_each_run_was_sent(sent):
    from runs.services.dispatch import enqueue_runs

    sweep = make_sweep()
    runs = [make_run(sweep, "auto"), make_run(sweep, "linear")]
    before = timezone.now()
    enqueue_runs([r.pk for r in runs], "host.x")
    assert len(sent) == 2 and all(Run.objects.get(pk=r.pk).sent_at >= before for r in runs)


def test_a_broker_lost_half_way_through_enqueueing_loses_no_run(monkeypatch, caplog):
    from celery import current_app
    from kombu.exceptions import OperationalError

    from runs.services.dispatch import enqueue_runs

    host = make_host("half")
    sweep = make_sweep(host)
    runs = [make_run(sweep, m) for m in ("auto", "linear", "ngram")]
    delivered = []

    def send_task(name, **kw):
        if delivered:
            raise OperationalError("Error 111 connecting to redis: Connection refused")
        delivered.append(kw["args"][0])

    monkeypatch.setattr(current_app, "send_task", send_task)
    assert enqueue_runs([r.pk for r in runs], host.queue) == 1
    assert "sent 1 of 3 run task(s)" in caplog.text
    assert all(Run.objects.get(pk=r.pk).sent_at is not None for r in runs)  # all count as sent
    resent = []
    monkeypatch.setattr(current_app, "send_task", lambda name, **kw: resent.append(kw["args"][0]))
    later = timezone.now() + timedelta(minutes=5)  # a marker sent once the broker was back
    Run.objects.filter(pk=runs[0].pk).update(state=RunState.SUCCEEDED)  # the delivered one ran
    assert supervision.reconcile(host, checkpoint=later) == [runs[1].pk, runs[2].pk]
    assert resent == [[runs[1].pk], [runs[2].pk]]


def test_reconciler_resends_only_runs_whose_message_is_gone(sent):
    host = make_host("rec")
    sweep = make_sweep(host)
    now = timezone.now()
    lost = [make_run(sweep, "auto"), make_run(sweep, "linear")]
    never_sent = make_run(sweep, "ngram")  # stored with --no-enqueue
    waiting_gpus = make_run(sweep, "eagle")  # a GPU-busy retry is due later
    just_sent = make_run(sweep, "mtp")  # sent after the marker: still on the queue
    Run.objects.filter(pk__in=[r.pk for r in lost]).update(sent_at=now - timedelta(minutes=5))
    Run.objects.filter(pk=waiting_gpus.pk).update(sent_at=now + timedelta(seconds=60))
    Run.objects.filter(pk=just_sent.pk).update(sent_at=now + timedelta(seconds=1))
    finish_run(make_run(sweep, "draft_model", k=2))  # finished: never re-sent
    assert supervision.reconcile(host, checkpoint=now) == [r.pk for r in lost]
    assert [kw["args"][0] for _, kw in sent] == [[lost[0].pk], [lost[1].pk]]
    assert all(kw["queue"] == "host.rec" for _, kw in sent)
    for r in lost:
        assert RunTransition.objects.get(run=r).note.startswith("re-sent by the reconciler")
        assert Run.objects.get(pk=r.pk).sent_at > now  # sent again just now
    assert Run.objects.get(pk=never_sent.pk).sent_at is None


def test_supervise_sends_a_marker_which_then_reconciles(sent):
    host = make_host("sup")
    run = make_run(make_sweep(host))
    Run.objects.filter(pk=run.pk).update(sent_at=timezone.now() - timedelta(minutes=5))
    assert supervision.supervise("sup") == {"reaped": [], "resent": []}
    (name, kw), = sent
    assert name == "runs.supervise_host" and kw["queue"] == "host.sup"
    assert Host.objects.get(pk=host.pk).worker_seen_at is not None
    checkpoint = datetime.fromisoformat(kw["kwargs"]["checkpoint"])
    assert supervision.supervise("sup", checkpoint) == {"reaped": [], "resent": [run.pk]}


def test_a_second_delivery_is_recorded_not_run():
    run = finish_run(make_run(make_sweep()))
    assert execution.execute_group([run.pk])[0].state == RunState.SUCCEEDED
    notes = list(RunTransition.objects.filter(run=run, from_state=RunState.SUCCEEDED, to_state=RunState.SUCCEEDED)
                 .values_list("note", flat=True))
    assert notes == ["duplicate delivery ignored: the run is already succeeded (a run is claimed at most once)"]


def test_gpu_busy_retry_moves_sent_at_to_the_next_attempt():
    from benchkit.specs import GpuRef
    from runs.services import leases
    from runs.tasks import GPU_BUSY_RETRY_S, execute_runs_task

    sweep = make_sweep()
    holder = make_run(sweep, "auto", gpus=[GpuRef(index=0, uuid="GPU-h")])
    waiting = make_run(sweep, "linear", gpus=[GpuRef(index=0, uuid="GPU-h")])
    leases.acquire(holder, ["GPU-h"], ttl_s=600)
    execute_runs_task.apply(args=[[waiting.pk]])  # eager: the retry is recorded, not waited for
    sent_at = Run.objects.get(pk=waiting.pk).sent_at
    assert sent_at > timezone.now() + timedelta(seconds=GPU_BUSY_RETRY_S - 10)


# --- one sweep per schedule window ------------------------------------------------------------------

def test_beat_messages_carry_their_window():
    from benchsite.celery import stamp_schedule_window

    headers = {"periodic_task_name": "nightly x"}
    stamp_schedule_window(headers=headers)
    assert headers["schedule_window"] == datetime.now(UTC).date().isoformat()
    plain = {"id": "1"}
    stamp_schedule_window(headers=plain)
    assert "schedule_window" not in plain  # not from beat: no window


def test_second_send_of_one_window_creates_nothing(sent, caplog, monkeypatch):
    from runs.services.sweeps import create_sweep_for_window

    monkeypatch.setattr("runs.services.sweeps.check_broker", lambda: None)

    make_host("ws-pcie8")
    path = SWEEPS / "users-grid-sglang.yaml"
    first, created = create_sweep_for_window(path, "ws-pcie8", None, "nightly grid", date(2026, 1, 2))
    again, created_again = create_sweep_for_window(path, "ws-pcie8", None, "nightly grid", date(2026, 1, 2))
    assert (created, created_again, again.pk) == (True, False, first.pk)
    assert "this send created nothing" in caplog.text
    next_night, created = create_sweep_for_window(path, "ws-pcie8", None, "nightly grid", date(2026, 1, 3))
    assert created and next_night.pk != first.pk
    assert Sweep.objects.count() == 2 and Run.objects.count() == 2 * 36
    _, unscheduled = create_sweep_for_window(path, "ws-pcie8", None, "", None)  # a plain send always creates
    assert unscheduled


def test_the_database_refuses_two_sweeps_of_one_window():
    host = make_host()
    Sweep.objects.create(name="a", host=host, schedule="s", window=date(2026, 1, 2))
    with pytest.raises(IntegrityError), transaction.atomic():
        Sweep.objects.create(name="b", host=host, schedule="s", window=date(2026, 1, 2))
    Sweep.objects.create(name="c", host=host, schedule="", window=None)
    Sweep.objects.create(name="d", host=host, schedule="", window=None)  # unscheduled sweeps are not limited


# --- least privilege ------------------------------------------------------------------------------

def _staff(username: str, *perms: str) -> User:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


def _yaml(env: str = "", extra: str = "") -> str:
    text = (SWEEPS / "demo.yaml").read_text()
    text = text.replace("{demo_target}", "/models/t").replace("{demo_draft}", "/models/d").replace(
        "{demo_prompts}", str(Path(__file__).parent / "fixtures" / "datasets" / "demo_categories.jsonl"))
    args = '["--gpu-memory-utilization", "0.2", "--enforce-eager"]'
    assert args in text and '    VLLM_CPU_KVCACHE_SPACE: "1"' in text, "demo.yaml changed: update _yaml"
    return text.replace('    VLLM_CPU_KVCACHE_SPACE: "1"', '    VLLM_CPU_KVCACHE_SPACE: "1"' + env).replace(
        args, args[:-1] + extra + "]")


def test_staff_without_permission_cannot_create_a_sweep(client):
    host = make_host("perm-host")
    client.force_login(_staff("nobody", "view_sweep"))
    url = reverse("admin:runs_sweep_create_from_yaml")
    resp = client.get(url)
    assert resp.status_code == 403
    # issue 31: the 403 page names the missing permission (Django's bare page said only "403 Forbidden")
    assert "creating a sweep needs the runs.create_sweep permission" in resp.content.decode()
    assert client.post(url, {"host": host.pk, "grid": _yaml()}).status_code == 403
    assert Sweep.objects.count() == 0 and Run.objects.count() == 0
    assert b"Create sweep from YAML" not in client.get(reverse("admin:runs_sweep_changelist")).content


@pytest.mark.parametrize(("env", "extra", "named"), [
    ('\n    LD_PRELOAD: "/tmp/evil.so"', "", "'LD_PRELOAD'"),
    ("", ', "--worker-extension-cls", "evil.Ext"', "'--worker-extension-cls'"),
    ("", ', "--chat-template=/etc/shadow"', "'--chat-template'"),
])
def test_env_and_extra_args_outside_the_allowlist_are_refused(client, env, extra, named):
    host = make_host("perm-host")
    client.force_login(_staff("maker", "view_sweep", "create_sweep"))
    resp = client.post(reverse("admin:runs_sweep_create_from_yaml"), {"host": host.pk, "grid": _yaml(env, extra),
                                                                     "enqueue": ""})
    assert resp.status_code == 403 and named in html.unescape(resp.content.decode())
    assert Sweep.objects.count() == 0 and Run.objects.count() == 0


def test_allowlisted_overrides_are_stored_with_who_in_the_audit_trail(client):
    host = make_host("perm-host")
    client.force_login(_staff("maker", "view_sweep", "create_sweep"))
    resp = client.post(reverse("admin:runs_sweep_create_from_yaml"), {"host": host.pk, "grid": _yaml(), "enqueue": ""})
    assert resp.status_code == 302, resp.content.decode()[-1500:]
    sweep = Sweep.objects.get()
    planned = loads_sweep(_yaml()).n_runs()  # what the demo grid plans (15 today: 5 configs x 3 repeats)
    assert sweep.created_by == "maker" and sweep.runs.count() == planned
    note = RunTransition.objects.filter(run__sweep=sweep).values_list("note", flat=True).first()
    assert note == ("created by maker (admin); server.env {'VLLM_CPU_KVCACHE_SPACE': '1'}; "
                    "extra args ['--gpu-memory-utilization', '0.2', '--enforce-eager', "
                    "'--per-request-spec-decode-metrics', 'summary']")


def test_a_superuser_may_use_any_override_and_it_is_marked(admin_client):
    host = make_host("perm-host")
    resp = admin_client.post(reverse("admin:runs_sweep_create_from_yaml"),
                             {"host": host.pk, "grid": _yaml('\n    LD_PRELOAD: "/opt/x.so"'), "enqueue": ""})
    assert resp.status_code == 302
    note = RunTransition.objects.filter(run__sweep=Sweep.objects.get()).values_list("note", flat=True).first()
    assert "LD_PRELOAD" in note and "outside the allowlists: allowed for a superuser" in note


def test_view_only_staff_cannot_invalidate_or_clear_quarantine(client):
    run = finish_run(make_run(make_sweep()))
    host = Host.objects.get(pk=run.host_id)
    Host.objects.filter(pk=host.pk).update(quarantined=True, quarantine_reason="left a process")
    client.force_login(_staff("viewer", "view_run", "view_host"))
    resp = client.post(reverse("admin:runs_run_changelist"),
                       {"action": "invalidate", "_selected_action": [run.pk], "apply": "1", "reason": "x"})
    assert resp.status_code == 403
    assert ("you may not run the action &#x27;invalidate&#x27;: it needs the runs.invalidate_run permission"
            in resp.content.decode())
    assert Run.objects.get(pk=run.pk).state == RunState.SUCCEEDED
    resp = client.post(reverse("admin:runs_host_changelist"),
                       {"action": "clear_quarantine", "_selected_action": [host.pk]})
    assert resp.status_code == 403 and Host.objects.get(pk=host.pk).quarantined
    assert "needs the runs.clear_quarantine permission" in resp.content.decode()
    page = client.get(reverse("admin:runs_run_changelist")).content.decode()
    assert "Invalidate selected runs" not in page


def test_the_permissions_let_their_holders_act(client):
    run = finish_run(make_run(make_sweep()))
    Host.objects.filter(pk=run.host_id).update(quarantined=True, quarantine_reason="left a process")
    client.force_login(_staff("operator", "view_run", "invalidate_run", "view_host", "change_host",
                              "clear_quarantine"))
    resp = client.post(reverse("admin:runs_run_changelist"),
                       {"action": "invalidate", "_selected_action": [run.pk], "apply": "1", "reason": "bad GPU"})
    assert resp.status_code == 302 and Run.objects.get(pk=run.pk).state == RunState.INVALIDATED
    # editing the host row cannot clear a quarantine: only the action (its own permission) can
    client.post(reverse("admin:runs_host_change", args=[run.host_id]), {"name": "testhost"})
    assert Host.objects.get(pk=run.host_id).quarantined
    resp = client.post(reverse("admin:runs_host_changelist"),
                       {"action": "clear_quarantine", "_selected_action": [run.host_id]})
    assert resp.status_code == 302 and not Host.objects.get(pk=run.host_id).quarantined


# --- the home page ----------------------------------------------------------------------------------

def test_home_page_shows_each_hosts_worker_alive_or_not(client, django_assert_max_num_queries):
    now = timezone.now()
    Host.objects.create(name="alive-host", worker_seen_at=now - timedelta(seconds=5))
    Host.objects.create(name="dead-host", worker_seen_at=now - timedelta(hours=2))
    Host.objects.create(name="new-host")
    with django_assert_max_num_queries(3):
        html = client.get(reverse("analysis:sweep_list")).content.decode()
    items = {name: html.split(f">{name}</a>")[1].split("</li>")[0] for name in ("alive-host", "dead-host", "new-host")}
    assert "worker alive" in items["alive-host"] and "last heartbeat" in items["alive-host"]
    assert "worker not alive" in items["dead-host"] and "2\xa0hours" in items["dead-host"]
    assert "no worker seen" in items["new-host"]
