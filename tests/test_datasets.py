"""Categorized datasets (issue 33): SPEED-Bench (parquet, hub jsonl, prepared `messages`),
MT-Bench / Spec-Bench question files, jsonl with a category; bad files refused as
`file:line: field: reason` before any server (no server is used here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchkit.measure import datasets
from benchkit.measure.datasets import DatasetError, DatasetOptions, check_dataset, load_prompts, read_dataset
from benchkit.measure.workloads import WorkloadError, build_prompts
from benchkit.specs import WorkloadSpec

FIX = Path(__file__).parent / "fixtures" / "datasets"
SPEED = FIX / "speed_bench_qualitative.jsonl"
SPEC = FIX / "spec_bench_question.jsonl"


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_speed_bench_jsonl_first_and_all_turns():
    first = read_dataset("speed_bench", SPEED)
    assert [p.category for p in first] == ["coding"] * 3 + ["math"] * 3 + ["writing"] * 3
    assert first[0].text == "coding question 0 turn one" and first[0].prompt_id == "1".rjust(32, "0")
    every = read_dataset("speed_bench", SPEED, DatasetOptions(turns="all"))
    assert len(every) == 12 and every[1].text == "coding question 0 turn two" and every[1].prompt_id.endswith("#2")


def test_speed_bench_parquet_and_prepared_layouts(tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    hub = tmp_path / "hub" / "qualitative"
    hub.mkdir(parents=True)
    pd.DataFrame(rows(SPEED)).to_parquet(hub / "test-00000-of-00001.parquet")
    prepared = tmp_path / "prepared"
    prepared.mkdir()
    (prepared / "qualitative.jsonl").write_text("".join(
        json.dumps({**{k: v for k, v in r.items() if k != "turns"},
                    "messages": [{"role": "user", "content": t} for t in r["turns"]]}) + "\n" for r in rows(SPEED)))
    want = [(p.text, p.category) for p in read_dataset("speed_bench", SPEED, DatasetOptions(turns="all"))]
    for path in (tmp_path / "hub", hub / "test-00000-of-00001.parquet", prepared):
        got = read_dataset("speed_bench", path, DatasetOptions(turns="all"))
        assert [(p.text, p.category) for p in got] == want


def test_spec_bench_and_per_category_sampling():
    opts = DatasetOptions(per_category=2, seed=3)
    got = load_prompts("spec_bench", SPEC, opts)
    assert [p.category for p in got] == ["coding", "math_reasoning", "writing"] * 2  # interleaved, sorted
    assert got == load_prompts("mt_bench", SPEC, opts)  # seeded, same layout
    assert {p.text for p in got} != {p.text for p in load_prompts("spec_bench", SPEC, DatasetOptions(per_category=2,
                                                                                                        seed=4))}
    only = load_prompts("spec_bench", SPEC, DatasetOptions(categories=("writing",)))
    assert [p.text for p in only] == ["writing q0 first", "writing q1 first", "writing q2 first"]


def test_build_prompts_carries_categories_and_warmup_outside_sample():
    wl = WorkloadSpec(dataset="spec_bench", dataset_path=str(SPEC), num_prompts=6, concurrency=1, seed=1)
    wl.prompts_per_category = 2  # the option's workload attribute (DatasetOptions.of_workload)
    ps = build_prompts(wl)
    assert len(ps) == 7 and all(p.approx for p in ps)
    assert sorted(p.category for p in ps[1:]) == ["coding"] * 2 + ["math_reasoning"] * 2 + ["writing"] * 2
    assert ps[0].text not in {p.text for p in ps[1:]}
    cat = WorkloadSpec(dataset="jsonl", dataset_path=str(SPEC), num_prompts=1)
    with pytest.raises(WorkloadError, match=r"spec_bench_question.jsonl:1: field 'prompt'"):
        build_prompts(cat)


def _write(tmp_path: Path, name: str, lines: list) -> Path:
    f = tmp_path / name
    f.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return f


GOOD_Q = {"question_id": 1, "category": "writing", "turns": ["hello"]}
GOOD_S = {"question_id": "a" * 32, "category": "coding", "turns": ["write code"]}


@pytest.mark.parametrize("kind, lines, message", [
    ("spec_bench", [GOOD_Q, {"question_id": 2, "turns": ["x"]}], r"q.jsonl:2: category: missing$"),
    ("spec_bench", [GOOD_Q, GOOD_Q, {**GOOD_Q, "category": " "}], r"q.jsonl:3: category: must not be empty$"),
    ("mt_bench", [{**GOOD_Q, "turns": []}], r"q.jsonl:1: turns: must hold at least one turn$"),
    ("mt_bench", [{**GOOD_Q, "turns": "hello"}], r"q.jsonl:1: turns: input should be a valid list"),
    ("mt_bench", ["{oops"], r"q.jsonl:1: not valid JSON"),
    ("speed_bench", [GOOD_S, {**GOOD_S, "category": ""}], r"q.jsonl:2: category: must not be empty$"),
    ("speed_bench", [{k: v for k, v in GOOD_S.items() if k != "turns"}], r"q.jsonl:1: turns: missing"),
    ("speed_bench", [{**GOOD_S, "turns": [datasets.SPEED_BENCH_PLACEHOLDER + "\n\n{question}"]}],
     r"q.jsonl:1: turns\[0\]: is SPEED-Bench's placeholder"),
    ("speed_bench", [{**GOOD_S, "question_id": 7}], r"q.jsonl:1: question_id: input should be a valid string"),
    ("jsonl", [{"prompt": "a", "category": ""}], r"q.jsonl:1: category: must not be empty$"),
    ("jsonl", [{"prompt": "a", "output_len": 0}], r"q.jsonl:1: output_len: input should be greater than or equal"),
])
def test_bad_records_name_file_line_field(tmp_path, kind, lines, message):
    f = _write(tmp_path, "q.jsonl", lines)
    with pytest.raises(DatasetError, match=message):
        read_dataset(kind, f)


def test_bad_paths_splits_and_selections(tmp_path):
    with pytest.raises(DatasetError, match=r"missing.jsonl: no such file$"):
        read_dataset("spec_bench", tmp_path / "missing.jsonl")
    with pytest.raises(DatasetError, match=r"nowhere: no such file or directory$"):
        read_dataset("speed_bench", tmp_path / "nowhere")
    with pytest.raises(DatasetError, match=r"split: unknown SPEED-Bench split 'throughput_4k' \(known: qualitative"):
        read_dataset("speed_bench", SPEED, DatasetOptions(split="throughput_4k"))
    with pytest.raises(DatasetError, match=r"split: no throughput_1k.jsonl or throughput_1k/\*.parquet"):
        read_dataset("speed_bench", tmp_path, DatasetOptions(split="throughput_1k"))
    with pytest.raises(DatasetError, match=r"categories: no prompt of category 'rag' \(the file has: coding, math"):
        load_prompts("speed_bench", SPEED, DatasetOptions(categories=("rag",)))
    with pytest.raises(DatasetError, match=r"per_category: category 'coding' has 3 prompt\(s\), 4 asked"):
        load_prompts("speed_bench", SPEED, DatasetOptions(per_category=4))


def test_check_dataset_refuses_before_any_server(tmp_path):
    assert check_dataset(WorkloadSpec()) is None  # random: nothing to read
    ok = WorkloadSpec(dataset="speed_bench", dataset_path=str(SPEED), num_prompts=8, concurrency=1)
    assert len(check_dataset(ok)) == 9
    with pytest.raises(DatasetError, match=r"9 prompt\(s\) selected, the run needs 17"):
        check_dataset(WorkloadSpec(dataset="speed_bench", dataset_path=str(SPEED), num_prompts=16))
    bad = WorkloadSpec(dataset="mt_bench", dataset_path=str(_write(tmp_path, "q.jsonl", [GOOD_Q, {"turns": []}])))
    with pytest.raises(DatasetError, match=r"q.jsonl:2: question_id: missing"):
        check_dataset(bad)
