"""Recompute stored runs' metrics from their raw request logs (a formula fix reaches old runs).

Runs are streamed in chunks with only the columns recompute needs (the log blob and window, the
workload's SLO, the kept counter figures); each run's requests are computed once for both the
window figures and the run page's samples (benchkit.measure.metrics.measure_encoded: a big run's
blob is decoded and walked chunk by chunk, so memory stays bounded), optionally in several worker
processes; rows are written by metrics_store.store_metrics, the one writer.

The window is assembled by the runner's own assembler (benchkit.measure.window.assemble_window)
from: the logs' figures (recomputed), the spec-decode figures (kept: the server's counters, not
the logs), the client's headroom (kept: its stored `client_headroom`, group `client`) and the
GPU efficiency figures and verdicts, re-derived from the run's stored telemetry stream
(GpuTelemetryBlob, with its idle memory baseline) over the request-log window; a run without a
stream gets the figures that need none (output tok/s per GPU) and a note saying why.
"""

from __future__ import annotations

import multiprocessing
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

from django.db import transaction

from benchkit.measure.gpu_samples import TelemetryStream, decode_telemetry
from benchkit.measure.gpu_window import NO_GPUS_NOTE
from benchkit.measure.metrics import METRIC_FIELDS, WindowMetrics, measure_encoded_batch
from benchkit.measure.window import assemble_window
from runs.models import Run, RunMetrics, RunState
from runs.services import summaries
from runs.services.metrics_store import store_metrics

#: Runs loaded per query (bounds memory: a blob is ~0.1-0.3 MB).
CHUNK = 20
_SPEC_FIELDS = tuple(f.name for f in METRIC_FIELDS if f.group == "spec_decode")
#: What recompute reads of a run: nothing else (no samples, spec, argv, log tail).
_COLUMNS = ("id", "sweep_id", "spec__workload__slo", "request_logs__data", "request_logs__window_start_ns",
            "request_logs__window_end_ns", "metrics__id", "metrics__spec_source", "metrics__source_tool",
            "metrics__definitions", "metrics__extra", "metrics__client_headroom", "gpus",
            "gpu_telemetry__data", "gpu_telemetry__idle_used_mib",
            *(f"metrics__{f}" for f in _SPEC_FIELDS))


def recompute_run(run: Run | int) -> RunMetrics | None:
    """Recompute one run's metrics from its stored logs and window; keeps its spec-decode
    figures (they come from the server's counters, not from the logs) and their source.

    Only succeeded runs with stored logs are recomputed; returns None for others (imported runs
    have no logs and are left as they are)."""
    pk = run if isinstance(run, int) else run.pk
    done = recompute_runs([pk])
    return RunMetrics.objects.get(run_id=pk) if done else None


def recomputable(qs) -> tuple[list[int], list[int]]:
    """(ids of the succeeded runs in `qs` that have stored logs, ids of those that have none),
    in id order (two queries of ids only; the runs themselves are loaded in chunks later)."""
    qs = qs.filter(state=RunState.SUCCEEDED).order_by("pk")
    return (list(qs.filter(request_logs__isnull=False).values_list("pk", flat=True)),
            list(qs.filter(request_logs__isnull=True).values_list("pk", flat=True)))


def _chunks(ids: Iterable[int], size: int) -> Iterator[list[int]]:
    chunk: list[int] = []
    for pk in ids:
        chunk.append(pk)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _load(ids: list[int]) -> list[dict[str, Any]]:
    """The recompute columns of the succeeded runs among `ids` that have logs (one query)."""
    return list(Run.objects.filter(pk__in=ids, state=RunState.SUCCEEDED, request_logs__isnull=False)
                .order_by("pk").values(*_COLUMNS))


def _items(rows: list[dict[str, Any]]) -> list[tuple[bytes, int, int, dict | None]]:
    """The pure part's input per row (measure_encoded_batch): blob, window, SLO."""
    return [(bytes(row["request_logs__data"]), row["request_logs__window_start_ns"],
             row["request_logs__window_end_ns"], row["spec__workload__slo"] or None) for row in rows]


def _store(rows: list[dict[str, Any]], results: list[tuple[WindowMetrics, dict]]) -> int:
    """Write the recomputed figures of `rows`, keeping each row's counter figures, client
    headroom and sources, and re-deriving its GPU figures from its telemetry stream."""
    with transaction.atomic():
        summaries.mark_stale({row["sweep_id"] for row in rows})
        for row, (measured, samples) in zip(rows, results, strict=True):
            kept: dict[str, Any] = {}
            if row["metrics__id"] is not None:
                kept = dict(spec_source=row["metrics__spec_source"], source_tool=row["metrics__source_tool"],
                            definitions=row["metrics__definitions"], extra=row["metrics__extra"],
                            client_headroom=row["metrics__client_headroom"])
            stream, note = _stream(row)
            window, gw = assemble_window(
                measured, row["request_logs__window_start_ns"], row["request_logs__window_end_ns"],
                spec_decode={f: row[f"metrics__{f}"] for f in _SPEC_FIELDS},
                client_headroom=kept.get("client_headroom"), telemetry=stream, gpu_uuids=_gpu_uuids(row),
                idle_used_mib=row["gpu_telemetry__idle_used_mib"] or {}, telemetry_note=note)
            store_metrics(Run(pk=row["id"]), window, distributions=samples, efficiency=gw.efficiency,
                          gpu_check=gw.gpu_check, **kept)
    return len(results)


def _gpu_uuids(row: dict[str, Any]) -> list[str]:
    """The run's GPU UUIDs (`Run.gpus`)."""
    return [g.get("uuid", "") for g in row["gpus"] or [] if isinstance(g, dict)]


def _stream(row: dict[str, Any]) -> tuple[TelemetryStream | None, str]:
    """(the row's stored telemetry stream, or None with the note saying why there is none)."""
    data = row["gpu_telemetry__data"]
    if data is not None:
        try:
            return decode_telemetry(bytes(data)), ""
        except ValueError as exc:
            return None, f"no GPU telemetry: the stored stream does not decode ({exc})"
    return None, "" if _gpu_uuids(row) else NO_GPUS_NOTE


def recompute_runs(ids: Iterable[int], jobs: int = 1, progress: Callable[[int], None] | None = None) -> int:
    """Recompute the succeeded runs with logs among `ids` (others are passed over) and return how
    many were recomputed. Loads CHUNK runs per query; with `jobs` > 1 the metrics are computed in
    that many worker processes (spawned: no database state is shared), at most 2 x jobs chunks in
    flight, while this process reads and writes the database. `progress(n)` is called after
    each chunk with the runs it held."""
    chunks = (_load(c) for c in _chunks(ids, CHUNK))
    done = 0
    if jobs <= 1:
        for rows in chunks:
            done += _finish(rows, measure_encoded_batch(_items(rows)), progress)
        return done
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        pending: deque[tuple[list[dict], Future]] = deque()
        for rows in chunks:
            pending.append((rows, pool.submit(measure_encoded_batch, _items(rows))))
            while len(pending) >= 2 * jobs:
                rows_done, future = pending.popleft()
                done += _finish(rows_done, future.result(), progress)
        while pending:
            rows_done, future = pending.popleft()
            done += _finish(rows_done, future.result(), progress)
    return done


def _finish(rows: list[dict[str, Any]], results: list, progress: Callable[[int], None] | None) -> int:
    n = _store(rows, results)
    if progress:
        progress(n)
    return n
