"""Every server command line draftboard renders, parsed by the engine's own argument parser
(issue 34): vLLM's from the installed vLLM, SGLang's `ServerArgs` from the `sglang` wheel.

What is rendered (benchkit.engines.adapters `build_argv`, the same call a run makes):

- every server of the shipped sweep files: sweeps/users-grid-sglang.yaml and nightly-example.yaml
  (SGLang, engine build `sglang-ddtree-pr`), vllm-eagle3-example.yaml and demo.yaml (vLLM, its
  `{demo_*}` placeholders filled);
- every method of benchkit.methods.METHODS that an engine or build declares in
  benchkit/engines/engine_flags.yaml, with every ServerConfig option set (dtype, max_model_len,
  load_format, served_model_name, seed), at TP 1/4/8 on SGLang and 1/2 on vLLM; DFlash with a
  drafter whose config.json gives its block size (the optional `--speculative-dflash-block-size`
  group) and without; prefix caching on and off; the acceptance-controlled twin of each engine;
- planted mistakes (a misspelt flag, a bad value), rendered through a user flags file or
  `extra_args`, which the engine must refuse.

How each engine checks (each in its own interpreter, `python tests/test_engine_parsers.py ENGINE`
with the cases as JSON on stdin, so neither engine's imports reach the test process):

- vLLM (`vllm.entrypoints.openai.api_server`'s own start, vllm/entrypoints/launchers/
  api_server/entry.py `main`): `make_arg_parser(FlexibleArgumentParser())`, `parse_args`,
  `validate_parsed_serve_args`, `AsyncEngineArgs.from_cli_args`; then every engine argument that
  differs from vLLM's default is validated against the pydantic field of the config class that owns
  it (ModelConfig, ParallelConfig, CacheConfig, LoadConfig, SchedulerConfig: e.g.
  `tensor_parallel_size >= 1`), and the `--speculative-config` JSON against SpeculativeConfig's
  fields (unknown keys and each value: `method` must be a SpeculativeMethod); n-gram's config is
  built whole (`SpeculativeConfig(**config)`, it needs no model).
- SGLang (`sglang.launch_server`): `prepare_server_args(argv)` (its argparse parser and
  `ServerArgs.from_cli_args`), then `SpeculativeAlgorithm.from_string` of the algorithm (where
  resolution turns the name into a worker; the parser takes any string), and the SGLANG_* variables
  of a twin's environment against `sglang.srt.environ.envs`.

What cannot run here is printed with the table (no model, no GPU): vLLM's
`create_engine_config` (ModelConfig reads the target's config.json), SpeculativeConfig's
`__post_init__` for methods with a drafter (reads the drafter's and target's configs), device
checks; SGLang's `ServerArgs.resolve_once` (its resolution pipeline: TP against the GPUs, the
speculative, memory and attention-backend hooks; it imports sglang's model and quantization stack,
torchvision and gguf among them, absent beside vLLM's torch, and reads the model's config.json).

DDTree is an unmerged SGLang pull request (engine_flags.yaml `builds.sglang-ddtree-pr`; DOMAIN.md:
"`--speculative-ddtree-budget B` in one SGLang PR", no upstream number recorded): released SGLang
refuses `--speculative-ddtree-budget` and the algorithm `DDTREE`. PR_ONLY names them; for a DDTree
command the test checks that released SGLang refuses exactly those (so the list stays true: once
upstream knows one, the test says so) and that everything else in the command parses.

The SGLang parser is installed by scripts/install.sh (`make test` runs it) into
`.venv/sglang-parser` with `pip install --no-deps --target` from requirements/sglang-parser.txt:
the `sglang` wheel pinned there (the version benchmarks/peers.py fetches) and `orjson`, the one
dependency its import needs that the venv lacks. Never into .venv itself: sglang pins another torch
than vLLM's CPU build. Its import then uses the venv's torch, transformers, msgspec, pydantic;
IPython is stubbed (sglang/utils.py imports `IPython.display.HTML, display` for notebook output at
import time; parsing never calls them).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SWEEPS = REPO / "sweeps"
SGLANG_PARSER_REQS = REPO / "requirements" / "sglang-parser.txt"
#: Where scripts/install.sh puts the SGLang parser (a folder beside the venv's own packages).
SGLANG_PARSER_DIR = Path(os.environ.get("DRAFTBOARD_SGLANG_PARSER_DIR") or Path(sys.prefix) / "sglang-parser")
#: The Python modules each engine's command line starts (engine_flags.yaml `launch`).
ENTRY_MODULES = {"vllm": "vllm.entrypoints.openai.api_server", "sglang": "sglang.launch_server"}
#: Modules stubbed in the SGLang interpreter, and why (nothing else is).
SGLANG_STUBS = {"IPython": "sglang/utils.py imports IPython.display (HTML, display) at import time for notebook "
                           "output; parsing never calls them; IPython is not installed here",
                "IPython.display": "(the same)"}
#: Flags and algorithm names of unmerged pull-request builds that the released engine refuses: they
#: are expected unknown, everything else must parse (module docstring).
PR_ONLY: dict[str, dict[str, Any]] = {
    "sglang-ddtree-pr": {
        "flags": ["--speculative-ddtree-budget"],
        "algorithms": ["DDTREE"],
        "ref": "engine_flags.yaml builds.sglang-ddtree-pr (DOMAIN.md: the DDTree SGLang pull request)",
    },
}
DEMO_VARS = {"demo_target": "/tmp/demo/target", "demo_draft": "/tmp/demo/draft",
             "demo_prompts": str(REPO / "tests" / "fixtures" / "datasets" / "demo_categories.jsonl")}
TP_OF = {"vllm": (1, 2), "sglang": (1, 4, 8)}
RESULT_MARK = "@@engine-parsers@@"
#: The engines' checks that cannot run here (no model, no GPU), as the table names them.
NOT_RUN = {
    "V-spec": "vLLM SpeculativeConfig.__post_init__ for a method with a drafter or MTP heads: resolves the draft "
              "model (ModelConfig of the drafter's config.json, its architecture against the method, the target's "
              "config for MTP)",
    "V-engine": "vLLM EngineArgs.create_engine_config: ModelConfig reads the target's config.json (the sweep "
                "files' /models/... are placeholders), then the checks across configs (max_model_len against the "
                "model, TP against the attention heads, ...)",
    "V-device": "vLLM platform and device checks (CUDA, GPU count for TP): this vLLM is the CPU build, no GPU here",
    "S-resolve": "SGLang ServerArgs.resolve_once, the resolution pipeline (speculative hooks: DFLASH/EAGLE/NGRAM "
                 "rules, draft config; TP against the GPUs; memory, attention backends): importing it pulls "
                 "sglang's model and quantization stack (torchvision, gguf, ... absent beside vLLM's torch) and "
                 "past the model-independent checks it reads the model's config.json",
}


@dataclass
class Case:
    """One rendered command line and what the engine should say about it."""

    id: str
    engine: str
    source: str                      # sweep file, "methods.py", "planted"
    label: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    expect: str = "ok"               # "ok" or "refused"
    pr_only_flags: list[str] = field(default_factory=list)
    pr_only_algorithms: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------------------------
# the engines' side: runs in the engine's interpreter (`python tests/test_engine_parsers.py ENGINE`)


def _argparse_refusal(fn, *args):
    """Call an argparse-based parse; (result, None) or (None, the parser's error line)."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return fn(*args), None
    except SystemExit as exc:
        lines = [ln for ln in err.getvalue().splitlines() if "error:" in ln] or err.getvalue().splitlines()[-1:]
        return None, (lines[-1] if lines else f"exit {exc.code}")


def _strip_flags(args: list[str], flags: list[str]) -> list[str]:
    """`args` without each of `flags` (and its one value, or `--flag=value`)."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a in flags:
            skip = True
            continue
        if any(a.startswith(f + "=") for f in flags):
            continue
        out.append(a)
    return out


def _entry(case: dict, module: str, result: dict) -> list[str] | None:
    """Check that the command starts `module` (and that it exists here); the arguments after it."""
    import importlib.util

    argv = case["argv"]
    if argv[1:3] != ["-m", module]:
        result.update(parsed=False, stage="entry point", refusal=f"starts {argv[1:3]}, not -m {module}")
        return None
    if importlib.util.find_spec(module) is None:
        result.update(parsed=False, stage="entry point", refusal=f"module {module} not found")
        return None
    result["checks"].append("entry module")
    return argv[3:]


def vllm_parse(cases: list[dict]) -> list[dict]:
    """vLLM's own parsing of each case (module docstring). One result dict per case."""
    import typing

    import pydantic
    from vllm.config import CacheConfig, LoadConfig, ModelConfig, ParallelConfig, SchedulerConfig
    from vllm.config.speculative import SpeculativeConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm.entrypoints.openai.api_server"))
    baseline = vars(AsyncEngineArgs.from_cli_args(parser.parse_args(["--model", "m"])))
    owners = (ModelConfig, ParallelConfig, CacheConfig, LoadConfig, SchedulerConfig)
    adapters: dict[tuple[str, str], Any] = {}

    def field_check(cls, name: str, value: Any) -> str | None:
        key = (cls.__name__, name)
        if key not in adapters:
            info = cls.__pydantic_fields__[name]
            tp = typing.Annotated[info.annotation, info] if info.metadata else info.annotation
            adapters[key] = pydantic.TypeAdapter(tp, config=pydantic.ConfigDict(arbitrary_types_allowed=True))
        try:
            adapters[key].validate_python(value)
        except pydantic.ValidationError as exc:
            problem = exc.errors()[0]
            return f"{cls.__name__}.{name}={value!r}: {problem['msg']}"
        return None

    out = []
    for case in cases:
        r: dict[str, Any] = {"id": case["id"], "parsed": True, "stage": "", "refusal": None, "checks": [],
                             "not_run": []}
        out.append(r)
        args = _entry(case, "vllm.entrypoints.openai.api_server", r)
        if args is None:
            continue
        ns, refusal = _argparse_refusal(parser.parse_args, args)
        if refusal:
            r.update(parsed=False, stage="argparse", refusal=refusal)
            continue
        r["checks"].append("argparse")
        try:
            validate_parsed_serve_args(ns)
            r["checks"].append("validate_parsed_serve_args")
            engine_args = AsyncEngineArgs.from_cli_args(ns)
            r["checks"].append("AsyncEngineArgs.from_cli_args")
        except (ValueError, TypeError) as exc:
            r.update(parsed=False, stage="serve-args checks", refusal=f"{type(exc).__name__}: {exc}")
            continue
        problems = []
        for name, value in vars(engine_args).items():
            if name.startswith("_") or name == "speculative_config" or value == baseline.get(name):
                continue
            for cls in owners:
                if name in cls.__pydantic_fields__:
                    problem = field_check(cls, name, value)
                    if problem:
                        problems.append(problem)
        if problems:
            r.update(parsed=False, stage="config fields", refusal="; ".join(problems))
            continue
        r["checks"].append("config fields")
        spec = engine_args.speculative_config
        if spec is not None:
            fields_ = SpeculativeConfig.__pydantic_fields__
            unknown = [k for k in spec if k.replace("-", "_") not in fields_]
            problems = [f"SpeculativeConfig: unknown key {k!r} (extra='forbid')" for k in unknown]
            problems += [p for k, v in spec.items() if k.replace("-", "_") in fields_
                         for p in [field_check(SpeculativeConfig, k.replace("-", "_"), v)] if p]
            if problems:
                r.update(parsed=False, stage="speculative config", refusal="; ".join(problems))
                continue
            r["checks"].append("SpeculativeConfig fields")
            if spec.get("method") == "ngram":  # needs no model: built whole
                try:
                    SpeculativeConfig(**spec)
                except (ValueError, TypeError, pydantic.ValidationError) as exc:
                    r.update(parsed=False, stage="speculative config", refusal=f"SpeculativeConfig: {exc}")
                    continue
                r["checks"].append("SpeculativeConfig(**config)")
            else:
                r["not_run"].append("V-spec")
        r["not_run"] += ["V-engine", "V-device"]
    return out


def _stub_module(name: str, attrs: tuple[str, ...] = ()) -> None:
    import types

    def unavailable(*_a, **_k):
        raise RuntimeError(f"{name} is a stub in tests/test_engine_parsers.py (SGLANG_STUBS)")

    mod = types.ModuleType(name)
    mod.__path__ = []
    for attr in attrs:
        setattr(mod, attr, unavailable)
    sys.modules[name] = mod


def sglang_parse(cases: list[dict]) -> list[dict]:
    """SGLang's own parsing of each case (module docstring). One result dict per case."""
    import importlib
    import logging

    _stub_module("IPython")
    _stub_module("IPython.display", ("HTML", "display"))
    server_args = importlib.import_module("sglang.srt.server_args")
    spec_info = importlib.import_module("sglang.srt.speculative.spec_info")
    envs = importlib.import_module("sglang.srt.environ").envs
    algorithm_of = spec_info.SpeculativeAlgorithm.from_string

    out = []
    for case in cases:
        r: dict[str, Any] = {"id": case["id"], "parsed": True, "stage": "", "refusal": None, "checks": [],
                             "not_run": [], "pr_only": {}}
        out.append(r)
        args = _entry(case, "sglang.launch_server", r)
        if args is None:
            continue
        pr_flags, pr_algos = case["pr_only_flags"], case["pr_only_algorithms"]
        if pr_flags:  # the whole command first: released SGLang must refuse exactly these flags
            _, refusal = _argparse_refusal(server_args.prepare_server_args, args)
            r["pr_only"]["full_command"] = refusal
            args = _strip_flags(args, pr_flags)
        sa, refusal = _argparse_refusal(server_args.prepare_server_args, args)
        logging.disable(logging.CRITICAL)  # prepare_server_args configures logging; keep stdout the results
        if refusal:
            r.update(parsed=False, stage="argparse", refusal=refusal)
            continue
        r["checks"].append("prepare_server_args")
        name = sa.speculative_algorithm
        try:
            algo = algorithm_of(name)
        except ValueError as exc:
            if name in pr_algos:
                r["pr_only"]["algorithm"] = str(exc)
            else:
                r.update(parsed=False, stage="speculative algorithm", refusal=str(exc))
                continue
        else:
            if name in pr_algos:
                r["pr_only"]["algorithm"] = f"KNOWN: {algo}"
        r["checks"].append("SpeculativeAlgorithm.from_string")
        unknown_env = [k for k in case["env"] if k.startswith("SGLANG_") and not hasattr(envs, k)]
        if unknown_env:
            r.update(parsed=False, stage="environment", refusal=f"not in sglang.srt.environ.envs: {unknown_env}")
            continue
        if any(k.startswith("SGLANG_") for k in case["env"]):
            r["checks"].append("SGLANG_* env names")
        r["not_run"].append("S-resolve")
    return out


# --------------------------------------------------------------------------------------------
# the test's side: render with benchkit, hand the cases to each engine's interpreter


def _sglang_pin() -> str:
    for line in SGLANG_PARSER_REQS.read_text().splitlines():
        m = re.match(r"sglang==(\S+)", line.strip())
        if m:
            return m.group(1)
    raise AssertionError(f"{SGLANG_PARSER_REQS}: no sglang==VERSION pin")


def _render(server, *, source: str, label: str, cases: list[Case], seen: set, flags_file: Path | None = None,
            expect: str = "ok", seed: int | None = None, case_id: str = "") -> None:
    from benchkit.engines.adapters import adapter_for

    adapter = adapter_for(server.engine, flags_file=flags_file)
    tau = server.acceptance_tau
    argv = adapter.build_argv(server, adapter.default_port, python="python", seed=seed, acceptance_tau=tau)
    env = adapter.env([], server=server, acceptance_tau=tau)
    key = (server.engine, server.engine_build, tuple(argv), tuple(sorted(env.items())), expect)
    if key in seen:
        return
    seen.add(key)
    pr = PR_ONLY.get(server.engine_build, {})
    uses_pr = server.method == "ddtree" and bool(pr)
    cases.append(Case(id=case_id or f"{server.engine}-{len(cases)}", engine=server.engine, source=source, label=label,
                      argv=argv, env=env, expect=expect,
                      pr_only_flags=list(pr.get("flags", [])) if uses_pr else [],
                      pr_only_algorithms=list(pr.get("algorithms", [])) if uses_pr else []))


def _label(server, extra: str = "") -> str:
    from benchkit.methods import method_label

    build = f" [{server.engine_build}]" if server.engine_build else ""
    label = method_label(server.method, server.num_speculative_tokens, server.tree_budget)
    return f"{label} tp{server.tp}{build}{extra}"


def planted_cases(tmp: Path) -> list[Case]:
    """Mistakes rendered the way a user's would be (a user flags file, a ServerConfig value,
    extra_args): each must be refused by the engine."""
    from benchkit.specs import ServerConfig

    bad_flags = tmp / "planted-flags.yaml"
    bad_flags.write_text(textwrap.dedent("""\
        engines:
          sglang:
            methods:
              eagle3:
                args: ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "{drafter}",
                       "--speculative-num-steps", "{k}", "--speculative-eagle-topk", "1",
                       "--speculative-num-draft-tokenz", "{k_plus_1}"]
              eagle:
                args: ["--speculative-algorithm", "EAGLE4", "--speculative-draft-model-path", "{drafter}"]
          vllm:
            methods:
              eagle3:
                speculative_config: {method: eagle3, model: "{drafter}", num_speculative_tokenz: "{k}"}
              eagle:
                speculative_config: {method: eagle4, model: "{drafter}", num_speculative_tokens: "{k}"}
            options:
              max_model_len: "--max-model-lenght"
        """))
    base = {"model": "/models/target", "drafter": "/models/drafter"}
    planted = [
        ("planted-sglang-misspelt-flag", "--speculative-num-draft-tokenz",
         ServerConfig(engine="sglang", method="eagle3", num_speculative_tokens=3, **base)),
        ("planted-sglang-unknown-algorithm", "--speculative-algorithm EAGLE4",
         ServerConfig(engine="sglang", method="eagle", **base)),
        ("planted-sglang-bad-dtype", "--dtype bfloat61",
         ServerConfig(engine="sglang", method="auto", dtype="bfloat61", model="/models/target")),
        ("planted-sglang-bad-tp", "--tp-size four (extra_args)",
         ServerConfig(engine="sglang", method="auto", model="/models/target", extra_args=["--tp-size", "four"])),
        ("planted-vllm-misspelt-flag", "--max-model-lenght",
         ServerConfig(engine="vllm", method="auto", max_model_len=2048, model="/models/target")),
        ("planted-vllm-misspelt-key", "speculative config num_speculative_tokenz",
         ServerConfig(engine="vllm", method="eagle3", num_speculative_tokens=3, **base)),
        ("planted-vllm-unknown-method", "speculative config method eagle4",
         ServerConfig(engine="vllm", method="eagle", num_speculative_tokens=3, **base)),
        ("planted-vllm-tp-0", "--tensor-parallel-size 0 (extra_args)",
         ServerConfig(engine="vllm", method="auto", model="/models/target",
                      extra_args=["--tensor-parallel-size", "0"])),
    ]
    cases: list[Case] = []
    for case_id, what, server in planted:
        _render(server, source="planted", label=what, cases=cases, seen=set(), flags_file=bad_flags,
                expect="refused", case_id=case_id)
    return cases


PLANTED_IDS = ("planted-sglang-misspelt-flag", "planted-sglang-unknown-algorithm", "planted-sglang-bad-dtype",
               "planted-sglang-bad-tp", "planted-vllm-misspelt-flag", "planted-vllm-misspelt-key",
               "planted-vllm-unknown-method", "planted-vllm-tp-0")


def rendered_cases(tmp: Path) -> list[Case]:
    """Every server command draftboard offers (module docstring), one case per distinct argv + env."""
    from benchkit.engines.adapters import adapter_for
    from benchkit.methods import METHODS
    from benchkit.specs import ServerConfig
    from benchkit.sweeps.sweepfile import load_sweep_file

    cases: list[Case] = []
    seen: set = set()
    for name, variables in (("users-grid-sglang.yaml", None), ("nightly-example.yaml", None),
                            ("vllm-eagle3-example.yaml", None), ("demo.yaml", DEMO_VARS)):
        spec = load_sweep_file(SWEEPS / name, variables=variables)
        for run in spec.expand():
            _render(run.server, source=name, label=_label(run.server), cases=cases, seen=seen,
                    seed=run.workload.seed)

    dflash = tmp / "dflash-drafter"  # a drafter whose config.json gives the block size
    dflash.mkdir(exist_ok=True)
    (dflash / "config.json").write_text(json.dumps({"block_size": 16}))
    options = {"dtype": "bfloat16", "max_model_len": 8192, "load_format": "dummy", "served_model_name": "target"}
    for engine in ("vllm", "sglang"):
        adapter = adapter_for(engine)
        builds = [""] + [b for b, blk in adapter.flags.get("builds", {}).items() if blk.get("engine") == engine]
        for build in builds:
            declared = adapter.engine_block(build).get("methods", {})
            for method, info in METHODS.items():
                if method not in declared:
                    continue
                drafters = [""]
                if info.takes_drafter:
                    drafters = ["/models/drafter"] + ([str(dflash)] if method == "linear" else [])
                for tp in TP_OF[engine]:
                    for drafter in drafters:
                        server = ServerConfig(engine=engine, engine_build=build, model="/models/target", method=method,
                                              drafter=drafter, tp=tp,
                                              tree_budget=15 if info.needs_budget else None, **options)
                        extra = " +block_size" if drafter == str(dflash) else ""
                        _render(server, source="methods.py", label=_label(server, " +options" + extra), cases=cases,
                                seen=seen, seed=0)
        for prefix in (True, False):
            server = ServerConfig(engine=engine, model="/models/target", prefix_caching=prefix)
            _render(server, source="options", label=f"auto prefix_caching={prefix}", cases=cases, seen=seen)
        twin = ServerConfig(engine=engine, model="/models/target", method="eagle3", drafter="/models/drafter",
                            num_speculative_tokens=3, acceptance_tau=2.5)
        _render(twin, source="twin", label="eagle3 k=3 acceptance_tau=2.5", cases=cases, seen=seen)
    return cases


def run_engine(engine: str, cases: list[Case], tmp: Path) -> subprocess.Popen:
    """Start the engine's interpreter on `cases` (`python tests/test_engine_parsers.py ENGINE`,
    the cases as JSON on its stdin, written to a file under `tmp`)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if engine == "sglang":
        env["PYTHONPATH"] = os.pathsep.join([str(SGLANG_PARSER_DIR), str(REPO)])
    env.pop("DJANGO_SETTINGS_MODULE", None)
    cases_file = tmp / f"{engine}-cases.json"
    cases_file.write_text(json.dumps([asdict(c) for c in cases]))
    with cases_file.open() as stdin:
        return subprocess.Popen([sys.executable, str(Path(__file__)), engine], stdin=stdin,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)


def collect(proc: subprocess.Popen, engine: str, timeout: float = 240) -> tuple[dict[str, dict], str]:
    """The engine's results by case id, or ({}, why) when its parser could not be imported."""
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        raise AssertionError(f"{engine} parser did not finish within {timeout:.0f} s:\n{stderr[-3000:]}") from None
    for line in stdout.splitlines():
        if line.startswith(RESULT_MARK):
            return {r["id"]: r for r in json.loads(line[len(RESULT_MARK):])}, ""
    tail = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    return {}, f"{engine} parser could not run (exit {proc.returncode}): " + " | ".join(tail[-3:])


def table(cases: list[Case], results: dict[str, dict[str, dict]], skipped: dict[str, str]) -> str:
    rows = [("engine", "source", "server / method", "argv", "result", "checks that could not run")]
    for c in cases:
        r = results.get(c.engine, {}).get(c.id)
        if r is None:
            verdict, not_run = f"SKIPPED ({skipped.get(c.engine, 'no result')[:60]})", ""
        else:
            verdict = "parsed OK" if r["parsed"] else f"REFUSED at {r['stage']}: {r['refusal'][:110]}"
            if r.get("pr_only"):
                verdict += " (PR-only, refused as expected: " + ", ".join(c.pr_only_flags + c.pr_only_algorithms) + ")"
            not_run = ", ".join(r["not_run"])
        rows.append((c.engine, c.source, c.label, str(len(c.argv)), verdict, not_run))
    widths = [max(len(r[i]) for r in rows) if i < 5 else 0 for i in range(6)]
    lines = ["  ".join(col.ljust(w) for col, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "\n".join(lines + ["checks that could not run:"] + [f"  {k}: {v}" for k, v in NOT_RUN.items()])


# --------------------------------------------------------------------------------------------
# pytest

if __name__ != "__main__":
    import pytest

    @pytest.fixture(scope="module")
    def parsed(tmp_path_factory):
        """All cases, rendered and handed to both engines at once; prints the table."""
        tmp = tmp_path_factory.mktemp("engine-parsers")
        cases = rendered_cases(tmp) + planted_cases(tmp)
        pin = _sglang_pin()
        installed = sorted(SGLANG_PARSER_DIR.glob("sglang-*.dist-info"))
        if not installed:
            pytest.fail(f"the SGLang parser is not installed in {SGLANG_PARSER_DIR}: run `bash scripts/install.sh` "
                        "(`make test` does; it installs requirements/sglang-parser.txt there)")
        assert installed[-1].name == f"sglang-{pin}.dist-info", (
            f"{SGLANG_PARSER_DIR} holds {installed[-1].name}, requirements/sglang-parser.txt pins {pin}: "
            "run `bash scripts/install.sh`")
        procs = {engine: run_engine(engine, [c for c in cases if c.engine == engine], tmp)
                 for engine in ("vllm", "sglang")}
        results, skipped = {}, {}
        for engine, proc in procs.items():
            results[engine], why = collect(proc, engine)
            if why:
                skipped[engine] = why
        print(f"\nengine parsers: vLLM (installed vllm), SGLang {pin} from {SGLANG_PARSER_DIR}; "
              f"stubbed for SGLang: {', '.join(SGLANG_STUBS)}\n" + table(cases, results, skipped))
        for engine, why in skipped.items():
            print(f"SKIPPED {engine}: {why}")
        return cases, results, skipped

    def _engine_results(parsed, engine: str) -> list[tuple[Case, dict]]:
        cases, results, skipped = parsed
        if engine in skipped:
            if engine == "vllm":
                pytest.fail(skipped[engine])  # vLLM is in the venv: its parser must import
            pytest.skip(skipped[engine])
        return [(c, results[engine][c.id]) for c in cases if c.engine == engine]

    @pytest.mark.parametrize("engine", ["vllm", "sglang"])
    def test_every_rendered_command_parses(parsed, engine):
        """Every sweep server, every declared method with every option, the twin: the engine's own
        parser and post-parse checks accept each (DDTree: all but PR_ONLY)."""
        rows = [(c, r) for c, r in _engine_results(parsed, engine) if c.expect == "ok"]
        assert len(rows) >= (20 if engine == "sglang" else 15)
        refused = [f"{c.source} {c.label}: {r['stage']}: {r['refusal']}\n    {' '.join(c.argv)}"
                   for c, r in rows if not r["parsed"]]
        assert not refused, f"{engine} refuses {len(refused)} rendered command(s):\n" + "\n".join(refused)
        sources = {c.source for c, _ in rows}
        wanted = ({"users-grid-sglang.yaml", "nightly-example.yaml"} if engine == "sglang"
                  else {"vllm-eagle3-example.yaml", "demo.yaml"})
        assert wanted | {"methods.py", "options", "twin"} <= sources

    def test_every_method_of_the_users_grid_is_parsed(parsed):
        """The users' grid on SGLang: auto, linear, DDTree b15/b16/b32/b64 at TP 1/4/8 (18 servers),
        and EAGLE, EAGLE-3, MTP, n-gram, draft model on the same build (methods.py cases)."""
        rows = _engine_results(parsed, "sglang")
        grid = [c for c, _ in rows if c.source == "users-grid-sglang.yaml"]
        assert len(grid) == 18
        labels = {c.label.split(" [")[0] for c, _ in rows if "[sglang-ddtree-pr]" in c.label}
        for want in ("auto tp1", "linear tp4", "b15 tp8", "b64 tp1", "eagle tp1", "eagle3 tp8", "mtp tp4",
                     "ngram tp1", "draft_model tp8", "linear tp8"):
            assert want in labels, (want, sorted(labels))

    def test_ddtree_pr_flags_are_exactly_the_unknown_ones(parsed):
        """Released SGLang refuses the DDTree PR's flag and algorithm, and nothing else of a DDTree
        command: the PR_ONLY list is neither stale nor hiding a real mistake."""
        from benchkit.engines.adapters import adapter_for

        pr = PR_ONLY["sglang-ddtree-pr"]
        args = adapter_for("sglang").engine_block("sglang-ddtree-pr")["methods"]["ddtree"]["args"]
        assert set(pr["flags"]) <= set(args) and set(pr["algorithms"]) <= set(args), (pr, args)
        rows = [(c, r) for c, r in _engine_results(parsed, "sglang") if c.pr_only_flags]
        assert len(rows) >= 12  # 4 budgets x TP 1/4/8 of the users' grid
        for c, r in rows:
            full = r["pr_only"].get("full_command") or ""
            rest = full.split("unrecognized arguments:", 1)[-1].split()
            assert "unrecognized arguments:" in full and [a for a in rest if a.startswith("-")] == pr["flags"], (
                f"{c.label}: released SGLang should refuse exactly {pr['flags']} ({pr['ref']}); it said {full!r}")
            algo = r["pr_only"].get("algorithm") or ""
            assert algo.startswith("Unknown speculative algorithm name: DDTREE"), (
                f"{c.label}: {algo!r}: released SGLang knows DDTREE now? update PR_ONLY")
            assert r["parsed"], (c.label, r)
        print(f"\n{rows[0][0].label}: released SGLang says {rows[0][1]['pr_only']}")

    @pytest.mark.parametrize("case_id", PLANTED_IDS)
    def test_planted_mistake_is_refused(parsed, case_id):
        """A misspelt flag or key, an unknown algorithm or method, a bad value: the engine says no."""
        cases, _, _ = parsed
        case = next(c for c in cases if c.id == case_id)
        (r,) = [r for c, r in _engine_results(parsed, case.engine) if c.id == case_id]
        print(f"\n{case_id}: {' '.join(case.argv)}\n  -> refused at {r['stage']}: {r['refusal']}")
        assert not r["parsed"], f"{case.engine} accepted the planted mistake {case.label}: {' '.join(case.argv)}"
        token = {"planted-sglang-misspelt-flag": "--speculative-num-draft-tokenz",
                 "planted-sglang-unknown-algorithm": "EAGLE4", "planted-sglang-bad-dtype": "bfloat61",
                 "planted-sglang-bad-tp": "four", "planted-vllm-misspelt-flag": "--max-model-lenght",
                 "planted-vllm-misspelt-key": "num_speculative_tokenz", "planted-vllm-unknown-method": "eagle4",
                 "planted-vllm-tp-0": "tensor_parallel_size"}[case_id]
        assert token in r["refusal"], r["refusal"]

    def test_sglang_pin_is_the_wheel_peers_fetches():
        """One SGLang version for the parser and the peer clients (benchmarks/peers.py)."""
        peers = (REPO / "benchmarks" / "peers.py").read_text()
        assert f'SGLANG_VERSION = "{_sglang_pin()}"' in peers


if __name__ == "__main__":
    _cases = json.load(sys.stdin)
    _results = {"vllm": vllm_parse, "sglang": sglang_parse}[sys.argv[1]](_cases)
    sys.stdout.write("\n" + RESULT_MARK + json.dumps(_results) + "\n")
