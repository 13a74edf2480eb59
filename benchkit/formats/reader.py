"""Read any supported result file: read its JSON safely (benchkit.formats.jsontext), detect which
tool wrote each object and validate it with that format's model (`benchkit.formats.vllm_bench`,
`benchkit.formats.sglang_bench`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchkit.formats.common import ImportedRun, ResultFileError
from benchkit.formats.jsontext import read_json_objects
from benchkit.formats.sglang_bench import import_sglang
from benchkit.formats.vllm_bench import import_draftboard, import_vllm

FORMATS = ("auto", "vllm", "sglang")

_VLLM_MARKERS = frozenset({
    "endpoint_type", "model_id", "tokenizer_id", "num_prompts", "burstiness", "failed",
    "total_token_throughput", "request_goodput", "mean_e2el_ms", "latencies", "best_of",
    "spec_decode_acceptance_length",
})
_SGLANG_MARKERS = frozenset({
    "dataset_name", "random_input_len", "random_output_len", "sharegpt_output_len",
    "random_range_ratio", "total_output_tokens_retokenized", "input_throughput", "total_throughput",
    "mean_e2e_latency_ms", "accept_length", "server_info", "concurrency",
})


def detect_tool(obj: dict[str, Any]) -> str | None:
    """"vllm" or "sglang" from the keys of one result object (the draftboard export counts as
    vllm), or None when the keys do not tell."""
    if "draftboard" in obj:
        return "vllm"
    v = len(_VLLM_MARKERS & obj.keys())
    s = len(_SGLANG_MARKERS & obj.keys())
    if v > s:
        return "vllm"
    if s > v:
        return "sglang"
    return None


@dataclass
class ResultFile:
    """A result file read and validated: `runs` in file order, `sha256` (hex) and `size_bytes`
    of its bytes (the import's idempotency key)."""

    path: Path
    sha256: str
    size_bytes: int
    runs: list[ImportedRun]


def read_result_file(path: str | Path, fmt: str = "auto") -> ResultFile:
    """Read and validate every run in a result file of `vllm bench serve` or `sglang.bench_serving`.

    `fmt`: "vllm", "sglang" or "auto" (each object's keys decide; see `detect_tool`). A single
    JSON object (vLLM's `--save-result`, also pretty-printed) or JSON lines (SGLang's output,
    vLLM's `--append-result`) are both read. Raises ResultFileError (`file:line: field: reason`)
    for an unreadable, malformed or impossible file, an object whose tool cannot be told, or an
    unknown `fmt`; never returns part of a file. Raises nothing else for any file content.
    """
    path = Path(path)
    if fmt not in FORMATS:
        raise ResultFileError(path, f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    text = read_json_objects(path)
    runs = []
    for obj in text.objects:
        tool = fmt if fmt != "auto" else detect_tool(obj.data)
        if tool is None:
            raise obj.error(None, "cannot tell whether vllm bench serve or sglang.bench_serving wrote this object; "
                                  "pass fmt='vllm' or fmt='sglang' (--format)")
        if tool == "vllm":
            run = import_draftboard(obj) if "draftboard" in obj.data else import_vllm(obj)
        else:
            run = import_sglang(obj)
        run.origin = f"{path}:{obj.line}" if obj.one_line and len(text.objects) > 1 else str(path)
        runs.append(run)
    return ResultFile(path, text.sha256, text.size_bytes, runs)


def load_result_file(path: str | Path, fmt: str = "auto") -> list[ImportedRun]:
    """The runs of `read_result_file(path, fmt)`, in file order (same errors)."""
    return read_result_file(path, fmt).runs
