"""URL routes: the dashboard (analysis app) at /, the admin at /admin/."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("analysis.urls")),
]
