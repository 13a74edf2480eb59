"""Thin models: hosts and their hardware history, sweeps, runs, metrics, raw request logs.

Behaviour lives in `runs.services` (writes) and `runs.selectors` (reads); state changes go
through `runs.services.transitions.transition`, never through `save()`.
"""

from __future__ import annotations

import functools
import shlex

from django.db import models
from django.db.models import Q

from benchkit.formats.limits import TEXT_LIMITS
from benchkit.measure.metrics import METRIC_FIELDS, MetricField
from benchkit.methods import method_label


class Host(models.Model):
    """A machine that runs benchmarks; its Celery worker consumes the queue `host.<name>`.

    `worker_seen_at` is the last heartbeat of that worker (runs.worker writes it; the home page
    shows the worker alive while it is recent, see selectors.hosts_with_workers)."""

    name = models.CharField(max_length=200, unique=True)
    quarantined = models.BooleanField(default=False)
    quarantine_reason = models.TextField(blank=True)
    quarantined_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    worker_name = models.CharField(max_length=200, blank=True, help_text="Celery node name of the last worker seen")
    worker_seen_at = models.DateTimeField(null=True, blank=True, help_text="last heartbeat of the host's worker")

    class Meta:
        permissions = [("clear_quarantine", "Can clear a host's quarantine (it takes runs again)")]

    def __str__(self) -> str:
        return self.name

    @property
    def queue(self) -> str:
        """The Celery queue this host's worker consumes."""
        return f"host.{self.name}"


class HostToken(models.Model):
    """A secret that lets one offline host send bundles to `POST /api/ingest/` (runs.services.ingest).

    Only the sha256 (hex) of the token is stored; the token itself is shown once, when an
    administrator creates it (admin), and is revoked (never deleted, for audit) by setting
    `revoked_at`. A bundle sent with it must name the token's host."""

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="tokens")
    name = models.CharField(max_length=100, help_text="what the token is for, e.g. the machine or person using it")
    token_sha256 = models.CharField(max_length=64, unique=True, editable=False,
                                    help_text="sha256 of the token (hex); the token itself is not stored")
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.CharField(max_length=150, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["host", "-created_at"]
        permissions = [("revoke_hosttoken", "Can revoke host tokens (offline ingest)")]

    def __str__(self) -> str:
        return f"{self.host} / {self.name}"

    @property
    def active(self) -> bool:
        """Not revoked."""
        return self.revoked_at is None


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
    created_by = models.CharField(max_length=150, blank=True, help_text="user who entered it (admin); empty = a "
                                  "command or a schedule")
    schedule = models.CharField(max_length=200, blank=True, help_text="the periodic schedule that created it")
    window = models.DateField(null=True, blank=True, help_text="UTC date of the schedule window it belongs to")
    checks_queued_at = models.DateTimeField(
        null=True, blank=True, help_text="when its last run ended and the lossless check and regression detection "
        "were queued (once: runs.services.regressions.runs_finished)")

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            # a nightly series is the sweeps of one name on one host: its latest night, the
            # previous one, the last N nights (runs.selectors.series_sweeps, latest_per_series)
            models.Index(fields=["host", "name", "-created_at"], name="sweep_series_latest"),
        ]
        constraints = [
            # one sweep per schedule window: a second beat send of the same night is refused
            models.UniqueConstraint(fields=["schedule", "window"], condition=Q(window__isnull=False),
                                    name="sweep_one_per_schedule_window"),
        ]
        permissions = [("create_sweep", "Can create sweeps from YAML (queues runs on GPU hosts)")]

    def __str__(self) -> str:
        return f"{self.name} #{self.pk}"


