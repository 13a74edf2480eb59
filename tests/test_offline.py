"""Offline GPU hosts (issue 11): `python -m benchkit run` writes a bundle against the synthetic
server (an external endpoint, no vLLM, no database, no broker); `manage.py ingest` and
`POST /api/ingest/` store it once, with a per-host token, refusing what does not match."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command
from django.urls import reverse

from benchkit.__main__ import run_sweep_offline
from benchkit.execution.bundle import MANIFEST, BundleError, open_bundle, open_bundle_tar, sha256_hex, tar_bundle
from benchkit.measure.logs import decode_logs
from benchkit.sweeps.sweepfile import PointsRefused
from runs.models import HardwareSnapshot, Host, HostToken, RequestLogBlob, Run, RunMetrics, RunState, RunTransition
from runs.services import ingest
from tests.synthetic_server import SyntheticConfig, SyntheticServer
from tests.test_allocation import h200_inventory

REPO = Path(__file__).resolve().parents[1]
HOST = "gpu-offline"
NUM_PROMPTS = 3
#: 16 output tokens a request: 1 (prefill), then messages of 4, 4, 4, 3 tokens = 4 draft steps of
#: k=3 draft tokens with 3 + 3 + 3 + 2 = 11 accepted: acceptance length 1 + 11/4
SERVER = SyntheticConfig(ttft_ms=5, gap_ms=3, tokens_per_message=4, first_message_tokens=1, spec_k=3)


def sweep_text(url: str, name: str = "offline-grid", concurrency=(1, 2), num_prompts: int = NUM_PROMPTS,
               ready_timeout_s: int = 30, share_server: bool = True) -> str:
    return f"""
name: {name}
share_server: {str(share_server).lower()}
engine: external
model: synthetic
server: {{endpoint_url: "{url}", served_model_name: synthetic}}
grid:
  tp: [1]
  methods: [{{method: draft_model, num_speculative_tokens: 3, drafter: /models/drafter}}]
  concurrency: {list(concurrency)}
  output_len: [16]
  input_len: [8]
