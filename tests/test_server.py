"""ManagedServer against real child processes (no stand-ins): a small http.server child, a
child that forks a grandchild, and children that exit or never answer."""

from __future__ import annotations

import os
import socket
import sys
import textwrap
import time

import psutil
import pytest

from benchkit.engines.server import ManagedServer, ServerStartError
from benchkit.hosts.teardown import group_members


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# A tiny HTTP server: /health answers 200 at once, /v1/models 200, anything else 404.
HTTP_CHILD = textwrap.dedent(
    """
    import http.server, sys
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            code = 200 if self.path in ("/health", "/v1/models") else 404
            self.send_response(code); self.end_headers(); self.wfile.write(b"ok")
        def log_message(self, *a):
            pass
    print("child starting", flush=True)
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
    """
)

# Forks a grandchild that sleeps (same process group), prints both pids, then sleeps itself.
FORKING_CHILD = textwrap.dedent(
    """
    import subprocess, sys, time
    g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print("grandchild", g.pid, flush=True)
    time.sleep(600)
    """
)


def test_start_wait_ready_log_tail_stop(tmp_path):
    port = _free_port()
    log = tmp_path / "server.log"
    srv = ManagedServer([sys.executable, "-c", HTTP_CHILD, str(port)], env=None, log_path=log)
    srv.start()
    try:
        assert srv.pid == srv.pgid
        assert os.getpgid(srv.pid) == srv.pid  # leader of its own group
        assert os.getpgid(srv.pid) != os.getpgid(0)
        taken = srv.wait_ready(
            [f"http://127.0.0.1:{port}/health", f"http://127.0.0.1:{port}/v1/models"], 30, 0.1
        )
        assert taken >= 0
        assert srv.alive()
        assert "child starting" in srv.log_tail(5)
    finally:
        report = srv.stop(term_timeout_s=10)
    assert report.clean
    assert srv.pid in report.terminated
    assert not srv.alive()
    assert not psutil.pid_exists(srv.pid)  # reaped, not a zombie


def test_stop_cleans_group_including_grandchild(tmp_path):
    log = tmp_path / "fork.log"
    with ManagedServer([sys.executable, "-c", FORKING_CHILD], env=dict(os.environ), log_path=log) as srv:
        for _ in range(300):
            if "grandchild" in srv.log_tail() or not srv.alive():
                break
            time.sleep(0.1)
        grandchild = int(srv.log_tail().split("grandchild")[1].split()[0])
        assert os.getpgid(grandchild) == srv.pgid
        assert set(group_members(srv.pgid)) >= {srv.pid, grandchild}
    report = srv.teardown
    assert report is not None and report.clean
    assert grandchild in report.terminated
    assert group_members(srv.pgid) == []
    assert not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE


def test_server_exited_reports_exit_code_and_log(tmp_path):
    argv = [sys.executable, "-c", "import sys; print('boom: bad flag', flush=True); sys.exit(3)"]
    srv = ManagedServer(argv, env=None, log_path=tmp_path / "exit.log")
    srv.start()
    with pytest.raises(ServerStartError) as err:
        srv.wait_ready([f"http://127.0.0.1:{_free_port()}/health"], timeout_s=60, poll_s=0.1)
    srv.stop()
    assert err.value.code == "server_exited"
    assert "code 3" in err.value.message
    assert "boom: bad flag" in err.value.message
    assert srv.returncode == 3


def test_server_not_ready_on_timeout(tmp_path):
    port = _free_port()  # nothing listens there
    srv = ManagedServer([sys.executable, "-c", "import time; time.sleep(600)"], None, tmp_path / "slow.log")
    srv.start()
    try:
        with pytest.raises(ServerStartError) as err:
            srv.wait_ready([f"http://127.0.0.1:{port}/health"], timeout_s=0.5, poll_s=0.1)
        assert err.value.code == "server_not_ready"
        assert srv.alive()
    finally:
        report = srv.stop(term_timeout_s=5)
    assert report.clean


def test_non_200_is_not_ready(tmp_path):
    port = _free_port()
    srv = ManagedServer([sys.executable, "-c", HTTP_CHILD, str(port)], None, tmp_path / "404.log")
    with srv:
        with pytest.raises(ServerStartError) as err:
            srv.wait_ready([f"http://127.0.0.1:{port}/health_generate"], timeout_s=2, poll_s=0.1)
        assert err.value.code == "server_not_ready"
        assert "HTTP 404" in err.value.message


def test_bad_argv_and_stop_before_start(tmp_path):
    with pytest.raises(ValueError):
        ManagedServer("python -m x", None, tmp_path / "x.log")  # a shell string is refused
    srv = ManagedServer([str(tmp_path / "no-such-binary")], None, tmp_path / "x.log")
    assert srv.stop() is None
    with pytest.raises(ServerStartError) as err:
        srv.start()
    assert err.value.code == "server_not_started"
    with pytest.raises(ServerStartError):
        ManagedServer(["true"], None, tmp_path / "y.log").wait_ready(["http://127.0.0.1:1/"], 1)


def test_env_is_merged_over_parent_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTBOARD_PARENT_VAR", "from-parent")
    code = "import os; e = os.environ; print(e['DRAFTBOARD_PARENT_VAR'], e['DRAFTBOARD_CHILD_VAR'])"
    srv = ManagedServer(
        [sys.executable, "-c", code], {"DRAFTBOARD_CHILD_VAR": "from-env"}, tmp_path / "env.log"
    )
    srv.start()
    srv.proc.wait(timeout=60)
    srv.stop()
    assert srv.returncode == 0
    assert "from-parent from-env" in srv.log_tail()
