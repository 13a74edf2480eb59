"""`manage.py start_sweep FILE --dry-run`: every run's GPUs (and NUMA crossing), exact argv and
environment, the preflight checks that fail now and the server starts, with nothing stored and
no server started."""

from __future__ import annotations

import re
import socket
from io import StringIO
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command
from django.urls import reverse

from benchkit.engines.server import ManagedServer
from runs.models import GpuLease, HardwareSnapshot, Host, Run, RunTransition, Sweep
from runs.services import dispatch
from runs.services.hosts import record_inventory
from tests import standin
from tests.factories import make_host
from tests.test_allocation import UUIDS, h200_inventory, pcie8_inventory

pytestmark = pytest.mark.django_db
SWEEPS = Path(__file__).resolve().parents[1] / "sweeps"
RUN_LINE = re.compile(r"^  run (\d+)/(\d+): (\S+)(?: b\d+)? TP(\d+) .* · GPUs (\S+) \((.*)\)$")


@pytest.fixture
def nothing_starts(monkeypatch):
    """Fail the test if a server would start or the broker be asked; yields a row counter."""
    def refuse(*args, **kwargs):
        raise AssertionError("a dry run started something")

    monkeypatch.setattr(ManagedServer, "start", refuse)
    monkeypatch.setattr(dispatch, "check_broker", refuse)
    monkeypatch.setattr(dispatch.current_app, "send_task", refuse)

    def counts():
        return [m.objects.count() for m in (Host, HardwareSnapshot, Sweep, Run, RunTransition, GpuLease)]
    return counts


def dry_run(*args) -> str:
    out = StringIO()
    call_command("start_sweep", *map(str, args), "--dry-run", stdout=out)
    return out.getvalue()


def test_users_grid_dry_run_on_the_8_gpu_two_numa_host(nothing_starts):
    record_inventory(make_host("ws-pcie8"), pcie8_inventory())
    before = nothing_starts()
    text = dry_run(SWEEPS / "users-grid-sglang.yaml", "--host", "ws-pcie8")
    assert nothing_starts() == before  # nothing stored
    runs = [RUN_LINE.match(line) for line in text.splitlines() if line.startswith("  run ")]
    assert len(runs) == 36 and all(runs) and [int(m.group(1)) for m in runs] == list(range(1, 37))
    by_tp = {}
    for m in runs:
        by_tp.setdefault(int(m.group(4)), set()).add((m.group(5), m.group(6)))
    assert by_tp == {1: {("0", "inside NUMA node 0")}, 4: {("0,1,2,3", "inside NUMA node 0")},
                     8: {("0,1,2,3,4,5,6,7", "CROSSES NUMA nodes 0,1")}}
    assert "36 runs in 18 server starts" in text
    assert len(re.findall(r"^server start \d+/18: ", text, re.M)) == 18
    # the exact argv and environment of a TP4 DDTree start
    start = text[text.index("server start 9/18:"):text.index("server start 10/18:")]
    assert start.startswith("server start 9/18: TP4 ddtree b15, build 'sglang-ddtree-pr'")
    assert re.search(r"argv: \S+python\S* -m sglang.launch_server --model-path /models/Qwen3.5-27B --host 127.0.0.1 "
                     r"--port \d+ --tp-size 4 --enable-metrics --served-model-name qwen3.5-27b --random-seed 0 "
                     r"--disable-radix-cache --speculative-algorithm DDTREE --speculative-draft-model-path "
                     r"/models/Qwen3.5-27B-DFlash --speculative-ddtree-budget 15\n", start)
    gpus = ",".join(UUIDS[:4])
    assert f"env (over the worker's environment): CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES={gpus}\n" in start
    # what would fail now, on this machine: the example model paths, and no SGLang installed here
    assert "FAIL model: model_missing: model directory /models/Qwen3.5-27B does not exist" in start
    assert re.search(r"FAIL engine_env: engine_env_error: build 'sglang-ddtree-pr' \(interpreter .*\): cannot import "
                     r"the engine: no module 'sglang'", start)
    assert "GPU checks (CUDA initialisation, idle GPUs) skipped: the host is not this machine" in text
    assert text.rstrip().endswith("preflight failures now: engine_env_error at 18 of 18 server starts; "
                                  "model_missing at 18 of 18 server starts")


