"""Runs imported before 0010 stored the unknown workload as placeholders: concurrency, input_len,
output_len and num_prompts 0 and dataset "unknown" (runs.services.imports at 0004). For imported
runs (point_key "import-N") those become NULL / "" here; the reverse writes the placeholders
back (the columns are NOT NULL again before 0010)."""

from django.db import migrations

PLACEHOLDER_COLUMNS = ("concurrency", "input_len", "output_len", "num_prompts")


def placeholders_to_null(apps, schema_editor):
    Run = apps.get_model("runs", "Run")
    imported = Run.objects.filter(point_key__startswith="import-")
    for column in PLACEHOLDER_COLUMNS:
        imported.filter(**{column: 0}).update(**{column: None})
    imported.filter(dataset="unknown").update(dataset="")


def null_to_placeholders(apps, schema_editor):
    Run = apps.get_model("runs", "Run")
    for column in PLACEHOLDER_COLUMNS:
        Run.objects.filter(**{f"{column}__isnull": True}).update(**{column: 0})
    Run.objects.filter(dataset="", point_key__startswith="import").update(dataset="unknown")


class Migration(migrations.Migration):

    dependencies = [
        ("runs", "0006_import_boundary"),
    ]

    operations = [
        migrations.RunPython(placeholders_to_null, null_to_placeholders),
    ]
