"""Fuzzing the result-file import (issues 10 and 19): hypothesis strategies that mutate the real
result files in tests/fixtures/results/ (vLLM single object, vLLM appended lines, the old
benchmark_serving layout, SGLang JSON lines, a draftboard format-1 export) and
tests/fixtures/harnesses/ (AIPerf's profile with its per-record export, a GuideLLM report as JSON
and as YAML, a genai-bench experiment folder, an inference-perf report folder, a `vllm bench
sweep` folder), and the checks every import must pass. Used by tests/test_import_fuzz.py (a few
hundred examples in CI) and benchmarks/fuzz_imports.py (the long run that prints counts).

A seed is a set of files (`Seed`: relative path -> JSON, JSON lines, YAML or raw bytes) and the
path imported (a file, or "." for the folder itself); a sample (`Sample`) mutates one or two of
its files and is written with `write_sample`.

A mutation replaces a value anywhere in an object (top level, server_info, draftboard.metrics,
draftboard.run, a per-request list) with a hostile one (NaN, +-Infinity, negative, huge or
long numbers, NUL, lone surrogates, over-long text, wrong types, deep nesting), deletes or
renames a key (a stray colon, as an old vLLM release wrote `request_goodput:`), adds one, or
damages the text (truncation, invalid UTF-8, a stray byte). The file is then imported through
the real service into the real database, as one of several methods.

`check_import(path, method)` returns an `Outcome`: `refused` (ResultFileError), `imported`,
`existing`, or `traceback` (any other exception: a bug); with `partial_write` when a refused
import changed any row count or an import left a run without metrics, and the list of
`violations` (a stored figure negative, non-finite or out of its schema bounds; a workload
column out of range).
"""

from __future__ import annotations

import copy
import json
import math
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st

from benchkit.formats.errors import ResultFileError
from benchkit.formats.limits import BIGINT_MAX, EXTRA_MAX_BYTES, INT_MAX
from benchkit.measure.metrics import METRIC_FIELDS

FIXTURES = Path(__file__).parent / "fixtures" / "results"
HARNESSES = Path(__file__).parent / "fixtures" / "harnesses"
#: The real result files the mutations start from: (file name, single object or JSON lines).
SEED_FILES = ("vllm-bench-serve-full.json", "vllm-bench-serve-appended.json", "vllm-benchmark-serving-old.json",
              "sglang-bench-serving.jsonl", "draftboard-export-format1.json")
#: Methods the files are imported as: draft_model k=4 (tau <= 5 fits every seed), auto (refuses
#: acceptance figures), b15 (DDTree), none (the file must state each run's method: a vllm bench
#: sweep folder does).
METHODS = (("draft_model", 4), ("auto", None), ("b15", None), (None, None))


@dataclass(frozen=True)
class Seed:
    """Real result files: `files` relative path -> (kind "json" | "lines" | "yaml" | "raw",
    parsed objects, or the bytes for "raw"); `target`: the path imported ("." = the folder);
    `method`: one it imports as unmutated."""

    name: str
    files: dict[str, tuple[str, Any]]
    target: str
    method: tuple[str | None, int | None] = ("draft_model", 4)


def _parsed(path: Path) -> tuple[str, Any]:
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        return "yaml", [yaml.safe_load(text)]
    if path.suffix == ".csv":
        return "raw", path.read_bytes()
    try:
        return "json", [json.loads(text)]
    except json.JSONDecodeError:
        return "lines", [json.loads(line) for line in text.splitlines() if line.strip()]


def _folder(root: Path, names: list[str]) -> dict[str, tuple[str, Any]]:
    return {n: _parsed(root / n) for n in names}


