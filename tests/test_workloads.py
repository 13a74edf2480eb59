"""Prompt building: exact lengths through a server's /tokenize, datasets, and clear errors."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import httpx
import pytest

from benchkit.measure.workloads import (
    Prompt,
    TokenizerClient,
    WorkloadError,
    build_prompts,
    load_jsonl,
    random_prompts,
)
from benchkit.specs import WorkloadSpec
from tests.synthetic_server import SyntheticConfig, SyntheticServer


def server_count(url: str, text: str) -> int:
    return httpx.post(f"{url}/tokenize", json={"model": "synthetic", "prompt": text}).json()["count"]


@pytest.mark.parametrize("bos", [False, True])
def test_random_prompts_have_exact_server_lengths(bos):
    wl = WorkloadSpec(dataset="random", input_len=37, output_len=5, num_prompts=4, concurrency=2, seed=11)
    with SyntheticServer(SyntheticConfig(bos=bos)) as url:
        ps = build_prompts(wl, base_url=url, model="synthetic")
        again = build_prompts(wl, base_url=url, model="synthetic")
        other = build_prompts(WorkloadSpec(**{**wl.__dict__, "seed": 12}), base_url=url, model="synthetic")
        counts = [server_count(url, p.text) for p in ps]
    assert len(ps) == 2 + 4  # warmup + measured
    assert counts == [37] * 6
    assert all(p.input_len == 37 and p.output_len == 5 and not p.approx for p in ps)
    assert [p.text for p in ps] == [p.text for p in again]
    assert [p.text for p in ps] != [p.text for p in other]
    assert len({p.text for p in ps}) == 6  # warmup never repeats a measured prompt


def test_no_tokenizer_endpoint_falls_back_and_flags():
    wl = WorkloadSpec(dataset="random", input_len=20, num_prompts=2, concurrency=1)
    with SyntheticServer(SyntheticConfig(tokenizer="none")) as url:
        ps = build_prompts(wl, base_url=url, model="synthetic")
    assert len(ps) == 3 and all(p.approx for p in ps)
    assert all(len(p.text.split()) == 20 for p in ps)
    assert all(p.approx for p in build_prompts(wl))  # no server at all


class BpeTokenizer:
    """A real byte-level BPE tokenizer (trained here on the standard library's sources) with the
    TokenizerClient interface, BOS id 0 when add_special_tokens."""

    def __init__(self):
        from tokenizers import ByteLevelBPETokenizer

        src = Path(sysconfig.get_paths()["stdlib"])
        texts = [p.read_text(errors="ignore") for p in sorted(src.glob("*.py"))[:40]]
        self.tok = ByteLevelBPETokenizer()
        self.tok.train_from_iterator(
            texts, vocab_size=2048, min_frequency=2, show_progress=False, special_tokens=["<s>"]
        )

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([0] if add_special_tokens else []) + self.tok.encode(text).ids

    def detokenize(self, tokens: list[int]) -> str:
        return self.tok.decode([int(t) for t in tokens if t != 0])


@pytest.fixture(scope="module")
def bpe():
    return BpeTokenizer()


@pytest.mark.parametrize("input_len", [2, 64, 301])
def test_random_prompts_converge_with_a_real_bpe_tokenizer(bpe, input_len):
    ps = random_prompts(5, input_len, 8, seed=5, tok=bpe)
    assert [len(bpe.tokenize(p.text)) for p in ps] == [input_len] * 5


class NonRoundTripping:
    """A tokenizer whose detokenize doubles the text: no prompt can reach its length."""

    def tokenize(self, text, add_special_tokens=True):
        return [ord(c) for c in text]

    def detokenize(self, tokens):
        return "".join(chr(t) for t in tokens) * 2


def test_non_converging_tokenizer_is_a_clear_error():
    with pytest.raises(WorkloadError, match="random prompt 0: could not reach exactly 10 tokens"):
        random_prompts(1, 10, 4, seed=0, tok=NonRoundTripping())


def test_input_len_too_small_for_special_tokens(bpe):
    with pytest.raises(WorkloadError, match="input_len 1 leaves no room beside 1 special"):
        random_prompts(1, 1, 4, seed=0, tok=bpe)


def write_sharegpt(path: Path, n: int) -> None:
    data = [
        {"conversations": [{"from": "human", "value": f"question {i}?"}, {"from": "gpt", "value": "answer"}]}
        for i in range(n)
    ]
    data.insert(2, {"conversations": [{"from": "gpt", "value": "starts with the model"}]})
    data.insert(3, {"conversations": []})
    path.write_text(json.dumps(data))


def test_sharegpt(tmp_path):
    f = tmp_path / "sg.json"
    write_sharegpt(f, 10)
    wl = WorkloadSpec(
        dataset="sharegpt", dataset_path=str(f), num_prompts=5, concurrency=1, output_len=7, seed=1
    )
    with SyntheticServer(SyntheticConfig(bos=True)) as url:
        ps = build_prompts(wl, base_url=url, model="synthetic")
    assert len(ps) == 6
    assert all(p.text.startswith("question ") for p in ps)
    assert len({p.text for p in ps}) == 6
    assert all(p.input_len == len(p.text) + 1 and p.output_len == 7 and not p.approx for p in ps)
    assert [p.text for p in ps] == [p.text for p in build_prompts(wl, base_url=None)]  # seeded order
    assert [p.text for p in ps] != [f"question {i}?" for i in range(6)]  # shuffled


def test_sharegpt_errors(tmp_path):
    f = tmp_path / "sg.json"
    write_sharegpt(f, 3)
    wl = WorkloadSpec(dataset="sharegpt", dataset_path=str(f), num_prompts=5, concurrency=1)
    with pytest.raises(WorkloadError, match=r"sg.json: 3 usable prompt\(s\), the run needs 6"):
        build_prompts(wl)
    f.write_text('[{"conversations": [{"from": "human", "value": "hi"}]}, {"turns": []}]')
    with pytest.raises(WorkloadError, match="sg.json: entry 1: missing 'conversations' list"):
        build_prompts(wl)
    f.write_text("{not json")
    with pytest.raises(WorkloadError, match="sg.json: cannot read ShareGPT JSON"):
        build_prompts(wl)
    with pytest.raises(WorkloadError, match="cannot read"):
        build_prompts(WorkloadSpec(dataset="sharegpt", dataset_path=str(tmp_path / "missing.json")))


def test_jsonl(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "alpha"}\n\n{"prompt": "beta", "output_len": 3}\n{"prompt": "gamma"}\n')
    wl = WorkloadSpec(dataset="jsonl", dataset_path=str(f), num_prompts=2, concurrency=1, output_len=9)
    with SyntheticServer() as url:
        ps = build_prompts(wl, base_url=url, model="synthetic")
    assert ps == [Prompt("alpha", 5, 9), Prompt("beta", 4, 3), Prompt("gamma", 5, 9)]


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"prompt": "a"}\n{"prompt": "b"\n', r"p.jsonl:2: not valid JSON"),
        ('{"prompt": "a"}\n\n{"text": "b"}\n', r"p.jsonl:3: field 'prompt' must be a non-empty string"),
        (
            '{"prompt": "a", "output_len": 0}\n',
            r"p.jsonl:1: field 'output_len' must be an integer >= 1, got 0",
        ),
        ('{"prompt": "a", "output_len": "5"}\n', r"p.jsonl:1: field 'output_len' must be an integer"),
        ('["a"]\n', r"p.jsonl:1: expected an object with 'prompt', got list"),
    ],
)
def test_jsonl_errors_name_the_line(tmp_path, content, message):
    f = tmp_path / "p.jsonl"
    f.write_text(content)
    with pytest.raises(WorkloadError, match=message):
        load_jsonl(f)


def test_unknown_dataset_and_bad_lengths():
    with pytest.raises(WorkloadError, match="unknown dataset 'csv'"):
        build_prompts(WorkloadSpec(dataset="csv"))
    with pytest.raises(WorkloadError, match="input_len and output_len must be >= 1"):
        build_prompts(WorkloadSpec(input_len=0))


def test_tokenizer_client_against_server():
    with SyntheticServer(SyntheticConfig(bos=True)) as url:
        tok = TokenizerClient(url, "synthetic")
        try:
            assert tok.tokenize("abc") == [1, 97, 98, 99]
            assert tok.tokenize("abc", add_special_tokens=False) == [97, 98, 99]
            assert tok.detokenize([97, 98, 99]) == "abc"
        finally:
            tok.close()
