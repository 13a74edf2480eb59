"""An external server: one someone else started, named by the sweep's `server.endpoint_url`.

draftboard launches nothing (no flags, no port of its own, no environment), so its version
cannot be read; it is ready when `GET /v1/models` answers (the one endpoint every OpenAI-
compatible server has). What engine serves it is unknown, so nothing engine-specific is
declared: no cache reset (points sharing it run without one), no counters of its own (the
runner's auto reading still finds vLLM's or SGLang's names on its `/metrics` page), and none of
the capabilities: no token-id request, no per-request speculative figures, no forced acceptance
(so no acceptance-controlled twin), continuous usage not known (the load client asks anyway and
counts from the text, flagged, when the usage is missing).
"""

from __future__ import annotations

import sys
from typing import ClassVar, NoReturn

from benchkit.engines.adapters import EngineAdapter
from benchkit.engines.flags import EngineConfigError
from benchkit.specs import GpuRef, ServerConfig


class External(EngineAdapter):
    """A server someone else started (`ServerConfig.endpoint_url`): `build_argv` returns [] and
    `env` returns {}."""

    name: ClassVar[str] = "external"
    title: ClassVar[str] = "external server"
    launched: ClassVar[bool] = False

    def port_span(self, port: int) -> list[int]:
        """[]: draftboard binds nothing for it."""
        return []

    def build_argv(self, server: ServerConfig, port: int, python: str = sys.executable, *, seed: int | None = None,
                   acceptance_tau: float | None = None) -> list[str]:
        """Always [] (nothing to start). Raises EngineConfigError when `endpoint_url` is empty or a
        twin is asked for (no forced acceptance)."""
        if not server.endpoint_url:
            raise EngineConfigError(f"ServerConfig.endpoint_url: engine {self.name!r} needs the URL of a "
                                    "running server")
        if acceptance_tau is not None:
            self.twin(server, acceptance_tau)
        return []

    def env(self, gpus: list[GpuRef], base: dict[str, str] | None = None, *, server: ServerConfig | None = None,
            acceptance_tau: float | None = None) -> dict[str, str]:
        """Always {} (or a copy of `base`): no process is started."""
        return dict(base) if base is not None else {}

    def twin(self, server: ServerConfig, tau: float) -> NoReturn:
        """Never: an external server cannot be made to accept at a pinned tau. Raises EngineConfigError."""
        raise EngineConfigError(f"acceptance_tau: engine {self.name!r} cannot force acceptance (no twin)")

    def base_url(self, server: ServerConfig) -> str:
        """The external server's base URL (`endpoint_url` without a trailing `/v1` or slash)."""
        url = server.endpoint_url.rstrip("/")
        return url[:-3] if url.endswith("/v1") else url
