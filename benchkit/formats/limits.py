"""The database's limits on what an import stores, in one place: the result-file boundary
(benchkit.formats.common) refuses values beyond them, and runs.models declares its columns with
them, so a value that passes the boundary always fits its column."""

#: Largest value of a BigIntegerField (PostgreSQL bigint, SQLite INTEGER): metric counts.
BIGINT_MAX = 2**63 - 1
#: Largest value of a PositiveIntegerField on PostgreSQL (integer): the run's workload columns.
INT_MAX = 2**31 - 1
#: max_length of the text columns an import fills: Run.model, Run.engine_version, Run.dataset,
#: RunMetrics.spec_source, RunMetrics.source_tool, ResultFile.name.
TEXT_LIMITS = {"model": 500, "engine_version": 100, "dataset": 200, "spec_source": 300, "source_tool": 50,
               "file_name": 500}
