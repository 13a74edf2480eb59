"""Child-process CUDA probe: really initialise CUDA on every visible GPU and report JSON.

Run as `python -m benchkit.hosts.cuda_probe [--backend auto|torch|driver] [--alloc-mib N]` with
`CUDA_VISIBLE_DEVICES` (UUIDs) and `CUDA_DEVICE_ORDER=PCI_BUS_ID` set by the caller
(`benchkit.hosts.preflight.check_cuda_init`). NVML alone is not enough: a container whose cgroup
device policy blocks /dev/nvidia-uvm still answers nvidia-smi but fails here.

Backends: `torch` (torch.cuda.init, then an N MiB tensor per device and a synchronize);
`driver` (the CUDA driver API through ctypes on libcuda.so.1: cuInit, cuDeviceGet,
cuDevicePrimaryCtxRetain, cuMemAlloc_v2/cuMemFree_v2; signatures from NVIDIA's cuda.h);
`auto` = torch when a CUDA build of torch is importable, else driver.

Prints one JSON object on stdout: `{"ok": bool, "backend": str, "device_count": int,
"devices": [{"index", "name", "uuid", "total_mib", "alloc_mib"}], "error": str,
"cuda_visible_devices": str}`; exit status 0 when ok, 1 otherwise.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
from typing import Any


def _probe_torch(alloc_mib: int) -> dict[str, Any]:
    import torch

    torch.cuda.init()
    n = torch.cuda.device_count()
    devices = []
    for i in range(n):
        props = torch.cuda.get_device_properties(i)
        x = torch.empty(alloc_mib * (1 << 20), dtype=torch.uint8, device=f"cuda:{i}")
        x.fill_(1)
        torch.cuda.synchronize(i)
        uuid = getattr(props, "uuid", None)
        uuid_text = f"GPU-{uuid}" if uuid is not None and not str(uuid).startswith("GPU-") else uuid
        devices.append(
            {
                "index": i,
                "name": props.name,
                "uuid": str(uuid_text) if uuid_text is not None else None,
                "total_mib": props.total_memory >> 20,
                "alloc_mib": alloc_mib,
            }
        )
        del x
    return {"backend": "torch", "device_count": n, "devices": devices}


class _CudaError(RuntimeError):
    pass


def _probe_driver(alloc_mib: int) -> dict[str, Any]:
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise _CudaError(f"cannot load libcuda.so.1 (NVIDIA driver library): {exc}") from None

    def check(rc: int, what: str) -> None:
        if rc != 0:
            name, text = ctypes.c_char_p(), ctypes.c_char_p()
            cuda.cuGetErrorName(rc, ctypes.byref(name))
            cuda.cuGetErrorString(rc, ctypes.byref(text))
            raise _CudaError(
                f"{what} failed: {(name.value or b'?').decode()} ({rc}): {(text.value or b'').decode()}"
            )

    check(cuda.cuInit(0), "cuInit")
    count = ctypes.c_int()
    check(cuda.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
    devices = []
    for i in range(count.value):
        dev = ctypes.c_int()
        check(cuda.cuDeviceGet(ctypes.byref(dev), i), f"cuDeviceGet({i})")
        name = ctypes.create_string_buffer(256)
        check(cuda.cuDeviceGetName(name, 256, dev), f"cuDeviceGetName({i})")
        total = ctypes.c_size_t()
        check(cuda.cuDeviceTotalMem_v2(ctypes.byref(total), dev), f"cuDeviceTotalMem({i})")
        raw = (ctypes.c_ubyte * 16)()
        check(cuda.cuDeviceGetUuid(raw, dev), f"cuDeviceGetUuid({i})")
        h = bytes(raw).hex()
        uuid = f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
        ctx = ctypes.c_void_p()
        check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), f"cuDevicePrimaryCtxRetain({i})")
        try:
            check(cuda.cuCtxSetCurrent(ctx), f"cuCtxSetCurrent({i})")
            ptr = ctypes.c_uint64()
            check(cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(alloc_mib << 20)), f"cuMemAlloc({i})")
            check(
                cuda.cuMemsetD8_v2(ptr, ctypes.c_ubyte(1), ctypes.c_size_t(alloc_mib << 20)),
                f"cuMemsetD8({i})",
            )
            check(cuda.cuCtxSynchronize(), f"cuCtxSynchronize({i})")
            check(cuda.cuMemFree_v2(ptr), f"cuMemFree({i})")
        finally:
            cuda.cuDevicePrimaryCtxRelease_v2(dev)
        devices.append(
            {
                "index": i,
                "name": name.value.decode(),
                "uuid": uuid,
                "total_mib": total.value >> 20,
                "alloc_mib": alloc_mib,
            }
        )
    return {"backend": "driver", "device_count": count.value, "devices": devices}


def _torch_has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.version.cuda is not None


def probe(backend: str = "auto", alloc_mib: int = 16) -> dict[str, Any]:
    """Initialise CUDA in this process and return the report described in the module docstring.

    Never raises: a failure is reported as `{"ok": False, "error": "<what failed>"}`.
    """
    report: dict[str, Any] = {
        "ok": False,
        "backend": backend,
        "device_count": 0,
        "devices": [],
        "error": "",
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    if backend == "auto":
        backend = "torch" if _torch_has_cuda() else "driver"
        report["backend"] = backend
    try:
        result = _probe_torch(alloc_mib) if backend == "torch" else _probe_driver(alloc_mib)
        report.update(result)
        if result["device_count"] == 0:
            report["error"] = "CUDA initialised but sees no device"
        else:
            report["ok"] = True
    except Exception as exc:  # noqa: BLE001 - the report carries any failure to the parent
        report["error"] = f"{type(exc).__name__}: {exc}"
    return report


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; prints the JSON report and returns 0 when CUDA worked."""
    p = argparse.ArgumentParser(description="Initialise CUDA on every visible GPU and report JSON.")
    p.add_argument("--backend", choices=("auto", "torch", "driver"), default="auto")
    p.add_argument("--alloc-mib", type=int, default=16, help="MiB allocated and written per device")
    args = p.parse_args(argv)
    report = probe(args.backend, args.alloc_mib)
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
