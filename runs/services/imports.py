"""Import result files of `vllm bench serve` (JSON) and `sglang.bench_serving` (JSON lines).

Each file run becomes a succeeded Run (created in that state, with an `imported` history row)
in a new sweep, with RunMetrics whose `source_tool` and `definitions` record the tool's own
metric definitions (their "ITL" is per chunk: draftboard stores it as ICL); a figure the file
lacks stays NULL (unknown), and the file's keys draftboard has no column for are kept in `extra`. All or nothing:
a malformed file raises benchkit.formats.common.ResultFileError and stores nothing.
"""

from __future__ import annotations

from pathlib import Path

from django.db import transaction
from django.utils import timezone

from benchkit.formats.common import ImportedRun
from benchkit.formats.reader import load_result_file
from benchkit.methods import METHODS, MethodError, check_method
from runs.models import Host, Run, RunState, RunTransition, Sweep
from runs.services.metrics_store import store_metrics


def _num(value, default=0):
    return default if value is None else value


class ImportOptionError(ValueError):
    """The options given for an import contradict each other or the method's rules."""


#: The import command's option for each field of benchkit.methods.check_method.
OPTION_NAMES = {"method": "--method", "num_speculative_tokens": "--num-speculative-tokens",
                "tree_budget": "--tree-budget", "drafter": "--drafter", "prefix_caching": "--prefix-caching"}


def check_import_options(method: str, num_speculative_tokens: int | None, tree_budget: int | None, tp: int,
                         sweep_name: str) -> None:
    """Raise ImportOptionError naming the option when the method description is invalid: the method
    table's rules (benchkit.methods.check_method; a result file does not name its drafter, so
    that is not checked), TP >= 1 and a non-empty sweep name."""
    try:
        check_method(method, num_speculative_tokens, tree_budget, drafter=None, names=OPTION_NAMES)
    except MethodError as exc:
        raise ImportOptionError(f"{OPTION_NAMES[exc.field]}: {exc.reason}") from None
    if tp < 1:
        raise ImportOptionError(f"--tp {tp}: must be >= 1")
    if not sweep_name.strip():
        raise ImportOptionError("--sweep-name is empty")


def import_result_file(path: str | Path, host: Host, sweep_name: str, method: str,
                       num_speculative_tokens: int | None = None, tree_budget: int | None = None, tp: int = 1,
                       engine: str | None = None, fmt: str = "auto") -> Sweep:
    """Store every run of the result file at `path` in a new sweep named `sweep_name`.

    The file does not reliably say which decoding method produced it, so the caller does
    (`method`, `num_speculative_tokens`, `tree_budget`, `tp`); `engine` defaults to the tool
    that wrote the file (vllm for `vllm bench serve`, sglang for `sglang.bench_serving`). A
    file that records speculative decoding (acceptance figures) cannot be imported as a method
    that does not speculate (`auto`).
    Raises ImportOptionError for contradictory options and ResultFileError naming the file,
    line and field for a bad file; nothing is stored then."""
    check_import_options(method, num_speculative_tokens, tree_budget, tp, sweep_name)
    imported: list[ImportedRun] = load_result_file(path, fmt=fmt)
    for imp in imported:
        if not METHODS[method].speculates and imp.metrics.acceptance_length:
            raise ImportOptionError(f"{imp.origin} records speculative decoding (acceptance length "
                                    f"{imp.metrics.acceptance_length}): pass its --method, not {method}")
    now = timezone.now()
    with transaction.atomic():
        sweep = Sweep.objects.create(name=sweep_name, host=host, source=f"import:{path}",
                                     spec={"imported_from": str(path), "fmt": fmt})
        for i, imp in enumerate(imported):
            w = imp.workload
            run = Run.objects.create(
                sweep=sweep, host=host, point_key=f"import-{i}", spec={"imported": imp.origin, "workload": w},
                engine=engine or ("sglang" if imp.source_tool.startswith("sglang") else "vllm"),
                engine_version=imp.source_version or "", model=w.get("model") or "",
                method=method, num_speculative_tokens=num_speculative_tokens, tree_budget=tree_budget, tp=tp,
                concurrency=_num(w.get("concurrency"), 0), request_rate=w.get("request_rate"),
                input_len=_num(w.get("input_len")), output_len=_num(w.get("output_len")),
                num_prompts=_num(w.get("num_prompts")), dataset=w.get("dataset") or "unknown",
                state=RunState.SUCCEEDED, started_at=now, finished_at=now,
            )
            RunTransition.objects.create(run=run, from_state="imported", to_state=RunState.SUCCEEDED,
                                         note=f"imported from {imp.origin} ({imp.source_tool})")
            store_metrics(run, imp.metrics, spec_source=imp.spec_source, source_tool=imp.source_tool,
                          definitions=imp.definitions, extra=imp.source_extra)
    return sweep
