"""Hosts on the Django side: topology-aware GPU planning for the users' grid, GPU leases,
quarantine, the host page, nightly scheduling and sweep entry (file, command, admin)."""

from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse
from django_celery_beat.models import PeriodicTask

from runs.models import GpuLease, Host, Run, RunState, Sweep
from runs.services import execution, leases
from runs.services.hosts import record_inventory
from runs.services.outcomes import store_outcome
from runs.services.sweeps import create_sweep_from_file
from runs.services.transitions import transition
from tests.factories import make_host, make_run, make_sweep
from tests.test_allocation import UUIDS, pcie8_inventory

pytestmark = pytest.mark.django_db
SWEEPS = Path(__file__).resolve().parents[1] / "sweeps"


@pytest.fixture
def pcie8_host():
    host = make_host("ws-pcie8")
    record_inventory(host, pcie8_inventory())
    return host


def test_users_grid_expands_onto_pcie8_topology(pcie8_host):
    sweep = create_sweep_from_file(SWEEPS / "users-grid-sglang.yaml", host_name=pcie8_host.name, enqueue=False)
    runs = list(sweep.runs.all())
    assert len(runs) == 36  # TP 1/4/8 x auto/linear/b15/b16/b32/b64 x concurrency 1/8
    by_tp = {}
    for r in runs:
        by_tp.setdefault(r.tp, set()).add(tuple(g["uuid"] for g in r.gpus))
    assert by_tp == {1: {(UUIDS[0],)}, 4: {tuple(UUIDS[:4])}, 8: {tuple(UUIDS)}}
    assert {r.tp for r in runs if r.gpus_cross_numa} == {8}  # only TP8 must cross the socket link
    assert sorted({(r.method, r.tree_budget) for r in runs}, key=str) == sorted(
        {("auto", None), ("linear", None), ("ddtree", 15), ("ddtree", 16), ("ddtree", 32), ("ddtree", 64)}, key=str)
    assert {(r.concurrency, r.output_len) for r in runs} == {(1, 1024), (8, 1024)}
    assert all(r.engine == "sglang" and r.state == RunState.QUEUED for r in runs)
    ddtree = next(r for r in runs if r.method == "ddtree")
    assert ddtree.spec["server"]["prefix_caching"] is False


def test_sweep_can_pin_gpus(pcie8_host, tmp_path):
    text = (SWEEPS / "users-grid-sglang.yaml").read_text()
    pinned = tmp_path / "pinned.yaml"
    pinned.write_text(text + "\ngpus:\n  4: [4, 5, 6, 7]\n  1: [6]\n")
    runs = create_sweep_from_file(pinned, host_name=pcie8_host.name, enqueue=False).runs.all()
    assert {tuple(g["index"] for g in r.gpus) for r in runs if r.tp == 4} == {(4, 5, 6, 7)}
    assert {tuple(g["index"] for g in r.gpus) for r in runs if r.tp == 1} == {(6,)}
    assert {tuple(g["uuid"] for g in r.gpus) for r in runs if r.tp == 8} == {tuple(UUIDS)}
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(text + "\ngpus:\n  4: [9, 10, 11, 12]\n")
    with pytest.raises(CommandError, match=r"wrong.yaml:\d+: gpus.4: host ws-pcie8: pinned GPUs \[9, 10, 11, 12\] are "
                                           r"not on the host: the host has 8 GPUs \[0, 1, 2, 3, 4, 5, 6, 7\]\n"):
        call_command("start_sweep", str(wrong), "--host", pcie8_host.name, "--no-enqueue")
    bad_tp = tmp_path / "bad_tp.yaml"
    bad_tp.write_text(text + "\ngpus:\n  2: [0, 1]\n")
    with pytest.raises(CommandError, match="gpus.2"):
        call_command("start_sweep", str(bad_tp), "--host", pcie8_host.name, "--no-enqueue")


def test_host_page_shows_gpus_and_topology(client, pcie8_host, django_assert_max_num_queries):
    with django_assert_max_num_queries(5):
        html = client.get(reverse("analysis:host_detail", args=[pcie8_host.name])).content.decode()
    assert UUIDS[7] in html and 'id="fig-topology"' in html and "SYS" in html


def test_snapshot_history_flags_a_changed_host(pcie8_host):
    inv = pcie8_inventory()
    assert not record_inventory(pcie8_host, inv).changed
    inv.driver_version = "999.1"
    assert record_inventory(pcie8_host, inv).changed


