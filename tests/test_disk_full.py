"""Issue 35: a full disk is named. With the runs folder on a full filesystem a run used to fail in
about a second as `server_exited` with an empty log tail; now preflight refuses a runs folder with
less than the minimum free space (`disk_full`, default 512 MiB, DRAFTBOARD_MIN_FREE_MIB), a write
of the runner or the launcher that meets ENOSPC / EDQUOT ends the run `disk_full` naming the path,
its folder and the free MiB, and a server that exits with an empty log on a (nearly) full
filesystem is `disk_full`, not `server_exited`.

The real-filesystem tests mount a 2 MiB tmpfs (root only; skipped otherwise) and run the real
runner against the stand-in engine (tests/standin), a real server process."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import uuid
from collections import namedtuple
from pathlib import Path

import pytest

from benchkit.engines import environment
from benchkit.engines.server import ManagedServer, ServerStartError
from benchkit.execution import runner
from benchkit.execution.runner import execute_run
from benchkit.hosts import preflight
from benchkit.specs import Limits, RunSpec, ServerConfig, WorkloadSpec
from tests import standin

MIB = 1024 * 1024
MIN_FREE_ENV = "DRAFTBOARD_MIN_FREE_MIB"
Usage = namedtuple("Usage", "total used free")


@pytest.fixture
def standin_flags(tmp_path, monkeypatch):
    """vLLM's flags launch the stand-in engine (as tests/test_engine_env.py)."""
    monkeypatch.setenv("DRAFTBOARD_ENGINE_FLAGS", str(standin.flags_file(tmp_path / "flags.yaml")))
    monkeypatch.delenv(MIN_FREE_ENV, raising=False)
    return tmp_path


def standin_spec(root: Path, **env: str) -> RunSpec:
    return RunSpec(
        server=ServerConfig(engine="vllm", model=str(standin.model_dir(root)), served_model_name="demo",
                            load_format="dummy", env={"PYTHONPATH": str(standin.STANDIN_SRC), **env}),
        workload=WorkloadSpec(input_len=16, output_len=8, num_prompts=4, concurrency=2),
        limits=Limits(ready_timeout_s=30, request_timeout_s=30, stop_timeout_s=10))


def fake_usage(free_mib: float, watched: Path | None = None):
    """shutil.disk_usage that reports `free_mib` free for paths under `watched` (all when None)."""
    real = shutil.disk_usage

    def usage(path):
        if watched is None or Path(path).resolve().is_relative_to(watched.resolve()):
            return Usage(100 * 1024 * MIB, 100 * 1024 * MIB - int(free_mib * MIB), int(free_mib * MIB))
        return real(path)

    return usage


# ---------------------------------------------------------------------------------------------
# Preflight


def test_preflight_refuses_a_runs_folder_below_the_minimum(tmp_path, monkeypatch):
    monkeypatch.delenv(MIN_FREE_ENV, raising=False)
    assert preflight.DISK_FULL == "disk_full" and preflight.DISK_FULL in preflight.CODES
    assert preflight.DEFAULT_MIN_FREE_MIB == 512 and preflight.min_free_mib() == 512
    monkeypatch.setattr(shutil, "disk_usage", fake_usage(100.0))
    with pytest.raises(preflight.PreflightError) as err:
        preflight.check_free_space(tmp_path)
    assert err.value.code == "disk_full"
    assert str(tmp_path) in err.value.message and "100.0 MiB free" in err.value.message
    assert "512 MiB" in err.value.message and preflight.MIN_FREE_ENV in err.value.message
    monkeypatch.setattr(shutil, "disk_usage", fake_usage(600.0))
    ok = preflight.check_free_space(tmp_path)
    assert ok.data == {"folder": str(tmp_path), "free_mib": 600.0, "min_free_mib": 512}
    with pytest.raises(preflight.PreflightError, match="below the minimum 1024 MiB"):
        preflight.check_free_space(tmp_path, minimum_mib=1024)
    monkeypatch.setenv(MIN_FREE_ENV, "50")
    assert preflight.min_free_mib() == 50
    assert preflight.check_free_space(tmp_path).data["min_free_mib"] == 50
    monkeypatch.setenv(MIN_FREE_ENV, "lots")
    with pytest.raises(ValueError, match=preflight.MIN_FREE_ENV):
        preflight.min_free_mib()


