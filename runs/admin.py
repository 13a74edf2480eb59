"""Admin: every model registered with useful columns and filters; invalidate runs with a
reason; clear a host's quarantine; enter a sweep as YAML; create (shown once) and revoke the host
tokens of offline ingest.

Least privilege (issue 11): the actions that change what runs or counts need their own
permission (runs.invalidate_run, runs.clear_quarantine, runs.create_sweep, runs.revoke_hosttoken;
creating a host token needs runs.add_hosttoken; view-only staff get none of them), every action
and view checks it again itself, a POST naming an action the user may not run is refused with 403,
and a sweep's server.env and extra arguments must pass runs.services.policy.
"""

from __future__ import annotations

import re

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import connection
from django.shortcuts import redirect, render
from django.urls import path, reverse
from django.utils.html import format_html

from benchkit.engines.registry import engine_names
from benchkit.hosts.allocation import AllocationError
from benchkit.measure.metrics import SUMMARY_FIELDS
from benchkit.methods import METHOD_NAMES
from benchkit.sweeps.sweepfile import PointsRefused, SweepError
from runs import models
from runs.admin_scale import LargeTableAdmin, recent_values_filter
from runs.forms import AcknowledgeForm, InvalidateForm, SweepYamlForm
from runs.services import dispatch, hosts, ingest, invalidation, policy, regressions, sweeps


class ActionPermissions:
    """Refuse (403) a changelist POST that names one of this admin's actions which the user may
    not run, naming the permission it needs. Django hides such actions, but a forged POST would
    only get "No action selected". `action_perms`: an action permission's name (the
    `permissions=` of @admin.action) -> the Django permission its has_NAME_permission checks."""

    action_perms: dict[str, str] = {}

    def changelist_view(self, request, extra_context=None):
        name = request.POST.get("action") if request.method == "POST" else None
        if name:
            declared = {getattr(a, "__name__", a) for a in self.actions or []} | set(dict(self.admin_site.actions))
            if name in declared and name not in self.get_actions(request):
                func = next((a for a in self.actions or [] if getattr(a, "__name__", a) == name), None)
                func = getattr(self, func, None) if isinstance(func, str) else func
                needed = [self.action_perms.get(p, p) for p in getattr(func, "allowed_permissions", ())]
                raise PermissionDenied(f"you may not run the action {name!r}"
                                       + (f": it needs the {' and '.join(needed)} permission" if needed else ""))
        return super().changelist_view(request, extra_context)


