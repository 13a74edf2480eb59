"""Helpers for tests that run real vLLM CPU servers."""

from __future__ import annotations

import os

import psutil

from benchkit.sweeps import sweepfile as sweepspec


def tiny_sweep(demo_models, name: str, methods: list, concurrency: int | list[int] = 2, output_len: int = 32,
               num_prompts: int = 8, engine_cpus: str = "0"):
    """A small sweep on the demo models (vLLM CPU, dummy weights), parsed by benchkit.sweeps.sweepfile.
    Runs that differ only in concurrency share one server start. `engine_cpus`: the server's
    `engine_cpus` (benchkit.engines.cpus; "" for vLLM's own placement). Default "0", as the demo:
    on a 2-CPU machine vLLM's own placement starves the API server and the load client, and
    timing assertions (tokens per chunk against tau) fail under load."""
    return sweepspec.parse_sweep({
        "name": name,
        "engine": "vllm",
        "model": str(demo_models.target),
        "drafter": str(demo_models.draft),
        "server": {"served_model_name": "demo", "dtype": "float32", "max_model_len": 1024, "load_format": "dummy",
                   "env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
                   # on the CPU build this fraction of the NUMA node's RAM is reserved (default 0.92)
                   "extra_args": ["--gpu-memory-utilization", "0.2"],
                   **({"engine_cpus": engine_cpus} if engine_cpus else {})},
        "grid": {"tp": [1], "methods": methods,
                 "concurrency": concurrency if isinstance(concurrency, list) else [concurrency],
                 "output_len": [output_len],
                 "input_len": [32]},
        "workload": {"num_prompts": num_prompts, "ignore_eos": True, "seed": 0},
        "limits": {"ready_timeout_s": 600, "request_timeout_s": 120, "stop_timeout_s": 30},
    }, source=f"test:{name}")


def vllm_server_pids(model_dir, leaders_only: bool = False) -> list[int]:
    """Pids of live vLLM API server processes serving `model_dir` (any leftover is a leak).

    Forked workers share the server's command line; `leaders_only` keeps the process-group
    leader, i.e. the process benchkit.engines.server.ManagedServer started."""
    out = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            if (p.info["status"] != psutil.STATUS_ZOMBIE and "vllm.entrypoints.openai.api_server" in cmd
                    and str(model_dir) in cmd and (not leaders_only or os.getpgid(p.pid) == p.pid)):
                out.append(p.info["pid"])
        except (psutil.Error, ProcessLookupError):
            continue
    return out
