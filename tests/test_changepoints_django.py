"""Change points through the Django layer (issue 21): the 14-night users'-grid fixture with the
planted changes (tests/nightly.py, built through the real services), detected by what the worker's
task runs when a sweep's last run finished (runs.tasks.detect_regressions_task), stored as
ChangePoint rows beside the existing regression flags, never duplicated by a re-run or the
back-fill command, acknowledged in the admin, shown on the trend and home pages."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse

from runs import tasks
from runs.models import ChangePoint, RegressionFlag, RunMetrics
from runs.services import changepoints
from tests.nightly import build_nightly_series
from tests.nightly_figures import ISSUE21_CHANGES, PLANTED

pytestmark = pytest.mark.django_db


@pytest.fixture
def series(monkeypatch):
    return build_nightly_series(nights=14, changes=ISSUE21_CHANGES, tau_noise_pct=2.0)


def stored(series) -> dict:
    """{(label, tp, concurrency): [(night 1-based, kind, metrics, found_by)]} of the stored rows."""
    night = {s.pk: i + 1 for i, s in enumerate(series.sweeps)}
    out: dict = {}
    for cp in ChangePoint.objects.filter(host=series.host).order_by("sweep__created_at"):
        out.setdefault((cp.label, cp.tp, cp.concurrency), []).append(
            (night[cp.sweep_id], cp.kind, set(cp.metrics), tuple(cp.found_by)))
    return out


def test_planted_changes_are_stored_at_their_nights_beside_the_flags_and_never_duplicated(series, client,
                                                                                         admin_client):
    last = series.sweeps[-1]
    flags = tasks.detect_regressions_task(last.pk)  # what the worker runs when the last run finished
    assert flags  # the existing rule still answers "is last night bad"
    found = stored(series)
    step, drift, drop = ISSUE21_CHANGES
    [(n, kind, moved, _)] = found[step.label, step.tp, step.concurrency]
    assert (n, kind) == (9, "step") and "median_tpot_ms" in moved and "acceptance_length" not in moved
    [(n, kind, moved, _)] = found[drift.label, drift.tp, drift.concurrency]
    assert kind == "drift" and abs(n - 5) <= 2 and "acceptance_length" in moved
    [(n, kind, moved, _)] = found[drop.label, drop.tp, drop.concurrency]
    assert (n, kind) == (7, "step") and "acceptance_length" in moved
    assert [(n, k) for n, k, _, _ in found[PLANTED.label, PLANTED.tp, PLANTED.concurrency]] == [(13, "step")]
    # nothing else of the 36 points (the one-night dip, the driver and engine updates, noise)
    assert set(found) == {(c.label, c.tp, c.concurrency) for c in ISSUE21_CHANGES} | {
        (PLANTED.label, PLANTED.tp, PLANTED.concurrency)}
    night = {i + 1: s.pk for i, s in enumerate(series.sweeps)}
    assert {(f.label, f.tp, f.concurrency, f.sweep_id) for f in RegressionFlag.objects.filter(host=series.host)} == {
        (PLANTED.label, PLANTED.tp, PLANTED.concurrency, night[14]), (step.label, step.tp, step.concurrency, night[10])}
    drop_row = ChangePoint.objects.get(host=series.host, label=drop.label, tp=drop.tp, concurrency=drop.concurrency)
    assert drop_row.shifts[0]["before_mean"] > drop_row.shifts[0]["after_mean"]
    assert drop_row.sentence.startswith("night 7") and drop_row.attribution["verdict"] == "no twin"

    # idempotent: the task again, the back-fill command, detection per sweep: same rows, same ids
    ids = sorted(ChangePoint.objects.values_list("pk", flat=True))
    tasks.detect_regressions_task(last.pk)
    out = io.StringIO()
    call_command("detect_change_points", stdout=out)
    call_command("detect_change_points", "--sweep", str(series.sweeps[5].pk), stdout=out)
    assert sorted(ChangePoint.objects.values_list("pk", flat=True)) == ids
    assert f"{len(ids)} change point(s) stored" in out.getvalue()

    # acknowledged in the admin like a flag; an acknowledged one survives a re-run that no longer finds it
    row = ChangePoint.objects.get(pk=ids[0])
    resp = admin_client.post(reverse("admin:runs_changepoint_changelist"),
                             {"action": "acknowledge", "_selected_action": [row.pk], "reason": "known: new kernel",
                              "apply": "1"})
    assert resp.status_code in (200, 302)
    row.refresh_from_db()
    assert row.acknowledged_by == "admin" and row.ack_reason == "known: new kernel"
    assert changepoints.acknowledge([row.pk], "someone", "again") == 0

    # the pages: trend page draws and explains them, saying which rule found what; home lists them
    page = client.get(reverse("analysis:trend") + f"?host={series.host.name}&series={last.name}").content.decode()
    assert all(f'data-change-point="{pk}"' in page for pk in ids) and "found by all metrics jointly" in page
    assert "rolling median (two nights, 10 %)" in page and 'triangle-up' in page  # marks drawn on the tok/s figure
    home = client.get(reverse("analysis:home")).content.decode()
    assert all(f'data-change-point="{pk}"' in home for pk in ids if pk != row.pk)  # open ones beside the flags
    assert f'data-change-point="{row.pk}"' not in home and 'id="flags"' in home


def test_trend_page_shows_per_position_acceptance_night_by_night(series, client):
    """A drafter change that only hurts deep positions is visible: per-position rates of one point
    (the figure each run already has), night by night, from its change point's link."""
    tasks.detect_regressions_task(series.sweeps[-1].pk)
    step, drift, drop = ISSUE21_CHANGES
    cp = ChangePoint.objects.get(host=series.host, label=drop.label, tp=drop.tp, concurrency=drop.concurrency)
    night = {s.pk: i + 1 for i, s in enumerate(series.sweeps)}
    rows = RunMetrics.objects.filter(run__sweep__in=series.sweeps, run__tp=drop.tp, run__concurrency=drop.concurrency,
                                     run__tree_budget=15)
    assert rows.count() == 14
    for m in rows.select_related("run"):  # deep positions fall from night 7 on, the first holds
        deep = 0.5 if night[m.run.sweep_id] >= 7 else 0.8
        m.per_position_acceptance_rate = [0.9, deep, deep / 2]
        m.save(update_fields=["per_position_acceptance_rate"])
    base = reverse("analysis:trend") + f"?host={series.host.name}&series={series.sweeps[-1].name}"
    page = client.get(base).content.decode()
    assert f"point={cp.point_key}#acceptance" in page  # each change point links to its point's positions
    page = client.get(f"{base}&point={cp.point_key}").content.decode()
    assert 'id="acceptance-positions"' in page and "position 3" in page
    table = page.split('id="acceptance-positions"')[1].split("</table>")[0]
    assert table.count("<tr>") == 15  # header + 14 nights
    assert "<td>0.900</td><td>0.800</td><td>0.400</td>" in table
    assert "<td>0.900</td><td>0.500</td><td>0.250</td>" in table
    data = client.get(reverse("analysis:trend_data") + f"?host={series.host.name}&series={series.sweeps[-1].name}"
                      f"&point={cp.point_key}").json()
    assert [r["rates"][1] for r in data["acceptance"]["rows"]] == [0.8] * 6 + [0.5] * 8
    other = client.get(f"{base}&point={'0' * 32}").content.decode()
    assert "no per-position acceptance rates" in other


@pytest.mark.parametrize("command", ["detect_change_points", "detect_regressions"])
def test_backfill_commands_name_a_sweep_or_host_that_does_not_exist(command):
    """Both back-fills check their choice alike (runs.management.series): a clear error, nothing run."""
    with pytest.raises(CommandError, match="no sweep 987654"):
        call_command(command, "--sweep", "987654", stdout=io.StringIO())
    with pytest.raises(CommandError, match="no host named 'nowhere'"):
        call_command(command, "--host", "nowhere", stdout=io.StringIO())
    with pytest.raises(CommandError, match="no host named ''"):
        call_command(command, "--host", "", stdout=io.StringIO())
    with pytest.raises(CommandError, match="--sweep names one sweep"):
        call_command(command, "--sweep", "1", "--series", "x", stdout=io.StringIO())
    out = io.StringIO()
    call_command(command, "--series", "no-such-series", stdout=out)  # an empty choice: nothing to judge
    assert out.getvalue().splitlines()[-1].startswith("0 ")
