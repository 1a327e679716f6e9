"""Cost terms: the one place a cost formula of a configuration lives.

Consumes a :class:`~planner.cost.context.CostContext` (model, cluster, config, runtime options);
produces, once per (layer class, :class:`~planner.strategy.LayerOption`, mesh, workload), a
:class:`LayerTerms` record, and once per configuration a :class:`ConfigTerms` record. Every
quantity of a pipeline stage is a sum of its layers' terms, a maximum of them, or a configuration
constant, so the three consumers build from these records and nothing else:

* :func:`stage_memory`, :func:`stage_time` and :func:`step_time` below (what
  :func:`planner.cost.model.evaluate` reports) add them up in floats;
* the CP-SAT builder (:mod:`planner.solve.inner`) multiplies each by the integer count of blocks
  with that option on a stage (every term is linear in those counts);
* the search's bounds (:mod:`planner.solve.bounds`) take sums and minima over options.

How a stage is made of terms (``S`` = the stage's layers, ``l`` a layer, ``C`` the config terms):

* memory = params + grads + optimizer: ``sum_S state bytes``; activations:
  ``C.in_flight[stage] * sum_S act_stored + max_S act_working``; buffers:
  ``C.buffer_bytes + max_S gather_buffer_bytes``; reserve:
  ``C.reserve_bytes + C.allocator_overhead * (activations + buffers)``.
* time per micro-batch = ``sum_S time_s + C.boundary_s + C.micro_batch_overhead_s`` plus, when
  ``C.per_micro_batch_sync`` (ZeRO-2/3, FSDP), the exposed per-phase traffic: the forward
  all-gathers hide behind the forward only, the backward all-gathers and reduce-scatters behind
  the backward and recomputation only, and the first gather and last reduce-scatter (one layer's,
  ``max_S zero_edge_s``) behind nothing (PyTorch FSDP notes: prefetching overlaps the next
  layer's collective with the current layer's compute)::

      fwd = sum_S zero_fwd_traffic_s + the forward gather's intercept
      bwd = sum_S zero_traffic_s + intercepts - fwd
      e = edge + (fwd - sum_S fwd_s)^+ + (bwd - sum_S (bwd_s + recompute_s))^+
      time += e + C.comm_slowdown * (fwd + bwd - e)

  (the hidden traffic still slows compute: NCCL kernels take SMs and HBM bandwidth).
* data-parallel sync of a stage: reduce = ``sum_S dp_reduce_s`` + intercept, gather =
  ``sum_S dp_gather_s`` + intercept; exposed ``e = (reduce - hidden)^+ + (gather - fwd)^+`` where
  hidden is the stage's backward (with overlap) plus the backward of earlier stages; the stage
  costs ``e + C.comm_slowdown * (reduce + gather - e)``.
* step = pipeline(stage times) + max over stages of the exposed sync + max over stages of
  ``sum_S optimizer_s`` + ``C.embedding_sync_s``.

Collective times are affine in their volume (alpha-beta, :mod:`planner.cost.comm`): a layer's
term is the slope times its volume; the latency intercept is a configuration term charged once
per stage that moves anything over that group (dense parameters: every stage; routed experts:
stages holding an expert).

To add a term: a field here, its value in :func:`layer_terms` or :func:`config_terms`, its
place in the stage formulas above and in :mod:`planner.solve.inner` (the equality test in
``tests/test_cost_terms.py`` fails until both agree, and the mutation test until the ILP uses it).
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import lru_cache
from typing import Sequence

from planner.config import ParallelConfig, RuntimeOptions
from planner.cost import comm, moe, offload
from planner.cost.compute import KERNEL_LAUNCH_S, Shard, hbm_bytes_per_s, layer_compute
from planner.cost.context import CostContext
from planner.cost.memory import (ACT_BYTES, ModelStates, in_flight_micro_batches,
                                 layer_activation_bytes, layer_params_on_gpu, zero_state_bytes)
from planner.cost.pipeline import bubble_pieces, pipeline_time_s
from planner.cost.pipeline_sim import uneven_chunk_excess
from planner.hardware import GIB, Gpu
from planner.hashing import cached_hash
from planner.ir import Layer, LayerKind, ModelGraph
from planner.pipeline_layout import layer_chunks, parse_layout
from planner.profiles import profile
from planner.strategy import (ACT_OFFLOAD_RECOMPUTE, LayerOption, Layout, Recompute,
                              interleaved_chunk)
from planner.topology import Link, group_link

# The PyTorch caching allocator holds freed blocks for reuse; nvidia-smi therefore reports more
# than the live tensors. Modelled as a fraction of the dynamic (activation and buffer) memory,
# per runtime: RuntimeOptions.allocator_overhead (calibrated: planner/calibration/defaults.yaml).
# The runtime reserve (CUDA context, workspaces, NCCL buffers) is a GPU property:
# planner.hardware.Gpu.reserve_gib (2.5 GiB by default).
# Adam step: read fp32 master, m, v and the gradient, write master, m, v and the 16-bit weights.
OPTIMIZER_BYTES_PER_PARAM = 4 * 4 + 3 * 4 + 2


@dataclass(frozen=True)
class Affine:
    """Seconds of a collective as ``slope_s_per_byte * bytes + intercept_s`` (bytes > 0)."""

    slope_s_per_byte: float = 0.0
    intercept_s: float = 0.0

    @staticmethod
    @lru_cache(maxsize=16384)
    def of(fn, *args) -> "Affine":
        """Slope and intercept of ``fn(size, *args)``, an alpha-beta collective of comm.py."""
        a, b = fn(1e9, *args), fn(2e9, *args)
        slope = (b - a) / 1e9
        return Affine(slope, a - slope * 1e9)

    def __add__(self, other: "Affine") -> "Affine":
        return Affine(self.slope_s_per_byte + other.slope_s_per_byte,
                      self.intercept_s + other.intercept_s)

    def scaled(self, k: float) -> "Affine":
        return Affine(k * self.slope_s_per_byte, k * self.intercept_s)


NO_COMM = Affine()


@dataclass(frozen=True)
class LayerTerms:
    """One layer with one option on one GPU, for one micro-batch (times) or held (bytes).

    Every field is additive over a stage's layers except the two marked "max" (the stage takes
    the largest). Names are the term names the equality and mutation tests iterate over.
    """

    fwd_s: float
    bwd_s: float
    recompute_s: float
    comm_s: float  # exposed TP / CP / EP communication
    act_stored_bytes: float  # kept until the micro-batch's backward (x micro-batches in flight)
    act_working_bytes: float  # max: transient extra while the layer's backward runs
    params_bytes: float  # model states after ZeRO sharding (dense and routed experts)
    grads_bytes: float
    optimizer_bytes: float
    gather_buffer_bytes: float  # max: ZeRO-3 gathered weights of the current and next layer
    zero_traffic_s: float  # ZeRO-2/3 per-micro-batch reduce-scatter (+ all-gathers), slope part
    zero_fwd_traffic_s: float  # of which the forward all-gather (ZeRO-3), slope part
    zero_edge_s: float  # max: this layer's forward gather + backward reduce-scatter, unhidden
    dp_reduce_s: float  # once per step: gradient reduction, slope part
    dp_gather_s: float  # once per step: updated-weight all-gather (ZeRO-1/2), slope part
    optimizer_s: float  # Adam step over the parameters this GPU updates
    dense_params: float  # held by one GPU before ZeRO sharding (volumes, reports)
    expert_params: float
    hw_flops: float  # executed, recomputation included
    # host memory of offloaded optimizer states (LayerOption.offload) and saved activations
    # (LayerOption.act_offload, x the most micro-batches any stage holds in flight); the
    # stage's sum is bounded by the GPU's host share, ConfigTerms.host_capacity_bytes
    host_bytes: float = 0.0
    # the weight-gradient GEMMs' share of bwd_s: the W pass zero-bubble schedules defer to fill
    # the pipeline's drain (planner/cost/pipeline.py)
    wgrad_s: float = 0.0
    # of comm_s, the MoE host floor's device idle time in the forward and in the backward
    # phase (planner.cost.moe.host_wait_split_s): the once-per-step DP sync and the ZeRO-2/3
    # per-micro-batch traffic (side streams, not behind the read-back) hide there as behind
    # compute (step_time, stage_time)
    host_wait_fwd_s: float = 0.0
    host_wait_bwd_s: float = 0.0

    @property
    def time_s(self) -> float:
        return self.fwd_s + self.bwd_s + self.recompute_s + self.comm_s

    @property
    def compute_s(self) -> float:
        return self.fwd_s + self.bwd_s + self.recompute_s

    @property
    def state_bytes(self) -> float:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes


# Terms that enter the solver's model (hw_flops and the raw parameter counts only report).
SOLVER_LAYER_TERMS = tuple(f.name for f in fields(LayerTerms)
                           if f.name not in ("dense_params", "expert_params", "hw_flops"))


@dataclass(frozen=True)
class ConfigTerms:
    """The terms of one configuration that no per-layer decision changes."""

    pp: int
    num_micro_batches: int
    virtual_stages: int
    in_flight: tuple[float, ...]  # micro-batches of stored activations held, per stage
    capacity_bytes: float
    reserve_bytes: float  # runtime context and workspaces (Gpu.reserve_gib)
    allocator_overhead: float
    buffer_bytes: float  # stage-boundary send/receive, SP gather, ZeRO buckets
    boundary_s: float  # per micro-batch: PP send/receive of every model chunk
    per_micro_batch_sync: bool  # ZeRO-2/3 reduce (and gather) every micro-batch
    zero_reduce_dense: Affine  # per micro-batch (ZeRO-2/3), per gradient byte
    zero_reduce_expert: Affine
    zero_gather_dense: Affine  # per micro-batch (ZeRO-3, forward and backward), per weight byte
    zero_gather_expert: Affine
    # of which the forward's (half of it; more with ZeRO++ hpZ, hpz_gathers; the experts': half)
    zero_gather_fwd_dense: Affine
    dp_reduce_dense: Affine  # once-per-step gradient reduction
    dp_reduce_expert: Affine
    dp_gather_dense: Affine  # once-per-step weight gather
    dp_gather_expert: Affine
    overlap_grad_reduce: bool
    overlap_param_gather: bool
    embedding_sync_s: float  # tied embeddings: gradient all-reduce of first and last stage
    comm_slowdown: float = 0.0  # compute slowdown per second of overlapped NCCL traffic
    micro_batch_overhead_s: float = 0.0  # fixed host / launch seconds per micro-batch per stage
    host_capacity_bytes: float = float("inf")  # host memory per GPU (Cluster.cpu_memory)
    # a zero-bubble schedule's fill/drain pieces (x, y, z): x (sum t - max t) + y sum b +
    # z sum w (planner.cost.pipeline.bubble_pieces); () for 1F1B and interleaved 1F1B
    bubble_pieces: tuple[tuple[float, float, float], ...] = ()
    # several chunks per rank: the schedule and the chunks' relative work (model order), from
    # which the operation order's excess over the closed form comes (chunk_weights,
    # planner.cost.pipeline_sim.uneven_chunk_excess); () with one chunk per rank
    pipeline_schedule: str = ""
    chunk_weights: tuple[float, ...] = ()
    head_stage: int = -1  # the rank of the last model chunk (-1: the last rank; V: rank 0)
    # the step's pipeline schedule runs (ParallelConfig.schedule_calls): num_micro_batches and
    # in_flight are one run's; step_time charges each run's pipeline and data-parallel sync
    schedule_calls: int = 1



# Configuration terms the solver's model reads (the mutation test drops each in turn).
SOLVER_CONFIG_TERMS = ("reserve_bytes", "allocator_overhead", "buffer_bytes", "boundary_s",
                       "zero_reduce_dense", "zero_reduce_expert", "zero_gather_dense",
                       "zero_gather_expert", "zero_gather_fwd_dense",
                       "dp_reduce_dense",
                       "dp_reduce_expert", "dp_gather_dense", "dp_gather_expert",
                       "embedding_sync_s", "in_flight", "comm_slowdown",
                       "micro_batch_overhead_s", "bubble_pieces", "chunk_weights")


def config_terms(ctx: CostContext) -> ConfigTerms:
    """The configuration's terms (computed once per context)."""
    return _config_terms(ctx)


