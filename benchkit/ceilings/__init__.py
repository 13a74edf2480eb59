"""Decode-step ceilings (issue 20, docs/CEILINGS.md): how far a measured point is from what the
hardware allows.

- `gpus`: GPU specifications (memory bandwidth, dense peak FLOP/s per dtype, each with its
  source) from `gpu_specs.yaml`, the seed rows of an admin-editable table; `find_gpu_spec`.
- `modelconfig`: a Hugging Face `config.json` read into a `ModelFootprint` (parameters read and
  multiplied per decode step, bytes per parameter, KV-cache bytes per token, recurrent-state
  bytes per sequence) and a drafter's `DrafterFootprint`.
- `roofline`: `decode_ceiling(...) -> StepCeiling`: memory and compute time of one decode step,
  the ceilings in output tok/s, the ridge, which one binds, achieved as % of the binding one.

Pure functions over plain typed inputs; no Django.
"""
