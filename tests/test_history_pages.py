"""Compare, trend and home pages, regression flags (service, admin, command) on a nightly series
of the users' grid built through the real services (tests/nightly.py), against the real database."""

from __future__ import annotations

import logging

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.urls import reverse

from runs.models import RegressionFlag, Run, RunState
from runs.services import regressions
from runs.services.invalidation import invalidate_runs
from tests.factories import finish_run, make_run, make_sweep
from tests.nightly import build_nightly_series

pytestmark = pytest.mark.django_db

NIGHTS = 6


@pytest.fixture
def series():
    return build_nightly_series(nights=NIGHTS)


def _flags():
    return list(RegressionFlag.objects.order_by("pk").values_list("sweep_id", "label", "tp", "concurrency", "rule"))


def test_only_the_planted_regression_is_flagged_once(series):
    last = series.sweeps[-1]
    assert _flags() == [(last.pk, "linear", 8, 1, "hud")]
    flag = RegressionFlag.objects.get()
    assert flag.change_pct == pytest.approx(-25, abs=4) and flag.previous_change_pct == pytest.approx(-25, abs=4)
    assert flag.series == "users-grid-sglang" and flag.host == series.host and flag.is_open
    assert flag.baseline_sweep_ids == [s.pk for s in series.sweeps[:5]]  # the 5 nights before (window 5)
    assert sorted(flag.run_ids) == list(Run.objects.filter(sweep=last, method="linear", tp=8, concurrency=1)
                                        .values_list("pk", flat=True))
    assert "engine version 0.5.2 -> 0.5.3" in flag.note
    # a back-fill re-judges every night: still one flag, same row
    call_command("detect_regressions")
    assert _flags() == [(last.pk, "linear", 8, 1, "hud")] and RegressionFlag.objects.get().pk == flag.pk


def test_acknowledged_flag_survives_re_detection_and_invalidation(series):
    flag = RegressionFlag.objects.get()
    with pytest.raises(ValueError, match="reason"):
        regressions.acknowledge([flag.pk], "alice", "  ")
    assert regressions.acknowledge([flag.pk], "alice", "TP8 linear slowed by the new all-reduce; filed") == 1
    assert regressions.acknowledge([flag.pk], "bob", "again") == 0  # the first acknowledgement stays
    # the slow runs are invalidated: the rule no longer holds, but the acknowledged flag is audit
    last = series.sweeps[-1]
    invalidate_runs(list(Run.objects.filter(sweep=last, method="linear", tp=8, concurrency=1)), "bad node")
    regressions.detect_for_sweep(last.pk)
    flag.refresh_from_db()
    assert flag.acknowledged_by == "alice" and flag.ack_reason.startswith("TP8 linear") and not flag.is_open


def test_unacknowledged_flag_that_no_longer_holds_is_removed(series):
    last = series.sweeps[-1]
    invalidate_runs(list(Run.objects.filter(sweep=last, method="linear", tp=8, concurrency=1)), "bad node")
    result = regressions.detect_for_sweep(last.pk)
    assert result.flagged == [] and result.removed == 1 and not RegressionFlag.objects.exists()


def test_demo_and_first_nights_are_not_judged():
    demo = make_sweep(name="demo", is_demo=True)
    finish_run(make_run(demo))
    assert regressions.detect_for_sweep(demo.pk).skipped.startswith("demo sweep")
    first = make_sweep(name="alone")
    assert regressions.detect_for_sweep(first.pk).skipped == "first night of its series"


def test_last_run_of_a_sweep_queues_detection_and_the_lossless_check(django_capture_on_commit_callbacks,
                                                                      monkeypatch):
    sent = []
    monkeypatch.setattr(regressions.dispatch, "enqueue_detection", lambda sid, q: sent.append(("detect", sid, q)))
    monkeypatch.setattr(regressions.dispatch, "enqueue_lossless", lambda sid, q: sent.append(("lossless", sid, q)))
    sw = make_sweep(name="nightly")
    a, b = make_run(sw, "auto"), make_run(sw, "draft_model", 4)
    finish_run(a)
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        assert regressions.runs_finished([a.pk]) == []  # b is still queued
    assert callbacks == [] and sent == []
    finish_run(b)
    with django_capture_on_commit_callbacks(execute=True):
        assert regressions.runs_finished([b.pk]) == [sw.pk]
    queue = sw.host.queue
    assert sorted(sent) == [("detect", sw.pk, queue), ("lossless", sw.pk, queue)]
    sent.clear()
    demo = make_sweep(name="demo", is_demo=True)  # a demo sweep is checked for losslessness, never for regressions
    run = finish_run(make_run(demo))
    with django_capture_on_commit_callbacks(execute=True):
        assert regressions.runs_finished([run.pk]) == []
    assert sent == [("lossless", demo.pk, demo.host.queue)]


