"""Issue 14 end to end, through the real worker (a `celery worker` process, a real Redis):

- a sweep whose engine build points at a second virtualenv's interpreter: the server's process
  is that interpreter (the kernel's /proc/PID/exe), the stored engine version is the one that
  venv's distribution declares, and teardown leaves nothing behind;
- `manage.py demo` with something listening on vLLM's default port 8000: the demo sweep gets
  free ports and succeeds; pinned to a taken port it exits non-zero naming `port_in_use` and
  what to do (it used to print the dashboard URL and exit 0 with all 8 runs failed);
- issue 17: an engine that is not in the repository (tests/engine_standin.py, one module),
  registered by the environment variable DRAFTBOARD_ENGINES and given its flags in a flags file
  of the test's own, runs a sweep through the worker: no other project file knows it.

The engine is the stand-in (tests/standin: an OpenAI-compatible streaming server, standard
library only), because no real engine fits in a bare venv here."""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
from django.conf import settings
from django.db import connection

from benchkit.engines import registry
from benchkit.sweeps.sweepfile import load_sweep_file, parse_sweep
from runs import localstack
from runs.models import Run, RunState
from runs.services.hosts import get_or_create_host, record_inventory
from runs.services.sweeps import create_sweep
from tests import engine_standin, standin

pytestmark = [pytest.mark.celery]
REPO = Path(__file__).resolve().parents[1]


def _test_database_url() -> str:
    s = connection.settings_dict
    if s["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{s['NAME']}"
    return f"postgres://{s['USER']}:{s['PASSWORD'] or ''}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


def _worker(tmp_path: Path, monkeypatch, env_extra: dict[str, str]):
    """A real Celery worker (subprocess) on a fresh host queue against the test database, with
    `env_extra` in its environment (and in this process's). Yields (host name, log path)."""
    for key, value in env_extra.items():
        monkeypatch.setenv(key, value)
    was_up = localstack.ping(settings.CELERY_BROKER_URL)
    broker = localstack.ensure_redis(settings.CELERY_BROKER_URL, Path(settings.VAR_DIR))
    host_name = f"ci-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "DATABASE_URL": _test_database_url(), "CELERY_BROKER_URL": broker,
           "DRAFTBOARD_HOST": host_name, "DRAFTBOARD_RUNS_DIR": str(tmp_path / "runs"), **env_extra}
    log = open(tmp_path / "worker.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "celery", "-A", "benchsite", "worker", "-Q", f"host.{host_name}",
                             "-c", "1", "--loglevel", "INFO", "-n", f"{host_name}@%h"],
                            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    yield host_name, tmp_path / "worker.log"
    from benchkit.hosts.teardown import stop_process_group

    stop_process_group(proc.pid, term_timeout_s=20)
    proc.wait(timeout=10)
    log.close()
    if not was_up:
        localstack.stop_redis(Path(settings.VAR_DIR))


@pytest.fixture
def engine_venv_worker(tmp_path, monkeypatch):
    """A second venv holding the stand-in engine, a flags file whose build `standin-venv` runs it,
    and a real Celery worker (subprocess) on a fresh host queue that reads that flags file."""
    python = standin.make_venv(tmp_path)
    flags = standin.flags_file(tmp_path / "flags.yaml", engine="sglang", python=str(python), build="standin-venv")
    for host_name, log in _worker(tmp_path, monkeypatch, {"DRAFTBOARD_ENGINE_FLAGS": str(flags)}):
        yield python, host_name, log


def _wait_finished(sweep, timeout_s: float = 120) -> list[Run]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if set(Run.objects.filter(sweep=sweep).values_list("state", flat=True)) <= {RunState.SUCCEEDED,
                                                                                   RunState.FAILED}:
            break
        time.sleep(0.5)
    return list(Run.objects.filter(sweep=sweep).order_by("id"))


