"""Provenance from the engine's own environment, stored with the run and shown on the run page;
a container that outlived its runtime's stop quarantines the host."""

from __future__ import annotations

import pytest
from django.urls import reverse

from benchkit.execution.outcome import RunOutcome
from runs.models import Host, Run
from runs.services.outcomes import store_outcome
from runs.services.transitions import transition
from tests.factories import make_run, make_sweep

pytestmark = pytest.mark.django_db

SGLANG_PR = {
    "build": "sglang-ddtree-pr", "module": "sglang", "distribution": "sglang", "version": "0.5.3rc1",
    "git_commit": "3f2a9c1d0b8e7f6a5c4d3e2f1a0b9c8d7e6f5a4b", "commit_source": "git checkout of the source tree",
    "torch_version": "2.8.0+cu128", "torch_cuda": "12.8", "python_version": "3.12.3",
    "python_executable": "/opt/sglang-ddtree/bin/python",
    "launcher": {"kind": "interpreter", "python": "/opt/sglang-ddtree/bin/python"},
}


def failed_with(run: Run, **outcome) -> Run:
    transition(run, "preflight")
    return store_outcome(run, RunOutcome(ok=False, reason="server_exited", message="exit 1", **outcome))


def test_provenance_is_stored_and_shown(client):
    run = failed_with(make_run(make_sweep()), provenance=SGLANG_PR, engine_version="0.5.3rc1",
                      engine_commit=SGLANG_PR["git_commit"], port=30017)
    run = Run.objects.get(pk=run.pk)
    assert run.provenance == SGLANG_PR and run.engine_version == "0.5.3rc1" and run.server_port == 30017
    html = client.get(reverse("analysis:run_detail", args=[run.pk])).content.decode()
    row = html[html.index('id="provenance"'):html.index("</tr>", html.index('id="provenance"'))]
    for text in ("sglang 0.5.3rc1", SGLANG_PR["git_commit"], "git checkout of the source tree",
                 "build sglang-ddtree-pr", "/opt/sglang-ddtree/bin/python", "Python 3.12.3",
                 "torch 2.8.0+cu128, CUDA 12.8"):
        assert text in row, text
    assert "not readable" not in row
    assert "port 30017" in html


def test_a_version_that_cannot_be_read_says_so(client):
    provenance = {"build": "fork", "module": "sglang", "version": None, "git_commit": None,
                  "version_error": "module 'sglang' is found at /src/sglang/__init__.py, but no installed "
                                   "distribution provides it (a source tree on PYTHONPATH?)",
                  "launcher": {"kind": "container", "runtime": "podman", "image": "localhost/sglang:pr",
                               "image_id": "sha256:abc", "python": "python3", "argv": ["podman", "run"]},
                  "python_version": "3.12.3", "torch_version": None}
    run = failed_with(make_run(make_sweep()), provenance=provenance)
    html = client.get(reverse("analysis:run_detail", args=[run.pk])).content.decode()
    row = html[html.index('id="provenance"'):html.index("</tr>", html.index('id="provenance"'))]
    assert "engine version not readable" in row and "no installed distribution provides it" in row
    assert "container: podman image <code>localhost/sglang:pr</code> sha256:abc" in row
    assert "no torch installed" in row
    assert Run.objects.get(pk=run.pk).engine_version == ""


def test_runs_before_provenance_show_no_row(client):
    run = failed_with(make_run(make_sweep()))
    assert 'id="provenance"' not in client.get(reverse("analysis:run_detail", args=[run.pk])).content.decode()


def test_a_container_left_running_quarantines_the_host():
    run = make_run(make_sweep())
    teardown = {"clean": False, "survivors": [], "outside": {
        "argv": ["docker", "stop", "-t", "30", "draftboard-run-1-abc"], "returncode": 1, "clean": False,
        "running_after": True, "output": "Error response from daemon: cannot stop container"}}
    failed_with(run, teardown=teardown)
    host = Host.objects.get(pk=run.host_id)
    assert host.quarantined and "docker stop -t 30 draftboard-run-1-abc" in host.quarantine_reason
