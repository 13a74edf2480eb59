"""Thin models: hosts and their hardware history, sweeps, runs, metrics, raw request logs.

Behaviour lives in `runs.services` (writes) and `runs.selectors` (reads); state changes go
through `runs.services.transitions.transition`, never through `save()`.
"""

from __future__ import annotations

import shlex

from django.db import models
from django.db.models import Q

from benchkit.measure.metrics import METRIC_FIELDS, MetricField
from benchkit.methods import method_label


class Host(models.Model):
    """A machine that runs benchmarks; its Celery worker consumes the queue `host.<name>`."""

    name = models.CharField(max_length=200, unique=True)
    quarantined = models.BooleanField(default=False)
    quarantine_reason = models.TextField(blank=True)
    quarantined_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name

    @property
    def queue(self) -> str:
        """The Celery queue this host's worker consumes."""
        return f"host.{self.name}"


class HardwareSnapshot(models.Model):
    """One inventory of a host (benchkit.hosts.inventory.HostInventory as JSON in `data`).

    `fingerprint` hashes what makes results comparable (GPU model and count, driver, CUDA,
    topology); `changed` is True when it differs from the host's previous snapshot.
    """

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="snapshots")
    taken_at = models.DateTimeField(auto_now_add=True)
    fingerprint = models.CharField(max_length=64)
    changed = models.BooleanField(default=False)
    gpu_count = models.PositiveIntegerField(default=0)
    gpu_name = models.CharField(max_length=200, blank=True)
    driver_version = models.CharField(max_length=100, blank=True)
    cuda_version = models.CharField(max_length=100, blank=True)
    cpu_model = models.CharField(max_length=300, blank=True)
    data = models.JSONField()

    class Meta:
        ordering = ["-taken_at"]
        indexes = [models.Index(fields=["host", "-taken_at"], name="snapshot_host_latest")]

    def __str__(self) -> str:
        return f"{self.host} @ {self.taken_at:%Y-%m-%d %H:%M}"


class Gpu(models.Model):
    """One GPU as a snapshot saw it. NUMA node -1 means unknown."""

    snapshot = models.ForeignKey(HardwareSnapshot, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveIntegerField()
    uuid = models.CharField(max_length=100)
    pci_bus_id = models.CharField(max_length=40, blank=True)
    name = models.CharField(max_length=200, blank=True)
    memory_total_mib = models.PositiveIntegerField(null=True, blank=True)
    numa_node = models.IntegerField(default=-1)

    class Meta:
        ordering = ["snapshot", "index"]
        constraints = [models.UniqueConstraint(fields=["snapshot", "index"], name="gpu_unique_index_per_snapshot")]

    def __str__(self) -> str:
        return f"GPU{self.index} {self.name} {self.uuid}"


class Sweep(models.Model):
    """A named grid of runs (from a sweeps/*.yaml file or the admin); `spec` is the parsed file."""

    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    host = models.ForeignKey(Host, on_delete=models.PROTECT, related_name="sweeps")
    source = models.CharField(max_length=500, blank=True, help_text="sweep file path, or 'admin'")
    spec = models.JSONField(default=dict)
    is_demo = models.BooleanField(default=False, help_text="runs use a demo model with random weights")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} #{self.pk}"


class RunState(models.TextChoices):
    """Run life cycle. Only SUCCEEDED runs feed charts and speedups."""

    QUEUED = "queued"
    PREFLIGHT = "preflight"
    STARTING = "starting"
    WARMING = "warming"
    MEASURING = "measuring"
    STOPPING = "stopping"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INVALIDATED = "invalidated"


ACTIVE_STATES = (RunState.PREFLIGHT, RunState.STARTING, RunState.WARMING, RunState.MEASURING, RunState.STOPPING)


class RunQuerySet(models.QuerySet):
    """Queries every page shares."""

    def counted(self) -> RunQuerySet:
        """Runs that feed charts, speedups and exports: succeeded, with metrics (failed and
        invalidated runs never count; MEASUREMENT.md "When a run does not count")."""
        return self.filter(state=RunState.SUCCEEDED, metrics__isnull=False)