def test_dry_run_on_this_machine_passes_or_names_the_taken_pinned_port(tmp_path, monkeypatch, nothing_starts):
    monkeypatch.setenv("DRAFTBOARD_ENGINE_FLAGS", str(standin.flags_file(tmp_path / "flags.yaml")))
    model = standin.model_dir(tmp_path)
    sweep = tmp_path / "s.yaml"
    sweep.write_text(f"""
name: cpu
engine: vllm
model: {model}
server: {{load_format: dummy, env: {{PYTHONPATH: "{standin.STANDIN_SRC}"}}}}
grid: {{methods: [auto], concurrency: [1, 2]}}
""")
    before = nothing_starts()
    text = dry_run(sweep)
    assert "preflight now: every check passes" in text and "preflight failures now: none" in text
    assert f"on host {settings.DRAFTBOARD_HOST}:" in text and "2 runs in 1 server starts" in text
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen(1)
    port = held.getsockname()[1]
    try:
        sweep.write_text(sweep.read_text() + f"port: {port}\n")
        text = dry_run(sweep)
    finally:
        held.close()
    assert f"port: {port} (pinned by the sweep file)" in text
    assert f"FAIL ports: port_in_use: port {port} is in use" in text
    assert nothing_starts() == before


# --- points the host cannot hold (issue 19) --------------------------------------------------------

FIT = """name: fit
engine: vllm
model: /models/target
server: {load_format: dummy}
grid:
  methods: [auto]
  tp: [1, 2, 3]
  concurrency: [1, 8]
"""


def test_tp3_on_the_2_gpu_host_is_refused_at_its_line_and_the_other_points_are_still_planned(tmp_path,
                                                                                             nothing_starts):
    """The 2 x H200 device's recorded inventory; TP3 cannot fit. Before: the dry run stopped with
    "TP3 needs 3 free GPUs; host has 2 GPUs [0, 1], busy [], free [0, 1]" and planned nothing."""
    record_inventory(make_host("h200"), h200_inventory())
    path = tmp_path / "fit.yaml"
    path.write_text(FIT)
    error = f"{path}:7: grid.tp[2]: host h200: TP3 needs 3 GPUs; the host has 2 GPUs [0, 1]"
    before = nothing_starts()
    out = StringIO()
    with pytest.raises(CommandError) as err:
        call_command("start_sweep", str(path), "--host", "h200", "--dry-run", stdout=out)
    assert str(err.value) == f"{error}\n2 runs refused: host h200 cannot hold them; nothing was stored"
    assert "busy" not in str(err.value)
    text = out.getvalue()
    assert ("4 runs in 2 server starts (runs that differ only in workload share one); 2 more runs REFUSED: the host "
            "cannot hold them (listed at the end).\n") in text
    # the valid points: planned on the host's GPUs, by UUID, each start checked
    runs = [RUN_LINE.match(line) for line in text.splitlines() if line.startswith("  run ")]
    assert [(m.group(1), m.group(4), m.group(5), m.group(6)) for m in runs] == [
        ("1", "1", "0", "inside NUMA node 0"), ("2", "1", "0", "inside NUMA node 0"),
        ("3", "2", "0,1", "inside NUMA node 0"), ("4", "2", "0,1", "inside NUMA node 0")]
    uuids = [g.uuid for g in h200_inventory().gpus]
    assert re.search(rf"CUDA_VISIBLE_DEVICES={uuids[0]}\s", text) and f"CUDA_VISIBLE_DEVICES={','.join(uuids)}" in text
    assert len(re.findall(r"^server start \d/2: TP[12] auto", text, re.M)) == 2
    assert "  TP3: REFUSED: host h200: TP3 needs 3 GPUs; the host has 2 GPUs [0, 1]\n" in text
    # the refused points, listed with their reason at the end
    assert text.rstrip().endswith(
        "REFUSED: 2 runs that host h200 cannot hold (not planned above; the sweep cannot be stored as written: "
        "start_sweep stores nothing while any run is refused):\n"
        f"  {error}\n"
        "    auto TP3 concurrency 1 input 128 output 128 repeat 0\n"
        "    auto TP3 concurrency 8 input 128 output 128 repeat 0")
    assert nothing_starts() == before
    # without --dry-run: the same error, nothing stored, the broker not even asked
    with pytest.raises(CommandError) as err:
        call_command("start_sweep", str(path), "--host", "h200", stdout=StringIO())
    assert str(err.value).splitlines()[0] == error
    assert nothing_starts() == before
    # the file fixed: the same command plans every point and exits 0
    path.write_text(FIT.replace("[1, 2, 3]", "[1, 2]"))
    assert "REFUSED" not in dry_run(path, "--host", "h200")


