"""Drafter or verify path, through the Django layer (issue 21): two nightly series of one
speculative point with an acceptance-controlled twin (`twin: {acceptance: pinned, tau}` in the
sweep file, so every night stores the spec run and its linked twin), driven to succeeded through
the real services (tests/nightly.finish). From night 7 one series' drafter gets worse (tau and
tok/s fall 12 %, the twin's speed holds), the other's verify path (tok/s and the twin's tok/s
fall 12 %, tau holds). What the worker's detection task stores names each, on the change point
and on the regression flag, with the figures."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from benchkit.compare.attribution import DRAFTER, VERIFY_PATH
from benchkit.hosts.inventory import HostInventory
from benchkit.sweeps.sweepfile import parse_sweep
from runs import tasks
from runs.models import ChangePoint, RegressionFlag, Run, Sweep
from runs.services import regressions
from runs.services.hosts import get_or_create_host, record_inventory
from runs.services.sweeps import create_sweep
from tests.nightly import finish

pytestmark = pytest.mark.django_db

NIGHTS, FROM, DROP, TAU, TOK_S, GOLDEN = 12, 7, 0.88, 3.0, 400.0, 3.0


def build(host, name: str, what: str, seed: int) -> list[Sweep]:
    """NIGHTS nights of series `name`: auto, draft_model k=4 and its twin pinned at GOLDEN; from
    night FROM the drafter (`what` = "drafter") or the verify path ("verify") gets worse."""
    spec = parse_sweep({"name": name, "engine": "vllm", "model": "/models/target",
                        "grid": {"methods": ["auto", {"method": "draft_model", "num_speculative_tokens": 4,
                                                      "drafter": "/models/draft"}], "concurrency": [1]},
                        "twin": {"acceptance": "pinned", "tau": GOLDEN}}, source=f"test:{name}")
    rng = np.random.default_rng(seed)
    start = datetime(2026, 3, 1, 2, 0, tzinfo=UTC)
    sweeps = []
    for night in range(1, NIGHTS + 1):
        at = start + timedelta(days=night - 1)
        sweep = create_sweep(spec, host, source="test", enqueue=False)
        Sweep.objects.filter(pk=sweep.pk).update(created_at=at)
        late = night >= FROM
        for run in Run.objects.filter(sweep=sweep).order_by("id"):
            noise = 1 + rng.uniform(-1.0, 1.0) / 100
            if run.method == "auto":
                tok_s, tau = TOK_S / 2, None
            elif run.twin_of_id:  # the twin: acceptance pinned, its speed is the step cost's alone
                tok_s, tau = TOK_S * (DROP if late and what == "verify" else 1.0), GOLDEN
            else:
                tok_s, tau = TOK_S * (DROP if late else 1.0), TAU * (DROP if late and what == "drafter" else 1.0)
            finish(run, tok_s * noise, tau, at + timedelta(minutes=run.pk % 30), "0.32.0")
        regressions.detect_for_sweep(sweep.pk)
        sweeps.append(sweep)
    return sweeps


@pytest.mark.parametrize(("what", "verdict"), [("drafter", DRAFTER), ("verify", VERIFY_PATH)])
def test_change_point_and_flag_of_a_spec_point_name_the_drafter_or_the_verify_path(what, verdict):
    host = get_or_create_host("attr-box")
    record_inventory(host, HostInventory(hostname="attr-box", gpus=[]))
    sweeps = build(host, f"nightly-{what}", what, seed=3)
    assert Run.objects.filter(sweep=sweeps[0], twin_of__isnull=False).count() == 1
    tasks.detect_regressions_task(sweeps[-1].pk)  # what the worker runs when the last night finished

    [cp] = ChangePoint.objects.filter(host=host, label="draft_model k=4")
    assert cp.sweep_id == sweeps[FROM - 1].pk and "output_throughput_tok_s" in cp.metrics
    assert ("acceptance_length" in cp.metrics) == (what == "drafter")
    a = cp.attribution
    assert a["verdict"] == verdict and a["reason"].startswith(verdict)
    assert a["speed"]["after"] / a["speed"]["before"] == pytest.approx(DROP, rel=0.03)
    assert a["twin_speed"]["after"] / a["twin_speed"]["before"] == pytest.approx(
        DROP if what == "verify" else 1.0, rel=0.03)
    assert a["twin_tau"]["before"] == pytest.approx(GOLDEN) and a["twin_tau"]["after"] == pytest.approx(GOLDEN)
    assert abs(a["unexplained_pct"]) < 3
    assert not ChangePoint.objects.filter(host=host, label="auto").exists()  # AR did not move
    # the twin never counts: no change point or flag of its own (its point is the real run's)
    flags = list(RegressionFlag.objects.filter(host=host, label="draft_model k=4"))
    assert flags and all(f.attribution["verdict"] == verdict for f in flags)
    assert all(f.sweep_id in {s.pk for s in sweeps[FROM - 1:]} for f in flags)
