"""The acceptance-controlled twin (issue 21) through the worker's run path: a sweep file asking
`twin: {acceptance: pinned, tau: ...}` on the synthetic engine build (a managed server process
speaking vLLM's API; it emulates vLLM's `rejection_sample_method: synthetic`, which the vLLM CPU
build refuses), executed by the real runner through runs.services.execution: the spec run and its
twin are both stored and linked, the twin's measured tau is the pinned one within 5 %, its
lossless verdict is "not lossless by design", it stays out of every headline; a later night
without a golden tau pins the median of the point's earlier nights. Plus the sweep file's
validation of `twin:`."""

from __future__ import annotations

import gc
import json

import pytest
from django.urls import reverse

from benchkit.compare import lossless as ll
from benchkit.hosts.inventory import HostInventory
from benchkit.specs import RunSpec
from benchkit.sweeps import twins
from benchkit.sweeps.sweepfile import SweepError, parse_sweep
from runs import tasks
from runs.models import LosslessCheck, Run, RunState
from runs.selectors import figure_points
from runs.services import dispatch, execution
from runs.services.hosts import get_or_create_host, record_inventory
from runs.services.sweeps import create_sweep
from tests.celeryproc import SYNTHETIC_FLAGS, synthetic_model, twin_sweep_doc

GOLDEN, REAL_TAU, K = 2.5, 2.0, 3


def sweep_doc(model, twin: dict) -> dict:
    return twin_sweep_doc(model, twin, k=K)


@pytest.mark.django_db(transaction=True)
def test_spec_run_and_its_pinned_twin_are_stored_linked_and_the_twin_holds_the_pinned_tau(tmp_path, monkeypatch,
                                                                                          settings, client):
    monkeypatch.setenv("DRAFTBOARD_ENGINE_FLAGS", str(SYNTHETIC_FLAGS))
    settings.DRAFTBOARD_RUNS_DIR = str(tmp_path / "runs")
    sent = []
    monkeypatch.setattr(dispatch, "enqueue_lossless", lambda sid, q: sent.append(("lossless", sid)))
    monkeypatch.setattr(dispatch, "enqueue_detection", lambda sid, q: sent.append(("detect", sid)))
    model = synthetic_model(tmp_path)
    host = get_or_create_host("twin-box")
    record_inventory(host, HostInventory(hostname="twin-box", gpus=[]))
    spec = parse_sweep(sweep_doc(model, {"acceptance": "pinned", "tau": GOLDEN}), source="test:twin")
    sweep = create_sweep(spec, host, source="test", enqueue=False)
    runs = list(Run.objects.filter(sweep=sweep).order_by("id"))
    assert len(runs) == 3  # auto, the spec run, its twin (auto has none)
    for group in dispatch.server_groups(runs):
        execution.execute_group(group)
    gc.collect()  # the run hooks' writes from the client's worker threads left their DB connections behind
    runs = list(Run.objects.filter(sweep=sweep).select_related("metrics").order_by("id"))
    assert [r.state for r in runs] == [RunState.SUCCEEDED] * 3, [(r.failure_reason, r.failure_message) for r in runs]
    assert sorted(sent) == [("detect", sweep.pk), ("lossless", sweep.pk)]  # the twin is a run like any other

    auto, real, twin = runs
    assert (auto.method, real.twin_of_id, twin.twin_of_id) == ("auto", None, real.pk)
    assert list(real.twins.all()) == [twin] and (twin.pinned_tau, twin.pinned_tau_source) == (GOLDEN, twins.GOLDEN)
    assert twin.point_key != real.point_key and RunSpec.from_dict(twin.spec).server.acceptance_tau == GOLDEN
    real_config = json.loads(real.argv[real.argv.index("--speculative-config") + 1])
    twin_config = json.loads(twin.argv[twin.argv.index("--speculative-config") + 1])
    assert twin_config == {**real_config, "rejection_sample_method": "synthetic", "synthetic_acceptance_length": GOLDEN}
    assert real.metrics.acceptance_length == pytest.approx(REAL_TAU, rel=0.05)
    assert twin.metrics.acceptance_length == pytest.approx(GOLDEN, rel=0.05)
    print(f"twin tau {twin.metrics.acceptance_length:.3f} (pinned {GOLDEN}), "
          f"real tau {real.metrics.acceptance_length:.3f}; tok/s twin {twin.metrics.output_throughput_tok_s:.1f}, "
          f"real {real.metrics.output_throughput_tok_s:.1f}")

    verdicts = tasks.check_lossless_task(sweep.pk)  # what the queued task runs
    assert verdicts[twin.pk] == ll.NOT_CHECKED and verdicts[real.pk] != ll.NOT_CHECKED
    check = LosslessCheck.objects.get(run=twin)
    assert check.reason == ll.SYNTHETIC_ACCEPTANCE and "not lossless by design" in check.sentence
    assert tasks.detect_regressions_task(sweep.pk) == []  # the first night: nothing judged, nothing raised

    page = client.get(reverse("analysis:run_detail", args=[twin.pk])).content.decode()
    assert 'id="twin-of"' in page and f'href="{reverse("analysis:run_detail", args=[real.pk])}"' in page

    # excluded from every headline: the counted runs (charts, speedups, exports) leave the twin out
    assert {p.run_id for p in figure_points(sweep.pk, ("output_throughput_tok_s",))} == {auto.pk, real.pk}
    assert set(Run.objects.counted().filter(sweep=sweep).values_list("pk", flat=True)) == {auto.pk, real.pk}

    # the next night without a golden tau pins the median of the point's earlier nights
    spec2 = parse_sweep(sweep_doc(model, {"acceptance": "pinned", "nights": 7}), source="test:twin2")
    sweep2 = create_sweep(spec2, host, source="test", enqueue=False)
    twin2 = Run.objects.get(sweep=sweep2, twin_of__isnull=False)
    assert twin2.pinned_tau == pytest.approx(real.metrics.acceptance_length) and twin2.pinned_tau_source == twins.MEDIAN
    assert twin2.twin_of.point_key == real.point_key


