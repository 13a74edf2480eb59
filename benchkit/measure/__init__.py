"""Measuring one run: workloads (prompts), the load client, raw request logs, metrics from the
logs, the servers' spec-decode counters, and the rules that decide whether a run counts."""
