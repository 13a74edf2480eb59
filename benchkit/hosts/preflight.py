"""Checks made before a server starts (and after it stops), each failing fast with a clear code.

Every check returns a `CheckResult` when the host is fit and raises `PreflightError(code,
message)` when it is not. Codes (docs/ARCHITECTURE.md):

- `model_missing`: the model / drafter directory does not exist (e.g. tmpfs wiped by a reboot);
- `model_incomplete`: it exists but lacks config.json, a tokenizer, or a weight shard;
- `host_env_error`: a host fault, not a benchmark failure (device nodes missing or blocked,
  CUDA does not initialise, NVML broken), so nightly trends stay clean;
- `gpu_busy`: a chosen GPU has compute processes or memory in use above its idle baseline;
- `port_in_use`: the server's port is taken;
- `engine_env_error`: the engine build's own environment is not usable (its interpreter or
  launcher is missing, its container image is not present locally, or the engine's package is
  not found there; benchkit.engines.environment.check_engine_env), distinct from a host fault;
- `dataset_error`: a categorized dataset's file cannot be read or its selection is empty;
- `disk_full`: the runs folder (a run's workdir's parent) has less free space than the minimum
  (`check_free_space`: DEFAULT_MIN_FREE_MIB, 512 MiB, or DRAFTBOARD_MIN_FREE_MIB). The runner and
  the server launcher use the same code when a write into the workdir meets ENOSPC / EDQUOT
  (`is_disk_full`, `disk_full_message`), and when the server exits with an (almost) empty log
  while its filesystem is below the minimum (`disk_full_exit_message`).

On a GPU-less host the GPU checks have nothing to check: they return a result with
`skipped=True` and say so in `detail`.
"""

from __future__ import annotations

import errno
import glob
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchkit.hosts.nvml import MIB, gpu_used_mib, load_pynvml, nvml_error_text, nvml_str

MODEL_MISSING = "model_missing"
MODEL_INCOMPLETE = "model_incomplete"
HOST_ENV_ERROR = "host_env_error"
GPU_BUSY = "gpu_busy"
PORT_IN_USE = "port_in_use"
ENGINE_ENV_ERROR = "engine_env_error"
DATASET_ERROR = "dataset_error"
DISK_FULL = "disk_full"
CODES = (MODEL_MISSING, MODEL_INCOMPLETE, HOST_ENV_ERROR, GPU_BUSY, PORT_IN_USE, ENGINE_ENV_ERROR, DATASET_ERROR,
         DISK_FULL)

#: The least free space (MiB) the runs folder must have before a server starts; the environment
#: variable MIN_FREE_ENV (also read by benchsite/settings.py) overrides it, 0 turns the check off.
DEFAULT_MIN_FREE_MIB = 512
MIN_FREE_ENV = "DRAFTBOARD_MIN_FREE_MIB"
#: A filesystem with less than this free (MiB) counts as full whatever the minimum.
NEARLY_FULL_MIB = 1.0
#: A server log at most this long (bytes) is "almost empty": the server could not write its log.
SHORT_LOG_BYTES = 1024
#: OSError errnos that mean the disk (or the user's quota) is full.
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})

#: Files any one of which makes a tokenizer (Hugging Face layouts).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "tiktoken.model")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
WEIGHT_GLOBS = ("*.safetensors", "pytorch_model*.bin", "*.pt", "*.gguf", "*.pth")


class PreflightError(Exception):
    """A failed preflight check. `code` is one of CODES; `message` says what and where."""

    def __init__(self, code: str, message: str):
        if code not in CODES:
            raise ValueError(f"unknown preflight code {code!r}")
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclass
class CheckResult:
    """A passed (or skipped) check: `name`, `skipped` (nothing to check here), `detail` (what
    was checked or why it was skipped) and `data` (check-specific readings, JSON-ready)."""

    name: str
    skipped: bool = False
    detail: str = ""
    data: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# Model directories