def test_sweep_file_twin_is_validated(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTBOARD_ENGINE_FLAGS", str(SYNTHETIC_FLAGS))
    doc = sweep_doc(tmp_path, {"acceptance": "pinned", "tau": GOLDEN})
    spec = parse_sweep(doc)
    [auto, draft] = spec.methods
    assert auto.twin is None and draft.twin == twins.TwinRequest("pinned", GOLDEN, twins.DEFAULT_NIGHTS)
    for bad, where in [({"acceptance": "free"}, "twin.acceptance"), ({"acceptance": "pinned", "tau": 0.5}, "twin.tau"),
                       ({"acceptance": "pinned", "nights": 0}, "twin.nights")]:
        with pytest.raises(SweepError) as exc:
            parse_sweep({**doc, "twin": bad})
        assert where in str(exc.value)
    entry_on_auto = {**doc, "twin": None}
    entry_on_auto["grid"] = {**doc["grid"], "methods": [{"method": "auto", "twin": {"acceptance": "pinned"}}]}
    del entry_on_auto["twin"]
    with pytest.raises(SweepError, match="does not speculate"):
        parse_sweep(entry_on_auto)
    external = {"name": "x", "engine": "external", "model": "m", "server": {"endpoint_url": "http://127.0.0.1:1"},
                "grid": {"methods": [{"method": "draft_model", "num_speculative_tokens": 2, "drafter": "d"}]},
                "twin": {"acceptance": "pinned", "tau": 2.0}}
    with pytest.raises(SweepError, match="no twin"):
        parse_sweep(external)


def test_plan_twin_says_no_twin_with_the_reason():
    spec = RunSpec.from_dict({"server": {"engine": "vllm", "model": "m", "method": "draft_model",
                                         "num_speculative_tokens": 3, "drafter": "d"}})
    plan = twins.plan_twin(spec, twins.TwinRequest(tau=None, nights=3), history=[])
    assert plan.spec is None and plan.note.startswith("no twin: no golden tau")
    plan = twins.plan_twin(spec, twins.TwinRequest(tau=9.0))
    assert plan.spec is None and "outside [1, 4]" in plan.note  # tau > k + 1
    plan = twins.plan_twin(spec, twins.TwinRequest(nights=3), history=[1.9, 5.0, 2.1, 2.3, 0.0])
    assert plan.tau == 2.3 and plan.source == twins.MEDIAN  # the last 3 valid nights: 2.1, 2.3, 5.0 -> median 2.3
    assert plan.spec.point_key() != spec.point_key() and spec.server.acceptance_tau is None
    sgl = RunSpec.from_dict({"server": {"engine": "sglang", "model": "m", "method": "eagle",
                                        "num_speculative_tokens": 3, "drafter": "d"}})
    plan = twins.plan_twin(sgl, twins.TwinRequest(tau=2.5))
    assert plan.spec is not None and "SGLang simulated acceptance" in plan.note


def test_dry_run_plans_the_twin_with_its_argv(tmp_path, monkeypatch):
    """The dry run shows a twin's server start (its speculative config with forced acceptance)
    and says why a point gets no twin."""
    from benchkit.sweeps.dryrun import format_plan, plan_sweep

    monkeypatch.setenv("DRAFTBOARD_ENGINE_FLAGS", str(SYNTHETIC_FLAGS))
    model = synthetic_model(tmp_path)
    plan = plan_sweep(parse_sweep(sweep_doc(model, {"acceptance": "pinned", "tau": GOLDEN})), None, "box")
    assert plan.n_runs == 3
    twin_starts = [s for s in plan.starts if s.spec.server.acceptance_tau == GOLDEN]
    assert len(twin_starts) == 1 and '"synthetic_acceptance_length":2.5' in " ".join(twin_starts[0].argv)
    assert "twin, acceptance pinned at tau 2.5" in format_plan(plan)
    plan = plan_sweep(parse_sweep(sweep_doc(model, {"acceptance": "pinned"})), None, "box",
                      twin_history=lambda r, n: [])
    assert plan.n_runs == 2 and any("no twin: no golden tau" in n for n in plan.notes)
