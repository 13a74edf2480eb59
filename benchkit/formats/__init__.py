"""Other tools' result files, read and written: `vllm bench serve` JSON and
`sglang.bench_serving` JSON lines."""