@pytest.mark.django_db(transaction=True)
def test_build_in_its_own_venv_runs_through_the_real_worker(engine_venv_worker, tmp_path):
    python, host_name, worker_log = engine_venv_worker
    host = get_or_create_host(host_name)
    record_inventory(host)
    report = tmp_path / "starts.jsonl"
    spec = parse_sweep({
        "name": "engine venv", "engine": "sglang", "engine_build": "standin-venv",
        "model": str(standin.model_dir(tmp_path)),
        "server": {"served_model_name": "demo", "load_format": "dummy", "env": {"STANDIN_REPORT": str(report)}},
        "grid": {"methods": ["auto"], "concurrency": [1, 2], "output_len": [16], "input_len": [16]},
        "workload": {"num_prompts": 8, "ignore_eos": True},
        "limits": {"ready_timeout_s": 60, "request_timeout_s": 30, "stop_timeout_s": 10},
    }, source="test")
    sweep = create_sweep(spec, host, source="test", enqueue=True)
    runs = _wait_finished(sweep)
    for r in runs:
        assert r.state == RunState.SUCCEEDED, (r.failure_reason, r.failure_message, worker_log.read_text()[-3000:])
        assert r.server_shared and r.argv[:3] == [str(python), "-m", "standin_engine"]
        assert r.engine_version == standin.DIST_VERSION
        p = r.provenance
        assert (p["distribution"], p["version"], p["build"]) == (standin.DIST_NAME, standin.DIST_VERSION,
                                                                 "standin-venv")
        assert p["python_executable"] == str(python) and p["launcher"] == {"kind": "interpreter",
                                                                           "python": str(python)}
        assert p["torch_version"] is None and "version_error" not in p
    starts = [json.loads(line) for line in report.read_text().splitlines()]
    assert len(starts) == 1  # the two runs shared one server start
    started = starts[0]
    # the kernel's view of the server process: the venv's own interpreter, not draftboard's
    assert os.path.realpath(started["proc_exe"]) == os.path.realpath(python) != os.path.realpath(sys.executable)
    assert started["executable"] == str(python)
    assert {r.server_port for r in runs} == {started["port"]}
    # teardown left nothing behind
    assert not psutil.pid_exists(started["pid"]) or psutil.Process(started["pid"]).status() == psutil.STATUS_ZOMBIE
    assert standin.standin_pids() == []


@pytest.fixture
def plugin_engine_worker(tmp_path, monkeypatch):
    """The stand-in engine as a plug-in: its module (tests/engine_standin.py) registered through
    DRAFTBOARD_ENGINES, its flags (`engines.standin`: the stand-in server from a second venv) in a
    flags file of this test's, a worker started with both."""
    python = standin.make_venv(tmp_path)
    flags = tmp_path / "flags.json"
    flags.write_text(json.dumps({"engines": {"standin": {
        "python": str(python),
        "launch": ["-m", "standin_engine", "--model", "{model}", "--host", "127.0.0.1", "--port", "{port}"],
        "options": {"served_model_name": "--served-model-name"},
        "methods": {"auto": {}, "ngram": {"speculative_config": {"method": "ngram", "num_speculative_tokens": "{k}"},
                                          "default_k": 3}}}}}))
    yield from _worker(tmp_path, monkeypatch, {registry.PLUGINS_ENV: engine_standin.ENTRY,
                                               "DRAFTBOARD_ENGINE_FLAGS": str(flags)})


@pytest.mark.django_db(transaction=True)
def test_a_plugin_engine_runs_a_sweep_through_the_real_worker(plugin_engine_worker, tmp_path):
    """Issue 17's done-when: one module + a registry entry, no other file. The worker resolves
    `standin` through the registry, starts the server from the engine's flags, checks its
    readiness paths, resets its cache between the two runs sharing a server (POST /flush_cache:
    a wrong path would fail the second run), renders the ngram config with the engine's own
    `speculative_config_args`, reads its version through the engine's build env, and tears down."""
    host_name, worker_log = plugin_engine_worker
    host = get_or_create_host(host_name)
    record_inventory(host)
    spec = parse_sweep({
        "name": "plug-in engine", "engine": "standin", "model": str(standin.model_dir(tmp_path)),
        "server": {"served_model_name": "demo", "load_format": "dummy"},
        "grid": {"methods": ["auto", {"method": "ngram"}], "concurrency": [1, 2], "output_len": [17],
                 "input_len": [16]},
        "workload": {"num_prompts": 8, "ignore_eos": True},
        "limits": {"ready_timeout_s": 60, "request_timeout_s": 30, "stop_timeout_s": 10},
    }, source="test")
    runs = _wait_finished(create_sweep(spec, host, source="test", enqueue=True))
    assert len(runs) == 4
    for r in runs:
        assert r.state == RunState.SUCCEEDED, (r.failure_reason, r.failure_message, worker_log.read_text()[-3000:])
        assert r.engine == "standin" and r.server_shared and r.engine_version == standin.DIST_VERSION
        assert r.argv[1:3] == ["-m", "standin_engine"] and r.server_port is not None
    ngram = [r for r in runs if r.method == "ngram"]
    assert len(ngram) == 2
    for r in ngram:
        assert r.argv[-2:] == ["--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": 3},
                                                                   sort_keys=True)]
        # the stand-in's first message carries 1 token, then each draft step 1 accepted draft + the
        # bonus token (standin_engine.ACCEPTED = 1): 17 tokens = 1 + 8 steps x 2, tau = 1 + 8 / 8
        assert r.metrics.acceptance_length == pytest.approx(2.0)
    assert all(r.metrics.acceptance_length is None for r in runs if r.method == "auto")
    assert standin.standin_pids() == []


