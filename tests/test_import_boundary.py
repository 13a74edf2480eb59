"""Issue 10: result files in through a validated boundary. Each input the issue lists as failing
(stored as 0, stored as nonsense, a traceback instead of a clean error, a half-done import) is a
test here, through the real command and the real database (SQLite, and PostgreSQL in the
second leg, where NUL and over-long strings used to be DataErrors)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from analysis.exports import run_export
from benchkit.formats.errors import ResultFileError
from benchkit.formats.reader import load_result_file
from benchkit.measure.metrics import METRIC_FIELDS
from runs.models import Host, ResultFile, Run, RunMetrics, RunTransition, Sweep
from runs.services.imports import import_result_file
from tests.test_migrations import migrate

pytestmark = pytest.mark.django_db
RESULTS = Path(__file__).parent / "fixtures" / "results"
VLLM_FULL = RESULTS / "vllm-bench-serve-full.json"
SGLANG = RESULTS / "sglang-bench-serving.jsonl"
TABLES = (Host, Sweep, Run, RunMetrics, RunTransition, ResultFile)


def counts() -> dict[str, int]:
    return {t.__name__: t.objects.count() for t in TABLES}


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def run_cmd(path: Path, *args: str) -> str:
    from io import StringIO
    out = StringIO()
    call_command("import_results", str(path), *args, stdout=out)
    return out.getvalue()


def vllm_obj(**changes) -> dict:
    obj = json.loads(VLLM_FULL.read_text())
    obj.update(changes)
    return obj


def sglang_summary_line(i: int) -> dict:
    """An sglang.bench_serving line as older versions write it without --output-details: no
    num_prompts (no per-request lists), no max_concurrency, no request_throughput, no
    total_throughput (the issue's 7 runs that ended at "concurrency 0")."""
    return {"backend": "sglang", "dataset_name": "sharegpt", "request_rate": 2.0 + i, "sharegpt_output_len": 256,
            "duration": 50.0, "completed": 100, "total_input_tokens": 20000, "total_output_tokens": 25600,
            "output_throughput": 512.0 + i, "mean_ttft_ms": 40.0, "median_ttft_ms": 38.0, "mean_tpot_ms": 9.0,
            "median_tpot_ms": 8.5, "mean_itl_ms": 9.1, "median_itl_ms": 8.0, "mean_e2e_latency_ms": 2400.0,
            "median_e2e_latency_ms": 2350.0}


def test_missing_workload_is_null_derived_where_derivable_and_not_drawn(client, tmp_path):
    path = write(tmp_path, "sg.jsonl", "\n".join(json.dumps(sglang_summary_line(i)) for i in range(7)) + "\n")
    run_cmd(path, "--method", "auto")
    runs = list(Run.objects.select_related("metrics").order_by("id"))
    assert len(runs) == 7
    for r in runs:
        assert (r.concurrency, r.num_prompts, r.input_len) == (None, None, None)  # not 0
        assert r.output_len == 256 and r.dataset == "sharegpt"
        m = r.metrics
        assert m.request_throughput_req_s == pytest.approx(100 / 50.0)  # completed / duration
        assert m.total_token_throughput_tok_s == pytest.approx((20000 + 25600) / 50.0)
        assert "request_throughput_req_s = completed / duration_s" in m.definitions["derived"]
        assert m.failed is None and m.error_rate is None  # SGLang without errors: unknown
    data = client.get(f"/sweeps/{runs[0].sweep_id}/data.json?points=1").json()
    concurrency = data["points"]["columns"].index("concurrency")
    assert len(data["points"]["rows"]) == 7 and {r[concurrency] for r in data["points"]["rows"]} == {None}
    # unknown concurrency: no throughput-latency curve, and never a point at "concurrency 0"
    assert "data" not in data["figures"]["tradeoff"]
    page = client.get(f"/runs/{runs[0].pk}/").content.decode()
    assert "concurrency not in the file" in re.sub(r"<[^>]+>", "", page) and "None" not in page.split("<h2>History")[0]
    assert "not in the file" in client.get(f"/sweeps/{runs[0].sweep_id}/").content.decode()


@pytest.mark.parametrize("tool", ["vllm", "sglang"])
def test_every_request_failed_is_a_failed_run_with_unknown_latencies(tmp_path, tool):
    zeros = {f"{s}_{m}_ms": 0.0 for s in ("mean", "median", "std", "p99") for m in ("ttft", "tpot", "itl")}
    if tool == "vllm":
        obj = {"model_id": "m", "num_prompts": 50, "completed": 0, "failed": 50, "duration": 3.0,
               "output_throughput": 0.0, "request_throughput": 0.0, "mean_e2el_ms": 0.0, **zeros}
    else:
        obj = {"backend": "sglang", "dataset_name": "random", "random_input_len": 32, "random_output_len": 24,
               "completed": 0, "duration": 3.0, "input_lens": [32] * 50, "output_lens": [0] * 50,
               "errors": ["Connection refused"] * 50, "mean_e2e_latency_ms": 0.0, **zeros}
    run_cmd(write(tmp_path, "failed.json", json.dumps(obj)), "--method", "auto")
    run = Run.objects.select_related("metrics").get()
    assert run.state == "failed" and run.failure_reason == "all_requests_failed"
    assert "0 of 50 requests completed" in run.failure_message
    m = run.metrics
    assert (m.completed, m.failed, m.error_rate) == (0, 50, 1.0)
    for f in METRIC_FIELDS:
        if f.group == "latency":
            assert getattr(m, f.name) is None, f.name  # placeholders, not measurements
    assert not Run.objects.counted().exists()


NON_FINITE = [
    ('"mean_ttft_ms": NaN', "mean_ttft_ms", "finite"),
    ('"mean_ttft_ms": Infinity', "mean_ttft_ms", "finite"),
    ('"request_rate": NaN', "request_rate", "finite"),
    ('"request_rate": -Infinity', "request_rate", "finite"),
    ('"request_rate": -2', "request_rate", "> 0"),
]


@pytest.mark.parametrize(("member", "field", "reason"), NON_FINITE)
def test_non_finite_and_negative_rates_are_refused_cleanly(tmp_path, member, field, reason):
    path = write(tmp_path, "x.json", '{"model_id": "m", "num_prompts": 1, "completed": 1, ' + member + "}")
    before = counts()
    with pytest.raises(CommandError, match=rf"x\.json:1: {field}: .*{reason}"):
        run_cmd(path, "--method", "auto", "--host", "fresh-host")
    assert counts() == before


@pytest.mark.parametrize(("obj", "field", "reason"), [
    ({"completed": 8, "output_throughput": -82.9, "median_ttft_ms": -55.7}, "output_throughput", ">= 0"),
    ({"completed": 8, "median_ttft_ms": -55.7}, "median_ttft_ms", ">= 0"),
    ({"completed": -1}, "completed", ">= 0"),
    ({"completed": 100000000000000000000}, "completed", f"<= {2**63 - 1}"),
    ({"completed": 1, "model_id": "m\ud800"}, "model_id", "lone surrogate"),
    ({"completed": 1, "model_id": "m\x00"}, "model_id", "NUL"),
    ({"completed": 1, "extra_key": ["a\x00b"]}, r"extra_key\[0\]", "NUL"),
    ({"completed": 1, "odd\ud800key": 1}, r"odd\\ud800key", "key contains a lone surrogate"),
    ({"completed": 1, "server_info": {"a\x00": 1}}, r"server_info\.a\\x00", "key contains a NUL"),
    ({"completed": 1, "model_id": "m" * 501}, "model_id", "longer than 500"),
    ({"completed": 1, "version": "0." * 51}, "version", "longer than 100"),
    ({"completed": 1, "spec_decode_acceptance_rate": 500}, "spec_decode_acceptance_rate", "<= 100"),
    ({"completed": 1, "spec_decode_acceptance_length": 0.5}, "spec_decode_acceptance_length", ">= 1"),
    ({"completed": 1, "spec_decode_per_position_acceptance_rates": [0.9, 1.5]},
     r"spec_decode_per_position_acceptance_rates\[1\]", "<= 1"),
    ({"completed": 1, "spec_decode_draft_tokens": 10, "spec_decode_accepted_tokens": 11},
     "spec_decode_accepted_tokens", "more than 10 drafted"),
    ({"completed": 1, "max_concurrency": 0}, "max_concurrency", ">= 1"),
    ({"completed": 1, "num_prompts": 2**31}, "num_prompts", "<="),
])
def test_impossible_values_are_refused_on_both_databases(tmp_path, obj, field, reason):
    """Each was stored (SQLite), a DataError (PostgreSQL), an IntegrityError or an OverflowError."""
    path = write(tmp_path, "x.json", json.dumps({"model_id": "m", **obj}))
    before = counts()
    with pytest.raises(CommandError, match=rf"x\.json:1: {field}: .*{reason}"):
        run_cmd(path, "--method", "draft_model", "--num-speculative-tokens", "4", "--format", "vllm",
                "--host", "fresh-host")
    assert counts() == before


def test_nesting_is_bounded(tmp_path):
    """100 000 nested brackets were a RecursionError."""
    deep = '{"model_id": "m", "completed": 1, "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    with pytest.raises(CommandError, match=r"deep\.json:1: nested deeper than 32 levels"):
        run_cmd(write(tmp_path, "deep.json", deep), "--method", "auto")
    pretty = "{\n" + '"completed": 1,\n"x":\n' + "[\n" * 40 + "]\n" * 40 + "}\n"
    with pytest.raises(CommandError, match=r"pretty\.json:3: x: nested deeper than 32"):
        run_cmd(write(tmp_path, "pretty.json", pretty), "--method", "auto")
    lines = SGLANG.read_text().splitlines()[0] + "\n" + deep + "\n"  # JSON lines: the deep one is line 2
    with pytest.raises(CommandError, match=r"deep\.jsonl:2: nested deeper than 32 levels"):
        run_cmd(write(tmp_path, "deep.jsonl", lines), "--method", "auto")
    assert Run.objects.count() == 0


@pytest.mark.parametrize(("text", "reason"), [
    ('{"model_id": "m", "completed": 1, "completed": 2}', "completed: duplicate key"),
    ('{"model_id": "m", "completed": 1, "x": ' + "9" * 5000 + "}", "a number too long"),
    ('{"model_id": "m", "completed": 1}\n{"model_id": "m", "comp', r"x.json:2: truncated \(ends inside a string\)"),
])
def test_other_json_hazards_are_clean_refusals(tmp_path, text, reason):
    with pytest.raises(ResultFileError, match=reason):
        load_result_file(write(tmp_path, "x.json", text), fmt="vllm")


def test_errors_name_the_line_in_a_pretty_printed_file(tmp_path):
    obj = vllm_obj(median_ttft_ms=-1.0)
    path = write(tmp_path, "pretty.json", json.dumps(obj, indent=2))
    with pytest.raises(ResultFileError) as exc:
        load_result_file(path)
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if '"median_ttft_ms"' in text)
    assert (exc.value.line, exc.value.field) == (line, "median_ttft_ms")
    assert str(exc.value) == f"{path}:{line}: median_ttft_ms: must be >= 0.0, got -1.0"


