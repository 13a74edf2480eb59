"""Trigram indexes for the run admin's text search (issue 22), on PostgreSQL only.

The admin searches `model`, `drafter` and `failure_message` with `icontains` and `point_key`
with `istartswith` (RunAdmin.search_fields). On PostgreSQL Django writes those as
`UPPER("col"::text) LIKE UPPER(%s)` (django/db/backends/postgresql/operations.py,
`lookup_cast`), which no B-tree index serves: a search read the whole table (462 ms at 1M runs).
A GIN index over the same expression with pg_trgm's `gin_trgm_ops` answers both `%x%` and `x%`
patterns of 3 or more characters (PostgreSQL docs, F.35 pg_trgm, "Index Support"). pg_trgm is a
trusted extension from PostgreSQL 13 on. SQLite (the embedded default) gets nothing: its table
is small enough to scan. Building the indexes locks writes to runs_run while they are built;
on a large table run the migration when no worker is storing runs.
"""

from django.db import migrations

COLUMNS = ("model", "drafter", "failure_message", "point_key")


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    for col in COLUMNS:
        schema_editor.execute(
            f"CREATE INDEX IF NOT EXISTS run_admin_search_{col} ON runs_run "
            f'USING gin (UPPER("{col}"::text) gin_trgm_ops)'
        )


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for col in COLUMNS:
        schema_editor.execute(f"DROP INDEX IF EXISTS run_admin_search_{col}")


class Migration(migrations.Migration):

    dependencies = [
        ("runs", "0017_admin_list_indexes"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