class Run(models.Model):
    """One benchmark point: one server configuration under one workload, executed once.

    `spec` holds the full benchkit.specs.RunSpec; the columns beside it copy what the dashboard
    filters and groups on. Unique on (sweep, point_key): re-running a point overwrites nothing
    and never duplicates it.
    """

    sweep = models.ForeignKey(Sweep, on_delete=models.CASCADE, related_name="runs")
    host = models.ForeignKey(Host, on_delete=models.PROTECT, related_name="runs")
    point_key = models.CharField(max_length=64, help_text="sha256 of the point's canonical JSON")
    spec = models.JSONField()

    engine = models.CharField(max_length=20)
    engine_build = models.CharField(max_length=100, blank=True)
    engine_version = models.CharField(max_length=100, blank=True)
    engine_commit = models.CharField(max_length=64, blank=True)
    provenance = models.JSONField(
        default=dict, blank=True,
        help_text="what the engine's own environment said about itself (benchkit.engines.environment."
                  "check_engine_env): build, launcher, distribution, version, git commit, torch, CUDA")
    model = models.CharField(max_length=500)
    drafter = models.CharField(max_length=500, blank=True)
    is_demo_model = models.BooleanField(default=False)
    method = models.CharField(max_length=30)
    num_speculative_tokens = models.PositiveIntegerField(null=True, blank=True)
    tree_budget = models.PositiveIntegerField(null=True, blank=True)
    tp = models.PositiveIntegerField(default=1)
    gpus = models.JSONField(default=list, blank=True, help_text="[{index, uuid, pci_bus_id, numa_node, name}]")
    gpus_cross_numa = models.BooleanField(default=False)
    concurrency = models.PositiveIntegerField()
    request_rate = models.FloatField(null=True, blank=True, help_text="req/s; empty = closed loop")
    input_len = models.PositiveIntegerField()
    output_len = models.PositiveIntegerField()
    num_prompts = models.PositiveIntegerField()
    dataset = models.CharField(max_length=200, default="random")
    temperature = models.FloatField(default=0.0)
    seed = models.IntegerField(default=0)
    repeat_index = models.PositiveIntegerField(default=0)

    state = models.CharField(max_length=20, choices=RunState.choices, default=RunState.QUEUED)
    failure_reason = models.CharField(max_length=50, blank=True, help_text="machine-readable code")
    failure_message = models.TextField(blank=True)
    invalidated_reason = models.TextField(blank=True)
    suspect = models.BooleanField(default=False)
    suspect_reasons = models.JSONField(default=list, blank=True)

    argv = models.JSONField(default=list, blank=True)
    server_env = models.JSONField(default=dict, blank=True)
    server_log_tail = models.TextField(blank=True)
    server_shared = models.BooleanField(default=False)
    server_port = models.PositiveIntegerField(null=True, blank=True, help_text="the server's main TCP port "
                                              "(pinned in the sweep file, or chosen free at start)")
    progress_done = models.PositiveIntegerField(default=0)
    progress_total = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = RunQuerySet.as_manager()

    class Meta:
        ordering = ["sweep", "id"]
        constraints = [models.UniqueConstraint(fields=["sweep", "point_key"], name="run_unique_point_per_sweep")]
        indexes = [
            # charts: succeeded runs of a sweep
            models.Index(fields=["sweep", "state"], name="run_sweep_state"),
            # "already done": a succeeded run of the same point anywhere
            models.Index(fields=["point_key"], name="run_point_succeeded", condition=Q(state="succeeded")),
        ]

    def __str__(self) -> str:
        return f"run {self.pk} {self.method_label} tp{self.tp} c{self.concurrency}"

    @property
    def method_label(self) -> str:
        """Short name of the decoding configuration (benchkit.methods.method_label): `auto`,
        `linear`, `b15` (DDTree, budget 15), `draft_model k=4`."""
        return method_label(self.method, self.num_speculative_tokens, self.tree_budget)

    @property
    def counts(self) -> bool:
        """True when this run feeds charts and speedups (the per-row form of `Run.objects.counted()`;
        needs `metrics` loaded, e.g. with select_related)."""
        return self.state == RunState.SUCCEEDED and hasattr(self, "metrics")

    @property
    def command_line(self) -> str:
        """The exact argv as one shell-quoted line, for display and copy-paste."""
        return shlex.join(self.argv or [])


class RunTransition(models.Model):
    """History of a run's state changes (written by services.transitions.transition)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="transitions")
    from_state = models.CharField(max_length=20)
    to_state = models.CharField(max_length=20)
    note = models.TextField(blank=True)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "at", "id"]


class RunMetrics(models.Model):
    """Metrics of one run's measured window (MEASUREMENT.md), one row per run.

    One nullable column per field of benchkit.measure.metrics.WindowMetrics (added below from
    `METRIC_FIELDS`: the column is the field, its help text the unit; NULL = unknown, never 0);
    `per_position_acceptance_rate` is the one list among them (a JSON column). Beside them:
    `spec_source` (which counters or tool gave the acceptance figures), `distributions` (the run
    page's samples), `source_tool` and `definitions` (where an imported run's numbers came from
    and what they mean), `extra` (keys of an imported file that draftboard has no column for).
    Written only by runs.services.metrics_store.
    """

    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="metrics")
    spec_source = models.CharField(max_length=300, blank=True, help_text="where the acceptance figures come from")
    distributions = models.JSONField(default=dict, blank=True)
    source_tool = models.CharField(max_length=50, default="draftboard")
    definitions = models.JSONField(default=dict, blank=True)
    extra = models.JSONField(default=dict, blank=True, help_text="source-file keys without a column")
    computed_at = models.DateTimeField(auto_now=True)


_COLUMN_TYPES = {int: models.BigIntegerField, float: models.FloatField, bool: models.BooleanField,
                 list: models.JSONField}


def _metric_column(f: MetricField) -> models.Field:
    """The nullable column of one WindowMetrics field: its label as verbose name, its unit as help text."""
    return _COLUMN_TYPES[f.kind](null=True, blank=True, verbose_name=f.label, help_text=f.unit)


for _f in METRIC_FIELDS:
    RunMetrics.add_to_class(_f.name, _metric_column(_f))


class RequestLogBlob(models.Model):
    """The run's per-request event logs, compact (benchkit.measure.logs.encode_logs), warmup included."""

    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="request_logs")
    data = models.BinaryField()
    n_requests = models.PositiveIntegerField()
    n_warmup = models.PositiveIntegerField()
    window_start_ns = models.BigIntegerField()
    window_end_ns = models.BigIntegerField()


class GpuLease(models.Model):
    """A GPU held by a run. Unique per (host, GPU UUID): two runs never hold one GPU at once.

    A lease expires at `expires_at` (past the run's own time limit), so a worker that dies
    leaves a reservation that frees itself; see services.leases.
    """

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="leases")
    gpu_uuid = models.CharField(max_length=100)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="leases")
    acquired_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["host", "gpu_uuid"], name="gpu_lease_one_holder")]