def test_gpu_leases_refuse_a_second_holder_and_expire():
    sweep = make_sweep()
    a, b = make_run(sweep, "auto"), make_run(sweep, "linear")
    leases.acquire(a, ["GPU-x", "GPU-y"], ttl_s=60)
    with pytest.raises(leases.GpusBusy, match=f"GPU-y \\(run {a.pk}\\)"):
        leases.acquire(b, ["GPU-y", "GPU-z"], ttl_s=60)
    assert not GpuLease.objects.filter(run=b).exists()  # all or none
    leases.acquire(b, ["GPU-z"], ttl_s=60)
    # a worker that died leaves leases that expire; then another run may take the GPU
    GpuLease.objects.filter(run=a).update(expires_at="2000-01-01T00:00:00Z")
    leases.acquire(b, ["GPU-x"], ttl_s=60)
    assert set(GpuLease.objects.filter(run=b).values_list("gpu_uuid", flat=True)) == {"GPU-x", "GPU-z"}


def test_run_on_held_gpus_waits_then_fails_gpu_busy():
    sweep = make_sweep()
    from benchkit.specs import GpuRef

    holder = make_run(sweep, "auto", gpus=[GpuRef(index=0, uuid="GPU-held")])
    waiting = make_run(sweep, "linear", gpus=[GpuRef(index=0, uuid="GPU-held")])
    leases.acquire(holder, ["GPU-held"], ttl_s=600)
    with pytest.raises(leases.GpusBusy):
        execution.execute(waiting.pk)
    waiting.refresh_from_db()
    assert waiting.state == RunState.QUEUED  # the task retries later
    # every retry used up: the task fails the run with the reason
    from runs.tasks import GPU_BUSY_MAX_RETRIES, execute_runs_task

    result = execute_runs_task.apply(args=[[waiting.pk]], retries=GPU_BUSY_MAX_RETRIES)
    assert result.get() == [RunState.FAILED]
    waiting.refresh_from_db()
    assert waiting.failure_reason == "gpu_busy" and "GPU-held" in waiting.failure_message


def test_unclean_teardown_quarantines_host_and_later_runs_skip():
    from benchkit.execution.outcome import RunOutcome

    sweep = make_sweep()
    run = make_run(sweep)
    for s in ("preflight", "starting", "warming", "measuring"):
        transition(run, s)
    store_outcome(run, RunOutcome(ok=False, reason="teardown_incomplete", message="pid 4242 survived",
                                  teardown={"clean": False, "survivors": [4242]}))
    host = Host.objects.get(pk=sweep.host_id)
    assert host.quarantined and "4242" in host.quarantine_reason
    later = execution.execute(make_run(sweep, "linear").pk)
    assert (later.state, later.failure_reason) == (RunState.FAILED, "host_quarantined")
    from runs.services.hosts import clear_quarantine

    assert clear_quarantine([host]) == 1
    assert not Host.objects.get(pk=host.pk).quarantined


def test_schedule_nightly_creates_beat_task():
    call_command("schedule_nightly", str(SWEEPS / "nightly-example.yaml"), "--hour", "3")
    task = PeriodicTask.objects.get(task="runs.start_sweep_from_file")
    assert task.enabled and task.crontab.hour == "3" and task.queue == f"host.{settings.DRAFTBOARD_HOST}"
    assert "nightly-example.yaml" in task.kwargs


def test_bad_sweep_file_names_line_and_field_and_stores_nothing(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nengine: vllm\nmodel: /m\ngrid:\n  tp: [1]\n  methods:\n    - {method: ddtree}\n"
                   "  concurrency: [1]\n  output_len: [16]\n")
    with pytest.raises(CommandError, match=r"bad.yaml:7.*tree_budget"):
        call_command("start_sweep", str(bad), "--no-enqueue")
    with pytest.raises(CommandError, match="bad.yaml"):
        call_command("schedule_nightly", str(bad))
    assert Sweep.objects.count() == 0 and Run.objects.count() == 0


def test_admin_creates_sweep_from_yaml(admin_client, pcie8_host):
    url = reverse("admin:runs_sweep_create_from_yaml")
    text = (SWEEPS / "users-grid-sglang.yaml").read_text()
    resp = admin_client.post(url, {"host": pcie8_host.pk, "grid": text})
    assert resp.status_code == 302, resp.content.decode()[-2000:]
    assert Sweep.objects.get().runs.count() == 36
    bad = admin_client.post(url, {"host": pcie8_host.pk, "grid": "name: [unclosed"})
    assert b"invalid YAML" in bad.content and Sweep.objects.count() == 1
    no_budget = text.replace("tree_budget: [15, 16, 32, 64], ", "")
    bad = admin_client.post(url, {"host": pcie8_host.pk, "grid": no_budget})
    line = no_budget.splitlines().index(next(x for x in no_budget.splitlines() if "method: ddtree" in x)) + 1
    assert f"admin YAML:{line}: grid.methods[2].tree_budget: method &#x27;ddtree&#x27; needs a tree budget" \
        in bad.content.decode()
    assert Sweep.objects.count() == 1


