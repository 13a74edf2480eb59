"""benchkit must run alone on an offline GPU host: importing it must not import Django."""

import pkgutil
import subprocess
import sys
from pathlib import Path

import benchkit

REPO = Path(__file__).resolve().parents[1]


def test_benchkit_imports_no_django():
    modules = [m.name for m in pkgutil.iter_modules(benchkit.__path__, "benchkit.")]
    assert "benchkit.runner" in modules and "benchkit.loadgen" in modules
    code = "import importlib, sys\n" + "".join(f"importlib.import_module({m!r})\n" for m in modules) + \
        "bad = sorted(m for m in sys.modules if m == 'django' or m.startswith('django.'))\n" \
        "print(','.join(bad))\n"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"benchkit pulled in Django modules: {out.stdout.strip()}"