class ResultFile(models.Model):
    """A result file imported from another tool (runs.services.imports), one row per distinct
    content: unique on the sha256 of its bytes, so importing the same file again reports its
    runs instead of storing them twice. Its runs point here (`Run.result_file`)."""

    sha256 = models.CharField(max_length=64, help_text="sha256 of the file's bytes (hex)")
    name = models.CharField(max_length=TEXT_LIMITS["file_name"], help_text="path the file was imported from")
    size_bytes = models.BigIntegerField()
    source_tool = models.CharField(max_length=TEXT_LIMITS["source_tool"])
    sweep = models.ForeignKey(Sweep, on_delete=models.CASCADE, related_name="result_files")
    imported_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["sweep", "id"]
        constraints = [models.UniqueConstraint(fields=["sha256"], name="result_file_unique_content")]

    def __str__(self) -> str:
        return f"{self.name} ({self.sha256[:12]})"


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
        invalidated runs never count; MEASUREMENT.md "When a run does not count"). An
        acceptance-controlled twin (`twin_of` set) never counts: its acceptance is forced, so its
        figures are read beside its real run only (`twins`)."""
        return self.filter(state=RunState.SUCCEEDED, metrics__isnull=False, twin_of__isnull=True)

    def twins(self) -> RunQuerySet:
        """Succeeded acceptance-controlled twins with metrics (issue 21): what `counted` leaves out."""
        return self.filter(state=RunState.SUCCEEDED, metrics__isnull=False, twin_of__isnull=False)


class Run(models.Model):
    """One benchmark point: one server configuration under one workload, executed once.

    `spec` holds the full benchkit.specs.RunSpec; the columns beside it copy what the dashboard
    filters and groups on. Unique on (sweep, host, point_key): re-running a point overwrites nothing
    and never duplicates it; a sweep on several hosts has each point once per host.
    """

    sweep = models.ForeignKey(Sweep, on_delete=models.CASCADE, related_name="runs")
    host = models.ForeignKey(Host, on_delete=models.PROTECT, related_name="runs")
    point_key = models.CharField(max_length=64, help_text="sha256 of the point's canonical JSON")
    spec = models.JSONField()

    engine = models.CharField(max_length=20)
    engine_build = models.CharField(max_length=100, blank=True)
    engine_version = models.CharField(max_length=TEXT_LIMITS["engine_version"], blank=True)
    engine_commit = models.CharField(max_length=TEXT_LIMITS["engine_commit"], blank=True)
    provenance = models.JSONField(
        default=dict, blank=True,
        help_text="what the engine's own environment said about itself (benchkit.engines.environment."
                  "check_engine_env): build, launcher, distribution, version, git commit, torch, CUDA")
    model = models.CharField(max_length=TEXT_LIMITS["model"])
    drafter = models.CharField(max_length=500, blank=True)
    is_demo_model = models.BooleanField(default=False)
    method = models.CharField(max_length=30)
    num_speculative_tokens = models.PositiveIntegerField(null=True, blank=True)
    tree_budget = models.PositiveIntegerField(null=True, blank=True)
    tp = models.PositiveIntegerField(default=1)
    gpus = models.JSONField(default=list, blank=True, help_text="[{index, uuid, pci_bus_id, numa_node, name}]")
    gpus_cross_numa = models.BooleanField(default=False)
    # Empty (NULL) only for an imported run whose file does not say (missing is not zero).
    concurrency = models.PositiveIntegerField(null=True, blank=True, help_text="empty = not in the imported file")
    request_rate = models.FloatField(null=True, blank=True, help_text="req/s; empty = closed loop")
    input_len = models.PositiveIntegerField(null=True, blank=True, help_text="empty = not in the imported file")
    output_len = models.PositiveIntegerField(null=True, blank=True, help_text="empty = not in the imported file")
    num_prompts = models.PositiveIntegerField(null=True, blank=True, help_text="empty = not in the imported file")
    dataset = models.CharField(max_length=TEXT_LIMITS["dataset"], default="random", blank=True,
                               help_text="empty = not in the imported file")
    temperature = models.FloatField(default=0.0)
    seed = models.IntegerField(default=0)
    repeat_index = models.PositiveIntegerField(default=0)

    state = models.CharField(max_length=20, choices=RunState.choices, default=RunState.QUEUED)
    failure_reason = models.CharField(max_length=TEXT_LIMITS["failure_reason"], blank=True,
                                      help_text="machine-readable code")
    failure_message = models.TextField(blank=True)
    invalidated_reason = models.TextField(blank=True)
    suspect = models.BooleanField(default=False)
    suspect_reasons = models.JSONField(default=list, blank=True)

    argv = models.JSONField(default=list, blank=True)
    server_env = models.JSONField(default=dict, blank=True)
    server_log_tail = models.TextField(blank=True)
    server_shared = models.BooleanField(default=False)
    client_options = models.JSONField(
        default=dict, blank=True,
        help_text="what the load client asked of the server (benchkit.measure.loadclient.ClientOptions, chosen "
                  "from the engine's capabilities): token ids, usage per message, kernel stamps, outputs kept")
    result_file = models.ForeignKey(ResultFile, null=True, blank=True, on_delete=models.PROTECT, related_name="runs",
                                    help_text="the file an imported run came from")
    server_port = models.PositiveIntegerField(null=True, blank=True, help_text="the server's main TCP port "
                                              "(pinned in the sweep file, or chosen free at start)")
    progress_done = models.PositiveIntegerField(default=0)
    progress_total = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    # delivery and supervision (runs.services.dispatch, runs.services.supervision)
    sent_at = models.DateTimeField(null=True, blank=True, help_text="when its task was (last) handed to the broker")
    worker_node = models.CharField(max_length=200, blank=True, help_text="machine of the worker that claimed it")
    worker_pid = models.IntegerField(null=True, blank=True, help_text="pid of the worker process executing it")
    server_pgid = models.IntegerField(null=True, blank=True, help_text="process-group id of its managed server")
    server_tag = models.CharField(max_length=64, blank=True,
                                  help_text="DRAFTBOARD_SERVER_TAG of its server start (shared by its server group)")
    heartbeat_at = models.DateTimeField(null=True, blank=True, help_text="last heartbeat of the executing worker")
    deadline_at = models.DateTimeField(null=True, blank=True, help_text="claim time + the runs' bound (run_timeout)")
    # offline hosts (runs.services.ingest): the UUID the run got in its bundle; ingesting it again is a no-op
    run_uuid = models.UUIDField(null=True, blank=True, unique=True, editable=False,
                                help_text="UUID of a run ingested from an offline bundle")
    # acceptance-controlled twin (issue 21, benchkit.sweeps.twins): the real run it pins
    twin_of = models.ForeignKey("self", null=True, blank=True, on_delete=models.CASCADE, related_name="twins",
                                help_text="the real run this twin measures with acceptance pinned")
    pinned_tau = models.FloatField(null=True, blank=True, help_text="a twin's forced mean acceptance length "
                                   "(tokens per verify pass)")
    pinned_tau_source = models.CharField(max_length=20, blank=True, help_text="golden (the file's tau) or "
                                         "median (of the point's last nights)")

    objects = RunQuerySet.as_manager()

    class Meta:
        ordering = ["sweep", "id"]
        constraints = [models.UniqueConstraint(fields=["sweep", "host", "point_key"],
                                               name="run_unique_point_per_host_per_sweep")]
        indexes = [
            # charts: succeeded runs of a sweep
            models.Index(fields=["sweep", "state"], name="run_sweep_state"),
            # "already done": a succeeded run of the same point anywhere
            models.Index(fields=["point_key"], name="run_point_succeeded", condition=Q(state="succeeded")),
            # trend page: succeeded runs of the last N nights at the chosen lengths and concurrency
            # (runs.selectors.history_points with filters), without reading the other workloads
            models.Index(fields=["sweep", "output_len", "input_len", "concurrency"], name="run_history_workload",
                         condition=Q(state="succeeded")),
            # the reaper (active runs of a host) and the reconciler (queued runs of a host)
            models.Index(fields=["host", "state"], name="run_host_state"),
            # the admin's run list at 1M runs (newest first, issue 22): each filter walks its own index
            *(models.Index(fields=[f, "-id"], name=f"run_admin_{f}") for f in
              ("state", "failure_reason", "method", "engine", "tp", "concurrency", "host")),
            models.Index(fields=["-id"], name="run_admin_suspect", condition=Q(suspect=True)),
            models.Index(fields=["-id"], name="run_admin_demo_model", condition=Q(is_demo_model=True)),
        ]
        permissions = [("invalidate_run", "Can invalidate runs (they stay stored but leave every chart)")]

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
    and what they mean), `extra` (keys of an imported file that draftboard has no column for),
    `efficiency` (benchkit.measure.efficiency.EfficiencyFigures.to_dict() without a price: per-GPU
    rows and notes; its run-level figures are the `efficiency` columns), `gpu_check`
    (benchkit.measure.gpu_validity.GpuWindowCheck.to_dict(): verdicts, clock events seen, notes;
    empty without telemetry) and `client_headroom` (benchkit.measure.loadgen.ClientHeadroom as a
    dict, per process; its run-level figures are the `client` columns), `categories` (a run whose
    prompts carry a category: benchkit.measure.categories.CategoryFigures.to_dict() per category,
    sorted; [] otherwise). No cost is stored: it
    depends on a GPU-hour price that can change (runs.selectors.price_for prices it when read).
    Written only by runs.services.metrics_store.
    """

    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="metrics")
    spec_source = models.CharField(max_length=TEXT_LIMITS["spec_source"], blank=True,
                                   help_text="where the acceptance figures come from")
    distributions = models.JSONField(default=dict, blank=True)
    source_tool = models.CharField(max_length=TEXT_LIMITS["source_tool"], default="draftboard")
    definitions = models.JSONField(default=dict, blank=True)
    extra = models.JSONField(default=dict, blank=True, help_text="source-file keys without a column")
    efficiency = models.JSONField(default=dict, blank=True, help_text="efficiency figures per GPU and notes")
    gpu_check = models.JSONField(default=dict, blank=True, help_text="GPU verdicts, clock events seen, notes")
    client_headroom = models.JSONField(default=dict, blank=True, help_text="load client CPU and loop lag")
    categories = models.JSONField(default=list, blank=True,
                                  help_text="figures per prompt category")
    computed_at = models.DateTimeField(auto_now=True)

    class Meta:
        # the admin's metrics list filtered by source tool, newest first, at 1M rows (issue 22)
        indexes = [models.Index(fields=["source_tool", "-id"], name="metrics_admin_source_tool")]


