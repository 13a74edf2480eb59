"""The Celery application. Workers consume one queue per GPU host (`host.<name>`).

Start a worker for this host with `celery -A benchsite worker -Q host.$(hostname)`; `make demo`
does that for you. Beat reads its schedule from django-celery-beat's tables (admin: Periodic
tasks), where nightly sweeps are entered.
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchsite.settings")

app = Celery("benchsite")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
