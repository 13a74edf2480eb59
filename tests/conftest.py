"""Shared fixtures. Imports nothing from Django at module level, so the benchkit tests also run
on an offline GPU host without Django (`python3 -m pytest tests/test_gpu_device.py`)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Demo models built by the tests (and by `manage.py demo` run from a test) train for a few steps
# only (benchkit.engines.demo_models.QUICK_TRAIN_SPEC): tests need the files, not the acceptance.
os.environ.setdefault("DRAFTBOARD_DEMO_QUICK", "1")
SHARED_FIXTURES = REPO.parent / "shared" / "fixtures"


def _have_nvidia_gpu() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount() > 0
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return False


#: Fixtures through which a test reaches the storage that leg 2 swaps (the database, and the
#: broker through the database's worker tests): pytest-django's own, checked against each
#: item's whole fixture closure, so a project fixture that asks for `db` counts too.
STORAGE_FIXTURES = frozenset({
    "db", "transactional_db", "django_db_reset_sequences", "django_db_serialized_rollback",
    "live_server", "admin_user", "admin_client", "django_user_model", "django_username_field",
})  # not django_db_setup / django_db_blocker: pytest-django's autouse helper puts them in every closure
#: Leg 2 (scripts/test.sh sets DRAFTBOARD_TEST_LEG=postgres): only what can fail differently on
#: PostgreSQL + the machine's Redis runs again.
POSTGRES_LEG = "postgres"


def uses_storage(item) -> bool:
    """True when `item` can reach the database or the broker leg 2 points at: it has the
    `django_db` or `postgres` marker, or one of STORAGE_FIXTURES in its fixture closure. Any
    other test is refused database access by pytest-django, and its subprocesses (manage.py,
    gunicorn, workers) get no test database URL; a Celery worker test hands its worker the test
    database, so it is `django_db` too (tests/celeryproc.database_url)."""
    if item.get_closest_marker("django_db") or item.get_closest_marker("postgres"):
        return True
    return not STORAGE_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))


def _select_postgres_leg(config, items) -> None:
    keep, drop = [], []
    for item in items:
        (keep if uses_storage(item) else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_collection_modifyitems(config, items):
    """Leg 2 keeps only the storage tests (uses_storage); skip `gpu` tests where no NVIDIA GPU
    answers NVML (CI has none)."""
    if os.environ.get("DRAFTBOARD_TEST_LEG") == POSTGRES_LEG:
        _select_postgres_leg(config, items)
    if any("gpu" in item.keywords for item in items) and not _have_nvidia_gpu():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU (run on the device machine)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def shared_fixtures() -> Path:
    """../shared/fixtures beside the repo (read in place)."""
    assert SHARED_FIXTURES.is_dir(), f"{SHARED_FIXTURES} missing: CI lays shared/ beside the clone"
    return SHARED_FIXTURES


@pytest.fixture(scope="session")
def demo_models(tmp_path_factory):
    """The demo target and draft model directories, built once per session (no download).

    Reuses $DRAFTBOARD_TEST_MODELS_DIR when set (to keep them between sessions)."""
    from benchkit.engines.demo_models import build_demo_models

    root = os.environ.get("DRAFTBOARD_TEST_MODELS_DIR")
    return build_demo_models(Path(root) if root else tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def chromium_path() -> str:
    """Debian's chromium binary (installed by scripts/system_deps.sh)."""
    path = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(path).exists():
        pytest.fail("chromium is not installed: run `make test` (it installs Debian's chromium)")
    return path