class AuditReadOnly:
    """Stored measurements and their history are evidence: viewable, never edited or deleted here."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(models.Host)
class HostAdmin(ActionPermissions, admin.ModelAdmin):
    list_display = ("name", "quarantined", "quarantine_reason", "worker_name", "worker_seen_at", "created_at")
    list_filter = ("quarantined",)
    search_fields = ("name",)
    actions = ["clear_quarantine"]
    # quarantine changes only through the action (its own permission), never by editing the row
    readonly_fields = ("quarantined", "quarantine_reason", "quarantined_at", "worker_name", "worker_seen_at")

    action_perms = {"clear_quarantine": "runs.clear_quarantine"}

    def has_clear_quarantine_permission(self, request) -> bool:
        return request.user.has_perm(self.action_perms["clear_quarantine"])

    @admin.action(description="Clear quarantine (host takes runs again)", permissions=["clear_quarantine"])
    def clear_quarantine(self, request, queryset):
        if not self.has_clear_quarantine_permission(request):
            raise PermissionDenied("clearing a quarantine needs the runs.clear_quarantine permission")
        n = hosts.clear_quarantine(queryset)
        self.message_user(request, f"cleared {n} host(s)")


class GpuInline(admin.TabularInline):
    model = models.Gpu
    extra = 0
    can_delete = False
    readonly_fields = ("index", "uuid", "pci_bus_id", "name", "memory_total_mib", "numa_node")


@admin.register(models.HostToken)
class HostTokenAdmin(ActionPermissions, admin.ModelAdmin):
    """Tokens of offline hosts (POST /api/ingest/). Adding one shows the token once (only its
    sha256 is stored); tokens are revoked with the action, never edited or deleted (audit)."""

    list_display = ("name", "host", "created_at", "created_by", "last_used_at", "revoked_at")
    list_filter = ("host", ("revoked_at", admin.EmptyFieldListFilter))
    search_fields = ("name", "host__name")
    fields = ("host", "name")
    actions = ["revoke"]

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    action_perms = {"revoke": "runs.revoke_hosttoken"}

    def has_revoke_permission(self, request) -> bool:
        return request.user.has_perm(self.action_perms["revoke"])

    def save_model(self, request, obj, form, change):
        if change or not self.has_add_permission(request):
            raise PermissionDenied("host tokens are created (runs.add_hosttoken) and revoked, never edited")
        row, token = ingest.create_token(obj.host, obj.name, created_by=request.user.get_username())
        obj.pk, obj.token_sha256, obj.created_at = row.pk, row.token_sha256, row.created_at
        request._draftboard_token = token  # shown by response_add, once

    def response_add(self, request, obj, post_url_continue=None):
        ctx = {**self.admin_site.each_context(request), "title": "Host token created", "row": obj,
               "token": request._draftboard_token, "opts": self.model._meta,
               "ingest_url": request.build_absolute_uri(reverse("api_ingest")),
               "back_url": reverse("admin:runs_hosttoken_changelist")}
        response = render(request, "admin/runs/hosttoken_created.html", ctx)
        response["Cache-Control"] = "no-store"
        return response

    @admin.action(description="Revoke selected tokens (their host can no longer send bundles)",
                  permissions=["revoke"])
    def revoke(self, request, queryset):
        if not self.has_revoke_permission(request):
            raise PermissionDenied("revoking host tokens needs the runs.revoke_hosttoken permission")
        n = ingest.revoke_tokens(queryset)
        self.message_user(request, f"revoked {n} token(s)")


@admin.register(models.HardwareSnapshot)
class HardwareSnapshotAdmin(AuditReadOnly, admin.ModelAdmin):
    list_display = ("host", "taken_at", "gpu_count", "gpu_name", "driver_version", "cuda_version", "changed",
                    "short_fingerprint")
    list_filter = ("host", "changed", "gpu_name", "driver_version")
    inlines = [GpuInline]
    readonly_fields = ("host", "taken_at", "fingerprint", "changed", "data")

    @admin.display(description="fingerprint")
    def short_fingerprint(self, obj):
        return obj.fingerprint[:12]


@admin.register(models.Gpu)
class GpuAdmin(AuditReadOnly, admin.ModelAdmin):
    list_display = ("uuid", "index", "name", "pci_bus_id", "numa_node", "memory_total_mib", "snapshot")
    list_filter = ("name", "numa_node")
    search_fields = ("uuid", "pci_bus_id")


@admin.register(models.Sweep)
class SweepAdmin(admin.ModelAdmin):
    list_display = ("name", "id", "host", "is_demo", "created_at", "created_by", "source", "dashboard")
    list_filter = ("host", "is_demo")
    search_fields = ("name", "description")
    # No inline of its runs (a 3 240-run sweep made a 5.5 MB page and 6 489 form fields, more than
    # Django accepts on save: issue 22): a link to the run list filtered to the sweep instead.
    readonly_fields = ("runs_list", "host", "spec", "source", "is_demo", "created_by", "schedule", "window")

    @admin.display(description="runs")
    def runs_list(self, obj):
        """Link to the admin's run list filtered to this sweep, with the sweep's run count (an
        index count of one sweep's rows)."""
        url = reverse("admin:runs_run_changelist") + f"?sweep={obj.pk}"
        return format_html('<a href="{}">{} runs</a>', url, obj.runs.count())

    def has_create_sweep_permission(self, request) -> bool:
        return request.user.has_perm("runs.create_sweep")

    def has_add_permission(self, request):
        return False  # sweeps are entered as YAML through "create from YAML" (see get_urls)

    def has_delete_permission(self, request, obj=None):
        return False  # runs stay for audit; invalidate them instead

    @admin.display(description="dashboard")
    def dashboard(self, obj):
        return format_html('<a href="{}">open</a>', reverse("analysis:sweep_detail", args=[obj.pk]))

    def get_urls(self):
        return [path("create-from-yaml/", self.admin_site.admin_view(self.create_from_yaml),
                     name="runs_sweep_create_from_yaml")] + super().get_urls()

    def changelist_view(self, request, extra_context=None):
        if self.has_create_sweep_permission(request):
            extra_context = {**(extra_context or {}), "create_url": reverse("admin:runs_sweep_create_from_yaml")}
        return super().changelist_view(request, extra_context)

    def create_from_yaml(self, request):
        """Admin page: paste a sweep grid as YAML, pick a host, create (and enqueue) its runs.

        Needs runs.create_sweep (403 otherwise); server.env and extra arguments outside the
        settings' allowlists are refused (403, naming each) unless the user is a superuser."""
        if not self.has_create_sweep_permission(request):
            raise PermissionDenied("creating a sweep needs the runs.create_sweep permission")
        form = SweepYamlForm(request.POST or None)
        status = 200
        if request.method == "POST" and form.is_valid():
            try:
                chosen = list(form.cleaned_data["host"] or [])
                sweep = sweeps.create_sweep(form.cleaned_data["grid"], chosen[0] if chosen else None, source="admin",
                                            enqueue=form.cleaned_data["enqueue"], user=request.user, hosts=chosen)
            except policy.OverrideNotAllowed as exc:
                for problem in exc.problems:
                    form.add_error("grid", f"not allowed: {problem} (a superuser may set it)")
                status = 403
            except PointsRefused as exc:  # one error per TP degree a host cannot hold, each located in the YAML
                for refusal in exc.refusals:
                    form.add_error("grid", str(refusal))
            except (AllocationError, SweepError, dispatch.BrokerUnavailable) as exc:
                form.add_error("grid", str(exc))
            else:
                messages.success(request, f"created sweep {sweep.pk} with {sweep.runs.count()} runs")
                return redirect("admin:runs_sweep_change", sweep.pk)
        ctx = {**self.admin_site.each_context(request), "form": form, "title": "Create a sweep from YAML",
               "opts": self.model._meta}
        return render(request, "admin/runs/sweep_yaml.html", ctx, status=status)


class TransitionInline(admin.TabularInline):
    model = models.RunTransition
    extra = 0
    can_delete = False
    readonly_fields = ("at", "from_state", "to_state", "note")


class FixedChoicesFilter(admin.SimpleListFilter):
    """A list filter whose choices are fixed (no query over the runs to build them); any value
    given in the URL still filters (exact match on `parameter_name`)."""

    choices_list: tuple = ()

    def lookups(self, request, model_admin):
        return [(str(v), str(v)) for v in self.choices_list]

    def queryset(self, request, queryset):
        value = self.value()
        if value in (None, ""):
            return queryset
        field = models.Run._meta.get_field(self.parameter_name)
        try:
            value = field.to_python(value)
        except ValidationError:
            return queryset.none()
        if isinstance(value, int) and not _fits(field, value):
            return queryset.none()  # no row holds it, and the database would refuse the number
        return queryset.filter(**{self.parameter_name: value})


def _fits(field, value: int) -> bool:
    """Whether `value` fits the integer column of `field` (a foreign key: its target's)."""
    target = field.target_field if field.is_relation else field
    low, high = connection.ops.integer_field_range(target.get_internal_type())
    return -2**63 <= value < 2**63 and (low is None or value >= low) and (high is None or value <= high)


class MethodFilter(FixedChoicesFilter):
    title, parameter_name, choices_list = "method", "method", METHOD_NAMES


class TpFilter(FixedChoicesFilter):
    title, parameter_name, choices_list = "TP", "tp", (1, 2, 4, 8, 16)


class ConcurrencyFilter(FixedChoicesFilter):
    title, parameter_name, choices_list = "concurrency", "concurrency", (1, 2, 4, 8, 16, 32, 64, 128, 256)


class EngineFilter(FixedChoicesFilter):
    title, parameter_name = "engine", "engine"

    @property
    def choices_list(self) -> tuple[str, ...]:
        """The registered engines (benchkit.engines.registry), plug-ins included."""
        return engine_names()


class FailureReasonFilter(FixedChoicesFilter):
    """Choices: the reasons among the newest RECENT failed runs (an index walk, not a scan of
    every run); any reason still filters through the URL."""

    title, parameter_name = "failure reason", "failure_reason"
    RECENT = 500

    def lookups(self, request, model_admin):
        recent = (models.Run.objects.filter(state=models.RunState.FAILED).order_by("-id")
                  .values_list("failure_reason", flat=True)[:self.RECENT])
        return [(r, r) for r in sorted(set(recent)) if r]


class SweepFilter(FixedChoicesFilter):
    """Choices: the NEWEST sweeps; any sweep id filters through the URL (`?sweep=ID`), which is
    how the sweep page links here."""

    title, parameter_name = "sweep", "sweep"
    NEWEST = 15

    def lookups(self, request, model_admin):
        return [(str(pk), f"{name} #{pk}") for pk, name in
                models.Sweep.objects.order_by("-id").values_list("id", "name")[:self.NEWEST]]


class RunChangeList(ChangeList):
    """The run list loads only the columns it shows (no JSON column is decoded per row)."""

    def get_queryset(self, request, exclude_parameters=None):
        return super().get_queryset(request, exclude_parameters).only(*RunAdmin.LIST_COLUMNS)


class ColumnsChangeList(ChangeList):
    """A list that loads only its admin's LIST_COLUMNS."""

    def get_queryset(self, request, exclude_parameters=None):
        return super().get_queryset(request, exclude_parameters).only(*self.model_admin.LIST_COLUMNS)


class ToStateFilter(FixedChoicesFilter):
    """A transition's new state, from the fixed run states (no DISTINCT over every transition)."""

    title, parameter_name, choices_list = "to state", "to_state", tuple(models.RunState.values)

    def queryset(self, request, queryset):
        value = self.value()
        return queryset if value in (None, "") else queryset.filter(to_state=value)


@admin.register(models.Run)
class RunAdmin(LargeTableAdmin, ActionPermissions, admin.ModelAdmin):
    list_display = ("id", "sweep", "method_label", "tp", "concurrency", "output_len", "state", "failure_reason",
                    "suspect", "output_tok_s", "engine", "host", "finished_at")
    #: Columns the list reads (RunChangeList): what list_display shows, through its joins.
    LIST_COLUMNS = ("id", "sweep", "sweep__name", "host", "host__name", "method", "num_speculative_tokens",
                    "tree_budget", "tp", "concurrency", "output_len", "state", "failure_reason", "suspect", "engine",
                    "finished_at", "metrics__id", "metrics__run", "metrics__output_throughput_tok_s")
    # Filters never scan every run to build their choices (fixed choices, the host table, the
    # newest sweeps, recent failure reasons).
    list_filter = ("state", FailureReasonFilter, MethodFilter, TpFilter, ConcurrencyFilter, EngineFilter, "host",
                   "suspect", "is_demo_model", SweepFilter)
    search_fields = ("model", "drafter", "failure_message", "^point_key")
    search_help_text = "A run id (digits) finds that run; other text searches model, drafter, failure message."
    list_select_related = ("sweep", "host", "metrics")
    ordering = ("-id",)  # the primary key's index: no join through the sweep's ordering
    # LargeTableAdmin: no count of the whole table; each filter column has an index led by it (Run.Meta)
    actions = ["invalidate"]
    inlines = [TransitionInline]
    readonly_fields = [f.name for f in models.Run._meta.fields]

    def get_changelist(self, request, **kwargs):
        return RunChangeList

    def get_search_results(self, request, queryset, search_term):
        """A run id (digits only) is an exact primary-key lookup; other terms search the text fields."""
        term = search_term.strip()
        if re.fullmatch(r"[0-9]{1,18}", term):  # ASCII digits only: str.isdigit() passes '²'
            return queryset.filter(pk=int(term)), False
        return super().get_search_results(request, queryset, search_term)

    def has_add_permission(self, request):
        return False  # runs come from sweeps

    def has_delete_permission(self, request, obj=None):
        return False  # an invalidated run stays for audit

    action_perms = {"invalidate": "runs.invalidate_run"}

    def has_invalidate_permission(self, request) -> bool:
        return request.user.has_perm(self.action_perms["invalidate"])

    @admin.display(description="output tok/s", ordering="metrics__output_throughput_tok_s")
    def output_tok_s(self, obj):
        m = getattr(obj, "metrics", None)
        return f"{m.output_throughput_tok_s:.1f}" if m and m.output_throughput_tok_s is not None else "—"

    @admin.action(description="Invalidate selected runs (asks for a reason)", permissions=["invalidate"])
    def invalidate(self, request, queryset):
        """Intermediate page asking for a reason; invalidated runs stay here but leave every chart."""
        if not self.has_invalidate_permission(request):
            raise PermissionDenied("invalidating runs needs the runs.invalidate_run permission")
        if "apply" in request.POST:
            form = InvalidateForm(request.POST)
            if form.is_valid():
                n, skipped = invalidation.invalidate_runs(list(queryset), form.cleaned_data["reason"])
                self.message_user(request, f"invalidated {n} run(s)")
                for msg in skipped:
                    self.message_user(request, msg, level=messages.WARNING)
                return None
        else:
            form = InvalidateForm()
        ctx = {**self.admin_site.each_context(request), "form": form, "runs": queryset,
               "title": "Invalidate runs", "opts": self.model._meta,
               "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME}
        return render(request, "admin/runs/invalidate.html", ctx)


@admin.register(models.RunMetrics)
class RunMetricsAdmin(LargeTableAdmin, AuditReadOnly, admin.ModelAdmin):
    list_display = ("run", *(f.name for f in SUMMARY_FIELDS), "error_rate", "source_tool")
    #: What the list reads: its columns and the run's label (no samples or JSON columns).
    LIST_COLUMNS = ("id", "run", "run__id", "run__method", "run__num_speculative_tokens", "run__tree_budget",
                    "run__tp", "run__concurrency", *(f.name for f in SUMMARY_FIELDS), "error_rate", "source_tool")
    list_filter = (recent_values_filter("source_tool", "source tool"),)
    list_select_related = ("run",)
    ordering = ("-id",)
    readonly_fields = [f.name for f in models.RunMetrics._meta.fields]

    def get_changelist(self, request, **kwargs):
        return ColumnsChangeList


class NoBlobBytes(LargeTableAdmin):
    """A blob model's admin: `data` is neither shown nor read (deferred in every query of the
    list and the change page: a request-log blob of a big run is tens of MB)."""

    exclude = ("data",)
    ordering = ("-id",)

    def get_queryset(self, request):
        return super().get_queryset(request).defer("data")


@admin.register(models.RequestLogBlob)
class RequestLogBlobAdmin(NoBlobBytes, AuditReadOnly, admin.ModelAdmin):
    list_display = ("run_id", "n_requests", "n_warmup")
    readonly_fields = ("run", "n_requests", "n_warmup", "window_start_ns", "window_end_ns")


@admin.register(models.GpuTelemetryBlob)
class GpuTelemetryBlobAdmin(NoBlobBytes, AuditReadOnly, admin.ModelAdmin):
    list_display = ("run_id", "hz", "n_ticks", "n_gpus")
    readonly_fields = ("run", "hz", "n_ticks", "n_gpus", "idle_used_mib")


@admin.register(models.RunOutputsBlob)
class RunOutputsBlobAdmin(NoBlobBytes, AuditReadOnly, admin.ModelAdmin):
    """What each run kept of its outputs for the lossless check; the digests themselves are never
    read here (deferred)."""

    list_display = ("run_id", "kind", "n_requests", "n_full")
    list_filter = (recent_values_filter("kind"),)
    readonly_fields = ("run", "kind", "n_requests", "n_full")


@admin.register(models.LosslessCheck)
class LosslessCheckAdmin(AuditReadOnly, admin.ModelAdmin):
    """The stored lossless verdicts (runs.services.lossless; recompute: `manage.py check_lossless`)."""

    list_display = ("run_id", "verdict", "identical_share", "median_first_divergence", "floor_identical_share",
                    "reason", "computed_at")
    list_filter = ("verdict", "reason")
    readonly_fields = [f.name for f in models.LosslessCheck._meta.fields]


@admin.register(models.GpuPrice)
class GpuPriceAdmin(admin.ModelAdmin):
    """GPU-hour prices per GPU model, edited in the list: cost per million output tokens is
    computed from them when pages and exports are read (runs.selectors.price_for)."""

    list_display = ("gpu_name", "usd_per_gpu_hour", "note", "updated_at")
    list_editable = ("usd_per_gpu_hour", "note")
    search_fields = ("gpu_name",)


@admin.register(models.GpuSpec)
class GpuSpecAdmin(admin.ModelAdmin):
    """GPU bandwidth and peak FLOP/s per GPU model, edited in the list like prices; the ceilings
    use them when the table has rows, else benchkit/ceilings/gpu_specs.yaml (`seed_gpu_specs`)."""

    list_display = ("gpu_name", "memory_bandwidth_tb_s", "dense_bf16_tflop_s", "dense_fp16_tflop_s",
                    "dense_fp8_tflop_s", "dense_fp32_tflop_s", "as_of", "updated_at")
    list_editable = ("memory_bandwidth_tb_s", "dense_bf16_tflop_s", "dense_fp16_tflop_s", "dense_fp8_tflop_s",
                     "dense_fp32_tflop_s")
    search_fields = ("gpu_name", "aliases")


@admin.register(models.ModelConfig)
class ModelConfigAdmin(admin.ModelAdmin):
    """Models' config.json by the name runs record: the ceilings read parameters and dtypes here."""

    list_display = ("model", "note", "updated_at")
    search_fields = ("model",)


@admin.register(models.GpuLease)
class GpuLeaseAdmin(admin.ModelAdmin):
    list_display = ("gpu_uuid", "host", "run", "acquired_at", "expires_at")
    list_filter = ("host",)


@admin.register(models.RunTransition)
class RunTransitionAdmin(LargeTableAdmin, AuditReadOnly, admin.ModelAdmin):
    list_display = ("run_id", "from_state", "to_state", "at", "note")
    list_filter = (ToStateFilter,)
    ordering = ("-id",)  # the primary key's index (the model's ordering by run and time needs a sort)


class OpenFlagFilter(admin.SimpleListFilter):
    """Open (not yet acknowledged) or acknowledged flags."""

    title = "status"
    parameter_name = "status"

    def lookups(self, request, model_admin):
        return (("open", "open"), ("acknowledged", "acknowledged"))

    def queryset(self, request, queryset):
        if self.value() == "open":
            return queryset.filter(acknowledged_at__isnull=True)
        if self.value() == "acknowledged":
            return queryset.filter(acknowledged_at__isnull=False)
        return queryset


@admin.register(models.RegressionFlag)
class RegressionFlagAdmin(AuditReadOnly, admin.ModelAdmin):
    """Regression flags are written by detection only; an administrator with the
    `runs.acknowledge_regressionflag` permission acknowledges them with a reason (kept)."""

    list_display = ("series", "host", "night", "label", "tp", "concurrency", "output_len", "metric", "change",
                    "rule", "status", "acknowledged_by")
    list_filter = (OpenFlagFilter, "host", "series", "rule", "tp")
    list_select_related = ("sweep", "host")
    search_fields = ("series", "label", "note", "ack_reason")
    readonly_fields = [f.name for f in models.RegressionFlag._meta.fields]
    actions = ["acknowledge"]

    def has_view_permission(self, request, obj=None):
        return super().has_view_permission(request, obj) or self.has_acknowledge_permission(request)

    def has_acknowledge_permission(self, request) -> bool:
        return request.user.has_perm("runs.acknowledge_regressionflag")

    @admin.display(description="night", ordering="sweep__created_at")
    def night(self, obj):
        return format_html('<a href="{}?new={}">#{} {}</a>', reverse("analysis:compare"), obj.sweep_id, obj.sweep_id,
                           f"{obj.sweep.created_at:%Y-%m-%d}")

    @admin.display(description="change", ordering="change_pct")
    def change(self, obj):
        return f"{obj.change_pct:+.1f} %"

    @admin.display(description="status", boolean=False)
    def status(self, obj):
        return "open" if obj.is_open else f"acknowledged {obj.acknowledged_at:%Y-%m-%d}"

    @admin.action(description="Acknowledge selected flags (asks for a reason)", permissions=["acknowledge"])
    def acknowledge(self, request, queryset):
        """Intermediate page asking for a reason; acknowledged flags leave the open list."""
        if "apply" in request.POST:
            form = AcknowledgeForm(request.POST)
            if form.is_valid():
                n = regressions.acknowledge([f.pk for f in queryset], request.user.get_username(),
                                            form.cleaned_data["reason"])
                self.message_user(request, f"acknowledged {n} flag(s)")
                return None
        else:
            form = AcknowledgeForm()
        ctx = {**self.admin_site.each_context(request), "form": form, "flags": queryset,
               "title": "Acknowledge regression flags", "opts": self.model._meta,
               "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME}
        return render(request, "admin/runs/acknowledge.html", ctx)


@admin.register(models.ResultFile)
class ResultFileAdmin(AuditReadOnly, admin.ModelAdmin):
    """Imported result files, one per content (sha256): which sweep their runs went into."""

    list_display = ("name", "source_tool", "size_bytes", "sweep", "imported_at")
    list_filter = ("source_tool",)
    search_fields = ("name", "sha256")
    readonly_fields = ("sha256", "name", "size_bytes", "source_tool", "sweep", "imported_at")