@lru_cache(maxsize=4096)
def _config_terms(ctx: CostContext) -> ConfigTerms:
    c, mesh, opts = ctx.config, ctx.mesh, ctx.options
    zero = c.zero_stage
    state = opts.state_bytes(zero)
    n, n_expert = mesh.shard_degree, mesh.expert_shard_degree
    hidden_bytes = ctx.shard.tokens * ctx.model.hidden * ACT_BYTES
    buffers = 0.0
    if c.pp > 1:
        buffers += 2 * hidden_bytes  # send and receive buffers of the stage boundary
    if c.sp:
        buffers += hidden_bytes  # all-gathered sequence-parallel input of one GEMM
    if zero >= 1 and n > 1:
        buffers += state.bucket_bytes
    boundary_s = 0.0
    if c.pp > 1:
        # forward activation out, backward gradient out, once per model chunk. Split over the
        # tensor group with SP, or by the runtime's scatter/gather (Narayanan §4.1: each rank
        # sends 1/tp across nodes, the receiver all-gathers it over the tensor group's link)
        split = c.tp > 1 and (c.sp or profile(opts.profile).pipe_partitioned)
        one = comm.p2p_s(hidden_bytes / (c.tp if split else 1), ctx.links.pp)
        if split and not c.sp:
            one += comm.all_gather_s(hidden_bytes, c.tp, ctx.links.tp)
        boundary_s = 2 * c.virtual_stages * one
    per_mb = zero >= 2 and n > 1 and not pp_keeps_unsharded(ctx)
    zr_dense, zr_expert, zg_dense, zg_expert, red_dense, red_expert, gat_dense, gat_expert = \
        dp_collectives(zero, n, n_expert, ctx.links.dp, ctx.links.edp or ctx.links.dp, per_mb,
                      mesh.replicas, ctx.links.replicate, state.reduce_all)
    zg_fwd_dense = zg_dense.scaled(0.5)
    if c.hpz and per_mb:
        zg_dense, zg_fwd_dense = hpz_gathers(
            n, ctx.links.dp, c.hpz, group_link(ctx.cluster, c.hpz, mesh.stride("shard")),
            c.num_micro_batches)
    spec = c.schedule_spec
    return ConfigTerms(
        pp=c.pp, num_micro_batches=c.micro_batches_per_call, virtual_stages=c.virtual_stages,
        in_flight=_in_flight(c.pp, c.micro_batches_per_call, c.virtual_stages,
                             c.pipeline_schedule),
        schedule_calls=c.schedule_calls,
        capacity_bytes=ctx.cluster.memory_bytes_per_gpu,
        reserve_bytes=ctx.cluster.gpu.reserve_gib * GIB,
        allocator_overhead=opts.allocator_overhead, buffer_bytes=buffers, boundary_s=boundary_s,
        per_micro_batch_sync=per_mb, zero_reduce_dense=zr_dense, zero_reduce_expert=zr_expert,
        zero_gather_dense=zg_dense, zero_gather_expert=zg_expert,
        zero_gather_fwd_dense=zg_fwd_dense,
        dp_reduce_dense=red_dense, dp_reduce_expert=red_expert, dp_gather_dense=gat_dense,
        dp_gather_expert=gat_expert, overlap_grad_reduce=opts.overlap_grad_reduce,
        overlap_param_gather=opts.overlap_param_gather, embedding_sync_s=embedding_sync_s(ctx),
        comm_slowdown=opts.comm_slowdown, micro_batch_overhead_s=opts.micro_batch_overhead_s,
        host_capacity_bytes=(ctx.cluster.cpu_memory.capacity_bytes if ctx.cluster.cpu_memory is not None
                             else float("inf")),
        bubble_pieces=bubble_pieces(spec, c.pp), pipeline_schedule=c.schedule,
        chunk_weights=(chunk_weights(ctx.model, c.pp * c.virtual_stages, c.pipeline_layout)
                       if c.pp > 1 and c.virtual_stages > 1 else ()),
        head_stage=0 if c.pp > 1 and spec.placement == "v" else -1)