def test_unknown_keys_are_kept_and_shown_on_the_run_page(client, tmp_path):
    obj = vllm_obj(**{"request_goodput:": 1.5, "rtfx": math.inf})  # a stray colon, from an old vLLM release
    run_cmd(write(tmp_path, "x.json", json.dumps(obj)), "--method", "draft_model", "--num-speculative-tokens", "4")
    run = Run.objects.select_related("metrics").get()
    assert run.metrics.extra["request_goodput:"] == 1.5
    assert run.metrics.extra["rtfx"] == "Infinity"  # kept, as text (JSON has no Infinity)
    assert run.metrics.request_goodput_req_s is None  # the key without the colon was not in the file
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert "request_goodput:" in page and "1.5" in page and "Keys of the file without a column" in page


def test_refused_import_leaves_no_new_host(tmp_path):
    empty = write(tmp_path, "empty.json", "")
    with pytest.raises(CommandError, match="the file is empty"):
        run_cmd(empty, "--method", "auto", "--host", "new-host")
    assert not Host.objects.filter(name="new-host").exists()
    run_cmd(VLLM_FULL, "--method", "draft_model", "--host", "new-host")
    assert Run.objects.get().host.name == "new-host"  # created inside the import that stored runs


def test_same_file_twice_reports_the_existing_runs(tmp_path):
    first = run_cmd(SGLANG, "--method", "draft_model", "--num-speculative-tokens", "4")
    assert "imported 2 run(s)" in first and f"imported          {SGLANG} (sglang.bench_serving): 2 run(s)" in first
    before = counts()
    ids = list(Run.objects.order_by("id").values_list("id", flat=True))
    copy = write(tmp_path, "copy.jsonl", SGLANG.read_text())  # same bytes, other name
    again = run_cmd(copy, "--method", "draft_model", "--num-speculative-tokens", "4", "--sweep-name", "again")
    assert counts() == before
    assert f"already imported  {copy} (sglang.bench_serving): run(s) {ids[0]}, {ids[1]} in sweep" in again
    assert "nothing stored" in again
    report = import_result_file(SGLANG, method="ngram")
    assert report.sweep is None and [f.status for f in report.files] == ["existing"] and report.files[0].runs == ids


