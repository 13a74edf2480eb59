"""Fuzzing the result-file import in CI (issues 10 and 19): mutations of the real fixture files,
every format's (see tests/resultfuzz.py), imported through the real service into the real
database. Only ResultFileError may come out; a refused import changes no row; nothing stored is
negative, non-finite or outside its bounds, and no run keeps more than the bound on kept keys.
The long run (>= 5000 examples, with counts) is benchmarks/fuzz_imports.py."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.resultfuzz import METHODS, SEEDS, check_import, result_files, unmutated, write_sample

pytestmark = pytest.mark.django_db


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(result_files(), st.sampled_from(METHODS))
def test_fuzzed_result_files_are_imported_or_refused_cleanly(sample, method):
    with tempfile.TemporaryDirectory() as folder:
        outcome = check_import(write_sample(Path(folder), sample), method)
    assert outcome.status != "traceback", outcome.error
    assert not outcome.partial_write, f"{outcome.status}: rows changed ({outcome.error})"
    assert not outcome.violations, outcome.violations


def test_every_seed_imports_unmutated():
    """The seeds themselves are good sources, written as the fuzzer writes them (so a refusal
    above comes from the mutation), every format among them."""
    from benchkit.formats.registry import FORMATS
    from runs.models import ResultFile

    for seed in SEEDS:
        with tempfile.TemporaryDirectory() as folder:
            outcome = check_import(write_sample(Path(folder), unmutated(seed)), seed.method)
            assert outcome.status == "imported" and not outcome.violations, (seed.name, outcome)
    assert set(ResultFile.objects.values_list("source_tool", flat=True)) >= {f.tool for f in FORMATS.values()}
