"""Architectural rules written as tests (docs/ARCHITECTURE.md, "Layers").

- benchkit must run alone on an offline GPU host: importing any of its modules imports no Django
  (benchkit.point, the record every page reads, included).
- Dependencies go one way: tasks -> services -> benchkit; analysis reads runs through selectors.
  No module of `runs` imports `analysis`; no service imports the tasks module or the Celery app;
  no module of `benchkit` imports `runs`, `analysis` or `benchsite`.
- A point (benchkit.point.Point) is made in two places only: its own module and, from stored
  runs, `runs/selectors.py` (`load_points`); analysis and services read points through it.
"""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import benchkit

REPO = Path(__file__).resolve().parents[1]


def _benchkit_modules() -> list[str]:
    return [m.name for m in pkgutil.walk_packages(benchkit.__path__, "benchkit.")]


def _imports(path: Path) -> set[str]:
    """Every module name `path` imports, at any depth of the file (function-level imports too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def _py_files(folder: str) -> list[Path]:
    return sorted(p for p in (REPO / folder).rglob("*.py") if "migrations" not in p.parts)




def test_benchkit_imports_no_django():
    modules = _benchkit_modules()
    assert "benchkit.sweeps.runner" in modules and "benchkit.measure.loadgen" in modules
    assert "benchkit.point" in modules and "benchkit.compare.stats" in modules
    code = "import importlib, sys\n" + "".join(f"importlib.import_module({m!r})\n" for m in modules) + \
        "bad = sorted(m for m in sys.modules if m == 'django' or m.startswith('django.'))\n" \
        "print(','.join(bad))\n"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"benchkit pulled in Django modules: {out.stdout.strip()}"


@pytest.mark.parametrize(("folder", "forbidden"), [
    ("benchkit", ("django", "runs", "analysis", "benchsite", "celery")),
    ("runs", ("analysis",)),
    ("runs/services", ("runs.tasks", "runs.worker", "benchsite.celery")),
    ("runs/selectors.py", ("runs.services", "runs.tasks")),
    ("analysis", ("runs.tasks", "runs.services")),
])
def test_imports_go_one_way(folder, forbidden):
    """A module may only import downwards: an import listed here would run against the layers."""
    target = REPO / folder
    files = [target] if target.is_file() else _py_files(folder)
    bad = []
    for path in files:
        for name in sorted(_imports(path)):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                bad.append(f"{path.relative_to(REPO)} imports {name}")
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


#: What makes a point, and the only files that may call it.
_POINT_MAKERS = ("Point", "build_points", "_points_of")
_MAY_MAKE_POINTS = ("benchkit/point.py", "runs/selectors.py")


def _calls(path: Path, names: tuple[str, ...]) -> list[tuple[int, str]]:
    """(line, name) of every call of a function or class named in `names` in `path`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if name in names:
                out.append((node.lineno, name))
    return out


def test_points_are_made_in_one_place(tmp_path):
    bad = [f"{path.relative_to(REPO)}:{line} calls {name}" for folder in ("benchkit", "runs", "analysis", "benchsite")
           for path in _py_files(folder) if str(path.relative_to(REPO)) not in _MAY_MAKE_POINTS
           for line, name in _calls(path, _POINT_MAKERS)]
    assert not bad, "points made outside benchkit/point.py and runs/selectors.py:\n" + "\n".join(bad)
    p = tmp_path / "m.py"  # the scanner sees both spellings of a call
    p.write_text("from benchkit import point\ndef f(rows):\n    return point.build_points((), (), rows), Point()\n")
    assert _calls(p, _POINT_MAKERS) == [(3, "build_points"), (3, "Point")]


def test_rule_catches_a_wrong_import(tmp_path):
    """The scanner sees imports inside functions too (so the rules above can fail)."""
    p = tmp_path / "m.py"
    p.write_text("def f():\n    from analysis import figures\n    import runs.tasks\n")
    assert {"analysis", "analysis.figures", "runs.tasks"} <= _imports(p)