_COLUMN_TYPES = {int: models.BigIntegerField, float: models.FloatField, bool: models.BooleanField,
                 list: models.JSONField, str: functools.partial(models.CharField, max_length=40)}


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


class GpuTelemetryBlob(models.Model):
    """The run's GPU sample stream (benchkit.measure.gpu_samples.encode_telemetry), from just
    before the warmup to just after the window; stored beside the request logs, for failed runs
    too (audit), so efficiency figures and GPU verdicts can be re-derived (recompute).
    `hz`: the sampling rate (ticks/s); `n_ticks`, `n_gpus`: the stream's size; `idle_used_mib`:
    the preflight's memory reading per GPU UUID (MiB), the baseline of `gpu_unexplained_memory`."""

    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="gpu_telemetry")
    data = models.BinaryField()
    hz = models.FloatField()
    n_ticks = models.PositiveIntegerField()
    n_gpus = models.PositiveIntegerField()
    idle_used_mib = models.JSONField(default=dict, blank=True)


class RunOutputsBlob(models.Model):
    """What each measured request of the run generated, as digests for the lossless check
    (benchkit.measure.outputs.encode_outputs: per request the prompt hash, kind, length, whole
    hash and block hashes, the first prompts' outputs in full; about 33 bytes + 4 per 64 tokens
    per request). Written with the request logs (runs.services.outcomes), read only by
    runs.services.lossless; `data` is never read on a page (deferred). `kind`: what was kept,
    "ids", "text", "mixed" or "none" (every request failed); `n_requests`, `n_full`: requests
    digested and kept whole."""

    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="outputs_blob")
    data = models.BinaryField()
    n_requests = models.PositiveIntegerField()
    n_full = models.PositiveIntegerField()
    kind = models.CharField(max_length=10)