def test_result_file_content_is_unique_in_the_database():
    sweep = import_result_file(VLLM_FULL, method="draft_model").sweep
    record = ResultFile.objects.get()
    from django.db import IntegrityError, transaction
    with pytest.raises(IntegrityError), transaction.atomic():
        ResultFile.objects.create(sha256=record.sha256, name="other", size_bytes=1, source_tool="x", sweep=sweep)


def test_exported_sglang_run_comes_back_as_sglang(tmp_path):
    first = import_result_file(SGLANG, method="draft_model", num_speculative_tokens=4).sweep
    original = first.runs.select_related("metrics").order_by("id").first()
    assert (original.engine, original.input_len, original.output_len, original.dataset) == ("sglang", 32, 24, "random")
    path = write(tmp_path, "export.json", json.dumps(run_export(original), default=str))
    back = import_result_file(path, method="draft_model", num_speculative_tokens=4).sweep.runs.get()
    assert (back.engine, back.input_len, back.output_len, back.dataset) == ("sglang", 32, 24, "random")
    assert (back.concurrency, back.num_prompts, back.model) == (original.concurrency, original.num_prompts,
                                                                original.model)


def test_partial_file_of_an_aborted_run_is_refused(tmp_path):
    path = write(tmp_path, "aborted.json", json.dumps(vllm_obj(num_prompts=50)))  # 4 completed + 0 failed
    with pytest.raises(CommandError, match=r"aborted\.json:1: completed: partial result: 4 completed \+ 0 failed "
                                           r"of num_prompts 50"):
        run_cmd(path, "--method", "draft_model")
    assert Run.objects.count() == 0


