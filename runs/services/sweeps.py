"""Create sweeps from sweep files and enqueue their runs on the host's queue."""

from __future__ import annotations

import logging
from datetime import date
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError, transaction

from benchkit import config_record
from benchkit.hosts.inventory import collect_inventory
from benchkit.specs import RunSpec
from benchkit.sweeps import dryrun, sweepfile, twins
from runs.models import Host, Run, RunMetrics, RunState, Sweep
from runs.selectors import latest_inventory, series_sweeps
from runs.services.dispatch import check_broker, enqueue_runs
from runs.services.hosts import get_or_create_host
from runs.services.hosts import host_name as host_name_checked
from runs.services.policy import check_overrides, not_allowed
from runs.services.transitions import NEW, create

log = logging.getLogger(__name__)


def run_fields(spec: RunSpec) -> dict:
    """Run columns copied from a RunSpec (what the dashboard filters and groups on): every record
    field with `run_column` (benchkit.config_record), the dataset as `kind:path` but for random,
    the GPUs, whether they span NUMA nodes and the repeat index."""
    s, w = spec.server, spec.workload
    numa = {g.numa_node for g in spec.gpus if g.numa_node >= 0}
    columns = {f.name: getattr(s if f.part == "server" else w, f.name) for f in config_record.run_columns()}
    return dict(
        columns, gpus=[g.__dict__ for g in spec.gpus], gpus_cross_numa=len(numa) > 1,
        dataset=w.dataset if w.dataset == "random" else f"{w.dataset}:{w.dataset_path}",
        repeat_index=spec.repeat_index,
    )


def point_tau_history(host: Host, series: str, point_key: str, nights: int) -> list[float]:
    """The mean acceptance length of the counted runs of point `point_key` over the last `nights`
    nights of the series (host, `series`), oldest first (one value per run; two queries)."""
    ids = [s.pk for s in series_sweeps(host.pk, series, limit=nights)]
    rows = (RunMetrics.objects.filter(run__in=Run.objects.counted().filter(sweep_id__in=ids, point_key=point_key),
                                      acceptance_length__isnull=False)
            .order_by("run__sweep__created_at", "run_id").values_list("acceptance_length", flat=True))
    return [float(v) for v in rows]


def plan_twins(spec: sweepfile.SweepSpec, host: Host, runspecs: list[RunSpec]) -> list[tuple[int, twins.TwinPlan]]:
    """(index into `runspecs`, plan) for every real run whose method variant asks for a twin
    (`spec.twin_for`): its reference tau from the file or the point's history on `host`
    (`point_tau_history`), checked by the engine (benchkit.sweeps.twins.plan_twin). A point
    without one is logged ("no twin: why") and runs alone."""
    out = twins.plan_twins(spec, runspecs,
                           lambda r, nights: point_tau_history(host, spec.name, r.point_key(), nights))
    for i, plan in out:
        if plan.spec is None:
            log.warning("sweep %s, host %s, %s: %s", spec.name, host.name, runspecs[i].server.method, plan.note)
    return out


def target_hosts(spec: sweepfile.SweepSpec, host: Host | None, hosts: list[Host] | None = None) -> list[Host]:
    """The hosts a sweep runs on, each running the whole grid: the file's `hosts:` (created on
    first use) when it names any, else `hosts` (several --host, the admin form's selection), else
    [`host`]. Raises ValueError when none is named, HostNameError for a bad name."""
    if spec.hosts:
        chosen = [get_or_create_host(name) for name in spec.hosts]
    elif hosts:
        chosen = list(hosts)
    elif host is not None:
        chosen = [host]
    else:
        raise ValueError("the sweep names no host: give --host or `hosts:` in the file")
    return list({h.pk: h for h in chosen}.values())


