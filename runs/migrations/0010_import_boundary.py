"""Issue 10: imported runs store what their file does not say as NULL (missing is not zero), and
each imported file is recorded once, by the sha256 of its bytes (ResultFile).

Runs imported before this migration stored the unknown workload as placeholders: concurrency,
input_len, output_len and num_prompts 0 and dataset "unknown" (runs.services.imports at 0004).
For imported runs (point_key "import-N") those become NULL / "" here; the reverse writes the
placeholders back (the columns are NOT NULL again before 0010).
"""

import django.db.models.deletion
from django.db import migrations, models

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
        ('runs', '0004_drop_metric_json'),
    ]

    operations = [
        migrations.AlterField(
            model_name='run',
            name='concurrency',
            field=models.PositiveIntegerField(blank=True, help_text='empty = not in the imported file', null=True),
        ),
        migrations.AlterField(
            model_name='run',
            name='dataset',
            field=models.CharField(blank=True, default='random', help_text='empty = not in the imported file', max_length=200),
        ),
        migrations.AlterField(
            model_name='run',
            name='input_len',
            field=models.PositiveIntegerField(blank=True, help_text='empty = not in the imported file', null=True),
        ),
        migrations.AlterField(
            model_name='run',
            name='num_prompts',
            field=models.PositiveIntegerField(blank=True, help_text='empty = not in the imported file', null=True),
        ),
        migrations.AlterField(
            model_name='run',
            name='output_len',
            field=models.PositiveIntegerField(blank=True, help_text='empty = not in the imported file', null=True),
        ),
        migrations.CreateModel(
            name='ResultFile',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('sha256', models.CharField(help_text="sha256 of the file's bytes (hex)", max_length=64)),
                ('name', models.CharField(help_text='path the file was imported from', max_length=500)),
                ('size_bytes', models.BigIntegerField()),
                ('source_tool', models.CharField(max_length=50)),
                ('imported_at', models.DateTimeField(auto_now_add=True)),
                ('sweep', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='result_files', to='runs.sweep')),
            ],
            options={
                'ordering': ['sweep', 'id'],
            },
        ),
        migrations.AddField(
            model_name='run',
            name='result_file',
            field=models.ForeignKey(blank=True, help_text='the file an imported run came from', null=True, on_delete=django.db.models.deletion.PROTECT, related_name='runs', to='runs.resultfile'),
        ),
        migrations.AddConstraint(
            model_name='resultfile',
            constraint=models.UniqueConstraint(fields=('sha256',), name='result_file_unique_content'),
        ),
        migrations.RunPython(placeholders_to_null, null_to_placeholders),
    ]
