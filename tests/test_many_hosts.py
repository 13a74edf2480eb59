"""Many hosts (issue 11): one sweep runs its grid on several hosts, each planned on its own latest
inventory and sent to its own queue; the sweep's run list shows and filters the host."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command
from django.urls import reverse

from benchkit.hosts.inventory import GpuInfo, HostInventory
from benchkit.sweeps.sweepfile import PointsRefused, SweepError, loads_sweep
from runs.models import Host, Run, RunTransition
from runs.services.dispatch import EXECUTE_RUNS_TASK
from runs.services.hosts import record_inventory
from runs.services.sweeps import create_sweep_from_file
from tests.factories import finish_run

pytestmark = pytest.mark.django_db


def grid(hosts: str = "", tp: str = "[1, 2]") -> str:
    return f"""
name: two-hosts
engine: vllm
model: /models/target
server: {{load_format: dummy}}
grid:
  tp: {tp}
  methods: [auto, {{method: draft_model, num_speculative_tokens: 4, drafter: /models/drafter}}]
  concurrency: [1, 8]
  output_len: [64]
  input_len: [32]
{hosts}
"""


def inventory(host: str, n: int) -> HostInventory:
    return HostInventory(hostname=host, gpus=[GpuInfo(index=i, uuid=f"GPU-{host}-{i}", name="H200", numa_node=0)
                                              for i in range(n)])


@pytest.fixture
def sent(monkeypatch):
    """Run tasks sent through Celery (captured, not published); the broker counts as up."""
    from celery import current_app

    out = []
    monkeypatch.setattr(current_app, "send_task", lambda name, **kw: out.append((name, kw)))
    monkeypatch.setattr("runs.services.sweeps.check_broker", lambda: None)
    return out


@pytest.fixture
def two_hosts():
    a, b = Host.objects.create(name="gpu-a"), Host.objects.create(name="gpu-b")
    record_inventory(a, inventory("gpu-a", 8))
    record_inventory(b, inventory("gpu-b", 2))
    return a, b


def _write(tmp_path, text: str):
    path = tmp_path / "sweep.yaml"
    path.write_text(text)
    return path


def test_a_sweep_file_naming_two_hosts_runs_its_grid_on_each_and_queues_each_on_its_host(
        tmp_path, sent, two_hosts, django_capture_on_commit_callbacks):
    path = _write(tmp_path, grid("hosts: [gpu-a, gpu-b]"))
    with django_capture_on_commit_callbacks(execute=True):
        sweep = create_sweep_from_file(path, host_name="gpu-elsewhere")  # the file's hosts win
    n_points = 2 * 2 * 2  # tp x methods x concurrency
    by_host = {h.name: list(Run.objects.filter(sweep=sweep, host=h).order_by("id")) for h in two_hosts}
    assert {name: len(runs) for name, runs in by_host.items()} == {"gpu-a": n_points, "gpu-b": n_points}
    assert sweep.host.name == "gpu-a" and not Host.objects.filter(name="gpu-elsewhere").exists()
    for name, runs in by_host.items():  # planned on the host's own inventory
        assert {g["uuid"].split("-")[1] + "-" + g["uuid"].split("-")[2] for r in runs for g in r.gpus} == {name}
        assert {r.point_key for r in runs} == {r.point_key for r in by_host["gpu-a"]}
    queued = {}
    for name, kw in sent:
        assert name == EXECUTE_RUNS_TASK
        queued.setdefault(kw["queue"], []).extend(kw["args"][0])
    assert {q: sorted(ids) for q, ids in queued.items()} == {
        f"host.{name}": sorted(r.pk for r in runs) for name, runs in by_host.items()}
    assert Run.objects.filter(sweep=sweep, sent_at__isnull=True).count() == 0


def test_a_host_too_small_for_the_grid_is_named_and_nothing_is_stored(tmp_path, sent, two_hosts):
    """gpu-a (8 GPUs) holds TP4, gpu-b (2 GPUs) does not: the error is located at the TP value,
    names gpu-b and its GPU count (not busy GPUs), and no run of either host is stored."""
    path = _write(tmp_path, grid("hosts: [gpu-a, gpu-b]", tp="[1, 4]"))
    with pytest.raises(PointsRefused) as err:
        create_sweep_from_file(path)
    assert str(err.value) == f"{path}:7: grid.tp[1]: host gpu-b: TP4 needs 4 GPUs; the host has 2 GPUs [0, 1]"
    assert [(r.host, r.tp, len(r.runs)) for r in err.value.refusals] == [("gpu-b", 4, 4)]
    assert not Run.objects.exists() and not sent


def test_several_hosts_from_the_command_line(tmp_path, two_hosts):
    path = _write(tmp_path, grid())
    out = io.StringIO()
    call_command("start_sweep", str(path), "--host", "gpu-a", "--host", "gpu-b", "--no-enqueue", stdout=out)
    assert sorted(Run.objects.order_by().values_list("host__name", flat=True).distinct()) == ["gpu-a", "gpu-b"]
    assert Run.objects.filter(host__name="gpu-b").count() == Run.objects.filter(host__name="gpu-a").count() == 8
    with pytest.raises(CommandError, match="host gpu-b: TP4"):
        call_command("start_sweep", str(_write(tmp_path, grid(tp="[4]"))), "--host", "gpu-a", "--host", "gpu-b",
                     "--no-enqueue", stdout=io.StringIO())


@pytest.mark.parametrize(("text", "field"), [
    ("hosts: [gpu-a, gpu-a]", "hosts: duplicate"),
    ('hosts: ["no spaces"]', r"hosts\[0\]: 'no spaces' is not a host name"),
    ("hosts: []", "hosts: must not be empty"),
])
def test_bad_hosts_in_a_sweep_file_are_refused_at_their_line(text, field):
    with pytest.raises(SweepError, match=f":12: {field}"):
        loads_sweep(grid(text))


def test_the_admin_form_takes_several_hosts(client, sent, two_hosts, django_capture_on_commit_callbacks):
    user = User.objects.create_user("op", password="pw", is_staff=True)
    for codename in ("create_sweep", "view_sweep"):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client.force_login(user)
    with django_capture_on_commit_callbacks(execute=True):
        resp = client.post(reverse("admin:runs_sweep_create_from_yaml"),
                           {"host": [h.pk for h in two_hosts], "grid": grid(), "enqueue": "on"})
    assert resp.status_code == 302, resp.content.decode()[:2000]
    assert {kw["queue"] for _, kw in sent} == {"host.gpu-a", "host.gpu-b"}
    assert RunTransition.objects.filter(note__startswith="created by op").count() == Run.objects.count() == 16
    resp = client.post(reverse("admin:runs_sweep_create_from_yaml"), {"grid": grid(), "enqueue": "on"})
    assert resp.status_code == 200 and "choose at least one host" in resp.content.decode()


def test_the_run_list_shows_each_runs_host_and_filters_by_host(client, tmp_path, two_hosts):
    sweep = create_sweep_from_file(_write(tmp_path, grid("hosts: [gpu-a, gpu-b]")), enqueue=False)
    url = reverse("analysis:sweep_runs", args=[sweep.pk])
    page = client.get(url).content.decode()
    assert page.count(">gpu-a</a></td>") == 8 and page.count(">gpu-b</a></td>") == 8
    assert 'href="?host=gpu-b"' in page
    only_b = client.get(url + "?host=gpu-b").content.decode()
    assert only_b.count(">gpu-b</a></td>") == 8 and ">gpu-a</a></td>" not in only_b
    assert client.get(url + "?host=bad%20name").status_code == 400


def test_a_dry_run_plans_each_host_of_the_file_on_its_own_inventory(tmp_path, two_hosts):
    out = io.StringIO()
    call_command("start_sweep", str(_write(tmp_path, grid("hosts: [gpu-a, gpu-b]"))), "--dry-run", stdout=out)
    text = out.getvalue()
    assert "GPU-gpu-a-0" in text and "GPU-gpu-b-0" in text
    assert not Run.objects.exists()


def test_the_sweep_page_names_each_host_and_its_figures_filter_by_host(client, tmp_path, two_hosts):
    sweep = create_sweep_from_file(_write(tmp_path, grid("hosts: [gpu-a, gpu-b]")), enqueue=False)
    page = client.get(reverse("analysis:sweep_detail", args=[sweep.pk])).content.decode()
    assert 'href="?host=gpu-a">only its runs' in page and 'href="?host=gpu-b">only its runs' in page
    for run in Run.objects.filter(sweep=sweep):
        finish_run(run)
    b_runs = set(Run.objects.filter(sweep=sweep, host__name="gpu-b").values_list("pk", flat=True))
    url = reverse("analysis:sweep_data", args=[sweep.pk])

    def run_ids(query: str) -> tuple[set[int], dict]:
        data = client.get(url + query).json()
        col = data["points"]["columns"].index("run_id")
        return {row[col] for row in data["points"]["rows"]}, data

    everything, _ = run_ids("?points=1")
    only_b, data = run_ids("?points=1&host=gpu-b")
    assert data["selection"]["host"] == ["gpu-b"]
    assert only_b == b_runs and b_runs < everything