class LosslessVerdict(models.TextChoices):
    """benchkit.compare.lossless.VERDICTS."""

    LOSSLESS = "lossless", "lossless"
    BEYOND_FLOOR = "beyond_floor", "differs beyond the AR noise floor"
    DIFFERS = "differs", "differs from AR (no noise floor)"
    INCONCLUSIVE = "inconclusive", "inconclusive (too few prompts or repeats)"
    NOT_CHECKED = "not_checked", "not checked"
    PRESERVED = "preserved", "distribution preserved (temperature > 0)"
    DISTRIBUTION_DIFFERS = "distribution_differs", "distribution differs from AR's (temperature > 0)"
    NOT_ENOUGH_SAMPLES = "not_enough_samples", "not enough samples (temperature > 0)"


class LosslessCheck(models.Model):
    """A speculative run's lossless verdict (benchkit.compare.lossless.Verdict), one row per run,
    written by runs.services.lossless when its sweep's last run finished (and by
    `manage.py check_lossless`); pages read these columns, never the outputs blobs.

    `identical_share` (0..1), `median_first_divergence` (in `unit`: token, or char for an engine
    that returns text only) and `precision` (exact, or to the block of `block` units) over the
    requests compared; `divergences`: [[prompt index, first divergence], ...] (at most
    benchkit.compare.lossless.MAX_DIVERGENCES); `baseline_run_ids`: the `auto` runs compared with;
    `floor_run_ids` / `floor_pairs` ([[run a, run b, compared, identical], ...]) /
    `floor_identical_share`: the AR noise floor; `p_value`: the rule's binomial tail (at
    temperature > 0: the sampling check's permutation p, `compared` the spec samples, the floor the
    AR run's own halves; benchkit.compare.lossless.judge_sampling)."""

    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="lossless")
    verdict = models.CharField(max_length=20, choices=LosslessVerdict.choices)
    sentence = models.CharField(max_length=500, help_text="what the pages print")
    reason = models.CharField(max_length=40, blank=True, help_text="not-checked reason code")
    compared = models.PositiveIntegerField(default=0, help_text="requests compared")
    identical = models.PositiveIntegerField(default=0, help_text="requests identical to AR")
    not_comparable = models.PositiveIntegerField(default=0)
    identical_share = models.FloatField(null=True, blank=True, help_text="0..1")
    median_first_divergence = models.FloatField(null=True, blank=True, help_text="tokens (chars when on text)")
    unit = models.CharField(max_length=10, blank=True)
    precision = models.CharField(max_length=10, blank=True, help_text="exact or block")
    block = models.PositiveIntegerField(null=True, blank=True)
    divergences = models.JSONField(default=list, blank=True)
    baseline_run_ids = models.JSONField(default=list, blank=True)
    floor_run_ids = models.JSONField(default=list, blank=True)
    floor_pairs = models.JSONField(default=list, blank=True)
    floor_identical_share = models.FloatField(null=True, blank=True, help_text="0..1")
    p_value = models.FloatField(null=True, blank=True)
    computed_at = models.DateTimeField(auto_now=True)


