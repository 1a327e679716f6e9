"""Serving memory per GPU: weights at serving precision, the paged KV cache, activation
workspace, runtime reserve; and the largest batch / context that fits.

Sources and rules:

* Weights: the per-GPU parameter split of the training model (:func:`planner.cost.memory.
  layer_params_on_gpu`: TP shards all but norms/routers, EP shards routed experts), at
  :data:`planner.serve.workload.WEIGHT_BYTES` per element for the transformer blocks' GEMM
  weights; embeddings, LM head and norms stay 16-bit (ModelOpt / llm-compressor fp8 and NVFP4
  checkpoints keep them in bf16). Pipeline stages hold ``ceil(blocks / pp)`` blocks; the first
  also the embedding, the last the head.
* KV cache per token and layer (one GPU): GQA/MHA ``2 * kv_heads_per_gpu * head_dim`` elements
  with ``kv_heads_per_gpu = max(kv_heads / tp, 1)`` (heads are replicated when tp > kv heads);
  MLA stores the compressed latent plus the decoupled RoPE key, ``kv_lora_rank +
  qk_rope_head_dim`` elements, the same on every TP rank (DeepSeek-V2 §2.1.2; vLLM/SGLang
  MLA backends); sliding-window layers keep at most ``window`` tokens. Blocks are paged:
  a sequence holds ``ceil(tokens / block) * block`` token slots.
* Activation workspace: one iteration of ``max_num_tokens`` tokens (hidden states, the QKV and
  gated-MLP intermediates of one layer, 16-bit) and fp32 logits of the sequences sampled
  (``max_batch``: one attention-DP rank's, ``WorkerConfig.rank_batch``).
* Reserve: the GPU's runtime reserve (CUDA context, cuBLAS, NCCL: ``Gpu.reserve_gib``) plus the
  runtime's CUDA-graph pools.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from planner.cost.memory import layer_params_on_gpu
from planner.hardware import GIB, Gpu
from planner.ir import Attention, LayerKind, ModelGraph
from planner.serve._cache import Ident
from planner.serve.runtime import ServingRuntime
from planner.serve.workload import KV_BYTES, WEIGHT_BYTES, WorkerConfig

ACT_BYTES = 2


@dataclass(frozen=True)
class ServingMemory:
    """Bytes on the fullest GPU of one worker, and the KV capacity left."""

    weights_bytes: float
    activation_bytes: float
    reserve_bytes: float
    kv_budget_bytes: float  # what the runtime gives the KV cache
    kv_bytes_per_token: float  # one token of context, all layers of the fullest stage
    capacity_bytes: float  # memory_fraction x GPU memory

    @property
    def kv_cache_gib(self) -> float:
        return max(self.kv_budget_bytes, 0.0) / GIB

    @property
    def fits_weights(self) -> bool:
        return self.kv_budget_bytes > 0

    def kv_bytes_for(self, tokens_per_seq: int, seqs: int, block: int) -> float:
        return seqs * paged_tokens(tokens_per_seq, block) * self.kv_bytes_per_token

    def max_sequences(self, tokens_per_seq: int, block: int) -> int:
        """Sequences of ``tokens_per_seq`` tokens whose KV fits (0 if not even one)."""
        per_seq = paged_tokens(tokens_per_seq, block) * self.kv_bytes_per_token
        if self.kv_budget_bytes <= 0 or per_seq <= 0:
            return 0
        return int(self.kv_budget_bytes // per_seq)

    def as_dict(self) -> dict:
        return {"weights_gib": self.weights_bytes / GIB,
                "activation_gib": self.activation_bytes / GIB,
                "reserve_gib": self.reserve_bytes / GIB,
                "kv_cache_gib": self.kv_cache_gib,
                "kv_bytes_per_token": self.kv_bytes_per_token,
                "usable_gib": self.capacity_bytes / GIB}


def paged_tokens(tokens: int, block: int) -> int:
    return math.ceil(tokens / block) * block


def kv_elements_per_token(att: Attention, tp: int) -> float:
    """KV-cache elements one GPU stores per token for one attention layer."""
    if att.is_mla:
        return float(att.kv_lora_rank + att.rope_head_dim)
    kv_heads = max(att.num_kv_heads / tp, 1.0)
    return kv_heads * (att.head_dim + att.v_head_dim)


def stage_blocks(model: ModelGraph, pp: int) -> list[int]:
    """Indices of the blocks on the fullest (first) pipeline stage."""
    blocks = [i for i, layer in enumerate(model.layers) if layer.kind is LayerKind.BLOCK]
    per = math.ceil(len(blocks) / pp) if blocks else 0
    return blocks[:per]


def kv_bytes_per_token(model: ModelGraph, worker: WorkerConfig, kv_dtype: str,
                       context: int | None = None, draft_layers: int = 0) -> float:
    """KV bytes per token of context on the fullest stage of one GPU; a sliding-window layer
    counts ``min(1, window / context)`` of a token (it keeps ``window`` of ``context``).
    ``draft_layers``: MTP blocks (copies of the last block) with their own KV cache, counted
    on the fullest stage (an upper bound when they sit on another)."""
    total = 0.0
    blocks = stage_blocks(model, worker.pp)
    last = [i for i, layer in enumerate(model.layers) if layer.kind is LayerKind.BLOCK][-1:]
    for i in blocks + last * draft_layers:
        att = model.layers[i].attention
        if att is None:
            continue
        share = 1.0
        if att.sliding_window is not None and context:
            share = min(1.0, att.sliding_window / context)
        total += kv_elements_per_token(att, worker.tp) * share
    return total * KV_BYTES[kv_dtype]


def weight_bytes_per_gpu(model: ModelGraph, worker: WorkerConfig, dtype: str,
                         draft_layers: int = 0) -> float:
    """Weights on the fullest GPU of a worker at serving precision; ``draft_layers`` MTP
    blocks (copies of the last block, on the last stage with the head)."""
    per_block = WEIGHT_BYTES[dtype]
    blocks = set(stage_blocks(model, worker.pp))
    block_list = [i for i, layer in enumerate(model.layers) if layer.kind is LayerKind.BLOCK]
    first = {i for i, layer in enumerate(model.layers) if layer.kind is LayerKind.EMBEDDING}
    last = {i for i, layer in enumerate(model.layers) if layer.kind is LayerKind.HEAD}
    stages = [blocks | first]
    if worker.pp > 1:
        per = math.ceil(len(block_list) / worker.pp)
        stages.append(set(block_list[(worker.pp - 1) * per:]) | last)
    else:
        stages[0] |= last
    best = 0.0
    for s, members in enumerate(stages):
        total = 0.0
        extra = block_list[-1:] * draft_layers if s == len(stages) - 1 else []
        for i in sorted(members) + extra:
            layer = model.layers[i]
            dense, _ = layer_params_on_gpu(layer, worker.tp, 1)  # without routed experts
            expert = layer.expert_params / (worker.ep * worker.moe_tp)
            if layer.kind is LayerKind.BLOCK:
                replicated = layer.tp_replicated_params
                total += (dense - replicated + expert) * per_block + replicated * ACT_BYTES
            else:
                total += (dense + expert) * ACT_BYTES
        best = max(best, total)
    return best


def activation_bytes(model: ModelGraph, worker: WorkerConfig, max_num_tokens: int,
                     max_batch: int) -> float:
    """Peak workspace of one iteration (see the module docstring)."""
    widest = 0.0
    for layer in model.blocks():
        width = 2.0 * layer.hidden  # residual stream and normed input
        att = layer.attention
        if att is not None:
            heads = att.num_heads / worker.tp
            width += heads * (att.head_dim + att.v_head_dim) + max(
                att.num_kv_heads / worker.tp, 1) * (att.head_dim + att.v_head_dim)
        mlp = layer.mlp
        if mlp is not None:
            tokens_share = mlp.top_k if mlp.is_moe else 1
            width += (3.0 if mlp.gated else 2.0) * mlp.ffn_hidden * tokens_share / max(
                worker.moe_tp if mlp.is_moe else worker.tp, 1)
        widest = max(widest, width)
    logits = 4.0 * max_batch * model.vocab / worker.tp
    return max_num_tokens * widest * ACT_BYTES + logits


def serving_memory(model: ModelGraph, gpu: Gpu, worker: WorkerConfig, dtype: str, kv_dtype: str,
                   rt: ServingRuntime, max_num_tokens: int, max_batch: int,
                   context: float | None = None, memory_fraction: float | None = None,
                   draft_layers: int = 0) -> ServingMemory:
    """``draft_layers``: MTP blocks loaded for speculative decoding (their weights and KV)."""
    return _serving_memory(Ident(model), gpu, worker, dtype, kv_dtype, rt, max_num_tokens,
                           max_batch, context, memory_fraction, draft_layers)


@lru_cache(maxsize=65536)
def _serving_memory(model_key, gpu, worker, dtype, kv_dtype, rt, max_num_tokens, max_batch,
                    context, memory_fraction, draft_layers) -> ServingMemory:
    fraction = rt.memory_fraction if memory_fraction is None else memory_fraction
    weights = _weights(model_key, worker, dtype, draft_layers)
    act = _activation(model_key, worker, max_num_tokens, max_batch)
    reserve = (gpu.reserve_gib + rt.cuda_graph_gib) * GIB
    total = gpu.memory_gib * GIB
    if rt.kv_rule == "free":  # a share of what weights and buffers leave free
        capacity = total
        free = total - weights - act - reserve
        budget = free * fraction if free > 0 else free
    elif rt.kv_rule == "static":  # the fraction holds weights + KV; buffers live in the rest
        capacity = total * fraction
        budget = capacity - weights
        if total - capacity < act + reserve:  # the rest must hold the buffers
            budget -= act + reserve - (total - capacity)
    else:  # the fraction bounds every allocation of the engine
        capacity = total * fraction
        budget = capacity - weights - act - reserve
    return ServingMemory(weights, act, reserve, budget,
                         _kv_per_token(model_key, worker, kv_dtype, context, draft_layers),
                         capacity)


@lru_cache(maxsize=65536)
def _weights(model_key, worker, dtype, draft_layers=0):
    return weight_bytes_per_gpu(model_key.obj, worker, dtype, draft_layers)


@lru_cache(maxsize=65536)
def _activation(model_key, worker, max_num_tokens, max_batch):
    return activation_bytes(model_key.obj, worker, max_num_tokens, max_batch)


@lru_cache(maxsize=65536)
def _kv_per_token(model_key, worker, kv_dtype, context, draft_layers=0):
    return kv_bytes_per_token(model_key.obj, worker, kv_dtype, context, draft_layers)
