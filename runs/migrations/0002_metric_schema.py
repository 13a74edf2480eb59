"""The metric schema (issue 8), step 1 of 3: one nullable column per
benchkit.measure.metrics.WindowMetrics field.

Four columns are renamed to carry their unit, the others that 0001 had become nullable (NULL =
unknown, never 0), the new ones are added. 0003 fills them from the 0001 JSON copies (`data`,
`spec_decode`) and 0004 drops those. Three migrations, not one: PostgreSQL refuses to ALTER a
table in the transaction that updated its rows ("pending trigger events").
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0001_initial'),
    ]

    operations = [
        migrations.RenameField(
            model_name='runmetrics',
            old_name='output_throughput',
            new_name='output_throughput_tok_s',
        ),
        migrations.RenameField(
            model_name='runmetrics',
            old_name='request_throughput',
            new_name='request_throughput_req_s',
        ),
        migrations.RenameField(
            model_name='runmetrics',
            old_name='total_token_throughput',
            new_name='total_token_throughput_tok_s',
        ),
        migrations.RenameField(
            model_name='runmetrics',
            old_name='goodput',
            new_name='request_goodput_req_s',
        ),
        migrations.AlterField(
            model_name='runmetrics',
            name='acceptance_length',
            field=models.FloatField(blank=True, help_text='tokens/step', null=True, verbose_name='acceptance length tau'),
        ),
        migrations.AlterField(
            model_name='runmetrics',
            name='acceptance_rate',
            field=models.FloatField(blank=True, help_text='fraction', null=True, verbose_name='acceptance rate'),
        ),
        migrations.AlterField(
            model_name='runmetrics',
            name='completed',
            field=models.BigIntegerField(blank=True, help_text='requests', null=True, verbose_name='completed'),
        ),
        migrations.AlterField(
            model_name='runmetrics',
            name='duration_s',
            field=models.FloatField(blank=True, help_text='s', null=True, verbose_name='window'),
        ),
        migrations.AlterField(
            model_name='runmetrics',
            name='error_rate',
            field=models.FloatField(blank=True, help_text='fraction', null=True, verbose_name='error rate'),
        ),
        migrations.AlterField(
            model_name='runmetrics',
            name='failed',
            field=models.BigIntegerField(blank=True, help_text='requests', null=True, verbose_name='failed'),
        ),
        migrations.AlterField(
            model_name='runmetrics',
            name='mean_tokens_per_chunk',
            field=models.FloatField(blank=True, help_text='tokens', null=True, verbose_name='mean tokens per chunk'),
        ),
        migrations.AlterField(
            model_name='runmetrics',
            name='mean_ttft_ms',
            field=models.FloatField(blank=True, help_text='ms', null=True, verbose_name='mean TTFT'),
        ),
        migrations.AlterField(
            model_name='runmetrics',
            name='median_e2el_ms',
            field=models.FloatField(blank=True, help_text='ms', null=True, verbose_name='median E2EL'),
        ),
        migrations.AlterField(
            model_name='runmetrics',
            name='median_icl_ms',
            field=models.FloatField(blank=True, help_text='ms', null=True, verbose_name='median ICL'),
        ),
        migrations.AlterField(
            model_name='runmetrics',
            name='median_itl_ms',
            field=models.FloatField(blank=True, help_text='ms/token', null=True, verbose_name='median ITL'),
        ),
        migrations.AlterField(
            model_name='runmetrics',
            name='median_tpot_ms',
            field=models.FloatField(blank=True, help_text='ms/token', null=True, verbose_name='median TPOT'),
        ),
        migrations.AlterField(
            model_name='runmetrics',
            name='median_ttft_ms',
            field=models.FloatField(blank=True, help_text='ms', null=True, verbose_name='median TTFT'),
        ),
        migrations.AlterField(
            model_name='runmetrics',
            name='output_throughput_tok_s',
            field=models.FloatField(blank=True, help_text='tok/s', null=True, verbose_name='output throughput'),
        ),
        migrations.AlterField(
            model_name='runmetrics',
            name='request_goodput_req_s',
            field=models.FloatField(blank=True, help_text='req/s', null=True, verbose_name='goodput'),
        ),
        migrations.AlterField(
            model_name='runmetrics',
            name='request_throughput_req_s',
            field=models.FloatField(blank=True, help_text='req/s', null=True, verbose_name='request throughput'),
        ),
        migrations.AlterField(
            model_name='runmetrics',
            name='total_token_throughput_tok_s',
            field=models.FloatField(blank=True, help_text='tok/s', null=True, verbose_name='total token throughput'),
        ),
        migrations.AddField(
            model_name='runmetrics',
            name='extra',
            field=models.JSONField(blank=True, default=dict, help_text='source-file keys without a column'),
        ),
        migrations.AddField(
            model_name='runmetrics',
            name='max_output_tokens_per_s',
            field=models.FloatField(blank=True, help_text='tok/s', null=True, verbose_name='peak output throughput'),
        ),
        migrations.AddField(
            model_name='runmetrics',
            name='mean_e2el_ms',
            field=models.FloatField(blank=True, help_text='ms', null=True, verbose_name='mean E2EL'),
        ),
        migrations.AddField(
            model_name='runmetrics',
            name='mean_icl_ms',
            field=models.FloatField(blank=True, help_text='ms', null=True, verbose_name='mean ICL'),
        ),
        migrations.AddField(
            model_name='runmetrics',
            name='mean_itl_ms',
            field=models.FloatField(blank=True, help_text='ms/token', null=True, verbose_name='mean ITL'),
        ),
        migrations.AddField(
            model_name='runmetrics',
            name='mean_tpot_ms',
            field=models.FloatField(blank=True, help_text='ms/token', null=True, verbose_name='mean TPOT'),
        ),
        migrations.AddField(
            model_name='runmetrics',
            name='output_tokens_from_text',
            field=models.BooleanField(blank=True, null=True, verbose_name='output tokens counted by the client'),
        ),
        migrations.AddField(
            model_name='runmetrics',
            name='p90_e2el_ms',
            field=models.FloatField(blank=True, help_text='ms', null=True, verbose_name='p90 E2EL'),
        ),
        migrations.AddField(
            model_name='runmetrics',
            name='p90_icl_ms',
            field=models.FloatField(blank=True, help_text='ms', null=True, verbose_name='p90 ICL'),
        ),
        migrations.AddField(
            model_name='runmetrics',
            name='p90_itl_ms',
            field=models.FloatField(blank=True, help_text='ms/token', null=True, verbose_name='p90 ITL'),
        ),
        migrations.AddField(
            model_name='runmetrics',
            name='p90_tpot_ms',
            field=models.FloatField(blank=True, help_text='ms/token', null=True, verbose_name='p90 TPOT'),
        ),
        migrations.AddField(
            model_name='runmetrics',
            name='p90_ttft_ms',
            field=models.FloatField(blank=True, help_text='ms', null=True, verbose_name='p90 TTFT'),
        ),
        migrations.AddField(
            model_name='runmetrics',
            name='p95_e2el_ms',
            field=models.FloatField(blank=True, help_text='ms', null=True, verbose_name='p95 E2EL'),
        ),
        migrations.AddField(
            model_name='runmetrics',
            name='p95_icl_ms',
            field=models.FloatField(blank=True, help_text='ms', null=True, verbose_name='p95 ICL'),
        ),
        migrations.AddField(
            model_name='runmetrics',
            name='p95_itl_ms',
            field=models.FloatField(blank=True, help_text='ms/token', null=True, verbose_name='p95 ITL'),
        ),
        migrations.AddField(
            model_name='runmetrics',
            name='p95_tpot_ms',
            field=models.FloatField(blank=True, help_text='ms/token', null=True, verbose_name='p95 TPOT'),
        ),
        migrations.AddField(
            model_name='runmetrics',
            name='p95_ttft_ms',
            field=models.FloatField(blank=True, help_text='ms', null=True, verbose_name='p95 TTFT'),
        ),
        migrations.AddField(
            model_name='runmetrics',
            name='p99_e2el_ms',
            field=models.FloatField(blank=True, help_text='ms', null=True, verbose_name='p99 E2EL'),
        ),
        migrations.AddField(
            model_name='runmetrics',
            name='p99_icl_ms',
            field=models.FloatField(blank=True, help_text='ms', null=True, verbose_name='p99 ICL'),
        ),
        migrations.AddField(
            model_name='runmetrics',
            name='p99_itl_ms',
            field=models.FloatField(blank=True, help_text='ms/token', null=True, verbose_name='p99 ITL'),
        ),
        migrations.AddField(
            model_name='runmetrics',
            name='p99_tpot_ms',
            field=models.FloatField(blank=True, help_text='ms/token', null=True, verbose_name='p99 TPOT'),
        ),
        migrations.AddField(
            model_name='runmetrics',
            name='p99_ttft_ms',
            field=models.FloatField(blank=True, help_text='ms', null=True, verbose_name='p99 TTFT'),
        ),
        migrations.AddField(
            model_name='runmetrics',
            name='per_position_acceptance_rate',
            field=models.JSONField(blank=True, help_text='fraction', null=True, verbose_name='per-position acceptance rate'),
        ),
        migrations.AddField(
            model_name='runmetrics',
            name='spec_num_accepted_tokens',
            field=models.FloatField(blank=True, help_text='tokens', null=True, verbose_name='accepted tokens'),
        ),
        migrations.AddField(
            model_name='runmetrics',
            name='spec_num_draft_tokens',
            field=models.FloatField(blank=True, help_text='tokens', null=True, verbose_name='draft tokens'),
        ),
        migrations.AddField(
            model_name='runmetrics',
            name='spec_num_drafts',
            field=models.FloatField(blank=True, help_text='drafts', null=True, verbose_name='drafts'),
        ),
        migrations.AddField(
            model_name='runmetrics',
            name='spec_source',
            field=models.CharField(blank=True, help_text='where the acceptance figures come from', max_length=300),
        ),
        migrations.AddField(
            model_name='runmetrics',
            name='std_e2el_ms',
            field=models.FloatField(blank=True, help_text='ms', null=True, verbose_name='std E2EL'),
        ),
        migrations.AddField(
            model_name='runmetrics',
            name='std_icl_ms',
            field=models.FloatField(blank=True, help_text='ms', null=True, verbose_name='std ICL'),
        ),
        migrations.AddField(
            model_name='runmetrics',
            name='std_itl_ms',
            field=models.FloatField(blank=True, help_text='ms/token', null=True, verbose_name='std ITL'),
        ),
        migrations.AddField(
            model_name='runmetrics',
            name='std_tpot_ms',
            field=models.FloatField(blank=True, help_text='ms/token', null=True, verbose_name='std TPOT'),
        ),
        migrations.AddField(
            model_name='runmetrics',
            name='std_ttft_ms',
            field=models.FloatField(blank=True, help_text='ms', null=True, verbose_name='std TTFT'),
        ),
        migrations.AddField(
            model_name='runmetrics',
            name='total_input_tokens',
            field=models.BigIntegerField(blank=True, help_text='tokens', null=True, verbose_name='input tokens'),
        ),
        migrations.AddField(
            model_name='runmetrics',
            name='total_output_tokens',
            field=models.BigIntegerField(blank=True, help_text='tokens', null=True, verbose_name='output tokens'),
        ),
    ]