workload: {{num_prompts: {num_prompts}, ignore_eos: true}}
limits: {{ready_timeout_s: {ready_timeout_s}, request_timeout_s: 30}}
"""


def benchkit_run(sweep: Path, out: Path, *extra: str, wait: bool = True):
    """`python -m benchkit run` in a child process without Django settings in its environment."""
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL")}
    argv = [sys.executable, "-m", "benchkit", "run", str(sweep), "--out", str(out), "--host", HOST, *extra]
    if not wait:
        return subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory) -> Path:
    """A bundle of two runs (concurrency 1 and 2, one shared server) on the synthetic server."""
    root = tmp_path_factory.mktemp("offline")
    with SyntheticServer(SERVER) as url:
        (root / "sweep.yaml").write_text(sweep_text(url))
        out = benchkit_run(root / "sweep.yaml", root / "bundle")
    assert out.returncode == 0, out.stdout + out.stderr
    return root / "bundle"


@pytest.fixture
def bundle(bundle_dir, tmp_path) -> Path:
    """A private copy of the bundle (a test may damage it)."""
    return Path(shutil.copytree(bundle_dir, tmp_path / "bundle"))


# --- the bundle (no Django) ----------------------------------------------------------------------

def test_offline_run_writes_every_run_with_its_figures_logs_and_inventory(bundle_dir):
    b = open_bundle(bundle_dir)
    m = b.manifest
    assert m.host == HOST and m.sweep_name == "offline-grid" and "offline-grid" in m.sweep_text
    assert [e.state for e in m.runs] == ["succeeded", "succeeded"]
    assert sorted(p.name for p in (bundle_dir / "runs").iterdir()) == sorted(Path(e.file).name for e in m.runs)
    concurrencies = []
    for entry in m.runs:
        assert sha256_hex((bundle_dir / entry.file).read_bytes()) == entry.sha256
        run = b.run(entry)
        concurrencies.append(run.spec["workload"]["concurrency"])
        assert run.point_key == run.run_spec().point_key() and run.uuid == entry.uuid
        assert run.metrics.completed == NUM_PROMPTS and run.metrics.total_output_tokens == 16 * NUM_PROMPTS
        assert run.metrics.acceptance_length == pytest.approx(1 + 11 / 4) and run.spec_source == "vllm"
        logs = run.logs
        assert len([r for r in logs if not r.warmup]) == NUM_PROMPTS and all(r.ok for r in logs)
        assert run.window_start_ns < run.window_end_ns and len(logs) > NUM_PROMPTS  # the warmup is kept
        assert run.inventory["hostname"] and "fingerprint" in run.inventory
        assert run.server_shared and run.provenance.get("build") == "external"
    assert concurrencies == [1, 2]


def test_a_sweep_killed_mid_run_leaves_only_complete_runs(tmp_path):
    """SIGKILL while the second run measures: the manifest lists the first run only, every listed
    file checks, and no file of the killed run looks complete. (Runs that share a server start are
    written when it stops, so this sweep gives each run its own.)"""
    slow = SyntheticConfig(ttft_ms=5, gap_ms=40, tokens_per_message=1)
    with SyntheticServer(slow) as url:
        (tmp_path / "sweep.yaml").write_text(sweep_text(url, concurrency=(1, 2), num_prompts=6,
                                                             share_server=False))
        proc = benchkit_run(tmp_path / "sweep.yaml", tmp_path / "bundle", "--no-progress", wait=False)
        manifest = tmp_path / "bundle" / MANIFEST
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if manifest.exists() and json.loads(manifest.read_text())["runs"]:
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    b = open_bundle(tmp_path / "bundle")
    assert len(b.manifest.runs) == 1
    assert b.run(b.manifest.runs[0]).state == "succeeded"
    files = [p.name for p in (tmp_path / "bundle" / "runs").iterdir() if not p.name.startswith(".tmp-")]
    assert files == [Path(b.manifest.runs[0].file).name]


def test_a_bundle_folder_is_never_written_twice(bundle_dir, tmp_path):
    out = benchkit_run(bundle_dir.parent / "sweep.yaml", bundle_dir)
    assert out.returncode == 2 and "exists" in out.stderr


def test_the_tar_form_reads_the_same_bundle_and_a_cut_archive_is_refused(bundle_dir):
    data = tar_bundle(bundle_dir)
    b = open_bundle_tar(io.BytesIO(data))
    assert [b.run(e).uuid for e in b.manifest.runs] == [e.uuid for e in open_bundle(bundle_dir).manifest.runs]
    with pytest.raises(BundleError, match="<archive>"):
        open_bundle_tar(io.BytesIO(data[: len(data) // 2]))
    runs_only = io.BytesIO()
    with tarfile.open(fileobj=runs_only, mode="w:gz") as tar:
        tar.add(bundle_dir / "runs", arcname="runs")
    with pytest.raises(BundleError, match="manifest.json: not in the archive"):
        open_bundle_tar(io.BytesIO(runs_only.getvalue()))


# --- ingest ---------------------------------------------------------------------------------------

def _counts() -> tuple[int, ...]:
    return (Run.objects.count(), RunMetrics.objects.count(), RequestLogBlob.objects.count(),
            HardwareSnapshot.objects.count(), RunTransition.objects.count())


@pytest.mark.django_db
def test_ingest_stores_each_run_once_and_a_second_ingest_is_a_noop(bundle):
    out = io.StringIO()
    call_command("ingest", str(bundle), stdout=out)
    b = open_bundle(bundle)
    runs = {r.run_uuid: r for r in Run.objects.select_related("metrics", "request_logs", "sweep")}
    assert len(runs) == 2 and out.getvalue().count("stored ") == 2
    for entry in b.manifest.runs:
        src, row = b.run(entry), runs[entry.uuid]
        assert row.state == RunState.SUCCEEDED and row.host.name == HOST and row.point_key == src.point_key
        assert row.sweep.source == f"bundle:{b.manifest.bundle_id}" and row.sweep.name == "offline-grid"
        assert row.concurrency == src.spec["workload"]["concurrency"] and row.engine == "external"
        assert row.metrics.acceptance_length == pytest.approx(src.metrics.acceptance_length)
        assert row.metrics.median_ttft_ms == pytest.approx(src.metrics.median_ttft_ms)
        assert decode_logs(bytes(row.request_logs.data)) == src.logs
        assert row.provenance == src.provenance and row.finished_at == src.finished_at
        assert any("ingested from offline bundle" in t.note for t in row.transitions.all())
    assert HardwareSnapshot.objects.filter(host__name=HOST).count() == 1
    before = _counts()
    again = io.StringIO()
    call_command("ingest", str(bundle), stdout=again)
    assert _counts() == before
    assert again.getvalue().count("nothing changed") == 2 and "0 stored, 2 ingested before (no-op)" in again.getvalue()


@pytest.mark.django_db
def test_a_truncated_run_file_is_refused_by_name_and_the_other_run_stored(bundle):
    b = open_bundle(bundle)
    cut = bundle / b.manifest.runs[1].file
    cut.write_bytes(cut.read_bytes()[:1000])
    with pytest.raises(CommandError, match="1 run file"):
        call_command("ingest", str(bundle), stdout=io.StringIO(), stderr=(err := io.StringIO()))
    assert f"{b.manifest.runs[1].file}: sha256" in err.getvalue() and "truncated" in err.getvalue()
    assert list(Run.objects.values_list("run_uuid", flat=True)) == [b.manifest.runs[0].uuid]


@pytest.mark.django_db
def test_a_changed_run_file_with_a_matching_manifest_is_still_refused(bundle):
    """The manifest's sha256 updated to a damaged file: the pydantic boundary still refuses it."""
    b = open_bundle(bundle)
    entry = b.manifest.runs[0]
    data = json.loads((bundle / entry.file).read_text())
    data["metrics"]["acceptance_length"] = 0.5  # below the schema's bound (>= 1)
    raw = json.dumps(data).encode()
    (bundle / entry.file).write_bytes(raw)
    manifest = json.loads((bundle / MANIFEST).read_text())
    manifest["runs"][0]["sha256"] = hashlib.sha256(raw).hexdigest()
    (bundle / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CommandError):
        call_command("ingest", str(bundle), stdout=io.StringIO(), stderr=(err := io.StringIO()))
    assert f"{entry.file}: metrics.acceptance_length" in err.getvalue()
    assert not Run.objects.filter(run_uuid=entry.uuid).exists() and Run.objects.count() == 1


