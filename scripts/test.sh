#!/usr/bin/env bash
# Every test, twice over the storage layer:
#   leg 1: the embedded default: SQLite + the private Redis on a unix socket (all tests)
#   leg 2: the real PostgreSQL and Redis of this machine, on the tests that can fail differently
#          there (DRAFTBOARD_TEST_LEG=postgres; tests/conftest.py uses_storage): those with the
#          `django_db` marker or a database fixture (every Celery worker and browser test that
#          hands its processes the test database is one), plus the `postgres`-marked ones, each
#          with its reason; the rest is deselected ("N deselected"). vLLM-only tests are left
#          out; the Celery + vLLM integration test runs here too.
# plus ruff. Real-server tests are marked (vllm, celery, browser) and run in both CI legs as stated.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
export PYTHONUNBUFFERED=1
echo "== ruff"
$BIN/ruff check .
echo "== migrations are up to date"
DRAFTBOARD_VAR_DIR="$(mktemp -d)" $BIN/python manage.py makemigrations --check --dry-run >/dev/null

VAR1="$(mktemp -d)"
echo "== leg 1: SQLite + private Redis (DRAFTBOARD_VAR_DIR=$VAR1)"
env -u DATABASE_URL -u REDIS_URL -u CELERY_BROKER_URL DRAFTBOARD_VAR_DIR="$VAR1" \
  $BIN/python -m pytest -q -p no:cacheprovider "$@"

VAR2="$(mktemp -d)"
PG_URL="${DRAFTBOARD_TEST_PG_URL:-postgres://postgres@127.0.0.1:5432/draftboard}"
REDIS_TEST_URL="${DRAFTBOARD_TEST_REDIS_URL:-redis://127.0.0.1:6379/15}"
echo "== leg 2: PostgreSQL ($PG_URL) + Redis ($REDIS_TEST_URL)"
env -u CELERY_BROKER_URL DRAFTBOARD_TEST_LEG=postgres DATABASE_URL="$PG_URL" REDIS_URL="$REDIS_TEST_URL" DRAFTBOARD_VAR_DIR="$VAR2" \
  $BIN/python -m pytest -q -p no:cacheprovider -m "not vllm or celery" "$@"
