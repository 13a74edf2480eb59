"""The Celery application. Workers consume one queue per GPU host (`host.<name>`).

Start a worker for this host with `celery -A benchsite worker -Q host.$(hostname)`; `make demo`
does that for you. Beat reads its schedule from django-celery-beat's tables (admin: Periodic
tasks), where nightly sweeps are entered.

Every message beat sends carries django-celery-beat's header `periodic_task_name`; the
`before_task_publish` hook below adds `schedule_window`, the UTC date at which it was sent, so
the nightly task knows its window (schedule + date) by the sender's clock, and a second send of
one window creates no second sweep (runs.services.sweeps.create_sweep_for_window).
"""

import os
from datetime import UTC, datetime

from celery import Celery
from celery.signals import before_task_publish

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchsite.settings")

app = Celery("benchsite")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@before_task_publish.connect
def stamp_schedule_window(headers=None, **kwargs) -> None:
    """Add header `schedule_window` (UTC date, ISO) to a message that a beat schedule sends."""
    if headers is not None and headers.get("periodic_task_name") and not headers.get("schedule_window"):
        headers["schedule_window"] = datetime.now(UTC).date().isoformat()