def test_unreachable_broker_stores_nothing(monkeypatch):
    from benchsite.celery import app

    monkeypatch.setattr(app.conf, "broker_url", "redis://127.0.0.1:1/0")
    with pytest.raises(CommandError, match="broker redis://127.0.0.1:1/0 does not answer"):
        call_command("start_sweep", str(SWEEPS / "nightly-example.yaml"), "--host", "gpu-a")
    assert Sweep.objects.count() == 0 and Run.objects.count() == 0


@pytest.mark.parametrize("name", ["../etc", "gpu/01", "a b", "x" * 101, "_lead"])
def test_bad_host_names_are_refused(name):
    with pytest.raises(CommandError, match="host name"):
        call_command("record_inventory", f"--host={name}")
    with pytest.raises(CommandError, match="host name"):
        call_command("start_sweep", str(SWEEPS / "nightly-example.yaml"), f"--host={name}", "--no-enqueue")
    assert Host.objects.count() == 0


def test_gpu_less_host_refuses_tp_above_one():
    from benchkit.hosts.inventory import HostInventory

    record_inventory(make_host("cpu-box"), HostInventory(hostname="cpu-box", gpus=[]))
    grid = SWEEPS / "users-grid-sglang.yaml"
    with pytest.raises(CommandError) as err:
        call_command("start_sweep", str(grid), "--host", "cpu-box", "--no-enqueue")
    lines = str(err.value).splitlines()
    assert lines[0].startswith(f"{grid}:23: grid.tp[1]: host cpu-box: TP4 needs 4 GPUs; the host has no GPUs in its "
                               "inventory (a CPU host runs TP1 only")
    assert lines[1].startswith(f"{grid}:23: grid.tp[2]: host cpu-box: TP8 needs 8 GPUs; the host has no GPUs")
    assert lines[2] == "24 runs refused: host cpu-box cannot hold them; nothing was stored"
    assert Sweep.objects.count() == 0


def test_audit_rows_are_read_only_in_admin(admin_client):
    from tests.factories import finish_run

    run = finish_run(make_run(make_sweep()))
    assert admin_client.get(reverse("admin:runs_runtransition_add")).status_code == 403
    assert admin_client.get(reverse("admin:runs_run_delete", args=[run.pk])).status_code == 403
    assert admin_client.get(reverse("admin:runs_runmetrics_change", args=[run.metrics.pk])).status_code == 200
    resp = admin_client.post(reverse("admin:runs_runmetrics_change", args=[run.metrics.pk]), {"completed": 0})
    assert resp.status_code == 403
    assert Run.objects.get(pk=run.pk).metrics.completed == 4


def test_runs_differing_only_in_workload_share_a_server_task(monkeypatch, pcie8_host):
    from celery import current_app

    from runs.services.dispatch import EXECUTE_RUNS_TASK, enqueue_runs

    sent = []

    def send_task(name, **kw):
        assert name == EXECUTE_RUNS_TASK
        sent.append(kw)

    monkeypatch.setattr(current_app, "send_task", send_task)
    sweep = create_sweep_from_file(SWEEPS / "users-grid-sglang.yaml", host_name=pcie8_host.name, enqueue=False)
    runs = list(sweep.runs.order_by("id"))
    enqueue_runs([r.pk for r in runs], "host.ws-pcie8")
    # 18 server configurations (TP 1/4/8 x 6 methods), each measured at concurrency 1 and 8
    assert len(sent) == 18 and all(len(k["args"][0]) == 2 for k in sent)
    for k in sent:
        a, b = (Run.objects.get(pk=i) for i in k["args"][0])
        assert (a.method, a.tree_budget, a.tp) == (b.method, b.tree_budget, b.tp)
        assert (a.concurrency, b.concurrency) == (1, 8)
        bound = sum(r.spec["limits"]["ready_timeout_s"] + r.spec["limits"]["run_timeout_s"]
                    + r.spec["limits"]["stop_timeout_s"] for r in (a, b))
        assert (k["queue"], k["soft_time_limit"], k["time_limit"]) == ("host.ws-pcie8", bound, bound + 120)
    sent.clear()
    enqueue_runs([r.pk for r in runs], "host.ws-pcie8", share_server=False)
    assert len(sent) == 36
