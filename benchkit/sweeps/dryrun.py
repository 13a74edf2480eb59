"""A sweep's dry run: what every run would get on a host, checked now, with nothing started.

`plan_sweep(spec, inventory, ...)` expands the sweep with its GPUs planned from the host's
inventory (the same plan a stored sweep gets, SweepSpec.expand_on), groups the runs into server
starts as the worker will (benchkit.specs.server_groups), and for each start builds the exact
launch (argv, environment, through the build's interpreter or launcher: EngineAdapter.launch)
and runs the runner's own preflight checks (benchkit.execution.runner.preflight_checks) now,
collecting every failure instead of stopping at the first. No server starts and nothing is
written outside a temporary folder (a container build's env file, which its probe reads).
`format_plan(plan)` is the text `manage.py start_sweep FILE --dry-run` prints.

Points the host cannot hold (a TP degree above its GPU count, a pinned GPU it lacks, a TP group
that must cross NUMA nodes under `cross_numa: false`) do not stop the plan: the other runs are
planned and checked, and the refused ones are listed at the end with their located reasons
(`SweepPlan.refused`, benchkit.sweeps.sweepfile.Refusal); `start_sweep` then exits non-zero.

Checks repeat across starts (the same model, build and GPUs), so each distinct check runs once
and its result is reused. GPU checks (CUDA initialisation, idle GPUs) run only when the host is
this machine (`gpu_checks`); ports are chosen as at run time (`runner.choose_port`), now.
"""

from __future__ import annotations

import shlex
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchkit.engines import adapters
from benchkit.execution import runner
from benchkit.hosts import preflight
from benchkit.hosts.allocation import Allocation
from benchkit.hosts.inventory import HostInventory
from benchkit.specs import RunSpec, server_groups
from benchkit.sweeps import twins
from benchkit.sweeps.sweepfile import Refusal, SweepSpec


@dataclass
class PlannedStart:
    """One server start of the plan: `number` (1-based), `runs` [(run number, RunSpec)] that share
    it, the exact `argv` and `env` (variables over the worker's environment), `port` and how it
    was chosen (`port_note`), `build` (the build's description), `failures` [(check, code,
    message)] of the checks that fail now."""

    number: int
    runs: list[tuple[int, RunSpec]]
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    port: int | None = None
    port_note: str = ""
    build: str = ""
    failures: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def spec(self) -> RunSpec:
        """The first run's spec (all runs of a start share its server)."""
        return self.runs[0][1]


@dataclass
class SweepPlan:
    """A dry run's result: `source` the sweep file, `host` its name, `gpu_plan` TP degree ->
    Allocation ({} without an inventory), `starts` (PlannedStart), `n_runs` (the runs planned),
    `notes` (what was not checked and why), `refused` (a Refusal per TP degree the host cannot
    hold; their runs are not in `starts`)."""

    source: str
    host: str
    gpu_plan: dict[int, Allocation]
    starts: list[PlannedStart]
    n_runs: int
    share_server: bool = True
    notes: list[str] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)

    @property
    def n_refused(self) -> int:
        """How many runs the host cannot hold."""
        return sum(len(r.runs) for r in self.refused)


def _check_key(name: str, spec: RunSpec, launch: Any) -> tuple:
    """What a check's result depends on, so equal checks of different starts run once."""
    if name == "model":
        return (name, spec.server.model, spec.server.load_format)
    if name == "drafter":
        return (name, spec.server.drafter, spec.server.load_format)
    if name == "engine_env":
        be = launch.build_env
        return (name, be.build, be.python, repr(be.launcher), tuple(sorted(launch.env.items())))
    if name in ("cuda_init", "gpus_idle"):
        return (name, tuple(g.uuid for g in spec.gpus))
    return (name, launch.port)