class GpuPrice(models.Model):
    """What one GPU-hour of a GPU model costs (USD), set in the admin: cost per million output
    tokens is computed from it when a page or export is read (runs.selectors.price_for), never
    stored. `gpu_name`: the NVML name as in `Gpu.name` / `GpuRef.name` (e.g. "NVIDIA H200");
    an empty price means no cost figure, never a guess."""

    gpu_name = models.CharField(max_length=200, unique=True, help_text='NVML name, e.g. "NVIDIA H200"')
    usd_per_gpu_hour = models.DecimalField(max_digits=10, decimal_places=4, null=True, blank=True,
                                           help_text="USD per GPU-hour; empty = no cost figure")
    note = models.CharField(max_length=300, blank=True, help_text="where the price comes from")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["gpu_name"]

    def __str__(self) -> str:
        return f"{self.gpu_name}: {self.usd_per_gpu_hour if self.usd_per_gpu_hour is not None else '-'} USD/GPU-h"


class GpuSpec(models.Model):
    """One GPU model's memory bandwidth and dense peak FLOP/s (docs/CEILINGS.md), set in the
    admin like GPU prices; seeded from benchkit/ceilings/gpu_specs.yaml (`manage.py
    seed_gpu_specs`). The ceilings read these rows when the table has any, else the file
    (runs.ceilings.gpu_spec_rows). Units in the names; an empty peak means the GPU has
    no such path (never 0). `aliases`: other NVML names of the same board, comma-separated."""

    gpu_name = models.CharField(max_length=200, unique=True, help_text='NVML name, e.g. "NVIDIA H200"')
    aliases = models.CharField(max_length=600, blank=True, help_text="other NVML names, comma-separated")
    memory_bandwidth_tb_s = models.FloatField(help_text="peak DRAM bandwidth per GPU, TB/s (1e12 bytes/s)")
    memory_bandwidth_source = models.CharField(max_length=600)
    dense_bf16_tflop_s = models.FloatField(null=True, blank=True, help_text="dense TFLOP/s; empty = none")
    dense_fp16_tflop_s = models.FloatField(null=True, blank=True, help_text="dense TFLOP/s; empty = none")
    dense_fp8_tflop_s = models.FloatField(null=True, blank=True, help_text="dense TFLOP/s; empty = none")
    dense_fp32_tflop_s = models.FloatField(null=True, blank=True, help_text="dense TFLOP/s; empty = none")
    flops_source = models.CharField(max_length=600)
    as_of = models.CharField(max_length=600)
    note = models.CharField(max_length=600, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["gpu_name"]

    def __str__(self) -> str:
        return f"{self.gpu_name}: {self.memory_bandwidth_tb_s} TB/s"


class ModelConfig(models.Model):
    """A model's Hugging Face `config.json`, keyed by the name runs record (`Run.model` or
    `Run.drafter`, e.g. "/models/Qwen3.5-27B"): the ceilings read it (runs.ceilings).
    Pasted in the admin or loaded with `manage.py seed_gpu_specs --model-config NAME=PATH`."""

    model = models.CharField(max_length=TEXT_LIMITS["model"], unique=True, help_text="as Run.model records it")
    config = models.JSONField(help_text="the model's config.json")
    note = models.CharField(max_length=300, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["model"]

    def __str__(self) -> str:
        return self.model


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
    unconfirmed = models.TextField(
        blank=True, help_text="why the reaper kept this lease of a lost run: its server could not be checked or "
        "stopped from where the reaper ran; the host's own worker releases it once the server is known stopped")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["host", "gpu_uuid"], name="gpu_lease_one_holder")]


