"""Architectural rules written as tests (docs/ARCHITECTURE.md, "Layers").

- benchkit must run alone on an offline GPU host: importing any of its modules imports no Django
  (benchkit.point, the record every page reads, included).
- Dependencies go one way: tasks -> services -> benchkit; analysis reads runs through selectors.
  No module of `runs` imports `analysis`; no service imports the tasks module or the Celery app;
  no module of `benchkit` imports `runs`, `analysis` or `benchsite`; `benchsite` (settings, URLs,
  the Celery app) is the top: no app imports it (the dev stack's supervisor is `runs.localstack`).
- Result formats (benchkit/formats/): the shared pieces (errors, jsontext, common, base, limits)
  import no format module, the registry or the reader; a format module imports no other format
  module, the registry or the reader; the registry imports the format modules.
- No import circle: the graph of which module imports which (every import, at any depth of a
  file, `TYPE_CHECKING` blocks included) over benchkit, runs, analysis and benchsite has no
  cycle, so each module can be read knowing only those below it.
- Only the engine modules name engines (benchkit/engines/kinds/, registered in
  benchkit/engines/registry.py): no branch on an engine's name (`== "vllm"`, `in ("vllm",
  "sglang")`, `.startswith("sglang")`) anywhere else in benchkit, runs or analysis, and nothing
  outside benchkit/engines imports an engine module (the registry hands out its class).
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


#: The packages whose import graph must have no cycle.
PACKAGES = ("benchkit", "runs", "analysis", "benchsite")


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """{module: the modules of `packages` it imports} for every .py file under root/<package>
    (migrations left out). An import names the deepest known module it reaches (`from a.b import
    c` is `a.b.c` when that is a module, else `a.b`); relative imports are resolved; a package's
    `__init__` counts as the package."""
    files = {(_module_name(p, root)): p for pkg in packages for p in (root / pkg).rglob("*.py")
             if "migrations" not in p.parts}
    known = set(files)

    def deepest(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                targets.update(filter(None, (deepest(a.name) for a in node.names)))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets.update(filter(None, (deepest(f"{base}.{a.name}") for a in node.names)))
        targets.discard(module)
        graph[module] = {t for t in targets if not module.startswith(t + ".")}  # a module's own package
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of `graph` with more than one module (Tarjan's
    algorithm, iterative), each sorted; [] when the graph has no cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found



def test_benchkit_imports_no_django():
    modules = _benchkit_modules()
    assert "benchkit.execution.runner" in modules and "benchkit.measure.loadgen" in modules
    assert "benchkit.point" in modules and "benchkit.compare.stats" in modules
    code = "import importlib, sys\n" + "".join(f"importlib.import_module({m!r})\n" for m in modules) + \
        "bad = sorted(m for m in sys.modules if m == 'django' or m.startswith('django.'))\n" \
        "print(','.join(bad))\n"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"benchkit pulled in Django modules: {out.stdout.strip()}"


@pytest.mark.parametrize(("folder", "forbidden"), [
    ("benchkit", ("django", "runs", "analysis", "benchsite", "celery")),
    # execution takes RunSpecs: the sweep-file side (parsing, dry run) sits above it
    ("benchkit/execution", ("benchkit.sweeps",)),
    ("benchkit/measure", ("benchkit.execution", "benchkit.sweeps")),
    ("runs", ("analysis", "benchsite")),
    ("runs/services", ("runs.tasks", "runs.worker", "benchsite.celery")),
    ("runs/selectors.py", ("runs.services", "runs.tasks")),
    ("analysis", ("runs.tasks", "runs.services", "benchsite")),
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


def test_no_import_circle():
    graph = import_graph(REPO, PACKAGES)
    assert {"benchkit.formats.jsontext", "benchkit.measure.loadgen", "runs.services.imports"} <= set(graph)
    assert "benchkit.measure.loadworkers" in graph["benchkit.measure.loadgen"]  # the graph sees real imports
    found = cycles(graph)
    assert not found, "import circles (each group imports itself through the others):\n" + "\n".join(
        " <-> ".join(c) for c in found)


def test_circle_finder_finds_circles(tmp_path):
    """The graph builder resolves absolute, relative and function-level imports, and the circle
    finder reports a three-module circle and a pair, not the acyclic rest."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..c import x\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n")
    (pkg / "d.py").write_text("from . import e\n")
    (pkg / "e.py").write_text("import pkg.d\nimport pkg.a\n")
    graph = import_graph(tmp_path, ("pkg",))
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.c"}
    assert cycles(graph) == [["pkg.a", "pkg.c", "pkg.sub.b"], ["pkg.d", "pkg.e"]]
    assert cycles({"x": {"y"}, "y": set()}) == []


#: A format module that reads another format's files through that module, and why.
FORMAT_READS_FORMAT = {
    ("benchkit.formats.vllm_sweep", "benchkit.formats.vllm_bench"):
        "a vllm bench sweep folder is vllm bench serve result files: one reader of them",
}


def test_format_modules_stand_between_the_interface_and_the_registry():
    from benchkit.formats.registry import FORMATS

    graph = import_graph(REPO, PACKAGES)
    formats = {type(f).__module__ for f in FORMATS.values()}
    assert formats == {f"benchkit.formats.{m}" for m in ("vllm_bench", "sglang_bench", "aiperf", "guidellm",
                                                         "genai_bench", "inference_perf", "vllm_sweep")}
    above = formats | {"benchkit.formats.registry", "benchkit.formats.reader"}
    shared = [f"benchkit.formats.{m}" for m in ("errors", "jsontext", "common", "base", "limits")]
    bad = [f"{m} imports {t}" for m in shared for t in sorted(graph[m] & above)]
    bad += [f"{m} imports {t}" for m in sorted(formats) for t in sorted(graph[m] & (above - {m}))
            if (m, t) not in FORMAT_READS_FORMAT]
    assert not bad, "result-format modules against their layers:\n" + "\n".join(bad)
    assert formats <= graph["benchkit.formats.registry"]


#: Engine modules: the one place an engine's name may decide anything.
ENGINE_MODULES = ("benchkit/engines/kinds/", "benchkit/engines/registry.py")
#: Files that compare against a string that happens to be an engine name, and why.
ENGINE_NAME_EXEMPT: dict[str, str] = {}


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
