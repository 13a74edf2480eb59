"""benchkit.point: the one record of a counted run. Its field groups are the only list of which
fields identify, match or define a run, so the keys derived from them must keep stored keys
byte-identical (a run's `point_key`, a regression flag's `identity_hash`)."""

from __future__ import annotations

from dataclasses import FrozenInstanceError

import pytest

from benchkit import point
from benchkit.point import Point, build_points
from benchkit.specs import GpuRef, RunSpec, ServerConfig, WorkloadSpec


def test_stored_keys_stay_byte_identical():
    """Hashes computed before the point had a type (issue 17), from the field lists it replaced."""
    assert RunSpec().point_key() == "f53e415d21b513c1b97bfa167a6767dc82ff3b41580fc689192ee74d70f2154f"
    spec = RunSpec(server=ServerConfig(engine="sglang", model="/m", drafter="/d", method="ddtree", tree_budget=15,
                                       tp=4, dtype="bfloat16", max_model_len=4096, load_format="dummy",
                                       prefix_caching=False, extra_args=["--x"], env={"A": "1"}, engine_build="pr"),
                   workload=WorkloadSpec(dataset="sharegpt", dataset_path="/p", input_len=512, output_len=1024,
                                         num_prompts=64, concurrency=8, request_rate=2.5, burstiness=0.5,
                                         ignore_eos=False, temperature=0.7, seed=3),
                   gpus=[GpuRef(0, "GPU-a")], repeat_index=2)
    assert spec.point_key() == "9a49363dfd6e09448878dadd79ce9c7a01f5fa5094d64d0f4f77fcee28489a4c"
    p = Point(engine="sglang", model="/m", drafter="/d", method="ddtree", tree_budget=15, tp=4, input_len=512,
              output_len=1024, concurrency=8)
    assert p.identity_hash() == "362f8b03fef695f202d90433a4803456"
    q = p.replace(method="draft_model", num_speculative_tokens=4, tree_budget=None, concurrency=None,
                  request_rate=2.5, temperature=0.7, seed=3)
    assert q.identity_hash() == "3292cc1d65448945b6dda3ff7bef8818" and q.label == "draft_model k=4"


def test_keys_read_the_groups():
    p = Point(run_id=1, engine="vllm", engine_version="0.10", host_id=1, gpu_uuids=("GPU-a",), drafter="/d1",
              hardware_fingerprint="hw1")
    # a drafter is part of the configuration a speedup varies, not of what it matches
    assert p.replace(drafter="/d2").match_key() == p.match_key()
    assert p.replace(drafter="/d2").config_key() != p.config_key()
    # the same point in another sweep: another build, other GPUs, another repeat
    other = p.replace(engine_version="0.11", gpu_uuids=("GPU-b",), repeat_index=2, run_id=9, hardware_fingerprint="x")
    assert other.identity_key() == p.identity_key() and other.match_key() != p.match_key()
    assert other.env_key() != p.env_key() and p.replace(host_id=2).env_key() == p.env_key()
    assert p.env_key() == tuple(getattr(p, f) or "" for f in point.ENV_FIELDS)
    # the same point across sweeps is judged on fields that define a measurement (RunSpec.point_fields)
    defining = RunSpec().point_fields()
    assert set(point.IDENTITY_FIELDS) <= set(defining["server"]) | set(defining["workload"])


def test_grid_order_puts_unknown_values_last():
    pts = [Point(run_id=i, tp=tp, method=m, tree_budget=b, concurrency=c)
           for i, (tp, m, b, c) in enumerate([(4, "auto", None, 1), (1, "ddtree", 15, None), (1, "ddtree", 15, 8),
                                               (1, "auto", None, 1), (1, "ddtree", 8, 1)])]
    assert [p.run_id for p in sorted(pts, key=Point.grid_key)] == [3, 4, 2, 1, 0]


def test_only_loaded_figures_can_be_read():
    p = Point(figures_={"median_tpot_ms": 8.0, "acceptance_length": None})
    assert p.median_tpot_ms == 8.0 and p.acceptance_length is None
    assert p.figures() == {"median_tpot_ms": 8.0, "acceptance_length": None}
    with pytest.raises(AttributeError, match=r"'output_throughput_tok_s' was not loaded on this point \(loaded: m"):
        p.output_throughput_tok_s  # noqa: B018
    with pytest.raises(AttributeError, match="no field or figure 'tps'"):
        p.tps  # noqa: B018
    with pytest.raises(KeyError, match="not a figure of a point: 'tps'"):
        Point(figures_={"tps": 1.0})
    for name in ("median_tpot_ms", "tp", "label"):
        with pytest.raises(FrozenInstanceError, match=f"cannot assign to '{name}'"):
            setattr(p, name, 1)


def test_rows_build_the_same_points_as_the_constructor():
    config = ("run_id", "method", "tree_budget", "tp", "gpu_uuids")
    rows = [(7, "ddtree", 15, 4, ("a", "b", "c", "d"), 650.0, 3.1), (8, "auto", None, 1, ("a",), 100.0, None)]
    built = build_points(config, ("output_throughput_tok_s", "acceptance_length"), rows)
    made = [Point(**dict(zip(config, r[:5], strict=True)),
                  figures_={"output_throughput_tok_s": r[5], "acceptance_length": r[6]}) for r in rows]
    assert built == made and [p.figures() for p in built] == [p.figures() for p in made]
    assert type(built[0]) is Point and [p.label for p in built] == ["b15", "auto"]
    with pytest.raises(KeyError, match="not a field of a point: 'gpus'"):
        build_points(("gpus",), (), [])
    with pytest.raises(ValueError, match="too many values"):
        build_points(("run_id",), (), [(1, 2)])
    assert build_points((), (), [(), ()]) == [Point(), Point()]