@pytest.mark.django_db
def test_a_truncated_manifest_or_another_host_stores_nothing(bundle):
    with pytest.raises(CommandError, match=f"from host '{HOST}', not 'gpu-other' \\(nothing stored\\)"):
        call_command("ingest", str(bundle), "--host", "gpu-other", stdout=io.StringIO())
    with pytest.raises(CommandError, match="no bundle given"):  # not the current folder read as one
        call_command("ingest", " ", stdout=io.StringIO())
    (bundle / MANIFEST).write_bytes((bundle / MANIFEST).read_bytes()[:200])
    with pytest.raises(CommandError, match="manifest.json: .*nothing stored"):
        call_command("ingest", str(bundle), stdout=io.StringIO())
    assert _counts() == (0, 0, 0, 0, 0) and not Host.objects.exists()


@pytest.mark.django_db
def test_a_failed_offline_run_is_stored_failed_with_its_reason(tmp_path):
    dead = "http://127.0.0.1:9"  # discard port: nothing answers
    (tmp_path / "sweep.yaml").write_text(sweep_text(dead, name="dead", concurrency=(1,), ready_timeout_s=1))
    out = benchkit_run(tmp_path / "sweep.yaml", tmp_path / "bundle")
    assert out.returncode == 1, out.stdout + out.stderr
    call_command("ingest", str(tmp_path / "bundle"), stdout=io.StringIO())
    run = Run.objects.get()
    assert run.state == RunState.FAILED and run.failure_reason == "server_not_ready"
    assert not RunMetrics.objects.exists()


def test_a_point_the_host_cannot_hold_refuses_the_sweep_before_anything_runs(tmp_path):
    """Issue 19, offline: the same located errors as `start_sweep` (a TP above the host's GPU count,
    a pinned GPU it lacks), exit status 2, no bundle folder, no server asked. In process on the
    real 2 x H200 inventory; then through `python -m benchkit run` on this machine's own inventory
    (TP64 fits no host this runs on)."""
    text = sweep_text("http://127.0.0.1:9").replace("tp: [1]", "tp: [1, 2, 3]") + "gpus:\n  2: [1, 2]\n"
    path = tmp_path / "sweep.yaml"
    path.write_text(text)
    line = {row.split(":")[0].strip(): n for n, row in enumerate(text.splitlines(), start=1)}
    with pytest.raises(PointsRefused) as err:
        run_sweep_offline(path, tmp_path / "bundle", host=HOST, inventory=h200_inventory())
    assert str(err.value).splitlines() == [
        f"{path}:{line['tp']}: grid.tp[2]: host {HOST}: TP3 needs 3 GPUs; the host has 2 GPUs [0, 1]",
        f"{path}:{line['2']}: gpus.2: host {HOST}: pinned GPUs [2] are not on the host: the host has 2 GPUs [0, 1]",
    ]
    assert not (tmp_path / "bundle").exists()
    path.write_text(sweep_text("http://127.0.0.1:9").replace("tp: [1]", "tp: [1, 64]"))
    out = benchkit_run(path, tmp_path / "bundle")
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.splitlines()
    assert re.fullmatch(rf"error: {re.escape(str(path))}:{line['tp']}: grid\.tp\[1\]: host {HOST}: TP64 needs 64 GPUs; "
                        r"the host has (\d+ GPUs \[[\d, ]+\]|no GPUs in its inventory.*)", lines[0]), lines
    assert lines[1:] == ["nothing ran"] and not (tmp_path / "bundle").exists()


# --- over HTTP, with a host token -------------------------------------------------------------------

