"""ServerConfig.engine_cpus: the CPU list, the engine's variables, the sweep file, and the
binding of a real process tree (benchkit.engines.cpus)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from benchkit.engines import cpus
from benchkit.engines.adapters import EngineConfigError, adapter_for
from benchkit.engines.kinds.vllm import Vllm
from benchkit.specs import RunSpec, ServerConfig
from benchkit.sweeps.sweepfile import SweepError, loads_sweep

ALLOWED = sorted(os.sched_getaffinity(0))


@pytest.mark.parametrize("text, want", [("0", {0}), ("0-2", {0, 1, 2}), ("0, 2-3", {0, 2, 3}), ("1,1", {1})])
def test_cpu_lists_parse(text, want):
    assert cpus.parse_cpus(text, allowed=set(range(8))) == want


@pytest.mark.parametrize("text, says", [
    ("", "not a CPU list"), ("a", "not a CPU list"), ("0-", "not a CPU list"), ("-1", "not a CPU list"),
    ("3-1", "runs backwards"), ("0,9", "CPU 9 not usable here"),
])
def test_bad_cpu_lists_name_the_problem(text, says):
    with pytest.raises(cpus.CpuPlacementError, match=says):
        cpus.parse_cpus(text, allowed=set(range(8)))


def test_vllm_env_binds_the_worker_and_reserves_nothing():
    server = ServerConfig(engine="vllm", model="m", engine_cpus=str(ALLOWED[0]))
    env = adapter_for("vllm").env([], server=server)
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == str(ALLOWED[0])
    assert env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in adapter_for("vllm").env([], server=ServerConfig(engine="vllm", model="m"))


def test_engines_without_placement_and_bad_lists_are_refused_at_launch():
    with pytest.raises(EngineConfigError, match="no known way to bind"):
        adapter_for("sglang").env([], server=ServerConfig(engine="sglang", model="m", engine_cpus="0"))
    with pytest.raises(EngineConfigError, match="not usable here"):
        adapter_for("vllm").env([], server=ServerConfig(engine="vllm", model="m", engine_cpus="4096"))


def test_engine_cpus_defines_the_point_only_when_set():
    plain = RunSpec(server=ServerConfig(model="m"))
    placed = RunSpec(server=ServerConfig(model="m", engine_cpus="0"))
    assert "engine_cpus" not in plain.point_fields()["server"]
    assert placed.point_fields()["server"]["engine_cpus"] == "0"
    assert plain.point_key() != placed.point_key()


SWEEP = """
name: s
engine: {engine}
model: /m
server: {{engine_cpus: "{cpus}"}}
grid: {{tp: [1], methods: [auto], concurrency: [1], output_len: [8], input_len: [8]}}
"""


def test_sweep_file_checks_engine_cpus():
    sweep = loads_sweep(SWEEP.format(engine="vllm", cpus="0"))
    assert {r.server.engine_cpus for r in sweep.expand()} == {"0"}
    with pytest.raises(SweepError, match="engine_cpus.*not a CPU list"):
        loads_sweep(SWEEP.format(engine="vllm", cpus="zero"))
    with pytest.raises(SweepError, match="engine_cpus.*no known way to bind"):
        loads_sweep(SWEEP.format(engine="sglang", cpus="0"))


TREE = textwrap.dedent("""
    import subprocess, sys, time
    kids = [subprocess.Popen([sys.executable, "-c",
             "import sys, time, threading; open('/proc/self/comm', 'w').write(sys.argv[1]); "
             "threading.Thread(target=time.sleep, args=(60,), daemon=True).start(); time.sleep(60)", name])
            for name in ("VLLM::EngineCore", "VLLM::Worker")]
    print("ready", flush=True)
    time.sleep(60)
""")


def _affinities(pid: int) -> set[frozenset[int]]:
    return {frozenset(os.sched_getaffinity(int(t))) for t in os.listdir(f"/proc/{pid}/task")}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="CPU affinity of a process tree: Linux")
def test_place_binds_every_thread_of_the_busy_processes_and_the_rest_elsewhere():
    leader = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    try:
        assert leader.stdout.readline().strip() == "ready"
        import psutil
        kids = psutil.Process(leader.pid).children()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not all(k.name().startswith("VLLM::") and k.num_threads() > 1
                                                      for k in kids):
            time.sleep(0.05)
        record = cpus.place(leader.pid, str(ALLOWED[0]), Vllm.cpu_placement)
        assert record["missing"] == []
        names = {p["name"]: p for p in record["processes"]}
        assert set(names) >= {"VLLM::EngineCor", "VLLM::Worker"}
        for k in kids:
            assert _affinities(k.pid) == {frozenset({ALLOWED[0]})}, k.name()
            assert names[k.name()]["threads"] == k.num_threads() >= 2
        rest = frozenset(ALLOWED[1:])
        if rest:
            assert _affinities(leader.pid) == {rest}
            assert record["frontend_cpus"] != ""
        else:  # one CPU: nothing left for the API server, which stays where it was
            assert record["frontend_cpus"] == ""
    finally:
        for p in psutil.Process(leader.pid).children():
            p.kill()
        leader.kill()
        leader.wait()


def test_place_says_which_busy_process_it_did_not_find():
    leader = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.2)
        record = cpus.place(leader.pid, str(ALLOWED[0]), Vllm.cpu_placement)
        assert record["missing"] == ["VLLM::EngineCor", "VLLM::Worker"]
    finally:
        leader.kill()
        leader.wait()
