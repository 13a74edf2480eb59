"""Stand-in result formats, written as a format author would write one (benchkit.formats.base),
for tests/test_format_registry.py: the test adds each to the registry itself, no project file
is touched. They are made up (no real tool writes them); they exercise what the formats of
issue 19 need that `vllm bench serve` and SGLang files do not: several runs in one document, and
a folder read as one source.

- `LoadTool` ("loadtool"): one JSON document `{"loadtool": {"version": V}, "model": M,
  "benchmarks": [{"concurrency", "requests": {"completed", "failed"}, "duration_s",
  "input_tokens", "output_tokens", "ttft_ms": {"mean", "median", "p99"}, "tpot_ms": {"mean"}},
  ...]}`, one run per entry of `benchmarks`, origin `path#benchmarks[i]`. Latencies in ms,
  durations in s, TPOT per output token as draftboard defines it.
- `SweepTool` ("sweeptool"): a folder holding `manifest.json` (`{"sweeptool": V, "model": M}`)
  and `points/*.json`, each one benchmark entry as above; one run per point file, origin
  `folder/points/<name>.json`. Other files of the folder are not read (so not in its key).
"""

from __future__ import annotations

from typing import Any, ClassVar

from benchkit.formats.base import Recognition, ResultFormat, Source
from benchkit.formats.common import (
    ImportedRun,
    Number,
    ResultModel,
    Text,
    Whole,
    extra_of,
    finish_window,
    make_workload,
    validate,
)
from benchkit.formats.errors import ResultFileError
from benchkit.formats.jsontext import JsonObject

TOOL = "loadtool"
DEFINITIONS = {"ttft": "first token minus send time", "tpot": "(latency - TTFT) / (output tokens - 1)"}


class Requests(ResultModel):
    completed: Whole() | None = None
    failed: Whole() | None = None


class Stats(ResultModel):
    mean: Number() | None = None
    median: Number() | None = None
    p99: Number() | None = None


class Benchmark(ResultModel):
    concurrency: Whole(1, 2**31 - 1) | None = None
    requests: Requests = Requests()
    duration_s: Number(None, gt=0) | None = None
    input_tokens: Whole() | None = None
    output_tokens: Whole() | None = None
    ttft_ms: Stats = Stats()
    tpot_ms: Stats = Stats()


class Version(ResultModel):
    version: Text(100) | None = None


class LoadToolDocument(ResultModel):
    loadtool: Version
    model: Text(500) | None = None
    benchmarks: list[Benchmark]


def run_of(bench: Benchmark, model: str | None, version: str | None, origin: str,
           refuse: Any) -> ImportedRun:
    """One benchmark entry as an ImportedRun (figures mapped to the metric schema's names)."""
    values = {"completed": bench.requests.completed, "failed": bench.requests.failed, "duration_s": bench.duration_s,
              "total_input_tokens": bench.input_tokens, "total_output_tokens": bench.output_tokens,
              "mean_ttft_ms": bench.ttft_ms.mean, "median_ttft_ms": bench.ttft_ms.median,
              "p99_ttft_ms": bench.ttft_ms.p99, "mean_tpot_ms": bench.tpot_ms.mean}
    workload = make_workload(concurrency=bench.concurrency, model=model)
    definitions = dict(DEFINITIONS)
    window, failure = finish_window(values, None, workload, definitions, refuse)
    return ImportedRun(source_tool=TOOL, source_version=version, definitions=definitions, metrics=window,
                       workload=workload, source_extra=extra_of(bench), origin=origin, failure=failure)


class LoadTool(ResultFormat):
    name: ClassVar[str] = "loadtool"
    tool: ClassVar[str] = TOOL
    reads: ClassVar[str] = "one JSON document, one run per benchmarks[] entry"

    def recognise(self, source: Source) -> Recognition | None:
        objects = source.json().objects
        if len(objects) == 1 and isinstance(objects[0].data.get("loadtool"), dict):
            return Recognition(1, TOOL, ("loadtool",))
        return None

    def read(self, source: Source):
        objects = source.json().objects
        if len(objects) != 1:
            raise ResultFileError(source.path, "a loadtool file is one JSON document")
        obj = objects[0]
        doc = validate(LoadToolDocument, obj)
        if not doc.benchmarks:
            raise obj.error(("benchmarks",), "no benchmark in the document")
        for i, bench in enumerate(doc.benchmarks):
            yield run_of(bench, doc.model, doc.loadtool.version, f"{source.path}#benchmarks[{i}]",
                         lambda name, reason, i=i: obj.error(("benchmarks", i, name), reason))


class SweepManifest(ResultModel):
    sweeptool: Text(100)
    model: Text(500) | None = None


class SweepTool(ResultFormat):
    name: ClassVar[str] = "sweeptool"
    tool: ClassVar[str] = "sweeptool"
    reads: ClassVar[str] = "a folder: manifest.json and points/*.json, one run per point"
    takes: ClassVar[str] = "folder"

    def recognise(self, source: Source) -> Recognition | None:
        manifest = source.path / "manifest.json"
        if manifest in source.files() and "sweeptool" in source.read_json(manifest).objects[0].data:
            return Recognition(1, "sweeptool", ("manifest.json",))
        return None

    def read(self, source: Source):
        manifest = source.path / "manifest.json"
        if manifest not in source.files():
            raise ResultFileError(source.path, "no manifest.json: not a sweeptool folder")
        head = validate(SweepManifest, source.read_json(manifest).objects[0])
        points = [p for p in source.files() if p.parent == source.path / "points" and p.suffix == ".json"]
        for path in points:
            obj: JsonObject = source.read_json(path).objects[0]
            bench = validate(Benchmark, obj)
            yield run_of(bench, head.model, head.sweeptool, str(path),
                         lambda name, reason, obj=obj: obj.error((name,), reason))


FORMAT = LoadTool()
FOLDER_FORMAT = SweepTool()