def _load_seeds() -> list[Seed]:
    seeds = [Seed(name, {name: _parsed(FIXTURES / name)}, name) for name in SEED_FILES]
    aiperf = HARNESSES / "aiperf" / "draft_model-k2"
    seeds.append(Seed("aiperf", _folder(aiperf, ["profile_export_aiperf.json", "profile_export.jsonl"]),
                      "profile_export_aiperf.json"))
    seeds.append(Seed("guidellm.json", {"benchmarks.json": _parsed(HARNESSES / "guidellm" / "draft_model-k2" /
                                                                   "benchmarks.json")}, "benchmarks.json"))
    report = json.loads((HARNESSES / "guidellm" / "auto" / "benchmarks.json").read_text())
    report["benchmarks"] = report["benchmarks"][:1]  # the real report's layout, one benchmark (YAML is slow)
    seeds.append(Seed("guidellm.yaml", {"benchmarks.yaml": ("yaml", [report])}, "benchmarks.yaml"))
    genai = HARNESSES / "genai-bench" / "auto"
    seeds.append(Seed("genai-bench", _folder(genai, sorted(p.name for p in genai.glob("*.json"))), "."))
    iperf = HARNESSES / "inference-perf" / "auto"
    seeds.append(Seed("inference-perf", _folder(iperf, ["config.yaml", "stage_0_lifecycle_metrics.json",
                                                        "stage_1_lifecycle_metrics.json",
                                                        "summary_lifecycle_metrics.json"]), "."))
    sweep = HARNESSES / "vllm-bench-sweep" / "sweep"
    seeds.append(Seed("vllm-sweep", _folder(sweep, sorted(str(p.relative_to(sweep)) for p in sweep.rglob("*")
                                                          if p.is_file() and p.name != "summary.json")), ".",
                      (None, None)))
    return seeds


SEEDS = _load_seeds()

HOSTILE_TEXT = ["", "m\x00", "a\x00b", "\ud800", "m\udfff", "x" * 501, "0." * 60, "inf", "Infinity", "NaN",
                "-inf", "trace", "random", "sharegpt", "sglang", "vllm", "four", "1e999", "\u00e9\u4e2d"]
HOSTILE_NUMBERS = [0, -1, -0.0, 0.5, 1, 1.5, 2, 100, 100.0001, 500, -82.9, -55.7, 2**31 - 1, 2**31, 2**63 - 1,
                   2**63, 10**20, -(10**20), 1e308, -1e308, 5e-324, math.nan, math.inf, -math.inf]
NEW_KEYS = ["request_goodput:", "completed:", "mean_ttft_ms ", "spec_decode_acceptance_rate", "num_prompts",
            "max_concurrency", "failed", "duration", "accept_length", "model_id", "version", "vllm_version",
            "dataset_name", "server_info", "errors", "input_lens", "itls", "draftboard", "x\x00", "\ud800",
            "duration_s", "model_config", "__class__", "model_extra"]

scalars = st.one_of(
    st.sampled_from(HOSTILE_NUMBERS),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**25), max_value=10**25),
    st.sampled_from(HOSTILE_TEXT),
    st.text(max_size=12),
    st.booleans(),
    st.none(),
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                      max_leaves=8)


numbers = st.one_of(
    st.sampled_from(HOSTILE_NUMBERS),
    st.floats(min_value=0.0, max_value=1e6),  # plausible: the import must store these within bounds
    st.integers(min_value=0, max_value=10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**25), max_value=10**25),
)


@st.composite
def replacement(draw, old: Any) -> Any:
    """A new value for `old`: mostly of its own kind (numbers for numbers, text for text, a
    list of numbers for a list), a quarter of the time anything at all."""
    if draw(st.integers(0, 3)) == 0:
        return draw(values)
    if isinstance(old, bool) or old is None:
        return draw(scalars)
    if isinstance(old, (int, float)):
        return draw(numbers)
    if isinstance(old, str):
        return draw(st.one_of(st.sampled_from(HOSTILE_TEXT), st.text(max_size=12)))
    if isinstance(old, list):
        return draw(st.lists(numbers, max_size=5))
    return draw(values)


def _containers(obj: Any, path: tuple = ()) -> list[tuple]:
    """Paths of every dict and list inside `obj` (itself included), lists of numbers sampled lightly."""
    out = [path]
    if isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(v, (dict, list)) and k != "generated_texts":
                out.extend(_containers(v, path + (k,)))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:3]):
            if isinstance(v, (dict, list)):
                out.extend(_containers(v, path + (i,)))
    return out


