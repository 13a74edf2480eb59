"""On a real NVIDIA GPU host (issue 14): a run through the runner whose build's server holds GPU
memory reaches exactly the GPU chosen for it, teardown frees it, and the provenance read through
the host's own interpreter names its CUDA build of torch.

Run on the device machine: `python3 -m pytest tests/test_gpu_engine_env.py -v -s`; skipped
wherever NVML finds no GPU. Needs torch with CUDA in that interpreter, plus what the runner
imports (httpx, aiohttp, numpy, pydantic, PyYAML, psutil, nvidia-ml-py).
"""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest

from tests.test_gpu_device import _nvml_gpu_count

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_nvml_gpu_count() == 0, reason="no NVIDIA GPU visible to NVML"),
]


def test_provenance_names_the_cuda_build_of_torch():
    torch = pytest.importorskip("torch")
    from benchkit.engines.adapters import adapter_for
    from benchkit.engines.environment import check_engine_env
    from benchkit.specs import ServerConfig

    launch = adapter_for("vllm").launch(ServerConfig(engine="vllm", model="/m"), 8000, [])
    launch.build_env = dataclasses.replace(launch.build_env, module="torch")  # no engine on that machine
    p = check_engine_env(launch)
    print("provenance:", json.dumps(p))
    assert p["torch_version"] == torch.__version__ and p["torch_cuda"] == torch.version.cuda is not None
    assert p["torch_git"] == torch.version.git_version and p["python_executable"] == sys.executable


def test_a_run_reaches_its_gpu_and_teardown_frees_it(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from benchkit.execution.runner import execute_run
    from benchkit.hosts.allocation import choose_gpus
    from benchkit.hosts.inventory import collect_inventory
    from benchkit.hosts.preflight import gpu_memory_used
    from benchkit.specs import Limits, RunSpec, ServerConfig, WorkloadSpec
    from tests import standin

    inventory = collect_inventory()
    gpu = choose_gpus(inventory, 1, busy=[0] if len(inventory.gpus) > 1 else []).gpu_refs()  # not always GPU 0
    monkeypatch.setenv("DRAFTBOARD_ENGINE_FLAGS", str(standin.flags_file(tmp_path / "flags.yaml")))
    report = tmp_path / "starts.jsonl"
    spec = RunSpec(
        server=ServerConfig(engine="vllm", model=str(standin.model_dir(tmp_path)), served_model_name="demo",
                            load_format="dummy", env={"PYTHONPATH": str(standin.STANDIN_SRC),
                                                      "STANDIN_CUDA_MIB": "2048", "STANDIN_REPORT": str(report)}),
        workload=WorkloadSpec(input_len=16, output_len=16, num_prompts=8, concurrency=2),
        gpus=gpu, limits=Limits(ready_timeout_s=180, request_timeout_s=60, stop_timeout_s=15))
    out = execute_run(spec, workdir=tmp_path / "run")
    started = json.loads(report.read_text().splitlines()[-1])
    print("outcome:", out.ok, out.reason, out.message, "teardown:", out.teardown, "started:", started)
    assert out.ok, (out.reason, out.message, out.server_log_tail)
    assert started["cuda_visible_devices"] == gpu[0].uuid
    assert started["gpu_uuid"].lower() == gpu[0].uuid.lower()  # the server's cuda:0 is the chosen GPU
    assert out.teardown["clean"] and out.teardown.get("gpus_freed", True)
    assert gpu_memory_used([gpu[0].uuid])[gpu[0].uuid]["procs"] == []
    assert standin.standin_pids() == []
