"""Django settings for draftboard, read from the environment (loud on bad values).

Environment:
- DATABASE_URL: any dj-database-url URL (postgres://user@host:5432/db). Unset: SQLite at
  $DRAFTBOARD_VAR_DIR/draftboard.sqlite3 (the embedded default).
- CELERY_BROKER_URL or REDIS_URL: the broker. Unset: the private Redis that `make demo` starts
  on a unix socket under $DRAFTBOARD_VAR_DIR/redis/ (see runs/services/localstack.py).
- DRAFTBOARD_HOST: this host's name and so its Celery queue `host.<name>` (default: hostname).
- DRAFTBOARD_VAR_DIR: runtime state (database, logs, pid files, demo models). Default ./var.
- DJANGO_SECRET_KEY (default: generated once into $DRAFTBOARD_VAR_DIR/secret_key), DJANGO_DEBUG,
  DJANGO_ALLOWED_HOSTS.
"""

from __future__ import annotations

import secrets
import socket
from pathlib import Path

import dj_database_url
import plotly

from .env import ConfigError, env_bool, env_int, env_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("DRAFTBOARD_VAR_DIR", str(BASE_DIR / "var"))).resolve()
try:
    VAR_DIR.mkdir(parents=True, exist_ok=True)
except OSError as _exc:
    raise ConfigError(f"DRAFTBOARD_VAR_DIR={VAR_DIR}: cannot use it as the state directory ({_exc})") from None


def _secret_key() -> str:
    key = env_str("DJANGO_SECRET_KEY")
    if key:
        return key
    path = VAR_DIR / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = _secret_key()
DEBUG = env_bool("DJANGO_DEBUG", False)
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])

DRAFTBOARD_HOST = env_str("DRAFTBOARD_HOST", socket.gethostname())
DRAFTBOARD_MODELS_DIR = Path(env_str("DRAFTBOARD_MODELS_DIR", str(VAR_DIR / "models")))
DRAFTBOARD_RUNS_DIR = Path(env_str("DRAFTBOARD_RUNS_DIR", str(VAR_DIR / "runs")))

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_celery_beat",
    "runs",
    "analysis",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "benchsite.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "benchsite.wsgi.application"

_default_db = f"sqlite:///{VAR_DIR / 'draftboard.sqlite3'}"
try:
    DATABASES = {"default": dj_database_url.parse(env_str("DATABASE_URL", _default_db), conn_max_age=0)}
except ValueError as exc:  # unknown scheme, malformed URL
    raise ConfigError(f"DATABASE_URL is not a usable database URL: {exc}") from None
if not DATABASES["default"].get("NAME"):
    raise ConfigError("DATABASE_URL names no database (e.g. postgres://user@host:5432/draftboard)")
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Web server, worker and beat share one SQLite file: wait for locks instead of failing.
    DATABASES["default"]["OPTIONS"] = {"timeout": 30, "transaction_mode": "IMMEDIATE"}
    # A file, not :memory:, so a Celery worker in another process sees the test database.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test-draftboard.sqlite3")}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
AUTH_PASSWORD_VALIDATORS = []
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "staticfiles"
# plotly.js is served once, as a static file, from the plotly package's own copy.
STATICFILES_DIRS = [
    BASE_DIR / "static",
    ("plotly", Path(plotly.__file__).parent / "package_data"),
]

LOGIN_URL = "admin:login"

# --- Celery -----------------------------------------------------------------------------------
LOCAL_REDIS_SOCKET = VAR_DIR / "redis" / "redis.sock"
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", env_str("REDIS_URL", f"redis+socket://{LOCAL_REDIS_SOCKET}"))
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
# Delivery (issue 11; runs.services.dispatch and supervision): a message is acked only after its
# task ends (acks_late) and is requeued when the worker process executing it dies
# (reject_on_worker_lost), so the runs of a group that were never claimed still run; the runs
# that were claimed are never run twice (the claim is a conditional UPDATE) and the second
# delivery is written in their history. The poison-message loop that reject_on_worker_lost can
# cause elsewhere cannot happen here: a redelivered run is already claimed, so it is a no-op.
# visibility_timeout must exceed the longest task (a group's summed bounds), else Redis hands a
# running task's message out again (harmless, but noise); a message held by a worker that died
# comes back only after it, which is why the reconciler, not the broker, re-sends lost runs.
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_REJECT_ON_WORKER_LOST = True
# A broker restart must not kill a benchmark that is running: the task goes on and is acked when
# it ends (tests/test_faults.py restarts Redis mid-run); were that ack lost, the message would
# come back after visibility_timeout as a recorded duplicate delivery, never a second run.
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 6 * 3600}
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_TIMEZONE = "UTC"
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_str("DRAFTBOARD_LOG_LEVEL", "INFO")},
}

# --- Run supervision (issue 11; runs.services.supervision), seconds ---------------------------
DRAFTBOARD_HEARTBEAT_INTERVAL_S = env_int("DRAFTBOARD_HEARTBEAT_INTERVAL_S", 10)
DRAFTBOARD_HEARTBEAT_TIMEOUT_S = env_int("DRAFTBOARD_HEARTBEAT_TIMEOUT_S", 60)
DRAFTBOARD_SUPERVISE_INTERVAL_S = env_int("DRAFTBOARD_SUPERVISE_INTERVAL_S", 30)
DRAFTBOARD_RECONCILE_MARGIN_S = env_int("DRAFTBOARD_RECONCILE_MARGIN_S", 30)
for _name in ("DRAFTBOARD_HEARTBEAT_INTERVAL_S", "DRAFTBOARD_HEARTBEAT_TIMEOUT_S", "DRAFTBOARD_SUPERVISE_INTERVAL_S"):
    if globals()[_name] < 1:
        raise ConfigError(f"{_name}={globals()[_name]}: must be at least 1 (seconds)")
if DRAFTBOARD_HEARTBEAT_TIMEOUT_S <= DRAFTBOARD_HEARTBEAT_INTERVAL_S:
    raise ConfigError(f"DRAFTBOARD_HEARTBEAT_TIMEOUT_S={DRAFTBOARD_HEARTBEAT_TIMEOUT_S} must exceed "
                      f"DRAFTBOARD_HEARTBEAT_INTERVAL_S={DRAFTBOARD_HEARTBEAT_INTERVAL_S}")

# --- Least privilege (issue 11; runs.services.policy) -----------------------------------------
# What a sweep entered on the web by a user who is not a superuser may put into a GPU host's
# server environment and command line (resource knobs only; nothing that loads code or paths).
DRAFTBOARD_SERVER_ENV_ALLOWLIST = env_list("DRAFTBOARD_SERVER_ENV_ALLOWLIST", [
    "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "NCCL_P2P_DISABLE", "NCCL_IB_DISABLE"])
DRAFTBOARD_EXTRA_ARGS_ALLOWLIST = env_list("DRAFTBOARD_EXTRA_ARGS_ALLOWLIST", [
    "--gpu-memory-utilization", "--max-num-seqs", "--max-num-batched-tokens", "--enforce-eager",
    "--mem-fraction-static", "--max-running-requests", "--chunked-prefill-size", "--cuda-graph-max-bs",
    "--disable-cuda-graph"])
