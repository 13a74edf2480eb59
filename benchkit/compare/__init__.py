"""Comparing runs (MEASUREMENT.md "Comparing runs"): pure functions over point dicts, so the
dashboard, the exports, the demo summary and an offline host all compare the same way."""
