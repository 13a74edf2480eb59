"""Import result files of `vllm bench serve` (JSON) and `sglang.bench_serving` (JSON lines).

Each file run becomes a succeeded Run (created in that state, with an `imported` history row)
in a new sweep, with RunMetrics whose `source_tool` and `definitions` record the tool's own
metric definitions (their "ITL" is per chunk: draftboard stores it as ICL). All or nothing:
a malformed file raises benchkit.resultfiles.ResultFileError and stores nothing.
"""

from __future__ import annotations

from pathlib import Path

from django.db import transaction
from django.utils import timezone

from benchkit.resultfiles import ImportedRun, load_result_file
from runs.models import Host, Run, RunMetrics, RunState, RunTransition, Sweep
from runs.services.execution import metrics_fields


def _num(value, default=0):
    return default if value is None else value


def import_result_file(path: str | Path, host: Host, sweep_name: str, method: str = "auto",
                       num_speculative_tokens: int | None = None, tree_budget: int | None = None, tp: int = 1,
                       engine: str = "vllm", fmt: str = "auto") -> Sweep:
    """Store every run of the result file at `path` in a new sweep named `sweep_name`.

    The file does not say which decoding method produced it, so the caller does (`method`,
    `num_speculative_tokens`, `tree_budget`, `tp`, `engine`). Raises ResultFileError naming
    the file, line and field; nothing is stored then."""
    imported: list[ImportedRun] = load_result_file(path, fmt=fmt)
    now = timezone.now()
    with transaction.atomic():
        sweep = Sweep.objects.create(name=sweep_name, host=host, source=f"import:{path}",
                                     spec={"imported_from": str(path), "fmt": fmt})
        for i, imp in enumerate(imported):
            w = imp.workload
            run = Run.objects.create(
                sweep=sweep, host=host, point_key=f"import-{i}", spec={"imported": imp.origin, "workload": w},
                engine=engine, engine_version=imp.source_version or "", model=w.get("model") or "",
                method=method, num_speculative_tokens=num_speculative_tokens, tree_budget=tree_budget, tp=tp,
                concurrency=_num(w.get("concurrency"), 0), request_rate=w.get("request_rate"),
                input_len=_num(w.get("input_len")), output_len=_num(w.get("output_len")),
                num_prompts=_num(w.get("num_prompts")), dataset=w.get("dataset") or "unknown",
                state=RunState.SUCCEEDED, started_at=now, finished_at=now,
            )
            RunTransition.objects.create(run=run, from_state="imported", to_state=RunState.SUCCEEDED,
                                         note=f"imported from {imp.origin} ({imp.source_tool})")
            flat = {k: v for k, v in imp.metrics_flat.items()}
            for key in ("completed", "failed", "error_rate", "duration", "output_throughput",
                        "request_throughput", "total_token_throughput"):
                flat[key] = _num(flat.get(key))
            RunMetrics.objects.create(run=run, source_tool=imp.source_tool, definitions=imp.definitions,
                                      **metrics_fields(flat, imp.spec_decode, None))
    return sweep
