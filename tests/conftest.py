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


def pytest_collection_modifyitems(config, items):
    """Skip `gpu` tests where no NVIDIA GPU answers NVML (CI has none)."""
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