@lru_cache(maxsize=1024)
def chunk_weights(model: ModelGraph, chunks: int, layout: str = "") -> tuple[float, ...]:
    """Each model chunk's share of the work, in mean blocks, as the blocks split into
    ``chunks`` (:func:`planner.strategy.interleaved_chunk`, or as an explicit pipeline
    ``layout`` writes them, planner.pipeline_layout.layer_chunks; the layers before the first
    block with chunk 0, those after the last with the last): a block weighs its active parameters, a
    head its vocabulary x hidden output projection, other layers nothing (the GEMM flops per
    token; attention's quadratic part is left out, which makes the head's chunk heavier, the
    conservative side). Rounded to 1/16."""
    blocks = [i for i, layer in enumerate(model.layers) if layer.kind is LayerKind.BLOCK]
    if not blocks or len(blocks) < chunks:
        return ()
    mean = sum(model.layers[i].active_params for i in blocks) / len(blocks) or 1.0
    out = [0.0] * chunks
    index = {layer: k for k, layer in enumerate(blocks)}
    written = layer_chunks(model, parse_layout(layout)) if layout else None
    for i, layer in enumerate(model.layers):
        if layer.kind is LayerKind.BLOCK:
            work = layer.active_params
            chunk = interleaved_chunk(index[i], len(blocks), chunks) if written is None else \
                written[i]
        else:
            chunk = (0 if i < blocks[0] else chunks - 1) if written is None else written[i]
            work = layer.vocab * layer.hidden if layer.kind is LayerKind.HEAD else 0
        out[chunk] += work / mean
    return tuple(round(x * 16) / 16 for x in out)


def dp_collectives(zero: int, n: int, n_expert: int, link: Link, expert_link: Link,
                   per_mb: bool, replicas: int = 1,
                   replica_link: Link | None = None,
                   reduce_all: bool = False) -> tuple[Affine, ...]:
    """The data-parallel collectives of ZeRO stage ``zero`` over ``n`` dense ranks on ``link``
    and ``n_expert`` routed-expert ranks on ``expert_link``: per-micro-batch reduce (dense,
    expert) and gather (dense, expert), once-per-step reduce and gather (dense, expert).

    Hybrid sharding (``replicas`` > 1 shard groups of ``n`` ranks, HSDP): the gathers and
    reduce-scatters stay inside the shard group; each rank's reduced 1/n of the gradient is
    then all-reduced with the ranks holding the same shard in the other groups
    (``replica_link``), per micro-batch where the reduce-scatter is (ZeRO-2/3), once per step
    otherwise (PyTorch FSDP HYBRID_SHARD: reduce-scatter then all-reduce; torchtitan's
    dp_replicate x dp_shard mesh; Megatron-Core's distributed-optimizer instances reduce
    inside an instance and all-reduce across instances).

    ``reduce_all``: the layout's once-per-step ZeRO-1 reduction is an all-reduce of the whole
    gradient before the partition's update and the weights' all-gather
    (:attr:`planner.config.StateBytes.reduce_all`, DeepSpeed's BF16_Optimizer)."""
    def coll(fn, size: int) -> Affine:
        return Affine.of(fn, size, link) if size > 1 else NO_COMM

    def ecoll(fn, size: int) -> Affine:  # routed experts: over the expert data parallel group
        return Affine.of(fn, size, expert_link) if size > 1 else NO_COMM

    # Sharded gradients cannot accumulate locally: ZeRO-2 reduce-scatters them every
    # micro-batch (DeepSpeed stage_1_and_2.py reduces in each backward), ZeRO-3 / FSDP also
    # gathers the weights for forward and backward (ZeRO §7: 1.5x the DP volume).
    zr_dense = zr_expert = zg_dense = zg_expert = NO_COMM
    if per_mb:
        zr_dense = coll(comm.reduce_scatter_s, n)
        zr_expert = ecoll(comm.reduce_scatter_s, n_expert)
        if zero >= 3:
            zg_dense = coll(comm.all_gather_s, n).scaled(2)
            zg_expert = ecoll(comm.all_gather_s, n_expert).scaled(2)
    # Once per step: ZeRO-0 all-reduces the gradients, ZeRO-1 reduce-scatters them and
    # all-gathers the updated weights; ZeRO-2 reduced per micro-batch and still gathers once;
    # ZeRO-3 does everything per micro-batch.
    # (ZeRO-3 without per-micro-batch sync: FSDP under PP, one gather and one reduce per step)
    red_dense = red_expert = gat_dense = gat_expert = NO_COMM
    if zero == 0:
        red_dense, red_expert = coll(comm.all_reduce_s, n), ecoll(comm.all_reduce_s, n_expert)
    elif zero < 3 or not per_mb:
        reduce = comm.all_reduce_s if reduce_all and zero == 1 else comm.reduce_scatter_s
        if not per_mb:
            red_dense = coll(reduce, n)
        if not (zero == 2 and n > 1):
            red_expert = ecoll(reduce, n_expert)
        gat_dense, gat_expert = coll(comm.all_gather_s, n), ecoll(comm.all_gather_s, n_expert)
    if replicas > 1 and replica_link is not None:
        across = Affine.of(comm.all_reduce_s, replicas, replica_link)
        across = Affine(across.slope_s_per_byte / n, across.intercept_s)  # 1/n of the bytes
        if per_mb:
            zr_dense = zr_dense + across
        else:
            red_dense = red_dense + across
    return zr_dense, zr_expert, zg_dense, zg_expert, red_dense, red_expert, gat_dense, gat_expert


def hpz_gathers(n: int, link: Link, hpz: int, hpz_link: Link,
                num_micro_batches: int) -> tuple[Affine, Affine]:
    """ZeRO++ hpZ's weight all-gathers per micro-batch: (forward and backward, the forward's).

    ZeRO-3 with a secondary partition (Wang et al., "ZeRO++", 2023, §3.2): after a layer's
    forward each rank keeps the 1/hpz shard of its gathered 16-bit weights for its group of
    ``hpz`` consecutive ranks (one node), and gathers from it, over ``hpz_link``, instead of from
    the primary 1/n shard over all ``n`` ranks (``link``). DeepSpeed drops the secondary copy
    only after the optimizer step (``stage3.py`` ``_post_step`` ->
    ``invalidate_secondary_tensor``; ``partition_parameters.py`` gathers over the secondary
    group whenever ``ds_secondary_tensor`` is set), so every gather of a step but its first
    forward's is the intra-node one. Per micro-batch: two hpz-rank gathers, plus the first
    forward's excess of the n-rank gather over the hpz-rank one spread over the step's
    ``num_micro_batches`` forwards (per-phase exposure is taken per micro-batch; the spread is
    exact when the forward hides all of it or none, and under-counts the first forward's
    exposure in between). The gradient reduce-scatter stays over all n ranks."""
    primary = Affine.of(comm.all_gather_s, n, link)
    secondary = Affine.of(comm.all_gather_s, hpz, hpz_link)
    excess = Affine(max(0.0, primary.slope_s_per_byte - secondary.slope_s_per_byte),
                    max(0.0, primary.intercept_s - secondary.intercept_s))
    forward = secondary + excess.scaled(1.0 / num_micro_batches)
    return forward + secondary, forward


