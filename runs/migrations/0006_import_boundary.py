"""Issue 10: imported runs store what their file does not say as NULL (missing is not zero), and
each imported file is recorded once, by the sha256 of its bytes (ResultFile). The placeholders
stored by earlier imports are turned into NULL by the next migration, 0007_import_placeholders
(a data step in its own transaction: PostgreSQL refuses schema changes in a transaction that
has updated the same table).
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0005_regression_flags'),
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
    ]
