"""The engines draftboard drives, and the facts about them that are not flags (those are data in
engine_flags.yaml): names and default ports (DOMAIN.md "Engine reference": vLLM serves on 8000,
SGLang on 30000). `external` is a server someone else started: nothing is launched, so it has no
port of its own and no flags."""

from __future__ import annotations

from typing import Literal

#: engine -> its usual port (what users know it by; servers draftboard starts get a free port
#: chosen when they start, benchkit.execution.runner.choose_port, unless a sweep file pins `port:`).
DEFAULT_PORTS: dict[str, int] = {"vllm": 8000, "sglang": 30000, "external": 0}
ENGINES: tuple[str, ...] = tuple(DEFAULT_PORTS)
#: Engines draftboard starts itself, with flags from engine_flags.yaml.
LAUNCHED_ENGINES: tuple[str, ...] = ("vllm", "sglang")
EngineName = Literal[ENGINES]  # type: ignore[valid-type]
LaunchedEngineName = Literal[LAUNCHED_ENGINES]  # type: ignore[valid-type]
