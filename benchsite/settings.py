"""Django settings for draftboard, read from the environment (loud on bad values).

Environment:
- DATABASE_URL: any dj-database-url URL (postgres://user@host:5432/db). Unset: SQLite at
  $DRAFTBOARD_VAR_DIR/draftboard.sqlite3 (the embedded default).
- CELERY_BROKER_URL or REDIS_URL: the broker. Unset: the private Redis that `make demo` starts
  on a unix socket under $DRAFTBOARD_VAR_DIR/redis/ (see runs/localstack.py).
- DRAFTBOARD_HOST: this host's name and so its Celery queue `host.<name>` (default: hostname).
- DRAFTBOARD_VAR_DIR: runtime state (database, logs, pid files, demo models). Default ./var.
- DJANGO_SECRET_KEY (default: generated once into $DRAFTBOARD_VAR_DIR/secret_key), DJANGO_DEBUG,
  DJANGO_ALLOWED_HOSTS.
- DJANGO_HTTPS: the site is served over HTTPS (directly or behind a TLS proxy). On: HTTP is
  redirected to HTTPS, session and CSRF cookies are Secure, HSTS is sent. Default: on when
  DJANGO_DEBUG is off and DJANGO_ALLOWED_HOSTS names any host other than this machine's own
  loopback names, off otherwise (see "HTTPS" below for why not DEBUG alone).
- DJANGO_HSTS_SECONDS (default 31536000), DJANGO_HSTS_INCLUDE_SUBDOMAINS (default on),
  DJANGO_HSTS_PRELOAD (default off): HSTS, only with DJANGO_HTTPS on.
- DJANGO_SECURE_PROXY_SSL_HEADER: behind a TLS proxy, the header it sets on HTTPS requests,
  e.g. `X-Forwarded-Proto: https`. Set it only when that proxy is the only way in and it
  overwrites the header (Django then trusts it to tell HTTPS from HTTP).
- DJANGO_CSRF_TRUSTED_ORIGINS: extra origins for unsafe requests, e.g. https://draftboard.example.org:8443.
"""

from __future__ import annotations

import secrets
import socket
from pathlib import Path

import dj_database_url
import plotly
from csp.constants import NONCE, NONE, SELF, UNSAFE_INLINE

from .env import ConfigError, env_bool, env_float, env_header, env_int, env_list, env_nonneg_int, env_origins, env_str

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
# Least free space (MiB) the runs folder needs before a server starts, else preflight fails
# `disk_full` (issue 35; 0 = no check). benchkit.hosts.preflight.min_free_mib reads the same
# variable in the worker; parsed here too so that a bad value stops startup.
DRAFTBOARD_MIN_FREE_MIB = env_nonneg_int("DRAFTBOARD_MIN_FREE_MIB", 512)

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
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "csp.middleware.CSPMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

# Content-Security-Policy of every response (django-csp; issue 31; tests/test_csp.py checks every
# page sends it and that the sweep page's Plotly figures draw under it in Chromium). What the pages
# load: scripts only from static/ (plotly.min.js, charts.js, sweep.js; the admin's) and one inline
# script, the report page's, which carries the request's nonce (`request.csp_nonce`); figure
# data is in json_script blocks (not executed); JSON endpoints and the what-to-run fragment are
# fetched from the site itself. Styles allow 'unsafe-inline': plotly.js writes <style> rules and
# style attributes at run time (no nonce possible), the report page has a <style> block and the
# admin style attributes; scripts never do. data: images are the favicon (`href="data:,"`) and
# plotly's PNG download; blob: its SVG download.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF, NONCE],
        "style-src": [SELF, UNSAFE_INLINE],
        "img-src": [SELF, "data:", "blob:"],
        "font-src": [SELF],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [NONE],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    },
}

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
# whitenoise serves the static files from the app itself (gunicorn or any WSGI server, no web
# server needed). Once `manage.py collectstatic` has filled STATIC_ROOT (README "Deploy") it
# serves that, with gzip variants; while STATIC_ROOT is empty (the demo, tests, development)
# straight from the folders above.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
STATIC_ROOT.mkdir(exist_ok=True)
WHITENOISE_USE_FINDERS = not any(STATIC_ROOT.iterdir())

