"""Acceptance-controlled twins on an offline host (issue 21's twins, issue 11's bundles): a sweep
file asking `twin: {acceptance: pinned, tau: ...}` run by `python -m benchkit run`'s code runs the
twin beside its real run (the synthetic engine build, a managed server speaking vLLM's API); the
bundle names the twin's real run; ingest stores it linked, pinned and out of every count. A
bundle run that pins acceptance without naming its real run is refused, and a twin whose real run
is not in the bundle is refused at ingest."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from benchkit.__main__ import run_sweep_offline
from benchkit.execution.bundle import MANIFEST, BundleError, open_bundle, sha256_hex
from benchkit.hosts.inventory import HostInventory
from benchkit.specs import RunSpec
from benchkit.sweeps import twins
from runs.models import Run
from runs.services import ingest
from tests.celeryproc import SYNTHETIC_FLAGS, synthetic_model, twin_sweep_doc

GOLDEN, REAL_TAU, K = 2.5, 2.0, 3
HOST = "twin-offline"


@pytest.fixture(scope="module")
def twin_bundle(tmp_path_factory):
    """A bundle of auto, the draft_model run and its twin pinned at the golden tau."""
    root = tmp_path_factory.mktemp("offline-twin")
    mp = pytest.MonkeyPatch()
    mp.setenv("DRAFTBOARD_ENGINE_FLAGS", str(SYNTHETIC_FLAGS))
    try:
        model = synthetic_model(root)
        doc = twin_sweep_doc(model, {"acceptance": "pinned", "tau": GOLDEN}, name="offline-twin-night",
                             output_len=64, num_prompts=4, k=K)
        (root / "sweep.yaml").write_text(yaml.safe_dump(doc))
        summary = run_sweep_offline(root / "sweep.yaml", root / "bundle", host=HOST,
                                    inventory=HostInventory(hostname=HOST, gpus=[]), progress=False)
    finally:
        mp.undo()
    assert (summary.succeeded, summary.failed) == (3, 0)
    return root / "bundle"


def _runs(bundle_dir):
    bundle = open_bundle(bundle_dir)
    return bundle, [bundle.run(e) for e in bundle.manifest.runs]


def test_the_offline_bundle_names_the_twins_real_run(twin_bundle):
    _, runs = _runs(twin_bundle)
    [twin] = [r for r in runs if r.twin_of is not None]
    real = next(r for r in runs if r.uuid == twin.twin_of)
    assert RunSpec.from_dict(real.spec).server.method == "draft_model" and real.twin_of is None
    assert RunSpec.from_dict(twin.spec).server.acceptance_tau == GOLDEN and twin.pinned_tau_source == twins.GOLDEN
    assert twin.point_key != real.point_key


@pytest.mark.django_db
def test_ingest_links_the_twin_and_keeps_it_out_of_the_counted_runs(twin_bundle):
    bundle, _ = _runs(twin_bundle)
    report = ingest.ingest_bundle(bundle)
    assert [r.status for r in report.runs] == ["stored"] * 3, report.to_dict()
    runs = {r.method if r.twin_of_id is None else "twin": r
            for r in Run.objects.filter(sweep_id=report.sweep_id).select_related("metrics")}
    twin, real = runs["twin"], runs["draft_model"]
    assert twin.twin_of_id == real.pk and (twin.pinned_tau, twin.pinned_tau_source) == (GOLDEN, twins.GOLDEN)
    assert twin.metrics.acceptance_length == pytest.approx(GOLDEN, rel=0.05)
    assert real.metrics.acceptance_length == pytest.approx(REAL_TAU, rel=0.05)
    counted = set(Run.objects.counted().filter(sweep_id=report.sweep_id).values_list("pk", flat=True))
    assert counted == {runs["auto"].pk, real.pk}
    again = ingest.ingest_bundle(bundle)  # idempotent, the twin included
    assert [r.status for r in again.runs] == ["existing"] * 3


def _rewrite(bundle_dir, run, doc_change) -> None:
    """Change one run file's JSON and its sha256 in the manifest (a hand-edited bundle)."""
    path = bundle_dir / f"runs/{run.uuid}.json"
    doc = json.loads(path.read_text())
    doc_change(doc)
    path.write_text(json.dumps(doc))
    manifest = json.loads((bundle_dir / MANIFEST).read_text())
    for e in manifest["runs"]:
        if e["uuid"] == str(run.uuid):
            e["sha256"] = sha256_hex(path.read_bytes())
    (bundle_dir / MANIFEST).write_text(json.dumps(manifest))


def test_a_pinned_run_without_its_real_run_is_refused(twin_bundle, tmp_path):
    copy = shutil.copytree(twin_bundle, tmp_path / "b")
    _, runs = _runs(copy)
    [twin] = [r for r in runs if r.twin_of is not None]
    _rewrite(copy, twin, lambda d: d.pop("twin_of"))
    bundle = open_bundle(copy)
    entry = next(e for e in bundle.manifest.runs if e.uuid == twin.uuid)
    with pytest.raises(BundleError, match="acceptance_tau is set .* but twin_of names no real run"):
        bundle.run(entry)


@pytest.mark.django_db
def test_a_twin_whose_real_run_is_missing_is_refused_at_ingest(twin_bundle, tmp_path):
    copy = shutil.copytree(twin_bundle, tmp_path / "b")
    _, runs = _runs(copy)
    [twin] = [r for r in runs if r.twin_of is not None]
    manifest = json.loads((copy / MANIFEST).read_text())
    manifest["runs"] = [e for e in manifest["runs"] if e["uuid"] != str(twin.twin_of)]
    (copy / MANIFEST).write_text(json.dumps(manifest))
    report = ingest.ingest_bundle(open_bundle(copy))
    by_uuid = {r.uuid: r for r in report.runs}
    refused = by_uuid[str(twin.uuid)]
    assert refused.status == "refused" and f"twin of run {twin.twin_of}, which is not a stored run" in refused.reason
    assert not Run.objects.filter(run_uuid=twin.uuid).exists()
    assert sorted(r.status for r in report.runs) == ["refused", "stored"]