# fp32 unsharded gradient accumulation of FSDP2 under PP (MixedPrecisionPolicy reduce_dtype)
UNSHARDED_GRAD_BYTES = 4.0


def pp_keeps_unsharded(ctx: CostContext) -> bool:
    """FSDP under PP that keeps weights gathered and gradients unsharded over the step
    (planner.profiles.RuntimeProfile.pp_keeps_unsharded)."""
    c = ctx.config
    return keeps_unsharded(c.zero_stage, c.pp, ctx.options.profile)


def keeps_unsharded(zero_stage: int, pp: int, profile_name: str) -> bool:
    """Whether runtime ``profile_name`` runs ZeRO ``zero_stage`` under ``pp`` stages with the
    weights kept gathered over a schedule run (the cost model's reading; the torchtitan export
    writes the reshard policy that runs it). The runtime's rule, dense or MoE: torchtitan
    (parallelize.py, the Llama 4 / DeepSeek-V3 apply_fsdp too) and NeMo AutoModel
    (NVIDIA-NeMo/Automodel @89e3a9fdd components/moe/parallelizer.py) pass
    ``reshard_after_forward=not pp_enabled`` to fully_shard; whether the kept weights fit is
    the memory model's to decide."""
    return zero_stage >= 3 and pp > 1 and profile(profile_name).pp_keeps_unsharded


@dataclass(frozen=True)
class LayoutView:
    """What a layer sees under a :class:`~planner.strategy.Layout`: its tensor degree, the
    sequences one tensor group processes per micro-batch, its ZeRO / gradient group and links."""

    tp: int
    micro_batch: int
    shard: Shard
    tp_link: Link
    dp_shard: int  # ranks holding the same weight shard (ZeRO sharding, gradient reduction)
    dp_link: Link


def layout_view(ctx: CostContext, layout: Layout) -> LayoutView | None:
    """The layer's view under ``layout``, or None when the layout does not divide this mesh
    (its tensor degree must divide tp x dp, and a tensor group's share of the stage's
    ``dp x micro_batch`` sequences per micro-batch must be whole)."""
    return _layout_view(ctx, layout)


@lru_cache(maxsize=4096)
def _layout_view(ctx: CostContext, layout: Layout) -> LayoutView | None:
    c, mesh = ctx.config, ctx.mesh
    if layout is Layout.MESH:
        return LayoutView(c.tp, c.micro_batch, ctx.shard, ctx.links.tp, mesh.shard_degree,
                          ctx.links.dp)
    t = layout.tensor_degree(c.tp, c.dp, ctx.cluster.gpus_per_node)
    if mesh.replicas > 1 or c.hpz:  # a per-layer layout refolds tp x dp: not with hybrid
        return None  # sharding (HSDP, hpZ's secondary groups)
    if t is None or (c.tp * c.dp) % t or (c.micro_batch * t) % c.tp:
        return None
    if t > c.tp and c.cp > 1:
        return None  # the tp ranks after a TP group are its CP peers (another sequence chunk)
    mb = c.micro_batch * t // c.tp
    n = c.tp * c.dp // t * c.cp  # tensor groups per stage x CP ranks: the layer's data group
    # the routed experts keep the stage's expert mesh (etp x ep x edp folds the same ranks
    # whatever the attention's degree: Megatron-Core MoE parallel folding), so the shard
    # carries the mesh's etp and load factor
    shard = replace(ctx.shard, micro_batch=mb, tp=t, sp=c.sp and t > 1)
    return LayoutView(t, mb, shard, group_link(ctx.cluster, t, 1), n,
                      group_link(ctx.cluster, n, t))


def layer_tensor_degrees(ctx: CostContext | None, config: ParallelConfig,
                         options: Sequence[LayerOption]) -> list[int | None]:
    """Each layer's tensor degree under its option's layout (:func:`layout_view`); None where
    the layout does not divide the mesh. ``ctx`` None: stages on pools of other GPUs (no one
    context), where the layout's own arithmetic over the plan's tp x dp applies."""
    if all(option.layout is Layout.MESH for option in options):
        return [config.tp] * len(options)
    if ctx is None:
        return [option.layout.tensor_degree(config.tp, config.dp) for option in options]
    views = [layout_view(ctx, option.layout) for option in options]
    return [None if view is None else view.tp for view in views]


def option_valid(ctx: CostContext, layer: Layer, option: LayerOption) -> bool:
    """Whether ``option`` can run ``layer`` under this context: non-mesh layouts are for
    blocks whose heads and FFN width (a MoE block's: its shared experts' width; its routed
    experts stay on the stage's expert mesh) divide the layout's tensor degree, and for the embedding
    and head (never recomputed) whose vocabulary it divides (a vocab-parallel table; a tied
    table's two copies on the first and last stage take one layout, and their gradient
    all-reduce is costed with its shard, ``embedding_sync_s``)."""
    if (option.offload or option.act_offload) and ctx.cluster.cpu_memory is None:
        return False  # no host memory described (the cluster file's host: section)
    if option.act_offload and (layer.kind is not LayerKind.BLOCK
                               or option.recompute not in ACT_OFFLOAD_RECOMPUTE):
        return False  # blocks' saved activations only (the edges and full recompute keep little)
    if option.layout is Layout.MESH:
        return True
    view = layout_view(ctx, option.layout)
    if view is None:
        return False
    if option.layout is Layout.NODE and layer.kind is LayerKind.BLOCK:
        return False  # a node-wide vocab-parallel table; blocks take the mesh's degree or less
    if layer.kind is not LayerKind.BLOCK:
        if option.recompute is not Recompute.NONE:
            return False
        return not layer.vocab or layer.vocab % view.tp == 0
    mlp = layer.mlp
    if mlp is not None and (mlp.shared_ffn_hidden % view.tp if mlp.is_moe
                            else mlp.ffn_hidden % view.tp):
        return False  # a MoE block's layout splits its attention and shared experts
    att = layer.attention
    return att is None or att.num_heads % view.tp == 0


@lru_cache(maxsize=4096)
def _layout_config_terms(ctx: CostContext, layout: Layout) -> ConfigTerms:
    """The configuration's terms as a layer of ``layout`` sees them: its weights are reduced
    and gathered over its own data group, so the slopes are that group's (the latency
    intercepts stay the configuration's, charged once per stage)."""
    t, view = _config_terms(ctx), layout_view(ctx, layout)
    zr, _, zg, _, red, _, gat, _ = dp_collectives(
        ctx.config.zero_stage, view.dp_shard, ctx.mesh.expert_shard_degree, view.dp_link,
        view.dp_link, t.per_micro_batch_sync,
        reduce_all=ctx.options.state_bytes(ctx.config.zero_stage).reduce_all)
    return replace(t, zero_reduce_dense=Affine(zr.slope_s_per_byte,
                                               t.zero_reduce_dense.intercept_s),
                   zero_gather_dense=Affine(zg.slope_s_per_byte, t.zero_gather_dense.intercept_s),
                   zero_gather_fwd_dense=Affine(zg.slope_s_per_byte / 2,
                                                t.zero_gather_fwd_dense.intercept_s),
                   dp_reduce_dense=Affine(red.slope_s_per_byte, t.dp_reduce_dense.intercept_s),
                   dp_gather_dense=Affine(gat.slope_s_per_byte, t.dp_gather_dense.intercept_s))


@dataclass(frozen=True)
class ReshardCollective:
    """The collective of one layout change (see :func:`reshard_s`): ``kind`` "all-gather"
    (``size_bytes`` the merged group's whole activation, gathered over ``ranks``) or
    "all-to-all" (``size_bytes`` what each rank holds, run forward and backward)."""

    kind: str
    size_bytes: float
    ranks: int
    link: Link

    def seconds(self) -> float:
        if self.kind == "all-to-all":
            return 2 * comm.all_to_all_s(self.size_bytes, self.ranks, self.link)
        return comm.all_gather_s(self.size_bytes, self.ranks, self.link)