def _post(client, data: bytes, token: str | None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    return client.post("/api/ingest/", data=data, content_type="application/gzip", **headers)


@pytest.mark.django_db
def test_http_ingest_with_the_hosts_token_then_again_as_a_noop(client, bundle_dir):
    row, token = ingest.create_token(Host.objects.create(name=HOST), "lab")
    assert row.token_sha256 == hashlib.sha256(token.encode()).hexdigest()
    assert not HostToken.objects.filter(token_sha256=token).exists()
    first = _post(client, tar_bundle(bundle_dir), token)
    assert first.status_code == 200, first.content
    assert (first.json()["stored"], first.json()["existing"]) == (2, 0)
    before = _counts()
    second = _post(client, tar_bundle(bundle_dir), token)
    assert second.status_code == 200 and (second.json()["stored"], second.json()["existing"]) == (0, 2)
    assert _counts() == before


@pytest.mark.django_db
def test_http_ingest_refuses_wrong_revoked_missing_and_other_hosts_tokens(client, bundle_dir):
    data = tar_bundle(bundle_dir)
    host = Host.objects.create(name=HOST)
    _, other_token = ingest.create_token(Host.objects.create(name="gpu-elsewhere"), "other")
    revoked, revoked_token = ingest.create_token(host, "old")
    assert ingest.revoke_tokens([revoked]) == 1
    assert _post(client, data, "dbh_not-a-token").status_code == 403
    resp = _post(client, data, revoked_token)
    assert resp.status_code == 403 and "revoked" in resp.json()["error"]
    resp = _post(client, data, other_token)
    assert resp.status_code == 403 and "gpu-elsewhere" in resp.json()["error"]
    # issue 31: one pair of quotes around the host name (was "'gpu-elsewhere''s")
    assert "the token belongs to host 'gpu-elsewhere'" in resp.json()["error"] and "''" not in resp.json()["error"]
    # issue 31: a chunked upload (no Content-Length) was "ReadError: empty file"; now 411 saying what to send
    _, good_token = ingest.create_token(host, "new")
    resp = client.post("/api/ingest/", data=data, content_type="application/gzip", CONTENT_LENGTH="",
                       HTTP_TRANSFER_ENCODING="chunked", HTTP_AUTHORIZATION=f"Bearer {good_token}")
    assert resp.status_code == 411 and "chunked uploads (no Content-Length header) are not accepted" in \
        resp.json()["error"] and "empty file" not in resp.json()["error"]
    assert _post(client, data, None).status_code == 401
    assert _counts() == (0, 0, 0, 0, 0)


@pytest.mark.django_db
def test_http_ingest_of_a_cut_archive_is_a_clear_400(client, bundle_dir):
    _, token = ingest.create_token(Host.objects.create(name=HOST), "lab")
    data = tar_bundle(bundle_dir)
    resp = _post(client, data[: len(data) - 100], token)
    assert resp.status_code == 400 and "<archive>" in resp.json()["error"]
    assert _counts() == (0, 0, 0, 0, 0)


# --- tokens in the admin ------------------------------------------------------------------------------

def _staff(username: str, *perms: str) -> User:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


@pytest.mark.django_db
def test_admin_creates_a_token_shown_once_and_only_revokers_revoke(client, bundle_dir):
    host = Host.objects.create(name=HOST)
    client.force_login(_staff("viewer", "view_hosttoken"))
    assert client.post(reverse("admin:runs_hosttoken_add"), {"host": host.pk, "name": "x"}).status_code == 403
    client.force_login(_staff("maker", "view_hosttoken", "add_hosttoken"))
    resp = client.post(reverse("admin:runs_hosttoken_add"), {"host": host.pk, "name": "lab box"})
    assert resp.status_code == 200 and "no-store" in resp["Cache-Control"]
    token = resp.content.decode().split('id="host-token"')[1].split(">")[1].split("<")[0]
    row = HostToken.objects.get()
    assert row.token_sha256 == ingest.token_hash(token) and row.created_by == "maker" and token.startswith("dbh_")
    assert token not in client.get(reverse("admin:runs_hosttoken_changelist")).content.decode()
    # a maker without the revoke permission: 403, the token still works
    resp = client.post(reverse("admin:runs_hosttoken_changelist"), {"action": "revoke", "_selected_action": [row.pk]})
    assert resp.status_code == 403 and HostToken.objects.get().revoked_at is None
    client.force_login(_staff("revoker", "view_hosttoken", "revoke_hosttoken"))
    resp = client.post(reverse("admin:runs_hosttoken_changelist"), {"action": "revoke", "_selected_action": [row.pk]})
    assert resp.status_code == 302 and HostToken.objects.get().revoked_at is not None
    client.logout()
    assert _post(client, tar_bundle(bundle_dir), token).status_code == 403
    assert not Run.objects.exists()
