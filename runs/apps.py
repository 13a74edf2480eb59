"""App config for runs."""

from django.apps import AppConfig


class RunsConfig(AppConfig):
    """Hosts, sweeps, runs and their metrics."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "runs"

    def ready(self) -> None:
        """Register the change points' admin (runs.admin_changepoints, beside runs.admin) and
        connect the summary signals (runs.services.summaries)."""
        from runs import admin_changepoints  # noqa: F401
        from runs.services import summaries

        summaries.connect_signals()
