"""benchkit: draftboard's Django-free measuring and orchestrating toolkit.

Everything a GPU host needs to execute a speculative-decoding benchmark run (load client,
metrics, engine adapters, inventory, preflight, teardown) lives here and imports no Django,
so it also runs alone on an offline host. The Django apps (`runs`, `analysis`) call it and
store what it returns. See docs/ARCHITECTURE.md.
"""
