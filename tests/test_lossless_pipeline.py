"""The lossless check end to end on the worker's path: a sweep on the synthetic engine build (a
managed server process speaking vLLM's API, token ids included), whose speculative servers are
lossy (`--diverge-after 5 --diverge-share 0.5`: from token 5 on, for a deterministic half of the
prompts), executed by the real runner through runs.services.execution; the last run queues the
check, the task stores the verdicts, and every page shows them. Ground truth: which prompts
diverge is recomputed from the prompts the runner sent (the same char tokenizer) and the
server's own rule."""

from __future__ import annotations

import csv
import io
import json

import pytest
from django.urls import reverse

from benchkit.compare import lossless as ll
from benchkit.compare import verdicts as verdict_rules
from benchkit.hosts.inventory import HostInventory
from benchkit.measure.outputs import decode_outputs
from benchkit.measure.workloads import build_prompts
from benchkit.specs import RunSpec
from benchkit.sweeps.sweepfile import parse_sweep
from runs import tasks
from runs.models import LosslessCheck, Run, RunOutputsBlob, RunState
from runs.selectors import figure_points
from runs.services import dispatch, execution
from runs.services.hosts import get_or_create_host, record_inventory
from runs.services.sweeps import create_sweep
from tests.celeryproc import SYNTHETIC_FLAGS, synthetic_model
from tests.synthetic_server import SyntheticConfig, SyntheticServer

P, SHARE, PROMPTS = 5, 0.5, 12