def create_sweep(spec: sweepfile.SweepSpec, host: Host | None, source: str, enqueue: bool = True, *, user=None,
                 schedule: str = "", window: date | None = None, hosts: list[Host] | None = None) -> Sweep:
    """Store `spec` as a Sweep with one queued Run per grid point and host, and enqueue each host's
    runs on that host's queue (`host.<name>`) on commit.

    The hosts are target_hosts(spec, host, hosts): several hosts each run the whole grid, the
    sweep belongs to the first (its series), every run records its own host. GPUs are planned per
    host from that host's latest hardware snapshot (every run of one TP degree on one host gets
    the same GPUs). Raises sweepfile.SweepError when placeholders are left unresolved or a
    categorized dataset is refused (spec.check_datasets: its `file:line: field: reason`; a file
    missing here is left to the worker's preflight when a target host is another machine),
    sweepfile.PointsRefused (a SweepError) listing every TP degree a host cannot hold (more GPUs
    than it has, a pinned GPU it lacks, a NUMA crossing the file forbids; each as `file:line:
    field: host NAME: reason`), and BrokerUnavailable when runs are to be queued but the broker
    does not answer; nothing is stored then.

    Each run is created by the move `new -> queued` (runs.services.transitions.create), its
    history noting where it came from. `user` (a Django user) entered the sweep on the web: its
    server.env and extra arguments must pass runs.services.policy (else
    policy.OverrideNotAllowed, nothing stored), the sweep records who created it, and each run's
    history says so, with those overrides. `schedule`
    and `window` name the schedule window of a nightly sweep (unique together: IntegrityError
    for a second sweep of one window, see create_sweep_for_window).
    """
    spec.require_resolved()
    targets = target_hosts(spec, host, hosts)
    fits = [(h, spec.fit_on(latest_inventory(h), h.name)) for h in targets]
    refused = [r for _, fit in fits for r in fit.refused]
    if refused:
        raise sweepfile.PointsRefused(refused)
    if enqueue:
        check_broker()
    planned: list[tuple[Host, list[RunSpec]]] = [(h, fit.runs) for h, fit in fits]
    local = all(h.name == settings.DRAFTBOARD_HOST for h in targets)
    spec.check_datasets([r for _, specs in planned for r in specs], missing_ok=not local)
    twin_plans = {h.pk: [(specs[i], p) for i, p in plan_twins(spec, h, specs) if p.spec is not None]
                  for h, specs in planned}
    runspecs = [r for _, specs in planned for r in specs]
    overrides = check_overrides(runspecs, user) if user is not None else None
    is_demo = any(r.server.is_demo_model for r in runspecs)
    with transaction.atomic():
        sweep = Sweep.objects.create(name=spec.name, description=spec.description, host=targets[0], source=source,
                                     spec=spec.to_dict(), is_demo=is_demo, schedule=schedule, window=window,
                                     created_by=user.get_username() if user is not None else "")
        note = f"created from {source}"
        if user is not None:
            note = f"created by {sweep.created_by} ({source})"
            if overrides:
                outside = " (outside the allowlists: allowed for a superuser)" if not_allowed(overrides) else ""
                note += f"; {overrides.describe()}{outside}"
        create([Run(sweep=sweep, host=h, point_key=r.point_key(), spec=r.to_dict(), **run_fields(r))
                for h, specs in planned for r in specs], NEW, RunState.QUEUED, note)
        for h in targets:
            if twin_plans[h.pk]:
                _create_twins(sweep, h, twin_plans[h.pk], note)
        ids_by_host = {h.pk: [] for h in targets}
        for pk, host_id in Run.objects.filter(sweep=sweep).order_by("id").values_list("id", "host_id"):
            ids_by_host[host_id].append(pk)
        ids = [pk for group in ids_by_host.values() for pk in group]
        assert len(ids) == len(runspecs) + sum(map(len, twin_plans.values()))
        if enqueue:
            def send() -> None:
                for h in targets:
                    enqueue_runs(ids_by_host[h.pk], h.queue, spec.share_server)

            transaction.on_commit(send)
    return sweep


def _create_twins(sweep: Sweep, host: Host, plans: list[tuple[RunSpec, twins.TwinPlan]], note: str) -> None:
    """Store each planned twin as a queued run of `sweep` on `host`, linked to its real run
    (`twin_of`, by the real run's point key)."""
    real = dict(Run.objects.filter(sweep=sweep, host=host).values_list("point_key", "pk"))
    for r, p in plans:  # one create each: the twin's history says what it pins and how
        create([Run(sweep=sweep, host=host, point_key=p.spec.point_key(), spec=p.spec.to_dict(),
                    **run_fields(p.spec), twin_of_id=real[r.point_key()], pinned_tau=p.tau,
                    pinned_tau_source=p.source)], NEW, RunState.QUEUED, f"{note}; twin of run {real[r.point_key()]}: "
               f"{p.note}")


