"""The figures of the nightly users'-grid series (tests/nightly.py), without Django: what every
point measures on every night, the changes planted in it, and `point_nights(...)`, the same
series for one point as `benchkit.compare.changepoints.Night`s built directly (no database),
with metrics computed by benchkit.measure.metrics from the same request logs tests/nightly.py
stores.

Figures (the users' own, DOMAIN.md): at 1024 output tokens and concurrency 1, TP1 DDTree b15 is
6.5x autoregressive and 1.625x linear DFlash; TP4 b15 reaches 1270.8 tok/s at concurrency 8;
at concurrency 1 TP4 is faster than TP8 (PCIe, two sockets).

Speed model of a planted change (MEASUREMENT.md "Comparing runs": decode speed = tau / step
cost): a change of the step cost by p % multiplies TPOT by (1 + p/100) and tok/s by
1 / (1 + p/100), tau unchanged; a change of tau by p % multiplies tau and tok/s by (1 + p/100)
and TPOT by 1 / (1 + p/100) (the step cost unchanged).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from benchkit.compare.changepoints import Night
from benchkit.compare.verdicts import MIN_COMPLETED_REQUESTS
from benchkit.measure import metrics
from benchkit.measure.logs import MessageEvent, RequestLog

MS = 1_000_000  # ns per ms

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
#: (NVIDIA driver, CUDA driver) before and after the driver update.
DRIVER_VERSIONS = (("575.57.08", "12.9"), ("580.65.06", "13.0"))


@dataclass(frozen=True)
class Planted:
    """A point made `drop_pct` % slower on the last `nights` nights."""

    label: str = "linear"
    tp: int = 8
    concurrency: int = 1
    drop_pct: float = 25.0
    nights: int = 2


PLANTED = Planted()


@dataclass(frozen=True)
class PlantedChange:
    """A change planted in one point (`label`, `tp`, `concurrency`) from night `from_night`
    (1-based) on. `target`: "step_cost" or "tau" (module doc: how each moves tok/s, TPOT and
    tau). `kind`: "step" (`pct` % from `from_night` on) or "drift" (`pct` % more every night:
    night `from_night` is at 1 x `pct`, the next at 2 x `pct`, ...)."""

    name: str
    label: str
    tp: int
    concurrency: int
    target: str
    kind: str
    from_night: int
    pct: float

    def __post_init__(self) -> None:
        if self.target not in ("step_cost", "tau") or self.kind not in ("step", "drift"):
            raise ValueError(f"planted change {self.name}: target/kind {self.target}/{self.kind}")

    def factor(self, night: int) -> float:
        """The target's factor on 1-based `night` (1.0 before `from_night`)."""
        if night < self.from_night:
            return 1.0
        steps = 1 if self.kind == "step" else night - self.from_night + 1
        return 1.0 + steps * self.pct / 100.0


#: Issue 21's planted changes (14 nights): a one-night step in TPOT on TP8 linear from night 9
#: (step cost +10 %, tau unchanged); a slow 1 %/night drift in tau on b32 from night 5; a tau drop
#: of 8 % on b15 with unchanged step cost (from night 7).
ISSUE21_CHANGES = (
    PlantedChange("tpot step", "linear", 8, 8, "step_cost", "step", 9, 10.0),
    PlantedChange("tau drift", "b32", 1, 1, "tau", "drift", 5, -1.0),
    PlantedChange("tau drop", "b15", 4, 8, "tau", "step", 7, -8.0),
)


@dataclass(frozen=True)
class SpecialNights:
    """The nights (1-based) of the series' fixed events: the driver update (a new hardware
    snapshot, no speed change), the single-night 20 % dip (TP1 b32 at concurrency 8) and the
    engine upgrade (ENGINE_VERSIONS[1] from that night on, no speed change)."""

    driver_update: int
    dip: int
    engine_upgrade: int


