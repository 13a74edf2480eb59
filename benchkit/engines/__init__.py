"""Inference engines: the adapters that turn a server configuration into a command line (flags
as data in engine_flags.yaml), the managed server process, and the local demo models."""
