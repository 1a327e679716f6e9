"""Inference (serving) planning: workload, memory, prefill/decode cost, search, plan section.

Modules: ``workload`` (what to serve, how a deployment is laid out), ``runtime`` (vLLM, SGLang,
TensorRT-LLM defaults and the calibrated constants), ``memory`` (weights, paged KV cache,
workspace, capacity), ``phases`` (one engine iteration from the training cost model's leaf
terms), ``evaluate`` (TTFT, TPOT, throughput of one deployment), ``search`` (best deployment
under latency targets, Pareto frontier), ``plan`` (the plan file's inference section, check).
See docs/inference.md.
"""
