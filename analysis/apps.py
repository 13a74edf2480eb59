"""App config for analysis."""

from django.apps import AppConfig


class AnalysisConfig(AppConfig):
    """Dashboard pages and exports."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "analysis"
