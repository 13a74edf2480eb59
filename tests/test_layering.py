"""Architectural rules written as tests (docs/ARCHITECTURE.md, "Layers").

- benchkit must run alone on an offline GPU host: importing any of its modules imports no Django.
- Dependencies go one way: tasks -> services -> benchkit; analysis reads runs through selectors.
  No module of `runs` imports `analysis`; no service imports the tasks module or the Celery app;
  no module of `benchkit` imports `runs`, `analysis` or `benchsite`.
- Only the engine modules name engines (benchkit/engines/kinds/, registered in
  benchkit/engines/registry.py): no branch on an engine's name (`== "vllm"`, `in ("vllm",
  "sglang")`, `.startswith("sglang")`) anywhere else in benchkit, runs or analysis, and nothing
  outside benchkit/engines imports an engine module (the registry hands out its class).
"""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import benchkit
from benchkit.engines import registry

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


def test_rule_catches_a_wrong_import(tmp_path):
    """The scanner sees imports inside functions too (so the rules above can fail)."""
    p = tmp_path / "m.py"
    p.write_text("def f():\n    from analysis import figures\n    import runs.tasks\n")
    assert {"analysis", "analysis.figures", "runs.tasks"} <= _imports(p)


#: Engine modules: the one place an engine's name may decide anything.
ENGINE_MODULES = ("benchkit/engines/kinds/", "benchkit/engines/registry.py")
#: Files that compare against a string that happens to be an engine name, and why.
ENGINE_NAME_EXEMPT = {
    "benchkit/formats/reader.py": "result-file format names (`vllm` is `vllm bench serve`'s JSON format), "
                                  "not engines; the format registry replaces them",
}


def _engine_name_branches(path: Path) -> list[str]:
    """Each comparison, membership test or prefix test of `path` against a registered engine's
    name (`x == "vllm"`, `x in ("vllm", "sglang")`, `x.startswith("sglang")`), as `file:line`."""
    names = set(registry.engine_names())

    def strings(node: ast.AST) -> set[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value}
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return set().union(*map(strings, node.elts)) if node.elts else set()
        return set()

    def names_an_engine(text: str) -> bool:
        return any(text == n or (text.startswith(n) and not text[len(n)].isalnum()) for n in names)

    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            hit = set().union(*(strings(x) for x in (node.left, *node.comparators))) & names
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("startswith", "endswith")):
            hit = {t for a in node.args for t in strings(a) if names_an_engine(t)}
        else:
            continue
        if hit:
            found.append(f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}:{node.lineno}: "
                         f"{', '.join(sorted(hit))}")
    return found


def test_only_engine_modules_branch_on_engine_names():
    bad = []
    for folder in ("benchkit", "runs", "analysis"):
        for path in _py_files(folder):
            rel = str(path.relative_to(REPO))
            if rel.startswith(ENGINE_MODULES) or rel in ENGINE_NAME_EXEMPT:
                continue
            bad += _engine_name_branches(path)
            bad += [f"{rel} imports {name}" for name in sorted(_imports(path))
                    if name.startswith("benchkit.engines.kinds") and not rel.startswith("benchkit/engines/")]
    assert not bad, ("engine names outside the engine modules (declare the fact on the engine's class in "
                     "benchkit/engines/kinds/ and ask the registry):\n" + "\n".join(bad))


def test_engine_name_rule_can_fail(tmp_path):
    p = tmp_path / "m.py"
    p.write_text('if s.engine == "vllm":\n    pass\nok = tool in ("sglang", "x")\n'
                 'u = t.startswith("sglang")\nv = m.startswith("vllm:spec_decode")\n'
                 'w = t.startswith("vllmx")\nz = name == "vllm-like"\n')
    assert [line.split(":", 2)[1] for line in _engine_name_branches(p)] == ["1", "3", "4", "5"]