def test_detection_not_queued_when_the_broker_is_down(monkeypatch, caplog):
    def down(sweep_id, queue):
        raise OSError("connection refused")

    monkeypatch.setattr(regressions.dispatch, "enqueue_detection", down)
    with caplog.at_level(logging.WARNING, logger="runs.services.regressions"):
        regressions._send(7, "host.x")  # the hook's on-commit callback: logs, never raises
    assert "detect_regressions --sweep 7" in caplog.text


# --- pages -----------------------------------------------------------------------------------------


def test_home_shows_latest_sweep_headline_and_the_flag(client, series):
    html = client.get(reverse("analysis:home")).content.decode()
    last = series.sweeps[-1]
    assert f"users-grid-sglang #{last.pk}" in html and 'id="fig-flags"' in html
    data = client.get(reverse("analysis:home_data")).json()
    (s,) = data["series"]
    assert s["sweep"]["id"] == last.pk and s["counts"]["succeeded"] == 36 and s["open_flags"] == 1
    tp1 = next(h for h in s["headline"] if h["tp"] == 1)
    # concurrency 1: decode speedup (TTFT left out, so above the 6.5x end-to-end), single runs: no verdict
    assert (tp1["label"], tp1["concurrency"], tp1["figure"], tp1["kind"]) == ("b15", 1, "decode speedup", "single")
    assert tp1["speedup"] > 6.5 * 1.1 and tp1["sentence"] == "single runs: no verdict"
    assert [(f["label"], f["tp"], f["concurrency"]) for f in data["open_flags"]] == [("linear", 8, 1)]
    (bar,) = data["figure"]["data"]
    assert bar["y"] == ["users-grid-sglang · linear · TP8 · c1"] and bar["x"][0] < -15


def test_compare_default_is_the_last_two_nights(client, series):
    data = client.get(reverse("analysis:compare_data")).json()
    old, new = series.sweeps[-2], series.sweeps[-1]
    assert (data["old"]["id"], data["new"]["id"]) == (old.pk, new.pk)
    assert data["counts"]["matched"] == 36 and data["counts"]["apart"] == 0
    worse = [(p["label"], p["tp"], p["concurrency"]) for p in data["points"] if p["verdict"] == "worse"]
    # the planted point fell 25 % on the last two nights: night -1 vs -2 is level; noise is within 5 %
    assert worse == [] and data["counts"]["same"] == 36
    data = client.get(reverse("analysis:compare_data"), {"old": series.sweeps[-3].pk, "new": new.pk}).json()
    worse = [(p["label"], p["tp"], p["concurrency"]) for p in data["points"] if p["verdict"] == "worse"]
    assert worse == [("linear", 8, 1)] and data["counts"]["worse"] == 1
    tok = data["points"][0]["metrics"][0]
    assert tok["name"] == "output_throughput_tok_s" and tok["change_pct"] == pytest.approx(-25, abs=4)
    assert data["points"][0]["single_run"] is True
    html = client.get(reverse("analysis:compare"), {"old": series.sweeps[-3].pk, "new": new.pk}).content.decode()
    assert "1 worse" in html and 'id="fig-compare"' in html


def test_compare_across_engine_upgrade_puts_points_apart(client, series):
    before = series.sweeps[series.engine_upgrade_night - 2]
    after = series.sweeps[series.engine_upgrade_night - 1]
    data = client.get(reverse("analysis:compare_data"), {"old": before.pk, "new": after.pk}).json()
    assert data["counts"]["matched"] == 0 and data["counts"]["apart"] == 36
    assert data["apart_reasons"] == ["engine version 0.5.2 -> 0.5.3"]
    html = client.get(reverse("analysis:compare"), {"old": before.pk, "new": after.pk}).content.decode()
    assert "not compared" in html


def test_compare_filters_and_bad_queries(client, series):
    new = series.sweeps[-1]
    data = client.get(reverse("analysis:compare_data"), {"new": new.pk, "tp": "8", "concurrency": "1"}).json()
    assert {(p["tp"], p["concurrency"]) for p in data["points"]} == {(8, 1)} and data["counts"]["matched"] == 6
    assert client.get(reverse("analysis:compare_data"), {"tp": "x"}).status_code == 400
    assert client.get(reverse("analysis:compare"), {"new": "abc"}).status_code == 400
    assert client.get(reverse("analysis:compare_data"), {"new": 999999}).status_code == 404