class SchedulerHeartbeat(models.Model):
    """The last sign of life of a Celery beat (one row per beat process name, `name`): beat's
    scheduler (runs.scheduler.ResilientScheduler) writes `beat_at` while it can reach the
    database, with the number of outages it rode out (`outages`) and the last one's first error and
    length (`last_outage`; the outage in progress is kept in the scheduler's memory).
    The home page and the host page show "scheduler: alive / silent since T" from it
    (runs.selectors.scheduler_status)."""

    name = models.CharField(max_length=200, unique=True, help_text="node:pid of the beat process")
    node = models.CharField(max_length=200, blank=True)
    pid = models.IntegerField(null=True, blank=True)
    started_at = models.DateTimeField()
    beat_at = models.DateTimeField(help_text="last tick written")
    outages = models.IntegerField(default=0, help_text="database outages beat rode out since it started")
    last_outage = models.TextField(blank=True, help_text="the last outage's first error and how long it lasted")

    def __str__(self) -> str:
        return self.name


class RegressionRuleName(models.TextChoices):
    """Which rule of benchkit.compare.regressions raised a flag."""

    HUD = "hud", "rolling median, two nights"
    MANNWHITNEY = "mannwhitney", "Mann-Whitney on repeats"


class RegressionFlag(models.Model):
    """A point of a nightly series that got worse (benchkit.compare.regressions.Finding), stored by
    runs.services.regressions.

    Natural key (sweep, point_key, metric): re-running detection updates a flag and never
    duplicates it. The series is (host, sweep name). `point_key` is
    benchkit.point.Point.identity_hash (its help text names the function's earlier home, kept so
    that no migration is needed); label, tp, concurrency and lengths are copied for
    display. Values are medians in the metric's unit; `change_pct` is value / baseline - 1 in %.
    An acknowledged flag keeps who, when and why (audit) and is never deleted by a re-run.
    """

    sweep = models.ForeignKey(Sweep, on_delete=models.CASCADE, related_name="regression_flags",
                              help_text="the night on which the point was flagged")
    host = models.ForeignKey(Host, on_delete=models.PROTECT, related_name="regression_flags")
    series = models.CharField(max_length=200, help_text="the sweep name (a series is one name on one host)")
    point_key = models.CharField(max_length=64, help_text="benchkit.compare.sweepdiff.identity_hash")
    metric = models.CharField(max_length=60, help_text="WindowMetrics field")
    label = models.CharField(max_length=100)
    tp = models.PositiveIntegerField()
    concurrency = models.PositiveIntegerField()
    input_len = models.PositiveIntegerField()
    output_len = models.PositiveIntegerField()
    value = models.FloatField(help_text="median of the night, in the metric's unit")
    baseline = models.FloatField(help_text="rolling median of the previous nights")
    change_pct = models.FloatField(help_text="value / baseline - 1, in %")
    previous_change_pct = models.FloatField(null=True, blank=True, help_text="the night before, against its baseline")
    p_value = models.FloatField(null=True, blank=True, help_text="Mann-Whitney one-sided p")
    rule = models.CharField(max_length=20, choices=RegressionRuleName.choices)
    run_ids = models.JSONField(default=list)
    baseline_sweep_ids = models.JSONField(default=list)
    note = models.TextField(blank=True, help_text="environment changes inside the window")
    attribution = models.JSONField(default=dict, blank=True, help_text="drafter / verify path / both "
                                   "(benchkit.compare.attribution, with the twin's figures); {} when not judged")
    detected_at = models.DateTimeField(auto_now_add=True)
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.CharField(max_length=150, blank=True, help_text="username")
    ack_reason = models.TextField(blank=True)

    class Meta:
        ordering = ["-sweep__created_at", "tp", "concurrency", "label"]
        constraints = [models.UniqueConstraint(fields=["sweep", "point_key", "metric"],
                                               name="regression_flag_unique_point_per_night")]
        indexes = [
            # home page: open flags, newest first
            models.Index(fields=["-detected_at"], name="regression_open", condition=Q(acknowledged_at__isnull=True)),
            # trend page: flags of one series
            models.Index(fields=["host", "series"], name="regression_series"),
        ]
        permissions = [("acknowledge_regressionflag", "Can acknowledge regression flags")]

    def __str__(self) -> str:
        return f"{self.series}: {self.label} TP{self.tp} c{self.concurrency} {self.change_pct:+.1f}%"

    @property
    def is_open(self) -> bool:
        """Not acknowledged yet."""
        return self.acknowledged_at is None