def _hold(port: int) -> socket.socket | None:
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_demo_with_port_8000_taken(tmp_path, demo_models):
    """`manage.py demo` as a new user runs it, in a fresh var folder (SQLite, private Redis, its
    own web server, worker and beat), with vLLM's flags pointed at the stand-in engine."""
    var = tmp_path / "var"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL")}
    env.update(DRAFTBOARD_VAR_DIR=str(var), DRAFTBOARD_HOST=f"demo-{uuid.uuid4().hex[:8]}",
               DRAFTBOARD_MODELS_DIR=str(demo_models.root),
               DRAFTBOARD_ENGINE_FLAGS=str(standin.flags_file(tmp_path / "flags.yaml")),
               PYTHONPATH=os.pathsep.join(filter(None, [str(standin.STANDIN_SRC), os.environ.get("PYTHONPATH")])))
    web = f"127.0.0.1:{_free_port()}"

    def demo(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "manage.py", "demo", "--web", web, "--timeout", "480", *args],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=700)

    held = _hold(8000)  # None: another program holds it already, which is the case to test
    pinned = held or _hold(0)
    try:
        ok = demo()
        assert ok.returncode == 0, ok.stdout[-3000:] + ok.stderr[-3000:]
        assert "Dashboard: http://" in ok.stdout
        report = next(ln for ln in ok.stdout.splitlines() if ln.startswith("Report:"))  # issue 23
        if shutil.which("pdflatex") and importlib.util.find_spec("kaleido"):
            pdf = Path(report.split()[1])
            assert pdf.suffix == ".pdf" and pdf.read_bytes().startswith(b"%PDF"), report
        db = sqlite3.connect(var / "draftboard.sqlite3")
        rows = db.execute("select state, server_port from runs_run").fetchall()
        n_runs = load_sweep_file(REPO / "sweeps" / "demo.yaml",
                                 variables={"demo_target": "t", "demo_draft": "d", "demo_prompts": "p"}).n_runs()
        assert len(rows) == n_runs and {s for s, _ in rows} == {"succeeded"}
        assert "decode speedup" in ok.stdout and "lossless" in ok.stdout  # the demo's table
        # issue 33: real text in three categories, the category matrix and one sentence each
        assert "Per category at TP1, concurrency 1" in ok.stdout
        assert all(f"  on {cat}: " in ok.stdout for cat in ("code", "prose", "structured")), ok.stdout[-3000:]
        if held is not None:  # we held 8000 throughout: every server was given another port
            assert 8000 not in {p for _, p in rows}
        sweep = tmp_path / "pinned.yaml"
        sweep.write_text((REPO / "sweeps" / "demo.yaml").read_text() + f"port: {pinned.getsockname()[1]}\n")
        failed = demo("--sweep-file", str(sweep))
        assert failed.returncode == 1, failed.stdout[-3000:]
        message = failed.stderr
        assert "no run of sweep" in message and "succeeded" in message
        assert f"port_in_use: {n_runs} run(s), e.g. port {pinned.getsockname()[1]} is in use" in message
        assert "what to do: another program listens on the sweep file's pinned port" in message
        assert "Dashboard:" not in failed.stdout
    finally:
        if held:
            held.close()
        if pinned is not held:
            pinned.close()
        subprocess.run([sys.executable, "manage.py", "stop_services"], cwd=REPO, env=env, timeout=120)
    assert standin.standin_pids() == []