def test_method_tokens_on_a_single_file():
    run_cmd(VLLM_FULL, "--method", "b15")
    run = Run.objects.get()
    assert (run.method, run.tree_budget, run.method_label) == ("ddtree", 15, "b15")


def test_configured_alias_and_tau_bound(tmp_path):
    run_cmd(SGLANG, "--method", "tree8", "--alias", "tree8=b8")
    assert Run.objects.filter(method="ddtree", tree_budget=8).count() == 2
    path = write(tmp_path, "k1.json", json.dumps(vllm_obj()))  # tau 4.0
    with pytest.raises(CommandError, match=r"spec_decode_acceptance_length: acceptance length 4.0 is more than "
                                           r"k \+ 1 = 2"):
        run_cmd(path, "--method", "draft_model", "--num-speculative-tokens", "1")


@pytest.mark.django_db(transaction=True)
def test_old_imported_placeholders_become_null_in_the_migration():
    """0006/0007 turn the 0 / "unknown" placeholders of runs imported before them into NULL / "";
    the reverse writes them back."""
    before, after = [("runs", "0004_drop_metric_json")], [("runs", "0007_import_placeholders")]
    try:
        apps = migrate(before)
        host = apps.get_model("runs", "Host").objects.create(name="h")
        sweep = apps.get_model("runs", "Sweep").objects.create(name="s", host=host)
        old = dict(sweep=sweep, host=host, spec={}, engine="vllm", model="m", method="auto", concurrency=0,
                   input_len=0, output_len=0, num_prompts=0, dataset="unknown", state="succeeded")
        apps.get_model("runs", "Run").objects.create(point_key="import-0", **old)
        apps.get_model("runs", "Run").objects.create(point_key="measured", **{**old, "dataset": "random"})
        Run_ = migrate(after).get_model("runs", "Run")
        imported, measured = Run_.objects.order_by("id")
        assert (imported.concurrency, imported.input_len, imported.output_len, imported.num_prompts,
                imported.dataset) == (None, None, None, None, "")
        assert (measured.concurrency, measured.dataset) == (0, "random")  # not an import: left alone
        row = migrate(before).get_model("runs", "Run").objects.get(point_key="import-0")
        assert (row.concurrency, row.num_prompts, row.dataset) == (0, 0, "unknown")
    finally:
        migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())