class ChangePointKind(models.TextChoices):
    """benchkit.compare.changepoints: a step at one night, or a drift through several."""

    STEP = "step", "step"
    DRIFT = "drift", "drift"


class ChangePoint(models.Model):
    """A change point of one point of a nightly series (benchkit.compare.changepoints.ChangePoint
    over the whole history; runs.services.changepoints stores it).

    Natural key (host, series, point_key, sweep): re-running detection updates it in place and
    never duplicates it; an unacknowledged change point that a re-run no longer finds is deleted
    (a drift's start may move by a night as nights are added), an acknowledged one is kept.
    `shifts`: each metric that moved ({metric, kind, before, after, change_pct, verdict, p_value,
    ...}, the metric's unit); `env_changes`: the environment differences at that night
    ({index, sweep_id, key, before, after}); `found_by`: which rule proposed it (`joint`,
    `metric:NAME`, `environment`); `attribution`: drafter / verify path / both / unknown / no
    twin with its figures (benchkit.compare.attribution), {} for a point without tau.
    """

    sweep = models.ForeignKey(Sweep, on_delete=models.CASCADE, related_name="change_points",
                              help_text="the night it happened (a drift's first changed night)")
    host = models.ForeignKey(Host, on_delete=models.PROTECT, related_name="change_points")
    series = models.CharField(max_length=200, help_text="the sweep name (a series is one name on one host)")
    point_key = models.CharField(max_length=64, help_text="benchkit.point.Point.identity_hash")
    label = models.CharField(max_length=100)
    tp = models.PositiveIntegerField()
    concurrency = models.PositiveIntegerField()
    input_len = models.PositiveIntegerField()
    output_len = models.PositiveIntegerField()
    kind = models.CharField(max_length=10, choices=ChangePointKind.choices)
    metrics = models.JSONField(default=list, help_text="names of the metrics that moved")
    shifts = models.JSONField(default=list)
    env_changes = models.JSONField(default=list)
    found_by = models.JSONField(default=list)
    sentence = models.TextField(help_text="the explanation the pages print")
    before_sweep_ids = models.JSONField(default=list, help_text="the nights compared before")
    after_sweep_ids = models.JSONField(default=list, help_text="the nights compared after")
    attribution = models.JSONField(default=dict, blank=True)
    detected_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.CharField(max_length=150, blank=True, help_text="username")
    ack_reason = models.TextField(blank=True)

    class Meta:
        ordering = ["-sweep__created_at", "tp", "concurrency", "label"]
        constraints = [models.UniqueConstraint(fields=["host", "series", "point_key", "sweep"],
                                               name="change_point_unique_point_per_night")]
        indexes = [
            models.Index(fields=["-detected_at"], name="change_point_open", condition=Q(acknowledged_at__isnull=True)),
            models.Index(fields=["host", "series"], name="change_point_series"),
        ]
        permissions = [("acknowledge_changepoint", "Can acknowledge change points")]

    def __str__(self) -> str:
        return f"{self.series}: {self.label} TP{self.tp} c{self.concurrency} {self.kind} ({', '.join(self.metrics)})"

    @property
    def is_open(self) -> bool:
        """Not acknowledged yet."""
        return self.acknowledged_at is None
