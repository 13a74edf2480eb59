"""The outcome of one run: the one record every path stores (issue 17).

`RunOutcome` is a pydantic model (unknown keys refused, no coercion). The runner returns it
(benchkit.execution.runner, filling it as the run goes: every assignment is validated), the
worker stores it, an offline bundle's run file is it plus the run's identity
(benchkit.execution.bundle.BundleRun) and ingest stores that, and an import of another tool's
result file builds one too. runs.services.outcomes.store_outcome is the one writer for all of
them; what it stores comes from here, never from a list of fields kept elsewhere.

JSON layout (`model_dump_json`, the bundle's run file): every field under its name, and three
fields in the encodings the database keeps:

- `logs`: {"encoding": "draftboard-logs-v1", "data_b64": base64 of
  benchkit.measure.logs.encode_logs, "n_requests", "n_warmup"} or null;
- `telemetry`: {"encoding": "draftboard-telemetry-v1", "data_b64": base64 of
  benchkit.measure.gpu_samples.encode_telemetry, "hz", "n_ticks", "n_gpus"} or null;
- `outputs`: {"encoding": "draftboard-outputs-v1", "data_b64": base64 of
  benchkit.measure.outputs.encode_outputs, "n_requests"} or null;
- `metrics`: {WindowMetrics field: value}, each within the metric schema's bounds
  (benchkit.formats.common.metrics_model), or null.

`efficiency` and `gpu_check` must have the shapes of EfficiencyFigures.to_dict() and
GpuWindowCheck.to_dict() (checked, kept as dicts). Texts stored in a limited column are cut to
the database's limit (benchkit.formats.limits.TEXT_LIMITS; a log tail keeps its end), never
refused: a long server message must not fail a run.
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    Strict,
    TypeAdapter,
    ValidationError,
)

from benchkit.formats.common import TOOL_DRAFTBOARD, metrics_model
from benchkit.formats.limits import TEXT_LIMITS
from benchkit.measure.efficiency import EfficiencyFigures
from benchkit.measure.gpu_samples import TelemetryStream, decode_telemetry, encode_telemetry
from benchkit.measure.gpu_validity import GpuWindowCheck
from benchkit.measure.logs import RequestLog, decode_logs, encode_logs
from benchkit.measure.metrics import WindowMetrics
from benchkit.measure.outputs import RunOutputs, decode_outputs, encode_outputs


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def first_error(exc: ValidationError) -> str:
    """`dotted.loc: message` of a ValidationError's first error (the message alone without a loc)."""
    e = exc.errors()[0]
    loc = ".".join(str(p) for p in e["loc"])
    return f"{loc}: {e['msg']}" if loc else e["msg"]


def _b64(data_b64: str) -> bytes:
    try:
        return base64.b64decode(data_b64, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"data_b64: not base64 ({exc})") from None


# -- the request logs ----------------------------------------------------------------------------

class LogsPart(_Strict):
    """The request logs in a JSON file: `data_b64` is base64 of benchkit.measure.logs.encode_logs
    (the encoding RequestLogBlob stores), with the number of requests and of warmup requests."""

    encoding: Literal["draftboard-logs-v1"] = "draftboard-logs-v1"
    data_b64: str
    n_requests: int = Field(ge=0)
    n_warmup: int = Field(ge=0)

    @classmethod
    def of(cls, logs: list[RequestLog]) -> LogsPart:
        """The part of `logs`."""
        return cls(data_b64=base64.b64encode(encode_logs(logs)).decode(), n_requests=len(logs),
                   n_warmup=sum(1 for r in logs if r.warmup))

    def decode(self) -> list[RequestLog]:
        """The logs; ValueError when the data is not base64 of encoded logs or holds another
        number of requests than `n_requests`."""
        raw = _b64(self.data_b64)
        try:
            logs = decode_logs(raw)
        except Exception as exc:  # zlib / JSON / shape errors of a damaged blob
            raise ValueError(f"cannot decode the request logs ({type(exc).__name__}: {exc})") from None
        if len(logs) != self.n_requests:
            raise ValueError(f"holds {len(logs)} requests, n_requests says {self.n_requests}")
        return logs


