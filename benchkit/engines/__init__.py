"""Inference engines: the engine catalog (names, default ports), the adapters that turn a server
configuration into a command line (flags as data in engine_flags.yaml, validated by flags.py),
the managed server process, and the local demo models."""