def _at(obj: Any, path: tuple) -> Any:
    for part in path:
        obj = obj[part]
    return obj


@st.composite
def mutated_object(draw, obj: dict) -> dict:
    """`obj` with 1-4 mutations (see the module docstring)."""
    obj = copy.deepcopy(obj)
    for _ in range(draw(st.integers(1, 4))):
        target = _at(obj, draw(st.sampled_from(_containers(obj))))
        kind = draw(st.sampled_from(["set"] * 6 + ["add", "delete", "delete", "rename", "nest"]))
        if isinstance(target, list):
            if not target:
                target.append(draw(values))
                continue
            i = draw(st.integers(0, len(target) - 1))
            if kind == "delete":
                del target[i]
            else:
                target[i] = draw(replacement(target[i]))
            continue
        keys = sorted(target, key=str)
        if kind == "add" or not keys:
            target[draw(st.one_of(st.sampled_from(NEW_KEYS), st.text(max_size=8)))] = draw(values)
            continue
        key = draw(st.sampled_from(keys))
        if kind == "delete":
            del target[key]
        elif kind == "rename":
            target[key + draw(st.sampled_from([":", " ", "_", "\x00"]))] = target.pop(key)
        elif kind == "nest":
            value = target[key]
            for _ in range(draw(st.sampled_from([1, 2, 5, 40]))):
                value = [value]
            target[key] = value
        else:
            target[key] = draw(replacement(target[key]))
    return obj


@dataclass(frozen=True)
class Sample:
    """A mutated seed: `files` relative path -> bytes, `target` as the seed's."""

    name: str
    files: dict[str, bytes]
    target: str


def _text(kind: str, objects: Any, ascii_only: bool, indent: int | None) -> bytes:
    if kind == "raw":
        return objects
    if kind == "yaml":
        text = yaml.safe_dump(objects[0], allow_unicode=not ascii_only, sort_keys=False)
        return text.encode("utf-8", "surrogatepass")
    if kind == "lines":
        text = "\n".join(json.dumps(o, ensure_ascii=ascii_only) for o in objects) + "\n"
    else:
        text = json.dumps(objects[0], ensure_ascii=ascii_only, indent=indent)
    return text.encode("utf-8", "surrogatepass")  # a lone surrogate unescaped: invalid UTF-8


@st.composite
def result_files(draw) -> Sample:
    """A mutated real result source (a file, or a folder of files)."""
    seed = draw(st.sampled_from(SEEDS))
    mutable = [n for n, (kind, _) in seed.files.items() if kind != "raw"]
    chosen = set(draw(st.lists(st.sampled_from(mutable), min_size=1, max_size=2)))
    out: dict[str, bytes] = {}
    for name, (kind, objects) in seed.files.items():
        if name in chosen:
            objects = list(objects)
            for _ in range(draw(st.integers(0, 2))):
                i = draw(st.integers(0, len(objects) - 1))
                objects[i] = draw(mutated_object(objects[i]))
            try:
                data = _text(kind, objects, draw(st.booleans()), draw(st.sampled_from([None, 2])))
            except yaml.YAMLError:  # a value PyYAML cannot write (a lone surrogate): write it as JSON
                data = _text("json", objects, True, None)
            data = draw(damaged(data, kind))
        else:
            data = _text(kind, objects, True, 2 if kind == "json" else None)
        out[name] = data
    return Sample(seed.name, out, seed.target)


@st.composite
def damaged(draw, data: bytes, kind: str) -> bytes:
    """`data`, now and then truncated, with a stray byte, or nested very deep."""
    damage = draw(st.sampled_from(["none"] * 12 + ["truncate", "byte", "deep"]))
    if damage == "truncate":
        data = data[: draw(st.integers(0, len(data)))]
    elif damage == "byte":
        i = draw(st.integers(0, max(0, len(data) - 1)))
        data = data[:i] + bytes([draw(st.integers(0, 255))]) + data[i + 1:]
    elif damage == "deep":
        n = draw(st.sampled_from([33, 1000, 100_000]))
        if kind == "yaml":
            data = data + b"deep: " + b"[" * n + b"]" * n + b"\n"
        else:
            data = data.rstrip()[:-1] + b', "deep": ' + b"[" * n + b"]" * n + b"}"
    return data


