"""The metric schema (issue 8), step 2 of 3: copy every stored figure out of the 0001 JSON.

`copy_out_of_json` fills the columns of 0002 from each row's `data` (RunMetrics.to_flat() of the
0001 code) and `spec_decode` (counter deltas) and keeps keys without a column in `extra`; the
reverse rebuilds both JSON fields from the columns. The key maps are the 0001-era layout,
frozen here on purpose (the app's code may move on).
"""

from django.db import migrations

#: 0001 flat key -> column, where they differ; every other flat key is its column's name.
FLAT_RENAMED = {"duration": "duration_s", "request_throughput": "request_throughput_req_s",
                "output_throughput": "output_throughput_tok_s",
                "total_token_throughput": "total_token_throughput_tok_s", "goodput": "request_goodput_req_s"}
#: 0001 spec_decode keys (asdict(SpecDecodeMetrics) beside its to_flat()) -> column.
SPEC_KEYS = {"num_drafts": "spec_num_drafts", "num_draft_tokens": "spec_num_draft_tokens",
             "num_accepted_tokens": "spec_num_accepted_tokens", "source": "spec_source",
             "spec_num_drafts": "spec_num_drafts", "spec_num_draft_tokens": "spec_num_draft_tokens",
             "spec_num_accepted_tokens": "spec_num_accepted_tokens", "spec_source": "spec_source",
             "acceptance_rate": "acceptance_rate", "acceptance_length": "acceptance_length",
             "per_position_acceptance_rate": "per_position_acceptance_rate"}
#: Columns that were NOT NULL in 0001 (the reverse must give them a value).
REQUIRED_0001 = ("completed", "failed", "error_rate", "duration_s", "output_throughput_tok_s",
                 "request_throughput_req_s", "total_token_throughput_tok_s")
NOT_METRICS = {"id", "run", "data", "spec_decode", "spec_source", "distributions", "source_tool", "definitions",
               "extra", "computed_at"}


def _metric_columns(model) -> set[str]:
    return {f.name for f in model._meta.concrete_fields} - NOT_METRICS


def copy_out_of_json(apps, schema_editor):
    """Fill the new columns from `data` and `spec_decode`; keys without a column go to `extra`."""
    RunMetrics = apps.get_model("runs", "RunMetrics")
    columns = _metric_columns(RunMetrics)
    for row in RunMetrics.objects.all().iterator(chunk_size=500):
        values, extra = {}, {}
        for key, value in (row.data or {}).items():
            name = FLAT_RENAMED.get(key, key)
            if name in columns:
                values[name] = value
            else:
                extra[key] = value
        spec_extra = {}
        for key, value in (row.spec_decode or {}).items():
            name = SPEC_KEYS.get(key)
            if name is None or values.get(name, value) != value:
                spec_extra[key] = value
            else:
                values[name] = value
        if spec_extra:
            extra["spec_decode"] = spec_extra
        values["spec_source"] = str(values.get("spec_source") or "")[:300]
        RunMetrics.objects.filter(pk=row.pk).update(extra=extra, **values)


def copy_into_json(apps, schema_editor):
    """The reverse: rebuild `data` (0001 flat keys) and `spec_decode` from the columns. 0001 had
    no NULL for its required columns, so an unknown one goes back as 0, as 0001 stored it."""
    RunMetrics = apps.get_model("runs", "RunMetrics")
    spec_columns = set(SPEC_KEYS.values()) - {"spec_source"}
    to_flat = {column: key for key, column in FLAT_RENAMED.items()}
    for row in RunMetrics.objects.all().iterator(chunk_size=500):
        columns = {name: getattr(row, name) for name in _metric_columns(RunMetrics)}
        extra = dict(row.extra or {})
        spec = {name: columns[name] for name in sorted(spec_columns)}
        spec_decode = {**spec, "spec_source": row.spec_source, **extra.pop("spec_decode", {})} \
            if any(v is not None for v in spec.values()) else extra.pop("spec_decode", {})
        data = {to_flat.get(name, name): value for name, value in columns.items() if name not in spec_columns}
        data.update(extra)
        required = {name: 0 for name in REQUIRED_0001 if columns[name] is None}
        RunMetrics.objects.filter(pk=row.pk).update(data=data, spec_decode=spec_decode, **required)


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0002_metric_schema'),
    ]

    operations = [
        migrations.RunPython(copy_out_of_json, copy_into_json),
    ]
