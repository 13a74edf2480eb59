"""A nightly series of the users' grid (sweeps/users-grid-sglang.yaml on an 8-GPU PCIe host),
built through the real services, with one planted regression.

Every night is `create_sweep` of the users' sweep file (with every method on the DDTree engine
build, so speedups have their matched autoregressive baseline), each run driven through `transition`
and `store_outcome` with metrics computed by benchkit.measure.metrics from request logs built
to hit the night's tok/s, then `regressions.detect_for_sweep` (what the task does when a
sweep's last run finishes). Only times are shifted: night i's sweep, runs and snapshots are
dated `start + i days` (the services stamp "now").

Figures (the users' own, DOMAIN.md): at 1024 output tokens and concurrency 1, TP1 DDTree b15 is
6.5x autoregressive and 1.625x linear DFlash; TP4 b15 reaches 1270.8 tok/s at concurrency 8;
at concurrency 1 TP4 is faster than TP8 (PCIe, two sockets). Every other point moves by
deterministic noise within +-`noise_pct`.

Planted, and what must follow:
- `PLANTED`: TP8 linear at concurrency 1 runs 25 % slower on the last two nights -> the one
  regression flag, on the last night.
- a single-night dip of 20 % (TP1 b32, concurrency 8, night max(4, nights // 2)) -> no flag;
- a driver update (hardware snapshot, new fingerprint) before night max(2, nights // 3) and an
  engine upgrade (0.5.2 -> 0.5.3) from night `nights - 2`, neither changing speed -> no flag,
  drawn on the trend page's time axis.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

from benchkit.execution.outcome import RunOutcome
from benchkit.measure import metrics
from benchkit.measure.logs import MessageEvent, RequestLog
from benchkit.sweeps.sweepfile import loads_sweep
from runs.models import HardwareSnapshot, Host, Run, RunState, Sweep
from runs.services import regressions
from runs.services.hosts import record_inventory
from runs.services.outcomes import store_outcome
from runs.services.sweeps import create_sweep
from runs.services.transitions import transition
from tests.factories import MS
from tests.test_allocation import pcie8_inventory

REPO = Path(__file__).resolve().parents[1]
USERS_GRID = REPO / "sweeps" / "users-grid-sglang.yaml"

#: Autoregressive output tok/s at (TP, concurrency).
AR_TOK_S = {(1, 1): 30.0, (4, 1): 64.0, (8, 1): 52.0, (1, 8): 200.0, (4, 8): 330.0, (8, 8): 290.0}
#: Speedup over autoregressive per configuration label at (TP, concurrency); b15 is the best
#: everywhere; TP1 c1: b15 / linear = 6.5 / 4.0 = 1.625 (the users' 1.63x).
SPEEDUP = {
    1: {"linear": 4.0, "b15": 6.5, "b16": 6.3, "b32": 5.6, "b64": 4.6},
    8: {"linear": 2.4, "b15": 1270.8 / 330.0, "b16": 3.7, "b32": 3.2, "b64": 2.6},
}
#: Acceptance length tau per configuration (grows with the budget; speed does not).
TAU = {"linear": 4.2, "b15": 6.1, "b16": 6.2, "b32": 6.9, "b64": 7.3}
ENGINE_VERSIONS = ("0.5.2", "0.5.3")


@dataclass(frozen=True)
class Planted:
    """A point made `drop_pct` % slower on the last `nights` nights."""

    label: str = "linear"
    tp: int = 8
    concurrency: int = 1
    drop_pct: float = 25.0
    nights: int = 2


PLANTED = Planted()


@dataclass
class NightlySeries:
    """What `build_nightly_series` made: the host, the sweeps (oldest first), the planted point."""

    host: Host
    sweeps: list[Sweep]
    planted: Planted
    dip_night: int
    engine_upgrade_night: int
    driver_update_night: int


def target_tok_s(label: str, tp: int, concurrency: int) -> float:
    """The users' figures: output tok/s of configuration `label` at (TP, concurrency)."""
    base = AR_TOK_S[(tp, concurrency)]
    if label == "auto":
        return base
    if (label, tp, concurrency) == ("b15", 4, 8):
        return 1270.8
    # TP4/TP8 gain a little less from speculation than TP1 (verification costs more there)
    return base * SPEEDUP[concurrency][label] * {1: 1.0, 4: 0.93, 8: 0.9}[tp]