def plan_sweep(spec: SweepSpec, inventory: HostInventory | None, host: str = "", *,
               gpu_checks: bool = False, twin_history: Callable[[RunSpec, int], list[float]] | None = None
               ) -> SweepPlan:
    """Plan every run of `spec` on the host whose inventory is `inventory` (None: no GPUs planned)
    and check each server start now (see the module docstring). `gpu_checks`: run the CUDA and
    idle-GPU checks (only meaningful on the host itself). A TP degree the host cannot hold is a
    Refusal in `refused` (its runs are not planned); every other problem is a failure of its
    start. Raises SweepError for unresolved placeholders. The acceptance-controlled twins the file
    asks for (`twin:`) are planned too (benchkit.sweeps.twins.plan_twin; `twin_history(run,
    nights)` gives a point's earlier taus for a twin without a golden tau, none without it); a
    point without a twin is a note saying why."""
    spec.require_resolved()
    fit = spec.fit_on(inventory, host)
    runspecs = list(fit.runs)
    twin_notes = []
    for i, twin in twins.plan_twins(spec, fit.runs, twin_history):
        r = fit.runs[i]
        if twin.spec is not None:
            runspecs.append(twin.spec)
        twin_notes.append(f"{r.server.method} TP{r.server.tp} c{r.workload.concurrency}: {twin.note}")
    plan = SweepPlan(source=spec.source, host=host, gpu_plan=fit.gpu_plan, starts=[], n_runs=len(runspecs),
                     share_server=spec.share_server, refused=fit.refused)
    if inventory is None:
        plan.notes.append(f"no hardware inventory of host {host!r}: GPUs are not planned "
                          "(run `manage.py record_inventory` on it)")
    if not gpu_checks:
        plan.notes.append("GPU checks (CUDA initialisation, idle GPUs) skipped: the host is not this machine")
    plan.notes += twin_notes
    results: dict[tuple, tuple[str, str] | None] = {}
    with tempfile.TemporaryDirectory(prefix="draftboard-dry-run-") as tmp:
        for number, group in enumerate(server_groups(runspecs, spec.share_server), start=1):
            start = PlannedStart(number=number, runs=[(i + 1, runspecs[i]) for i in group])
            _plan_start(start, Path(tmp) / f"start-{number}", gpu_checks, results)
            plan.starts.append(start)
    return plan


def _plan_start(start: PlannedStart, workdir: Path, gpu_checks: bool,
                results: dict[tuple, tuple[str, str] | None]) -> None:
    spec = start.spec
    s = spec.server
    try:
        adapter = adapters.adapter_for(s.engine)
        if not adapter.launched:
            start.build, start.port_note = f"external server {s.endpoint_url}", "the external server's"
            return
        if spec.port is not None:
            start.port, start.port_note = spec.port, "pinned by the sweep file"
        else:
            start.port = runner.choose_port(adapter)
            start.port_note = "free now; a free one is chosen again when the server starts"
        launch = adapter.launch(s, start.port, spec.gpus, seed=spec.workload.seed, workdir=workdir,
                                name_hint="dry-run", acceptance_tau=s.acceptance_tau)
    except (adapters.EngineConfigError, RuntimeError, OSError) as exc:
        start.failures.append(("launch", "config_error", str(exc)))
        return
    start.argv, start.env, start.build = launch.argv, launch.env, launch.build_env.describe()
    for name, check in runner.preflight_checks(spec, adapter, launch):
        if name in ("cuda_init", "gpus_idle") and not gpu_checks:
            continue  # the plan's note says so once
        key = _check_key(name, spec, launch)
        if key not in results:
            try:
                check()
                results[key] = None
            except preflight.PreflightError as exc:
                results[key] = (exc.code, exc.message)
            except adapters.EngineConfigError as exc:  # e.g. an env value --env-file cannot carry
                results[key] = ("config_error", str(exc))
        if results[key] is not None:
            start.failures.append((name, *results[key]))


def _gpus(spec: RunSpec) -> str:
    if not spec.gpus:
        return "none (CPU, or not planned)"
    numa = sorted({g.numa_node for g in spec.gpus if g.numa_node >= 0})
    where = ("CROSSES NUMA nodes " + ",".join(map(str, numa)) if len(numa) > 1
             else f"inside NUMA node {numa[0]}" if numa else "NUMA node unknown")
    return f"{','.join(str(g.index) for g in spec.gpus)} ({where})"


