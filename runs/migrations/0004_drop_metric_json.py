"""The metric schema (issue 8), step 3 of 3: drop the 0001 JSON copies of the figures, now in
their columns (0003)."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0003_metric_values'),
    ]

    operations = [
        migrations.RemoveField(
            model_name='runmetrics',
            name='data',
        ),
        migrations.RemoveField(
            model_name='runmetrics',
            name='spec_decode',
        ),
    ]
