"""On a real NVIDIA GPU host: inventory, CUDA-init preflight, and teardown of a real CUDA process.

Run on the device machine (`nvidia-h200-x2`); skipped wherever NVML finds no GPU. Needs
PyTorch with CUDA for the memory-holding child processes.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from benchkit.hosts.allocation import choose_gpus
from benchkit.hosts.inventory import collect_inventory
from benchkit.hosts.preflight import (
    PreflightError,
    check_cuda_init,
    check_device_nodes,
    check_gpus_idle,
    gpu_memory_used,
    gpus_back_to_baseline,
    idle_baseline,
)
from benchkit.hosts.teardown import group_members, stop_process_group


def _nvml_gpu_count() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no library, no driver, no GPU
        return 0


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_nvml_gpu_count() == 0, reason="no NVIDIA GPU visible to NVML"),
]


@pytest.fixture(scope="module")
def inventory():
    return collect_inventory()


def test_real_inventory(inventory):
    n = _nvml_gpu_count()
    assert [g.index for g in inventory.gpus] == list(range(n))
    for g in inventory.gpus:
        assert g.uuid.startswith("GPU-") and g.pci_bus_id and g.name
        assert g.memory_total_mib > 0 and g.compute_capability
        assert g.numa_node >= 0, g.missing
    assert inventory.driver_version and inventory.cuda_driver_version
    assert inventory.topology_source == "nvidia-smi topo -m", inventory.missing
    assert inventory.topology.indices == list(range(n))
    assert collect_inventory().fingerprint() == inventory.fingerprint()
    print(
        "inventory:",
        inventory.fingerprint(),
        inventory.topology.to_dict()["links"],
        {g.index: (g.numa_node, g.numa_source, g.missing) for g in inventory.gpus},
    )


def test_device_nodes():
    r = check_device_nodes()
    assert not r.skipped and "/dev/nvidia-uvm" in r.data["nodes"]


def test_allocation_on_real_host(inventory):
    n = len(inventory.gpus)
    a = choose_gpus(inventory, n)
    assert a.indices == list(range(n))
    assert a.uuids == [g.uuid for g in inventory.gpus]
    assert not a.crosses_numa


@pytest.mark.parametrize("backend", ["torch", "driver"])
def test_cuda_init_on_every_gpu_and_each_alone(inventory, backend):
    uuids = [g.uuid for g in inventory.gpus]
    r = check_cuda_init(uuids, timeout_s=180, backend=backend)
    assert r.data["ok"] and r.data["device_count"] == len(uuids)
    for uuid in uuids:
        one = check_cuda_init([uuid], timeout_s=180, backend=backend)
        assert one.data["device_count"] == 1
        # CUDA_VISIBLE_DEVICES=<uuid> really selected that GPU
        assert one.data["devices"][0]["uuid"].lower().replace("gpu-", "") == uuid.lower().replace("gpu-", "")
    print(f"cuda_probe[{backend}]:", r.data)


def test_cuda_init_rejects_a_uuid_no_gpu_has():
    with pytest.raises(PreflightError) as info:
        check_cuda_init(["GPU-00000000-0000-0000-0000-000000000000"], timeout_s=180)
    assert info.value.code == "host_env_error"


HOLDER = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    import torch
    role, ready_dir, mib = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if role == "server":
        # a worker in the same process group, as vLLM/SGLang fork theirs
        subprocess.Popen([sys.executable, __file__, "worker", ready_dir, str(mib // 2)])
    else:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a stuck worker: only SIGKILL ends it
    x = torch.empty(mib << 20, dtype=torch.uint8, device="cuda:0")
    x.fill_(1)
    torch.cuda.synchronize()
    with open(os.path.join(ready_dir, role), "w") as f:
        f.write(str(os.getpid()))
    while True:
        time.sleep(1)
""")


