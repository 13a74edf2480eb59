"""Fuzzing the result-file import in CI (issue 10): mutations of the real fixture files (see
tests/resultfuzz.py) imported through the real service into the real database. Only
ResultFileError may come out; a refused import changes no row; nothing stored is negative,
non-finite or outside its bounds. The long run (>= 5000 examples, with counts) is
benchmarks/fuzz_imports.py."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.resultfuzz import METHODS, SEEDS, check_import, result_files

pytestmark = pytest.mark.django_db


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(result_files(), st.sampled_from(METHODS))
def test_fuzzed_result_files_are_imported_or_refused_cleanly(named, method):
    name, data = named
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / name
        path.write_bytes(data)
        outcome = check_import(path, method)
    assert outcome.status != "traceback", outcome.error
    assert not outcome.partial_write, f"{outcome.status}: rows changed ({outcome.error})"
    assert not outcome.violations, outcome.violations


def test_every_seed_imports_unmutated():
    """The seeds themselves are good files (so a refusal above comes from the mutation)."""
    with tempfile.TemporaryDirectory() as folder:
        for name, _, _ in SEEDS:
            path = Path(folder) / name
            path.write_bytes((Path(__file__).parent / "fixtures" / "results" / name).read_bytes())
            outcome = check_import(path, ("draft_model", 4))
            assert outcome.status == "imported" and not outcome.violations, (name, outcome)
