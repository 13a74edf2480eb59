"""Where an engine build's server runs, and what that environment holds.

A build (a block of engine_flags.yaml, `engines.NAME` or `builds.NAME`; layout in
benchkit.engines.flags) names how its server starts:

- `python: /opt/sglang-ddtree/bin/python`: that interpreter runs `-m sglang.launch_server ...`
  (the build's own virtualenv or conda environment, with its CUDA torch); without it, the
  interpreter draftboard runs under;
- `launcher: {argv: [...], container: {runtime, image}}`: argv templates put before the
  interpreter, e.g. `docker run --rm --name {name} --gpus '"device={gpu_uuids}"' --env-file
  {env_file} -v {model}:{model}:ro {image}` with `python: python3` (the interpreter in the image).

`BuildEnv` is that, resolved for one build; `Launch` is one server start made from it: the argv
(always a list, never a shell string), the environment, the container name the launch assigned
and `stop_outside`, which stops what the launch started outside the server's process group (a
container: `RUNTIME stop -t S NAME`, then `RUNTIME container inspect` to see it gone), used by
`benchkit.engines.server.ManagedServer.stop` before it stops the group.

`check_engine_env(launch)` is the build's preflight and its provenance in one child process run
through the same interpreter or launcher as the server: the interpreter or launcher exists, the
image is present locally, the engine's package is found there (importlib.util.find_spec, without
executing it: importing vLLM takes 5-15 s), and it reads the engine's distribution and version,
the git commit of a source build, torch's version and CUDA version, and the Python version.
Failures raise PreflightError `engine_env_error` naming the build and what is missing.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchkit.engines.flags import PLACEHOLDER_RE, EngineConfigError
from benchkit.hosts.preflight import ENGINE_ENV_ERROR, PreflightError
from benchkit.specs import GpuRef

#: Seconds a probe child (through a launcher: a container start) may take.
PROBE_TIMEOUT_S = 120.0
#: Seconds added to the stop timeout for the container runtime's own `stop` command.
RUNTIME_SLACK_S = 30.0


@dataclass(frozen=True)
class BuildEnv:
    """Where one build's servers run.

    `build` the build's name (the engine's name for its own block); `engine` vllm or sglang;
    `python` the interpreter that runs the server's module (an absolute path, or inside a
    launcher the name the launcher resolves); `launcher` the launcher's argv templates ([] for a
    plain interpreter; elements as benchkit.engines.flags._launcher_arg); `container` {"runtime",
    "image"} when the launcher starts a container; `module` the top-level package the server runs
    (`sglang` for `-m sglang.launch_server`); `distributions` distribution names tried for the
    version when the module's own distribution is not found."""

    build: str
    engine: str
    python: str
    launcher: tuple[Any, ...] = ()
    container: dict[str, str] | None = None
    module: str = ""
    distributions: tuple[str, ...] = ()

    @property
    def kind(self) -> str:
        """`interpreter`, `launcher` or `container`."""
        return "container" if self.container else "launcher" if self.launcher else "interpreter"

    def describe(self) -> str:
        """One line for messages: `build 'x' (interpreter /opt/x/bin/python)`."""
        if self.container:
            how = f"{self.container['runtime']} image {self.container['image']}, interpreter {self.python}"
        elif self.launcher:
            first = self.launcher[0] if isinstance(self.launcher[0], str) else "launcher"
            how = f"launcher {first}, interpreter {self.python}"
        else:
            how = f"interpreter {self.python}"
        return f"build {self.build!r} ({how})"


