"""A stand-in engine, declared the way a new engine (TensorRT-LLM, say) would be: one module with
one EngineAdapter subclass. Tests register it without touching the registry's file, through the
environment variable DRAFTBOARD_ENGINES=standin=tests.engine_standin:StandIn (so that a worker
process started with it sees it too); its flags come from a flags file of the test's own.

It describes tests/standin/standin_engine (the stand-in server, pure standard library): ready on
`GET /health` then `GET /v1/models`, `POST /flush_cache` clears nothing but answers 200, speculation
through `--speculative-config JSON` (it reads `num_speculative_tokens`), vLLM-named spec-decode
counters on `/metrics` (so the counters are read by vLLM's reader, the runner's auto reading),
version from the distribution tests/standin.py installs.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from benchkit.engines.adapters import EngineAdapter

#: The registry entry the tests put in DRAFTBOARD_ENGINES.
ENTRY = "standin=tests.engine_standin:StandIn"


class StandIn(EngineAdapter):
    """The stand-in engine (module docstring)."""

    name: ClassVar[str] = "standin"
    title: ClassVar[str] = "stand-in engine"
    default_port: ClassVar[int] = 18123
    distributions: ClassVar[tuple[str, ...]] = ("draftboard-standin-engine",)
    ready_paths: ClassVar[tuple[str, ...]] = ("/health", "/v1/models")
    reset_cache_path: ClassVar[str | None] = "/flush_cache"

    def speculative_config_args(self, spec: dict[str, Any], method: str) -> list[str]:
        """`--speculative-config JSON`, as the stand-in server reads it."""
        return ["--speculative-config", json.dumps(spec, sort_keys=True)]
