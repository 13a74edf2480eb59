"""Engine builds as users run them: free ports chosen at run time (the engine's derived ports
too), each build's own interpreter or launcher, provenance read from that environment, and the
build's preflight. Servers are the stand-in engine (tests/standin), a real process."""

from __future__ import annotations

import errno
import socket

import pytest

from benchkit.engines.adapters import adapter_for
from benchkit.specs import Limits, RunSpec, ServerConfig, WorkloadSpec
from benchkit.sweeps.runner import choose_port, execute_run
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
def taken_default_ports(monkeypatch):
    """vLLM's and SGLang's default ports moved to ports this test holds (as if another program
    listened on 8000 / 30000), so that the test never takes 8000 from other tests of this shared
    machine. Yields {engine: held socket}."""
    from benchkit.engines import adapters

    held = {}
    for engine in ("vllm", "sglang"):
        while True:
            s = hold()
            if s.getsockname()[1] + 239 < 65536:
                break
            s.close()
        held[engine] = s
        monkeypatch.setitem(adapters.DEFAULT_PORTS, engine, s.getsockname()[1])
    yield held
    for s in held.values():
        s.close()


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


def test_choose_port_skips_a_taken_default_port_and_checks_derived_ports_together(taken_default_ports):
    vllm, sgl = adapter_for("vllm"), adapter_for("sglang")
    default = vllm.default_port
    assert default == taken_default_ports["vllm"].getsockname()[1]
    p = choose_port(vllm)
    assert default < p < default + 200
    # SGLang: a main port whose derived port (port + 233, its dist-init port) is taken is skipped
    start = choose_port(sgl, start=sgl.default_port + 1)
    derived = hold(start + 233)
    try:
        q = choose_port(sgl, start=start)
    finally:
        if derived:
            derived.close()
    assert derived is None or q != start
    for port in sgl.port_span(q):
        s = hold(port)
        assert s is not None, f"derived port {port} is taken"
        s.close()


def test_unpinned_run_gets_a_free_port_when_the_default_is_taken(standin_flags, taken_default_ports):
    spec = standin_spec(standin_flags)
    out = execute_run(spec, workdir=standin_flags / "w")
    assert out.ok, (out.reason, out.message, out.server_log_tail)
    assert out.port not in (None, taken_default_ports["vllm"].getsockname()[1])
    assert out.argv[out.argv.index("--port") + 1] == str(out.port)
    assert spec.port is None  # the chosen port is recorded with the run, not written into the spec
    assert standin.standin_pids() == []


def test_pinned_port_is_used_as_given_and_a_taken_one_fails(standin_flags):
    s = hold()
    taken = s.getsockname()[1]
    try:
        out = execute_run(standin_spec(standin_flags, port=taken), workdir=standin_flags / "w")
    finally:
        s.close()
    assert not out.ok and out.reason == "port_in_use" and str(taken) in out.message
    free = choose_port(adapter_for("vllm"), start=taken + 1)
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
