"""The run admin's trigram indexes (migration 0018) without GIN's pending list, on PostgreSQL only.

A GIN index with `fastupdate` on (PostgreSQL's default) queues new entries in a pending list
that every search reads whole until VACUUM or the list's size limit (gin_pending_list_limit,
4 MB) moves them into the index (PostgreSQL docs, 70.4.1 "GIN Fast Update Technique"). On the
history benchmark's 100 440-run database the four lists held 157-490 pages, and the run search
took 12 ms in PostgreSQL with them and 0.5 ms without; the admin's searched list went from
65 ms to 161 ms p95 between two freshly seeded databases of the same size, depending on when
autovacuum had last run. Off, each stored run updates the four indexes itself: measured here,
inserting 3 240 runs took 1.05 s against 0.27 s (0.24 ms more per run, against the minutes a
run takes). The lists present now are moved into the indexes (`gin_clean_pending_list`).
"""

from django.db import migrations

COLUMNS = ("model", "drafter", "failure_message", "point_key")


def _set(schema_editor, fastupdate: str, clean: bool) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    for col in COLUMNS:
        name = f"run_admin_search_{col}"
        schema_editor.execute(f"ALTER INDEX IF EXISTS {name} SET (fastupdate = {fastupdate})")
        if clean:
            schema_editor.execute(f"SELECT gin_clean_pending_list(to_regclass('{name}')) "
                                  f"WHERE to_regclass('{name}') IS NOT NULL")


def forwards(apps, schema_editor):
    _set(schema_editor, "off", clean=True)


def backwards(apps, schema_editor):
    _set(schema_editor, "on", clean=False)


class Migration(migrations.Migration):

    dependencies = [
        ("runs", "0018_admin_search_trigram"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