def reshard_collective(ctx: CostContext, hidden: int, before: Layout, after: Layout,
                       seq_len: int = 0) -> ReshardCollective | None:
    """The collective :func:`reshard_s` charges for the layout change ``before`` -> ``after``
    (None when the tensor degree does not change)."""
    if before is after:
        return None
    a, b = layout_view(ctx, before), layout_view(ctx, after)
    if a is None or b is None or a.tp == b.tp:
        return None
    small, big = (a, b) if a.tp < b.tp else (b, a)
    k = big.tp // small.tp
    link = group_link(ctx.cluster, k, small.tp)  # k ranks, one from each merging group
    tokens = big.shard.tokens if not seq_len else big.micro_batch * seq_len // big.shard.cp
    gathered = tokens * hidden * ACT_BYTES  # one merged group's activation
    if small.shard.sp or big.shard.sp:
        return ReshardCollective("all-to-all", gathered / big.tp, k, link)
    return ReshardCollective("all-gather", gathered, k, link)


def reshard_s(ctx: CostContext, hidden: int, before: Layout, after: Layout,
              seq_len: int = 0) -> float:
    """Seconds per micro-batch (forward + backward) to move the activation from a layer of
    layout ``before`` to the next layer, of layout ``after``.

    Between layers the activation is split along the batch over the tensor groups and
    replicated inside one (with sequence parallelism: split along the sequence inside it). When
    the tensor degree grows k-fold, k neighbouring groups merge: the forward pass all-gathers
    the batch over those k ranks and the backward pass only slices the gradient; when it
    shrinks, the forward slices and the backward all-gathers the gradient. With sequence
    parallelism each rank's shard changes from (batch/k, seq) to (batch, seq/k): an all-to-all,
    forward and backward. These are the resharding collectives of the sharding-spec changes
    S(batch) -> R and S(seq) -> S(batch) (Alpa, Zheng et al. OSDI 2022, §4.1 and Table 2;
    GSPMD, Xu et al. 2021; the edge costs of OpenXLA's auto-sharding pass). ``seq_len``: the
    later layer's tokens per sequence when they are not the workload's (a vision encoder)."""
    collective = reshard_collective(ctx, hidden, before, after, seq_len)
    return 0.0 if collective is None else collective.seconds()


def boundary_reshard_s(ctx: CostContext, layers: Sequence[Layer],
                       options: Sequence[LayerOption], stage: Sequence[int],
                       pp: int) -> list[float]:
    """Per stage, the resharding seconds per micro-batch of the layout changes between
    consecutive layers, charged to the stage of the later layer."""
    out = [0.0] * pp
    for i in range(1, len(layers)):
        if options[i].layout is not options[i - 1].layout:
            out[stage[i]] += reshard_s(ctx, layers[i].hidden, options[i - 1].layout,
                                       options[i].layout, layers[i].seq_len)
    return out


@lru_cache(maxsize=4096)
def _in_flight(pp: int, num_micro_batches: int, virtual_stages: int,
               schedule: str = "") -> tuple[float, ...]:
    return tuple(in_flight_micro_batches(i, pp, num_micro_batches, virtual_stages, schedule)
                 for i in range(pp))


def embedding_sync_s(ctx: CostContext, layout: Layout = Layout.MESH) -> float:
    """Tied embeddings on two or more stages: the first and the last stage each hold the table
    and all-reduce its gradient (Megatron-LM's embedding group). Under a layout of tensor
    degree t' every rank holds a V x h / t' shard and all-reduces it with the rank of the same
    position on the other stage, which holds the same shard: two ranks over the pipeline
    link."""
    c = ctx.config
    if not (ctx.model.tied_embeddings and c.pp > 1) or c.schedule_spec.placement == "v":
        return 0.0  # (a V placement keeps the embedding and the head on rank 0)
    view = layout_view(ctx, layout)
    tp = view.tp if view is not None else c.tp
    size = (ctx.model.vocab * ctx.model.hidden / tp
            * ctx.options.state_bytes(c.zero_stage).grad_reduce_bytes)
    return comm.all_reduce_s(size, 2, ctx.links.pp)


def tied_config_terms(ctx: CostContext, embedding_layout: Layout) -> ConfigTerms:
    """The configuration's terms with the tied table's gradient sync under the layout the
    embedding (and so the head) takes."""
    t = config_terms(ctx)
    if not t.embedding_sync_s or embedding_layout is Layout.MESH:
        return t
    return replace(t, embedding_sync_s=embedding_sync_s(ctx, embedding_layout))


def embedding_layout(layers: Sequence[Layer], options: Sequence[LayerOption]) -> Layout:
    """The layout of the model's embedding in a placement (the mesh's when there is none)."""
    for layer, option in zip(layers, options):
        if layer.kind is LayerKind.EMBEDDING:
            return option.layout
    return Layout.MESH


def _tp_syncs(layer: Layer, sp: bool = True) -> tuple[int, int]:
    """TP synchronisation points of a layer (forward, backward): Megatron's f/g operators.

    A MoE block under sequence parallelism has the attention's and, with shared experts, their
    dense MLP's: Megatron-Core's ``MoELayer`` routes and dispatches the sequence shard itself
    (``moe_layer.py``; it requires sequence parallelism with TP), and the routed experts' TP
    traffic is the dispatcher's gather and scatter over the expert tensor group
    (``token_dispatcher.py`` ``gather_from_sequence_parallel_region`` over the ETP group after
    the all-to-all; none at etp 1), costed with the dispatch (planner.cost.moe
    ``dispatch_combine_s``); ``SharedExpertMLP`` is a TP-split MLP on the same sequence shard
    (all-gather in, reduce-scatter out)."""
    if layer.kind is LayerKind.BLOCK:
        mlp = layer.mlp
        n = 2 + (1 if layer.attention is not None and layer.attention.cross_attention else 0)
        if sp and mlp is not None and mlp.is_moe and not mlp.shared_ffn_hidden:
            n -= 1
        return n, n
    if layer.kind is LayerKind.MTP:  # its block, plus the eh_proj output gathered
        return 3, 3
    if layer.kind is LayerKind.EMBEDDING:
        return 1, 0  # vocab-parallel embedding: all-reduce (reduce-scatter with SP) of the output
    return (1 if layer.vocab else 0), 1  # LM head: gather input (SP), reduce input gradient


def conv_tp_s(layer: Layer, micro_batch: int, tp: int, link: Link) -> tuple[float, float]:
    """(forward, backward) seconds of a convolutional block's channel-parallel collectives:
    each convolution computes its share of the output channels from the whole input, so the
    forward all-gathers every output and the backward all-reduces every input gradient (each
    rank's weight shard contributes a partial sum), as a column-parallel linear without a
    row-parallel partner (Megatron-LM §3)."""
    if tp <= 1:
        return 0.0, 0.0
    fwd = sum(comm.all_gather_s(micro_batch * c.out_channels * c.out_pixels * ACT_BYTES, tp,
                                link) for c in layer.convs)
    bwd = sum(comm.all_reduce_s(micro_batch * c.in_channels * c.in_pixels * ACT_BYTES, tp, link)
              for c in layer.convs)
    return fwd, bwd


def layer_terms(ctx: CostContext, layer: Layer, option: LayerOption) -> LayerTerms:
    """The terms of ``layer`` run with ``option`` under the context's mesh and workload."""
    return _layer_terms(ctx, _unnamed(layer), option)


@lru_cache(maxsize=65536)
def _unnamed(layer: Layer) -> Layer:
    """Cost does not depend on a layer's name: identical layers in different places (gpt-oss's
    alternating sliding / full attention blocks) share one cache entry."""
    return replace(layer, name="") if layer.name else layer


