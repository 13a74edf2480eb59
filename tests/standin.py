"""Helpers for tests that start the stand-in engine (tests/standin/standin_engine, pure stdlib):
a model directory preflight accepts, a flags file whose builds launch the stand-in, and a fresh
virtualenv holding it as an installed distribution."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil

STANDIN_SRC = Path(__file__).resolve().parent / "standin"
#: The stand-in's distribution name and version (tests/standin/standin_engine/__init__.py).
DIST_NAME, DIST_VERSION = "draftboard-standin-engine", "0.7.1+standin"


def model_dir(root: Path) -> Path:
    """A model directory that preflight accepts with `load_format: dummy` (config + tokenizer)."""
    d = root / "standin-model"
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({"architectures": ["StandIn"]}))
    (d / "tokenizer.json").write_text("{}")
    return d


def flags_file(path: Path, engine: str = "vllm", python: str | None = None, build: str = "",
               launcher: dict | None = None) -> Path:
    """A flags file (benchkit.engines.flags layout) whose `engine` (or build `build` of it) launches
    `python -m standin_engine` instead of the engine; `python` / `launcher` set its environment."""
    block: dict = {"launch": ["-m", "standin_engine", "--model", "{model}", "--host", "127.0.0.1",
                              "--port", "{port}", "--tp-size", "{tp}"]}
    if python:
        block["python"] = python
    if launcher:
        block["launcher"] = launcher
    doc = {"builds": {build: {"engine": engine, **block}}} if build else {"engines": {engine: block}}
    path.write_text(json.dumps(doc))  # JSON is YAML
    return path


def make_venv(root: Path) -> Path:
    """A second virtualenv (`python -m venv --without-pip --copies`, no system site-packages; its
    interpreter is a copy, so /proc/PID/exe of its processes names it and not draftboard's)
    holding the stand-in engine as the installed distribution DIST_NAME DIST_VERSION (package
    files plus a .dist-info with METADATA, top_level.txt and RECORD). Returns its interpreter."""
    venv = root / "engine-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--copies", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True, timeout=60).stdout.strip())
    pkg = site / "standin_engine"
    pkg.mkdir(parents=True)
    files = []
    for src in sorted((STANDIN_SRC / "standin_engine").glob("*.py")):
        (pkg / src.name).write_bytes(src.read_bytes())
        files.append(f"standin_engine/{src.name}")
    info = site / f"{DIST_NAME.replace('-', '_')}-{DIST_VERSION}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DIST_NAME}\nVersion: {DIST_VERSION}\n")
    (info / "top_level.txt").write_text("standin_engine\n")
    (info / "RECORD").write_text("".join(f"{f},,\n" for f in [*files, f"{info.name}/METADATA",
                                                               f"{info.name}/top_level.txt", f"{info.name}/RECORD"]))
    return python


def standin_pids() -> list[int]:
    """Pids of live stand-in engine processes (any leftover after a teardown is a leak)."""
    out = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and "standin_engine" in " ".join(p.info["cmdline"] or []):
                out.append(p.info["pid"])
        except psutil.Error:
            continue
    return out
