"""Migrations 0002-0004 (the metric schema) on a database holding rows written before them.

The 0001-era rows are built with the 0001 historical models from what the 0001 code stored: the
`data` / `spec_decode` JSON of a measured run is the draftboard block of
tests/fixtures/results/draftboard-export-format1.json (written by the code at 021632b), and an
imported run carries a key draftboard had no column for. After 0004 every figure is in its
column, nothing is lost, and the reverse rebuilds the JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from benchkit.formats.reader import load_result_file
from benchkit.measure.metrics import METRIC_FIELDS, WindowMetrics

FORMAT1 = Path(__file__).parent / "fixtures" / "results" / "draftboard-export-format1.json"
BEFORE, AFTER = [("runs", "0001_initial")], [("runs", "0004_drop_metric_json")]


def migrate(targets):
    """Migrate to `targets` and return the historical apps there."""
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    executor.loader.build_graph()
    return executor.loader.project_state(targets).apps


def old_row(apps, name: str, data: dict, spec_decode: dict, **columns):
    """A 0001 RunMetrics row as 0001's execution.metrics_fields wrote it (columns copied from data)."""
    host, _ = apps.get_model("runs", "Host").objects.get_or_create(name="h")
    sweep = apps.get_model("runs", "Sweep").objects.create(name=name, host=host)
    run = apps.get_model("runs", "Run").objects.create(
        sweep=sweep, host=host, point_key=name, spec={}, engine="vllm", model="/m", method="draft_model",
        concurrency=2, input_len=32, output_len=16, num_prompts=6, state="succeeded")
    cols = dict(completed=data["completed"], failed=data["failed"], error_rate=data["error_rate"],
                duration_s=data["duration"], output_throughput=data["output_throughput"],
                request_throughput=data["request_throughput"], total_token_throughput=data["total_token_throughput"],
                goodput=data["goodput"], mean_ttft_ms=data["mean_ttft_ms"], median_ttft_ms=data["median_ttft_ms"],
                median_tpot_ms=data["median_tpot_ms"], median_itl_ms=data["median_itl_ms"],
                median_icl_ms=data["median_icl_ms"], median_e2el_ms=data["median_e2el_ms"],
                mean_tokens_per_chunk=data["mean_tokens_per_chunk"],
                acceptance_length=spec_decode.get("acceptance_length"),
                acceptance_rate=spec_decode.get("acceptance_rate"))
    return apps.get_model("runs", "RunMetrics").objects.create(
        run=run, data=data, spec_decode=spec_decode, distributions={"ttft_ms": [1.0, 2.0]}, **{**cols, **columns})


@pytest.mark.django_db(transaction=True)
def test_metric_schema_migrations_move_every_stored_figure_into_its_column_and_back():
    block = json.loads(FORMAT1.read_text())["draftboard"]
    measured_data, measured_spec = block["metrics"], block["spec_decode"]
    imported_data = {**measured_data, "a_later_key": 1.5, "failed": 0, "p90_ttft_ms": None}
    imported_spec = {"acceptance_length": 2.1, "spec_source": "sglang.bench_serving accept_length", "odd": [1]}
    try:
        apps = migrate(BEFORE)
        measured = old_row(apps, "measured", measured_data, measured_spec)
        imported = old_row(apps, "imported", imported_data, imported_spec, source_tool="sglang.bench_serving",
                           definitions={"itl": "per chunk"})

        apps = migrate(AFTER)
        RunMetrics = apps.get_model("runs", "RunMetrics")
        row = RunMetrics.objects.get(pk=measured.pk)
        # fields added after this migration (e.g. 0010's efficiency and client columns) stay None
        window = WindowMetrics(**{f.name: getattr(row, f.name) for f in METRIC_FIELDS if hasattr(row, f.name)})
        # the database migration and the file importer agree on every figure of the same run
        assert window == load_result_file(FORMAT1)[0].metrics
        assert (row.duration_s, row.output_throughput_tok_s, row.request_goodput_req_s) == (
            measured_data["duration"], measured_data["output_throughput"], measured_data["goodput"])
        assert (row.spec_num_drafts, row.per_position_acceptance_rate, row.spec_source) == (50.0, [0.8, 0.6, 0.4],
                                                                                               "vllm")
        assert row.extra == {} and row.distributions == {"ttft_ms": [1.0, 2.0]}

        row = RunMetrics.objects.get(pk=imported.pk)
        assert row.extra == {"a_later_key": 1.5, "spec_decode": {"odd": [1]}}  # kept, not lost
        assert row.acceptance_length == 2.1 and row.spec_source == "sglang.bench_serving accept_length"
        assert row.p90_ttft_ms is None and row.acceptance_rate is None and row.spec_num_drafts is None
        assert (row.source_tool, row.definitions) == ("sglang.bench_serving", {"itl": "per chunk"})

        apps = migrate(BEFORE)  # and back: the JSON is rebuilt from the columns
        RunMetrics = apps.get_model("runs", "RunMetrics")
        row = RunMetrics.objects.get(pk=measured.pk)
        assert row.data == measured_data and row.output_throughput == measured_data["output_throughput"]
        assert row.spec_decode == {k: v for k, v in measured_spec.items() if k.startswith(("spec_", "accept", "per_"))}
        row = RunMetrics.objects.get(pk=imported.pk)
        assert row.data == imported_data and row.spec_decode["odd"] == [1]
    finally:
        migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())


def test_model_columns_are_the_schema():
    """One nullable column per WindowMetrics field, its unit as help text; nothing else numeric."""
    from runs.models import RunMetrics

    for f in METRIC_FIELDS:
        column = RunMetrics._meta.get_field(f.name)
        assert column.null and column.help_text == f.unit and column.verbose_name == f.label, f.name
    others = {c.name for c in RunMetrics._meta.concrete_fields} - {f.name for f in METRIC_FIELDS}
    assert others == {"id", "run", "spec_source", "distributions", "source_tool", "definitions", "extra",
                      "efficiency", "gpu_check", "client_headroom", "categories", "computed_at"}