@dataclass(frozen=True)
class WorkView:
    """What a layer's compute, tensor / context / expert-parallel communication and activation
    bytes read of a configuration under one layout (:func:`work_view`): the GPU, the runtime
    options, the layer's shard (its micro-batch, tensor degree, sequence parallelism, context
    and expert degrees, precision, sequence) and the links of its tensor, context and expert
    groups. Not the pipeline degree, the data-parallel degree, ZeRO, the virtual stages or
    the schedule: configurations that differ only in those share their layers' work
    (:func:`_layer_work` reads nothing else; ``tests/test_graph_search_speed.py`` checks every
    shared term equals a fresh one)."""

    gpu: Gpu
    options: RuntimeOptions
    shard: Shard
    etp: int  # the mesh's expert tensor degree (the routed experts keep the stage's mesh)
    tp_link: Link
    cp_link: Link
    ep_link: Link
    ep_intra: Link
    ep_inter: Link
    ep_domains: int
    etp_link: Link

    __hash__ = cached_hash  # computed once: every cached term's lookup hashes it


@lru_cache(maxsize=4096)
def work_view(ctx: CostContext, layout: Layout) -> WorkView:
    """The :class:`WorkView` of ``ctx`` under ``layout`` (which must divide the mesh)."""
    view, links = layout_view(ctx, layout), ctx.links
    return WorkView(ctx.cluster.gpu, ctx.options, view.shard, ctx.mesh.expert_tp, view.tp_link,
                    links.cp, links.ep, links.ep_intra or links.ep, links.ep_inter or links.ep,
                    links.ep_domains, links.etp or links.tp)


@dataclass(frozen=True)
class LayerWork:
    """A layer's terms that do not depend on its states' sharding (:func:`_layer_work`)."""

    fwd_s: float  # the layer's compute (no per-block host time)
    bwd_s: float
    recompute_s: float
    tp_comm_s: float  # exposed TP communication
    other_s: float  # CP ring, MoE dispatch and host floor
    act_stored_bytes: float
    act_working_bytes: float
    hw_flops: float
    wgrad_s: float
    host_wait_fwd_s: float = 0.0  # of other_s, the host floor (planner.cost.moe)
    host_wait_bwd_s: float = 0.0


