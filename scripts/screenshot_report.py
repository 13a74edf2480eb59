"""Take docs/screenshots/report.png: the first page of the users' grid's PDF report.

    .venv/bin/python scripts/screenshot_report.py [--out docs/screenshots/report.png] [--page 1] [--dpi 100]

Builds the users' grid (tests/usersgrid.py, through the real services) in a fresh SQLite
database under a temporary DRAFTBOARD_VAR_DIR, runs `manage.py report` on it (kaleido, Chromium,
pdflatex) and renders the page with `pdftoppm` (poppler-utils). Needs scripts/system_deps.sh.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "screenshots" / "report.png")
    ap.add_argument("--page", type=int, default=1)
    ap.add_argument("--dpi", type=int, default=100)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        var = Path(tmp)
        code = ("import sys, django; django.setup(); from django.core.management import call_command; "
                "call_command('migrate', verbosity=0); from tests.usersgrid import make_users_grid; "
                "call_command('report', str(make_users_grid().pk), '--out', sys.argv[1])")
        env = {**os.environ, "DRAFTBOARD_VAR_DIR": str(var), "DJANGO_SETTINGS_MODULE": "benchsite.settings"}
        env.pop("DATABASE_URL", None)
        out = subprocess.run([sys.executable, "-c", code, str(var / "report")], cwd=REPO, env=env, check=True,
                             capture_output=True, text=True)
        pdf = Path(out.stdout.strip().splitlines()[-1])
        subprocess.run(["pdftoppm", "-r", str(args.dpi), "-png", "-f", str(args.page), "-l", str(args.page),
                        "-singlefile", str(pdf), str(args.out.with_suffix(""))], check=True)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