def special_nights(nights: int) -> SpecialNights:
    """The fixed events of a series of `nights` nights (>= 6)."""
    return SpecialNights(max(2, nights // 3), max(4, nights // 2), nights - 2)


def target_tok_s(label: str, tp: int, concurrency: int) -> float:
    """The users' figures: output tok/s of configuration `label` at (TP, concurrency)."""
    base = AR_TOK_S[(tp, concurrency)]
    if label == "auto":
        return base
    if (label, tp, concurrency) == ("b15", 4, 8):
        return 1270.8
    # TP4/TP8 gain a little less from speculation than TP1 (verification costs more there)
    return base * SPEEDUP[concurrency][label] * {1: 1.0, 4: 0.93, 8: 0.9}[tp]


def night_figures(label: str, tp: int, concurrency: int, night: int, nights: int, noise: float,
                  planted: Planted = PLANTED, changes: tuple[PlantedChange, ...] = (), dip: bool = True
                  ) -> tuple[float, float | None]:
    """(output tok/s, tau) of one point on 1-based `night` of `nights`: the users' figure times
    `noise` (1 + the night's relative noise), with `planted`, the dip (when `dip`) and
    `changes` applied."""
    tok_s = target_tok_s(label, tp, concurrency) * noise
    tau = TAU.get(label)
    if (label, tp, concurrency) == (planted.label, planted.tp, planted.concurrency) and night > nights - planted.nights:
        tok_s *= 1 - planted.drop_pct / 100
    if dip and (label, tp, concurrency) == ("b32", 1, 8) and night == special_nights(nights).dip:
        tok_s *= 0.8
    for ch in changes:
        if (label, tp, concurrency) != (ch.label, ch.tp, ch.concurrency):
            continue
        f = ch.factor(night)
        if ch.target == "step_cost":
            tok_s /= f
        elif tau is not None:
            tok_s, tau = tok_s * f, tau * f
    return tok_s, tau


def logs_for(tok_s: float, tokens_per_msg: int, concurrency: int) -> tuple[list[RequestLog], int, int]:
    """`concurrency` requests sent together, each streaming 64 tokens in messages of
    `tokens_per_msg`, so that the window gives `tok_s` output tok/s (±0.1 %) and TPOT is what
    one of `concurrency` streams sees; repeated back to back in rounds until at least
    benchkit.compare.verdicts.MIN_COMPLETED_REQUESTS requests completed (every round alike, so
    tok/s, TPOT and TTFT do not depend on the count). Returns (logs, window_start_ns,
    window_end_ns)."""
    n_tokens = 64
    round_ms = concurrency * n_tokens / tok_s * 1000.0
    msgs = -(-n_tokens // tokens_per_msg)
    ttft = min(60.0 * (1 + 0.25 * (concurrency - 1)), round_ms / 4)
    gap = (round_ms - ttft) / max(msgs - 1, 1)
    logs, t0 = [], 1_000 * MS
    send = t0
    for _ in range(-(-MIN_COMPLETED_REQUESTS // concurrency)):
        for _i in range(concurrency):
            at, got, events = send + int(ttft * MS), 0, []
            while got < n_tokens:
                k = min(tokens_per_msg, n_tokens - got)
                events.append(MessageEvent(t_ns=at, tokens=k, kind="content"))
                got, at = got + k, at + int(gap * MS)
            logs.append(RequestLog(index=len(logs), warmup=False, send_ns=send, events=events, ok=True,
                                   prompt_tokens=512, completion_tokens=n_tokens, input_len=512, output_len=n_tokens,
                                   end_ns=events[-1].t_ns))
        send = max(r.end_ns for r in logs)
    return logs, t0, send


def run_figures(tok_s: float, tau: float | None, concurrency: int
                ) -> tuple[list[RequestLog], int, int, metrics.WindowMetrics]:
    """What a run at `tok_s` with acceptance length `tau` stores (tests/nightly.py `finish`):
    `logs_for`'s request logs, the window, and its metrics computed from those logs, tau from
    counter figures. Returns (logs, window_start_ns, window_end_ns, metrics)."""
    k = max(1, round(tau)) if tau else 1
    logs, t0, t1 = logs_for(tok_s, k, concurrency)
    window = metrics.compute_run_metrics(logs, t0, t1, None)
    if tau:
        drafts = 100.0
        window = window.with_spec_decode({"acceptance_length": tau, "spec_num_drafts": drafts,
                                          "spec_num_accepted_tokens": (tau - 1) * drafts,
                                          "spec_num_draft_tokens": 15 * drafts,
                                          "acceptance_rate": (tau - 1) / 15})
    return logs, t0, t1, window


def point_nights(label: str, tp: int, concurrency: int, nights: int = 14, noise_pct: float = 2.0,
                 tau_noise_pct: float = 0.0, seed: int = 0, planted: Planted = PLANTED,
                 changes: tuple[PlantedChange, ...] = ISSUE21_CHANGES, repeats: int = 1, dip: bool = True,
                 noise: str = "uniform", first_sweep_id: int = 101) -> list[Night]:
    """One point of the nightly series as Nights, built directly: per night `repeats` runs, each
    with tok/s noise uniform in +-`noise_pct` % and tau noise uniform in +-`tau_noise_pct` %
    (tests/nightly.py draws tok/s noise the same way, tau noise only when asked; `noise="normal"`
    draws normal noise with those standard deviations instead), the planted changes applied
    (`planted`, the dip when `dip`, `changes`), output tok/s and median TPOT computed by
    benchkit.measure.metrics from the request logs, and the environment of tests/nightly.py
    (driver update, engine upgrade). Sweep ids count from `first_sweep_id`."""
    if noise not in ("uniform", "normal"):
        raise ValueError(f"noise must be uniform or normal, got {noise!r}")
    rng = np.random.default_rng(seed)

    def draw(pct: float) -> float:
        return 1 + (rng.uniform(-pct, pct) if noise == "uniform" else rng.normal(0.0, pct)) / 100
    special = special_nights(nights)
    out = []
    for night in range(1, nights + 1):
        values: dict[str, list[float]] = {"output_throughput_tok_s": [], "median_tpot_ms": [], "acceptance_length": []}
        for _ in range(repeats):
            tok_s, tau = night_figures(label, tp, concurrency, night, nights, draw(noise_pct), planted, changes, dip)
            if tau is not None and tau_noise_pct:
                tau *= draw(tau_noise_pct)
            w = run_figures(tok_s, tau, concurrency)[3]
            for name, vals in values.items():
                if getattr(w, name) is not None:
                    vals.append(getattr(w, name))
        driver = DRIVER_VERSIONS[1 if night >= special.driver_update else 0][0]
        engine = ENGINE_VERSIONS[1 if night >= special.engine_upgrade else 0]
        out.append(Night(sweep_id=first_sweep_id + night - 1,
                         values={k: tuple(v) for k, v in values.items() if v},
                         env={"driver_version": driver, "engine_version": engine}))
    return out
