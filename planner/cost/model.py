"""The cost model: step time and per-GPU memory of one configuration, stage by stage.

Consumes a ModelGraph, a Cluster, a ParallelConfig, a LayerPlacement and RuntimeOptions; produces
an :class:`Evaluation`. The solver calls the same building blocks (:func:`make_context`,
:func:`layer_cost`, :func:`stage_memory`, :func:`stage_time`, :func:`step_time`) so that
``shardplan plan`` and ``shardplan evaluate`` always agree on a configuration.

Mesh layout (Megatron-LM order, TP innermost): global rank
``((pp_rank * dp + dp_rank) * cp + cp_rank) * tp + tp_rank``. TP groups are contiguous ranks
(inside an NVLink domain when tp <= gpus per node), CP groups have stride tp, DP groups stride
tp*cp, EP groups stride tp inside the dp x cp ranks, PP neighbours stride tp*cp*dp.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

from clusters.topology import Link, group_link
from planner.config import LayerPlacement, ParallelConfig, Recompute, RuntimeOptions
from planner.cost import comm
from planner.cost.compute import HBM_EFFICIENCY, Shard, attention_core_flops, layer_compute, layer_gemms
from planner.cost.memory import (ACT_BYTES, ModelStates, in_flight_micro_batches,
                                 layer_activation_bytes, layer_params_on_gpu, zero_state_bytes)
from planner.cost.pipeline import pipeline_time_s
from planner.hardware import GIB, Cluster
from planner.ir import Layer, LayerKind, ModelGraph

# The runtime reserve (CUDA context, workspaces, NCCL buffers) is a GPU property:
# planner.hardware.Gpu.reserve_gib (2.5 GiB by default, calibrated in docs/accuracy.md).
# The PyTorch caching allocator holds freed blocks for reuse; nvidia-smi therefore reports more
# than the live tensors. Modelled as a fraction of the dynamic (activation and buffer) memory.
ALLOCATOR_OVERHEAD = 0.25
# Adam step: read fp32 master, m, v and the gradient, write master, m, v and the 16-bit weights.
OPTIMIZER_BYTES_PER_PARAM = 4 * 4 + 3 * 4 + 2


@dataclass(frozen=True)
class Links:
    tp: Link
    cp: Link
    dp: Link  # the dp x cp ranks sharing ZeRO states and reducing gradients
    ep: Link
    pp: Link


@dataclass(frozen=True, eq=False)  # identity hash: contexts key the per-layer cost cache
class CostContext:
    model: ModelGraph
    cluster: Cluster
    config: ParallelConfig
    options: RuntimeOptions
    shard: Shard
    links: Links

    @property
    def shard_degree(self) -> int:
        """Ranks sharing ZeRO states of dense parameters (Megatron shards over dp x cp)."""
        return self.config.dp * self.config.cp


def make_context(model: ModelGraph, cluster: Cluster, config: ParallelConfig,
                 options: RuntimeOptions = RuntimeOptions()) -> CostContext:
    c = config
    shard = Shard(c.micro_batch, c.seq_len, c.tp, c.cp, c.ep, c.sp, c.dtype)
    links = mesh_links(cluster, c.tp, c.cp, c.dp, c.ep, c.pp)
    return CostContext(model, cluster, config, options, shard, links)


@lru_cache(maxsize=4096)
def mesh_links(cluster: Cluster, tp: int, cp: int, dp: int, ep: int, pp: int) -> Links:
    """The link of every group of a tp x cp x dp x pp mesh (TP innermost)."""
    return Links(
        tp=group_link(cluster, tp, 1),
        cp=group_link(cluster, cp, tp),
        dp=group_link(cluster, dp * cp, tp),
        ep=group_link(cluster, ep, tp),
        pp=group_link(cluster, 2 if pp > 1 else 1, tp * cp * dp),
    )


@dataclass(frozen=True)
class LayerCost:
    """One layer on one GPU for one micro-batch."""

    fwd_s: float
    bwd_s: float
    recompute_s: float
    comm_s: float  # exposed TP / CP / EP communication
    act_stored_bytes: float
    act_working_bytes: float
    dense_params: float  # held by one GPU before ZeRO sharding
    expert_params: float
    hw_flops: float  # executed, recomputation included

    @property
    def time_s(self) -> float:
        return self.fwd_s + self.bwd_s + self.recompute_s + self.comm_s


def _tp_syncs(layer: Layer) -> tuple[int, int]:
    """TP synchronisation points of a layer (forward, backward): Megatron's f/g operators."""
    if layer.kind is LayerKind.BLOCK:
        n = 2 + (1 if layer.attention is not None and layer.attention.cross_attention else 0)
        return n, n
    if layer.kind is LayerKind.EMBEDDING:
        return 1, 0  # vocab-parallel embedding: all-reduce (reduce-scatter with SP) of the output
    return (1 if layer.vocab else 0), 1  # LM head: gather input (SP), reduce input gradient


