"""Preflight checks: model directories, device nodes, CUDA init, GPU idleness, ports."""

import json
import socket
import struct
from pathlib import Path

import pytest

from benchkit.hosts.preflight import (
    CODES,
    PreflightError,
    check_cuda_init,
    check_device_nodes,
    check_gpus_idle,
    check_model_dir,
    check_port_free,
    gpus_back_to_baseline,
    idle_baseline,
)
from tests.nvml_replay import ReplayNvml

SHARED = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "hardware"
NVML = json.loads((SHARED / "h200x2-nvlink" / "nvml.json").read_text())
U0, U1 = (g["uuid"] for g in NVML["gpus"])


def safetensors_bytes(n_bytes: int = 16) -> bytes:
    header = json.dumps({"w": {"dtype": "U8", "shape": [n_bytes], "data_offsets": [0, n_bytes]}}).encode()
    return struct.pack("<Q", len(header)) + header + b"\x01" * n_bytes


def make_model(
    d: Path,
    shards=("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"),
    tokenizer="tokenizer.json",
) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    if tokenizer:
        (d / tokenizer).write_text("{}")
    if shards:
        (d / "model.safetensors.index.json").write_text(
            json.dumps({"weight_map": {f"layer{i}.w": s for i, s in enumerate(shards)}})
        )
        for s in shards:
            (d / s).write_bytes(safetensors_bytes())
    return d


def code_of(fn, *args, **kw) -> PreflightError:
    with pytest.raises(PreflightError) as info:
        fn(*args, **kw)
    assert info.value.code in CODES
    return info.value


# ------------------------------------------------------------------ model directories


def test_complete_model(tmp_path):
    r = check_model_dir(make_model(tmp_path / "m"))
    assert not r.skipped and len(r.data["weights"]) == 2 and r.data["bytes"] > 0


def test_missing_dir(tmp_path):
    e = code_of(check_model_dir, tmp_path / "gone", role="drafter")
    assert e.code == "model_missing" and "drafter directory" in e.message and "gone" in e.message


def test_no_config(tmp_path):
    d = make_model(tmp_path / "m")
    (d / "config.json").unlink()
    e = code_of(check_model_dir, d)
    assert e.code == "model_incomplete" and "config.json" in e.message


def test_bad_config_json(tmp_path):
    d = make_model(tmp_path / "m")
    (d / "config.json").write_text("{oops")
    assert "not valid JSON" in code_of(check_model_dir, d).message


def test_no_tokenizer_for_model_but_ok_for_drafter(tmp_path):
    d = make_model(tmp_path / "m", tokenizer=None)
    e = code_of(check_model_dir, d)
    assert e.code == "model_incomplete" and "no tokenizer" in e.message
    assert check_model_dir(d, role="drafter").data["weights"]
    (d / "tokenizer.model").write_bytes(b"spm")
    assert check_model_dir(d)


def test_missing_and_empty_shards(tmp_path):
    d = make_model(tmp_path / "m")
    (d / "model-00002-of-00002.safetensors").unlink()
    e = code_of(check_model_dir, d)
    assert e.code == "model_incomplete"
    assert (
        "1 of 2 shards named in model.safetensors.index.json are missing: model-00002-of-00002" in e.message
    )
    (d / "model-00002-of-00002.safetensors").write_bytes(b"")
    assert "is empty" in code_of(check_model_dir, d).message


def test_truncated_safetensors(tmp_path):
    d = make_model(tmp_path / "m")
    shard = d / "model-00001-of-00002.safetensors"
    shard.write_bytes(safetensors_bytes()[:-4])
    e = code_of(check_model_dir, d)
    assert e.code == "model_incomplete" and "truncated" in e.message and shard.name in e.message


def test_no_weights_only_with_dummy(tmp_path):
    d = make_model(tmp_path / "m", shards=())
    assert "no weight files" in code_of(check_model_dir, d).message
    r = check_model_dir(d, allow_no_weights=True)
    assert r.data["weights"] == [] and "dummy" in r.detail


def test_single_bin_without_index(tmp_path):
    d = make_model(tmp_path / "m", shards=())
    (d / "pytorch_model.bin").write_bytes(b"x" * 10)
    assert check_model_dir(d).data["weights"] == ["pytorch_model.bin"]


def test_unknown_code_is_refused():
    with pytest.raises(ValueError, match="unknown preflight code"):
        PreflightError("oops", "x")


# ------------------------------------------------------------------ device nodes, CUDA


def test_device_nodes_gpu_less_dir(tmp_path):
    r = check_device_nodes(tmp_path)
    assert r.skipped and "GPU-less" in r.detail


def test_device_nodes_present_and_openable(tmp_path):
    for n in ("nvidiactl", "nvidia-uvm", "nvidia0", "nvidia1"):
        (tmp_path / n).write_bytes(b"")
    r = check_device_nodes(tmp_path)
    assert not r.skipped and len(r.data["nodes"]) == 4


def test_device_nodes_uvm_missing_or_blocked(tmp_path):
    for n in ("nvidiactl", "nvidia0"):
        (tmp_path / n).write_bytes(b"")
    e = code_of(check_device_nodes, tmp_path)
    assert e.code == "host_env_error" and "nvidia-uvm does not exist" in e.message
    (tmp_path / "nvidia-uvm").mkdir()  # cannot be opened read/write
    e = code_of(check_device_nodes, tmp_path)
    assert e.code == "host_env_error" and "nvidia-uvm cannot be opened read/write" in e.message