def test_trend_draws_flag_and_environment_changes(client, series):
    q = {"host": series.host.name, "series": "users-grid-sglang"}
    data = client.get(reverse("analysis:trend_data"), q).json()
    assert len(data["nights"]) == NIGHTS and data["n_points"] == 36 * NIGHTS
    texts = [c["text"] for c in data["changes"]]
    assert texts == ["driver 575.57.08 → 580.65.06, CUDA 12.9 → 13.0", "engine version 0.5.2 → 0.5.3"]
    fig = data["figures"]["tok_s"]
    flags = [t for t in fig["data"] if t["name"] == "regression flag"]
    assert len(flags) == 1 and len(flags[0]["x"]) == 1 and "linear" in flags[0]["text"][0]
    assert {a["text"] for a in fig["layout"]["annotations"]} >= set(texts)
    lines = {t["name"] for t in fig["data"] if t.get("mode") == "lines+markers"}
    assert lines == {"auto", "linear", "b15", "b16", "b32", "b64"}
    speed = data["figures"]["speedup"]
    tp1_b15 = [t for t in speed["data"] if t["name"] == "b15" and t["xaxis"] == "x"]
    assert tp1_b15 and all(y == pytest.approx(6.5, rel=0.06) for y in tp1_b15[0]["y"])
    html = client.get(reverse("analysis:trend"), q).content.decode()
    assert 'id="fig-trend-tok-s"' in html and "linear" in html and "acknowledge" in html
    assert client.get(reverse("analysis:trend"), {**q, "nights": "0"}).status_code == 400
    assert client.get(reverse("analysis:trend"), {"host": series.host.name, "series": "nope"}).status_code == 404