def format_plan(plan: SweepPlan) -> str:
    """The dry run as text: a header, the GPU plan per TP degree, then per server start its
    GPUs, port, argv (shell-quoted, exactly the list that would run), environment, the
    preflight checks failing now and its runs (one line each, with their GPUs), then a tally."""
    lines = [f"Dry run of {plan.source} on host {plan.host}: nothing is stored and no server starts.",
             f"{plan.n_runs} runs in {len(plan.starts)} server starts"
             + (" (runs that differ only in workload share one)" if plan.share_server else "")
             + (f"; {plan.n_refused} more {_runs(plan.n_refused)} REFUSED: the host cannot hold "
                f"{'it' if plan.n_refused == 1 else 'them'} (listed at the end)"
                if plan.refused else "") + "."]
    rows = {tp: f"GPUs {_gpus_of(alloc)}" for tp, alloc in plan.gpu_plan.items()}
    rows.update({r.tp: f"REFUSED: {r.reason}" for r in plan.refused})
    lines += [f"  TP{tp}: {row}" for tp, row in sorted(rows.items())]
    lines += [f"  note: {n}" for n in plan.notes]
    for st in plan.starts:
        s = st.spec.server
        lines += ["", f"server start {st.number}/{len(plan.starts)}: TP{s.tp} {st.runs[0][1].server.method}"
                      f"{' b' + str(s.tree_budget) if s.tree_budget else ''}"
                      f"{' k=' + str(s.num_speculative_tokens) if s.num_speculative_tokens else ''}, {st.build}",
                  f"  GPUs: {_gpus(st.spec)}" + "".join(f"\n        GPU{g.index} {g.uuid} bus {g.pci_bus_id or '?'}"
                                                        for g in st.spec.gpus)]
        if st.port is not None:
            lines.append(f"  port: {st.port} ({st.port_note})")
        if st.argv:
            lines.append(f"  argv: {shlex.join(st.argv)}")
            lines.append("  env (over the worker's environment): "
                         + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(st.env.items())))
        if st.failures:
            lines += [f"  preflight now: FAIL {check}: {code}: {message}" for check, code, message in st.failures]
        else:
            lines.append("  preflight now: every check passes")
        for n, r in st.runs:
            lines.append(f"  run {n}/{plan.n_runs}: {_point(r)} · GPUs {_gpus(r)}")
    tally = Counter(code for st in plan.starts for code in {c for _, c, _ in st.failures})
    lines.append("")
    ranked = sorted(tally.items(), key=lambda kv: (-kv[1], kv[0]))
    lines.append("preflight failures now: "
                 + ("; ".join(f"{code} at {n} of {len(plan.starts)} server starts" for code, n in ranked) or "none"))
    if plan.refused:
        lines += ["", f"REFUSED: {plan.n_refused} {_runs(plan.n_refused)} that host {plan.host} cannot hold (not "
                      "planned above; the sweep cannot be stored as written: start_sweep stores nothing while any run "
                      "is refused):"]
        for refusal in plan.refused:
            lines.append(f"  {refusal}")
            lines += [f"    {_point(r)}" for r in refusal.runs]
    return "\n".join(lines)


def _runs(n: int) -> str:
    return "run" if n == 1 else "runs"


def _point(r: RunSpec) -> str:
    """`auto b15 TP4 concurrency 8 input 128 output 1024 repeat 0` (one run of the plan; a twin says
    its pinned tau)."""
    w = r.workload
    return (f"{r.server.method}{' b' + str(r.server.tree_budget) if r.server.tree_budget else ''} TP{r.server.tp} "
            f"concurrency {w.concurrency} input {w.input_len} output {w.output_len} repeat {r.repeat_index}"
            + (f" · twin, acceptance pinned at tau {r.server.acceptance_tau:g}" if r.server.acceptance_tau else ""))


def _gpus_of(alloc: Allocation) -> str:
    if not alloc.indices:
        return "none (" + alloc.reason + ")"
    numa = sorted({n for n in alloc.numa_nodes if n >= 0})
    where = ("CROSSES NUMA nodes " + ",".join(map(str, numa)) if alloc.crosses_numa
             else f"inside NUMA node {numa[0]}" if numa else "NUMA node unknown")
    return f"{','.join(map(str, alloc.indices))} ({where}; {alloc.reason})"
