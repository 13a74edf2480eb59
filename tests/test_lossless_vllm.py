"""The lossless check on vLLM's CPU build (issue 18's done-when): a small sweep on the demo models
at temperature 0 (auto, draft_model k=2, ngram k=4; concurrency 1 and 2, so the two auto runs
give the AR noise floor) through the real runner and the worker's storage; the verdicts come from
the token ids the server returned. The data is printed and asserted against an independent
comparison of the stored whole outputs; whatever the verdict, it is the server's, reported as
found (the demo weights are random: only the pipeline is claimed, not a model's behaviour)."""

from __future__ import annotations

import pytest

from benchkit.compare import lossless as ll
from benchkit.hosts.inventory import HostInventory
from benchkit.measure.outputs import decode_outputs
from runs.models import LosslessCheck, Run, RunOutputsBlob, RunState
from runs.services import dispatch, execution, lossless
from runs.services.hosts import get_or_create_host, record_inventory
from runs.services.sweeps import create_sweep
from tests.realserver import tiny_sweep, vllm_server_pids

pytestmark = pytest.mark.vllm
PROMPTS, OUT = 8, 32


def whole(run: Run) -> dict[int, list[int]]:
    """{prompt hash: the whole output's token ids} of a run (every prompt kept whole: 8 < 32)."""
    outs = decode_outputs(bytes(RunOutputsBlob.objects.get(run=run).data))
    return {r.prompt: r.full for r in outs.records.values()}


@pytest.mark.django_db(transaction=True)
def test_lossless_verdicts_from_real_vllm_token_ids(demo_models, tmp_path, monkeypatch, settings):
    settings.DRAFTBOARD_RUNS_DIR = str(tmp_path / "runs")
    monkeypatch.setattr(dispatch, "enqueue_lossless", lambda sid, q: None)
    monkeypatch.setattr(dispatch, "enqueue_detection", lambda sid, q: None)
    host = get_or_create_host("vllm-cpu-box")
    record_inventory(host, HostInventory(hostname="vllm-cpu-box", gpus=[]))
    spec = tiny_sweep(demo_models, "lossless-vllm", ["auto", {"method": "draft_model", "num_speculative_tokens": 2},
                                                     {"method": "ngram", "num_speculative_tokens": 4}],
                      concurrency=[1, 2], output_len=OUT, num_prompts=PROMPTS)
    sweep = create_sweep(spec, host, source="test", enqueue=False)
    try:
        for group in dispatch.server_groups(list(Run.objects.filter(sweep=sweep))):
            execution.execute_group(group)
    finally:
        assert vllm_server_pids(demo_models.target) == []
    runs = list(Run.objects.filter(sweep=sweep).order_by("id"))
    assert [r.state for r in runs] == [RunState.SUCCEEDED] * 6, [(r.failure_reason, r.failure_message) for r in runs]
    for r in runs:  # the engine registry asked vLLM for token ids and it returned them
        assert r.client_options["return_token_ids"] is True
        blob = RunOutputsBlob.objects.get(run=r)
        assert (blob.kind, blob.n_requests, blob.n_full) == ("ids", PROMPTS, PROMPTS)
        assert all(len(ids) == OUT for ids in whole(r).values())

    verdicts = lossless.check_sweep(sweep.pk)
    auto = {r.concurrency: r for r in runs if r.method == "auto"}
    ar = {c: whole(r) for c, r in auto.items()}
    shared = set(ar[1]) & set(ar[2])
    ar_same = sum(ar[1][h] == ar[2][h] for h in shared)
    print(f"\nreal vLLM CPU, demo models, temperature 0: AR c=1 vs AR c=2 identical on {ar_same} of {len(shared)} "
          "shared prompts")
    for r in runs:
        if r.method == "auto":
            continue
        check = LosslessCheck.objects.get(run=r)
        mine, base = whole(r), ar[r.concurrency]
        same = sum(mine[h] == base[h] for h in mine)
        first = sorted(next((i for i, (a, b) in enumerate(zip(mine[h], base[h], strict=True)) if a != b), OUT)
                       for h in mine if mine[h] != base[h])
        print(f"run {r.pk} {r.method_label} c={r.concurrency}: {check.verdict}: {check.sentence} "
              f"(first divergences {first})")
        assert verdicts[r.pk] == check.verdict and check.verdict in (ll.LOSSLESS, ll.BEYOND_FLOOR, ll.INCONCLUSIVE)
        assert (check.compared, check.identical, check.unit, check.precision) == (PROMPTS, same, "token", "exact")
        assert sorted(pos for _, pos in check.divergences) == first
        assert check.baseline_run_ids == [auto[r.concurrency].pk]
        assert check.floor_pairs == [[auto[1].pk, auto[2].pk, len(shared), ar_same]]
        rejected = not (same == PROMPTS or (check.p_value or 0) >= ll.ALPHA)
        assert (check.verdict == ll.BEYOND_FLOOR) == rejected
        # not rejected: lossless only with power at 8 prompts x 1 repeat against the floor's rate
        q = 1 - ar_same / len(shared)
        powered = ll.systematic_power(PROMPTS, 1, q) >= ll.POWER
        if not rejected:
            assert check.verdict == (ll.LOSSLESS if powered else ll.INCONCLUSIVE), check.sentence
            assert powered or "prompts" in check.sentence
