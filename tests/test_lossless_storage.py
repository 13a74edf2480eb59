"""Where the lossless check's data lives: the outputs digest stored by the one writer for the
worker, an offline bundle (version 3, and a version 2 bundle without outputs) and an import alike;
the verdict table read by every page through the point, never the blob; the back-fill command;
a damaged blob; an invalidated baseline."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from benchkit.__main__ import run_sweep_offline
from benchkit.compare import lossless as ll
from benchkit.execution.bundle import BUNDLE_FORMAT_VERSION, MANIFEST, open_bundle, sha256_hex
from benchkit.execution.outcome import RunOutcome
from benchkit.hosts.inventory import HostInventory
from benchkit.measure import metrics
from benchkit.measure.outputs import RunOutputs, decode_outputs, digest_output, encode_outputs
from benchkit.point import GROUPS
from runs import selectors
from runs.models import LosslessCheck, Run, RunOutputsBlob, RunState
from runs.services import dispatch, ingest, lossless
from runs.services.imports import import_result_file
from runs.services.invalidation import invalidate_runs
from runs.services.outcomes import store_outcome
from runs.services.transitions import transition
from tests.factories import make_logs, make_run, make_sweep
from tests.synthetic_server import SyntheticConfig, SyntheticServer

pytestmark = pytest.mark.django_db

RESULTS = Path(__file__).parent / "fixtures" / "results"


def outputs_of(diverge: dict[int, int] | None = None, n: int = 4) -> RunOutputs:
    """Token-id digests of prompts 0..n-1 (prompt index = request index), 64 tokens each;
    `diverge`: prompt -> first diverging position."""
    recs = []
    for i in range(n):
        ids = [i * 100 + j + (7 if j >= (diverge or {}).get(i, 10**6) else 0) for j in range(64)]
        recs.append(digest_output(i, f"prompt {i}", ids, None, True))
    return RunOutputs.from_records(recs)


def finished(run: Run, outputs: RunOutputs | None) -> Run:
    """`run` driven to stopping and ended by store_outcome with `outputs` (4 requests of 64 tokens)."""
    for state in (RunState.PREFLIGHT, RunState.STARTING, RunState.WARMING, RunState.MEASURING, RunState.STOPPING):
        transition(run, state)
    logs, t0, t1 = make_logs(4, 1, 5.0, n_tokens=64)
    return store_outcome(run, RunOutcome(ok=True, logs=logs, window_start_ns=t0, window_end_ns=t1,
                                         metrics=metrics.compute_run_metrics(logs, t0, t1, None), outputs=outputs,
                                         client_options={"return_token_ids": True, "keep_outputs": True}))


@pytest.fixture
def grid():
    """auto at concurrency 1 (two repeats) and 4, ngram (lossy on half the prompts) and
    draft_model (lossless) at concurrency 1."""
    sw = make_sweep(name="lossless grid")
    runs = {
        "auto": finished(make_run(sw, "auto"), outputs_of()),
        "auto-r1": finished(make_run(sw, "auto", repeat=1), outputs_of()),
        "auto-c4": finished(make_run(sw, "auto", concurrency=4), outputs_of()),
        "ngram": finished(make_run(sw, "ngram", k=4), outputs_of({0: 3, 2: 9})),
        "draft": finished(make_run(sw, "draft_model", k=2), outputs_of()),
    }
    return sw, runs


def test_the_point_columns_follow_the_group():
    assert tuple(selectors._LOSSLESS_COLUMNS) == GROUPS["lossless"]


def test_the_one_writer_stores_the_digest_and_the_check_reads_it(grid):
    sw, runs = grid
    blob = RunOutputsBlob.objects.get(run=runs["ngram"])
    assert (blob.kind, blob.n_requests, blob.n_full) == ("ids", 4, 4)
    assert decode_outputs(bytes(blob.data)) == outputs_of({0: 3, 2: 9})
    assert Run.objects.get(pk=runs["ngram"].pk).client_options == {"return_token_ids": True, "keep_outputs": True}
    # 4 identical prompts of one run: no power to call it lossless (issue 31), inconclusive
    assert lossless.check_sweep(sw.pk) == {runs["ngram"].pk: ll.BEYOND_FLOOR, runs["draft"].pk: ll.INCONCLUSIVE}
    assert lossless.check_sweep(sw.pk) == {runs["ngram"].pk: ll.BEYOND_FLOOR, runs["draft"].pk: ll.INCONCLUSIVE}
    assert LosslessCheck.objects.count() == 2  # idempotent: rows updated, never duplicated
    c = LosslessCheck.objects.get(run=runs["ngram"])
    assert (c.compared, c.identical, c.median_first_divergence, c.precision) == (4, 2, 6.0, "exact")
    assert c.baseline_run_ids == [runs["auto"].pk, runs["auto-r1"].pk]
    assert c.floor_run_ids == sorted(r.pk for k, r in runs.items() if k.startswith("auto"))
    assert len(c.floor_pairs) == 3 and c.floor_identical_share == 1.0
    # the points (load_points and the exports' counted_points) carry the verdict
    pts = {p.run_id: p for p in selectors.figure_points(sw.pk, ())}
    assert pts[runs["ngram"].pk].lossless_verdict == ll.BEYOND_FLOOR
    assert pts[runs["ngram"].pk].lossless_identical_share == 0.5
    assert pts[runs["ngram"].pk].lossless_divergence_median == 6.0
    assert pts[runs["draft"].pk].lossless_sentence.startswith("inconclusive (need 16 prompts at 1 run): 0 of 4")
    assert pts[runs["auto"].pk].lossless_verdict == "" and pts[runs["auto"].pk].lossless_identical_share is None
    counted = {p.run_id: p for p in selectors.counted_points(list(selectors.sweep_runs(sw)))}
    for rid, p in pts.items():
        assert [getattr(counted[rid], f) for f in GROUPS["lossless"]] == [getattr(p, f) for f in GROUPS["lossless"]]


def test_no_page_reads_an_outputs_blob(grid, client):
    """Pages read the verdict columns; the blob's data column is in no query of any page."""
    sw, runs = grid
    lossless.check_sweep(sw.pk)
    urls = [reverse("analysis:run_detail", args=[runs["ngram"].pk]), reverse("analysis:run_detail",
                                                                             args=[runs["auto"].pk]),
            reverse("analysis:sweep_detail", args=[sw.pk]), reverse("analysis:sweep_data", args=[sw.pk]),
            reverse("analysis:sweep_runs", args=[sw.pk]), reverse("analysis:sweep_export", args=[sw.pk, "csv"]),
            reverse("analysis:sweep_export", args=[sw.pk, "json"]), reverse("analysis:home"),
            reverse("analysis:compare") + f"?old={sw.pk}&new={sw.pk}"]
    for url in urls:
        with CaptureQueriesContext(connection) as ctx:
            assert client.get(url).status_code == 200, url
        blob_reads = [q["sql"] for q in ctx.captured_queries if '"runs_runoutputsblob"."data"' in q["sql"]]
        assert blob_reads == [], (url, blob_reads)
    page = client.get(urls[0]).content.decode()
    assert "differs beyond the AR noise floor" in page and "4 requests digested (token ids), 4 kept whole" in page
    assert "2 of 4 requests" in page and "3 · #0" in page  # the divergence positions, per request


