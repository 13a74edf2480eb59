"""Take docs/screenshots/sweep.png: the sweep page of the users' grid in headless Chromium.

    .venv/bin/python scripts/screenshot_sweep.py [--out docs/screenshots/sweep.png] [--width 1400]

Builds the users' grid (tests/usersgrid.py, through the real services) in a fresh SQLite
database under a temporary DRAFTBOARD_VAR_DIR, starts `manage.py runserver` on it, waits until
the page's figures are drawn, and saves a full-page screenshot. Needs Debian's chromium
(scripts/system_deps.sh). Exits 1 when the page logs an error or the figures do not draw.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _build(var: Path) -> int:
    """The users' grid in a new database under `var`; returns the sweep id."""
    code = ("import django; django.setup(); from django.core.management import call_command; "
            "call_command('migrate', verbosity=0); from tests.usersgrid import make_users_grid; "
            "print(make_users_grid().pk)")
    env = {**os.environ, "DRAFTBOARD_VAR_DIR": str(var), "DJANGO_SETTINGS_MODULE": "benchsite.settings"}
    env.pop("DATABASE_URL", None)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, check=True, capture_output=True, text=True)
    return int(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "screenshots" / "sweep.png")
    ap.add_argument("--width", type=int, default=1400)
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        var = Path(tmp)
        sweep = _build(var)
        port = _free_port()
        env = {**os.environ, "DRAFTBOARD_VAR_DIR": str(var)}
        env.pop("DATABASE_URL", None)
        argv = [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload", "--insecure"]
        server = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}/sweeps/{sweep}/"
            for _ in range(100):
                try:
                    urllib.request.urlopen(url, timeout=2)
                    break
                except OSError:
                    time.sleep(0.2)
            errors: list[str] = []
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": args.width, "height": 900})
                page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.goto(url)
                page.wait_for_selector("#sweep-figures[data-state=ready]", timeout=30_000)
                page.wait_for_timeout(300)
                args.out.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(args.out), full_page=True)
                browser.close()
        finally:
            server.terminate()
            server.wait(timeout=10)
    if errors:
        print("page errors:", *errors, sep="\n  ")
        return 1
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
