"""On a real NVIDIA GPU host: inventory, CUDA-init preflight, teardown of a real CUDA process, and
GPU telemetry sampled from a real CUDA load (issue 12).

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
from benchkit.hosts.nvml import load_pynvml
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
from benchkit.hosts.telemetry import Recorder, TelemetrySampler
from benchkit.measure.efficiency import gpu_energy
from benchkit.measure.gpu_samples import decode_telemetry
from benchkit.measure.gpu_validity import CLOCK_EVENT_BITS, check_gpu_window


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


def test_telemetry_reads_every_field_of_every_gpu(inventory):
    nv = load_pynvml()
    nv.nvmlInit()
    try:
        rec = Recorder(nv, [g.uuid for g in inventory.gpus], hz=10)
        rec.tick()
        rec.tick()
    finally:
        nv.nvmlShutdown()
    s = rec.stream
    for g in s.gpus:
        print("telemetry fields:", g.index, g.name, g.power_limit_mw, g.max_sm_mhz,
              {f: v[-1] for f, v in g.values.items()}, "missing:", g.missing, "procs:", g.procs)
        # every field but the energy counter exists on every GPU NVML supports (Volta+ for energy)
        assert set(g.missing) <= {"energy_mj"}, g.missing
        assert 0 < g.values["power_mw"][-1] / 1000 < 2000 and 0 < g.values["sm_mhz"][-1] <= g.max_sm_mhz
        assert 0 <= g.values["util_gpu_pct"][-1] <= 100 and 0 < g.values["temp_c"][-1] < 110
        assert g.values["clock_events"][-1] & ~sum(CLOCK_EVENT_BITS) == 0
    print("query time per tick (ms):", [q / 1e6 for q in s.query_ns])


LOADER = textwrap.dedent("""
    import os, sys, time
    import torch
    folder = sys.argv[1]
    open(os.path.join(folder, "imported"), "w").close()
    while not os.path.exists(os.path.join(folder, "go")):
        time.sleep(0.05)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        c = a @ b
    torch.cuda.synchronize()
    with open(os.path.join(folder, "warm.tmp"), "w") as f:
        f.write(str(time.perf_counter_ns()))
    os.replace(os.path.join(folder, "warm.tmp"), os.path.join(folder, "warm"))
    end_by = time.monotonic() + 120
    while time.monotonic() < end_by and not os.path.exists(os.path.join(folder, "stop")):
        for _ in range(20):
            c = a @ b
        torch.cuda.synchronize()
""")


def _wait_for(path, proc, timeout_s=180):
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.poll() is None, f"load process exited with {proc.returncode}"
        assert time.monotonic() < deadline, f"{path.name} not written within {timeout_s} s"
        time.sleep(0.05)


def test_telemetry_samples_a_real_cuda_load(inventory, tmp_path):
    """Idle, then a bf16 matrix-multiply loop on GPU 0, sampled by the real sampler process."""
    uuid = inventory.gpus[0].uuid
    script = tmp_path / "loader.py"
    script.write_text(LOADER)
    env = dict(os.environ, CUDA_DEVICE_ORDER="PCI_BUS_ID", CUDA_VISIBLE_DEVICES=uuid)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=env, start_new_session=True)
    try:
        _wait_for(tmp_path / "imported", proc)
        with TelemetrySampler([uuid], tmp_path / "gpu.bin", hz=10, group_pgid=proc.pid) as sampler:
            first = sampler.start()
            time.sleep(2.0)
            idle = (first, time.perf_counter_ns())
            (tmp_path / "go").touch()
            _wait_for(tmp_path / "warm", proc)
            warm = int((tmp_path / "warm").read_text())
            time.sleep(6.0)
            loaded = (warm + 2_000_000_000, time.perf_counter_ns())
            (tmp_path / "stop").touch()
            proc.wait(60)
            stream = sampler.stop()
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert decode_telemetry((tmp_path / "gpu.bin").read_bytes()) == stream
    g = stream.gpus[0]
    e_idle = gpu_energy(stream, g, *idle)
    e_load = gpu_energy(stream, g, *loaded)
    print("idle:", e_idle)
    print("loaded:", e_load)
    print("tick gaps (ms):", sorted((b - a) / 1e6 for a, b in zip(stream.t_ns, stream.t_ns[1:], strict=False))[::10])
    assert e_load.mean_power_w > e_idle.mean_power_w + 100
    assert e_load.util_gpu_mean_pct > 50 and e_load.sm_clock_mean_mhz > 0
    if e_load.energy_source == "counter":  # its deltas match integrated power (ENVIRONMENT.md)
        assert e_load.energy_j == pytest.approx(e_load.integrated_energy_j, rel=0.10)
    gaps = [b - a for a, b in zip(stream.t_ns, stream.t_ns[1:], strict=False)]
    assert sorted(gaps)[len(gaps) // 2] == pytest.approx(100_000_000, rel=0.1)
    listed = {pid for t, plist in g.procs for pid, _ in plist}
    print("processes seen:", stream.processes)
    assert proc.pid in listed and stream.processes[proc.pid].pgid == proc.pid
    ours = check_gpu_window(stream, *loaded)
    print("verdicts (own group):", ours.messages(), ours.clock_events_seen, ours.notes)
    assert not [v for v in ours.verdicts if v.code == "gpu_foreign_process"]
    other = check_gpu_window(stream, *loaded, group_pgid=1)  # as if the run were another group
    assert [v.detail["pid"] for v in other.verdicts if v.code == "gpu_foreign_process"] == [proc.pid]


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