def test_the_runner_fails_preflight_disk_full_before_any_start(standin_flags, monkeypatch):
    runs = standin_flags / "runs"
    monkeypatch.setattr(shutil, "disk_usage", fake_usage(3.5, watched=runs))
    out = execute_run(standin_spec(standin_flags), workdir=runs / "run-1")
    assert out.reason == "disk_full", (out.reason, out.message)
    assert str(runs) in out.message and "3.5 MiB free" in out.message and "512 MiB" in out.message
    assert out.argv and out.teardown == {} and standin.standin_pids() == []
    names = [n for n, _ in runner.preflight_checks(standin_spec(standin_flags), runner.adapters.adapter_for("vllm"),
                                                   _launch(standin_flags), workdir=runs / "run-1")]
    assert names[0] == "disk"
    assert "disk" not in [n for n, _ in runner.preflight_checks(standin_spec(standin_flags),
                                                                runner.adapters.adapter_for("vllm"),
                                                                _launch(standin_flags))]


def _launch(root: Path) -> environment.Launch:
    return runner.adapters.adapter_for("vllm").launch(standin_spec(root).server, 18000, [], workdir=root / "w")


# ---------------------------------------------------------------------------------------------
# Writes that meet ENOSPC / EDQUOT


def test_the_disk_full_helpers_name_path_folder_and_free_space(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", fake_usage(0.25))
    assert preflight.is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert preflight.is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert not preflight.is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not preflight.is_disk_full(ValueError("x"))
    msg = preflight.disk_full_message(tmp_path / "server.log", OSError(errno.ENOSPC, "No space left on device"))
    assert str(tmp_path / "server.log") in msg and f"folder {tmp_path}" in msg and "0.2 MiB free" in msg
    assert "No space left on device" in msg


def test_a_full_disk_writing_the_env_file_ends_the_run_disk_full(standin_flags, monkeypatch):
    monkeypatch.setenv(MIN_FREE_ENV, "0")
    workdir = standin_flags / "runs" / "run-1"

    def full(self):
        raise OSError(errno.ENOSPC, "No space left on device", str(workdir / "server.env"))

    monkeypatch.setattr(environment.Launch, "write_env_file", full)
    out = execute_run(standin_spec(standin_flags), workdir=workdir)
    assert out.reason == "disk_full", (out.reason, out.message)
    assert str(workdir / "server.env") in out.message and f"folder {workdir}" in out.message
    assert "MiB free" in out.message and standin.standin_pids() == []


def test_a_full_disk_opening_the_server_log_ends_the_run_disk_full(standin_flags, monkeypatch):
    monkeypatch.setenv(MIN_FREE_ENV, "0")
    workdir = standin_flags / "runs" / "run-1"
    real_open = open

    def full_open(path, *a, **kw):
        if str(path) == str(workdir / "server.log"):
            raise OSError(errno.EDQUOT, "Disk quota exceeded", str(path))
        return real_open(path, *a, **kw)

    monkeypatch.setattr("builtins.open", full_open)
    out = execute_run(standin_spec(standin_flags), workdir=workdir)
    assert out.reason == "disk_full", (out.reason, out.message)
    assert str(workdir / "server.log") in out.message and "Disk quota exceeded" in out.message
    assert "MiB free" in out.message and standin.standin_pids() == []


def test_a_full_disk_starting_telemetry_ends_the_run_disk_full(tmp_path, monkeypatch):
    from benchkit.execution.outcome import RunOutcome
    from benchkit.specs import GpuRef

    spec = standin_spec(tmp_path)
    spec.gpus = [GpuRef(0, "GPU-x")]

    class Sampler:
        def start(self):
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "telemetry-0.bin"))

        def kill(self):
            pass

    monkeypatch.setattr(runner, "telemetry_sampler", lambda *a, **kw: Sampler())
    out = RunOutcome(ok=False)
    with pytest.raises(OSError) as err:
        runner._start_telemetry(spec, out, tmp_path / "telemetry-0.bin", None)
    assert err.value.errno == errno.ENOSPC

    class Other(Sampler):
        def start(self):
            raise OSError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(runner, "telemetry_sampler", lambda *a, **kw: Other())
    assert runner._start_telemetry(spec, out, tmp_path / "telemetry-0.bin", None) is None
    assert out.telemetry_note.startswith("no GPU telemetry:")


