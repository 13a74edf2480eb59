"""Sweeps: sweep files expanded into run specs, their dry run, and the sweep file of one point."""
