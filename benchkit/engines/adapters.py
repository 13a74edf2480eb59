"""The engine seam: `EngineAdapter`, the base class every engine module subclasses
(benchkit/engines/kinds/: vllm.py, sglang.py, external.py), and `adapter_for(name)`, which builds
the adapter of a registered engine (benchkit/engines/registry.py) with its flags loaded.

An engine module declares its facts as class attributes and methods: `name`, `default_port` and
`port_span` (the ports derived from the main one), `ready_paths`, `metrics_path` and
`read_counters` (its Prometheus counters, read through benchkit.measure.counters),
`reset_cache_path` and `server_env` (what that request needs), `speculative_config_args` (how a
method's speculative config is rendered on the command line), `distributions` (where its version
is read from), `launched` (whether draftboard starts it), `result_tools` (the result files whose
runs are its), and the capabilities the load client and runner use (benchkit.engines.capabilities:
`token_ids`, `request_spec_metrics`, `acceptance_twin`, `continuous_usage`). What is the same for
every engine lives here: the command line from the flags file, the environment, the launch.

The mapping (engine, engine build, method, k, tree budget) -> command-line flags is data, in
`benchkit/engines/engine_flags.yaml` (its header documents the format and the sources of every flag:
vLLM's vllm/engine/arg_utils.py and vllm/config/speculative.py, SGLang's
python/sglang/srt/server_args.py, and the DDTree SGLang pull request). A user flags file with
the same layout is merged on top, so a new fork or PR build needs no code change.

Each build's server runs in the build's own environment (its `python` and `launcher`,
benchkit.engines.environment): `EngineAdapter.launch` assembles the whole start, and
environment.check_engine_env reads the engine's version through that same interpreter or
launcher. Nothing here imports vllm, sglang or django.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Any, ClassVar

from benchkit.engines import registry
from benchkit.engines.capabilities import ContinuousUsage, RequestSpecMetrics, TokenIds, TwinChange
from benchkit.engines.cpus import CpuPlacement, CpuPlacementError, parse_cpus
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
from benchkit.measure import counters
from benchkit.measure.counters import MetricsPage, SpecCounters
from benchkit.measure.loadclient import ClientOptions
from benchkit.methods import MethodChoice, MethodError, check_method
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


_FIELD_OF = {
    "model": "model",
    "drafter": "drafter",
    "k": "num_speculative_tokens",
    "k_plus_1": "num_speculative_tokens",
    "tree_budget": "tree_budget",
    "port": "port",
    "tp": "tp",
}


class EngineAdapter:
    """One engine: its facts (class attributes, overridden by each engine module) and the launch
    command and environment of its servers from `ServerConfig` (the same for every engine: the
    flags file says what differs). `flags` is the merged flags document (`load_flags`).

    Facts: `name` (the registry key, at most 20 characters), `title` (how people write it),
    `default_port` (what users know it by; started servers get a free port unless the sweep pins
    one), `launched` (draftboard starts it from engine_flags.yaml; False: someone else's server,
    nothing launched), `distributions` (distribution names tried for its version when its
    module's own is not found), `ready_paths` (GET paths that must answer 200, in order, before
    the server counts as ready), `metrics_path` (its Prometheus page), `counter_prefixes` (the
    metric names `read_counters` reads, so that a page's relevant samples are kept raw),
    `reset_cache_path` (POST path that clears its prefix cache; None: none known),
    `server_env` (variables its servers always get, e.g. what the cache reset needs),
    `result_tools` (benchkit.formats tool names whose runs are this engine's).
    Capabilities (benchkit.engines.capabilities; None: not available or not verified):
    `token_ids`, `request_spec_metrics`, `continuous_usage`, `cpu_placement` (how
    `ServerConfig.engine_cpus` binds its busy processes, benchkit.engines.cpus), and the method
    `acceptance_twin`.
    """

    name: ClassVar[str] = ""
    title: ClassVar[str] = ""
    default_port: ClassVar[int] = 0
    launched: ClassVar[bool] = True
    distributions: ClassVar[tuple[str, ...]] = ()
    ready_paths: ClassVar[tuple[str, ...]] = ("/v1/models",)
    metrics_path: ClassVar[str] = "/metrics"
    counter_prefixes: ClassVar[tuple[str, ...]] = ()
    reset_cache_path: ClassVar[str | None] = None
    server_env: ClassVar[dict[str, str]] = {}
    result_tools: ClassVar[tuple[str, ...]] = ()
    token_ids: ClassVar[TokenIds | None] = None
    request_spec_metrics: ClassVar[RequestSpecMetrics | None] = None
    continuous_usage: ClassVar[ContinuousUsage | None] = None
    cpu_placement: ClassVar[CpuPlacement | None] = None

    def __init__(self, flags: dict[str, Any] | None = None):
        self.flags: dict[str, Any] = flags or {}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} engine {self.name!r}>"

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

    def method_of_speculative_config(self, config: dict[str, Any], engine_build: str = "") -> MethodChoice | None:
        """The decoding configuration of a server started with the speculative config `config`
        (a `--speculative-config` object, e.g. one a `vllm bench sweep` run file records): the
        method whose flags entry renders the same `method` value, with k and the tree budget read
        from the keys its template fills with `{k}` / `{tree_budget}`. The inverse of
        `speculative_config_args`, read from the same flags. None when no entry matches (or the
        engine's methods use no speculative config)."""
        for name, entry in self.engine_block(engine_build).get("methods", {}).items():
            template = (entry or {}).get("speculative_config") or {}
            if not template or template.get("method") != config.get("method"):
                continue
            k = next((config.get(key) for key, value in template.items() if value == "{k}"), None)
            budget = next((config.get(key) for key, value in template.items() if value == "{tree_budget}"), None)
            return MethodChoice(name, k, budget)
        return None

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

    # ---- facts every engine module may override
    def port_span(self, port: int) -> list[int]:
        """TCP ports the server binds, derived from its main `port`, to check before a start
        (default: the main port only)."""
        return [port]

    def ready_urls(self, base_url: str) -> list[str]:
        """URLs that must answer 200, in order, before the server counts as ready (`ready_paths`)."""
        base = base_url.rstrip("/")
        return [base + path for path in self.ready_paths]

    def metrics_url(self, base_url: str) -> str:
        """The server's Prometheus page (`metrics_path`)."""
        return base_url.rstrip("/") + self.metrics_path

    def reset_cache_url(self, base_url: str) -> str | None:
        """POST endpoint that clears the prefix cache between points on a shared server
        (`reset_cache_path`; None: the engine has none draftboard knows, nothing is reset)."""
        return base_url.rstrip("/") + self.reset_cache_path if self.reset_cache_path else None

    def read_counters(self, page: MetricsPage) -> SpecCounters:
        """The speculative-decoding counters in one parsed /metrics page (the page's raw samples
        and restart markers are attached by `counters_from_text`); `source="none"` when the page
        has none. An engine that declares `counter_prefixes` reads its own; the default (an
        engine without counters of its own: an external server, a server that exports another
        engine's names) is what any registered engine with counters finds there, in registry
        order (`counters_from_text(..., AUTO)`)."""
        return _read_any(page)

    def scrape_counters(self, metrics_url: str, timeout_s: float = 5.0) -> SpecCounters:
        """GET `metrics_url` and read this engine's counters (`read_counters`). Raises
        ScrapeError (benchkit.measure.counters) naming the URL, or for a page that cannot be read."""
        return counters_from_text(counters.fetch_metrics_text(metrics_url, timeout_s), self.name)

    def speculative_config_args(self, spec: dict[str, Any], method: str) -> list[str]:
        """The command-line flags that pass a method's filled `speculative_config` (flags file)
        to the server. Default: refused, the engine takes its method flags as `args`. Raises
        EngineConfigError."""
        raise EngineConfigError(f"methods.{method}.speculative_config: engine {self.name!r} takes no speculative "
                                "config; give the method's flags as `args`")

    def acceptance_twin(self, tau: float, k: int | None) -> TwinChange | None:
        """(c) What a server start changes so that its acceptance length is forced to `tau`
        (tokens per verify pass, bonus included) with draft length `k` (None: the engine's
        default): an acceptance-controlled twin of a speculative run. None: the engine cannot
        force acceptance, so there is no twin (the default)."""
        return None

    def client_options(self) -> ClientOptions:
        """What the load client asks this engine's servers for, read off its capabilities (the one
        mapping; the runner records the answer with the run, `RunOutcome.client_options`):

        - `return_token_ids` when the engine declares `token_ids` (a): the output's ids are kept
          for the lossless check (issue 18) and each message's tokens are counted exactly;
        - `continuous_usage` when the engine declares it (d), and also when it declares nothing
          about it (an external server: a server that does not know the option ignores it, and
          the client then counts from the ids or the text, flagged); never refused by a server;
        - `spec_tokens_details` off: no engine carries per-request figures on /v1/completions on
          request (vLLM's need a server flag, SGLang's are on its native /generate only);
        - outputs kept (the digest of `benchkit.measure.outputs`), the first FULL_REQUESTS in full.
        """
        return ClientOptions(continuous_usage=True, return_token_ids=self.token_ids is not None)

    @staticmethod
    def check_tau(tau: float, k: int | None) -> None:
        """Refuse a pinned tau outside [1, k + 1] (1 when no draft is ever accepted, k + 1 when
        all are; both engines check the same range). Raises EngineConfigError."""
        top = k + 1 if k is not None else math.inf
        if not isinstance(tau, int | float) or isinstance(tau, bool) or not 1.0 <= tau <= top:
            raise EngineConfigError(f"acceptance_tau: {tau!r} outside [1, {top:g}] (tokens per verify pass "
                                    f"with k = {k})")

    def twin(self, server: ServerConfig, tau: float) -> TwinChange:
        """The TwinChange that pins `server`'s acceptance length to `tau` (k as build_argv
        resolves it). Raises EngineConfigError for a method that does not speculate, an engine
        without forced acceptance ("no twin"), or tau outside [1, k + 1]."""
        if server.method == "auto":
            raise EngineConfigError("acceptance_tau: method 'auto' does not speculate; a twin pins a speculative run")
        k = self.resolve_k(server, self.method_entry(server.method, server.engine_build))
        change = self.acceptance_twin(tau, k)
        if change is None:
            raise EngineConfigError(f"acceptance_tau: engine {self.name!r} cannot force acceptance (no twin)")
        return change

    # ---- the command line, from the flags file
    def build_argv(
        self, server: ServerConfig, port: int, python: str = sys.executable, *, seed: int | None = None,
        acceptance_tau: float | None = None,
    ) -> list[str]:
        """The server's command line as a list: `[python, -m, module, ...]`.

        Order: the build's `launch` templates, `options` for set fields (dtype, max_model_len,
        load_format, served_model_name, seed), prefix-caching flags when decided, the method's
        args (and its `speculative_config`, rendered by `speculative_config_args`), the engine's
        per-request spec-decode flags when the build sets `per_request_spec_metrics` and the
        method speculates, then `server.extra_args` verbatim. With `acceptance_tau`, the twin's changes
        (`twin`): its speculative-config keys merged in and its args after the method's.
        Raises EngineConfigError naming the ServerConfig field when the combination
        breaks a rule of the method table (benchkit.methods.check_method: unknown method, tree
        budget or drafter missing, k < 1, prefix caching forced on for DDTree), the model is
        empty, tp < 1, the method is undefined for the build, or the twin is impossible.
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
        change = self.twin(server, acceptance_tau) if acceptance_tau is not None else TwinChange()
        if change.speculative_config and "speculative_config" not in entry:
            raise EngineConfigError(f"acceptance_tau: method {server.method!r} of this build has no speculative_config "
                                    "to force acceptance in")
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
            argv += self.speculative_config_args({**spec, **change.speculative_config}, server.method)
        level = block.get("per_request_spec_metrics")
        if level and info.speculates:
            if self.request_spec_metrics is None:
                raise EngineConfigError(f"per_request_spec_metrics: engine {self.name!r} declares no per-request "
                                        "spec-decode figures")
            argv += self.request_spec_metrics.args(level)
        argv += [*change.args, *(str(a) for a in server.extra_args)]
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
            module=launch_module(block.get("launch", [])), distributions=self.distributions)

    def launch(
        self,
        server: ServerConfig,
        port: int,
        gpus: list[GpuRef],
        *,
        seed: int | None = None,
        workdir: str | Path = ".",
        name_hint: str = "",
        acceptance_tau: float | None = None,
    ) -> Launch:
        """One server start of `server` on `port` and `gpus`, from its build's environment: argv
        = the filled launcher prefix + `build_argv(server, port, python=<the build's python>)`;
        env = `env(gpus, server=server)`; for a container launcher, a fresh container name
        (`{name}`) and `workdir/server.env` as `{env_file}` (written by Launch.write_env_file).
        With `acceptance_tau`, the acceptance-controlled twin of that start (`twin`).
        Raises EngineConfigError (see build_argv, build_env, environment.fill_launcher)."""
        benv = self.build_env(server.engine_build)
        env = self.env(gpus, server=server, acceptance_tau=acceptance_tau)
        argv = self.build_argv(server, port, python=benv.python, seed=seed, acceptance_tau=acceptance_tau)
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

    # ---- environment
    def env(
        self,
        gpus: list[GpuRef],
        base: dict[str, str] | None = None,
        *,
        server: ServerConfig | None = None,
        acceptance_tau: float | None = None,
    ) -> dict[str, str]:
        """Environment variables to set for the server, on top of the parent's environment
        (`ManagedServer` merges them over `os.environ`). With `base`, they are merged over a
        copy of `base` instead.

        Order: `server.env` (the sweep's per-server variables, e.g. VLLM_CPU_KVCACHE_SPACE),
        then always `CUDA_DEVICE_ORDER=PCI_BUS_ID` (indices match nvidia-smi / NVML); with GPUs,
        `CUDA_VISIBLE_DEVICES` lists their UUIDs (indices where a UUID is empty), overriding
        any value in `server.env`; with none it is left alone; then the engine's `server_env`
        (e.g. vLLM's `VLLM_SERVER_DEV_MODE=1`, without which `POST /reset_prefix_cache` does not
        exist), with `server.engine_cpus` the engine's CPU-placement variables (`cpu_placement`;
        EngineConfigError when the engine has none or the list is bad) and, with
        `acceptance_tau` (needs `server`), the twin's variables (`twin`).
        """
        out = dict(base) if base is not None else {}
        if server is not None:
            out.update({str(k): str(v) for k, v in server.env.items()})
        out["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        if gpus:
            out["CUDA_VISIBLE_DEVICES"] = ",".join(g.uuid if g.uuid else str(g.index) for g in gpus)
        out.update(self.server_env)
        if server is not None and server.engine_cpus:
            if self.cpu_placement is None:
                raise EngineConfigError(f"engine_cpus: engine {self.name!r} has no known way to bind its processes to "
                                        "CPUs (only vLLM's CPU build has one here)")
            try:
                parse_cpus(server.engine_cpus)
            except CpuPlacementError as exc:
                raise EngineConfigError(str(exc)) from None
            out.update(self.cpu_placement.server_env(server.engine_cpus))
        if acceptance_tau is not None:
            if server is None:
                raise EngineConfigError("acceptance_tau: the twin's environment needs the server configuration")
            out.update(self.twin(server, acceptance_tau).env)
        return out


#: `engine` of counters_from_text that asks every registered engine with counters of its own.
AUTO = "auto"


def _counter_prefixes() -> tuple[str, ...]:
    return tuple(p for n in registry.engine_names() for p in registry.engine_class(n).counter_prefixes)


def _read_any(page: MetricsPage) -> SpecCounters:
    """The first reading with counters, from the registered engines that declare counter names
    (registry order: vLLM's names win when a page has both); `source="none"` otherwise."""
    for name in registry.engine_names():
        cls = registry.engine_class(name)
        if cls.counter_prefixes:
            reading = cls().read_counters(page)
            if reading.source != "none":
                return reading
    return SpecCounters(source="none")


def counters_from_text(text: str, engine: str = AUTO) -> SpecCounters:
    """A Prometheus text page (benchkit.measure.counters.parse_page, keeping the counter names of
    every registered engine) read by engine `engine`'s `read_counters`, or with AUTO by whichever
    registered engine finds its counters there, with the page's raw samples, `_created` times and
    process start attached. A page without speculative-decoding counters gives `source="none"`.
    Raises ScrapeError for text the Prometheus parser rejects or a sample the engine's reader
    cannot read (e.g. a vLLM per-position sample without an integer `position` label),
    EngineConfigError (a ValueError) for an unknown `engine`."""
    reader = _read_any if engine == AUTO else registry.engine_class(engine)().read_counters
    page = counters.parse_page(text, _counter_prefixes())
    return page.reading(reader(page))


def adapter_for(engine: str, flags_file: str | Path | None = None) -> EngineAdapter:
    """The adapter of registered engine `engine` (benchkit.engines.registry); for an engine
    draftboard launches, its flags loaded from the shipped engine_flags.yaml with `flags_file`
    merged on top (the environment variable `DRAFTBOARD_ENGINE_FLAGS` when `flags_file` is
    None). Raises EngineConfigError for an unknown engine or a bad flags file."""
    cls = registry.engine_class(engine)
    if not cls.launched:
        return cls()
    if flags_file is None and os.environ.get("DRAFTBOARD_ENGINE_FLAGS"):
        flags_file = os.environ["DRAFTBOARD_ENGINE_FLAGS"]
    return cls(load_flags(flags_file))
