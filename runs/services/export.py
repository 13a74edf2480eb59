"""A run in the `vllm bench serve --save-result` key layout plus draftboard's keys."""

from __future__ import annotations

from typing import Any

from benchkit.resultfiles import export_vllm_layout
from runs.models import Run


def run_export(run: Run) -> dict[str, Any]:
    """One succeeded run as benchkit.resultfiles.export_vllm_layout writes it, with the run's
    configuration (engine, method, TP, GPUs, argv) under draftboard.run. Requires `run.metrics`."""
    m = run.metrics
    meta = {
        "run_id": run.pk, "sweep_id": run.sweep_id, "model": run.model, "backend": run.engine,
        "label": run.method_label, "date": run.finished_at, "num_prompts": run.num_prompts,
        "concurrency": run.concurrency, "request_rate": run.request_rate, "spec_decode": m.spec_decode or None,
        "engine_version": run.engine_version, "engine_commit": run.engine_commit, "method": run.method,
        "num_speculative_tokens": run.num_speculative_tokens, "tree_budget": run.tree_budget, "tp": run.tp,
        "gpus": run.gpus, "input_len": run.input_len, "output_len": run.output_len, "argv": run.argv,
        "is_demo_model": run.is_demo_model, "source_tool": m.source_tool,
    }
    return export_vllm_layout(m.data, meta)
