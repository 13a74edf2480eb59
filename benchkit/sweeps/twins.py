"""Acceptance-controlled twins (issue 21; docs/CHANGEPOINTS.md): pure, Django-free.

A sweep file asks for a twin with `twin: {acceptance: pinned}` (top level: every speculative
point; or on one `grid.methods` entry). Each such point then gets a second run, its *twin*, whose
server starts with the engine's synthetic acceptance pinned to a reference tau (the engine
registry says how: `EngineAdapter.twin`; an engine without forced acceptance has no twin). The
reference is the file's `tau:` (a "golden" tau, as InferenceX pins per model) or else the median
tau of the same point over its series' last `nights` nights. The twin's tau cannot move, so its
speed moves with the step cost alone (benchkit.compare.attribution).
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from benchkit.engines.adapters import EngineConfigError, adapter_for
from benchkit.specs import RunSpec

PINNED = "pinned"
#: How far back the default reference tau looks (nights of the series).
DEFAULT_NIGHTS = 7
#: `TwinPlan.source` values.
GOLDEN, MEDIAN = "golden", "median"


@dataclass(frozen=True)
class TwinRequest:
    """What a sweep file asked: `acceptance` ("pinned"), the golden `tau` (tokens per verify
    pass, >= 1; None: the median of the last `nights` nights), `nights` (>= 1)."""

    acceptance: str = PINNED
    tau: float | None = None
    nights: int = DEFAULT_NIGHTS


@dataclass(frozen=True)
class TwinPlan:
    """The twin of one run, or why there is none: `spec` the twin's RunSpec (None: no twin),
    `tau` the pinned tau, `source` GOLDEN or MEDIAN ("" without a tau), `note` a sentence for
    the run's history or the log ("no twin: ..." when `spec` is None)."""

    spec: RunSpec | None
    tau: float | None
    source: str
    note: str


def reference_tau(request: TwinRequest, history: Sequence[float]) -> tuple[float | None, str]:
    """(tau, source) for a twin: the request's golden tau (GOLDEN), else the median of `history`
    (the point's tau per night, newest last; the last `request.nights` are used; MEDIAN); (None,
    "") when neither exists. Non-finite or < 1 history values are skipped."""
    if request.tau is not None:
        return float(request.tau), GOLDEN
    vals = [float(v) for v in history if v is not None and v == v and v >= 1.0][-request.nights:]
    if not vals:
        return None, ""
    return float(statistics.median(vals)), MEDIAN


def plan_twin(spec: RunSpec, request: TwinRequest, history: Sequence[float] = ()) -> TwinPlan:
    """The twin of the real run `spec` (a deep copy with `server.acceptance_tau` set), checked
    against its engine's way to force acceptance (`EngineAdapter.twin`: refuses `auto`, an engine
    without one, a tau outside [1, k + 1]). Never raises for those: the plan says "no twin: why".
    `history`: the point's tau over its earlier nights (`reference_tau`)."""
    tau, source = reference_tau(request, history)
    if tau is None:
        return TwinPlan(None, None, "", f"no twin: no golden tau in the file and no tau of this point in the last "
                                        f"{request.nights} nights")
    try:
        change = adapter_for(spec.server.engine).twin(spec.server, tau)
    except EngineConfigError as exc:
        return TwinPlan(None, tau, source, f"no twin: {exc}")
    twin = copy.deepcopy(spec)
    twin.server.acceptance_tau = tau
    how = "the file's golden tau" if source == GOLDEN else f"median tau of the last {request.nights} nights"
    return TwinPlan(twin, tau, source, f"acceptance-controlled twin: tau pinned to {tau:.4g} ({how}); {change.note}")


def plan_twins(spec: Any, runspecs: Sequence[RunSpec],
               history: Callable[[RunSpec, int], Sequence[float]] | None = None) -> list[tuple[int, TwinPlan]]:
    """(index into `runspecs`, plan) for every real run whose method variant asks for a twin
    (`spec.twin_for(run)`, a benchkit.sweeps.sweepfile.SweepSpec), planned by `plan_twin`; a plan
    without a twin (`plan.spec` None) says why. `history(run, nights)`: the point's tau over its
    series' earlier nights, asked only where the file gives no golden tau (None: no history, as
    on an offline host). The one planning loop of a worker's sweep, a dry run and an offline
    run."""
    out = []
    for i, r in enumerate(runspecs):
        request = spec.twin_for(r)
        if request is None:
            continue
        past = history(r, request.nights) if history is not None and request.tau is None else ()
        out.append((i, plan_twin(r, request, past)))
    return out
