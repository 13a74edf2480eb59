"""Create sweeps from sweep files and enqueue their runs on the host's queue."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from django.conf import settings
from django.db import transaction

from benchkit import allocation, sweepspec
from benchkit.inventory import HostInventory
from benchkit.runner import server_key
from benchkit.specs import GpuRef, RunSpec
from runs.models import Host, Run, Sweep
from runs.services.inventory import latest_inventory

HOST_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


class HostNameError(ValueError):
    """A host name that cannot name a Celery queue and a URL (letters, digits, . _ -; <= 100)."""


class BrokerUnavailable(RuntimeError):
    """The Celery broker does not answer, so runs could not be queued; nothing was stored."""


def host_name(name: str | None = None) -> str:
    """`name` (default: settings.DRAFTBOARD_HOST), checked. Raises HostNameError for a name
    that is not 1-100 letters, digits, '.', '_' or '-' (it becomes the queue `host.<name>` and
    a URL path segment)."""
    name = name or settings.DRAFTBOARD_HOST
    if not HOST_NAME_RE.match(name):
        raise HostNameError(f"host name {name!r} (DRAFTBOARD_HOST or --host): use 1-100 letters, digits, "
                            "'.', '_' or '-', starting with a letter or digit")
    return name


def get_or_create_host(name: str | None = None) -> Host:
    """The Host row for `name` (default: settings.DRAFTBOARD_HOST), created on first use.
    Raises HostNameError (see host_name)."""
    host, _ = Host.objects.get_or_create(name=host_name(name))
    return host


def parse_substitutions(items: list[str]) -> dict[str, str]:
    """`--set KEY=VALUE` options as a dict. Raises ValueError naming an item without '='."""
    subs = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE")
        key, value = item.split("=", 1)
        subs[key] = value
    return subs


def check_broker(timeout_s: float = 5.0) -> None:
    """Raise BrokerUnavailable unless the Celery broker accepts a connection within `timeout_s`."""
    from benchsite.celery import app

    url = app.conf.broker_url
    try:
        with app.connection_for_write(url) as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, timeout=timeout_s)
    except Exception as exc:  # kombu raises OperationalError, OSError, or its own errors
        raise BrokerUnavailable(f"the Celery broker {url} does not answer ({exc}); start it (`make demo` starts a "
                                "private Redis) or store the sweep without queueing it (--no-enqueue)") from None


def _gpu_assigner(inventory: HostInventory | None, tps: list[int], pinned: dict[int, list[int]]):
    """Give every run of one TP degree the same GPU set: the sweep's pinned indices where it
    pins them, else a topology-aware choice (benchkit.allocation). Returns None on a host
    without GPUs (CPU servers take no GPUs). Raises allocation.AllocationError when the host
    has too few GPUs or a pinned index does not exist."""
    if inventory is None:
        return None
    if not inventory.gpus:
        if max(tps) > 1:
            raise allocation.AllocationError(f"host {inventory.hostname} has no GPUs (its latest inventory), so TP "
                                              f"{max(tps)} cannot run there; record the inventory of the GPU host")
        return None
    groups = {tp: allocation.choose_gpus(inventory, tp, pinned=pinned.get(tp)) for tp in sorted(set(tps))}

    def assign(tp: int) -> list[GpuRef]:
        return groups[tp].gpu_refs()

    return assign


def point_hash(spec: RunSpec) -> str:
    """sha256 hex of benchkit.sweepspec.point_key (the canonical JSON of the point): the
    run's natural key within a sweep, short enough for an index."""
    return hashlib.sha256(sweepspec.point_key(spec).encode()).hexdigest()