@dataclass
class Launch:
    """One server start, ready to execute.

    `argv` the whole command line (list): the filled launcher `prefix`, the interpreter, the
    engine's flags. `env` variables set for the server over the worker's environment (for a
    container they are also written to `env_file`, which its argv passes). `container_name` the
    name the launch assigned ('' without a container). `port` the server's main port. `gpus` and
    `values` are what the launcher's placeholders were filled from (a probe refills them)."""

    argv: list[str]
    env: dict[str, str]
    build_env: BuildEnv
    prefix: list[str] = field(default_factory=list)
    env_file: str = ""
    container_name: str = ""
    port: int | None = None
    gpus: list[GpuRef] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict, repr=False)

    def write_env_file(self) -> None:
        """Write `env` to `env_file` as KEY=VALUE lines (docker/podman `--env-file`), mode 0600.
        Raises EngineConfigError for a value holding a newline (the format cannot carry it);
        OSError (its `filename` the env file) when it cannot be written, e.g. ENOSPC."""
        if not self.env_file:
            return
        bad = [k for k, v in self.env.items() if "\n" in v or "\n" in k]
        if bad:
            raise EngineConfigError(f"environment variables {bad} hold a newline; --env-file cannot pass them")
        path = Path(self.env_file)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.writelines(f"{k}={v}\n" for k, v in sorted(self.env.items()))
        except OSError as exc:  # a failed write (ENOSPC) names no file: name it, the runner reports it
            if exc.filename is None:
                exc.filename = str(path)
            raise

    def probe_argv(self, code: str, arg: str) -> list[str]:
        """`[prefix..., python, -c, code, arg]` through the same launcher as the server (a
        container gets the name `<name>-probe`, so it never clashes with the server's)."""
        prefix = self.prefix
        if self.build_env.launcher:
            values = dict(self.values, name=f"{self.container_name}-probe" if self.container_name else None)
            prefix = fill_launcher(self.build_env.launcher, values, self.gpus, self.build_env.build)
        return [*prefix, self.build_env.python, "-c", code, arg]

    def stop_outside(self, timeout_s: float) -> dict[str, Any]:
        """Stop what the launch started outside the server's process group and say whether it is
        gone: for a container, `stop_container` on its name. Returns {} without a container, else
        {"argv", "returncode", "output", "running_after", "clean"}. Never raises."""
        if not self.container_name or not self.build_env.container:
            return {}
        return stop_container(self.build_env.container["runtime"], self.container_name, timeout_s)


def stop_container(runtime: str, name: str, timeout_s: float) -> dict[str, Any]:
    """`RUNTIME stop -t S NAME` (S = `timeout_s`: the runtime sends SIGTERM, then SIGKILL after
    S seconds), then `RUNTIME container inspect NAME` to see it gone (no such container, or not
    running). Returns {"argv", "returncode" (None when it could not run), "output" (last 2000
    characters), "running_after" (container_running), "clean"}. Never raises."""
    argv = [runtime, "stop", "-t", str(max(int(timeout_s), 0)), name]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s + RUNTIME_SLACK_S)
        returncode, output = proc.returncode, (proc.stdout + proc.stderr).strip()[-2000:]
    except (OSError, subprocess.TimeoutExpired) as exc:
        returncode, output = None, f"{type(exc).__name__}: {exc}"
    running = container_running(runtime, name)
    return {"argv": argv, "returncode": returncode, "output": output, "running_after": running,
            "clean": running is False}


