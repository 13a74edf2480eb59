"""What an engine's server can do beyond serving tokens, as declarations each engine module fills
in (benchkit/engines/kinds/): the shapes here, the facts (with the engine source they were read
from) there. The load client and the runner read them; nothing here talks to a server.

- `TokenIds` (a): how a completion request asks for the output token ids, and where each choice
  carries them.
- `RequestSpecMetrics` (b): the per-request speculative-decoding figures a response can carry, the
  server flag that turns them on, and `read()`, which turns a response into `RequestSpecFigures`.
- `TwinChange` (c): what an acceptance-controlled twin run changes in the server's start (forced,
  synthetic acceptance at a pinned tau); `EngineAdapter.acceptance_twin` returns one or None.
- `ContinuousUsage` (d): whether the server sends cumulative usage on every streamed message, what
  the request must say for it, and what it costs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TokenIds:
    """(a) Output token ids on a completion: `body` holds the request keys to add (merged into
    the /v1/completions body), `choice_key` the key of each choice that then holds the ids (in a
    stream: the ids of that message's tokens only). `source` cites where this was read."""

    body: Mapping[str, Any]
    choice_key: str
    source: str

    def read(self, choice: Mapping[str, Any]) -> list[int] | None:
        """The token ids one choice (or streamed choice delta) carries; None when absent or not
        a list of integers."""
        ids = choice.get(self.choice_key)
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            return None
        return list(ids)


@dataclass(frozen=True)
class RequestSpecFigures:
    """One request's speculative-decoding figures, in draftboard's terms whatever the engine
    calls them: `steps` target verify passes, `accepted` draft tokens accepted over them,
    `drafted` draft tokens proposed (None where the engine does not say). Units: counts."""

    steps: int
    accepted: int
    drafted: int | None

    @property
    def acceptance_length(self) -> float | None:
        """tau = 1 + accepted / steps (tokens per verify pass, the bonus token included;
        MEASUREMENT.md "Per run"); None without a step."""
        return 1.0 + self.accepted / self.steps if self.steps > 0 else None

    @property
    def acceptance_rate(self) -> float | None:
        """accepted / drafted (fraction, 0..1); None when drafted is unknown or 0."""
        return self.accepted / self.drafted if self.drafted else None


@dataclass(frozen=True)
class RequestSpecMetrics:
    """(b) Per-request speculative-decoding figures in a server's responses.

    `server_args` maps a detail level to the flags the server must start with ((): always on);
    `endpoint` is the path whose responses carry them (`/v1/completions`, or an engine's native
    one); `path` the keys from the response object down to the figures; `steps_keys`,
    `accepted_keys`, `drafted_keys` the names of the verify passes, accepted and proposed draft
    tokens, the first present wins (engines rename them between releases); `streamed_on` says
    which streamed message carries them. `source` cites where this was read.
    """

    server_args: Mapping[str, tuple[str, ...]]
    endpoint: str
    path: tuple[str, ...]
    steps_keys: tuple[str, ...]
    accepted_keys: tuple[str, ...]
    drafted_keys: tuple[str, ...]
    streamed_on: str
    source: str

    def args(self, level: str = "summary") -> list[str]:
        """The server flags for `level`. Raises ValueError for a level the engine does not have."""
        if level not in self.server_args:
            raise ValueError(f"per-request speculative-decoding level {level!r} unknown "
                             f"(known: {', '.join(self.server_args)})")
        return list(self.server_args[level])

    def read(self, response: Mapping[str, Any]) -> RequestSpecFigures | None:
        """The figures of one response object (or streamed message); None when it carries none
        (not speculating, not the message that carries them, or the feature off)."""
        node: Any = response
        for key in self.path:
            node = node.get(key) if isinstance(node, Mapping) else None
        if not isinstance(node, Mapping):
            return None

        def first(keys: tuple[str, ...]) -> int | None:
            for key in keys:
                value = node.get(key)
                if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                    return int(value)
            return None

        steps, accepted = first(self.steps_keys), first(self.accepted_keys)
        if steps is None or accepted is None:
            return None
        return RequestSpecFigures(steps=steps, accepted=accepted, drafted=first(self.drafted_keys))


@dataclass(frozen=True)
class TwinChange:
    """(c) What an acceptance-controlled twin changes in a server start so that acceptance is
    forced to a pinned tau (synthetic: its outputs are not the model's, never lossless):
    `speculative_config` keys merged into the rendered speculative config, `args` flags appended,
    `env` variables set. `note` says how the engine does it."""

    speculative_config: Mapping[str, Any] = field(default_factory=dict)
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    note: str = ""


@dataclass(frozen=True)
class ContinuousUsage:
    """(d) Cumulative usage on every streamed message: `stream_options` is what the request sends
    for it, `requires_include_usage` whether the server ignores `continuous_usage_stats` unless
    `include_usage` is set too, `cost` what it costs the server and the wire. `source` cites where
    this was read."""

    stream_options: Mapping[str, Any]
    requires_include_usage: bool
    cost: str
    source: str