# -- the output digests (the lossless check) -------------------------------------------------------

class OutputsPart(_Strict):
    """Every measured request's output digest in a JSON file: `data_b64` is base64 of
    benchkit.measure.outputs.encode_outputs (the encoding RunOutputsBlob stores), with the number
    of requests it holds."""

    encoding: Literal["draftboard-outputs-v1"] = "draftboard-outputs-v1"
    data_b64: str
    n_requests: int = Field(ge=0)

    @classmethod
    def of(cls, outputs: RunOutputs) -> OutputsPart:
        """The part of `outputs`."""
        return cls(data_b64=base64.b64encode(encode_outputs(outputs)).decode(), n_requests=len(outputs))

    def decode(self) -> RunOutputs:
        """The digests; ValueError when the data does not decode (decode_outputs) or holds another
        number of requests than `n_requests`."""
        outputs = decode_outputs(_b64(self.data_b64))
        if len(outputs) != self.n_requests:
            raise ValueError(f"holds {len(outputs)} requests, n_requests says {self.n_requests}")
        return outputs


def _outputs_in(value: Any) -> RunOutputs | None:
    """RunOutputs as they are (the runner), or an OutputsPart's JSON form decoded (a file)."""
    if value is None or isinstance(value, RunOutputs):
        return value
    return _decoded(OutputsPart, value)


def _outputs_out(outputs: RunOutputs | None) -> dict[str, Any] | None:
    return None if outputs is None else OutputsPart.of(outputs).model_dump()


def _decoded(part: type[LogsPart] | type[TelemetryPart] | type[OutputsPart], value: Any) -> Any:
    """The decoded data of an encoded part's JSON form (ValueError naming the problem)."""
    if not isinstance(value, dict):
        raise ValueError(f"expected the decoded data or a {part.__name__} object")
    try:
        return part.model_validate(value).decode()
    except ValidationError as exc:
        raise ValueError(first_error(exc)) from None


def _logs_in(value: Any) -> list[RequestLog] | None:
    """A list of RequestLog as it is (the runner), or a LogsPart's JSON form decoded (a file)."""
    if value is None or (isinstance(value, list) and all(isinstance(r, RequestLog) for r in value)):
        return value
    return _decoded(LogsPart, value)


def _logs_out(logs: list[RequestLog] | None) -> dict[str, Any] | None:
    return None if logs is None else LogsPart.of(logs).model_dump()


# -- the GPU telemetry stream --------------------------------------------------------------------

class TelemetryPart(_Strict):
    """A GPU telemetry stream in a JSON file: `data_b64` is base64 of
    benchkit.measure.gpu_samples.encode_telemetry (the encoding GpuTelemetryBlob stores), with the
    rate (ticks/s) and size the blob row records."""

    encoding: Literal["draftboard-telemetry-v1"] = "draftboard-telemetry-v1"
    data_b64: str
    hz: float = Field(gt=0)
    n_ticks: int = Field(ge=0)
    n_gpus: int = Field(ge=0)

    @classmethod
    def of(cls, stream: TelemetryStream) -> TelemetryPart:
        """The part of `stream` (ValueError for an inconsistent stream, encode_telemetry)."""
        return cls(data_b64=base64.b64encode(encode_telemetry(stream)).decode(), hz=stream.hz,
                   n_ticks=stream.n_ticks, n_gpus=len(stream.gpus))

    def decode(self) -> TelemetryStream:
        """The stream; ValueError when the data does not decode (decode_telemetry) or its rate
        or size is not the part's."""
        stream = decode_telemetry(_b64(self.data_b64))
        got = (stream.hz, stream.n_ticks, len(stream.gpus))
        if got != (self.hz, self.n_ticks, self.n_gpus):
            raise ValueError(f"the stream has (hz, n_ticks, n_gpus) {got}, the part says "
                             f"{(self.hz, self.n_ticks, self.n_gpus)}")
        return stream