def test_device_nodes_this_host():
    if not Path("/dev/nvidiactl").exists():
        assert check_device_nodes().skipped
    else:
        assert not check_device_nodes().skipped


def test_cuda_init_skips_without_gpus():
    r = check_cuda_init([])
    assert r.skipped and "GPU-less" in r.detail


def test_cuda_init_of_a_gpu_nobody_has_fails_with_the_childs_message():
    """A real child process tries CUDA on a UUID no GPU has: no GPU here, none there either."""
    e = code_of(check_cuda_init, ["GPU-00000000-0000-0000-0000-000000000000"], timeout_s=120)
    assert e.code == "host_env_error"
    assert "CUDA initialisation failed" in e.message or "CUDA sees" in e.message


# ------------------------------------------------------------------ GPU idleness (replayed NVML)


def test_idle_gpus_pass():
    r = check_gpus_idle([U0, U1], nvml=ReplayNvml(NVML))
    assert r.data[U0]["used_mib"] == 615 and r.data[U0]["procs"] == []


def test_memory_above_baseline_is_busy():
    e = code_of(check_gpus_idle, [U0], baseline={U0: 100}, nvml=ReplayNvml(NVML))
    assert e.code == "gpu_busy" and "615 MiB in use, idle limit 356 MiB" in e.message
    assert check_gpus_idle([U0], baseline=idle_baseline([U0], ReplayNvml(NVML)), nvml=ReplayNvml(NVML))


def test_compute_process_is_busy():
    data = json.loads(json.dumps(NVML))
    data["gpus"][1]["procs"] = [[4242, 2 << 30]]
    e = code_of(check_gpus_idle, [U0, U1], nvml=ReplayNvml(data))
    assert e.code == "gpu_busy" and U1 in e.message and "[[4242, 2048]]" in e.message


def test_unknown_uuid_is_a_host_error():
    e = code_of(check_gpus_idle, ["GPU-nope"], nvml=ReplayNvml(NVML))
    assert e.code == "host_env_error" and "GPU-nope" in e.message


def test_gpu_checks_skip_on_gpu_less_host():
    assert check_gpus_idle([]).skipped


def test_back_to_baseline_waits_for_memory_release():
    class Releasing(ReplayNvml):
        """Holds a dead server's memory for the first two readings, as a driver does briefly."""

        calls = 0

        def nvmlDeviceGetComputeRunningProcesses(self, h):  # noqa: N802
            Releasing.calls += 1
            if Releasing.calls <= 2:
                return super().nvmlDeviceGetComputeRunningProcesses({"procs": [[77, 1 << 30]]})
            return super().nvmlDeviceGetComputeRunningProcesses(h)

    r = gpus_back_to_baseline([U0], baseline={U0: 615}, timeout_s=30, poll_s=0.01, nvml=Releasing(NVML))
    assert Releasing.calls == 3 and not r.skipped
    Releasing.calls = -(10**6)  # never releases
    e = code_of(gpus_back_to_baseline, [U0], timeout_s=0.05, poll_s=0.01, nvml=Releasing(NVML))
    assert e.code == "gpu_busy"


# ------------------------------------------------------------------ ports


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listener_with_free_neighbour(bind_host: str) -> socket.socket:
    """A listening socket on a kernel-chosen port P whose neighbour P-1 was free just before
    (other tests' servers take ports too: P-1 in use would name P-1 in the span check)."""
    for _ in range(50):
        s = socket.socket()
        s.bind((bind_host, 0))
        port = s.getsockname()[1]
        try:
            with socket.socket() as probe:
                probe.bind((bind_host, port - 1))
        except OSError:
            s.close()
            continue
        s.listen(1)
        return s
    raise AssertionError("no port with a free neighbour in 50 tries")


@pytest.mark.parametrize("bind_host", ["127.0.0.1", "0.0.0.0"])
def test_port_held_by_a_real_listener(bind_host):
    with _listener_with_free_neighbour(bind_host) as s:
        port = s.getsockname()[1]
        e = code_of(check_port_free, port)
        assert e.code == "port_in_use" and f"port {port}" in e.message and "EADDRINUSE" in e.message
        e = code_of(check_port_free, port - 1, span=2)
        assert f"port {port}" in e.message
    assert check_port_free(port).data["ports"] == [port]


def test_free_port_passes():
    port = free_port()
    assert check_port_free(port).detail.startswith(f"ports {port}..{port}")


def test_bad_port_range():
    with pytest.raises(ValueError, match="bad port range"):
        check_port_free(65535, span=2)


def test_cuda_probe_child_finds_benchkit_from_any_directory(tmp_path):
    """The probe child gets the folder holding `benchkit` on its PYTHONPATH, so it imports it
    whatever the working directory (a worker may be started anywhere)."""
    import subprocess
    import sys

    from benchkit.hosts.preflight import _repo_root

    out = subprocess.run([sys.executable, "-c", "import benchkit.hosts.cuda_probe"], cwd=tmp_path,
                         env={"PYTHONPATH": _repo_root(), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
