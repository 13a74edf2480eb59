"""Admin of change points (issue 21), imported by RunsConfig.ready: written by detection only
(runs.services.changepoints); an administrator with `runs.acknowledge_changepoint` acknowledges
them with a reason, as regression flags are."""

from __future__ import annotations

from django.contrib import admin
from django.shortcuts import render
from django.urls import reverse
from django.utils.html import format_html

from runs import models
from runs.admin import AuditReadOnly, OpenFlagFilter
from runs.forms import AcknowledgeForm
from runs.services import changepoints


@admin.register(models.ChangePoint)
class ChangePointAdmin(AuditReadOnly, admin.ModelAdmin):
    """Change points, open first; acknowledging asks for a reason (kept with who and when)."""

    list_display = ("series", "host", "night", "label", "tp", "concurrency", "output_len", "kind", "moved",
                    "attributed", "status", "acknowledged_by")
    list_filter = (OpenFlagFilter, "host", "series", "kind", "tp")
    list_select_related = ("sweep", "host")
    search_fields = ("series", "label", "sentence", "ack_reason")
    readonly_fields = [f.name for f in models.ChangePoint._meta.fields]
    actions = ["acknowledge"]

    def has_view_permission(self, request, obj=None):
        return super().has_view_permission(request, obj) or self.has_acknowledge_permission(request)

    def has_acknowledge_permission(self, request) -> bool:
        return request.user.has_perm("runs.acknowledge_changepoint")

    @admin.display(description="night", ordering="sweep__created_at")
    def night(self, obj):
        return format_html('<a href="{}?new={}">#{} {}</a>', reverse("analysis:compare"), obj.sweep_id, obj.sweep_id,
                           f"{obj.sweep.created_at:%Y-%m-%d}")

    @admin.display(description="what moved")
    def moved(self, obj):
        return "; ".join(f"{s['metric']} {s['change_pct']:+.1f} %" for s in obj.shifts)

    @admin.display(description="drafter / verify path")
    def attributed(self, obj):
        return (obj.attribution or {}).get("verdict", "")

    @admin.display(description="status")
    def status(self, obj):
        return "open" if obj.is_open else f"acknowledged {obj.acknowledged_at:%Y-%m-%d}"

    @admin.action(description="Acknowledge selected change points (asks for a reason)", permissions=["acknowledge"])
    def acknowledge(self, request, queryset):
        """Intermediate page asking for a reason; acknowledged change points leave the open list."""
        if "apply" in request.POST:
            form = AcknowledgeForm(request.POST)
            if form.is_valid():
                n = changepoints.acknowledge([c.pk for c in queryset], request.user.get_username(),
                                             form.cleaned_data["reason"])
                self.message_user(request, f"acknowledged {n} change point(s)")
                return None
        else:
            form = AcknowledgeForm()
        ctx = {**self.admin_site.each_context(request), "form": form, "flags": queryset, "what": "change points",
               "title": "Acknowledge change points", "opts": self.model._meta,
               "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME}
        return render(request, "admin/runs/acknowledge.html", ctx)
