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

Opt-in (`changes=`, e.g. `tests.nightly_figures.ISSUE21_CHANGES`: issue 21's TPOT step, tau
drift and tau drop) and `tau_noise_pct=`: further changes and tau noise. The figures, the planted
changes and the request logs live in tests/nightly_figures.py (no Django), which also builds
one point's series directly for the change-point tests.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

from benchkit.execution.outcome import RunOutcome
from benchkit.sweeps.sweepfile import loads_sweep
from runs.models import HardwareSnapshot, Host, Run, RunState, Sweep
from runs.services import regressions
from runs.services.hosts import record_inventory
from runs.services.outcomes import store_outcome
from runs.services.sweeps import create_sweep
from runs.services.transitions import transition
from tests.nightly_figures import (  # noqa: F401  (AR_TOK_S, SPEEDUP, TAU: re-exported for current users)
    AR_TOK_S,
    DRIVER_VERSIONS,
    ENGINE_VERSIONS,
    PLANTED,
    SPEEDUP,
    TAU,
    Planted,
    PlantedChange,
    night_figures,
    run_figures,
    special_nights,
    target_tok_s,
)
from tests.test_allocation import pcie8_inventory

REPO = Path(__file__).resolve().parents[1]
USERS_GRID = REPO / "sweeps" / "users-grid-sglang.yaml"


@dataclass
class NightlySeries:
    """What `build_nightly_series` made: the host, the sweeps (oldest first), the planted point."""

    host: Host
    sweeps: list[Sweep]
    planted: Planted
    dip_night: int
    engine_upgrade_night: int
    driver_update_night: int
    changes: tuple[PlantedChange, ...] = field(default_factory=tuple)


def finish(run: Run, tok_s: float, tau: float | None, started_at: datetime, engine_version: str) -> Run:
    """Drive a queued run to succeeded through the real services with metrics at `tok_s`."""
    transition(run, RunState.PREFLIGHT, started_at=started_at)
    for state in (RunState.STARTING, RunState.WARMING, RunState.MEASURING, RunState.STOPPING):
        transition(run, state)
    logs, t0, t1, window = run_figures(tok_s, tau, run.concurrency)
    source = "sglang counters" if tau else ""
    argv = ["python", "-m", "sglang.launch_server", "--model-path", run.model, "--tp-size", str(run.tp)]
    outcome = RunOutcome(ok=True, argv=argv, logs=logs, window_start_ns=t0, window_end_ns=t1, metrics=window,
                         spec_source=source, engine_version=engine_version, engine_commit="")
    return store_outcome(run, outcome)


def build_nightly_series(nights: int = 8, host_name: str = "ws-pcie8", noise_pct: float = 2.0, seed: int = 0,
                         planted: Planted = PLANTED, start: datetime | None = None,
                         detect: bool = True, changes: tuple[PlantedChange, ...] = (),
                         tau_noise_pct: float = 0.0) -> NightlySeries:
    """`nights` sweeps of the users' grid on one host (36 runs each), with the planted changes
    of the module doc, plus `changes` (tests/nightly_figures.PlantedChange) and tau noise
    uniform in +-`tau_noise_pct` % (drawn from its own generator, seed + 1, so the tok/s noise
    is the same with or without it). `nights` >= 6. Returns the series; regression flags are
    stored when `detect`."""
    if nights < 6:
        raise ValueError("a nightly series with the planted changes needs at least 6 nights")
    rng, tau_rng = np.random.default_rng(seed), np.random.default_rng(seed + 1)
    start = start or datetime(2026, 3, 1, 2, 0, tzinfo=UTC)
    host = Host.objects.get_or_create(name=host_name)[0]
    inv = pcie8_inventory()
    special = special_nights(nights)
    driver_night, dip_night, upgrade_night = special.driver_update, special.dip, special.engine_upgrade
    (old_driver, old_cuda), (new_driver, new_cuda) = DRIVER_VERSIONS
    snap = record_inventory(host, dataclasses.replace(inv, driver_version=old_driver, cuda_driver_version=old_cuda))
    HardwareSnapshot.objects.filter(pk=snap.pk).update(taken_at=start - timedelta(days=1))
    # The shipped file runs every method on the DDTree build, so each speedup has its matched
    # autoregressive run (MEASUREMENT.md: same engine build).
    spec = loads_sweep(USERS_GRID.read_text(), source=str(USERS_GRID))
    sweeps = []
    for night in range(1, nights + 1):
        at = start + timedelta(days=night - 1)
        if night == driver_night:
            snap = record_inventory(host, dataclasses.replace(inv, driver_version=new_driver,
                                                              cuda_driver_version=new_cuda))
            HardwareSnapshot.objects.filter(pk=snap.pk).update(taken_at=at - timedelta(hours=1))
        sweep = create_sweep(spec, host, source=str(USERS_GRID.relative_to(REPO)), enqueue=False)
        Sweep.objects.filter(pk=sweep.pk).update(created_at=at)
        sweep.created_at = at
        version = ENGINE_VERSIONS[1] if night >= upgrade_night else ENGINE_VERSIONS[0]
        for run in Run.objects.filter(sweep=sweep).order_by("id"):
            noise = 1 + rng.uniform(-noise_pct, noise_pct) / 100
            tok_s, tau = night_figures(run.method_label, run.tp, run.concurrency, night, nights, noise, planted,
                                       changes)
            if tau is not None and tau_noise_pct:
                tau *= 1 + tau_rng.uniform(-tau_noise_pct, tau_noise_pct) / 100
            finish(run, tok_s, tau, at + timedelta(minutes=run.pk % 36), version)
        if detect:
            regressions.detect_for_sweep(sweep.pk)
        sweeps.append(sweep)
    return NightlySeries(host=host, sweeps=sweeps, planted=planted, dip_night=dip_night,
                         engine_upgrade_night=upgrade_night, driver_update_night=driver_night,
                         changes=tuple(changes))