def test_a_damaged_blob_is_said_not_raised(grid):
    sw, runs = grid
    RunOutputsBlob.objects.filter(run=runs["draft"]).update(data=b"junk")
    assert lossless.check_sweep(sw.pk)[runs["draft"].pk] == ll.NOT_CHECKED
    c = LosslessCheck.objects.get(run=runs["draft"])
    assert c.reason == ll.UNREADABLE and "not an encoded outputs blob" in c.sentence


def test_an_invalidated_baseline_requeues_the_check(grid, monkeypatch, django_capture_on_commit_callbacks):
    sw, runs = grid
    lossless.check_sweep(sw.pk)
    sent = []
    monkeypatch.setattr(dispatch, "enqueue_lossless", lambda sid, q: sent.append((sid, q)))
    with django_capture_on_commit_callbacks(execute=True):
        invalidate_runs([runs["auto"], runs["auto-r1"], runs["ngram"]], "bad node")
    assert sent == [(sw.pk, sw.host.queue)]
    lossless.check_sweep(sw.pk)  # what the queued task does
    assert not LosslessCheck.objects.filter(run=runs["ngram"]).exists()  # no longer counted: no verdict
    draft = LosslessCheck.objects.get(run=runs["draft"])
    assert draft.reason == ll.NO_BASELINE  # its only matched auto runs were invalidated


def test_the_backfill_command(grid, capsys):
    sw, runs = grid
    call_command("check_lossless", "--sweep", str(sw.pk))
    assert f"sweep {sw.pk}: 1 beyond_floor, 1 inconclusive" in capsys.readouterr().out
    LosslessCheck.objects.all().delete()
    call_command("check_lossless")
    assert LosslessCheck.objects.count() == 2


