"""Sweeps: sweep files expanded into run specs, and the runner that executes runs end to end."""