def unmutated(seed: Seed) -> Sample:
    """The seed's own files, written as a sample."""
    return Sample(seed.name, {n: _text(kind, objs, True, 2 if kind == "json" else None)
                              for n, (kind, objs) in seed.files.items()}, seed.target)


def write_sample(folder: Path, sample: Sample) -> Path:
    """Write `sample` under `folder` (a fresh folder per sample) and return the path to import."""
    for name, data in sample.files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return folder if sample.target == "." else folder / sample.target


@dataclass
class Outcome:
    """What one fuzzed import did (see the module docstring)."""

    status: str
    partial_write: bool = False
    violations: list[str] = field(default_factory=list)
    error: str = ""


def _tables():
    from runs.models import Host, ResultFile, Run, RunMetrics, RunTransition, Sweep

    return (Host, Sweep, Run, RunMetrics, RunTransition, ResultFile)


def row_counts() -> dict[str, int]:
    return {t.__name__: t.objects.count() for t in _tables()}


def violations_of(run_ids: list[int]) -> list[str]:
    """Every stored figure of these runs outside its bounds: metric columns negative, non-finite or
    beyond the schema's lo/hi (counts within bigint), workload columns out of their ranges, and
    kept keys (RunMetrics.extra) over EXTRA_MAX_BYTES."""
    from runs.models import Run

    out = []
    for run in Run.objects.filter(pk__in=run_ids).select_related("metrics"):
        for name in ("concurrency", "num_prompts", "input_len", "output_len", "tp"):
            v = getattr(run, name)
            if v is not None and not 0 <= v <= INT_MAX:
                out.append(f"run {run.pk} {name}={v!r}")
        if run.request_rate is not None and not (math.isfinite(run.request_rate) and run.request_rate > 0):
            out.append(f"run {run.pk} request_rate={run.request_rate!r}")
        m = run.metrics
        size = len(json.dumps(m.extra, ensure_ascii=False).encode("utf-8", "surrogatepass"))
        if size > EXTRA_MAX_BYTES:
            out.append(f"run {run.pk} extra={size} bytes")
        for f in METRIC_FIELDS:
            value = getattr(m, f.name)
            items = value if isinstance(value, list) else [value]
            for v in items:
                if v is None or isinstance(v, bool):
                    continue
                bad = not isinstance(v, (int, float)) or not math.isfinite(v) \
                    or (f.lo is not None and v < f.lo) or (f.hi is not None and v > f.hi) \
                    or (f.kind is int and not -BIGINT_MAX <= v <= BIGINT_MAX)
                if bad:
                    out.append(f"run {run.pk} {f.name}={v!r}")
    return out


def check_import(path: Path, method: tuple[str | None, int | None], host: str = "fuzz-host") -> Outcome:
    """Import `path` as `method` through the real service and check the database afterwards."""
    from runs.models import Run
    from runs.services.imports import import_result_file

    before = row_counts()
    try:
        report = import_result_file(path, host=host, sweep_name="fuzz", method=method[0],
                                    num_speculative_tokens=method[1])
    except ResultFileError as exc:
        return Outcome("refused", partial_write=row_counts() != before, error=str(exc))
    except Exception:  # noqa: BLE001 - the fuzzer counts every other exception as a bug
        return Outcome("traceback", partial_write=row_counts() != before, error=traceback.format_exc())
    ids = report.run_ids
    if not ids:
        return Outcome("existing", partial_write=row_counts() != before)
    no_metrics = Run.objects.filter(pk__in=ids, metrics__isnull=True).count()
    return Outcome("imported", partial_write=no_metrics > 0, violations=violations_of(ids))
