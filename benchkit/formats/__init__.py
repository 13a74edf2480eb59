"""Other tools' result files, read and written: one module per format (`vllm bench serve` JSON,
`sglang.bench_serving` JSON lines), listed in `registry.py`; the interface they implement in
`base.py`; the one reading entry `reader.read_result_file`."""