# --- HTTPS (manage.py check --deploy) ---------------------------------------------------------
# Whether the site is served over HTTPS is its own setting, not DEBUG: `make demo` runs with DEBUG
# off on plain http://127.0.0.1:8765, where Secure cookies would never come back (no admin login)
# and an HTTPS redirect would lead nowhere. The default follows where the site is reachable: only
# through this machine's loopback names -> plain HTTP is fine; any other host name -> HTTPS, so a
# deployment that names its host gets the secure settings unless it says DJANGO_HTTPS=0.
LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "[::1]", "::1", "testserver"}
HTTPS = env_bool("DJANGO_HTTPS", not DEBUG and not set(ALLOWED_HOSTS) <= LOOPBACK_HOSTS)
SECURE_SSL_REDIRECT = HTTPS
SESSION_COOKIE_SECURE = HTTPS
CSRF_COOKIE_SECURE = HTTPS
_HSTS_VARS = ("DJANGO_HSTS_SECONDS", "DJANGO_HSTS_INCLUDE_SUBDOMAINS", "DJANGO_HSTS_PRELOAD")
if not HTTPS and any(env_str(v) for v in _HSTS_VARS):
    raise ConfigError(f"{', '.join(v for v in _HSTS_VARS if env_str(v))} set, but the site is not served "
                      "over HTTPS (DJANGO_HTTPS is off); HSTS applies only with DJANGO_HTTPS=1")
SECURE_HSTS_SECONDS = env_nonneg_int("DJANGO_HSTS_SECONDS", 31_536_000) if HTTPS else 0
SECURE_HSTS_INCLUDE_SUBDOMAINS = HTTPS and env_bool("DJANGO_HSTS_INCLUDE_SUBDOMAINS", True)
SECURE_HSTS_PRELOAD = HTTPS and env_bool("DJANGO_HSTS_PRELOAD", False)
SECURE_PROXY_SSL_HEADER = env_header("DJANGO_SECURE_PROXY_SSL_HEADER")
CSRF_TRUSTED_ORIGINS = env_origins("DJANGO_CSRF_TRUSTED_ORIGINS")
# security.W021 asks for HSTS preload. Preloading consents to browsers' built-in HTTPS lists for
# the whole domain, which is the deployer's choice (DJANGO_HSTS_PRELOAD=1), not a default.
SILENCED_SYSTEM_CHECKS = [] if SECURE_HSTS_PRELOAD else ["security.W021"]

LOGIN_URL = "admin:login"

# --- Nightly series: regression detection and sweep comparison (benchkit.compare) --------------
# DRAFTBOARD_REGRESSION_WINDOW: N previous nights whose median is the baseline.
# DRAFTBOARD_REGRESSION_THRESHOLD_PCT: how much worse than that baseline counts, in %.
# DRAFTBOARD_REGRESSION_TEST: auto (Mann-Whitney where a night has >= 3 repeats, else the
#   rolling-median rule on two consecutive nights), hud (always the rolling-median rule) or
#   mannwhitney (repeats only). DRAFTBOARD_REGRESSION_ALPHA: the Mann-Whitney level.
# DRAFTBOARD_COMPARE_NOISE_PCT: on the compare page, a single-run change smaller than this is
#   "no significant change" (with >= 3 repeats the bootstrap interval decides instead).
DRAFTBOARD_REGRESSION_WINDOW = env_int("DRAFTBOARD_REGRESSION_WINDOW", 5)
DRAFTBOARD_REGRESSION_THRESHOLD_PCT = env_float("DRAFTBOARD_REGRESSION_THRESHOLD_PCT", 10.0)
DRAFTBOARD_REGRESSION_TEST = env_str("DRAFTBOARD_REGRESSION_TEST", "auto")
DRAFTBOARD_REGRESSION_ALPHA = env_float("DRAFTBOARD_REGRESSION_ALPHA", 0.05)
DRAFTBOARD_COMPARE_NOISE_PCT = env_float("DRAFTBOARD_COMPARE_NOISE_PCT", 5.0)
try:  # refuse a bad combination at start-up, naming the variable
    from benchkit.compare.regressions import RegressionRule as _Rule

    _Rule(window=DRAFTBOARD_REGRESSION_WINDOW, threshold_pct=DRAFTBOARD_REGRESSION_THRESHOLD_PCT,
          test=DRAFTBOARD_REGRESSION_TEST, alpha=DRAFTBOARD_REGRESSION_ALPHA,
          min_history=min(3, max(1, DRAFTBOARD_REGRESSION_WINDOW)))