def test_a_server_that_exits_with_an_empty_log_on_a_full_disk_is_disk_full(tmp_path, monkeypatch):
    monkeypatch.delenv(MIN_FREE_ENV, raising=False)
    monkeypatch.setattr(shutil, "disk_usage", fake_usage(0.0, watched=tmp_path))
    server = ManagedServer([sys.executable, "-c", "raise SystemExit(1)"], None, tmp_path / "server.log")
    server.start()
    try:
        with pytest.raises(ServerStartError) as err:
            server.wait_ready(["http://127.0.0.1:9/health"], timeout_s=20, poll_s=0.05)
    finally:
        server.stop(5)
    assert err.value.code == "disk_full"
    m = err.value.message
    assert "exited with code 1" in m and str(tmp_path / "server.log") in m and f"folder {tmp_path}" in m
    assert "0.0 MiB free" in m and "512 MiB" in m


def test_a_server_that_exits_with_a_log_or_with_space_left_is_still_server_exited(tmp_path, monkeypatch):
    monkeypatch.delenv(MIN_FREE_ENV, raising=False)
    monkeypatch.setattr(shutil, "disk_usage", fake_usage(0.0, watched=tmp_path))
    loud = "import sys; sys.stderr.write('x' * 5000 + '\\nImportError: no engine\\n'); raise SystemExit(3)"
    server = ManagedServer([sys.executable, "-c", loud], None, tmp_path / "a.log")
    server.start()
    try:
        with pytest.raises(ServerStartError) as err:
            server.wait_ready(["http://127.0.0.1:9/health"], timeout_s=20, poll_s=0.05)
    finally:
        server.stop(5)
    assert err.value.code == "server_exited" and "ImportError: no engine" in err.value.message
    monkeypatch.setattr(shutil, "disk_usage", fake_usage(2048.0, watched=tmp_path))
    server = ManagedServer([sys.executable, "-c", "raise SystemExit(1)"], None, tmp_path / "b.log")
    server.start()
    try:
        with pytest.raises(ServerStartError) as err:
            server.wait_ready(["http://127.0.0.1:9/health"], timeout_s=20, poll_s=0.05)
    finally:
        server.stop(5)
    assert err.value.code == "server_exited"


def test_disk_full_is_a_declared_failure_reason():
    from benchkit.execution import outcome

    assert "disk_full" in (outcome.RunOutcome.__doc__ or "")
    doc = (Path(__file__).resolve().parents[1] / "docs" / "ARCHITECTURE.md").read_text()
    assert "`dataset_error`, `disk_full`" in doc


# ---------------------------------------------------------------------------------------------
# A real full filesystem: a 2 MiB tmpfs (root only)


@pytest.fixture
def small_tmpfs():
    """A 2 MiB tmpfs mounted under /tmp, unmounted afterwards; skipped without root."""
    if os.geteuid() != 0:
        pytest.skip("mounting a 2 MiB tmpfs needs root (mount -t tmpfs); run as root to test a real full disk")
    base = Path(os.environ.get("DRAFTBOARD_VAR_DIR") or "/tmp") / f"diskfull-{uuid.uuid4().hex[:8]}"
    base.mkdir(parents=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(base)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        base.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield base
    finally:
        subprocess.run(["umount", "-l", str(base)], check=False)
        base.rmdir()


def fill(folder: Path) -> None:
    """Write into `folder` until its filesystem refuses with ENOSPC."""
    with open(folder / "filler", "wb") as fh:
        try:
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    assert shutil.disk_usage(folder).free < MIB


def test_real_small_tmpfs_fails_preflight_disk_full(standin_flags, small_tmpfs):
    runs = small_tmpfs / "runs"
    out = execute_run(standin_spec(standin_flags), workdir=runs / "run-1")
    assert out.reason == "disk_full", (out.reason, out.message, out.server_log_tail)
    assert str(runs) in out.message and "below the minimum 512 MiB" in out.message
    assert standin.standin_pids() == []


def test_real_full_tmpfs_server_exit_is_disk_full_not_server_exited(standin_flags, small_tmpfs, monkeypatch):
    """The issue's case: preflight's minimum set to 0 lets the run start on a full tmpfs; the server
    cannot write its file (STANDIN_REPORT on the tmpfs) nor its traceback (the log is on it too),
    and exits with an empty log."""
    monkeypatch.setenv(MIN_FREE_ENV, "0")
    runs = small_tmpfs / "runs"
    runs.mkdir()
    fill(small_tmpfs)
    workdir = runs / "run-1"
    out = execute_run(standin_spec(standin_flags, STANDIN_REPORT=str(workdir / "report.jsonl")), workdir=workdir)
    assert out.reason == "disk_full", (out.reason, out.message, out.server_log_tail)
    assert str(workdir / "server.log") in out.message and f"folder {workdir}" in out.message
    assert "MiB free" in out.message and out.server_log_tail == ""
    assert standin.standin_pids() == []
