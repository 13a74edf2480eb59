"""Stored per-sweep point summaries (issue 22, runs.services.summaries): the points read from a
sweep's summary equal the points read from its runs, after every write that changes them (a run
stored, invalidated, recomputed, its lossless verdict), and reading them costs the same queries
whatever the sweep's size."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from benchkit.measure.metrics import METRICS
from benchkit.point import RECORD_FIELDS
from runs import selectors
from runs.models import Run, RunMetrics, SweepSummary, SweepSummaryColumn
from runs.services import lossless, summaries
from runs.services.invalidation import invalidate_runs
from runs.services.recompute import recompute_runs
from tests.factories import make_run, make_sweep
from tests.nightly import build_nightly_series
from tests.test_lossless_storage import finished, outputs_of
from tests.usersgrid import make_users_grid

pytestmark = pytest.mark.django_db

ALL = tuple(METRICS)


def dump(points) -> list[tuple]:
    """Every field and figure of each point, in order (Point equality covers the configuration only)."""
    return [(tuple(getattr(p, f) for f in RECORD_FIELDS), p.label, p.figures()) for p in points]


def live_figure_points(sweep_id: int, figures=ALL, prices=None, **selection):
    """figure_points read from the runs (the stored summaries not read for the call)."""
    real = selectors._summaries
    selectors._summaries = lambda *args, **kwargs: {}
    try:
        return selectors.figure_points(sweep_id, figures, prices, **selection)
    finally:
        selectors._summaries = real


def assert_summary_is_live(sweep_id: int) -> None:
    assert SweepSummary.objects.filter(sweep_id=sweep_id).exists(), "no summary stored"
    prices = selectors.gpu_prices()
    for figures, kw in ((ALL, {}), (("output_throughput_tok_s", "duration_s", "total_output_tokens"),
                                    {"prices": prices})):
        got = selectors.figure_points(sweep_id, figures, **kw)
        assert dump(got) == dump(live_figure_points(sweep_id, figures, **kw))


@pytest.fixture
def grid():
    """auto (two repeats, and at concurrency 4), ngram (lossy) and draft_model (lossless), each
    stored by store_outcome with its outputs; the lossless verdicts computed; summary built."""
    sw = make_sweep(name="summary grid")
    runs = {
        "auto": finished(make_run(sw, "auto"), outputs_of()),
        "auto-r1": finished(make_run(sw, "auto", repeat=1), outputs_of()),
        "auto-c4": finished(make_run(sw, "auto", concurrency=4), outputs_of()),
        "ngram": finished(make_run(sw, "ngram", k=4), outputs_of({0: 3, 2: 9})),
        "draft": finished(make_run(sw, "draft_model", k=2), outputs_of()),
    }
    lossless.check_sweep(sw.pk)
    summaries.build(sw.pk)
    return sw, runs


def test_summary_points_equal_the_runs_points_with_every_figure_and_selection(grid):
    sw, runs = grid
    assert_summary_is_live(sw.pk)
    points = selectors.figure_points(sw.pk, ALL)
    assert len(points) == 5 and {p.lossless_verdict for p in points} > {""}  # verdicts are in the summary
    for sel in ({"tp": [1], "concurrency": [4]}, {"methods": ["ngram"]}, {"configs": [("draft_model", 2, None)]},
                {"methods": ["auto"], "configs": [("ngram", 4, None)], "concurrency": [1]},
                {"host": [sw.host.name]}, {"host": ["nowhere"]}, {"output_len": [64, 128]}):
        got = selectors.figure_points(sw.pk, ALL, **sel)
        assert dump(got) == dump(live_figure_points(sw.pk, ALL, **sel)), sel
        assert got or sel == {"host": ["nowhere"]}


def test_a_stored_run_replaces_the_summary_after_commit(grid, django_capture_on_commit_callbacks):
    sw, _ = grid
    with django_capture_on_commit_callbacks(execute=True):
        run = finished(make_run(sw, "draft_model", k=2, repeat=1), outputs_of())
        assert not SweepSummary.objects.filter(sweep=sw).exists()  # stale in the writer's transaction
    assert SweepSummary.objects.get(sweep=sw).n_points == 6
    assert run.pk in {p.run_id for p in selectors.figure_points(sw.pk, ALL)}
    assert_summary_is_live(sw.pk)


def test_invalidation_and_lossless_verdicts_keep_the_summary_current(grid, django_capture_on_commit_callbacks):
    sw, runs = grid
    with django_capture_on_commit_callbacks(execute=True):
        invalidate_runs([runs["auto"], runs["ngram"]], "bad node")
    assert SweepSummary.objects.get(sweep=sw).n_points == 3
    assert_summary_is_live(sw.pk)
    with django_capture_on_commit_callbacks(execute=True):
        lossless.check_sweep(sw.pk)  # the verdicts change: auto-r1 is the only baseline at concurrency 1
    assert_summary_is_live(sw.pk)


def test_recompute_replaces_the_summarised_figures(grid, django_capture_on_commit_callbacks):
    sw, runs = grid
    before = dump(selectors.figure_points(sw.pk, ALL))
    # figures spoilt behind the writers' back (a queryset update): the summary still says the old ones
    RunMetrics.objects.filter(run__sweep=sw).update(output_throughput_tok_s=0.0)
    assert dump(selectors.figure_points(sw.pk, ALL)) == before
    with django_capture_on_commit_callbacks(execute=True):
        assert recompute_runs([r.pk for r in runs.values()]) == 5
    assert dump(selectors.figure_points(sw.pk, ALL)) == before  # recomputed from the logs, summary rebuilt
    assert_summary_is_live(sw.pk)


def test_a_run_saved_through_the_orm_marks_its_sweep(grid):
    sw, runs = grid
    run = runs["draft"]
    run.engine_version = "9.9"
    run.save()
    assert not SweepSummary.objects.filter(sweep=sw).exists()
    assert {p.engine_version for p in selectors.figure_points(sw.pk, ALL) if p.run_id == run.pk} == {"9.9"}
    summaries.build(sw.pk)
    Run.objects.filter(pk=run.pk).update(progress_done=3)  # no point reads it: nothing marked either way
    run.progress_done = 4
    run.save(update_fields=["progress_done"])
    assert SweepSummary.objects.filter(sweep=sw).exists()


def test_another_format_or_a_missing_column_is_read_from_the_runs(grid, django_assert_num_queries):
    sw, _ = grid
    with django_assert_num_queries(1):  # the summary's columns only
        from_summary = selectors.figure_points(sw.pk, ALL)
    SweepSummary.objects.filter(sweep=sw).update(format=selectors.SUMMARY_FORMAT + 1)
    with django_assert_num_queries(2):  # the summary (unusable), then the runs
        assert dump(selectors.figure_points(sw.pk, ALL)) == dump(from_summary)
    SweepSummary.objects.filter(sweep=sw).update(format=selectors.SUMMARY_FORMAT)
    # as if built before a figure was added to the schema
    SweepSummaryColumn.objects.filter(summary_id=sw.pk, name="median_tpot_ms").delete()
    with django_assert_num_queries(2):
        assert dump(selectors.figure_points(sw.pk, ALL)) == dump(from_summary)
    with django_assert_num_queries(1):  # a figure it has
        selectors.figure_points(sw.pk, ("output_throughput_tok_s",))


def test_history_points_from_summaries_equal_the_runs_points(django_assert_num_queries):
    s = build_nightly_series(nights=6, detect=False)
    ids = [sw.pk for sw in s.sweeps]
    snaps = selectors.snapshot_history([s.host.pk])
    speed = ("output_throughput_tok_s",)
    cases = [(speed, None, snaps, True), (ALL, {"tp": [4, 8], "concurrency": [1]}, None, False),
             (speed, {"method": ["ddtree", "auto"]}, {}, True)]
    live = [selectors.history_points(ids, f, flt, sn, gpus=g) for f, flt, sn, g in cases]
    assert all(live) and len({p.hardware_fingerprint for p in live[0]} - {""}) == 2  # two drivers, dated per run
    summaries.rebuild(ids[::2])  # half of them: the other half still read from the runs
    for (f, flt, sn, g), want in zip(cases, live, strict=True):
        assert dump(selectors.history_points(ids, f, flt, sn, gpus=g)) == dump(want)
    summaries.rebuild()
    for (f, flt, sn, g), want in zip(cases, live, strict=True):
        assert dump(selectors.history_points(ids, f, flt, sn, gpus=g)) == dump(want)
    with django_assert_num_queries(1):  # every sweep's summary in one query
        selectors.history_points(ids, ("output_throughput_tok_s",), snapshots={})
    with pytest.raises(ValueError, match="unknown history filter"):
        selectors.history_points(ids, ALL, {"engine": ["x"]})


def test_page_queries_and_sizes_do_not_depend_on_the_runs_with_summaries(client, django_assert_num_queries):
    small, big = make_users_grid("ws-small"), make_users_grid("ws-big", repeats=3)
    call_command("rebuild_summaries", stdout=io.StringIO())
    counts = {}
    for sweep in (small, big):
        urls = [reverse("analysis:sweep_detail", args=[sweep.pk]), reverse("analysis:sweep_data", args=[sweep.pk]),
                reverse("analysis:sweep_data", args=[sweep.pk]) + "?tp=4&method=b15",
                reverse("analysis:compare") + f"?old={sweep.pk}&new={sweep.pk}", reverse("analysis:home")]
        for i, url in enumerate(urls):
            with CaptureQueriesContext(connection) as ctx:
                assert client.get(url).status_code == 200, url
            assert not any('"runs_runmetrics"' in q["sql"] for q in ctx.captured_queries), url  # no run's figures
            counts.setdefault(i, []).append(len(ctx.captured_queries))
    assert all(small_n == big_n for small_n, big_n in counts.values()), counts


def test_the_rebuild_command(grid):
    sw, _ = grid
    SweepSummary.objects.all().delete()
    out = io.StringIO()
    call_command("rebuild_summaries", "--sweep", str(sw.pk), stdout=out)
    assert "rebuilt 1 sweep summary" in out.getvalue()
    assert_summary_is_live(sw.pk)
    with pytest.raises(Exception, match="no sweep 999999"):
        call_command("rebuild_summaries", "--sweep", "999999", stdout=io.StringIO())


def test_a_failed_rebuild_never_fails_the_writer(grid, monkeypatch, caplog, django_capture_on_commit_callbacks):
    sw, _ = grid

    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(summaries, "rebuild", broken)
    with django_capture_on_commit_callbacks(execute=True):
        run = finished(make_run(sw, "draft_model", k=2, repeat=1), outputs_of())
    assert run.state == "succeeded" and not SweepSummary.objects.filter(sweep=sw).exists()
    assert "rebuild_summaries" in caplog.text
    assert run.pk in {p.run_id for p in selectors.figure_points(sw.pk, ALL)}  # read from the runs meanwhile
