"""App config for runs."""

from django.apps import AppConfig


class RunsConfig(AppConfig):
    """Hosts, sweeps, runs and their metrics."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "runs"

    def ready(self) -> None:
        """Connect the summary signals (runs.services.summaries)."""
        from runs.services import summaries

        summaries.connect_signals()
