"""Admin lists that stay fast at a million rows (issue 22): no count of the whole table per
page, filters whose choices come from a bounded read, and blob rows read without their bytes.

`CappedCountPaginator` counts at most a few pages past the page asked for (`SELECT COUNT(*)`
over a LIMITed subquery: an index walk of at most that many rows, not a scan of the table); the
list then says "more than N" (templates/admin/runs/pagination.html) and the action bar offers
"all matching" without a number (templates/admin/runs/actions.html). `LargeTableAdmin` puts it
on a ModelAdmin with `show_full_result_count = False`.
"""

from __future__ import annotations

from django.contrib import admin
from django.contrib.admin.views.main import PAGE_VAR
from django.core.paginator import Paginator
from django.utils.functional import cached_property


class CappedCountPaginator(Paginator):
    """A Paginator whose `count` reads at most (`page_hint` + LOOKAHEAD_PAGES) x per_page + 1
    rows of `object_list` (a QuerySet). `capped` is True when that limit was reached (more rows
    may follow; `count` is then the limit + 1, so one more page is offered and opening it counts
    further). Exact when the list is shorter than the limit."""

    LOOKAHEAD_PAGES = 10

    def __init__(self, object_list, per_page, orphans=0, allow_empty_first_page=True, page_hint: int = 1):
        super().__init__(object_list, per_page, orphans, allow_empty_first_page)
        self.page_hint = max(1, page_hint)
        self.capped = False

    @cached_property
    def count(self) -> int:
        limit = (self.page_hint + self.LOOKAHEAD_PAGES) * self.per_page
        n = self.object_list[:limit + 1].count()
        self.capped = n > limit
        return n


class LargeTableAdmin:
    """ModelAdmin mixin for tables that grow with every run: the paginator counts a bounded
    number of rows and the list never counts the whole table."""

    show_full_result_count = False
    paginator = CappedCountPaginator
    #: Rows per page: Django's admin renders about 1 ms of CPU per row of a 14-column list; 50
    #: keeps a page of the run list near 60 ms (100: about 110 ms of CPU, benchmarks/history_budget.py).
    list_per_page = 50

    def get_paginator(self, request, queryset, per_page, orphans=0, allow_empty_first_page=True):
        try:
            hint = int(request.GET.get(PAGE_VAR, 1))
        except ValueError:
            hint = 1
        return CappedCountPaginator(queryset, per_page, orphans, allow_empty_first_page, page_hint=hint)


class RecentValuesFilter(admin.SimpleListFilter):
    """A list filter whose choices are the distinct values of `parameter_name` among the newest
    RECENT rows (an index walk of the primary key, not a DISTINCT over the whole table); any
    value given in the URL still filters (exact match)."""

    RECENT = 500

    def lookups(self, request, model_admin):
        recent = model_admin.model.objects.order_by("-pk").values_list(self.parameter_name, flat=True)[:self.RECENT]
        return [(v, v) for v in sorted({v for v in recent if v not in (None, "")})]

    def queryset(self, request, queryset):
        value = self.value()
        return queryset if value in (None, "") else queryset.filter(**{self.parameter_name: value})


def recent_values_filter(field: str, title: str | None = None) -> type[RecentValuesFilter]:
    """A RecentValuesFilter class over `field` (a column of the admin's model)."""
    return type(f"Recent_{field}_Filter", (RecentValuesFilter,),
                {"title": title or field.replace("_", " "), "parameter_name": field})
