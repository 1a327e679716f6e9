"""Compute time of one layer for one micro-batch on one GPU.

Consumes a :class:`~planner.ir.Layer`, a :class:`Shard` (how the layer is split) and a
:class:`~planner.hardware.Gpu`; produces FLOPs and seconds (forward, backward, and the extra
forward work of each recomputation option).

Model (pure functions, no state):

* GEMMs: every linear layer is a GEMM ``(M tokens) x (K in) -> (N out)``; its FLOPs are ``2MNK``
  (Narayanan et al. 2021 §5.1). Backward runs two GEMMs of the same size (data and weight
  gradients), hence the usual 2x. Time is a roofline over the GPU's peak and HBM bandwidth, with
  a shape-dependent efficiency: the output is cut into thread-block tiles that run in waves of
  ``num_sms`` blocks, so a GEMM of 112 tiles on 108 SMs runs two waves and wastes half of the
  second (wave quantization, NVIDIA "Matrix Multiplication Background" user guide §2.2-2.3);
  partial tiles waste padded work and short K dimensions do not amortise the tile prologue.
* Attention core: FlashAttention-style kernels skip the masked half of causal attention and run
  at a fraction of the GEMM efficiency (Dao 2023, FlashAttention-2 §4: 50-73 % of peak forward,
  lower backward; backward does 2.5x the forward FLOPs because it recomputes the scores);
  "eager" attention materialises the ``s x s`` scores (batched GEMMs whose math does not hide
  their score traffic, plus a memory-bound softmax).
* Element-wise ops (norms, residual adds, activations, rotary, dropout, cross-entropy) are
  memory-bound: bytes moved / achievable HBM bandwidth.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

from planner.config import RuntimeOptions
from planner.cost import moe
from planner.cost.recompute_modules import DEFAULT_RECOMPUTE_MODULES, recomputed_gemm_names
from planner.strategy import Recompute
from planner.hardware import Gpu
from planner.ir import Attention, Layer, LayerKind, Mlp

# Calibrated defaults (see docs/accuracy.md for how they were set; every one is a physical
# quantity in a plausible range, none is fitted per entry).
HBM_EFFICIENCY = 0.80  # achievable fraction of HBM bandwidth for streaming kernels (STREAM-like)
ACT_BYTES_16 = 2  # 16-bit activations
KERNEL_LAUNCH_S = 4e-6  # per kernel launch and tail; CUDA launch overhead is 3-5 us
K_PROLOGUE = 64  # K-elements worth of per-tile prologue/epilogue work
FLASH_DEFAULT_RELATIVE = 0.80  # flash forward vs matmul_efficiency when the GPU gives none
FLASH_BWD_RATIO = 0.75  # flash backward efficiency / forward efficiency (FA2 §4: 70 % vs ~55 %)
# Thread-block tiles cuBLAS picks from, with the relative efficiency of each tile size (larger
# tiles reuse operands better). Source: NVIDIA Deep Learning Performance guide, "Matrix
# Multiplication Background", tile-quantization section.
TILES = ((256, 128, 1.00), (128, 256, 1.00), (128, 128, 0.92), (128, 64, 0.80), (64, 64, 0.60))


# Bytes per GEMM operand element; fp4 (NVFP4) is 4-bit values plus one fp8 scale per 16.
GEMM_OPERAND_BYTES = {"fp8": 1.0, "fp4": 0.5 + 1.0 / 16}


def hbm_bytes_per_s(gpu: Gpu) -> float:
    """Achievable HBM bandwidth of streaming (memory-bound) kernels, bytes per second."""
    return gpu.hbm_bandwidth_gbytes_per_s * 1e9 * HBM_EFFICIENCY


@dataclass(frozen=True)
class Shard:
    """How one layer runs on one GPU: the micro-batch and the degrees that split its work."""

    micro_batch: int
    seq_len: int
    tp: int = 1
    cp: int = 1
    ep: int = 1
    sp: bool = False
    dtype: str = "bf16"
    etp: int = 0  # expert tensor parallel degree (0: tp)
    expert_load: float = 1.0  # busiest expert rank's tokens over the balanced share

    @property
    def tokens(self) -> int:
        """Tokens of one micro-batch on one GPU (context parallelism splits the sequence)."""
        return self.micro_batch * self.seq_len // self.cp

    @property
    def expert_tp(self) -> int:
        return self.etp or self.tp


@dataclass(frozen=True)
class Gemm:
    m: int
    n: int
    k: int
    count: int = 1  # identical GEMMs (batched heads, local experts)
    grouped: bool = False  # one grouped-GEMM kernel over the local experts (MoE)
    # HBM elements moved when they are not the operands' (an implicit-GEMM convolution reads
    # its input once, not the im2col matrix): 0 = count x (m k + k n + m n)
    io_elements: float = 0.0
    # what the GEMM is, where a runtime runs it in another precision than the rest
    # (RuntimeOptions.fp8_bf16_gemms): "head" (the output / LM head), "router" (the MoE router)
    role: str = ""

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.count


@dataclass(frozen=True)
class LayerCompute:
    """Seconds and FLOPs of one layer for one micro-batch on one GPU."""

    fwd_s: float
    bwd_s: float
    attn_core_fwd_s: float  # the part of fwd_s that selective recomputation repeats
    fwd_flops: float
    attn_core_fwd_flops: float
    attn_core_bwd_s: float = 0.0  # the attention core's share of bwd_s
    gemm_fwd_s: float = 0.0  # the GEMMs' share of fwd_s
    gemm_fwd_flops: float = 0.0
    # what SELECTIVE repeats under the runtime's recompute modules (None: the attention core,
    # Megatron's default core_attn; planner.cost.recompute_modules)
    selective_fwd_s: float | None = None
    selective_fwd_flops: float | None = None
    # the weight-gradient GEMMs' share of bwd_s: what a zero-bubble schedule defers (its W pass,
    # Qi et al. 2024 §2; planner/cost/pipeline.py)
    gemm_wgrad_s: float = 0.0

    @property
    def attn_core_s(self) -> float:
        """Forward plus backward seconds of the attention core (ring attention hides behind it)."""
        return self.attn_core_fwd_s + self.attn_core_bwd_s

    def recompute_s(self, recompute: Recompute) -> float:
        if recompute is Recompute.OP:  # half the GEMMs and every non-saved element-wise op
            return self.fwd_s - self.attn_core_fwd_s - self.gemm_fwd_s / 2
        if recompute is Recompute.FULL:
            return self.fwd_s
        if recompute is Recompute.SELECTIVE:
            return self.attn_core_fwd_s if self.selective_fwd_s is None else self.selective_fwd_s
        return 0.0

    def recompute_flops(self, recompute: Recompute) -> float:
        if recompute is Recompute.OP:
            return self.gemm_fwd_flops / 2
        if recompute is Recompute.FULL:
            return self.fwd_flops
        if recompute is Recompute.SELECTIVE:
            return self.attn_core_fwd_flops if self.selective_fwd_flops is None \
                else self.selective_fwd_flops
        return 0.0


def _tile_efficiency(m: int, n: int, k: int, count: int, num_sms: int) -> float:
    best = 0.0
    for tile_m, tile_n, tile_eff in TILES:
        tiles_m, tiles_n = math.ceil(m / tile_m), math.ceil(n / tile_n)
        tiles = tiles_m * tiles_n * count
        pad = (m * n) / (tiles_m * tile_m * tiles_n * tile_n)
        # Split-K: with fewer tiles than SMs cuBLAS splits K across blocks (as long as each
        # split keeps >= 256 of K), at the price of a reduction pass (modelled as 10 %).
        split = 1
        if tiles < num_sms:
            split = max(1, min(num_sms // tiles, k // 256))
        work = tiles * split
        waves = math.ceil(work / num_sms)
        wave = work / (waves * num_sms)
        split_cost = 0.9 if split > 1 else 1.0
        k_eff = (k / split) / (k / split + K_PROLOGUE)
        best = max(best, tile_eff * pad * wave * split_cost * k_eff)
    return best


@lru_cache(maxsize=65536)
def gemm_time_s(gemm: Gemm, gpu: Gpu, dtype: str, fp8_factor: float = 1.0,
                expert_s: float = 0.0, overlap: bool = True) -> float:
    """Roofline time of a GEMM: max(compute at shape-dependent efficiency, HBM traffic) + launch.
    FP8 GEMMs reach ``fp8_factor`` of the 16-bit efficiency on their doubled peak (calibrated:
    planner/calibration/defaults.yaml; scaling and casts are not free). ``expert_s``: what each
    local expert beyond the first adds to a grouped GEMM the runtime runs one GEMM per expert
    (planner.cost.moe.EXPERT_GEMM_S; 0 where one kernel runs every expert). ``overlap=False``:
    compute + HBM traffic instead of their max, for GEMMs whose math does not hide their
    traffic (the eager attention core's: :func:`_attention_core_times`)."""
    if gemm.m <= 0 or gemm.n <= 0 or gemm.k <= 0:
        return 0.0
    eff = gpu.matmul_efficiency * _tile_efficiency(gemm.m, gemm.n, gemm.k, gemm.count, gpu.num_sms)
    if gemm.grouped:
        eff *= moe.GROUPED_GEMM_EFFICIENCY
    if dtype == "fp8":
        eff *= fp8_factor
    compute = gemm.flops / (gpu.peak_flops(dtype) * eff)
    elem = GEMM_OPERAND_BYTES.get(dtype, 2)
    traffic = elem * (gemm.io_elements or
                      gemm.count * (gemm.m * gemm.k + gemm.k * gemm.n + gemm.m * gemm.n))
    memory = traffic / hbm_bytes_per_s(gpu)
    per_expert = expert_s * (gemm.count - 1) if gemm.grouped else 0.0
    busy = max(compute, memory) if overlap else compute + memory
    return busy + KERNEL_LAUNCH_S + per_expert


def gemm_dtype(gemm: Gemm, dtype: str, bf16_roles: tuple[str, ...] = ()) -> str:
    """The precision ``gemm`` runs in when the layer's GEMMs run in ``dtype``: 16 bits under FP8
    / FP4 for the roles the runtime leaves outside its low-precision conversion (``bf16_roles``,
    RuntimeOptions.fp8_bf16_gemms from RuntimeProfile.fp8_bf16_gemms), ``dtype`` otherwise."""
    if gemm.role and dtype in ("fp8", "fp4") and gemm.role in bf16_roles:
        return "bf16"
    return dtype


def backward_gemms(g: Gemm) -> tuple[Gemm, Gemm]:
    """Data gradient (M x N -> M x K) and weight gradient (K x M -> K x N); a convolution's
    move the same tensors (output gradient, weights, input) as its forward."""
    return (Gemm(g.m, g.k, g.n, g.count, g.grouped, g.io_elements, g.role),
            Gemm(g.k, g.n, g.m, g.count, g.grouped, g.io_elements, g.role))


def conv_gemms(layer: Layer, shard: Shard) -> list[Gemm]:
    """The implicit GEMMs of a layer's convolutions for one micro-batch on one GPU (NVIDIA Deep
    Learning Performance guide, "Convolutional Layers": M = N·P·Q, N = C_out, K = C_in·R·S per
    group; cuDNN's implicit-GEMM kernels tile that GEMM like cuBLAS, so the tile and wave model
    above applies). Blocks split output channels over tensor parallelism (channel-parallel:
    whole groups when they divide, else each group's channels); the stem never splits."""
    tp = shard.tp if layer.kind is LayerKind.BLOCK else 1
    out = []
    for c in layer.convs:
        if c.groups % tp == 0:
            count, n = c.groups // tp, c.out_channels // c.groups
        else:
            count, n = c.groups, max(c.out_channels // c.groups // tp, 1)
        m = shard.micro_batch * c.out_pixels
        k = c.in_channels // c.groups * c.kernel
        io = shard.micro_batch * (c.in_channels * c.in_pixels + c.out_channels * c.out_pixels
                                  / tp) + c.weights / tp
        out.append(Gemm(m, n, k, count, False, io))
    return out


def _attention_gemms(att: Attention, h: int, tokens: int, tp: int) -> list[Gemm]:
    heads = att.num_heads // tp
    kv_heads = max(att.num_kv_heads // tp, 1)  # KV heads are replicated when tp > kv heads
    if att.is_mla:
        q_rank = att.q_lora_rank or 0
        gemms = [Gemm(tokens, att.kv_lora_rank + att.rope_head_dim, h)]  # kv down (replicated)
        if q_rank:
            gemms += [Gemm(tokens, q_rank, h), Gemm(tokens, heads * att.head_dim, q_rank)]
        else:
            gemms += [Gemm(tokens, heads * att.head_dim, h)]
        nope = att.head_dim - att.rope_head_dim
        gemms += [Gemm(tokens, heads * (nope + att.v_head_dim), att.kv_lora_rank)]  # kv up
    else:
        gemms = [Gemm(tokens, heads * att.head_dim + kv_heads * (att.head_dim + att.v_head_dim), h)]
    gemms.append(Gemm(tokens, h, heads * att.v_head_dim))  # output projection
    if att.cross_attention:  # encoder-decoder: q, kv of the encoder states, output
        gemms += [Gemm(tokens, heads * att.head_dim, h),
                  Gemm(tokens, 2 * kv_heads * att.head_dim, h),
                  Gemm(tokens, h, heads * att.v_head_dim)]
    return gemms


def _mlp_gemms(mlp: Mlp, h: int, tokens: int, shard: Shard) -> list[Gemm]:
    up = 2 if mlp.gated else 1
    tp = shard.tp
    gemms: list[Gemm] = []
    if not mlp.is_moe:
        width = mlp.ffn_hidden // tp
        return [Gemm(tokens, up * width, h), Gemm(tokens, h, width)]
    # Routed experts on the expert mesh: num_experts / ep local experts of width F / etp, one
    # grouped GEMM each (planner.cost.moe.tokens_per_expert: balanced share x load factor).
    local = mlp.num_experts // shard.ep
    per_expert = max(1, round(moe.tokens_per_expert(tokens, mlp, tp, shard.expert_tp, shard.ep,
                                                    shard.expert_load)))
    width = max(mlp.ffn_hidden // shard.expert_tp, 1)
    router_tokens = tokens // tp if shard.sp else tokens  # each rank routes its sequence shard
    gemms += [Gemm(max(router_tokens, 1), mlp.num_experts, h, role="router"),
              Gemm(per_expert, up * width, h, local, True),
              Gemm(per_expert, h, width, local, True)]
    if mlp.shared_ffn_hidden:  # shared experts run like a dense MLP on the attention mesh
        shared = mlp.shared_ffn_hidden // tp
        gemms += [Gemm(tokens, up * shared, h), Gemm(tokens, h, shared)]
    return gemms


def layer_gemms(layer: Layer, shard: Shard) -> list[Gemm]:
    """Forward GEMMs of one layer on one GPU."""
    t = shard.tokens
    if layer.convs:
        return conv_gemms(layer, shard) + layer_gemms(replace(layer, convs=()), shard)
    if layer.kind is LayerKind.EMBEDDING:
        return []
    if layer.kind is LayerKind.HEAD:
        if not layer.vocab:
            return [Gemm(t, layer.hidden, layer.hidden, role="head")] \
                if layer.params > layer.hidden * 4 else []
        return [Gemm(t, max(layer.vocab // shard.tp, 1), layer.hidden, role="head")]
    gemms: list[Gemm] = []
    if layer.kind is LayerKind.MTP:  # eh_proj: [norm(h); norm(embedding)] (2h) -> h
        gemms.append(Gemm(t, max(layer.hidden // shard.tp, 1), 2 * layer.hidden))
    if layer.attention is not None:
        gemms += _attention_gemms(layer.attention, layer.hidden, t, shard.tp)
    if layer.mlp is not None:
        gemms += _mlp_gemms(layer.mlp, layer.hidden, t, shard)
    return gemms


def attention_core_flops(att: Attention, shard: Shard, kernel: str) -> float:
    """Forward FLOPs of QK^T and attention-times-V on one GPU (one micro-batch)."""
    keys = shard.seq_len if att.sliding_window is None else min(shard.seq_len, att.sliding_window)
    if att.causal and kernel == "flash" and att.sliding_window is None:
        keys = keys / 2  # the masked half is skipped; CP's 2*cp chunking keeps ranks balanced
    heads = att.num_heads // shard.tp
    flops = 2.0 * shard.tokens * keys * heads * (att.head_dim + att.v_head_dim)
    if att.cross_attention:
        flops *= 2
    return flops


def attention_core_dtype(dtype: str, fp8_attention: bool) -> str:
    """The precision the flash attention core runs in: 16 bits under FP8 / FP4 GEMMs, FP8 where
    the runtime runs the attention in FP8 too (``fp8_attention``: Transformer Engine's FP8
    DotProductAttention through cuDNN, Megatron ``--fp8-dot-product-attention``). At the same
    kernel efficiency, on the FP8 peak: in the forward-speed benchmarks of FlashAttention-3
    (Shah et al. 2024, arXiv 2407.08608; H100, head dim 256, 4k tokens) cuDNN's FP8 attention
    runs 1.87x (1,087 vs 581 TFLOP/s) and 2.10x (1,015 vs 483) its FP16 throughput, about the
    2x of the peaks; no FP8 backward is published, the backward is taken at the same ratio."""
    if dtype == "fp8" and fp8_attention:
        return "fp8"
    return "bf16" if dtype in ("fp8", "fp4") else dtype


# HBM bytes per score element of the eager attention core's memory-bound kernels (16-bit
# fp16 / bf16 scores, 2 B an element): Megatron-LM's CoreAttention / ParallelAttention
# (megatron/model/transformer.py, 2021 onwards) runs ``FusedScaleMaskSoftmax`` on the scores,
# then ``attention_dropout`` (a torch.nn.Dropout) on the probabilities, unfused.
# Softmax forward: read the scores, write the probabilities (2 + 2). Softmax backward: read
# the probabilities and their gradient, write the scores' gradient (2 + 2 + 2).
# Dropout forward (PyTorch's fused dropout kernel): read the probabilities, write the dropped
# probabilities and a 1-byte bool / uint8 keep-mask (2 + 2 + 1). Dropout backward: read the
# mask and the gradient, write the scaled gradient (1 + 2 + 2). A recomputed forward repeats
# the forward's bytes. Flash kernels apply dropout inside the kernel and regenerate the mask
# in the backward from the saved random-number-generator state (Dao et al. 2022,
# FlashAttention, arXiv:2205.14135 §3.1 and Appendix B, Algorithm 2): no extra traffic.
EAGER_SOFTMAX_BYTES = (4.0, 6.0)  # (forward, backward) per score element
EAGER_DROPOUT_BYTES = (5.0, 5.0)  # (forward, backward) per score element


def eager_core_bytes_per_score(dropout: bool) -> tuple[float, float]:
    """(forward, backward) HBM bytes per ``s x s`` score element of the eager attention core's
    memory-bound kernels: the softmax, and the attention dropout where the run trains with
    dropout (:data:`EAGER_DROPOUT_BYTES`)."""
    fwd, bwd = EAGER_SOFTMAX_BYTES
    if dropout:
        fwd, bwd = fwd + EAGER_DROPOUT_BYTES[0], bwd + EAGER_DROPOUT_BYTES[1]
    return fwd, bwd


def _attention_core_times(att: Attention, shard: Shard, gpu: Gpu, kernel: str,
                          fp8_attention: bool = False, dropout: bool = False
                          ) -> tuple[float, float]:
    heads = att.num_heads // shard.tp
    if kernel == "flash":
        flops = attention_core_flops(att, shard, kernel)
        efficiency = gpu.attention_efficiency or FLASH_DEFAULT_RELATIVE * gpu.matmul_efficiency
        rate = gpu.peak_flops(attention_core_dtype(shard.dtype, fp8_attention)) * efficiency
        fwd = flops / rate + KERNEL_LAUNCH_S
        bwd = 2.5 * flops / (rate * FLASH_BWD_RATIO) + KERNEL_LAUNCH_S
        return fwd, bwd
    # Eager: batched GEMMs over (micro_batch x heads) plus a memory-bound softmax over the scores.
    # The GEMMs write (QK^T, and dP in the backward) or stream (PV, dV, dQ, dK) the s x s scores
    # with only head_dim of math per element, and their math does not hide that traffic: they
    # are charged compute + traffic (``overlap=False``), not the roofline's max. Checked on the
    # published PyTorch standard attention of FlashAttention-2 (Dao 2023, arXiv:2307.08691,
    # Fig. 4 a-b: A100 80GB SXM4, fp16, no mask, no dropout, forward + backward; 16k tokens,
    # hidden 2048, sequence 512 .. 8k): measured 36-46 TFLOP/s at head_dim 64 and 53-86 at 128,
    # this formula 43-48 and 69-83, the max 58-66 and 103-124 (tests/test_cost_formulas.py).
    dtype = "bf16" if shard.dtype in ("fp8", "fp4") else shard.dtype
    q = shard.tokens // shard.micro_batch
    keys = shard.seq_len
    batch = shard.micro_batch * heads
    scores = Gemm(q, keys, att.head_dim, batch)
    context = Gemm(q, att.v_head_dim, keys, batch)

    def seconds(g: Gemm) -> float:
        return gemm_time_s(g, gpu, dtype, overlap=False)

    fwd = seconds(scores) + seconds(context)
    bwd = sum(seconds(g) for gg in (scores, context) for g in backward_gemms(gg))
    elements = float(batch) * q * keys
    hbm = hbm_bytes_per_s(gpu)
    fwd_bytes, bwd_bytes = eager_core_bytes_per_score(dropout)  # softmax (+ dropout)
    fwd += elements * fwd_bytes / hbm
    bwd += elements * bwd_bytes / hbm
    if att.cross_attention:
        fwd, bwd = 2 * fwd, 2 * bwd
    return fwd, bwd


def elementwise_bytes(layer: Layer, shard: Shard, options: RuntimeOptions) -> float:
    """HBM bytes moved by the memory-bound ops of one layer's forward pass (one micro-batch)."""
    t, h, tp = shard.tokens, layer.hidden, shard.tp
    if layer.convs:
        return conv_elementwise_bytes(layer, shard) + (
            0.0 if layer.kind is LayerKind.BLOCK and layer.attention is None and
            layer.mlp is None else elementwise_bytes(replace(layer, convs=()), shard, options))
    seq_split = tp if shard.sp else 1  # sequence parallelism shards the replicated region
    if layer.kind is LayerKind.EMBEDDING:
        return t * 4.0 * h / seq_split
    if layer.kind is LayerKind.HEAD:
        # final norm, then cross-entropy over the vocabulary shard in fp32 (read bf16 logits,
        # write fp32 softmax, read it back for the loss).
        return t * (4.0 * h / seq_split + 10.0 * layer.vocab / tp)
    per_token = layer.num_norms * 4.0 * h + 12.0 * h  # norms (read+write) and 2 residual adds
    if options.dropout:
        per_token += 2 * 3.0 * h  # dropout read, write and 1-byte mask, twice
    per_token /= seq_split
    mlp = layer.mlp
    if mlp is not None:
        if mlp.is_moe:  # per routed token copy on this GPU: activation, permute / unpermute
            copies = moe.routed_tokens(1.0, mlp, tp, shard.expert_tp, shard.expert_load)
            act = (6.0 if mlp.gated else 4.0) * mlp.ffn_hidden / shard.expert_tp
            per_token += copies * (act + 4.0 * h
                                   + moe.expert_cast_bytes(mlp, h, shard.expert_tp, shard.dtype))
        else:
            per_token += (6.0 if mlp.gated else 4.0) * mlp.ffn_hidden / tp
        if mlp.shared_ffn_hidden:
            per_token += (6.0 if mlp.gated else 4.0) * mlp.shared_ffn_hidden / tp
    att = layer.attention
    if att is not None:
        heads = att.num_heads / tp
        rope = att.rope_head_dim or att.head_dim
        per_token += 4.0 * (heads + max(att.num_kv_heads / tp, 1)) * rope  # rotary on q and k
    return t * per_token


# Forward HBM bytes per 16-bit output element of a convolution's element-wise tail: batch
# normalisation reads its input twice (statistics, then normalise) and writes once (6 B), the
# activation reads and writes (4 B).
CONV_TAIL_BYTES = 10.0


def conv_elementwise_bytes(layer: Layer, shard: Shard) -> float:
    """HBM bytes of the memory-bound ops after a layer's convolutions (one micro-batch): the
    normalisation and activation of every convolution's output (split over channel-parallel
    ranks in blocks), and the residual add of the last output (read two, write one)."""
    tp = shard.tp if layer.kind is LayerKind.BLOCK else 1
    outputs = [c.out_channels * c.out_pixels / tp for c in layer.convs]
    return shard.micro_batch * (CONV_TAIL_BYTES * sum(outputs) + 6.0 * outputs[-1])


def layer_compute(layer: Layer, shard: Shard, gpu: Gpu, options: RuntimeOptions) -> LayerCompute:
    """Forward and backward seconds of ``layer`` for one micro-batch on one GPU. Calibrated
    efficiencies in ``options`` (planner/calibration) replace the GPU preset's."""
    if options.matmul_efficiency is not None or options.attention_efficiency is not None:
        gpu = replace(gpu, matmul_efficiency=options.matmul_efficiency or gpu.matmul_efficiency,
                      attention_efficiency=options.attention_efficiency
                      or gpu.attention_efficiency)
    expert_s = moe.EXPERT_GEMM_S if options.expert_gemm_per_expert \
        and not options.moe.host_captured else 0.0
    return _layer_compute(layer, shard, gpu, options.attention_kernel, options.dropout,
                          options.elementwise_factor, options.fp8_gemm_factor,
                          options.recompute_modules, options.fp8_attention,
                          options.fp8_bf16_gemms, expert_s)


@lru_cache(maxsize=16384)
def _layer_compute(layer: Layer, shard: Shard, gpu: Gpu, kernel: str, dropout: bool,
                   elementwise_factor: float = 1.0, fp8_factor: float = 1.0,
                   modules: tuple[str, ...] = DEFAULT_RECOMPUTE_MODULES,
                   fp8_attention: bool = False,
                   bf16_roles: tuple[str, ...] = (), expert_s: float = 0.0) -> LayerCompute:
    """``elementwise_factor``: HBM traffic of the element-wise ops relative to fused kernels
    (eager PyTorch launches norms, activations and residual adds separately and re-reads their
    inputs; Transformer Engine / torch.compile fuse them: calibrated per runtime).
    ``bf16_roles``: the GEMM roles the runtime keeps in 16 bits under FP8 (:func:`gemm_dtype`).
    ``expert_s``: each local expert's own GEMM launch beyond the first (:func:`gemm_time_s`)."""
    options = RuntimeOptions(attention_kernel=kernel, dropout=dropout)
    gemms = layer_gemms(layer, shard)

    def seconds(g: Gemm) -> float:
        return gemm_time_s(g, gpu, gemm_dtype(g, shard.dtype, bf16_roles), fp8_factor,
                           expert_s)

    fwd = sum(seconds(g) for g in gemms)
    gemm_fwd = fwd
    bwd = sum(seconds(b) for g in gemms for b in backward_gemms(g))
    wgrad = sum(seconds(backward_gemms(g)[1]) for g in gemms)
    flops = sum(g.flops for g in gemms)
    gemm_flops = flops
    hbm = hbm_bytes_per_s(gpu)
    elementwise = elementwise_bytes(layer, shard, options) / hbm * elementwise_factor
    # ~10 element-wise kernels per block forward, twice that backward
    kernels = 10 if layer.kind is LayerKind.BLOCK else 2
    if layer.convs:  # a convolution, its normalisation and its activation each
        kernels = 3 * len(layer.convs) + (0 if layer.attention is None and layer.mlp is None
                                          else kernels)
    fwd += elementwise + kernels * KERNEL_LAUNCH_S
    bwd += 2 * elementwise + 2 * kernels * KERNEL_LAUNCH_S
    core_fwd = core_bwd = core_flops = 0.0
    if layer.attention is not None:
        core_fwd, core_bwd = _attention_core_times(layer.attention, shard, gpu, kernel,
                                                   fp8_attention, dropout)
        core_flops = attention_core_flops(layer.attention, shard, kernel)
        fwd += core_fwd
        bwd += core_bwd
        flops += core_flops
    selective_s = selective_flops = None
    if modules != DEFAULT_RECOMPUTE_MODULES and layer.kind is not LayerKind.EMBEDDING:
        keep_core = "core_attn" in modules
        extra_s, extra_flops = _module_recompute(layer, shard, gpu, fp8_factor, modules)
        selective_s = (core_fwd if keep_core else 0.0) + extra_s
        selective_flops = (core_flops if keep_core else 0.0) + extra_flops
    return LayerCompute(fwd, bwd, core_fwd, flops, core_flops, core_bwd, gemm_fwd, gemm_flops,
                        selective_s, selective_flops, wgrad)


def _module_recompute(layer: Layer, shard: Shard, gpu: Gpu, fp8_factor: float,
                      modules: tuple[str, ...]) -> tuple[float, float]:
    """(seconds, FLOPs) of the forward work beyond the attention core that the recompute
    ``modules`` repeat (planner.cost.recompute_modules): their GEMMs, and the HBM traffic of the
    element-wise modules (read the input, write the output, 16-bit)."""
    t, h, tp = shard.tokens, layer.hidden, shard.tp
    names = recomputed_gemm_names(layer, modules)
    gemms: list[Gemm] = []
    att, mlp = layer.attention, layer.mlp
    if "mla_up" in names:
        heads = att.num_heads // tp
        if att.q_lora_rank:
            gemms.append(Gemm(t, heads * att.head_dim, att.q_lora_rank))
        nope = att.head_dim - att.rope_head_dim
        gemms.append(Gemm(t, heads * (nope + att.v_head_dim), att.kv_lora_rank))
    up = 2 if (mlp is not None and mlp.gated) else 1
    if "mlp" in names:
        width = mlp.ffn_hidden // tp
        gemms += [Gemm(t, up * width, h), Gemm(t, h, width)]
    if "shared" in names:
        shared = mlp.shared_ffn_hidden // tp
        gemms += [Gemm(t, up * shared, h), Gemm(t, h, shared)]
    seconds = sum(gemm_time_s(g, gpu, shard.dtype, fp8_factor) for g in gemms)
    flops = sum(g.flops for g in gemms)
    moved = 0.0
    if "layernorm" in modules and layer.num_norms:
        moved += 2 * 2 * ACT_BYTES_16 * t * h / (tp if shard.sp else 1)
    if "moe_act" in modules and mlp is not None and mlp.is_moe:
        copies = t / tp * mlp.top_k * shard.expert_tp * shard.expert_load
        moved += copies * (up + 1) * ACT_BYTES_16 * mlp.ffn_hidden / shard.expert_tp
    if moved:
        seconds += moved / hbm_bytes_per_s(gpu) + KERNEL_LAUNCH_S
    return seconds, flops
