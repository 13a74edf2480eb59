"""The database's limits on what is stored, in one place: the result-file boundary
(benchkit.formats.common) refuses values beyond them, the run outcome
(benchkit.execution.outcome) cuts its texts to them, and runs.models declares its columns with
them, so a value that passes either always fits its column."""

#: Largest value of a BigIntegerField (PostgreSQL bigint, SQLite INTEGER): metric counts.
BIGINT_MAX = 2**63 - 1
#: Largest value of a PositiveIntegerField on PostgreSQL (integer): the run's workload columns.
INT_MAX = 2**31 - 1
#: max_length of the text columns an import or an outcome fills: Run.model, Run.engine_version,
#: Run.engine_commit, Run.failure_reason, Run.dataset, RunMetrics.spec_source,
#: RunMetrics.source_tool, ResultFile.name; and the most characters kept of two long texts
#: (TextField columns): Run.failure_message and Run.server_log_tail (which keeps its end).
TEXT_LIMITS = {"model": 500, "engine_version": 100, "engine_commit": 64, "failure_reason": 50, "dataset": 200,
               "spec_source": 300, "source_tool": 50, "file_name": 500, "failure_message": 5000,
               "server_log_tail": 20000}

#: Most bytes (UTF-8 JSON) of the keys an imported run keeps from its file without a column
#: (RunMetrics.extra): beyond it the largest keys are left out and named with their sizes
#: (benchkit.formats.common.bound_extra), so a 4 MB report never lands in a run's row.
EXTRA_MAX_BYTES = 64 * 1024
