"""The admin at a million rows (issue 22): blob pages read no blob bytes, a sweep page does not
inline its runs and saves at any size, the big lists never count the whole table and read only
their columns, and every run-list filter walks an index led by its column."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from benchkit.measure.logs import encode_logs
from runs import admin as run_admin
from runs.admin_scale import CappedCountPaginator
from runs.models import GpuTelemetryBlob, RequestLogBlob, Run, RunMetrics, RunOutputsBlob, Sweep
from tests.factories import finish_run, make_logs, make_run, make_sweep

pytestmark = pytest.mark.django_db


def _bulk_runs(sweep: Sweep, n: int) -> None:
    Run.objects.bulk_create([Run(sweep=sweep, host=sweep.host, point_key=f"p{i}", spec={}, engine="vllm", model="m",
                                 method="auto", concurrency=1 + i % 8, tp=1) for i in range(n)], batch_size=1000)


def _selects_column(queries, table: str, column: str) -> bool:
    return any(f'"{table}"."{column}"' in q["sql"] for q in queries if q["sql"].lstrip().upper().startswith("SELECT"))


@pytest.mark.parametrize("model, table", [(RequestLogBlob, "runs_requestlogblob"),
                                          (GpuTelemetryBlob, "runs_gputelemetryblob"),
                                          (RunOutputsBlob, "runs_runoutputsblob")])
def test_blob_admin_pages_read_no_blob_bytes(admin_client, model, table):
    run = finish_run(make_run(make_sweep()))
    if model is GpuTelemetryBlob:
        GpuTelemetryBlob.objects.create(run=run, data=b"x" * 1000, hz=10.0, n_ticks=1, n_gpus=1)
    elif model is RunOutputsBlob:
        RunOutputsBlob.objects.create(run=run, data=b"x" * 1000, n_requests=1, n_full=0, kind="ids")
    row = model.objects.get(run=run)
    name = model._meta.model_name
    for url in (reverse(f"admin:runs_{name}_changelist"), reverse(f"admin:runs_{name}_change", args=[row.pk])):
        with CaptureQueriesContext(connection) as ctx:
            resp = admin_client.get(url)
        assert resp.status_code == 200
        assert any(table in q["sql"] for q in ctx.captured_queries)  # the page did read the table...
        assert not _selects_column(ctx.captured_queries, table, "data"), url  # ...but not the bytes


def test_a_3240_run_sweep_page_links_its_runs_and_saves(admin_client):
    small, big = make_sweep(name="small"), make_sweep(name="big")
    _bulk_runs(small, 3)
    _bulk_runs(big, 3240)
    counts, fields = {}, {}
    admin_client.get(reverse("admin:runs_sweep_change", args=[small.pk]))  # the session's first reads
    for sweep in (small, big):
        with CaptureQueriesContext(connection) as ctx:
            page = admin_client.get(reverse("admin:runs_sweep_change", args=[sweep.pk])).content.decode()
        counts[sweep.name] = len(ctx.captured_queries)
        fields[sweep.name] = page.count(' name="')  # form fields: a run inline added two per run
        assert f'{reverse("admin:runs_run_changelist")}?sweep={sweep.pk}' in page
        assert f">{sweep.runs.count()} runs<" in page
        assert not re.search(r"/admin/runs/run/\d+/change/", page)  # no run listed inline
    assert counts["big"] == counts["small"] and fields["big"] == fields["small"]
    resp = admin_client.post(reverse("admin:runs_sweep_change", args=[big.pk]),
                             {"name": "big, renamed", "description": "3 240 runs", "_save": "Save"})
    assert resp.status_code == 302, resp.content[:2000]
    big.refresh_from_db()
    assert (big.name, big.description, big.runs.count()) == ("big, renamed", "3 240 runs", 3240)


def _counts(queries) -> list[str]:
    return [q["sql"] for q in queries if "COUNT(" in q["sql"].upper()]


def test_run_list_never_counts_the_whole_table(admin_client, monkeypatch):
    monkeypatch.setattr(CappedCountPaginator, "LOOKAHEAD_PAGES", 1)
    monkeypatch.setattr(run_admin.RunAdmin, "list_per_page", 5)
    sweep = make_sweep()
    _bulk_runs(sweep, 40)
    url = reverse("admin:runs_run_changelist")
    with CaptureQueriesContext(connection) as ctx:
        page = admin_client.get(url).content.decode()
    assert "more than 10 runs" in page and "Select all matching runs" in page
    counts = _counts(ctx.captured_queries)
    assert counts and all("LIMIT" in sql.upper() for sql in counts), counts
    # a later page counts further, still bounded; the last page is reachable page by page
    page = admin_client.get(url + "?p=6").content.decode()
    assert "more than 35 runs" in page
    page = admin_client.get(url + "?p=8").content.decode()
    assert "40 runs" in page and "more than" not in page
    # a filter with fewer rows than the limit counts exactly
    page = admin_client.get(url + "?concurrency=3").content.decode()
    assert "5 runs" in page and "more than" not in page


def test_metrics_list_reads_its_columns_in_one_query_whatever_the_rows(admin_client):
    sweep = make_sweep()
    url = reverse("admin:runs_runmetrics_changelist")
    n_queries = []
    for n in (1, 6):
        while RunMetrics.objects.count() < n:
            finish_run(make_run(sweep, repeat=RunMetrics.objects.count()))
        with CaptureQueriesContext(connection) as ctx:
            resp = admin_client.get(url)
        assert resp.status_code == 200 and resp.content.decode().count("/admin/runs/runmetrics/") > n
        n_queries.append(len(ctx.captured_queries))
        assert not _selects_column(ctx.captured_queries, "runs_runmetrics", "distributions")
        assert not _selects_column(ctx.captured_queries, "runs_run", "spec")
        assert all("LIMIT" in sql.upper() for sql in _counts(ctx.captured_queries))
    assert n_queries[0] == n_queries[1]
    assert admin_client.get(url + "?source_tool=draftboard").status_code == 200


def test_every_run_list_filter_walks_an_index_led_by_its_column():
    ma = run_admin.RunAdmin
    leading = {idx.fields[0].lstrip("-") for idx in Run._meta.indexes}
    partial = {str(idx.condition) for idx in Run._meta.indexes if idx.condition is not None}
    for f in ma.list_filter:
        name = f if isinstance(f, str) else f.parameter_name
        field = Run._meta.get_field(name)
        if field.get_internal_type() == "BooleanField":
            assert any(f"('{name}', True)" in c for c in partial), name
        elif name != "sweep":  # a sweep's runs: the foreign key's own index, a few thousand rows at most
            assert name in leading, name


def test_storing_path_writes_the_compact_blob():
    run = finish_run(make_run(make_sweep()))
    blob = RequestLogBlob.objects.get(run=run)
    logs, _, _ = make_logs(4, 1, 10.0, n_tokens=64)
    assert bytes(blob.data) == encode_logs(logs)


def test_run_search_uses_trigram_indexes_on_postgresql():
    """RunAdmin's search fields each have a pg_trgm GIN index over the expression Django's
    lookup writes (migration 0018), so PostgreSQL plans a bitmap scan, not a full read; without
    GIN's pending list (migration 0019)."""
    if connection.vendor != "postgresql":
        pytest.skip("trigram indexes are PostgreSQL-only (SQLite scans its small table)")
    fields = [f.lstrip("^") for f in run_admin.RunAdmin.search_fields]
    with connection.cursor() as cur:
        cur.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'runs_run'")
        defs = dict(cur.fetchall())
        for f in fields:
            assert "gin_trgm_ops" in defs.get(f"run_admin_search_{f}", ""), f
        # no pending list for searches to read whole (migration 0019)
        cur.execute("SELECT relname, reloptions FROM pg_class WHERE relname LIKE 'run_admin_search_%%'")
        options = dict(cur.fetchall())
        assert {f"run_admin_search_{f}" for f in fields} <= options.keys()
        assert all("fastupdate=off" in (opts or []) for opts in options.values()), options
        # the planner picks the index once a full read is dearer than the bitmap scan; plain index
        # scans off too (on a near-empty table it filtered a B-tree scan instead: order-dependent)
        cur.execute("SET LOCAL enable_seqscan = off")
        cur.execute("SET LOCAL enable_indexscan = off")
        sql, params = Run.objects.filter(failure_message__icontains="out of memory").query.sql_with_params()
        cur.execute("EXPLAIN " + sql, params)
        plan = "\n".join(r[0] for r in cur.fetchall())
    assert "run_admin_search_failure_message" in plan, plan


def test_run_list_search_and_filters_refuse_odd_numbers_without_an_error(admin_client):
    """Found by a new user's trial (each was an HTTP 500): a search of '²' (str.isdigit() passes
    it, int() refuses it) searches text; a sweep id beyond the column's range matches nothing."""
    run = make_run(make_sweep())
    url = reverse("admin:runs_run_changelist")
    for query in ({"q": "\u00b2"}, {"q": " \u00b2 "}, {"sweep": "99999999999999999999"}, {"sweep": str(-2**70)},
                  {"tp": "99999999999999999999"}):
        resp = admin_client.get(url, query)
        assert resp.status_code == 200, (query, resp.status_code)
        assert f'href="/admin/runs/run/{run.pk}/change/' not in resp.content.decode(), query
    assert f'/admin/runs/run/{run.pk}/change/' in admin_client.get(url, {"q": str(run.pk)}).content.decode()