def test_cross_numa_false_on_the_two_socket_host_refuses_tp8_and_plans_tp4_inside_a_node(tmp_path, nothing_starts):
    record_inventory(make_host("ws-pcie8"), pcie8_inventory())
    path = tmp_path / "numa.yaml"
    path.write_text(FIT.replace("[1, 2, 3]", "[4, 8]") + "cross_numa: false\n")
    out = StringIO()
    with pytest.raises(CommandError, match=r"numa.yaml:7: grid.tp\[1\]: host ws-pcie8: TP8 cannot stay inside one "
                                           r"NUMA node and the sweep forbids crossing NUMA nodes"):
        call_command("start_sweep", str(path), "--host", "ws-pcie8", "--dry-run", stdout=out)
    runs = [RUN_LINE.match(line) for line in out.getvalue().splitlines() if line.startswith("  run ")]
    assert {(m.group(4), m.group(5), m.group(6)) for m in runs} == {("4", "0,1,2,3", "inside NUMA node 0")}


def test_the_admin_form_shows_each_refusal_as_a_form_error_and_stores_nothing(client, nothing_starts):
    record_inventory(make_host("h200"), h200_inventory())
    user = User.objects.create_user("op", password="pw", is_staff=True)
    for codename in ("create_sweep", "view_sweep"):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client.force_login(user)
    before = nothing_starts()
    grid = FIT.replace("[1, 2, 3]", "[1, 2, 4]") + "gpus:\n  2: [1, 2]\n"
    resp = client.post(reverse("admin:runs_sweep_create_from_yaml"),
                       {"host": [Host.objects.get(name="h200").pk], "grid": grid, "enqueue": "on"})
    assert resp.status_code == 200
    errors = resp.context["form"].errors["grid"]
    assert errors == [
        "admin YAML:7: grid.tp[2]: host h200: TP4 needs 4 GPUs; the host has 2 GPUs [0, 1]",
        "admin YAML:10: gpus.2: host h200: pinned GPUs [2] are not on the host: the host has 2 GPUs [0, 1]",
    ]
    page = resp.content.decode()
    assert "admin YAML:7: grid.tp[2]: host h200: TP4 needs 4 GPUs; the host has 2 GPUs [0, 1]" in page
    assert nothing_starts() == before


@pytest.mark.parametrize("name", ["vllm-bench-serve-full.json", "sglang-bench-serving.jsonl"])
@pytest.mark.parametrize("dry", [True, False])
def test_a_result_file_given_to_start_sweep_points_to_import_results(name, dry):
    """Issue 31: a result file was refused as a sweep file ("name: missing (required)")."""
    path = Path(__file__).parent / "fixtures" / "results" / name
    with pytest.raises(CommandError) as exc:
        call_command("start_sweep", str(path), *(["--dry-run"] if dry else []), "--no-enqueue")
    assert f"{path} is a " in str(exc.value) and "result file, not a sweep file" in str(exc.value)
    assert f"manage.py import_results {path}" in str(exc.value) and "missing (required)" not in str(exc.value)
    assert Sweep.objects.count() == 0
