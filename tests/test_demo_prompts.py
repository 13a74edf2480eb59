"""The demo's categorized real-text prompts (benchkit.engines.demo_prompts, issue 33): the file
is deterministic, every category has the count asked, nothing comes from the training corpus,
the datasets reader takes the file, bad arguments and an unfillable category are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchkit.engines import demo_prompts as dp
from benchkit.engines.demo_models import CORPUS_FILES, _stdlib_dir
from benchkit.measure import datasets


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_file_is_deterministic_and_complete(tmp_path):
    a = dp.write_demo_dataset(tmp_path / "a.jsonl", per_category=5, seed=3)
    b = dp.write_demo_dataset(tmp_path / "sub" / "b.jsonl", per_category=5, seed=3)
    assert a.read_bytes() == b.read_bytes()
    rows = _lines(a)
    assert [r["category"] for r in rows] == list(dp.CATEGORIES) * 5  # interleaved, sorted order
    assert len({r["prompt"] for r in rows}) == len(rows)
    for r in rows:
        assert set(r) == {"prompt", "category", "source"}
        assert dp.DEFAULT_MAX_CHARS // 2 <= len(r["prompt"]) <= dp.DEFAULT_MAX_CHARS
        assert r["prompt"] == r["prompt"].rstrip() and r["prompt"].strip()
    # another seed draws other windows
    assert dp.write_demo_dataset(tmp_path / "c.jsonl", per_category=5, seed=4).read_bytes() != a.read_bytes()


def test_no_prompt_comes_from_the_training_corpus(tmp_path):
    rows = dp.demo_prompts(per_category=12)
    corpus_paths = {str(_stdlib_dir() / rel) for rel in CORPUS_FILES}
    assert {str(p) for p in dp.training_files()} <= corpus_paths
    corpus = "\n".join(p.read_text(encoding="utf-8", errors="replace") for p in dp.training_files())
    for r in rows:
        assert r["source"] not in corpus_paths
        assert r["prompt"] not in corpus
    code = [r for r in rows if r["category"] == "code"]
    assert all(r["source"].endswith(".py") for r in code)
    assert all(Path(r["source"]).is_file() for r in rows if r["category"] != "structured")
    assert all(r["source"].startswith("generated:") for r in rows if r["category"] == "structured")


def test_datasets_reader_takes_the_file(tmp_path):
    path = dp.write_demo_dataset(tmp_path / "p.jsonl", per_category=4, warmup=2)
    prompts = datasets.read_dataset("jsonl", path)
    assert len(prompts) == 14
    # the two warmup prompts come first, one each of the first two categories
    assert [p.category for p in prompts[:2]] == ["code", "prose"]
    assert datasets.category_counts(prompts[2:]) == {c: 4 for c in dp.CATEGORIES}
    sample = datasets.load_prompts("jsonl", path, datasets.DatasetOptions(per_category=4, seed=0))
    assert datasets.category_counts(sample) == {c: 4 for c in dp.CATEGORIES}


def test_category_subset_and_token_window(tmp_path):
    rows = dp.demo_prompts(per_category=3, categories=["structured", "code"])
    assert [r["category"] for r in rows] == ["code", "structured"] * 3
    tokenizers = pytest.importorskip("tokenizers")
    from benchkit.engines.demo_models import train_tokenizer

    tok_path = tmp_path / "tokenizer.json"
    tok_path.write_text(train_tokenizer().to_str(), encoding="utf-8")
    tok = tokenizers.Tokenizer.from_file(str(tok_path))
    rows = dp.demo_prompts(per_category=4, tokenizer=tmp_path, max_tokens=32)
    for r in rows:
        assert 16 <= len(tok.encode(r["prompt"], add_special_tokens=False).ids) <= 32


@pytest.mark.parametrize("kwargs, match", [
    ({"per_category": 0}, "per_category"),
    ({"per_category": True}, "per_category"),
    ({"per_category": 2.0}, "per_category"),
    ({"seed": -1}, "seed"),
    ({"max_chars": 10}, "max_chars"),
    ({"max_tokens": 4}, "max_tokens"),
    ({"warmup": -1}, "warmup"),
    ({"categories": []}, "categories"),
    ({"categories": "code"}, "categories"),
    ({"categories": ["code", "code"]}, "categories"),
    ({"categories": ["poetry"]}, "categories"),
    ({"tokenizer": "/nonexistent/dir"}, "tokenizer"),
])
def test_bad_arguments_are_refused(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        dp.write_demo_dataset(tmp_path / "x.jsonl", **kwargs)
    assert not (tmp_path / "x.jsonl").exists()


def test_missing_sources_fall_back_then_fail_clearly(tmp_path, monkeypatch):
    # the first group missing: the next one fills the category
    groups = dp._prose_groups()
    monkeypatch.setattr(dp, "_prose_groups", lambda: [list, *groups])
    rows = dp.demo_prompts(per_category=2, categories=["prose"])
    assert len(rows) == 2
    # no sources at all: a clear error naming the category
    monkeypatch.setattr(dp, "_code_groups", lambda: [list, list])
    with pytest.raises(dp.DemoPromptError, match="category 'code' needs 3 prompt"):
        dp.write_demo_dataset(tmp_path / "x.jsonl", per_category=3)
    assert not (tmp_path / "x.jsonl").exists()
    # a one-line file gives one window, not two
    src = tmp_path / "one.py"
    src.write_text("value = compute(1, 2, 3)  # a single line, long enough for one window\n", encoding="utf-8")
    monkeypatch.setattr(dp, "_code_groups", lambda: [lambda: [src]])
    with pytest.raises(dp.DemoPromptError, match="code"):
        dp.demo_prompts(per_category=2, categories=["code"], max_chars=64)
