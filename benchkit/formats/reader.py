"""Read any supported result file: detect which tool wrote each object and hand it to that
format's reader (`benchkit.formats.vllm_bench`, `benchkit.formats.sglang_bench`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchkit.formats.common import ImportedRun, ResultFileError, SourceObject, read_objects
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



def load_result_file(path: str | Path, fmt: str = "auto") -> list[ImportedRun]:
    """Import every run in a result file of `vllm bench serve` or `sglang.bench_serving`.

    `fmt`: "vllm", "sglang" or "auto" (each object's keys decide; see `detect_tool`). A single
    JSON object (vLLM's `--save-result`, also pretty-printed) or JSON lines (SGLang's output,
    vLLM's `--append-result`) are both read. Returns one ImportedRun per object, in file order.
    Raises ResultFileError (file, line, field) for an unreadable or malformed file, an object
    whose tool cannot be told, or an unknown `fmt`; never returns part of a file.
    """
    path = Path(path)
    if fmt not in FORMATS:
        raise ResultFileError(path, f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    runs = []
    for line, obj in read_objects(path):
        tool = fmt if fmt != "auto" else detect_tool(obj)
        if tool is None:
            raise ResultFileError(
                path, "cannot tell whether vllm bench serve or sglang.bench_serving wrote this object; "
                "pass fmt='vllm' or fmt='sglang'", line=line)
        o = SourceObject(obj, str(path), line)
        if tool == "vllm":
            run = import_draftboard(o) if "draftboard" in obj else import_vllm(o)
        else:
            run = import_sglang(o)
        run.origin = str(path) if line is None else f"{path}:{line}"
        runs.append(run)
    return runs
