"""The physical floor of one decode step: the bytes a step must read from HBM on one GPU, over
the GPU's full (vendor) HBM bandwidth.

No decode step of the stated deployment can be faster, whatever the kernels: every step of
every sequence reads the weights of each layer its tokens pass once (of an MoE layer only the
experts its tokens are routed to) and each sequence's whole KV cache. Compute, collectives,
launches and the scheduler only add to it. A measured time per output token below this floor
means the run generated more than one token per step of the stated model (speculative decoding,
e.g. DeepSeek-V3's multi-token prediction) or ran a configuration other than the one stated;
``bench/inference.py`` reports the TPOT error with and without such rows, and
``bench/fit_inference.py`` does not fit the cost constants to them.

Counted per GPU of the fullest worker, one token per decoding sequence:

* weights: every block's dense (attention, shared-expert, dense-MLP) weights at the serving
  precision split over ``tp`` (norms replicated, 16-bit), the routed experts held
  (``experts / ep`` of width ``1 / moe_tp``) times the fraction a step hits
  (:func:`experts_hit_fraction`), and the 16-bit LM head over ``tp``; all pipeline stages (a
  token passes each once per step);
* KV: ``sequences / attention_dp`` sequences at ``context`` tokens, the bytes per token of one
  GPU's share of its stage's layers (:func:`planner.serve.memory.kv_elements_per_token`).
"""
from __future__ import annotations

from planner.cost.memory import layer_params_on_gpu
from planner.hardware import Gpu
from planner.ir import LayerKind, ModelGraph
from planner.serve.memory import ACT_BYTES, kv_elements_per_token
from planner.serve.workload import KV_BYTES, WEIGHT_BYTES, WorkerConfig


def experts_hit_fraction(top_k: int, num_experts: int, tokens: float) -> float:
    """Expected fraction of an MoE layer's experts that ``tokens`` tokens routed top-``k``
    (uniformly) reach: ``1 - (1 - k / E) ^ tokens``."""
    if tokens <= 0:
        return 0.0
    return 1.0 - (1.0 - top_k / num_experts) ** tokens


def decode_step_bytes(model: ModelGraph, worker: WorkerConfig, dtype: str, kv_dtype: str,
                      sequences: float, context: float) -> float:
    """HBM bytes one GPU of ``worker`` must read for one decode step of ``sequences``
    sequences (all of the worker's) at ``context`` tokens each (see the module docstring)."""
    per_block = WEIGHT_BYTES[dtype]
    tokens_stage = sequences  # one token per sequence passes every stage
    total = 0.0
    for cls in model.layer_classes():
        layer, count = cls.layer, cls.count
        if layer.kind is LayerKind.EMBEDDING:
            continue  # a lookup reads one row per token
        dense, _ = layer_params_on_gpu(layer, worker.tp, 1)
        if layer.kind is not LayerKind.BLOCK:
            total += count * dense * ACT_BYTES
            continue
        replicated = layer.tp_replicated_params
        weights = (dense - replicated) * per_block + replicated * ACT_BYTES
        mlp = layer.mlp
        if layer.expert_params and mlp is not None and mlp.is_moe:
            hit = experts_hit_fraction(mlp.top_k, mlp.num_experts, tokens_stage)
            weights += layer.expert_params / (worker.ep * worker.moe_tp) * hit * per_block
        att = layer.attention
        kv = 0.0
        if att is not None:
            keys = context if att.sliding_window is None else min(context,
                                                                  att.sliding_window)
            # each pipeline stage holds 1/pp of the layers and reads their KV once a step
            kv = (sequences / worker.attention_dp) * keys * \
                kv_elements_per_token(att, worker.tp) * KV_BYTES[kv_dtype] / worker.pp
        total += count * (weights + kv)
    return total


def decode_floor_s(model: ModelGraph, gpu: Gpu, worker: WorkerConfig, dtype: str,
                   kv_dtype: str, sequences: float, context: float) -> float:
    """Seconds of the fastest possible decode step (one token per sequence): the bytes of
    :func:`decode_step_bytes` at the GPU's full HBM bandwidth."""
    return decode_step_bytes(model, worker, dtype, kv_dtype, sequences, context) / (
        gpu.hbm_bandwidth_gbytes_per_s * 1e9)
