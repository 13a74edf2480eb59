"""One module per engine, each a subclass of benchkit.engines.adapters.EngineAdapter declaring
that engine's facts, each registered by one line in benchkit/engines/registry.py. Only these
modules name an engine's endpoints, flags, counters and environment (tests/test_layering.py)."""