def test_teardown_frees_a_real_cuda_process_group(inventory, tmp_path):
    uuid = inventory.gpus[0].uuid
    check_gpus_idle([g.uuid for g in inventory.gpus])  # fresh host: idle before we start
    baseline = idle_baseline([uuid])
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    env = dict(os.environ, CUDA_DEVICE_ORDER="PCI_BUS_ID", CUDA_VISIBLE_DEVICES=uuid)
    proc = subprocess.Popen(
        [sys.executable, str(script), "server", str(tmp_path), "2048"], env=env, start_new_session=True
    )
    pgid = proc.pid
    try:
        deadline = time.monotonic() + 180
        while not ((tmp_path / "server").exists() and (tmp_path / "worker").exists()):
            assert proc.poll() is None, f"holder exited with {proc.returncode}"
            assert time.monotonic() < deadline, "holder processes did not allocate GPU memory in 180 s"
            time.sleep(0.5)
        server_pid = int((tmp_path / "server").read_text())
        worker_pid = int((tmp_path / "worker").read_text())
        assert sorted(group_members(pgid)) == sorted([server_pid, worker_pid])

        readings = gpu_memory_used([uuid])[uuid]
        print("while held:", readings, "baseline:", baseline)
        assert readings["used_mib"] >= baseline[uuid] + 2048 + 1024
        with pytest.raises(PreflightError) as info:
            check_gpus_idle([uuid], baseline=baseline)
        assert info.value.code == "gpu_busy"
        print("busy message:", info.value.message)

        report = stop_process_group(pgid, term_timeout_s=5, kill_timeout_s=20)
        proc.wait(timeout=30)
        print("teardown:", report)
        assert report.clean and report.survivors == []
        assert worker_pid in report.killed  # it ignored SIGTERM
        assert group_members(pgid) == []
        r = gpus_back_to_baseline([uuid], baseline, timeout_s=60)
        print("after teardown:", r.data)
        assert not r.skipped
    finally:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# Starts HOLDER's server role as a tagged ManagedServer (PDEATHSIG SIGTERM), then waits to be
# killed: it stands in for the Celery pool process that runs a benchmark (issue 11).
STARTER = textwrap.dedent("""
    import sys, time
    from benchkit.engines.server import ManagedServer
    from benchkit.hosts.teardown import SERVER_TAG_ENV
    script, ready_dir, uuid, tag = sys.argv[1:5]
    env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": uuid, SERVER_TAG_ENV: tag}
    srv = ManagedServer([sys.executable, script, "server", ready_dir, "2048"], env, ready_dir + "/server.log")
    print(srv.start(), flush=True)
    time.sleep(3600)
""")


def test_cuda_server_of_a_killed_starter_is_stopped_and_the_gpu_freed(inventory, tmp_path):
    """Issue 11 item 2 on a real GPU: SIGKILL the process that started a CUDA server. PDEATHSIG
    stops the server leader at once; its worker (ignores SIGTERM, holds GPU memory) is what the
    reaper finds by tag and SIGKILLs; then the GPU is back at its idle baseline."""
    from benchkit.hosts.teardown import stop_tagged_processes, tagged_processes

    uuid = inventory.gpus[0].uuid
    check_gpus_idle([uuid])
    baseline = idle_baseline([uuid])
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    tag = f"gpu-test-{os.getpid()}"
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    starter = subprocess.Popen([sys.executable, "-c", STARTER, str(script), str(tmp_path), uuid, tag], cwd=repo,
                               stdout=subprocess.PIPE, text=True)
    try:
        leader = int(starter.stdout.readline())
        deadline = time.monotonic() + 180
        while not ((tmp_path / "server").exists() and (tmp_path / "worker").exists()):
            assert time.monotonic() < deadline, "holder processes did not allocate GPU memory in 180 s"
            time.sleep(0.5)
        worker_pid = int((tmp_path / "worker").read_text())
        assert set(tagged_processes(tag)) == {leader, worker_pid}
        starter.kill()
        starter.wait(timeout=10)
        t0 = time.monotonic()
        while leader in tagged_processes(tag):
            assert time.monotonic() - t0 < 10, "PDEATHSIG did not stop the CUDA server leader"
            time.sleep(0.1)
        print(f"leader stopped {time.monotonic() - t0:.2f} s after its starter died")
        assert set(tagged_processes(tag)) == {worker_pid}  # the stuck worker still holds the GPU
        with pytest.raises(PreflightError):
            check_gpus_idle([uuid], baseline=baseline)
        report = stop_tagged_processes(tag, term_timeout_s=3, kill_timeout_s=20)
        print("reaper teardown:", report)
        assert report.clean and worker_pid in report.killed
        r = gpus_back_to_baseline([uuid], baseline, timeout_s=60)
        print("after the reaper:", r.data)
    finally:
        starter.kill()
        stop_tagged_processes(tag, term_timeout_s=1, kill_timeout_s=10)