def layer_cost(ctx: CostContext, layer: Layer, recompute: Recompute) -> LayerCost:
    return _layer_cost(ctx, layer, recompute)


@lru_cache(maxsize=65536)
def _layer_cost(ctx: CostContext, layer: Layer, recompute: Recompute) -> LayerCost:
    c, shard, links, opts = ctx.config, ctx.shard, ctx.links, ctx.options
    compute = layer_compute(layer, shard, ctx.cluster.gpu, opts)
    tokens = shard.tokens
    hidden_bytes = tokens * layer.hidden * ACT_BYTES
    # Tensor parallel collectives (not overlapped with compute unless the runtime says so).
    fwd_syncs, bwd_syncs = _tp_syncs(layer)
    one = comm.tp_collective_s(hidden_bytes, c.tp, links.tp, c.sp)
    if c.tp > 1 and not c.sp and layer.kind is LayerKind.HEAD:
        fwd_syncs = 0  # without SP the head's input is already replicated
    tp_fwd = fwd_syncs * one
    tp_comm = (tp_fwd + bwd_syncs * one) * (1.0 - opts.tp_comm_overlap)
    if recompute is Recompute.FULL:
        tp_comm += tp_fwd * (1.0 - opts.tp_comm_overlap)
    other = 0.0
    mlp = layer.mlp
    if mlp is not None and mlp.is_moe and c.ep > 1:
        # token dispatch and combine, forward and backward (Megatron-Core alltoall dispatcher)
        other += 4 * comm.all_to_all_s(hidden_bytes * mlp.top_k, c.ep, links.ep)
    att = layer.attention
    if att is not None and c.cp > 1:
        # ring attention: cp-1 exchanges of the local K and V chunk forward, twice that (K, V and
        # their gradients) backward, hidden behind the attention core compute where possible.
        kv_bytes = tokens * max(att.num_kv_heads // c.tp, 1) * (att.head_dim + att.v_head_dim) * ACT_BYTES
        ring = 3 * (c.cp - 1) * comm.p2p_s(kv_bytes, links.cp)
        core_s = compute.attn_core_fwd_s * 3.5  # forward + backward of the core
        other += max(0.0, ring - core_s)
    stored, working = layer_activation_bytes(layer, c.micro_batch, c.seq_len, c.tp, c.cp, c.sp,
                                             recompute, opts.attention_kernel, opts.dropout)
    dense, expert = layer_params_on_gpu(layer, c.tp, c.ep)
    hw_flops = 3 * compute.fwd_flops + compute.recompute_flops(recompute)
    return LayerCost(compute.fwd_s, compute.bwd_s, compute.recompute_s(recompute),
                     tp_comm + other, stored, working, dense, expert, hw_flops)


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per GPU by category; ``reserve`` is runtime context + allocator overhead."""

    params: float = 0.0
    grads: float = 0.0
    optimizer: float = 0.0
    activations: float = 0.0
    buffers: float = 0.0
    reserve: float = 0.0

    @property
    def other(self) -> float:
        return self.buffers + self.reserve

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations + self.other

    def __add__(self, other: "MemoryBreakdown") -> "MemoryBreakdown":
        return MemoryBreakdown(*(a + b for a, b in zip(self._values(), other._values())))

    def _values(self) -> tuple[float, ...]:
        return (self.params, self.grads, self.optimizer, self.activations, self.buffers,
                self.reserve)

    def gib(self) -> dict[str, float]:
        """The JSON form: GiB per category (params, grads, optimizer, activations, other, total)."""
        return {"params": self.params / GIB, "grads": self.grads / GIB,
                "optimizer": self.optimizer / GIB, "activations": self.activations / GIB,
                "other": self.other / GIB, "total": self.total / GIB}


def stage_memory(ctx: CostContext, stage: int, costs: Sequence[LayerCost]) -> MemoryBreakdown:
    """Peak bytes per GPU of pipeline stage ``stage`` holding layers with ``costs``."""
    c, opts = ctx.config, ctx.options
    state = opts.state_bytes
    dense = sum(x.dense_params for x in costs)
    expert = sum(x.expert_params for x in costs)
    states = zero_state_bytes(dense, ctx.shard_degree, c.zero_stage, state)
    expert_states = zero_state_bytes(expert, max(ctx.shard_degree // c.ep, 1), c.zero_stage, state)
    inflight = in_flight_micro_batches(stage, c.pp, c.num_micro_batches, c.virtual_stages)
    activations = inflight * sum(x.act_stored_bytes for x in costs) + \
        max((x.act_working_bytes for x in costs), default=0.0)
    hidden_bytes = ctx.shard.tokens * ctx.model.hidden * ACT_BYTES
    buffers = 0.0
    if c.pp > 1:
        buffers += 2 * hidden_bytes  # send and receive buffers of the stage boundary
    if c.sp:
        buffers += hidden_bytes  # all-gathered sequence-parallel input of one GEMM
    if c.zero_stage >= 3:
        largest = max((x.dense_params for x in costs), default=0.0)
        buffers += 2 * largest * state.weights  # gathered weights of the current and next layer
    if c.zero_stage >= 1 and c.dp * c.cp > 1:
        buffers += state.bucket_bytes
    reserve = ctx.cluster.gpu.reserve_gib * GIB + ALLOCATOR_OVERHEAD * (activations + buffers)
    total_states = ModelStates(states.params + expert_states.params,
                               states.grads + expert_states.grads,
                               states.optimizer + expert_states.optimizer)
    return MemoryBreakdown(total_states.params, total_states.grads, total_states.optimizer,
                           activations, buffers, reserve)


def stage_time(ctx: CostContext, costs: Sequence[LayerCost]) -> float:
    """Seconds per micro-batch on one stage: its layers plus the stage-boundary transfers."""
    c = ctx.config
    time_s = sum(x.time_s for x in costs)
    if c.pp > 1:
        boundary = ctx.shard.tokens * ctx.model.hidden * ACT_BYTES / (c.tp if c.sp else 1)
        # forward activation out, backward gradient out, once per model chunk (Narayanan §4.1)
        time_s += 2 * c.virtual_stages * comm.p2p_s(boundary, ctx.links.pp)
    if c.zero_stage >= 2 and ctx.shard_degree > 1:
        # Sharded gradients cannot accumulate locally: ZeRO-2 reduce-scatters them every
        # micro-batch (DeepSpeed stage_1_and_2.py reduces in each backward), ZeRO-3 / FSDP also
        # gathers the weights for forward and backward (ZeRO §7: 1.5x the DP volume). Both are
        # overlapped with the stage's compute; only the excess is exposed.
        dense = sum(x.dense_params for x in costs)
        expert = sum(x.expert_params for x in costs)
        state = ctx.options.state_bytes
        n, n_expert = ctx.shard_degree, max(ctx.shard_degree // c.ep, 1)
        traffic = (comm.reduce_scatter_s(dense * state.grad_reduce_bytes, n, ctx.links.dp)
                   + comm.reduce_scatter_s(expert * state.grad_reduce_bytes, n_expert, ctx.links.dp))
        if c.zero_stage >= 3:
            traffic += 2 * (comm.all_gather_s(dense * state.weights, n, ctx.links.dp)
                            + comm.all_gather_s(expert * state.weights, n_expert, ctx.links.dp))
        compute_s = sum(x.fwd_s + x.bwd_s for x in costs)
        time_s += max(0.0, traffic - compute_s)
    return time_s


@dataclass(frozen=True)
class StepBreakdown:
    pipeline_s: float
    bubble_s: float
    dp_exposed_s: float
    optimizer_s: float
    embedding_sync_s: float

    @property
    def step_time_s(self) -> float:
        return self.pipeline_s + self.dp_exposed_s + self.optimizer_s + self.embedding_sync_s


def dp_sync_s(ctx: CostContext, costs: Sequence[LayerCost]) -> tuple[float, float]:
    """(gradient reduction, parameter gather) seconds of one stage's data-parallel sync."""
    c, state = ctx.config, ctx.options.state_bytes
    n = ctx.shard_degree
    dense = sum(x.dense_params for x in costs)
    expert = sum(x.expert_params for x in costs)
    n_expert = max(n // c.ep, 1)
    if c.zero_stage >= 3 or (c.zero_stage == 2 and n > 1):
        # per micro-batch, inside stage_time; ZeRO-2 still gathers the updated weights once
        if c.zero_stage == 3:
            return 0.0, 0.0
        return 0.0, (comm.all_gather_s(dense * state.weights, n, ctx.links.dp)
                     + comm.all_gather_s(expert * state.weights, n_expert, ctx.links.dp))
    if c.zero_stage == 0:
        return (comm.all_reduce_s(dense * state.grad_reduce_bytes, n, ctx.links.dp)
                + comm.all_reduce_s(expert * state.grad_reduce_bytes, n_expert, ctx.links.dp)), 0.0
    reduce = (comm.reduce_scatter_s(dense * state.grad_reduce_bytes, n, ctx.links.dp)
              + comm.reduce_scatter_s(expert * state.grad_reduce_bytes, n_expert, ctx.links.dp))
    gather = (comm.all_gather_s(dense * state.weights, n, ctx.links.dp)
              + comm.all_gather_s(expert * state.weights, n_expert, ctx.links.dp))
    return reduce, gather


def step_time(ctx: CostContext, stage_costs: Sequence[Sequence[LayerCost]],
              stage_times: Sequence[float]) -> StepBreakdown:
    c, opts = ctx.config, ctx.options
    m = c.num_micro_batches
    pipe = pipeline_time_s(stage_times, m, c.virtual_stages)
    bubble = pipe - m * max(stage_times)
    # DP sync per stage. With overlap, gradient reduction hides behind the last micro-batch's
    # backward, and stage i also has the slack of the backward still running on stages < i
    # (Megatron-LM --overlap-grad-reduce; parameter all-gather behind the next forward with
    # --overlap-param-gather).
    exposed = 0.0
    slack = 0.0
    for costs in stage_costs:
        reduce, gather = dp_sync_s(ctx, costs)
        bwd = sum(x.bwd_s + x.recompute_s for x in costs)
        fwd = sum(x.fwd_s for x in costs)
        hidden_reduce = (bwd + slack) if opts.overlap_grad_reduce else slack
        hidden_gather = fwd if opts.overlap_param_gather else 0.0
        exposed = max(exposed, max(0.0, reduce - hidden_reduce) + max(0.0, gather - hidden_gather))
        slack += bwd
    # Optimizer step: memory-bound Adam over the parameters this GPU updates.
    optimizer = 0.0
    hbm = ctx.cluster.gpu.hbm_bandwidth_gbytes_per_s * 1e9 * HBM_EFFICIENCY
    for costs in stage_costs:
        owned = sum(x.dense_params for x in costs) / (ctx.shard_degree if c.zero_stage >= 1 else 1)
        owned += sum(x.expert_params for x in costs) / (
            max(ctx.shard_degree // c.ep, 1) if c.zero_stage >= 1 else 1)
        optimizer = max(optimizer, owned * OPTIMIZER_BYTES_PER_PARAM / hbm)
    return StepBreakdown(pipe, bubble, exposed, optimizer, embedding_sync_s(ctx))


def embedding_sync_s(ctx: CostContext) -> float:
    """Tied embeddings: first and last stage all-reduce the word-embedding gradient."""
    c = ctx.config
    if not (ctx.model.tied_embeddings and c.pp > 1):
        return 0.0
    size = ctx.model.vocab * ctx.model.hidden / c.tp * ctx.options.state_bytes.grad_reduce_bytes
    return comm.all_reduce_s(size, 2, ctx.links.pp)


@dataclass(frozen=True)
class StageResult:
    index: int
    layers: tuple[int, ...]
    memory: MemoryBreakdown
    time_s: float  # per micro-batch
    compute_s: float
    comm_s: float


@dataclass(frozen=True)
class Evaluation:
    model: ModelGraph
    cluster: Cluster
    config: ParallelConfig
    placement: LayerPlacement
    options: RuntimeOptions
    stages: tuple[StageResult, ...]
    breakdown: StepBreakdown
    model_flops: float  # per step, no recomputation (PaLM App. B convention, causal attention halved)
    hw_flops: float  # per step, recomputation included

    @property
    def step_time_s(self) -> float:
        return self.breakdown.step_time_s

    @property
    def tokens_per_s(self) -> float:
        return self.config.global_batch * self.config.seq_len / self.step_time_s

    @property
    def model_tflops_per_gpu(self) -> float:
        return self.model_flops / self.step_time_s / self.cluster.num_gpus / 1e12

    @property
    def hw_tflops_per_gpu(self) -> float:
        return self.hw_flops / self.step_time_s / self.cluster.num_gpus / 1e12

    @property
    def mfu(self) -> float:
        return self.model_tflops_per_gpu / self.cluster.gpu.peak_tflops[self.config.dtype]

    @property
    def peak_memory_bytes(self) -> float:
        return max(s.memory.total for s in self.stages)

    @property
    def fits(self) -> bool:
        return self.peak_memory_bytes <= self.cluster.memory_bytes_per_gpu


def model_flops_per_step(model: ModelGraph, config: ParallelConfig, kernel: str = "flash") -> float:
    """Training FLOPs of one step without recomputation: 3 x forward, GEMMs at tp = 1."""
    shard = Shard(1, config.seq_len)
    per_sequence = 0.0
    for cls in model.layer_classes():
        layer = cls.layer
        flops = sum(g.flops for g in layer_gemms(layer, shard))
        if layer.attention is not None:
            flops += attention_core_flops(layer.attention, shard, "flash")
        per_sequence += flops * cls.count
    return 3 * per_sequence * config.global_batch


def evaluate(model: ModelGraph, cluster: Cluster, config: ParallelConfig,
             placement: LayerPlacement | None = None,
             options: RuntimeOptions = RuntimeOptions()) -> Evaluation:
    """Predict step time and per-GPU memory of one configuration (validated first)."""
    from planner.config import default_placement

    config.validate(model, cluster)
    if placement is None:
        placement = default_placement(model, config)
    ctx = make_context(model, cluster, config, options)
    stage_layers = [placement.layers_of_stage(s) for s in range(config.pp)]
    cache: dict = {}  # identical layers (same signature) cost the same: compute each once

    def cost(i: int) -> LayerCost:
        key = (model.layers[i].signature, placement.recompute[i])
        if key not in cache:
            cache[key] = layer_cost(ctx, model.layers[i], placement.recompute[i])
        return cache[key]

    stage_costs = [[cost(i) for i in layers] for layers in stage_layers]
    times = [stage_time(ctx, costs) for costs in stage_costs]
    stages = tuple(
        StageResult(index=s, layers=tuple(stage_layers[s]),
                    memory=stage_memory(ctx, s, stage_costs[s]), time_s=times[s],
                    compute_s=sum(x.fwd_s + x.bwd_s + x.recompute_s for x in stage_costs[s]),
                    comm_s=times[s] - sum(x.fwd_s + x.bwd_s + x.recompute_s for x in stage_costs[s]))
        for s in range(config.pp))
    breakdown = step_time(ctx, stage_costs, times)
    m = config.num_micro_batches
    hw = sum(x.hw_flops for costs in stage_costs for x in costs) * m * config.dp * config.tp * config.cp
    return Evaluation(model, cluster, config, placement, options, stages, breakdown,
                      model_flops_per_step(model, config), hw)
