"""Peer load clients for `client_capacity.py`: SGLang's Rust bench client (`sglang-bench`, the
`sglang.srt.rust_extensions._bench` extension) and its Python client (`sglang.benchmark.serving`),
both taken from the `sglang` wheel on the package index (only the files they need), run against
the synthetic server with ground truth.

Fetch them once where the package index is reachable (the GPU machine has no network: fetch here
for its Python and carry `.peers/` there):

    .venv/bin/python benchmarks/peers.py fetch                  # for this interpreter
    .venv/bin/python benchmarks/peers.py fetch --python 3.12    # for the GPU machine's python3

`.peers/sglang-VERSION-cpXY/` then holds `sglang/srt/rust_extensions/_bench*.so` (a PyO3 module
with `run_argv(argv)`: the Rust client's own command line; needs no other sglang file) and
`sglang/benchmark/**` (its Python client, which also imports parts of the SGLang runtime: it runs
only in an interpreter where `pip install sglang` was done; `python_client_ready` says).

Matching to ground truth: neither SGLang client writes the prompt of a request into its result,
so every request carries the extra body field `synthetic_echo_key: true` and the synthetic server
starts its first message with the blake2b-32 of the prompt text (`[0123abcd]`); the client's
`generated_texts` (with `--output-details`) name the request.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PEERS_DIR = REPO / ".peers"
SGLANG_VERSION = "0.5.23"
#: the Python client's imports outside sglang/benchmark (sglang 0.5.23)
_PY_CLIENT_EXTRA = ("sglang/__init__.py", "sglang/version.py", "sglang/srt/__init__.py",
                    "sglang/srt/disaggregation/__init__.py", "sglang/srt/disaggregation/utils.py",
                    "sglang/srt/utils/__init__.py", "sglang/srt/utils/network.py",
                    "sglang/srt/rust_extensions/__init__.py")

# run the Rust client's argv in a fresh interpreter: load the extension from its file (its PyO3
# init symbol is PyInit__bench, so the module is named `_bench`) and hand it the command line
_RUST_SHIM = (
    "import importlib.util, sys\n"
    "spec = importlib.util.spec_from_file_location('_bench', sys.argv[1])\n"
    "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
    "try:\n"
    "    m.run_argv(['sglang-bench'] + sys.argv[2:])\n"
    "except SystemExit as e:\n"
    "    sys.exit(int(e.code or 0))\n"
)


def peer_dir(python: str | None = None, root: Path = PEERS_DIR) -> Path:
    """`.peers/sglang-VERSION-cpXY` for Python `X.Y` (default: this interpreter)."""
    tag = (python or f"{sys.version_info.major}.{sys.version_info.minor}").replace(".", "")
    return root / f"sglang-{SGLANG_VERSION}-cp{tag}"


def fetch_sglang(python: str | None = None, root: Path = PEERS_DIR) -> Path:
    """Download the `sglang==SGLANG_VERSION` wheel for CPython `python` (manylinux x86_64, no
    dependencies) with pip and extract the Rust bench extension and the Python client's files
    into `peer_dir(python)`. Returns that folder. Raises RuntimeError when pip fails (no index)."""
    dest = peer_dir(python, root)
    with tempfile.TemporaryDirectory() as tmp:
        argv = [sys.executable, "-m", "pip", "download", f"sglang=={SGLANG_VERSION}", "--no-deps",
                "--only-binary=:all:", "-d", tmp]
        if python:
            argv += ["--python-version", python, "--platform", "manylinux_2_34_x86_64"]
        proc = subprocess.run(argv, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("sglang-*.whl"))
        if proc.returncode != 0 or not wheels:
            raise RuntimeError(f"pip download sglang=={SGLANG_VERSION} failed:\n{(proc.stdout + proc.stderr)[-2000:]}")
        with zipfile.ZipFile(wheels[0]) as z:
            names = [n for n in z.namelist()
                     if n.startswith("sglang/srt/rust_extensions/_bench") or n.startswith("sglang/benchmark/")
                     or n in _PY_CLIENT_EXTRA]
            z.extractall(dest, members=names)
        (dest / "WHEEL").write_text(wheels[0].name + "\n")
    write_tokenizer(root / "tokenizer")
    return dest


def write_tokenizer(dest: Path) -> Path:
    """A local tokenizer folder (`tokenizer.json` + config) for the SGLang clients, which load one
    even for a synthetic server: the demo models' byte-level BPE (`demo_models.train_tokenizer`,
    about a second, no download). Returns `dest`."""
    sys.path.insert(0, str(REPO))
    from benchkit.engines.demo_models import TOKENIZER_CONFIG, train_tokenizer

    dest.mkdir(parents=True, exist_ok=True)
    (dest / "tokenizer.json").write_text(train_tokenizer().to_str(), encoding="utf-8")
    (dest / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG), encoding="utf-8")
    return dest


def rust_extension(python: str | None = None, root: Path = PEERS_DIR) -> Path | None:
    """The Rust bench extension fetched for this interpreter, or None."""
    found = sorted((peer_dir(python, root) / "sglang/srt/rust_extensions").glob("_bench*.so"))
    return found[0] if found else None


def python_client_ready(root: Path = PEERS_DIR) -> bool:
    """Whether SGLang's Python client imports here: `sglang.benchmark.serving` from an installed
    sglang or from the fetched files, which import parts of the runtime (`sglang.srt.environ`,
    torch, zmq, orjson, transformers): in practice an interpreter with `pip install sglang`."""
    env = {**os.environ, "PYTHONPATH": str(peer_dir(None, root))}
    proc = subprocess.run([sys.executable, "-c", "import sglang.benchmark.serving"], capture_output=True, env=env)
    return proc.returncode == 0


def write_sharegpt(path: Path, prompts: Sequence[Any]) -> None:
    """The prompts as a ShareGPT JSON file (the only local-file dataset both SGLang clients read);
    the output length comes from `--sharegpt-output-len`."""
    rows = [{"id": f"p{i}", "conversations": [{"from": "human", "value": p.text}, {"from": "gpt", "value": "ok"}]}
            for i, p in enumerate(prompts)]
    path.write_text(json.dumps(rows))


def run_sglang_client(kind: str, base_url: str, model: str, tokenizer: Path, prompts: Sequence[Any],
                      output_len: int, concurrency: int, warmups: int, extra_body: dict, work: Path, name: str,
                      timeout_s: float, worker_threads: int | None = None) -> dict:
    """One closed-loop run of SGLang's `rust` or `python` bench client (backend `vllm`:
    /v1/completions, streamed) over `prompts` with `concurrency` streams, ignore_eos, temperature
    0, `--output-details` and `extra_body` plus `synthetic_echo_key`. Returns its result line (dict
    with per-request `ttfts` s, `itls` s lists, `generated_texts`, `errors`, `output_throughput`
    tok/s, `completed`). Raises RuntimeError with the output's tail on failure or after
    `timeout_s` s."""
    dataset = work / f"{name}.sharegpt.json"
    write_sharegpt(dataset, prompts)
    out = work / f"{name}.jsonl"
    args = ["--backend", "vllm", "--base-url", base_url, "--model", model, "--tokenizer", str(tokenizer),
            "--dataset-name", "sharegpt", "--dataset-path", str(dataset), "--sharegpt-output-len", str(output_len),
            "--num-prompts", str(len(prompts)), "--max-concurrency", str(concurrency), "--request-rate", "inf",
            "--warmup-requests", str(warmups), "--output-file", str(out), "--output-details", "--disable-tqdm",
            "--extra-request-body", json.dumps({**extra_body, "synthetic_echo_key": True}), "--seed", "0"]
    if kind == "rust":
        ext = rust_extension()
        if ext is None:
            raise RuntimeError(f"no Rust bench extension under {peer_dir()}: run benchmarks/peers.py fetch")
        argv = [sys.executable, "-c", _RUST_SHIM, str(ext), *args]
        if worker_threads:
            argv += ["--worker-threads", str(worker_threads)]
        env = None
    else:
        argv = [sys.executable, "-m", "sglang.benchmark.serving", *args]
        env = {**os.environ, "PYTHONPATH": str(peer_dir()), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"sglang {kind} client did not finish within {timeout_s:.0f} s") from exc
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"sglang {kind} client exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-2000:]}")
    return json.loads(out.read_text().strip().splitlines()[-1])


def echo_key(prompt_text: str) -> str:
    """The synthetic server's `[hex]` request name for a prompt (see the module docstring)."""
    return f"[{hashlib.blake2b(prompt_text.encode(), digest_size=4).hexdigest()}]"


def sglang_errors(result: dict, records: dict) -> dict:
    """An SGLang client's per-request TTFT and ITLs (s) against the ground truth
    (`_common.result_errors`), each request matched through the echo key in its generated text."""
    from _common import result_errors

    by_key = {echo_key(prompt): recs[-1] for prompt, recs in records.items() if recs}
    return result_errors(result, [by_key.get((text or "")[:10]) for text in result.get("generated_texts", [])])


def main(argv: list[str] | None = None) -> int:
    """`fetch [--python X.Y]`: download and extract the peers (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch", help="download the sglang wheel and extract the bench clients into .peers/")
    f.add_argument("--python", default=None, help="CPython X.Y the files are for (default: this one)")
    args = ap.parse_args(argv)
    dest = fetch_sglang(args.python)
    print(f"{dest}: {sum(1 for _ in dest.rglob('*') if _.is_file())} files, Rust extension "
          f"{rust_extension(args.python) or 'missing'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
