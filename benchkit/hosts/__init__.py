"""The GPU host: NVML access, inventory, `nvidia-smi topo -m` topology, GPU allocation for a TP
group, preflight checks before a server starts, and process-group teardown after it stops."""