except ValueError as _exc:
    raise ConfigError(f"DRAFTBOARD_REGRESSION_*: {_exc}") from None
if not DRAFTBOARD_COMPARE_NOISE_PCT >= 0:
    raise ConfigError(f"DRAFTBOARD_COMPARE_NOISE_PCT={DRAFTBOARD_COMPARE_NOISE_PCT} must be >= 0")

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
CELERY_BEAT_SCHEDULER = "runs.scheduler:ResilientScheduler"  # rides out database outages (issue 35)
CELERY_TIMEZONE = "UTC"
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_str("DRAFTBOARD_LOG_LEVEL", "INFO")},
    # plotly's static export (the PDF report) logs every step of its Chromium session at INFO
    "loggers": {name: {"level": "WARNING"} for name in ("kaleido", "choreographer", "logistro")},
}

# --- Run supervision (issue 11; runs.services.supervision), seconds ---------------------------
DRAFTBOARD_HEARTBEAT_INTERVAL_S = env_int("DRAFTBOARD_HEARTBEAT_INTERVAL_S", 10)
DRAFTBOARD_HEARTBEAT_TIMEOUT_S = env_int("DRAFTBOARD_HEARTBEAT_TIMEOUT_S", 60)
DRAFTBOARD_SUPERVISE_INTERVAL_S = env_int("DRAFTBOARD_SUPERVISE_INTERVAL_S", 30)
DRAFTBOARD_RECONCILE_MARGIN_S = env_int("DRAFTBOARD_RECONCILE_MARGIN_S", 30)
# How long a worker retries its database work (state moves, the outcome store, the lease
# release) through an outage before the run fails `database_unavailable` (runs.services.dbretry).
DRAFTBOARD_DB_RETRY_MAX_S = env_int("DRAFTBOARD_DB_RETRY_MAX_S", 900)
for _name in ("DRAFTBOARD_HEARTBEAT_INTERVAL_S", "DRAFTBOARD_HEARTBEAT_TIMEOUT_S", "DRAFTBOARD_SUPERVISE_INTERVAL_S"):
    if globals()[_name] < 1:
        raise ConfigError(f"{_name}={globals()[_name]}: must be at least 1 (seconds)")
if DRAFTBOARD_HEARTBEAT_TIMEOUT_S <= DRAFTBOARD_HEARTBEAT_INTERVAL_S:
    raise ConfigError(f"DRAFTBOARD_HEARTBEAT_TIMEOUT_S={DRAFTBOARD_HEARTBEAT_TIMEOUT_S} must exceed "
                      f"DRAFTBOARD_HEARTBEAT_INTERVAL_S={DRAFTBOARD_HEARTBEAT_INTERVAL_S}")

# --- Offline hosts (issue 11; runs.services.ingest, POST /api/ingest/) ------------------------
# Most bytes of one uploaded bundle (the tar.gz as sent); larger uploads get 413.
DRAFTBOARD_INGEST_MAX_BYTES = env_int("DRAFTBOARD_INGEST_MAX_BYTES", 256 * 1024 * 1024)

# --- Least privilege (issue 11; runs.services.policy) -----------------------------------------
# What a sweep entered on the web by a user who is not a superuser may put into a GPU host's
# server environment and command line (resource knobs only; nothing that loads code or paths).
DRAFTBOARD_SERVER_ENV_ALLOWLIST = env_list("DRAFTBOARD_SERVER_ENV_ALLOWLIST", [
    "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "NCCL_P2P_DISABLE", "NCCL_IB_DISABLE"])
DRAFTBOARD_EXTRA_ARGS_ALLOWLIST = env_list("DRAFTBOARD_EXTRA_ARGS_ALLOWLIST", [
    "--gpu-memory-utilization", "--max-num-seqs", "--max-num-batched-tokens", "--enforce-eager",
    "--mem-fraction-static", "--max-running-requests", "--chunked-prefill-size", "--cuda-graph-max-bs",
    "--disable-cuda-graph", "--per-request-spec-decode-metrics"])
