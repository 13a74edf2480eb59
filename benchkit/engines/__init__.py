"""Inference engines: the registry (registry.py, one line per engine) and one module per engine
(kinds/) declaring its facts on the shared adapter (adapters.py: the command line from the flags
in engine_flags.yaml, validated by flags.py), the capabilities they declare (capabilities.py),
where a build's server runs (environment.py), the managed server process, and the local demo
models."""