def _telemetry_in(value: Any) -> TelemetryStream | None:
    """A TelemetryStream as it is (the runner), or a TelemetryPart's JSON form decoded (a file)."""
    if value is None or isinstance(value, TelemetryStream):
        return value
    return _decoded(TelemetryPart, value)


def _telemetry_out(stream: TelemetryStream | None) -> dict[str, Any] | None:
    return None if stream is None else TelemetryPart.of(stream).model_dump()


# -- the window's figures and the GPU results ------------------------------------------------------

#: The window's figures in a file: one optional field per WindowMetrics field, bounds from the schema.
OutcomeMetrics = metrics_model("OutcomeMetrics", lambda f: f.name, scaled=False, base=_Strict)


def _metrics_in(value: Any) -> Any:
    return value.to_dict() if isinstance(value, WindowMetrics) else value


def _metrics_of(model: BaseModel | None) -> WindowMetrics | None:
    return None if model is None else WindowMetrics.from_dict(model.model_dump())


def _shaped(adapter: TypeAdapter, drop: tuple[str, ...] = ()) -> Any:
    """An after-validator checking that a dict has the shape of `adapter`'s dataclass (its
    `to_dict()`; keys in `drop` are derived, not fields); the dict is kept as it is."""

    def check(value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            adapter.validate_python({k: v for k, v in value.items() if k not in drop})
        return value

    return AfterValidator(check)


def _clipped(name: str, keep_end: bool = False) -> Any:
    """A string cut to TEXT_LIMITS[name] characters (its last ones with `keep_end`)."""
    n = TEXT_LIMITS[name]
    return Annotated[str, Strict(), AfterValidator(lambda s: s[-n:] if keep_end else s[:n])]


_Logs = Annotated[Any, PlainValidator(_logs_in), PlainSerializer(_logs_out, when_used="json")]
_Telemetry = Annotated[Any, PlainValidator(_telemetry_in), PlainSerializer(_telemetry_out, when_used="json")]
_Outputs = Annotated[Any, PlainValidator(_outputs_in), PlainSerializer(_outputs_out, when_used="json")]
_Metrics = Annotated[OutcomeMetrics | None, BeforeValidator(_metrics_in),  # type: ignore[valid-type]
                    AfterValidator(_metrics_of), PlainSerializer(lambda m: None if m is None else m.to_dict())]
_Efficiency = Annotated[dict[str, Any] | None, _shaped(TypeAdapter(EfficiencyFigures), drop=("tokens_counted",))]
_GpuCheck = Annotated[dict[str, Any] | None, _shaped(TypeAdapter(GpuWindowCheck))]


class RunOutcome(BaseModel):
    """What happened in one run (the runner's `execute_runs` returns one per run).

    `ok` is True only when the run counts (MEASUREMENT.md "When a run does not count");
    otherwise `reason` is a code (preflight codes, `disk_full` (the runs folder below its minimum
    free space, a write into the workdir that met ENOSPC / EDQUOT, or a server that exited with
    an almost empty log on a full filesystem; the message names the path, the folder and its
    free MiB), `server_exited`, `server_not_ready`,
    `server_died`, `not_run_server_died`, `workload_error`, validity codes, `run_timeout`,
    `internal_error`, an import's `all_requests_failed`) and `message` says what happened.
    `server_shared`: the run shared its server start with other runs. `port`: the server's main
    port (the sweep's pinned one, or the free one chosen at start; None for an external server,
    an import, or when preflight failed before a port was chosen). `provenance`: what the
    engine's own environment says about itself (benchkit.engines.environment.check_engine_env:
    build, launcher, engine distribution, version and git commit, torch and CUDA versions);
    `version_error` in it says why the version could not be read. `engine_version` /
    `engine_commit` copy its version and commit ('' when unknown; an import: the tool's
    version). `logs`: the raw request logs, warmup included; `window_start_ns` /
    `window_end_ns`: the measured window (perf_counter_ns). `metrics`: the window's figures
    (benchkit.measure.metrics.WindowMetrics, the speculative-decoding fields from the counter
    deltas, None when the counters restarted or gave figures out of bounds: then a suspect mark
    says so); `spec_source` names the counters (or the tool) those came from; `distributions`
    the run page's samples. `suspect_reasons`: marks that keep the run but flag it;
    `violations`: the failures found, (code, message). `teardown`: the teardown report
    (benchkit.hosts.teardown); `timings_s`: seconds per phase. `client_headroom`: the load
    client's CPU and event-loop lag over the window (`dataclasses.asdict` of
    benchkit.measure.loadgen.ClientHeadroom; its figures are also in `metrics`, group `client`).
    GPU telemetry (issue 12): `telemetry` the run's NVML sample stream (from just before the
    warmup to just after the window; also kept for a failed run), None without one, and then
    `telemetry_note` says why (`no GPU telemetry: ...`); `idle_used_mib` the preflight's memory
    reading per GPU UUID (MiB, the baseline of `gpu_unexplained_memory`); `efficiency`
    (EfficiencyFigures.to_dict(), price None: cost is priced when read; its run-level figures
    are in `metrics`, group `efficiency`) and `gpu_check` (GpuWindowCheck.to_dict(), None
    without a stream), set for runs whose window ended. `outputs`: every measured request's
    output digest (benchkit.measure.outputs.RunOutputs: token ids or text, hashed, the first
    prompts in full; the lossless check's input), None when not kept (an import, or a run whose
    window never ran); `client_options`: what the load client asked of the server
    (`dataclasses.asdict` of benchkit.measure.loadclient.ClientOptions, chosen from the engine's
    capabilities by EngineAdapter.client_options; {} when no load was sent). `source_tool`,
    `definitions`, `extra`:
    who computed the figures and how, and a source file's keys without a column (imports;
    `draftboard` for a measured run).
    """

    model_config = ConfigDict(extra="forbid", strict=True, validate_assignment=True)

    ok: bool
    reason: _clipped("failure_reason") = ""  # type: ignore[valid-type]
    message: _clipped("failure_message") = ""  # type: ignore[valid-type]
    argv: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    engine_version: _clipped("engine_version") = ""  # type: ignore[valid-type]
    engine_commit: _clipped("engine_commit") = ""  # type: ignore[valid-type]
    server_log_tail: _clipped("server_log_tail", keep_end=True) = ""  # type: ignore[valid-type]
    server_shared: bool = False
    port: int | None = Field(None, ge=1, le=65535)
    provenance: dict[str, Any] = Field(default_factory=dict)
    teardown: dict[str, Any] = Field(default_factory=dict)
    timings_s: dict[str, float] = Field(default_factory=dict)
    logs: _Logs = None
    window_start_ns: int = 0
    window_end_ns: int = 0
    metrics: _Metrics = None
    spec_source: _clipped("spec_source") = ""  # type: ignore[valid-type]
    distributions: dict[str, list[float]] = Field(default_factory=dict)
    suspect_reasons: list[str] = Field(default_factory=list)
    violations: list[tuple[str, str]] = Field(default_factory=list)
    client_headroom: dict[str, Any] = Field(default_factory=dict)
    telemetry: _Telemetry = None
    telemetry_note: str = ""
    idle_used_mib: dict[str, int] = Field(default_factory=dict)
    outputs: _Outputs = None
    client_options: dict[str, Any] = Field(default_factory=dict)
    efficiency: _Efficiency = None
    gpu_check: _GpuCheck = None
    source_tool: _clipped("source_tool") = TOOL_DRAFTBOARD  # type: ignore[valid-type]
    definitions: dict[str, str] = Field(default_factory=dict)
    extra: dict[str, Any] = Field(default_factory=dict)

    def problem(self) -> str | None:
        """Why this outcome cannot be stored as a run's end, or None: a succeeded outcome needs
        metrics and no failure reason; a failed one needs its reason."""
        if self.ok and (self.metrics is None or self.reason):
            return "a succeeded run needs metrics and no failure reason"
        if not self.ok and not self.reason:
            return "a failed run needs its failure reason"
        return None