def run_fields(spec: RunSpec) -> dict:
    """Run columns copied from a RunSpec (what the dashboard filters and groups on)."""
    s, w = spec.server, spec.workload
    numa = {g.numa_node for g in spec.gpus if g.numa_node >= 0}
    return dict(
        engine=s.engine, engine_build=s.engine_build, model=s.model, drafter=s.drafter,
        is_demo_model=s.is_demo_model, method=s.method, num_speculative_tokens=s.num_speculative_tokens,
        tree_budget=s.tree_budget, tp=s.tp, gpus=[g.__dict__ for g in spec.gpus],
        gpus_cross_numa=len(numa) > 1, concurrency=w.concurrency, request_rate=w.request_rate,
        input_len=w.input_len, output_len=w.output_len, num_prompts=w.num_prompts,
        dataset=w.dataset if w.dataset == "random" else f"{w.dataset}:{w.dataset_path}",
        temperature=w.temperature, seed=w.seed, repeat_index=spec.repeat_index,
    )


def create_sweep(spec: sweepspec.SweepSpec, host: Host, source: str, enqueue: bool = True) -> Sweep:
    """Store `spec` as a Sweep with one queued Run per grid point and enqueue them on commit.

    GPUs are planned from the host's latest hardware snapshot (every run of one TP degree
    gets the same GPUs). Raises sweepspec.SweepError when placeholders are left unresolved
    and allocation.AllocationError when the host has too few GPUs (or none, for TP > 1), and
    BrokerUnavailable when runs are to be queued but the broker does not answer; nothing is
    stored then.
    """
    spec.require_resolved()
    if enqueue:
        check_broker()
    inventory = latest_inventory(host)
    runspecs = spec.expand(assign_gpus=_gpu_assigner(inventory, spec.grid["tp"], spec.pinned_gpus))
    is_demo = any(r.server.is_demo_model for r in runspecs)
    with transaction.atomic():
        sweep = Sweep.objects.create(name=spec.name, description=spec.description, host=host, source=source,
                                     spec=spec.to_dict(), is_demo=is_demo)
        runs = Run.objects.bulk_create([
            Run(sweep=sweep, host=host, point_key=point_hash(r), spec=r.to_dict(), **run_fields(r))
            for r in runspecs
        ])
        if enqueue:
            ids = [r.pk for r in Run.objects.filter(sweep=sweep).order_by("id")]
            transaction.on_commit(lambda: enqueue_runs(ids, host.queue, spec.share_server))
    assert len(runs) == len(runspecs)
    return sweep


def create_sweep_from_file(path: str | Path, host_name: str | None = None,
                           substitutions: dict[str, str] | None = None, enqueue: bool = True) -> Sweep:
    """Parse the sweep file at `path` with `{name}` placeholders replaced from `substitutions`
    and call create_sweep. Raises sweepspec.SweepError naming the file, line and field."""
    spec = sweepspec.load_sweep_file(Path(path), variables=substitutions)
    return create_sweep(spec, get_or_create_host(host_name), source=str(path), enqueue=enqueue)


def server_groups(runs: list[Run], share_server: bool = True) -> list[list[int]]:
    """Run ids grouped for execution: consecutive runs (in id order, which is the sweep's
    expansion order) with the same benchkit.runner.server_key share one server start when
    `share_server`; otherwise every run is its own group."""
    groups: list[list[int]] = []
    last_key = None
    for run in sorted(runs, key=lambda r: r.pk):
        key = server_key(RunSpec.from_dict(run.spec))
        if share_server and groups and key == last_key:
            groups[-1].append(run.pk)
        else:
            groups.append([run.pk])
        last_key = key
    return groups


def enqueue_runs(run_ids: list[int], queue: str, share_server: bool = True) -> None:
    """Send the runs to `queue` as execute_runs tasks, one per server group (call only after
    the rows are committed). Each task has a soft time limit of its runs' summed bound
    (leases.total_limit_s) and a hard one two minutes later."""
    from runs.services.leases import total_limit_s
    from runs.tasks import execute_runs_task

    runs = list(Run.objects.filter(pk__in=run_ids))
    by_id = {r.pk: r for r in runs}
    for group in server_groups(runs, share_server):
        limit = sum(total_limit_s(RunSpec.from_dict(by_id[i].spec).limits) for i in group)
        execute_runs_task.apply_async(args=[group], queue=queue, soft_time_limit=limit, time_limit=limit + 120)