class SweepSummary(models.Model):
    """The stored point summary of one sweep (issue 22): every column `runs.selectors.load_points`
    reads of each counted run (the point's Run columns, its lossless group, `gpus` as text, the
    start time, every WindowMetrics figure), one SweepSummaryColumn row per column, in run-id
    order (packed by runs.selectors.pack_summary), so that a page fetches only the columns it
    reads. Pages and exports read these rows instead of every run; they are deleted when a run
    of the sweep is stored, invalidated or recomputed and rebuilt after that transaction commits
    (runs.services.summaries), and by `manage.py rebuild_summaries`. A sweep without one (or of
    another `format`) is read from its runs."""

    sweep = models.OneToOneField(Sweep, on_delete=models.CASCADE, primary_key=True, related_name="summary")
    format = models.PositiveSmallIntegerField(help_text="runs.selectors.SUMMARY_FORMAT when built")
    n_points = models.PositiveIntegerField(default=0, help_text="counted runs summarised")
    built_at = models.DateTimeField(auto_now=True)


class SweepSummaryColumn(models.Model):
    """One column of a SweepSummary: its values for each counted run of the sweep, in run-id
    order, packed (runs.selectors.pack_summary: zlib over marshal of the list)."""

    summary = models.ForeignKey(SweepSummary, on_delete=models.CASCADE, related_name="columns")
    name = models.CharField(max_length=64)
    data = models.BinaryField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["summary", "name"], name="sweep_summary_column_unique")]