def cp_ring_exposed_s(att, tokens: int, tp: int, cp: int, link: Link, compute,
                      recomputed: bool = False) -> float:
    """Seconds per micro-batch the context-parallel KV ring leaves exposed (ring attention,
    Transformer Engine ``AttnFuncWithCPAndKVP2P``, ``cp_comm_type = "p2p"``, Megatron-Core's
    default). The attention runs in ``cp`` steps, one per KV chunk; the send of step i + 1's
    chunk to the next rank overlaps step i's attention, so each of the ``cp - 1`` exchanges
    hides behind one step (1 / cp of the core) of its own pass only: the forward's KV chunks
    behind the forward's steps, the backward's KV and KV-gradient chunks (one buffer, twice the
    bytes) behind the backward's -- the backward's slack cannot absorb a forward that waits
    on its ring. Each hop is one GPU-to-GPU send (:func:`planner.cost.comm.ring_hop_s`).
    ``recomputed``: the forward runs again in the backward (full recomputation, or selective
    recomputation of the attention core) with its ring."""
    kv_bytes = tokens * max(att.num_kv_heads // tp, 1) * (att.head_dim + att.v_head_dim) * ACT_BYTES
    steps = cp - 1
    fwd = steps * max(0.0, comm.ring_hop_s(kv_bytes, link) - compute.attn_core_fwd_s / cp)
    bwd = steps * max(0.0, comm.ring_hop_s(2 * kv_bytes, link) - compute.attn_core_bwd_s / cp)
    return fwd * (2 if recomputed else 1) + bwd


def _repeats_attention_core(recompute: Recompute, modules: tuple[str, ...]) -> bool:
    """Whether ``recompute`` runs the attention core's forward again (full recomputation;
    selective recomputation with ``core_attn`` among its modules,
    planner.cost.recompute_modules)."""
    return recompute is Recompute.FULL or (recompute is Recompute.SELECTIVE
                                           and "core_attn" in modules)


@lru_cache(maxsize=65536)
def _layer_work(work: WorkView, layer: Layer, recompute: Recompute) -> LayerWork:
    """The compute, communication and activation terms of ``layer`` under ``work`` (reads
    nothing of the configuration but ``work``: shared by every configuration with the same)."""
    opts, shard = work.options, work.shard
    tp, sp = shard.tp, shard.sp
    seq_len = layer.seq_len or shard.seq_len  # a vision encoder runs on its image tokens
    if seq_len != shard.seq_len:
        shard = replace(shard, seq_len=seq_len)
    compute = layer_compute(layer, shard, work.gpu, opts)
    tokens = shard.tokens
    hidden_bytes = tokens * layer.hidden * ACT_BYTES
    # Tensor parallel collectives (not overlapped with compute unless the runtime says so).
    fwd_syncs, bwd_syncs = _tp_syncs(layer, sp)
    one = comm.tp_collective_s(hidden_bytes, tp, work.tp_link, sp)
    if tp > 1 and not sp and layer.kind is LayerKind.HEAD:
        fwd_syncs = 0  # without SP the head's input is already replicated
    tp_fwd = fwd_syncs * one
    tp_bwd = bwd_syncs * one
    if layer.convs and layer.kind is LayerKind.BLOCK and layer.attention is None \
            and layer.mlp is None:
        tp_fwd, tp_bwd = conv_tp_s(layer, shard.micro_batch, tp, work.tp_link)
    tp_total = tp_fwd + tp_bwd + (tp_fwd if recompute is Recompute.FULL else 0.0)
    # the hidden share still slows the GEMMs it overlaps (NCCL takes SMs). Runtimes hide TP
    # collectives by splitting SP's all-gather / reduce-scatter into the GEMMs (Megatron's
    # --tp-comm-overlap needs --sequence-parallel; torchtitan's async TP): none without SP
    hidden = opts.tp_comm_overlap if sp else 0.0
    tp_comm = tp_total * ((1.0 - hidden) + hidden * opts.comm_slowdown)
    other = 0.0
    mlp = layer.mlp
    moe_buffer = 0.0
    wait_fwd = wait_bwd = 0.0
    if mlp is not None and mlp.is_moe:
        # token dispatch and combine over the expert mesh, forward and backward (planner.cost.moe)
        a2a_passes = 3 if recompute is Recompute.FULL else 2
        a2a_s = moe.dispatch_combine_s(
            tokens, layer.hidden, mlp, tp, work.etp, shard.ep, ACT_BYTES, opts.moe,
            work.ep_link, work.ep_intra, work.ep_inter, work.ep_domains, work.etp_link,
            a2a_passes, work.gpu.num_sms)
        other += a2a_s
        moe_buffer = moe.dispatch_buffer_bytes(tokens, layer.hidden, mlp, tp, work.etp,
                                               ACT_BYTES, opts.moe)
    att = layer.attention
    if att is not None and shard.cp > 1:
        other += cp_ring_exposed_s(att, tokens, tp, shard.cp, work.cp_link, compute,
                                   _repeats_attention_core(recompute, opts.recompute_modules))
    if mlp is not None and mlp.is_moe:  # the layer is no faster than the host issues it
        gpu_s = compute.fwd_s + compute.bwd_s + compute.recompute_s(recompute) + tp_comm + other
        passes, launches = moe.host_passes(recompute.value)
        # the forward up to the router: what the dropless read-back waits for (planner.cost.moe)
        pre_sync_s = layer_compute(replace(layer, mlp=None), shard, work.gpu, opts).fwd_s
        # one synchronised forward pass's device time: its compute, its TP collectives and its
        # dispatch + combine (one of the a2a passes); the CP ring stays with the rest
        forward_s = compute.fwd_s + tp_fwd * ((1.0 - hidden) + hidden * opts.comm_slowdown) \
            + a2a_s / a2a_passes
        wait_fwd, wait_bwd = moe.host_wait_split_s(
            gpu_s, passes, launches * KERNEL_LAUNCH_S, opts.moe, pre_sync_s, forward_s,
            moe.pre_sync_passes(recompute.value))
        other += wait_fwd + wait_bwd
    stored, working = layer_activation_bytes(layer, shard.micro_batch, seq_len, tp, shard.cp,
                                             sp, recompute, opts.attention_kernel, opts.dropout,
                                             work.etp, opts.moe.load_factor,
                                             opts.fp8_saved_inputs and shard.dtype == "fp8",
                                             opts.recompute_modules, opts.cross_entropy)
    return LayerWork(compute.fwd_s, compute.bwd_s, compute.recompute_s(recompute),
                     tp_comm, other, stored, working + moe_buffer,
                     3 * compute.fwd_flops + compute.recompute_flops(recompute),
                     compute.gemm_wgrad_s, wait_fwd, wait_bwd)


@lru_cache(maxsize=65536)
def _layer_terms(ctx: CostContext, layer: Layer, option: LayerOption) -> LayerTerms:
    c, opts = ctx.config, ctx.options
    mesh = ctx.mesh
    view = layout_view(ctx, option.layout)  # the mesh itself, or the layer's own factoring
    if view is None:
        raise ValueError(f"layout {option.layout.value} does not divide the mesh "
                         f"tp={c.tp} dp={c.dp} micro_batch={c.micro_batch}")
    if not option_valid(ctx, layer, option):
        raise ValueError(f"option {option.name} cannot run a {layer.kind.value} layer here "
                         f"(tp={c.tp} dp={c.dp}, runtime {opts.runtime}, host memory "
                         f"{'described' if ctx.cluster.cpu_memory else 'not described'})")
    tp = view.tp
    if layer.tied_params and c.pp == 1:
        # one stage holds the embedding and the head: one tensor, one copy (the head's copy
        # of a tied table exists on the last of several stages only)
        layer = replace(layer, tied_params=0)
    work = _layer_work(work_view(ctx, option.layout), layer, option.recompute)
    stored, working = work.act_stored_bytes, work.act_working_bytes
    other = work.other_s
    dense, expert = layer_params_on_gpu(layer, tp, c.ep, mesh.expert_tp)
    zero = c.zero_stage
    state = opts.state_bytes(zero)
    n, n_expert = view.dp_shard, mesh.expert_shard_degree
    dense_states = zero_state_bytes(dense, n, zero, state)
    expert_states = zero_state_bytes(expert, n_expert, zero, state)
    if c.hpz:  # ZeRO++ hpZ: the secondary partition, 16-bit weights over hpz ranks
        dense_states = replace(dense_states,
                               params=dense_states.params + dense * state.weights / c.hpz)
    keep = pp_keeps_unsharded(ctx) and n > 1
    if keep:  # the gathered 16-bit weights and an unsharded gradient next to the shards
        held = dense + expert
        dense_states = replace(dense_states, params=dense_states.params + held * state.weights,
                               grads=dense_states.grads + held * UNSHARDED_GRAD_BYTES)
    t = _config_terms(ctx)
    if t.head_stage >= 0 and layer.kind not in (LayerKind.BLOCK, LayerKind.EMBEDDING):
        # a V placement keeps the head in the last chunk, whose backward follows its forward
        # (one micro-batch in flight, as on 1F1B's last stage); the rank's in-flight count is
        # its two chunks' average (planner.cost.pipeline), which would count the head p times
        stored /= t.in_flight[t.head_stage]
    if option.layout is not Layout.MESH:
        t = _layout_config_terms(ctx, option.layout)
    grad_dense, grad_expert = dense * state.grad_reduce_bytes, expert * state.grad_reduce_bytes
    w_dense, w_expert = dense * state.weights, expert * state.weights
    zero_reduce = (t.zero_reduce_dense.slope_s_per_byte * grad_dense
                   + t.zero_reduce_expert.slope_s_per_byte * grad_expert)
    zero_gather = (t.zero_gather_dense.slope_s_per_byte * w_dense
                   + t.zero_gather_expert.slope_s_per_byte * w_expert)  # forward + backward
    zero_traffic = zero_reduce + zero_gather
    zero_fwd = (t.zero_gather_fwd_dense.slope_s_per_byte * w_dense
                + t.zero_gather_expert.slope_s_per_byte / 2 * w_expert)
    owned = dense / (n if zero >= 1 else 1) + expert / (n_expert if zero >= 1 else 1)
    optimizer_bytes = dense_states.optimizer + expert_states.optimizer
    optimizer_s = owned * OPTIMIZER_BYTES_PER_PARAM / hbm_bytes_per_s(ctx.cluster.gpu)
    host_bytes = 0.0
    if option.offload:  # ZeRO-Offload: states on the host, Adam on its cores
        host_bytes = offload.host_bytes(owned, optimizer_bytes)
        optimizer_bytes = 0.0
        optimizer_s = offload.offload_step_s(owned, state.grad_reduce_bytes, state.weights,
                                             OPTIMIZER_BYTES_PER_PARAM, ctx.cluster.cpu_memory)
    # host time of a block that the GPU does not hide: per pass (forward, backward, recomputed
    # forward) one block's launches, hooks and checkpointing bookkeeping (calibrated per runtime)
    host = opts.block_overhead_s if layer.kind is LayerKind.BLOCK else 0.0
    recompute_s = work.recompute_s
    if option.act_offload:  # saved activations in host memory (planner/cost/offload.py)
        other += offload.activation_exposed_s(
            stored, work.fwd_s + host, work.bwd_s + host + recompute_s,
            ctx.cluster.cpu_memory, hbm_bytes_per_s(ctx.cluster.gpu))
        host_bytes += stored * max(t.in_flight)  # every in-flight micro-batch's copy (any stage)
        working += 2 * stored  # in transit: the block whose backward runs, the prefetched one
        stored = 0.0
    return LayerTerms(
        fwd_s=work.fwd_s + host, bwd_s=work.bwd_s + host,
        recompute_s=recompute_s + (host if recompute_s else 0.0),
        comm_s=work.tp_comm_s + other, act_stored_bytes=stored, act_working_bytes=working,
        params_bytes=dense_states.params + expert_states.params,
        grads_bytes=dense_states.grads + expert_states.grads,
        optimizer_bytes=optimizer_bytes,
        gather_buffer_bytes=2 * (dense + expert) * state.weights if zero >= 3 and not keep
        else 0.0,
        zero_traffic_s=zero_traffic, zero_fwd_traffic_s=zero_fwd,
        zero_edge_s=zero_fwd + zero_reduce,
        dp_reduce_s=(t.dp_reduce_dense.slope_s_per_byte * grad_dense
                     + t.dp_reduce_expert.slope_s_per_byte * grad_expert),
        dp_gather_s=(t.dp_gather_dense.slope_s_per_byte * w_dense
                     + t.dp_gather_expert.slope_s_per_byte * w_expert),
        optimizer_s=optimizer_s, dense_params=dense, expert_params=expert,
        hw_flops=work.hw_flops, host_bytes=host_bytes, wgrad_s=work.wgrad_s,
        host_wait_fwd_s=work.host_wait_fwd_s, host_wait_bwd_s=work.host_wait_bwd_s)


# -- stage and step formulas over terms (what evaluate() reports) ----------------------------

# What a stage's overlapped collectives (ZeRO-2/3 traffic, the DP sync) hide behind in each
# phase: its compute and the device's waits on the host (the MoE host floor,
# planner.cost.moe.host_wait_split_s). The solver's constraints (planner.solve.stage_model)
# read the same names.
FWD_HIDING_TERMS = ("fwd_s", "host_wait_fwd_s")
BWD_HIDING_TERMS = ("bwd_s", "recompute_s", "host_wait_bwd_s")


def hiding_s(layers: Sequence[LayerTerms], names: tuple[str, ...]) -> float:
    """The seconds of ``layers`` a phase's overlapped traffic can hide behind (``names``:
    :data:`FWD_HIDING_TERMS` or :data:`BWD_HIDING_TERMS`)."""
    return sum(sum(getattr(x, name) for name in names) for x in layers)


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


def _has_expert(layers: Sequence[LayerTerms]) -> bool:
    return any(x.expert_params > 0 for x in layers)


def _charged(layers: Sequence[LayerTerms], slope_sum: float, dense: Affine, expert: Affine) -> float:
    """A stage's collective seconds: its layers' slope terms plus each group's intercept."""
    return (slope_sum + (dense.intercept_s if layers else 0.0)
            + (expert.intercept_s if _has_expert(layers) else 0.0))


def stage_memory(t: ConfigTerms, stage: int, layers: Sequence[LayerTerms]) -> MemoryBreakdown:
    """Peak bytes per GPU of pipeline stage ``stage`` holding ``layers``."""
    activations = t.in_flight[stage] * sum(x.act_stored_bytes for x in layers) + \
        max((x.act_working_bytes for x in layers), default=0.0)
    buffers = t.buffer_bytes + max((x.gather_buffer_bytes for x in layers), default=0.0)
    reserve = t.reserve_bytes + t.allocator_overhead * (activations + buffers)
    return MemoryBreakdown(sum(x.params_bytes for x in layers), sum(x.grads_bytes for x in layers),
                           sum(x.optimizer_bytes for x in layers), activations, buffers, reserve)


def stage_host_bytes(layers: Sequence[LayerTerms]) -> float:
    """Host bytes per GPU of a stage's offloaded optimizer states."""
    return sum(x.host_bytes for x in layers)


def stage_fits(t: ConfigTerms, stage: int, layers: Sequence[LayerTerms]) -> bool:
    """The stage fits its GPU's memory and its share of host memory."""
    return (stage_memory(t, stage, layers).total <= t.capacity_bytes
            and stage_host_bytes(layers) <= t.host_capacity_bytes)


def stage_time(t: ConfigTerms, layers: Sequence[LayerTerms]) -> float:
    """Seconds per micro-batch on one stage: its layers, the stage-boundary transfers and the
    exposed part of the ZeRO-2/3 per-micro-batch traffic (overlapped with the stage's compute);
    with several unequal chunks per rank, times 1 + the operation order's excess over the
    closed form (:func:`pipeline_excess`: the pipeline then takes what the order takes)."""
    time_s = sum(x.time_s for x in layers) + t.boundary_s + t.micro_batch_overhead_s
    if t.per_micro_batch_sync:
        traffic = _charged(layers, sum(x.zero_traffic_s for x in layers),
                           t.zero_reduce_dense + t.zero_gather_dense,
                           t.zero_reduce_expert + t.zero_gather_expert)
        fwd_traffic = _charged(layers, sum(x.zero_fwd_traffic_s for x in layers),
                               t.zero_gather_fwd_dense, t.zero_gather_expert.scaled(0.5))
        exposed = (max((x.zero_edge_s for x in layers), default=0.0)
                   + max(0.0, fwd_traffic - hiding_s(layers, FWD_HIDING_TERMS))
                   + max(0.0, traffic - fwd_traffic - hiding_s(layers, BWD_HIDING_TERMS)))
        time_s += exposed + t.comm_slowdown * (traffic - exposed)
    if t.chunk_weights:  # unequal chunks inside a rank: the order's excess (pipeline_excess)
        time_s *= 1 + pipeline_excess(t)
    return time_s


def dp_sync_s(t: ConfigTerms, layers: Sequence[LayerTerms]) -> tuple[float, float]:
    """(gradient reduction, parameter gather) seconds of one stage's once-per-step sync."""
    return (_charged(layers, sum(x.dp_reduce_s for x in layers), t.dp_reduce_dense,
                     t.dp_reduce_expert),
            _charged(layers, sum(x.dp_gather_s for x in layers), t.dp_gather_dense,
                     t.dp_gather_expert))


def pipeline_s(t: ConfigTerms, stage_layers: Sequence[Sequence[LayerTerms]],
               stage_times: Sequence[float]) -> float:
    """The pipeline's seconds under the configuration's schedule (planner.cost.pipeline): the
    stage times, and for a zero-bubble schedule the stages' full backward and weight-gradient
    sums its fill/drain pieces read."""
    if not t.bubble_pieces:
        return pipeline_time_s(stage_times, t.num_micro_batches, t.virtual_stages)
    return pipeline_time_s(
        stage_times, t.num_micro_batches, t.virtual_stages, t.bubble_pieces,
        sum(x.bwd_s + x.recompute_s for layers in stage_layers for x in layers),
        sum(x.wgrad_s for layers in stage_layers for x in layers))


def pipeline_excess(t: ConfigTerms) -> float:
    """The operation order's excess over the closed form on the configuration's unequal
    chunks (a multiple of 1/1024; 0 with one chunk per rank or equal chunks)."""
    if not t.chunk_weights or t.pp <= 1:
        return 0.0
    return uneven_chunk_excess(t.pipeline_schedule, t.pp, t.num_micro_batches,
                               t.chunk_weights)


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


def step_time(t: ConfigTerms | Sequence[ConfigTerms], stage_layers: Sequence[Sequence[LayerTerms]],
              stage_times: Sequence[float]) -> StepBreakdown:
    """The step from its stages. ``t`` is the configuration's terms, or one ConfigTerms per
    stage when stages differ in hardware (stages on different GPU pools, planner/hetero): each
    stage's data-parallel sync is then costed with its own terms; the schedule, overlap switches
    and embedding sync are read from the first stage's."""
    per_stage = list(t) if isinstance(t, (list, tuple)) else [t] * len(stage_layers)
    t = per_stage[0]
    # k schedule runs a step (ParallelConfig.schedule_calls): each its own fill and drain on
    # its m micro-batches, and its own data-parallel sync at its last backward
    k, m = t.schedule_calls, t.num_micro_batches
    pipe = k * pipeline_s(t, stage_layers, stage_times)
    bubble = pipe - k * m * max(stage_times)
    # DP sync per stage. With overlap, gradient reduction hides behind the last micro-batch's
    # backward, and stage i also has the slack of the backward still running on stages < i
    # (Megatron-LM --overlap-grad-reduce; parameter all-gather behind the next forward with
    # --overlap-param-gather).
    exposed = 0.0
    slack = 0.0
    for stage, layers in enumerate(stage_layers):
        reduce, gather = dp_sync_s(per_stage[stage], layers)
        # the device's waits on the host (MoE host floor) hide the side-stream sync too
        bwd = hiding_s(layers, BWD_HIDING_TERMS)
        fwd = hiding_s(layers, FWD_HIDING_TERMS)
        hidden_reduce = (bwd + slack) if t.overlap_grad_reduce else slack
        hidden_gather = fwd if t.overlap_param_gather else 0.0
        e = max(0.0, reduce - hidden_reduce) + max(0.0, gather - hidden_gather)
        exposed = max(exposed, k * (e + t.comm_slowdown * (reduce + gather - e)))
        slack += bwd
    # Optimizer step: memory-bound Adam over the parameters this GPU updates (slowest stage).
    optimizer = max((sum(x.optimizer_s for x in layers) for layers in stage_layers), default=0.0)
    return StepBreakdown(pipe, bubble, exposed, optimizer, t.embedding_sync_s)


def model_states(layers: Sequence[LayerTerms]) -> ModelStates:
    return ModelStates(sum(x.params_bytes for x in layers), sum(x.grads_bytes for x in layers),
                       sum(x.optimizer_bytes for x in layers))
