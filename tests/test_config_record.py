"""The run configuration is declared once (benchkit.config_record) and everything else derives from
it or matches it: the spec dataclasses, the point key, the sweep file's sections, one point's sweep
file, the format layer's workload keys, the Run columns and the import path's Run, Point's groups.
A stand-in field added to the record shows up in each of them."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import types
from dataclasses import fields
from pathlib import Path
from typing import get_args

from django.db import models

from benchkit import config_record
from benchkit.config_record import RECORD, WHEN_SET, ConfigField
from benchkit.formats.common import WORKLOAD_KEYS
from benchkit.point import FIELD_GROUP, IDENTITY_FIELDS, RECORD_FIELDS
from benchkit.specs import RunSpec, ServerConfig, WorkloadSpec
from benchkit.sweeps import sweepfile
from runs.models import Run

ROOT = Path(__file__).resolve().parent.parent

#: Point keys stored before the record existed (computed with benchkit/specs.py at 45bed4a).
KEYS_BEFORE = {
    "default": "f53e415d21b513c1b97bfa167a6767dc82ff3b41580fc689192ee74d70f2154f",
    "twin": "ec8e546f05d12a1cd56e6d284dbfc91f965d77418ca574718c40f8f9f7e78e00",
}


def test_the_spec_dataclasses_are_the_record_in_its_order():
    for cls, part in ((ServerConfig, "server"), (WorkloadSpec, "workload")):
        declared = config_record.of_part(part)
        assert [f.name for f in fields(cls)] == [f.name for f in declared]
        default = cls()
        for f in declared:
            assert getattr(default, f.name) == f.default_value(), f.name
            assert f.group in config_record.GROUPS, f.name
    assert len({f.name for f in RECORD}) == len(RECORD)


def test_point_keys_are_those_stored_before_the_record():
    assert RunSpec().point_key() == KEYS_BEFORE["default"]
    twin = RunSpec(server=ServerConfig(engine="sglang", method="ddtree", tree_budget=15, prefix_caching=False,
                                       acceptance_tau=3.2, engine_cpus="0", served_model_name="x", is_demo_model=True),
                   workload=WorkloadSpec(concurrency=8, request_rate=2.5, warmup_requests=4, slo={"ttft_ms": 5.0}),
                   repeat_index=1)
    assert twin.point_key() == KEYS_BEFORE["twin"]
    point = RunSpec().point_fields()
    for f in RECORD:
        assert (f.name in point[f.part]) == (f.point_key is True), f.name


def test_sweep_file_sections_are_the_record():
    """`server:` and `workload:` are derived; the top level, the grid and a method entry (lists
    that expand) hold every record field that names them."""
    for model, section in ((sweepfile.ServerSection, "server"), (sweepfile.WorkloadSection, "workload")):
        assert list(model.model_fields) == [f.name for f in config_record.in_section(section)]
    where = {"top": sweepfile.SweepFile, "grid": sweepfile.Grid, "grid.methods": sweepfile.MethodEntry,
             "twin": sweepfile.TwinSection}
    for section, model in where.items():
        for f in config_record.in_section(section):
            assert f.name in model.model_fields or section == "twin", (section, f.name)
    assert set(sweepfile.GRID_AXES) == {f.name for f in config_record.in_section("grid") if f.part == "workload"}
    assert sweepfile.WorkloadSection.model_fields["dataset"].annotation.__args__ == config_record.DATASET_KINDS


def test_every_point_field_of_the_record_has_its_group():
    """Point (benchkit.point) carries a subset of the record, in the record's groups; every field
    naming a point across sweeps (IDENTITY) defines the stored point key."""
    shared = [name for name in RECORD_FIELDS if any(f.name == name for f in RECORD)]
    assert shared, "Point shares no field with the record"
    for name in shared:
        assert FIELD_GROUP[name] == config_record.field_named(name).group, name
    for name in IDENTITY_FIELDS:
        assert config_record.field_named(name).point_key is True, name


def test_format_workload_keys_hold_the_imported_fields():
    assert WORKLOAD_KEYS[:len(config_record.imported_keys())] == config_record.imported_keys()
    assert {"tokenizer", "backend"} <= set(WORKLOAD_KEYS)


_COLUMN_KINDS = {str: (models.CharField, models.TextField), int: (models.IntegerField,),
                 float: (models.FloatField,), bool: (models.BooleanField,)}


def column_problems(record: tuple[ConfigField, ...], model: type[models.Model]) -> list[str]:
    """What the Run model lacks or holds otherwise than the record says: a `run_column` field
    without its column (a migration to write), of another kind, NULL where the record says it
    cannot be unknown or the other way round (a text column is never NULL: "" is unknown); a
    configuration column the record does not mark."""
    out = []
    names = {f.name for f in model._meta.concrete_fields}
    for f in record:
        if not f.run_column:
            if f.name in names:
                out.append(f"{f.name}: a Run column the record does not mark run_column")
            continue
        if f.name not in names:
            out.append(f"{f.name}: no Run column (add one and its migration)")
            continue
        column = model._meta.get_field(f.name)
        options = get_args(f.type) if isinstance(f.type, types.UnionType) else (f.type,)
        base = next(t for t in options if t is not type(None))
        if not isinstance(column, _COLUMN_KINDS[base]):
            out.append(f"{f.name}: a {type(column).__name__} for a {base.__name__}")
        nullable = base is not str and (type(None) in options or f.imported)
        if column.null != nullable:
            out.append(f"{f.name}: null={column.null}, the record says {nullable}")
    return out


def test_run_model_columns_match_the_record():
    assert column_problems(RECORD, Run) == []


def test_a_stand_in_column_is_missing_until_its_migration():
    standin = ConfigField("standin_knob", "server", str, "engine", "server", "", run_column=True)
    assert column_problems((*RECORD, standin), Run) == ["standin_knob: no Run column (add one and its migration)"]
    wrong = dataclasses.replace(config_record.field_named("tp"), type=int | None)
    assert column_problems((wrong,), Run) == ["tp: null=False, the record says True"]


_STANDIN = r'''
import json, os, sys
from benchkit import config_record
from benchkit.config_record import ConfigField
config_record.RECORD = (*config_record.RECORD,
    ConfigField("standin_knob", "server", str, "engine", "server", "", point_key="when_set",
                doc="a stand-in server option"),
    ConfigField("standin_depth", "workload", int, "workload", "workload", 2, ge=1, point_key="when_set",
                imported=True, run_column=True, doc="a stand-in workload axis"))
import django
django.setup()
from benchkit.formats.common import make_workload
from benchkit.sweeps.fragment import point_sweep_dict, point_sweep_file
from benchkit.sweeps.sweepfile import SweepError, loads_sweep
from runs.services.sweeps import run_fields

base = "name: s\nengine: vllm\nmodel: /m\ngrid:\n  methods: [auto]\n"
plain = loads_sweep(base, "plain").expand()[0]
spec = loads_sweep(base + "server: {standin_knob: x}\nworkload: {standin_depth: 5}\n", "standin").expand()[0]
again = loads_sweep(point_sweep_file(spec, "again"), "again").expand()[0]
try:
    loads_sweep(base + "workload: {standin_depth: 0}\n", "bad")
    refused = ""
except SweepError as exc:
    refused = str(exc)
print(json.dumps({
    "knob": spec.server.standin_knob, "depth": spec.workload.standin_depth,
    "plain_depth": plain.workload.standin_depth,
    "point": spec.point_fields(), "keys_differ": spec.point_key() != plain.point_key(),
    "plain_key": plain.point_key(),
    "fragment": point_sweep_dict(spec, "f"), "again": again.point_key() == spec.point_key(),
    "refused": refused, "imported": make_workload(standin_depth=3)["standin_depth"],
    "run_fields": run_fields(spec)["standin_depth"],
}))
'''


def test_a_stand_in_field_in_the_record_reaches_sweep_file_point_key_fragment_and_imports(tmp_path):
    """In a fresh interpreter, two stand-in fields appended to the record (before anything imports
    it): a server option and a workload axis (a Run column too), both WHEN_SET. The sweep file
    accepts and checks them, they define the point key where set (a point without them keeps the
    key it has here), one point's sweep file writes them (and reproduces the key), a result file's
    workload may give the axis, and `run_fields` copies it."""
    base = "name: s\nengine: vllm\nmodel: /m\ngrid:\n  methods: [auto]\n"
    key_here = sweepfile.loads_sweep(base, "plain").expand()[0].point_key()
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "benchsite.settings", "DRAFTBOARD_VAR_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", _STANDIN], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert (out["knob"], out["depth"], out["plain_depth"]) == ("x", 5, 2)
    assert out["point"]["server"]["standin_knob"] == "x" and out["point"]["workload"]["standin_depth"] == 5
    assert out["keys_differ"] and out["plain_key"] == key_here and out["again"]
    assert out["fragment"]["server"] == {"standin_knob": "x"}
    assert out["fragment"]["workload"] == {"standin_depth": 5}
    assert "workload.standin_depth" in out["refused"] and "must be >= 1, got 0" in out["refused"]
    assert out["imported"] == 3 and out["run_fields"] == 5


def test_when_set_fields_leave_older_keys_alone():
    for f in RECORD:
        if f.point_key == WHEN_SET:
            spec = RunSpec()
            assert f.name not in spec.point_fields()[f.part]
