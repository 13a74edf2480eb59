"""App config for runs."""

from django.apps import AppConfig


class RunsConfig(AppConfig):
    """Hosts, sweeps, runs and their metrics."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "runs"