def test_an_imported_run_is_not_checked():
    sweep = import_result_file(RESULTS / "vllm-bench-serve-full.json", sweep_name="imported", method="ngram").sweep
    (check,) = LosslessCheck.objects.filter(run__sweep=sweep)
    assert (check.verdict, check.reason, check.sentence) == (ll.NOT_CHECKED, ll.IMPORTED,
                                                             "not checked: imported file: no outputs kept")
    assert not RunOutputsBlob.objects.filter(run__sweep=sweep).exists()


def offline_sweep(url: str) -> str:
    return f"""
name: offline-lossless
share_server: true
engine: external
model: synthetic
server: {{endpoint_url: "{url}", served_model_name: synthetic}}
grid:
  tp: [1]
  methods: [auto, {{method: draft_model, num_speculative_tokens: 3, drafter: /models/drafter}}]
  concurrency: [1, 2]
  output_len: [24]
  input_len: [8]
workload: {{num_prompts: 5, ignore_eos: true}}
limits: {{ready_timeout_s: 30, request_timeout_s: 30}}
"""


def as_version_2(folder: Path) -> None:
    """Rewrite a version 3 bundle as version 2 wrote it: no outputs, no client options."""
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["format_version"] = 2
    for entry in manifest["runs"]:
        path = folder / entry["file"]
        doc = json.loads(path.read_text())
        doc["format_version"] = 2
        del doc["outputs"], doc["client_options"]
        path.write_text(json.dumps(doc))
        entry["sha256"] = sha256_hex(path.read_bytes())
    (folder / MANIFEST).write_text(json.dumps(manifest))


def test_offline_bundles_carry_the_outputs_and_older_bundles_stay_readable(tmp_path):
    """An offline sweep (external engine: no token ids, so the outputs are text) writes the digests
    into its bundle; ingest stores them and computes the verdicts (lossless, compared on text). The
    same bundle as version 2 wrote it ingests too, its spec runs "not checked"."""
    with SyntheticServer(SyntheticConfig(ttft_ms=2, gap_ms=1, tokens_per_message=2)) as url:
        (tmp_path / "sweep.yaml").write_text(offline_sweep(url))
        summary = run_sweep_offline(tmp_path / "sweep.yaml", tmp_path / "bundle", host="offline-box",
                                    inventory=HostInventory(hostname="offline-box", gpus=[]), progress=False)
    assert (summary.succeeded, summary.failed) == (4, 0)
    old = Path(shutil.copytree(tmp_path / "bundle", tmp_path / "bundle-v2"))
    bundle = open_bundle(tmp_path / "bundle")
    assert bundle.manifest.format_version == BUNDLE_FORMAT_VERSION == 4
    first = bundle.run(bundle.manifest.runs[0])
    assert first.outputs is not None and len(first.outputs) == 5 and first.client_options["return_token_ids"] is False

    report = ingest.ingest_bundle(bundle)
    runs = list(Run.objects.filter(sweep_id=report.sweep_id).order_by("id"))
    assert [b.kind for b in RunOutputsBlob.objects.filter(run__in=runs)] == ["text"] * 4
    checks = {c.run.method: c for c in LosslessCheck.objects.filter(run__in=runs).select_related("run")}
    assert set(checks) == {"draft_model"} and checks["draft_model"].verdict == ll.INCONCLUSIVE  # 5 prompts
    assert checks["draft_model"].unit == "char" and "compared on text" in checks["draft_model"].sentence
    assert {r.client_options["return_token_ids"] for r in runs} == {False}

    as_version_2(old)
    v2 = open_bundle(old)
    assert v2.manifest.format_version == 2 and v2.run(v2.manifest.runs[0]).outputs is None
    LosslessCheck.objects.all().delete()
    Run.objects.all().delete()
    report = ingest.ingest_bundle(v2)
    assert [r.status for r in report.runs] == ["stored"] * 4
    assert not RunOutputsBlob.objects.exists()
    reasons = set(LosslessCheck.objects.values_list("reason", flat=True))
    assert reasons == {ll.BASELINE_NOT_KEPT}


def test_the_blob_is_small(grid):
    """Storage per run: the encoded digests of a 10 000-request x 2 000-token run stay within a
    few MB (benchkit.measure.outputs.encoded_size_estimate, checked against real encodings in
    tests/test_outputs.py); here the grid's real blobs."""
    sizes = [len(bytes(b.data)) for b in RunOutputsBlob.objects.all()]
    assert sizes and max(sizes) < 4 * (33 + 4) + 4 * 4 * 64 + 200
    assert len(encode_outputs(outputs_of(n=4))) == sizes[0]
