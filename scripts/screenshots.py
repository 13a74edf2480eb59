"""Screenshots of the dashboard for the README: seeds a fresh demo database with a nightly series
of the users' grid (tests/nightly.py: 14 nights of sweeps/users-grid-sglang.yaml on an 8-GPU
PCIe host, through the real services, one planted regression) and saves PNGs of the compare,
trend and home pages into docs/screenshots/ (the sweep page's, of the users' grid itself, is
scripts/screenshot_sweep.py's).

    .venv/bin/python scripts/screenshots.py [--out docs/screenshots] [--nights 14] [--keep]

Uses its own SQLite database in a temporary DRAFTBOARD_VAR_DIR (never the one `make demo`
uses), serves it with `manage.py runserver --insecure` on a free port, and drives Debian's
chromium (/usr/bin/chromium) through Playwright. Exits 2 when chromium is missing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-quic", "--no-first-run", "--disable-component-update", "--disable-sync"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def seed(nights: int) -> dict:
    """Migrate the (fresh) database and build the nightly series; returns the ids to shoot."""
    import django

    sys.path.insert(0, str(REPO))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchsite.settings")
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from tests.nightly import build_nightly_series

    s = build_nightly_series(nights=nights)
    return {"host": s.host.name, "series": s.sweeps[-1].name, "last": s.sweeps[-1].pk,
            "before": s.sweeps[-3].pk}


def shoot(base: str, ids: dict, out: Path, chromium: str) -> list[Path]:
    """Save one full-page PNG per page; returns the paths."""
    from playwright.sync_api import sync_playwright

    pages = {
        "home.png": "/",
        "compare.png": f"/compare/?old={ids['before']}&new={ids['last']}",
        "trend.png": f"/trend/?host={ids['host']}&series={ids['series']}",
    }
    out.mkdir(parents=True, exist_ok=True)
    saved = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1440, "height": 900}, device_scale_factor=1)
        for name, path in pages.items():
            page.goto(base + path)
            if page.locator("#sweep-figures").count():  # the sweep page draws from its data.json
                page.wait_for_selector("#sweep-figures[data-state=ready]", timeout=30_000)
                page.wait_for_timeout(800)
            elif page.locator("[data-figure]").count():
                page.wait_for_selector(".js-plotly-plot .main-svg", timeout=30_000)
                page.wait_for_timeout(800)  # let plotly finish its layout transitions
            page.screenshot(path=str(out / name), full_page=True)
            saved.append(out / name)
        browser.close()
    return saved


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "screenshots")
    ap.add_argument("--nights", type=int, default=14)
    ap.add_argument("--keep", action="store_true", help="keep the temporary database directory")
    args = ap.parse_args()
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(chromium).exists():
        print("chromium is not installed (apt-get install chromium)", file=sys.stderr)
        return 2
    var = Path(tempfile.mkdtemp(prefix="draftboard-shots-"))
    os.environ.update(DRAFTBOARD_VAR_DIR=str(var), DJANGO_DEBUG="0")
    os.environ.pop("DATABASE_URL", None)
    ids = seed(args.nights)
    port = _free_port()
    log = open(var / "web.log", "wb")
    web = subprocess.Popen([sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload",
                            "--insecure"], cwd=REPO, env=os.environ.copy(), stdout=log, stderr=subprocess.STDOUT,
                           start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                urllib.request.urlopen(base + "/", timeout=2)
                break
            except OSError:
                time.sleep(0.2)
        for p in shoot(base, ids, args.out, chromium):
            print(p.relative_to(REPO) if p.is_relative_to(REPO) else p)
    finally:
        web.terminate()
        web.wait(timeout=10)
        log.close()
        if not args.keep:
            shutil.rmtree(var, ignore_errors=True)
        else:
            print(f"database kept in {var}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
