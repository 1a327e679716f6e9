"""Memory per GPU: model states under ZeRO, activations under recomputation and sequence
parallelism, and the pipeline schedule's micro-batches in flight.

Pure functions over byte counts. Sources:

* ZeRO stages: Rajbhandari et al. 2020 §5 (ZeRO, Rajbhandari et al. 2020 §3.1); per-runtime bytes per parameter
  in :class:`planner.config.StateBytes`.
* Activations per transformer layer: Korthikanti et al. 2022 §4 (Korthikanti et al. 2022 §4). The general
  form below reproduces their ``sbh(34 + 5as/h)`` exactly for a GPT block with dropout and
  eager attention, and extends it tensor by tensor to GQA, gated MLPs, MoE, MLA and flash
  attention.
* Micro-batches in flight: 1F1B holds ``min(p - i, m)`` on stage ``i``; interleaved 1F1B with
  ``v`` chunks holds ``2(p - i - 1) + (v - 1)p + 1`` chunk-micro-batches (Megatron-LM
  ``schedules.py`` warm-up count + 1), which gives Korthikanti's ``1 + (p-1)/(pv)`` on stage 0;
  the zero-bubble V schedules hold ``p`` (ZB-V) or ``p + 1/2`` (DualPipeV) on every rank
  (:mod:`planner.cost.pipeline`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from planner.config import StateBytes
from planner.cost.recompute_modules import DEFAULT_RECOMPUTE_MODULES, saved_bytes_per_token
from planner.strategy import Recompute
from planner.ir import Attention, Layer, LayerKind

ACT_BYTES = 2  # 16-bit activations

# Bytes per vocabulary logit of one token that the loss keeps for backward, and the extra while
# the loss runs backward, by cross-entropy implementation (RuntimeOptions.cross_entropy):
# * fp32: the logits are upcast and the fp32 softmax is saved (Megatron's vocab-parallel cross
#   entropy, Korthikanti et al. 2022 §4.3: 4sbv/t); backward holds the 16-bit logits' gradient
#   next to the fp32 one;
# * bf16: no upcast (NeMo AutoModel's MaskedCrossEntropy with fp32_upcast false): the 16-bit
#   softmax saved, its 16-bit gradient and the logits' gradient in backward;
# * fused: one kernel computes the loss and writes the gradient into the 16-bit logits buffer
#   in the forward pass (Transformer Engine's parallel_cross_entropy, Megatron
#   --cross-entropy-loss-fusion --cross-entropy-fusion-impl te): that buffer is all it keeps.
LOGIT_BYTES = {"fp32": (4.0, ACT_BYTES + 4.0), "bf16": (2.0, 2.0 * ACT_BYTES),
               "fused": (float(ACT_BYTES), 0.0)}
CROSS_ENTROPY = tuple(LOGIT_BYTES)


@dataclass(frozen=True)
class ModelStates:
    params: float
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer


def zero_state_bytes(num_params: float, shard_degree: int, zero_stage: int,
                     state: StateBytes) -> ModelStates:
    """Bytes of weights, gradients and optimizer states one GPU holds for ``num_params``.

    ZeRO-1 shards the optimizer states over ``shard_degree`` ranks, ZeRO-2 also the gradients
    (from ``state.grads_sharded_from_stage``), ZeRO-3 also the weights. A runtime's copy of
    the gradients for the data-parallel reduction (``state.reduce_copy_bytes``) is never
    sharded; it is counted with the gradients.
    """
    n = max(shard_degree, 1)
    weights = state.weights * num_params / (n if zero_stage >= 3 else 1)
    grads = state.grads * num_params / (n if zero_stage >= state.grads_sharded_from_stage else 1)
    grads += state.reduce_copy_bytes * num_params  # the reduction's flattened copy (unsharded)
    optimizer = state.optimizer * num_params / (n if zero_stage >= 1 else 1)
    return ModelStates(weights, grads, optimizer)


def layer_params_on_gpu(layer: Layer, tp: int, ep: int, etp: int = 0) -> tuple[float, float]:
    """(dense, expert) parameters of ``layer`` held by one GPU before ZeRO sharding: dense ones
    split by tp, routed experts by the expert mesh's ep x etp (``etp`` 0: tp).

    Tied weights count here: the stage holding the LM head keeps a copy of the embedding.
    """
    held = layer.params + layer.tied_params
    expert = layer.expert_params / (ep * (etp or tp))
    sharded = held - layer.tp_replicated_params - layer.expert_params
    return sharded / tp + layer.tp_replicated_params, expert


def _attention_act_per_token(att: Attention, h: int, tp: int, seq_len: int, kernel: str,
                             dropout: bool) -> tuple[float, float]:
    """(tp-sharded bytes, attention-core-internal bytes) stored per token by one attention."""
    heads = att.num_heads / tp
    kv_heads = max(att.num_kv_heads / tp, 1)
    q_k = ACT_BYTES * (heads * att.head_dim + kv_heads * att.head_dim)  # Q and K
    v = ACT_BYTES * kv_heads * att.v_head_dim
    out = ACT_BYTES * heads * att.v_head_dim  # attention output = output-projection input
    sharded = q_k + v + out
    if att.is_mla:  # latent vectors and their norm inputs (replicated down-projections)
        sharded += 2 * ACT_BYTES * ((att.q_lora_rank or 0) + att.kv_lora_rank + att.rope_head_dim)
    if kernel == "flash":
        core = 4.0 * heads  # fp32 log-sum-exp per head
    else:
        keys = seq_len if att.sliding_window is None else min(seq_len, att.sliding_window)
        core = heads * keys * (5 if dropout else 2)  # softmax out (2), dropout mask (1), out (2)
    if att.cross_attention:
        sharded, core = 2 * sharded, 2 * core
    return sharded, core


def block_activation_bytes_per_token(layer: Layer, tp: int, sp: bool, seq_len: int,
                                     kernel: str, dropout: bool, etp: int = 0,
                                     expert_load: float = 1.0) -> tuple[float, float]:
    """(stored bytes per token without recomputation, of which attention-core internals).

    Replicated across TP ranks unless sequence-parallel: the norm inputs, the GEMM inputs after
    each norm and the dropout masks (Korthikanti's ``10 sbh``). TP-sharded: Q, K, V, the
    attention output, the MLP's intermediate activations. Routed experts store, per token copy
    their GPU computes (:func:`planner.cost.moe.routed_tokens`: ``top_k x etp / tp x load`` per
    token), the permuted input and the expert's intermediate activations at width F / etp.
    """
    h = layer.hidden
    replicated = layer.num_norms * ACT_BYTES * h + 2 * ACT_BYTES * h  # norm inputs + GEMM inputs
    if dropout:
        replicated += 2 * h  # two 1-byte dropout masks
    if layer.attention is not None and layer.attention.cross_attention:
        replicated += ACT_BYTES * h  # input of the cross-attention query projection
    if layer.kind is LayerKind.MTP:
        replicated += 2 * ACT_BYTES * 2 * h  # the two normed inputs and the eh_proj input
    sharded = core = 0.0
    if layer.attention is not None:
        sharded, core = _attention_act_per_token(layer.attention, h, tp, seq_len, kernel, dropout)
    mlp = layer.mlp
    if mlp is not None:
        per_expert = ACT_BYTES * (3 if mlp.gated else 2) * mlp.ffn_hidden / tp  # GEMM1 out + act out
        if mlp.is_moe:
            etp = etp or tp
            copies = mlp.top_k * etp / tp * expert_load
            width = ACT_BYTES * (3 if mlp.gated else 2) * mlp.ffn_hidden / etp
            sharded += copies * (width + ACT_BYTES * h)  # + permuted expert inputs
            replicated += 4.0 * mlp.num_experts  # fp32 router logits
            if mlp.shared_ffn_hidden:
                sharded += ACT_BYTES * (3 if mlp.gated else 2) * mlp.shared_ffn_hidden / tp
        else:
            sharded += per_expert
    return replicated / (tp if sp else 1) + sharded + core, core


def fp8_input_saving_per_token(layer: Layer, tp: int, sp: bool, etp: int = 0,
                               expert_load: float = 1.0) -> float:
    """Bytes per token saved when the GEMM inputs kept for backward are FP8 (1 byte) instead of
    16-bit: Transformer Engine's Linear / LayerNormLinear save their FP8-cast input for the
    weight gradient. The four dense GEMM inputs: the QKV and FC1 inputs (norm outputs, replicated
    unless SP), the output-projection input and the FC2 input (TP-sharded). Routed experts'
    grouped GEMMs (TE ``GroupedLinear``) do the same for each token copy their GPU computes: the
    permuted input (FC1) and the activation output (FC2 input, width F / etp)."""
    h = layer.hidden
    saving = 2 * h * (ACT_BYTES - 1) / (tp if sp else 1)  # one byte less per element
    if layer.attention is not None:
        saving += (ACT_BYTES - 1) * layer.attention.num_heads * layer.attention.v_head_dim / tp
    mlp = layer.mlp
    if mlp is not None and not mlp.is_moe:
        saving += (ACT_BYTES - 1) * mlp.ffn_hidden / tp
    elif mlp is not None:
        etp = etp or tp
        copies = mlp.top_k * etp / tp * expert_load
        saving += (ACT_BYTES - 1) * copies * (h + mlp.ffn_hidden / etp)
    return saving


def op_sac_saved_per_token(layer: Layer, tp: int, sp: bool) -> float:
    """Bytes per token per-op selective checkpointing keeps (torchtitan ``op`` SAC): the block
    input, the attention kernel's output and log-sum-exp, and the output of every other matmul
    (half of the GEMM outputs); everything else is recomputed in backward."""
    h = layer.hidden
    saved = ACT_BYTES * h / (tp if sp else 1)
    outputs = 0.0
    att, mlp = layer.attention, layer.mlp
    if att is not None:
        heads, kv_heads = att.num_heads / tp, max(att.num_kv_heads / tp, 1)
        saved += ACT_BYTES * heads * att.v_head_dim + 4.0 * heads
        outputs += ACT_BYTES * (heads * att.head_dim + kv_heads * (att.head_dim + att.v_head_dim))
        outputs += ACT_BYTES * h
    if mlp is not None:
        up = 2 if mlp.gated else 1
        routed = mlp.top_k if mlp.is_moe else 1
        outputs += routed * ACT_BYTES * (up * mlp.ffn_hidden / tp + h)
    return saved + outputs / 2


def conv_activation_bytes(layer: Layer, micro_batch: int, tp: int,
                          recompute: Recompute) -> tuple[float, float]:
    """(stored, working) bytes of a layer's convolutions for one micro-batch on one GPU: the
    layer input (the first convolution's, kept for its weight gradient), then per convolution
    its output (the normalisation's saved input, split over channel-parallel ranks) and the
    activation's output (the next convolution's input, whole on every rank), 16-bit. Full
    recomputation keeps the layer input only and rebuilds the rest while its backward runs.
    (PyTorch autograd saves exactly these: conv input, batch-norm input, ReLU output.)"""
    split = tp if layer.kind is LayerKind.BLOCK else 1
    first = layer.convs[0]
    block_input = ACT_BYTES * first.in_channels * first.in_pixels
    inner = sum(ACT_BYTES * c.out_channels * c.out_pixels * (1 + 1 / split) for c in layer.convs)
    if recompute is Recompute.FULL:
        return micro_batch * block_input, micro_batch * inner
    return micro_batch * (block_input + inner), 0.0


def layer_activation_bytes(layer: Layer, micro_batch: int, seq_len: int, tp: int, cp: int,
                           sp: bool, recompute: Recompute, kernel: str,
                           dropout: bool, etp: int = 0, expert_load: float = 1.0,
                           fp8_inputs: bool = False,
                           modules: tuple[str, ...] = DEFAULT_RECOMPUTE_MODULES,
                           cross_entropy: str = "fp32") -> tuple[float, float]:
    """(stored, working) activation bytes of one layer for one micro-batch on one GPU.

    ``stored`` stays alive until the micro-batch's backward reaches the layer; ``working`` is the
    transient extra while the layer's backward runs (the recomputed activations under FULL).
    ``fp8_inputs``: the runtime keeps FP8 GEMM inputs (:func:`fp8_input_saving_per_token`).
    ``modules``: what SELECTIVE recomputes (:mod:`planner.cost.recompute_modules`);
    ``cross_entropy``: the loss's bytes per logit (:data:`LOGIT_BYTES`).
    """
    if layer.convs:
        conv = conv_activation_bytes(layer, micro_batch, tp, recompute)
        if layer.attention is None and layer.mlp is None:
            return conv
        rest = layer_activation_bytes(replace(layer, convs=()), micro_batch, seq_len, tp, cp, sp,
                                      recompute, kernel, dropout, etp, expert_load, fp8_inputs,
                                      modules)
        return conv[0] + rest[0], max(conv[1], rest[1])
    tokens = micro_batch * seq_len / cp
    h = layer.hidden
    seq_split = tp if sp else 1
    if layer.kind is LayerKind.EMBEDDING:
        return (tokens * h / seq_split if dropout else 0.0), 0.0
    if layer.kind is LayerKind.HEAD:
        # final-norm input and LM-head input (bf16), and what the loss keeps per logit of the
        # vocabulary shard (LOGIT_BYTES; fp32: Korthikanti §4.3: 4sbh/t (1 + V/h)); a
        # classifier head without vocabulary stores little.
        kept, backward = LOGIT_BYTES[cross_entropy]
        stored = tokens * (2 * ACT_BYTES * h / seq_split + kept * layer.vocab / tp)
        return stored, tokens * backward * layer.vocab / tp
    full, core = block_activation_bytes_per_token(layer, tp, sp, seq_len, kernel, dropout, etp,
                                                  expert_load)
    if fp8_inputs:
        full -= fp8_input_saving_per_token(layer, tp, sp, etp, expert_load)
    if recompute is Recompute.OP:
        saved = min(op_sac_saved_per_token(layer, tp, sp), full)
        return tokens * saved, tokens * (full - saved)
    if recompute is Recompute.FULL:
        return tokens * ACT_BYTES * h / seq_split, tokens * full
    if recompute is Recompute.SELECTIVE:
        if modules != DEFAULT_RECOMPUTE_MODULES:
            core = min(saved_bytes_per_token(layer, tp, sp, modules, core, etp, expert_load,
                                             fp8_inputs), full)
        return tokens * (full - core), tokens * core
    return tokens * full, 0.0


def in_flight_micro_batches(stage: int, pp: int, num_micro_batches: int,
                            virtual_stages: int = 1, schedule: str = "") -> float:
    """Micro-batches whose activations stage ``stage`` holds at its peak, in units of the whole
    stage's activations (so interleaving gives a fraction per chunk). ``schedule``: a name of
    :data:`planner.cost.pipeline.SCHEDULES` (ZB-H1 keeps 1F1B's peak, Qi et al. §2.1; the V
    schedules their own, :func:`planner.cost.pipeline.in_flight_stages`)."""
    if schedule:
        from planner.cost.pipeline import SCHEDULES, in_flight_stages

        held = in_flight_stages(SCHEDULES[schedule], stage, pp, num_micro_batches,
                                virtual_stages)
        if held is not None:
            return held
    if virtual_stages <= 1:
        return float(min(pp - stage, num_micro_batches))
    chunks = 2 * (pp - stage - 1) + (virtual_stages - 1) * pp + 1
    return min(chunks, num_micro_batches * virtual_stages) / virtual_stages