def test_admin_acknowledge_needs_the_permission(client, series):
    flag = RegressionFlag.objects.get()
    url = reverse("admin:runs_regressionflag_changelist")
    staff = User.objects.create_user("viewer", password="pw", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_regressionflag"))
    client.force_login(staff)
    assert client.get(url).status_code == 200
    client.post(url, {"action": "acknowledge", "_selected_action": [flag.pk], "apply": "1", "reason": "known"})
    flag.refresh_from_db()
    assert flag.is_open  # no acknowledge permission: the action is not offered
    staff.user_permissions.add(Permission.objects.get(codename="acknowledge_regressionflag"))
    staff = User.objects.get(pk=staff.pk)
    client.force_login(staff)
    first = client.post(url, {"action": "acknowledge", "_selected_action": [flag.pk]})
    assert first.status_code == 200 and b"reason" in first.content and RegressionFlag.objects.get().is_open
    client.post(url, {"action": "acknowledge", "_selected_action": [flag.pk], "apply": "1",
                      "reason": "expected: new all-reduce"})
    flag.refresh_from_db()
    assert not flag.is_open and flag.acknowledged_by == "viewer" and flag.ack_reason == "expected: new all-reduce"
    assert client.get(reverse("analysis:home_data")).json()["open_flags"] == []
    trend = client.get(reverse("analysis:trend_data"), {"host": series.host.name, "series": flag.series}).json()
    assert [f["open"] for f in trend["flags"]] == [False]


# --- query counts do not grow with runs -------------------------------------------------------------

PAGES = [("analysis:home", {}), ("analysis:home_data", {}), ("analysis:compare", {}),
         ("analysis:compare_data", {}), ("analysis:trend", None), ("analysis:trend_data", None)]
#: home: latest ids, latest sweeps, runs' points, state counts, open flags (+ hosts for the HTML);
#: compare: latest ids, latest sweep, previous, old sweep's host, snapshots, points;
#: trend: host, nights, facets, snapshots, points, flags. Home and compare points, trend facets:
#: the sweeps' stored summaries first (runs.models.SweepSummary; none here: the services rebuild
#: them on commit, and a test's transaction never commits), then the runs: one query more each
#: (trend points too: this grid needs no default filter, runs.selectors.SUMMARY_FILTERED_MAX_SWEEPS).
# home and trend: one more each for the change points (issue 21; open ones, the series' ones)
# compare: + 3 for the ceilings (GPU specs, model configs, hosts' GPU models; issue 20)
# home: + 1 for the scheduler's heartbeat (issue 35; runs.selectors.scheduler_status)
EXPECTED = {"analysis:home": 9, "analysis:home_data": 7, "analysis:compare": 10, "analysis:compare_data": 10,
            "analysis:trend": 9, "analysis:trend_data": 9}


def test_query_counts_do_not_grow_with_runs(client, django_assert_num_queries):
    s = build_nightly_series(nights=6)
    series_q = {"host": s.host.name, "series": "users-grid-sglang"}

    def count_all():
        for name, params in PAGES:
            with django_assert_num_queries(EXPECTED[name]):
                assert client.get(reverse(name), series_q if params is None else params).status_code == 200, name

    count_all()
    build_nightly_series(nights=6, start=s.sweeps[-1].created_at.replace(year=2027))  # 6 more nights
    assert Run.objects.filter(state=RunState.SUCCEEDED).count() == 2 * 6 * 36
    count_all()


def test_figure_script_writes_what_json_script_writes():
    from datetime import UTC, datetime

    from django.utils.html import json_script

    from analysis.templatetags.figure_json import figure_script

    fig = {"data": [{"text": ["</script><b>&amp; 6.5×", "a<b>c&d"], "x": [1.5, None, 2]}],
           "layout": {"title": {"text": "TP4 > TP8 & b15 < b64 · ünïcode"}}, "at": datetime(2026, 1, 2, tzinfo=UTC)}
    out = figure_script(fig, "fig-x")
    assert out == json_script(fig, "fig-x")
    assert "</script><b>" not in out.split(">", 1)[1][:-len("</script>")]


def test_every_page_answers_a_bad_query_the_same_way(client):
    """One parser (analysis.filters) and one answer (analysis.views.bad_query) on every page and
    JSON endpoint: HTTP 400, plain text naming the parameter, whatever is stored."""
    sweep = make_sweep()
    series_q = {"host": sweep.host.name, "series": sweep.name}
    cases = [("analysis:sweep_detail", [sweep.pk], {"tp": "x"}, "tp"),
             ("analysis:sweep_data", [sweep.pk], {"concurrency": "-1"}, "concurrency"),
             ("analysis:sweep_runs", [sweep.pk], {"state": "nonsense"}, "state"),
             ("analysis:compare", [], {"new": "abc"}, "new"),
             ("analysis:compare_data", [], {"tp": "x"}, "tp"),
             ("analysis:trend", [], {**series_q, "nights": "0"}, "nights"),
             ("analysis:trend_data", [], {**series_q, "output_len": "1.5"}, "output_len"),
             # found by a new user's trial: each of these was an HTTP 500 (an int() that overflowed
             # the database or refused what str.isdigit() passed), or read as another number
             ("analysis:sweep_runs", [sweep.pk], {"tp": "99999999999999999999"}, "tp"),
             ("analysis:sweep_detail", [sweep.pk], {"concurrency": str(2**31)}, "concurrency"),
             ("analysis:compare", [], {"old": "\u00b2"}, "old"),
             ("analysis:compare_data", [], {"new": "99999999999999999999"}, "new"),
             ("analysis:sweep_data", [sweep.pk], {"tp": "1_0"}, "tp"),
             ("analysis:trend", [], {**series_q, "tp": "\u0661"}, "tp"),
             ("analysis:trend_data", [], {**series_q, "nights": "0x10"}, "nights"),
             ("analysis:compare_data", [], {"method": "nope"}, "method"),
             ("analysis:trend", [], {**series_q, "method": "\u2603"}, "method")]
    for name, args, query, param in cases:
        resp = client.get(reverse(name, args=args), query)
        assert resp.status_code == 400 and resp["Content-Type"].startswith("text/plain"), name
        assert resp.content.decode().startswith(f"bad query: {param}: "), (name, resp.content)


def test_fingerprints_are_the_same_by_every_route(series, monkeypatch):
    """runs.selectors.load_points dates each run's hardware fingerprint three ways (a CASE in the
    query, in Python past FINGERPRINT_CASE_MAX changes, or after reading the snapshots itself):
    the points are the same, and the driver update shows as two fingerprints."""
    from runs import selectors

    ids = [s.pk for s in series.sweeps]
    snaps = selectors.snapshot_history([series.host.pk])
    in_sql = selectors.history_points(ids, ("output_throughput_tok_s",), snapshots=snaps)
    read_here = selectors.history_points(ids, ("output_throughput_tok_s",))
    monkeypatch.setattr(selectors, "FINGERPRINT_CASE_MAX", 0)
    dated = selectors.history_points(ids, ("output_throughput_tok_s",), snapshots=snaps)
    key = [(p.run_id, p.hardware_fingerprint, p.gpu_uuids, p.output_throughput_tok_s) for p in in_sql]
    assert key == [(p.run_id, p.hardware_fingerprint, p.gpu_uuids, p.output_throughput_tok_s) for p in dated]
    assert key == [(p.run_id, p.hardware_fingerprint, p.gpu_uuids, p.output_throughput_tok_s) for p in read_here]
    assert len({p.hardware_fingerprint for p in in_sql}) == 2 and "" not in {p.hardware_fingerprint for p in in_sql}
    assert selectors.history_points(ids, (), snapshots={})[0].hardware_fingerprint == ""  # not read
