"""Comparing runs (MEASUREMENT.md "Comparing runs"): pure functions over points
(benchkit.point.Point), so the dashboard, the exports, the demo summary and an offline host all
compare the same way. One median and one bootstrap (stats), speedups and step costs (speedups),
two sweeps side by side (sweepdiff), a nightly series' regressions (regressions)."""