def dry_run_sweep_file(path: str | Path, host_name: str | None = None,
                       substitutions: dict[str, str] | None = None) -> dryrun.SweepPlan:
    """What `create_sweep_from_file` would queue, planned and checked now, storing nothing
    (benchkit.sweeps.dryrun.plan_sweep): the GPUs come from the host's latest recorded inventory
    (none recorded and the host is this machine: collected now); the GPU checks run only when the
    host is this machine (settings.DRAFTBOARD_HOST). Runs the host cannot hold are listed in the
    plan's `refused`, the others planned. Raises SweepError (a bad file, unresolved
    placeholders) and HostNameError as create_sweep_from_file does."""
    spec = sweepfile.load_sweep_file(Path(path), variables=substitutions)
    name = host_name_checked(host_name)
    this_machine = name == host_name_checked(None)
    host = Host.objects.filter(name=name).first()
    inventory = latest_inventory(host) if host else None
    if inventory is None and this_machine:
        inventory = collect_inventory()
    history = (lambda r, nights: point_tau_history(host, spec.name, r.point_key(), nights)) if host else None
    return dryrun.plan_sweep(spec, inventory, name, gpu_checks=this_machine, twin_history=history)


def _caller_hosts(spec: sweepfile.SweepSpec, host_name: str | list[str] | None) -> tuple[Host | None, list[Host]]:
    """(host, hosts) for create_sweep from a caller's host name(s): none when the file names its
    `hosts:` (they win), else the names given (default: DRAFTBOARD_HOST)."""
    if spec.hosts:
        return None, []
    names = [host_name] if isinstance(host_name, str) or host_name is None else list(host_name)
    hosts = [get_or_create_host(n) for n in names or [None]]
    return hosts[0], hosts


def create_sweep_from_file(path: str | Path, host_name: str | list[str] | None = None,
                           substitutions: dict[str, str] | None = None, enqueue: bool = True) -> Sweep:
    """Parse the sweep file at `path` with `{name}` placeholders replaced from `substitutions`
    and call create_sweep on the file's `hosts:`, else on `host_name` (one name or several;
    default DRAFTBOARD_HOST). Raises sweepfile.SweepError naming the file, line and field."""
    spec = sweepfile.load_sweep_file(Path(path), variables=substitutions)
    host, hosts = _caller_hosts(spec, host_name)
    return create_sweep(spec, host, source=str(path), enqueue=enqueue, hosts=hosts)


def create_sweep_for_window(path: str | Path, host_name: str | None, substitutions: dict[str, str] | None,
                            schedule: str, window: date | None) -> tuple[Sweep, bool]:
    """Create the sweep of schedule `schedule` for its window `window` (UTC date) from the file
    at `path`, unless one exists: returns (sweep, created). Two sends of one window (two beat
    processes, a beat resync) give one sweep; the second is a logged no-op. Without a schedule
    window (a message not sent by beat) it always creates, as create_sweep_from_file."""
    if not (schedule and window):
        return create_sweep_from_file(path, host_name=host_name, substitutions=substitutions), True
    existing = Sweep.objects.filter(schedule=schedule, window=window).first()
    if existing is None:
        spec = sweepfile.load_sweep_file(Path(path), variables=substitutions)
        try:
            host, hosts = _caller_hosts(spec, host_name)
            return create_sweep(spec, host, source=str(path), schedule=schedule, window=window, hosts=hosts), True
        except IntegrityError:  # another worker created it meanwhile (the unique constraint)
            existing = Sweep.objects.filter(schedule=schedule, window=window).first()
            if existing is None:
                raise
    log.warning("schedule %r, window %s: sweep %s already exists; this send created nothing (a second beat "
                "or a resync)", schedule, window, existing.pk)
    return existing, False
