"""Dashboard routes."""

from django.urls import path

from analysis import views

app_name = "analysis"

urlpatterns = [
    path("", views.home, name="home"),
    path("home.json", views.home_data, name="home_data"),
    path("sweeps/", views.sweep_list, name="sweep_list"),
    path("compare/", views.compare, name="compare"),
    path("compare/data.json", views.compare_data, name="compare_data"),
    path("trend/", views.trend, name="trend"),
    path("trend/data.json", views.trend_data, name="trend_data"),
    path("sweeps/<int:pk>/", views.sweep_detail, name="sweep_detail"),
    path("sweeps/<int:pk>/data.json", views.sweep_data, name="sweep_data"),
    path("sweeps/<int:pk>/what-to-run/", views.sweep_what_to_run, name="sweep_what_to_run"),
    path("sweeps/<int:pk>/runs/", views.sweep_runs, name="sweep_runs"),
    path("sweeps/<int:pk>/progress.json", views.sweep_progress, name="sweep_progress"),
    path("sweeps/<int:pk>/export.<str:fmt>", views.sweep_export, name="sweep_export"),
    path("sweeps/<int:pk>/report/", views.sweep_report, name="sweep_report"),
    path("sweeps/<int:pk>/report.pdf", views.sweep_report_pdf, name="sweep_report_pdf"),
    path("runs/<int:pk>/", views.run_detail, name="run_detail"),
    path("runs/<int:pk>/progress.json", views.run_progress, name="run_progress"),
    path("hosts/<str:name>/", views.host_detail, name="host_detail"),
    path("glossary/", views.glossary, name="glossary"),
]
