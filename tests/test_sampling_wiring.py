"""The T > 0 lossless check wired into the product (issue 33): a workload's samples_per_prompt
(N rounds, seed + j), every sample's ids kept, `check_runs` routing a multi-sample T > 0 run to
benchkit.compare.sampling.check_sampling against the matched auto run (floor: its own halves), and
the verdicts stored by runs.services.lossless.check_sweep, marked as the T = 0 ones are."""

from __future__ import annotations

import numpy as np
import pytest

from benchkit.compare import lossless as ll
from benchkit.compare import sampling
from benchkit.execution.outcome import RunOutcome
from benchkit.measure import metrics
from benchkit.measure import outputs as out
from benchkit.measure.loadclient import build_body
from benchkit.measure.workloads import WorkloadError, build_prompts
from benchkit.point import Point
from benchkit.specs import RunSpec, ServerConfig, WorkloadSpec

T = 0.7


# -- the workload: rounds and seeds --------------------------------------------------------------

def test_samples_per_prompt_sends_rounds_with_seed_plus_j_and_keeps_every_output_whole():
    w = WorkloadSpec(num_prompts=6, samples_per_prompt=3, seed=40, input_len=5, output_len=9, warmup_requests=1,
                     temperature=T)
    ps = build_prompts(w)
    assert len(ps) == 1 + 6
    warm, meas = ps[0], ps[1:]
    assert warm.seed is None and build_body(warm, "m", w, "completions")["seed"] == 40
    assert [p.text for p in meas[:2]] == [p.text for p in meas[2:4]] == [p.text for p in meas[4:]]
    assert meas[0].text != meas[1].text and warm.text not in {p.text for p in meas}
    assert [build_body(p, "m", w, "completions")["seed"] for p in meas] == [40, 40, 41, 41, 42, 42]
    one = WorkloadSpec(num_prompts=6, input_len=5, seed=40)
    assert [p.text for p in build_prompts(one)] == [p.text for p in build_prompts(w, count=7)]  # same prompts
    assert all(p.seed is None for p in build_prompts(one))
    with pytest.raises(WorkloadError, match="multiple of samples_per_prompt 4"):
        build_prompts(WorkloadSpec(num_prompts=6, samples_per_prompt=4, input_len=5))
    assert out.full_requests(3200, 100) == 3200 and out.full_requests(3200, 1) == out.FULL_REQUESTS
    assert "samples_per_prompt" in RunSpec(ServerConfig(), w).point_fields()["workload"]
    assert "samples_per_prompt" not in RunSpec(ServerConfig(), one).point_fields()["workload"]


def test_a_blob_of_every_sample_round_trips_and_an_old_blob_still_decodes():
    recs = [out.digest_output(i, f"p{i % 2}", [i, i + 1, 2], None, True) for i in range(6)]
    back = out.decode_outputs(out.encode_outputs(out.RunOutputs.from_records(recs)))
    assert ll.run_samples(back) == {out.prompt_hash("p0"): [[0, 1, 2], [2, 3, 2], [4, 5, 2]],
                                    out.prompt_hash("p1"): [[1, 2, 2], [3, 4, 2], [5, 6, 2]]}
    partial = [out.digest_output(i, f"p{i}", [i], None, i < 2) for i in range(4)]  # the FULL_REQUESTS layout
    got = out.decode_outputs(out.encode_outputs(out.RunOutputs.from_records(partial)))
    assert [got.records[i].full for i in range(4)] == [[0], [1], None, None]


# -- simulated runs ------------------------------------------------------------------------------

def sim_outputs(sampler: str, prompts: int, samples: int, seed: int, model_seed: int = 3) -> out.RunOutputs:
    """A run's kept outputs as the load client writes them for samples_per_prompt = `samples`:
    request j * prompts + i is prompt i's sample j, its ids drawn by `sampler` (benchkit.compare.
    sampling's simulator; the same known target per prompt in every run)."""
    models = sampling.prompt_models(prompts, seed=model_seed)
    rng = np.random.default_rng(seed)
    seqs = [sampling.simulate(m, sampler, samples, 9, rng) for m in models]
    recs = [out.digest_output(j * prompts + i, f"prompt {i}", seqs[i][j].tolist(), None, True)
            for j in range(samples) for i in range(prompts)]
    return out.RunOutputs.from_records(recs)


def point(run_id: int, method: str = "auto", temperature: float = T) -> Point:
    return Point(run_id=run_id, method=method, num_speculative_tokens=None if method == "auto" else 4,
                 temperature=temperature)


def test_a_multi_sample_run_at_t_gt_0_is_judged_by_the_sampling_check():
    runs = {1: sim_outputs("ar", 32, 100, 1), 2: sim_outputs("ar", 32, 100, 2),
            3: sim_outputs("speculative", 32, 100, 3), 4: sim_outputs("greedy_draft", 32, 100, 4),
            5: sim_outputs("speculative", 32, 1, 5)}
    pts = [point(1), point(2), point(3, "draft_model"), point(4, "ngram"), point(5, "eagle")]
    got = ll.check_runs(pts, runs.get)
    assert got[3].verdict == ll.PRESERVED and got[3].sentence.startswith("distribution preserved (p=")
    assert got[3].baseline_run_ids == (1,) and got[3].floor_run_ids == (1,) and got[3].compared == 3200
    assert "AR halves p=" in got[3].sentence and not got[3].marked
    assert got[4].verdict == ll.DISTRIBUTION_DIFFERS and got[4].p_value < 0.05 and got[4].marked
    assert got[4].sentence.startswith("distribution differs (p=") and "where: prompt" in got[4].sentence
    assert got[5].verdict == ll.NOT_CHECKED and got[5].reason == ll.SAMPLING
    assert "samples_per_prompt" in got[5].sentence
    # what check_sampling says, unchanged: the AR run is the first auto run, the floor its halves
    ar = ll.run_samples(runs[1])
    sv = sampling.check_sampling(ar, ll.run_samples(runs[3]), sampling.halves(ar))
    assert got[3].p_value == sv.p_value and got[3].sentence.startswith(sv.sentence)