@pytest.mark.django_db(transaction=True)
def test_divergence_after_token_p_on_a_share_of_prompts_is_caught_and_shown(tmp_path, monkeypatch, client,
                                                                             settings):
    monkeypatch.setenv("DRAFTBOARD_ENGINE_FLAGS", str(SYNTHETIC_FLAGS))
    settings.DRAFTBOARD_RUNS_DIR = str(tmp_path / "runs")
    sent = []
    monkeypatch.setattr(dispatch, "enqueue_lossless", lambda sid, q: sent.append(("lossless", sid)))
    monkeypatch.setattr(dispatch, "enqueue_detection", lambda sid, q: sent.append(("detect", sid)))
    model = synthetic_model(tmp_path)
    host = get_or_create_host("lossless-box")
    record_inventory(host, HostInventory(hostname="lossless-box", gpus=[]))
    spec = parse_sweep({
        "name": "lossless", "engine": "vllm", "engine_build": "synthetic", "model": str(model), "share_server": True,
        "server": {"served_model_name": "synthetic", "load_format": "dummy",
                   "extra_args": ["--ttft-ms", "5", "--gap-ms", "2", "--diverge-after", str(P),
                                  "--diverge-share", str(SHARE)]},
        "grid": {"tp": [1], "concurrency": [1, 2], "output_len": [16], "input_len": [8],
                 "methods": ["auto", {"method": "draft_model", "num_speculative_tokens": 3, "drafter": str(model)}]},
        "workload": {"num_prompts": PROMPTS, "ignore_eos": True, "seed": 0},
        "limits": {"ready_timeout_s": 30, "request_timeout_s": 30, "run_timeout_s": 120, "stop_timeout_s": 5},
    }, source="test:lossless")
    sweep = create_sweep(spec, host, source="test", enqueue=False)
    runs = list(Run.objects.filter(sweep=sweep).order_by("id"))
    for group in dispatch.server_groups(runs):
        execution.execute_group(group)
    runs = list(Run.objects.filter(sweep=sweep).order_by("id"))
    assert [r.state for r in runs] == [RunState.SUCCEEDED] * 4, [(r.failure_reason, r.failure_message) for r in runs]
    assert sorted(sent) == [("detect", sweep.pk), ("lossless", sweep.pk)]  # queued once, by the last run

    for r in runs:  # the engine's capabilities chose the client's options, recorded with the run
        assert r.client_options["return_token_ids"] and r.client_options["keep_outputs"]
        blob = RunOutputsBlob.objects.get(run=r)
        assert (blob.kind, blob.n_requests, blob.n_full) == ("ids", PROMPTS, PROMPTS)
        assert "--speculative-config" in r.argv or r.method == "auto"

    verdicts = tasks.check_lossless_task(sweep.pk)  # what the queued task runs
    auto = {r.concurrency: r for r in runs if r.method == "auto"}
    spec_runs = {r.concurrency: r for r in runs if r.method != "auto"}
    assert verdicts == {r.pk: ll.BEYOND_FLOOR for r in spec_runs.values()}

    rule = SyntheticConfig(diverge_after=P, diverge_share=SHARE)
    with SyntheticServer(SyntheticConfig()) as url:  # the same char tokenizer the runner's prompts used
        prompts = build_prompts(RunSpec.from_dict(runs[0].spec).workload, base_url=url, model="synthetic",
                                count=PROMPTS + 2)
    for c, r in spec_runs.items():
        check = LosslessCheck.objects.get(run=r)
        expected = [c + j for j in range(PROMPTS) if rule.diverges(prompts[c + j].text)]
        assert 0 < len(expected) < PROMPTS  # the share splits the prompts: the check has something to find
        assert (check.compared, check.identical) == (PROMPTS, PROMPTS - len(expected))
        assert check.identical_share == pytest.approx(1 - len(expected) / PROMPTS)
        assert (check.median_first_divergence, check.unit, check.precision) == (P, "token", "exact")
        assert sorted(check.divergences) == [[i, P] for i in expected]
        assert check.baseline_run_ids == [auto[c].pk] and check.floor_run_ids == [auto[1].pk, auto[2].pk]
        assert check.floor_pairs == [[auto[1].pk, auto[2].pk, PROMPTS - 1, PROMPTS - 1]]  # AR agrees with AR
        assert check.floor_identical_share == 1.0 and check.p_value == 0.0
        shown = f"{100 * len(expected) / PROMPTS:.1f} %".replace(".0 %", " %")
        assert check.sentence.startswith(f"differs beyond the AR noise floor ({shown} of requests, first divergence "
                                         f"median at token {P})")
        print(f"synthetic lossy server, concurrency {c}: {check.sentence}")
        ids = decode_outputs(bytes(RunOutputsBlob.objects.get(run=r).data))  # what the server sent, uppercased
        assert sorted(i for i, rec in ids.records.items() if any(t < ord("a") for t in rec.full)) == expected

    # the point, the pages, the exports; these synthetic windows are a fraction of a second, which the
    # verdict rules exclude (MIN_WINDOW_S): lifted here, the lossless marks are under test
    monkeypatch.setattr(verdict_rules, "MIN_WINDOW_S", 0.0)
    points = {p.run_id: p for p in figure_points(sweep.pk, ("output_throughput_tok_s",))}
    assert {rid: p.lossless_verdict for rid, p in points.items()} == {
        **{r.pk: "" for r in auto.values()}, **{r.pk: ll.BEYOND_FLOOR for r in spec_runs.values()}}
    page = client.get(reverse("analysis:run_detail", args=[spec_runs[1].pk])).content.decode()
    assert 'id="lossless"' in page and "differs beyond the AR noise floor" in page
    assert f'href="{reverse("analysis:run_detail", args=[auto[1].pk])}"' in page and "return_token_ids True" in page
    base_page = client.get(reverse("analysis:run_detail", args=[auto[1].pk])).content.decode()
    assert "this run is a baseline of the lossless check" in base_page
    heat = json.loads(client.get(reverse("analysis:sweep_data", args=[sweep.pk])).content)["figures"]["speedup"]
    cells = [(t, h) for trace in heat["data"] for row_t, row_h in zip(trace["text"], trace["hovertext"], strict=True)
             for t, h in zip(row_t, row_h, strict=True) if "draft_model" in h]
    assert cells and all(t.startswith(f"{ll.MARK} ") or t.startswith(f"★ {ll.MARK} ") for t, _ in cells)
    assert all("not lossless: differs beyond the AR noise floor" in h for _, h in cells)
    sweep_page = client.get(reverse("analysis:sweep_detail", args=[sweep.pk])).content.decode()
    assert f"{ll.MARK} not lossless</span>" in sweep_page  # the headline's winner carries the mark
    rows = list(csv.DictReader(io.StringIO(client.get(reverse("analysis:sweep_export",
                                                              args=[sweep.pk, "csv"])).content.decode())))
    assert {r["run"]: r["lossless"] for r in rows} == {
        **{str(r.pk): "" for r in auto.values()}, **{str(r.pk): ll.BEYOND_FLOOR for r in spec_runs.values()}}
    exported = json.loads(client.get(reverse("analysis:sweep_export", args=[sweep.pk, "json"])).content)
    got = {r["draftboard"]["run"]["run_id"]: r["draftboard"]["run"]["lossless"] for r in exported["runs"]}
    assert got[auto[1].pk] is None and got[spec_runs[2].pk]["verdict"] == ll.BEYOND_FLOOR
    assert got[spec_runs[2].pk]["median_first_divergence"] == P