def container_running(runtime: str, name: str) -> bool | None:
    """Whether container `name` still runs: False when the runtime knows no such container or
    reports it not running, True when running, None when the runtime cannot be asked."""
    try:
        proc = subprocess.run([runtime, "container", "inspect", "--format", "{{.State.Running}}", name],
                              capture_output=True, text=True, timeout=RUNTIME_SLACK_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return False  # "no such container": --rm removed it
    return proc.stdout.strip().lower() == "true"


def container_name(hint: str = "") -> str:
    """A fresh container name, `draftboard-<hint>-<6 hex>` (docker's rule: [a-zA-Z0-9][a-zA-Z0-9_.-]*)."""
    clean = re.sub(r"[^a-zA-Z0-9_.-]+", "-", hint).strip("-.")[:40]
    return f"draftboard-{clean + '-' if clean else ''}{secrets.token_hex(3)}"


class MissingValue(Exception):
    """A template's placeholder `name` has no value (None or '')."""

    def __init__(self, name: str):
        super().__init__(name)
        self.name = name


def fill_template(template: str, values: dict[str, Any]) -> str:
    """`template` with each `{name}` replaced by `str(values[name])`. Raises MissingValue for a
    placeholder whose value is None, '' or absent."""

    def sub(match: re.Match) -> str:
        val = values.get(match.group(1))
        if val is None or val == "":
            raise MissingValue(match.group(1))
        return str(val)

    return PLACEHOLDER_RE.sub(sub, template)


def fill_launcher(templates: Sequence[Any], values: dict[str, Any], gpus: Sequence[GpuRef], build: str) -> list[str]:
    """The launcher's argv for one server start.

    `templates` as benchkit.engines.flags._launcher_arg checks them; `values` maps
    LAUNCHER_PLACEHOLDERS to values (None or '' = none); `{gpu_uuids}` / `{gpu_indices}` come
    from `gpus` (UUID where known, else the index), and a `per_gpu` group is repeated once per
    GPU with `{gpu_uuid}` / `{gpu_index}`. An optional group (a list) with a placeholder that has
    no value is left out. Raises EngineConfigError naming the build and the placeholder when a
    plain element needs a value that is missing (e.g. GPUs on a CPU run)."""
    vals = dict(values)
    vals["gpu_uuids"] = ",".join(g.uuid or str(g.index) for g in gpus) or None
    vals["gpu_indices"] = ",".join(str(g.index) for g in gpus) or None
    out: list[str] = []
    for item in templates:
        try:
            if isinstance(item, str):
                out.append(fill_template(item, vals))
            elif isinstance(item, list):
                try:
                    out += [fill_template(t, vals) for t in item]
                except MissingValue:
                    continue
            else:
                for g in gpus:
                    per = dict(vals, gpu_uuid=g.uuid or str(g.index), gpu_index=g.index)
                    out += [fill_template(t, per) for t in item["per_gpu"]]
        except MissingValue as exc:
            raise EngineConfigError(f"launcher of build {build!r}: {{{exc.name}}} has no value for this run "
                                    f"(template {item!r}); put it in an optional group [..] if it may be absent"
                                    ) from None
    return out


def launch_module(launch_templates: Sequence[str]) -> str:
    """The top-level package a build's `launch` runs: `sglang` for `-m sglang.launch_server`
    ('' when the launch has no `-m`)."""
    items = list(launch_templates)
    if "-m" in items and items.index("-m") + 1 < len(items):
        return items[items.index("-m") + 1].split(".")[0]
    return ""


# --------------------------------------------------------------------------------------------
# the build's preflight and provenance


#: Run by the build's interpreter (through its launcher): finds the engine's package without
#: executing it and reads versions from metadata and files. Standard library only, Python >= 3.8.
PROBE_SCRIPT = r"""
import importlib.metadata as md, importlib.util, json, os, platform, re, sys
args = json.loads(sys.argv[1])
out = {"python_executable": sys.executable, "python_version": platform.python_version(),
       "module": args["module"], "module_found": False, "module_path": None, "distribution": None,
       "version": None, "git_commit": None, "commit_source": None, "torch_version": None, "torch_cuda": None,
       "torch_git": None}

def git_head(start):
    d = start
    while True:
        g = os.path.join(d, ".git")
        if os.path.isdir(g):
            gitdir = g
            break
        if os.path.isfile(g):
            text = open(g).read().strip()
            if not text.startswith("gitdir:"):
                return None
            gitdir = os.path.normpath(os.path.join(d, text[7:].strip()))
            break
        parent = os.path.dirname(d)
        if parent == d:
            return None
        d = parent
    head = open(os.path.join(gitdir, "HEAD")).read().strip()
    if not head.startswith("ref:"):
        return head
    ref = head[4:].strip()
    dirs = [gitdir]
    common = os.path.join(gitdir, "commondir")
    if os.path.isfile(common):
        dirs.append(os.path.normpath(os.path.join(gitdir, open(common).read().strip())))
    for base in dirs:
        path = os.path.join(base, ref)
        if os.path.isfile(path):
            return open(path).read().strip()
        packed = os.path.join(base, "packed-refs")
        if os.path.isfile(packed):
            for line in open(packed):
                parts = line.split()
                if len(parts) == 2 and parts[1] == ref:
                    return parts[0]
    return None

spec = importlib.util.find_spec(args["module"]) if args["module"] else None
if spec is not None:
    out["module_found"] = True
    out["module_path"] = spec.origin or (list(spec.submodule_search_locations or []) or [None])[0]
names = []
try:
    names += md.packages_distributions().get(args["module"], [])
except Exception:
    pass
names += [n for n in args["dists"] if n not in names]
for name in names:
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        continue
    out["distribution"] = dist.metadata["Name"] or name
    out["version"] = dist.version
    try:
        du = json.loads(dist.read_text("direct_url.json") or "{}")
    except ValueError:
        du = {}
    commit = (du.get("vcs_info") or {}).get("commit_id")
    if commit:
        out["git_commit"], out["commit_source"] = commit, "direct_url.json"
    break
path = out["module_path"]
if not out["git_commit"] and path and not re.search(r"[/\\](site|dist)-packages[/\\]", path):
    try:
        commit = git_head(os.path.dirname(os.path.abspath(path)))
    except OSError:
        commit = None
    if commit:
        out["git_commit"], out["commit_source"] = commit, "git checkout of the source tree"
if not out["git_commit"] and path:
    vfile = os.path.join(os.path.dirname(path), "_version.py")
    if os.path.isfile(vfile):
        m = re.search(r"commit_id\s*=\s*['\"]([0-9a-fA-F]{7,40})['\"]", open(vfile).read())
        if m:
            out["git_commit"], out["commit_source"] = m.group(1), "_version.py"
if not out["git_commit"] and out["version"]:
    m = re.search(r"\+g([0-9a-f]{7,40})", out["version"])
    if m:
        out["git_commit"], out["commit_source"] = m.group(1), "local version +g"
try:
    out["torch_version"] = md.version("torch")
except md.PackageNotFoundError:
    pass
tspec = importlib.util.find_spec("torch")
if tspec is not None and tspec.origin:
    vfile = os.path.join(os.path.dirname(tspec.origin), "version.py")
    if os.path.isfile(vfile):
        text = open(vfile).read()
        m = re.search(r"^cuda\s*(?::[^=\n]*)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
        out["torch_cuda"] = m.group(1) if m else None
        m = re.search(r"^git_version\s*(?::[^=\n]*)?=\s*['\"]([0-9a-f]{7,40})['\"]", text, re.M)
        out["torch_git"] = m.group(1) if m else None
        # torch.__version__ as torch itself reports it: it keeps the build's local tag (2.11.0+cu130),
        # which an image's distribution metadata can lack (seen on the H200 machine: "2.11.0")
        m = re.search(r"^__version__\s*(?::[^=\n]*)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
        if m:
            out["torch_version"] = m.group(1)
print("DRAFTBOARD_PROBE " + json.dumps(out))
"""


def _executable_problem(program: str) -> str | None:
    """Why `program` (a path, or a name looked up on PATH) cannot be executed, or None."""
    if os.sep in program:
        if not os.path.exists(program):
            return f"{program} does not exist"
        if not os.access(program, os.X_OK) or os.path.isdir(program):
            return f"{program} is not an executable file"
        return None
    return None if shutil.which(program) else f"{program!r} is not found on PATH"


def image_id(runtime: str, image: str) -> str:
    """The local image's id (`RUNTIME image inspect --format {{.Id}} IMAGE`). Raises
    PreflightError `engine_env_error` when the runtime is missing or the image is not present."""
    try:
        proc = subprocess.run([runtime, "image", "inspect", "--format", "{{.Id}}", image],
                              capture_output=True, text=True, timeout=RUNTIME_SLACK_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PreflightError(ENGINE_ENV_ERROR, f"`{runtime} image inspect {image}` failed: {exc}") from None
    if proc.returncode != 0:
        why = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
        raise PreflightError(ENGINE_ENV_ERROR, f"image {image} is not present locally ({why[0]}); "
                                               f"pull or build it first: `{runtime} pull {image}`")
    return proc.stdout.strip().splitlines()[0] if proc.stdout.strip() else ""


def check_engine_env(launch: Launch, timeout_s: float = PROBE_TIMEOUT_S) -> dict[str, Any]:
    """The build's preflight, and its provenance (one child process through the build's own
    interpreter or launcher, as the server will run).

    Checks, in order: the launcher's program exists (a path, or a name on PATH), the container
    image is present locally (`RUNTIME image inspect`), the interpreter exists (when it is a
    path outside a launcher), the build's `launch` starts with `-m MODULE`, the probe runs and
    finds the engine's package (`module`). Raises
    PreflightError `engine_env_error`, its message starting with the build's description and
    saying what is missing. Writes the launch's env file first (a container probe reads it).

    Returns the provenance, JSON-ready: {"build", "launcher": {"kind", "python", "argv"
    (the filled prefix), "runtime", "image", "image_id"}, "python_executable", "python_version",
    "module", "module_path", "distribution", "version", "git_commit", "commit_source",
    "torch_version", "torch_cuda", "torch_git"} plus "version_error" when the version cannot be
    read (the package is found but no installed distribution provides it)."""
    be = launch.build_env
    where = be.describe()
    launcher: dict[str, Any] = {"kind": be.kind, "python": be.python}
    if be.launcher:
        launcher["argv"] = list(launch.prefix)
        problem = _executable_problem(launch.prefix[0]) if launch.prefix else "empty launcher"
        if problem:
            raise PreflightError(ENGINE_ENV_ERROR, f"{where}: launcher program {problem}")
    if be.container:
        launcher.update(runtime=be.container["runtime"], image=be.container["image"])
        try:
            launcher["image_id"] = image_id(be.container["runtime"], be.container["image"])
        except PreflightError as exc:
            raise PreflightError(ENGINE_ENV_ERROR, f"{where}: {exc.message}") from None
    elif not be.launcher:
        problem = _executable_problem(be.python)
        if problem:
            raise PreflightError(ENGINE_ENV_ERROR, f"{where}: interpreter {problem}")
    if not be.module:
        raise PreflightError(ENGINE_ENV_ERROR, f"{where}: its `launch` runs no Python module: it must start with "
                                               "`-m MODULE` (e.g. [\"-m\", \"sglang.launch_server\", ...]), "
                                               "MODULE being the engine package the server runs")
    launch.write_env_file()  # a container probe reads the server's environment from it too
    argv = launch.probe_argv(PROBE_SCRIPT, json.dumps({"module": be.module, "dists": list(be.distributions)}))
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=_probe_env(launch),
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        if be.container and launch.container_name:  # the runtime's client was killed; its container was not
            stop_container(be.container["runtime"], f"{launch.container_name}-probe", 10)
        raise PreflightError(ENGINE_ENV_ERROR, f"{where}: the environment probe did not finish within "
                                               f"{timeout_s:g} s") from None
    except OSError as exc:
        raise PreflightError(ENGINE_ENV_ERROR, f"{where}: cannot run {argv[0]!r}: {exc}") from None
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("DRAFTBOARD_PROBE ")]
    try:
        found = json.loads(lines[-1][len("DRAFTBOARD_PROBE "):])
    except (IndexError, ValueError):
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        raise PreflightError(ENGINE_ENV_ERROR, f"{where}: the interpreter did not run the environment probe "
                                               f"(exit status {proc.returncode}): {tail}") from None
    if not found.get("module_found"):
        raise PreflightError(ENGINE_ENV_ERROR, f"{where}: cannot import the engine: no module {be.module!r} in "
                                               f"that environment ({found.get('python_executable')}, Python "
                                               f"{found.get('python_version')})")
    provenance = {"build": be.build, "launcher": launcher, **found}
    if not found.get("version"):
        provenance["version_error"] = (f"module {be.module!r} is found at {found.get('module_path')}, but no "
                                       "installed distribution provides it (a source tree on PYTHONPATH?)")
    return provenance


def _probe_env(launch: Launch) -> dict[str, str]:
    """The probe's environment: the worker's, with the server's variables over it (PYTHONPATH and
    the like matter for what the interpreter finds); the GPUs are hidden from it unless a
    container needs them to start."""
    env = {**os.environ, **launch.env}
    if not launch.build_env.container:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def unreadable_provenance(build: str, reason: str, launcher: dict[str, Any] | None = None) -> dict[str, Any]:
    """Provenance of a run whose engine environment could not be read (an external server, or a
    preflight that failed before the probe answered): version None and `version_error`."""
    return {"build": build, "launcher": launcher or {}, "version": None, "git_commit": None,
            "version_error": reason}