def test_tiny_samples_are_not_enough_and_marked_unsure_and_t0_is_untouched():
    runs = {1: sim_outputs("ar", 4, 6, 1), 3: sim_outputs("speculative", 4, 6, 3)}
    v = ll.check_runs([point(1), point(3, "draft_model")], runs.get)[3]
    assert v.verdict == ll.NOT_ENOUGH_SAMPLES and "not enough samples (need" in v.sentence
    mark = ll.lossless_mark(Point(run_id=3, method="draft_model", lossless_verdict=v.verdict,
                                  lossless_sentence=v.sentence))
    assert mark.symbol == ll.UNSURE_MARK and mark.run_ids == (3,)
    differs = ll.lossless_mark(Point(run_id=4, method="ngram", lossless_verdict=ll.DISTRIBUTION_DIFFERS))
    assert differs.symbol == ll.MARK and differs.words == "not lossless"
    assert ll.lossless_mark(Point(run_id=5, method="ngram", lossless_verdict=ll.PRESERVED)) is None
    # no auto run that kept several samples: said, not judged
    single = {1: sim_outputs("ar", 4, 1, 1), 3: sim_outputs("speculative", 4, 6, 3)}
    v = ll.check_runs([point(1), point(3, "draft_model")], single.get)[3]
    assert v.reason == ll.SAMPLING_NO_BASELINE and v.baseline_run_ids == (1,)
    # T = 0: the identity check, whatever the outputs (identical multi-sample outputs are lossless)
    same = {1: sim_outputs("ar", 4, 6, 1), 2: sim_outputs("ar", 4, 6, 1), 3: sim_outputs("ar", 4, 6, 1)}
    t0 = ll.check_runs([point(1, temperature=0), point(2, temperature=0), point(3, "draft_model", 0)], same.get)[3]
    assert t0.verdict in (ll.LOSSLESS, ll.INCONCLUSIVE) and t0.sentence.startswith(("lossless", "inconclusive"))


# -- stored through the product ------------------------------------------------------------------

@pytest.mark.django_db
def test_check_sweep_stores_the_sampling_verdicts():
    from runs.models import LosslessCheck, Run, RunState
    from runs.services import lossless
    from runs.services.outcomes import store_outcome
    from runs.services.sweeps import run_fields
    from runs.services.transitions import transition
    from tests.factories import make_logs, make_sweep

    def stored(sweep, method: str, k: int | None, repeat: int, outputs: out.RunOutputs, samples: int) -> Run:
        n = len(outputs)
        spec = RunSpec(server=ServerConfig(engine="vllm", model="/models/m", method=method,
                                           num_speculative_tokens=k),
                       workload=WorkloadSpec(output_len=9, input_len=32, num_prompts=n, temperature=T,
                                             samples_per_prompt=samples), repeat_index=repeat)
        run = Run.objects.create(sweep=sweep, host=sweep.host, point_key=f"{method}|{k}|r{repeat}",
                                 spec=spec.to_dict(), **run_fields(spec))
        for state in (RunState.PREFLIGHT, RunState.STARTING, RunState.WARMING, RunState.MEASURING,
                      RunState.STOPPING):
            transition(run, state)
        logs, t0, t1 = make_logs(4, 1, 5.0, n_tokens=9)
        return store_outcome(run, RunOutcome(ok=True, logs=logs, window_start_ns=t0, window_end_ns=t1,
                                             metrics=metrics.compute_run_metrics(logs, t0, t1, None),
                                             outputs=outputs,
                                             client_options={"return_token_ids": True, "keep_outputs": True}))

    sw = make_sweep(name="sampling")
    stored(sw, "auto", None, 0, sim_outputs("ar", 32, 100, 1), 100)
    stored(sw, "auto", None, 1, sim_outputs("ar", 32, 100, 2), 100)
    good = stored(sw, "draft_model", 4, 0, sim_outputs("speculative", 32, 100, 3), 100)
    bad = stored(sw, "ngram", 4, 0, sim_outputs("greedy_draft", 32, 100, 4), 100)
    assert lossless.check_sweep(sw.pk) == {good.pk: ll.PRESERVED, bad.pk: ll.DISTRIBUTION_DIFFERS}
    row = LosslessCheck.objects.get(run=bad)
    assert row.get_verdict_display() == "distribution differs from AR's (temperature > 0)"
    assert row.sentence.startswith("distribution differs (p=") and row.p_value < 0.05
    assert LosslessCheck.objects.get(run=good).sentence.startswith("distribution preserved")

    tiny = make_sweep(name="tiny")
    stored(tiny, "auto", None, 0, sim_outputs("ar", 4, 6, 1), 6)
    few = stored(tiny, "draft_model", 4, 0, sim_outputs("speculative", 4, 6, 3), 6)
    one = stored(tiny, "eagle", 4, 0, sim_outputs("speculative", 24, 1, 3), 1)
    assert lossless.check_sweep(tiny.pk) == {few.pk: ll.NOT_ENOUGH_SAMPLES, one.pk: ll.NOT_CHECKED}
    assert "need" in LosslessCheck.objects.get(run=few).sentence
    assert "samples_per_prompt" in LosslessCheck.objects.get(run=one).sentence