def _safetensors_problem(path: Path) -> str | None:
    """Why a .safetensors file is truncated or malformed, or None when its header is whole.

    Format (huggingface/safetensors README): 8-byte little-endian header length N, N bytes of
    JSON mapping tensor names to `data_offsets` [begin, end) relative to the byte after the
    header; the file must hold at least 8 + N + max(end) bytes.
    """
    size = path.stat().st_size
    if size < 8:
        return f"{size} bytes, shorter than the 8-byte header length"
    with path.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > size - 8 or n > 100 * MIB:
            return f"header length {n} exceeds the file ({size} bytes)"
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError):
            return "header is not valid JSON"
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)]
    need = 8 + n + max(ends, default=0)
    if size < need:
        return f"truncated: {size} bytes, tensors need {need}"
    return None


def check_model_dir(
    path: str | os.PathLike,
    role: str = "model",
    allow_no_weights: bool = False,
    require_tokenizer: bool | None = None,
) -> CheckResult:
    """Check that a model (or drafter) directory is complete before a server loads it.

    Checks: the directory exists (else `model_missing`); `config.json` exists and is JSON; a
    tokenizer file (any of TOKENIZER_FILES) exists, required by default for role "model" and
    not for other roles (drafters share the target's tokenizer); every shard named by
    `model.safetensors.index.json` / `pytorch_model.bin.index.json` exists and is non-empty;
    without an index, at least one weight file (WEIGHT_GLOBS) exists and is non-empty unless
    `allow_no_weights` (for `--load-format dummy`); `.safetensors` headers fit their file.
    Every failure but the first raises `model_incomplete`, naming the file.
    `data`: {"weights": [file names], "bytes": total weight bytes}.
    """
    d = Path(path)
    if not d.exists():
        raise PreflightError(MODEL_MISSING, f"{role} directory {d} does not exist")
    if not d.is_dir():
        raise PreflightError(MODEL_MISSING, f"{role} path {d} is not a directory")
    cfg = d / "config.json"
    if not cfg.is_file():
        raise PreflightError(MODEL_INCOMPLETE, f"{role} directory {d} has no config.json")
    try:
        json.loads(cfg.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PreflightError(MODEL_INCOMPLETE, f"{cfg}: not valid JSON: {exc}") from None
    if require_tokenizer is None:
        require_tokenizer = role == "model"
    if require_tokenizer and not any((d / t).is_file() for t in TOKENIZER_FILES):
        raise PreflightError(
            MODEL_INCOMPLETE, f"{role} directory {d} has no tokenizer (none of {', '.join(TOKENIZER_FILES)})"
        )

    shards: list[Path] = []
    for index_name in WEIGHT_INDEXES:
        index = d / index_name
        if not index.is_file():
            continue
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as exc:
            raise PreflightError(
                MODEL_INCOMPLETE, f"{index}: unreadable weight index ({type(exc).__name__}: {exc})"
            ) from None
        names = sorted(set(weight_map.values()))
        absent = [n for n in names if not (d / n).is_file()]
        if absent:
            raise PreflightError(
                MODEL_INCOMPLETE,
                f"{role} directory {d}: {len(absent)} of {len(names)} shards named in {index_name} "
                "are missing: " + ", ".join(absent[:5]) + (" ..." if len(absent) > 5 else ""),
            )
        shards.extend(d / n for n in names)
    if not shards:
        for pattern in WEIGHT_GLOBS:
            shards.extend(sorted(d.glob(pattern)))
    if not shards:
        if allow_no_weights:
            return CheckResult(
                "model_dir",
                detail=f"{role} {d}: config and tokenizer, no weights (dummy load)",
                data={"weights": [], "bytes": 0},
            )
        raise PreflightError(
            MODEL_INCOMPLETE, f"{role} directory {d} has no weight files ({', '.join(WEIGHT_GLOBS)})"
        )
    total = 0
    for shard in shards:
        size = shard.stat().st_size
        if size == 0:
            raise PreflightError(MODEL_INCOMPLETE, f"{role} weight file {shard} is empty")
        if shard.suffix == ".safetensors":
            problem = _safetensors_problem(shard)
            if problem:
                raise PreflightError(MODEL_INCOMPLETE, f"{role} weight file {shard}: {problem}")
        total += size
    return CheckResult(
        "model_dir",
        detail=f"{role} {d}: {len(shards)} weight files, {total} bytes",
        data={"weights": [s.name for s in shards], "bytes": total},
    )


# ---------------------------------------------------------------------------------------------
# Device nodes and CUDA


def check_device_nodes(dev_root: str | os.PathLike = "/dev") -> CheckResult:
    """Check that the NVIDIA device nodes exist and open read/write.

    Needs `<dev>/nvidiactl`, `<dev>/nvidia-uvm` and at least one `<dev>/nvidia<N>`; each is
    opened O_RDWR and closed. A host with neither nvidiactl nor any nvidia<N> is GPU-less:
    skipped. Raises `host_env_error` naming the node and the OS error (e.g. EPERM from a
    cgroup v2 device policy that blocks /dev/nvidia-uvm). A missing nvidia-uvm on bare metal
    is created by the first CUDA use (`nvidia-modprobe -u -c=0`); the message says so.
    """
    dev = Path(dev_root)
    gpus = sorted(glob.glob(str(dev / "nvidia[0-9]*")), key=lambda p: int(Path(p).name[6:]))
    ctl = dev / "nvidiactl"
    if not gpus and not ctl.exists():
        return CheckResult(
            "device_nodes", skipped=True, detail=f"no NVIDIA device nodes under {dev}: GPU-less host"
        )
    if not gpus:
        raise PreflightError(HOST_ENV_ERROR, f"{ctl} exists but no {dev}/nvidia<N> GPU node")
    nodes = [ctl, dev / "nvidia-uvm", *map(Path, gpus)]
    for node in nodes:
        if not node.exists():
            hint = (
                " (load nvidia_uvm: nvidia-modprobe -u -c=0, or pass it into the container)"
                if "uvm" in node.name
                else ""
            )
            raise PreflightError(HOST_ENV_ERROR, f"device node {node} does not exist{hint}")
        try:
            fd = os.open(node, os.O_RDWR)
        except OSError as exc:
            raise PreflightError(
                HOST_ENV_ERROR,
                f"device node {node} cannot be opened read/write: "
                f"{errno.errorcode.get(exc.errno, exc.errno)} {exc.strerror} "
                "(a container device policy may block it)",
            ) from None
        os.close(fd)
    return CheckResult(
        "device_nodes",
        detail=f"opened {', '.join(str(n) for n in nodes)} read/write",
        data={"nodes": [str(n) for n in nodes]},
    )


def _repo_root() -> str:
    """The folder that holds the `benchkit` package (so a child process can import it)."""
    return str(Path(__file__).resolve().parents[2])


def _uuid_hex(uuid: Any) -> str:
    """`GPU-926e315f-5a39-...` or `926e315f-5a39-...` -> 32 lower-case hex digits ("" if None)."""
    text = str(uuid or "").lower()
    text = text[4:] if text.startswith("gpu-") else text
    return text.replace("-", "")


def check_cuda_init(
    gpu_uuids: Sequence[str],
    timeout_s: float = 60.0,
    backend: str = "auto",
    python: str | None = None,
) -> CheckResult:
    """Initialise CUDA on exactly these GPUs in a child process (`python -m benchkit.hosts.cuda_probe`).

    The child runs with `CUDA_DEVICE_ORDER=PCI_BUS_ID` and `CUDA_VISIBLE_DEVICES=<uuids>` and
    allocates a little memory on each device (see benchkit.hosts.cuda_probe). No UUIDs: skipped.
    Raises `host_env_error` with the child's message when it fails, times out after
    `timeout_s`, prints no JSON, or sees a different number of devices (or different UUIDs)
    than asked for. `data` is the child's JSON report.
    """
    uuids = [u for u in gpu_uuids if u]
    if not uuids:
        return CheckResult(
            "cuda_init", skipped=True, detail="no GPUs to initialise: GPU-less host or CPU run"
        )
    env = dict(os.environ)
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env["CUDA_VISIBLE_DEVICES"] = ",".join(uuids)
    env["PYTHONPATH"] = _repo_root() + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    argv = [python or sys.executable, "-m", "benchkit.hosts.cuda_probe", "--backend", backend]
    try:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise PreflightError(
            HOST_ENV_ERROR, f"CUDA initialisation on {uuids} did not finish within {timeout_s:g} s"
        ) from None
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    try:
        report = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise PreflightError(
            HOST_ENV_ERROR, f"CUDA probe exited {proc.returncode} without a report: {' | '.join(tail)}"
        ) from None
    if not report.get("ok"):
        raise PreflightError(HOST_ENV_ERROR, f"CUDA initialisation failed on {uuids}: {report.get('error')}")
    if report.get("device_count") != len(uuids):
        raise PreflightError(
            HOST_ENV_ERROR, f"CUDA sees {report.get('device_count')} devices, expected {len(uuids)} ({uuids})"
        )
    seen = [dv.get("uuid") for dv in report.get("devices", [])]
    seen_hex, want_hex = sorted(map(_uuid_hex, seen)), sorted(map(_uuid_hex, uuids))
    if all(len(h) == 32 for h in seen_hex + want_hex) and seen_hex != want_hex:
        raise PreflightError(HOST_ENV_ERROR, f"CUDA sees GPUs {seen}, expected {uuids}")
    return CheckResult(
        "cuda_init", detail=f"CUDA initialised ({report.get('backend')}) on {len(uuids)} GPUs", data=report
    )


# ---------------------------------------------------------------------------------------------
# GPU idleness


def _open_nvml(nvml: Any) -> Any:
    nv = nvml if nvml is not None else load_pynvml()
    try:
        nv.nvmlInit()
    except Exception as exc:  # noqa: BLE001
        raise PreflightError(HOST_ENV_ERROR, f"NVML init failed: {nvml_error_text(exc)}") from None
    return nv


def gpu_memory_used(gpu_uuids: Sequence[str], nvml: Any = None) -> dict[str, dict[str, Any]]:
    """uuid -> {"used_mib": int, "procs": [[pid, used_mib], ...]} via NVML (compute processes).

    Raises `host_env_error` when NVML fails or a UUID is not on this host.
    """
    nv = _open_nvml(nvml)
    out: dict[str, dict[str, Any]] = {}
    try:
        for uuid in gpu_uuids:
            try:
                h = nv.nvmlDeviceGetHandleByUUID(uuid)
            except Exception as exc:  # noqa: BLE001
                raise PreflightError(
                    HOST_ENV_ERROR, f"GPU {uuid} not found by NVML: {nvml_error_text(exc)}"
                ) from None
            try:
                used = gpu_used_mib(nv, h)
                procs = [
                    [int(p.pid), int(p.usedGpuMemory or 0) // MIB]
                    for p in nv.nvmlDeviceGetComputeRunningProcesses(h)
                ]
            except Exception as exc:  # noqa: BLE001
                raise PreflightError(
                    HOST_ENV_ERROR, f"NVML cannot read GPU {uuid}: {nvml_error_text(exc)}"
                ) from None
            out[nvml_str(uuid)] = {"used_mib": used, "procs": procs}
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
    return out


def idle_baseline(gpu_uuids: Sequence[str], nvml: Any = None) -> dict[str, int]:
    """uuid -> memory used (MiB) now; record it on idle GPUs to compare against later."""
    return {u: r["used_mib"] for u, r in gpu_memory_used(gpu_uuids, nvml).items()}


def check_gpus_idle(
    gpu_uuids: Sequence[str],
    max_used_mib: int = 1024,
    baseline: dict[str, int] | None = None,
    tolerance_mib: int = 256,
    nvml: Any = None,
) -> CheckResult:
    """Check that each GPU runs no compute process and holds no more memory than when idle.

    Memory bound per GPU: `baseline[uuid] + tolerance_mib` when a baseline (from
    `idle_baseline`) names it, else `max_used_mib` (MiB, NVML v2 `used`, which excludes
    driver-reserved memory). No UUIDs: skipped. Raises `gpu_busy` naming the GPU, its
    memory and the pids, or `host_env_error` when NVML fails. `data`: `gpu_memory_used`.
    """
    uuids = [u for u in gpu_uuids if u]
    if not uuids:
        return CheckResult("gpus_idle", skipped=True, detail="no GPUs to check: GPU-less host or CPU run")
    readings = gpu_memory_used(uuids, nvml)
    for uuid, r in readings.items():
        if r["procs"]:
            raise PreflightError(
                GPU_BUSY,
                f"GPU {uuid} has compute processes [pid, MiB]: {r['procs']} ({r['used_mib']} MiB used)",
            )
        limit = baseline[uuid] + tolerance_mib if baseline and uuid in baseline else max_used_mib
        if r["used_mib"] > limit:
            raise PreflightError(
                GPU_BUSY, f"GPU {uuid} has {r['used_mib']} MiB in use, idle limit {limit} MiB"
            )
    return CheckResult("gpus_idle", detail=f"{len(uuids)} GPUs idle", data=readings)


def gpus_back_to_baseline(
    gpu_uuids: Sequence[str],
    baseline: dict[str, int] | None = None,
    tolerance_mib: int = 256,
    max_used_mib: int = 1024,
    timeout_s: float = 30.0,
    poll_s: float = 0.5,
    nvml: Any = None,
) -> CheckResult:
    """After a run: wait up to `timeout_s` for the GPUs to pass `check_gpus_idle` again.

    The driver frees a dead process's memory shortly after it exits, hence the polling.
    Raises the last `gpu_busy` when they do not; `host_env_error` at once on an NVML fault.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return check_gpus_idle(gpu_uuids, max_used_mib, baseline, tolerance_mib, nvml)
        except PreflightError as exc:
            if exc.code != GPU_BUSY or time.monotonic() >= deadline:
                raise
        time.sleep(poll_s)


# ---------------------------------------------------------------------------------------------
# Ports


def _bind_problem(host: str, port: int) -> str | None:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        # Servers (uvicorn) set SO_REUSEADDR, so sockets in TIME_WAIT do not block them; nor here.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
        s.listen(1)
    except OSError as exc:
        return f"{host}:{port}: {errno.errorcode.get(exc.errno, exc.errno)} {exc.strerror}"
    finally:
        s.close()
    return None


def check_port_free(port: int, span: int = 1, hosts: Iterable[str] = ("127.0.0.1", "0.0.0.0")) -> CheckResult:
    """Check that TCP ports `port .. port+span-1` can be bound (and listened on) on each host.

    A real bind, not a connect: it also catches a port held by a socket that does not accept.
    Raises `port_in_use` naming the port, address and OS error; ValueError for a port out of
    1..65535.
    """
    if span < 1 or not (1 <= port and port + span - 1 <= 65535):
        raise ValueError(f"bad port range {port}..{port + span - 1}")
    hosts = list(hosts)
    for p in range(port, port + span):
        for host in hosts:
            problem = _bind_problem(host, p)
            if problem:
                raise PreflightError(PORT_IN_USE, f"port {p} is in use ({problem})")
    return CheckResult(
        "port_free",
        detail=f"ports {port}..{port + span - 1} free on {', '.join(hosts)}",
        data={"ports": list(range(port, port + span))},
    )


# ---------------------------------------------------------------------------------------------
# Free space


def min_free_mib() -> int:
    """The runs folder's minimum free space in MiB: MIN_FREE_ENV when set (an integer >= 0; 0
    turns the check off), else DEFAULT_MIN_FREE_MIB. Raises ValueError for any other value."""
    raw = os.environ.get(MIN_FREE_ENV, "").strip()
    if not raw:
        return DEFAULT_MIN_FREE_MIB
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"{MIN_FREE_ENV}={raw!r}: expected a whole number of MiB, 0 or more")
    return value


def free_mib(path: str | os.PathLike) -> float | None:
    """Free space (MiB, for an unprivileged user: shutil.disk_usage's `free`) of the filesystem
    holding `path`, or of its nearest existing parent; None when it cannot be read."""
    p = Path(path)
    while not p.exists() and p.parent != p:
        p = p.parent
    try:
        return shutil.disk_usage(p).free / MIB
    except OSError:
        return None


def _free_text(folder: Path) -> str:
    free = free_mib(folder)
    return f"{free:.1f} MiB free" if free is not None else "free space unreadable"


def is_disk_full(exc: BaseException) -> bool:
    """True for an OSError whose errno says the disk or the quota is full (ENOSPC, EDQUOT)."""
    return isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS


def disk_full_message(path: str | os.PathLike, exc: BaseException | None = None) -> str:
    """`disk full writing PATH: folder FOLDER has N.N MiB free (strerror)`."""
    p = Path(path)
    why = f" ({exc.strerror or exc})" if isinstance(exc, OSError) else ""
    return f"disk full writing {p}: folder {p.parent} has {_free_text(p.parent)}{why}"


def disk_full_exit_message(log_path: str | os.PathLike, returncode: int | None,
                           minimum_mib: float | None = None) -> str | None:
    """When a server that exited left an (almost) empty log (at most SHORT_LOG_BYTES) on a
    filesystem with less free space than `minimum_mib` (default `min_free_mib()`; never less
    than NEARLY_FULL_MIB), the message that names the full disk; else None (the exit is the
    server's own: `server_exited`)."""
    log = Path(log_path)
    try:
        size = log.stat().st_size
    except FileNotFoundError:
        size = 0
    except OSError:
        return None
    if size > SHORT_LOG_BYTES:
        return None
    free = free_mib(log.parent)
    if minimum_mib is None:
        try:
            minimum_mib = min_free_mib()
        except ValueError:
            minimum_mib = DEFAULT_MIN_FREE_MIB
    if free is None or free >= max(minimum_mib, NEARLY_FULL_MIB):
        return None
    return (f"disk full: the server process exited with code {returncode} before it was ready and its log "
            f"{log} holds {size} bytes; folder {log.parent} has {free:.1f} MiB free (minimum {minimum_mib} MiB, "
            f"{MIN_FREE_ENV}): the server could not write its log or its files")


def check_free_space(folder: str | os.PathLike, minimum_mib: float | None = None) -> CheckResult:
    """Check that the filesystem of `folder` (the runs folder: a run's workdir's parent, or its
    nearest existing parent) has at least `minimum_mib` MiB free (default: `min_free_mib()`,
    512 MiB unless DRAFTBOARD_MIN_FREE_MIB says otherwise). Raises `disk_full` naming the
    folder, its free MiB and the minimum; `host_env_error` when the free space cannot be read.
    `data`: {"folder", "free_mib" (one decimal), "min_free_mib"}."""
    minimum = min_free_mib() if minimum_mib is None else minimum_mib
    d = Path(folder)
    free = free_mib(d)
    if free is None:
        raise PreflightError(HOST_ENV_ERROR, f"cannot read the free space of the runs folder {d}")
    if free < minimum:
        raise PreflightError(DISK_FULL, f"the runs folder {d} has {free:.1f} MiB free, below the minimum "
                                        f"{minimum} MiB ({MIN_FREE_ENV})")
    return CheckResult("free_space", detail=f"runs folder {d}: {free:.1f} MiB free (minimum {minimum} MiB)",
                       data={"folder": str(d), "free_mib": round(free, 1), "min_free_mib": minimum})
