"""Store a run's outcome: the one writer of a finished run, for every path that ends one.

A worker's run (runs.services.execution), an offline bundle's run (runs.services.ingest) and a
run of another tool's result file (runs.services.imports) all reach the database as a
benchkit.execution.outcome.RunOutcome through `store_outcome`: its final state (a move of
runs.services.transitions), the run's server details and load-client options, its raw request
logs (RequestLogBlob), its output digests (RunOutputsBlob, the lossless check's input), its GPU
telemetry stream (GpuTelemetryBlob), its figures (runs.services.metrics_store) and the
host's quarantine when the teardown left processes behind, in one transaction.
"""

from __future__ import annotations

from django.db import connection, transaction

from benchkit.execution.outcome import RunOutcome
from benchkit.measure.categories import category_figures
from benchkit.measure.gpu_samples import encode_telemetry
from benchkit.measure.logs import encode_logs
from benchkit.measure.outputs import encode_outputs
from runs.models import GpuTelemetryBlob, RequestLogBlob, Run, RunOutputsBlob, RunState
from runs.services import hosts
from runs.services.metrics_store import store_metrics
from runs.services.transitions import create, transition


def store_outcome(run: Run, outcome: RunOutcome, *, origin: str | None = None, note: str = "") -> Run:
    """Write `outcome` as `run`'s end, in one transaction, and return the run in its final
    state (succeeded when `outcome.ok`, else failed with the outcome's reason and message).

    Without `origin`, `run` is a stored run in an active state (a worker's) and the final state
    is its next move (transitions.transition: IllegalTransition unless it is legal from the
    run's state: only `stopping` may succeed). With `origin` (transitions.IMPORTED, INGESTED),
    `run` is a new, unsaved Run with its columns set, created in its final state by that move
    (transitions.create). `note` goes to the move's history row.

    Stored: the server details (port, argv, environment, log tail, engine version and commit,
    provenance), the load client's options, the suspect marks, the raw request logs, the output
    digests and the GPU telemetry stream (also for a failed run: audit), and the figures
    (RunMetrics, with the efficiency figures, GPU verdicts, client headroom and the figures'
    source beside them). A failed run keeps no figures when it
    has request logs (a measured window that does not count: MEASUREMENT.md "When a run does not
    count"; its logs stay for audit and recompute); a failed run without logs (an imported
    file's, e.g. `all_requests_failed`) keeps the figures the file gives, its only record.
    Raises ValueError for an outcome that cannot end a run (RunOutcome.problem)."""
    problem = outcome.problem()
    if problem:
        raise ValueError(f"run {run.pk}: {problem}")
    fields = dict(
        server_shared=outcome.server_shared, server_port=outcome.port, argv=outcome.argv, server_env=outcome.env,
        server_log_tail=outcome.server_log_tail, engine_version=outcome.engine_version,
        engine_commit=outcome.engine_commit, provenance=outcome.provenance, suspect=bool(outcome.suspect_reasons),
        suspect_reasons=outcome.suspect_reasons, client_options=outcome.client_options,
    )
    if not outcome.ok:
        fields.update(failure_reason=outcome.reason, failure_message=outcome.message)
    state = RunState.SUCCEEDED if outcome.ok else RunState.FAILED
    with transaction.atomic():
        if origin is None:
            run = transition(run, state, note=note, **fields)
        else:
            run = create([run], origin, state, note=note, **fields)[0]
        if outcome.logs is not None:
            data = encode_logs(outcome.logs)
            blob, _ = RequestLogBlob.objects.update_or_create(run=run, defaults=dict(
                data=b"" if _binary_write() else data, n_requests=len(outcome.logs),
                n_warmup=sum(1 for r in outcome.logs if r.warmup), window_start_ns=outcome.window_start_ns,
                window_end_ns=outcome.window_end_ns))
            if _binary_write():
                _write_bytes(RequestLogBlob, blob.pk, "data", data)
            del data
        if outcome.outputs is not None:
            recs = outcome.outputs.records.values()
            kinds = {r.kind for r in recs if r.kind != "none"}
            RunOutputsBlob.objects.update_or_create(run=run, defaults=dict(
                data=encode_outputs(outcome.outputs), n_requests=len(outcome.outputs),
                n_full=sum(1 for r in recs if r.full is not None),
                kind=kinds.pop() if len(kinds) == 1 else ("mixed" if kinds else "none")))
        if outcome.telemetry is not None:
            GpuTelemetryBlob.objects.update_or_create(run=run, defaults=dict(
                data=encode_telemetry(outcome.telemetry), hz=outcome.telemetry.hz,
                n_ticks=outcome.telemetry.n_ticks, n_gpus=len(outcome.telemetry.gpus),
                idle_used_mib=outcome.idle_used_mib))
        if outcome.metrics is not None and (outcome.ok or outcome.logs is None):
            store_metrics(run, outcome.metrics, spec_source=outcome.spec_source, distributions=outcome.distributions,
                          source_tool=outcome.source_tool, definitions=outcome.definitions, extra=outcome.extra,
                          efficiency=outcome.efficiency, gpu_check=outcome.gpu_check,
                          client_headroom=outcome.client_headroom, categories=run_categories(outcome))
        teardown = outcome.teardown
        if teardown and not teardown.get("clean", True):
            outside = teardown.get("outside") or {}
            hosts.quarantine(run.host_id, f"run {run.pk} left processes behind: {teardown.get('survivors')}"
                             + (f"; {' '.join(outside.get('argv') or [])}: {outside.get('output')}"
                                if outside and not outside.get("clean") else ""))
    return run


def run_categories(outcome: RunOutcome) -> list[dict]:
    """The run's figures per prompt category (benchkit.measure.categories.category_figures over
    its request logs and window, as dicts), or [] when no request carries a category (or there
    are no logs: an imported file)."""
    logs = outcome.logs
    if not logs or not any(r.category for r in logs) or outcome.window_end_ns <= outcome.window_start_ns:
        return []
    return [f.to_dict() for f in category_figures(logs, outcome.window_start_ns, outcome.window_end_ns)]


def _binary_write() -> bool:
    """Whether blobs are written by `_write_bytes` (PostgreSQL: Django's psycopg cursor binds
    parameters on the client, which sends a blob as escaped text, about 7x its size in memory)."""
    return connection.vendor == "postgresql"


def _write_bytes(model, pk: int, column: str, data: bytes) -> None:
    """Set `model`'s `column` of row `pk` to `data` with a server-side-binding psycopg cursor and a
    binary parameter (the bytes go to the server as they are: no escaped copy), inside the
    current transaction. PostgreSQL only (`_binary_write`)."""
    import psycopg

    connection.ensure_connection()
    table = connection.ops.quote_name(model._meta.db_table)
    with psycopg.Cursor(connection.connection) as cur:
        cur.execute(f"UPDATE {table} SET {connection.ops.quote_name(column)} = %b WHERE id = %s", (data, pk))
