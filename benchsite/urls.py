"""URL routes: the dashboard (analysis app) at /, the admin at /admin/, the offline-bundle ingest
API at /api/ingest/ (runs.api)."""

from django.contrib import admin
from django.urls import include, path

from runs import api

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/ingest/", api.ingest, name="api_ingest"),
    path("", include("analysis.urls")),
]