def _logs_for(tok_s: float, tokens_per_msg: int, concurrency: int):
    """`concurrency` requests sent together, each streaming 64 tokens in messages of
    `tokens_per_msg`, so that the window gives `tok_s` output tok/s (±0.1 %) and TPOT is what
    one of `concurrency` streams sees. Returns (logs, window_start_ns, window_end_ns)."""
    n_tokens = 64
    window_ms = concurrency * n_tokens / tok_s * 1000.0
    msgs = -(-n_tokens // tokens_per_msg)
    ttft = min(60.0 * (1 + 0.25 * (concurrency - 1)), window_ms / 4)
    gap = (window_ms - ttft) / max(msgs - 1, 1)
    logs, t0 = [], 1_000 * MS
    for i in range(concurrency):
        at, got, events = t0 + int(ttft * MS), 0, []
        while got < n_tokens:
            k = min(tokens_per_msg, n_tokens - got)
            events.append(MessageEvent(t_ns=at, tokens=k, kind="content"))
            got, at = got + k, at + int(gap * MS)
        logs.append(RequestLog(index=i, warmup=False, send_ns=t0, events=events, ok=True, prompt_tokens=512,
                               completion_tokens=n_tokens, input_len=512, output_len=n_tokens,
                               end_ns=events[-1].t_ns))
    return logs, t0, max(r.end_ns for r in logs)


def finish(run: Run, tok_s: float, tau: float | None, started_at: datetime, engine_version: str) -> Run:
    """Drive a queued run to succeeded through the real services with metrics at `tok_s`."""
    transition(run, RunState.PREFLIGHT, started_at=started_at)
    for state in (RunState.STARTING, RunState.WARMING, RunState.MEASURING, RunState.STOPPING):
        transition(run, state)
    k = max(1, round(tau)) if tau else 1
    logs, t0, t1 = _logs_for(tok_s, k, run.concurrency)
    window = metrics.compute_run_metrics(logs, t0, t1, None)
    source = ""
    if tau:
        drafts = 100.0
        window = window.with_spec_decode({"acceptance_length": tau, "spec_num_drafts": drafts,
                                          "spec_num_accepted_tokens": (tau - 1) * drafts,
                                          "spec_num_draft_tokens": 15 * drafts,
                                          "acceptance_rate": (tau - 1) / 15})
        source = "sglang counters"
    argv = ["python", "-m", "sglang.launch_server", "--model-path", run.model, "--tp-size", str(run.tp)]
    outcome = RunOutcome(ok=True, argv=argv, logs=logs, window_start_ns=t0, window_end_ns=t1, metrics=window,
                         spec_source=source, engine_version=engine_version, engine_commit="")
    return store_outcome(run, outcome)


def build_nightly_series(nights: int = 8, host_name: str = "ws-pcie8", noise_pct: float = 2.0, seed: int = 0,
                         planted: Planted = PLANTED, start: datetime | None = None,
                         detect: bool = True) -> NightlySeries:
    """`nights` sweeps of the users' grid on one host (36 runs each), with the planted changes
    of the module doc. `nights` >= 6. Returns the series; regression flags are stored when
    `detect`."""
    if nights < 6:
        raise ValueError("a nightly series with the planted changes needs at least 6 nights")
    rng = np.random.default_rng(seed)
    start = start or datetime(2026, 3, 1, 2, 0, tzinfo=UTC)
    host = Host.objects.get_or_create(name=host_name)[0]
    inv = pcie8_inventory()
    driver_night, dip_night, upgrade_night = max(2, nights // 3), max(4, nights // 2), nights - 2
    snap = record_inventory(host, dataclasses.replace(inv, driver_version="575.57.08", cuda_driver_version="12.9"))
    HardwareSnapshot.objects.filter(pk=snap.pk).update(taken_at=start - timedelta(days=1))
    # The shipped file runs every method on the DDTree build, so each speedup has its matched
    # autoregressive run (MEASUREMENT.md: same engine build).
    spec = loads_sweep(USERS_GRID.read_text(), source=str(USERS_GRID))
    sweeps = []
    for night in range(1, nights + 1):
        at = start + timedelta(days=night - 1)
        if night == driver_night:
            snap = record_inventory(host, dataclasses.replace(inv, driver_version="580.65.06",
                                                              cuda_driver_version="13.0"))
            HardwareSnapshot.objects.filter(pk=snap.pk).update(taken_at=at - timedelta(hours=1))
        sweep = create_sweep(spec, host, source=str(USERS_GRID.relative_to(REPO)), enqueue=False)
        Sweep.objects.filter(pk=sweep.pk).update(created_at=at)
        sweep.created_at = at
        version = ENGINE_VERSIONS[1] if night >= upgrade_night else ENGINE_VERSIONS[0]
        for run in Run.objects.filter(sweep=sweep).order_by("id"):
            label = run.method_label
            tok_s = target_tok_s(label, run.tp, run.concurrency) * (1 + rng.uniform(-noise_pct, noise_pct) / 100)
            if (label, run.tp, run.concurrency) == (planted.label, planted.tp, planted.concurrency) \
                    and night > nights - planted.nights:
                tok_s *= 1 - planted.drop_pct / 100
            if (label, run.tp, run.concurrency) == ("b32", 1, 8) and night == dip_night:
                tok_s *= 0.8
            finish(run, tok_s, TAU.get(label), at + timedelta(minutes=run.pk % 36), version)
        if detect:
            regressions.detect_for_sweep(sweep.pk)
        sweeps.append(sweep)
    return NightlySeries(host=host, sweeps=sweeps, planted=planted, dip_night=dip_night,
                         engine_upgrade_night=upgrade_night, driver_update_night=driver_night)