def test_refusals_are_printable(tmp_path, capsys):
    """A key holding a lone surrogate or a NUL is named with escapes: the message prints anywhere."""
    path = write(tmp_path, "x.json", json.dumps({"model_id": "m", "completed": 1, "k\ud800\x00": 1}))
    with pytest.raises(CommandError) as exc:
        run_cmd(path, "--method", "auto")
    assert str(exc.value).endswith(r"x.json:1: k\ud800\x00: key contains a NUL character (\u0000), which a "
                                   "database cannot store")
    str(exc.value).encode("ascii")


def test_exports_say_what_the_file_did_not(client):
    """SGLang's two lines: one with max_concurrency 2, an older one without it."""
    sweep = import_result_file(SGLANG, method="draft_model", num_speculative_tokens=4).sweep
    csv = client.get(f"/sweeps/{sweep.pk}/export.csv").content.decode().splitlines()
    header = csv[0].split(",")
    col = header.index("concurrency")
    assert sorted(line.split(",")[col] for line in csv[1:]) == ["", "2"]  # not "2.0", not "0"
    tex = client.get(f"/sweeps/{sweep.pk}/export.tex").content.decode()
    assert "not in the file" in tex
    exported = client.get(f"/sweeps/{sweep.pk}/export.json").json()["runs"]
    assert sorted(r["max_concurrency"] or 0 for r in exported) == [0, 2]
    assert {r["draftboard"]["run"]["concurrency"] for r in exported} == {None, 2}


def test_admin_lists_imported_files_read_only(admin_client):
    import_result_file(SGLANG, method="draft_model", num_speculative_tokens=4)
    record = ResultFile.objects.get()
    page = admin_client.get("/admin/runs/resultfile/").content.decode()
    assert record.name in page
    assert admin_client.get(f"/admin/runs/resultfile/{record.pk}/delete/").status_code == 403


def test_run_page_shows_source_keys_of_runs_imported_before_0010(client):
    """Those have no ResultFile row; their kept keys are shown all the same."""
    run = import_result_file(SGLANG, method="draft_model", num_speculative_tokens=4).sweep.runs.order_by("id")[0]
    Run.objects.filter(pk=run.pk).update(result_file=None)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert f"<code>{SGLANG}:1</code>" in page and "<code>concurrency</code>" in page  # SGLang's observed mean
