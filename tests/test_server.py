"""ManagedServer against real child processes (no stand-ins): a small http.server child, a
child that forks a grandchild, and children that exit or never answer."""

from __future__ import annotations

import os
import socket
import subprocess
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


# A process that starts the synthetic engine as a ManagedServer (tagged), prints its pid, then
# waits to be killed: it stands in for the Celery pool child that runs a benchmark.
STARTER = textwrap.dedent(
    """
    import sys, time
    from benchkit.engines.server import ManagedServer
    from benchkit.hosts.teardown import SERVER_TAG_ENV
    port, tag, log = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    srv = ManagedServer([sys.executable, "-m", "tests.synthetic_server", "--port", str(port)],
                        {SERVER_TAG_ENV: tag}, log)
    srv.start()
    srv.wait_ready([f"http://127.0.0.1:{port}/health"], 30, 0.1)
    print("leader", srv.pid, flush=True)
    time.sleep(600)
    """
)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _wait(cond, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def test_server_leader_dies_with_its_starter_and_the_tag_finds_the_rest(tmp_path):
    """Issue 11 item 2: SIGKILL the process that started a server. PDEATHSIG gives the leader
    SIGTERM at once; the leader's forked child (holding the port, as an engine's workers do)
    is left for the supervisor, which finds it by SERVER_TAG_ENV and stops its whole group."""
    from benchkit.hosts.teardown import stop_tagged_processes, tagged_processes

    port, tag = _free_port(), f"test-{os.getpid()}-{time.monotonic_ns()}"
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    starter = subprocess.Popen([sys.executable, "-c", STARTER, str(port), tag, str(tmp_path / "s.log")],
                               cwd=repo, stdout=subprocess.PIPE, text=True)
    try:
        line = starter.stdout.readline()
        assert line.startswith("leader"), line
        leader = int(line.split()[1])
        assert _wait(lambda: len(tagged_processes(tag)) == 2, 10)  # leader + its forked child
        assert set(tagged_processes(tag).values()) == {leader}  # one group, led by the server
        t0 = time.monotonic()
        starter.kill()
        starter.wait(timeout=10)
        assert _wait(lambda: not psutil.pid_exists(leader)
                     or psutil.Process(leader).status() == psutil.STATUS_ZOMBIE, 5), "PDEATHSIG did not stop it"
        assert time.monotonic() - t0 < 5
        left = tagged_processes(tag)
        assert len(left) == 1 and not _port_free(port)  # the child still holds the port
        report = stop_tagged_processes(tag, term_timeout_s=5)
        assert report.clean and set(left) <= set(report.terminated)
        assert tagged_processes(tag) == {} and _wait(lambda: _port_free(port), 5)
    finally:
        starter.kill()
        stop_tagged_processes(tag, term_timeout_s=2)


def test_tagged_teardown_never_signals_an_untagged_group(tmp_path):
    """A recorded group id whose processes carry another tag (or none) is left alone."""
    from benchkit.hosts.teardown import stop_tagged_processes

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True,
                             env={**os.environ, "DRAFTBOARD_SERVER_TAG": "someone-else"})
    try:
        report = stop_tagged_processes("not-this-one", term_timeout_s=1)
        assert report.clean and report.terminated == [] and other.poll() is None
    finally:
        other.kill()
        other.wait()
