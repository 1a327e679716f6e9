"""Mixture-of-experts cost formulas: the tokens each GPU's experts compute, the token dispatch and
combine all-to-all over the expert-parallel group (flat or hierarchical), the expert-tensor-
parallel gather, and the bytes of the dispatch buffers.

Consumes an :class:`~planner.ir.Mlp`, the expert mesh degrees (``tp``, ``etp``, ``ep``; see
:class:`planner.mesh.Mesh`), a micro-batch's tokens on one GPU, the links of the expert groups
(:class:`planner.cost.context.Links`) and :class:`planner.moe.MoeOptions`; produces token counts,
seconds and bytes. :mod:`planner.cost.terms` puts them into each layer's terms.

Model (Megatron-Core ``MoEAlltoAllTokenDispatcher`` / ``MoEFlexTokenDispatcher``; torchtitan
``ExpertParallel``):

* Tokens. A MoE layer's input on one GPU is its sequence shard (``tokens / tp``: Megatron-Core
  requires sequence parallelism for MoE with TP). Each token goes to ``top_k`` experts; with
  balanced routing each of the ``ep`` ranks of the EP group receives ``tokens / tp x top_k``
  copies, and an ETP group gathers its members' copies, so one GPU's ``E / ep`` local experts
  compute ``tokens / tp x top_k x etp`` copies (times the load factor: the busiest rank sets the
  pace) at width ``F / etp``. The FLOPs per GPU do not depend on ep or etp; the per-expert GEMM
  shape does (grouped-GEMM tile efficiency, :mod:`planner.cost.compute`).
* Dispatch and combine. Each moves ``tokens / tp x top_k x h`` elements per GPU, forward and
  (as their transposes) backward: four all-to-alls per layer and micro-batch, two more when the
  block is recomputed. Flat: one all-to-all over the EP group's link (the topology's all-to-all
  bandwidth: across nodes every member talks to every other node). Hierarchical (``deepep``): a
  token crosses the network once per remote NVLink domain holding one of its experts -- with the
  experts spread evenly over ``D`` domains, ``(D - 1)(1 - (1 - 1/D)^top_k)`` times -- and is
  forwarded over NVLink inside the domain; the network and NVLink phases overlap, so the time is
  the larger of the two (DeepSeek-V3 report §3.2.2: IB 50 GB/s vs NVLink 160 GB/s). Under
  group-limited routing (:attr:`planner.ir.Mlp.expert_groups`, DeepSeek-V3's node-limited
  routing: each token to at most 4 nodes) the token's experts lie in the domains its kept
  groups cover (:func:`remote_domain_copies`).
* ETP. With ``etp > 1`` the received copies are all-gathered over the ETP group before the
  experts and reduce-scattered after them (and the transposes backward).
* Host. Issued from Python, a MoE layer pass takes at least the host's time to issue it, and
  dropless routing reads the token counts back once per pass (Megatron-Core
  ``tokens_per_expert.cpu()``), exposing the host's issue of the rest of the layer, which
  waits for the device's forward up to the router; the read-back drains the device's queue, so
  each synchronised forward pass is a host / device cycle of its own and the backward another
  (:func:`host_floor_s`); a capacity factor makes the shapes static
  (no read-back) and a CUDA graph that captures the layer removes the issue time
  (:attr:`planner.moe.MoeOptions.cuda_graph`).
* Overlap: ``MoeOptions.a2a_overlap`` of the all-to-all time is hidden behind independent
  compute; DeepEP's kernels hold :data:`DEEPEP_SMS` SMs meanwhile, so the hidden share still
  slows that compute by ``DEEPEP_SMS / num_sms`` of its length (:func:`sm_reserve_share`).
"""
from __future__ import annotations

import math

from planner.topology import Link
from planner.cost import comm
from planner.ir import Mlp
from planner.moe import MoeOptions

# Streaming multiprocessors DeepEP's dispatch and combine kernels occupy while they run (the
# normal, high-throughput kernels: ``deep_ep.Buffer.num_sms = 20``, Megatron-Core
# ``--moe-deepep-num-sms`` default 20; DeepSeek-V3 report §3.2.2: "only 20 SMs are sufficient
# to fully utilize the bandwidths of IB and NVLink", of the H800's 132). Compute overlapping
# them runs on the other SMs (:func:`sm_reserve_share`).
DEEPEP_SMS = 20


# Host time a dropless MoE layer pass adds to its issue: the grouped GEMMs and the all-to-all
# splits are sized from token counts the host reads back (Megatron-Core
# ``tokens_per_expert.cpu()``; DeepEP's normal-mode dispatch likewise waits on the CPU for the
# received counts), so the host waits for the router, then builds the splits and allocates the
# dynamically sized buffers before it can issue the rest of the layer. Seconds per layer pass,
# on top of :data:`HOST_PER_LAYER_PASS_S` in the host's issue time (what a GPU-bound layer
# hides); absent with a capacity factor (static shapes) and under a full-iteration CUDA graph
# (sync-free buffers). The synchronisation alone is tens of microseconds (CUDA programming
# guide, "Asynchronous concurrent execution"); with the host work around it, milliseconds in
# Python-issued MoE layers: the token-dropping Qwen3-30B-A3B run on 8 B200 at micro-batch 1 took
# 14.5 s per step, its dropless twins of the next releases 27-28 s. Fitted by bench/moe_fit.py
# (2.5 ms; 2.5 until session 7 costed the device work the read-back waits for, host_floor_s,
# 2.0 until session 10 split the host's issue at the sync point, PRE_SYNC_LAUNCHES: mean +
# median 17.6 % vs 19.1 % at 2.0, the grid's top; 1.5 ms in session 11, with the host floor
# 2.5 ms, once node-limited routing and DeepEP's SM reservation are costed: mean + median
# 16.3 % vs 17.4 % at 2.5 / 2.0 ms; 2.0 ms in session 11's second re-fit, the floor at its
# bound 2.36 ms: 16.4 %).
DROPLESS_SYNC_S = 2.0e-3


# Grouped-GEMM kernels (Transformer Engine / cuBLASLt grouped GEMM, CUTLASS grouped) run one
# launch over all local experts with per-expert problem sizes; they can reach less than the
# dense cuBLAS efficiency of the same shapes (scheduling across ragged groups, no split-K,
# per-expert quantisation in FP8). On top of the tile / wave model, which already charges small
# per-expert row counts, and of the FP8 casts of the expert inputs (:func:`expert_cast_bytes`).
# Fitted by bench/moe_fit.py (grid 0.8 / 1.0: 1.0, i.e. the tile model alone; 0.8 before the
# casts were costed, when it stood in for them).
GROUPED_GEMM_EFFICIENCY = 1.0


# Seconds each local expert beyond the first adds to a grouped GEMM where the runtime runs one
# GEMM per expert (RuntimeProfile.expert_gemm_per_expert): Transformer Engine's GroupedLinear
# launches a cuBLASLt GEMM per expert over 4 compute streams (common/gemm/cublaslt_gemm.cu
# multi_stream_cublas_gemm) after quantising each expert's slice (split_quantize), where one
# grouped kernel would take every expert in one launch. Measured on SM100 (Transformer Engine
# #3134, benchmarks/linear/benchmark_grouped_linear.py, kernel against kernel): 8 experts of
# 128 tokens x 2048 x 2048 take 0.267 ms through the per-expert cuBLASLt loop and 0.069 ms in
# one CUTLASS grouped launch, (0.267 - 0.069) / 8 = 25 us per expert. Absent where a CUDA graph
# replays the MoE layer (the per-expert launches and their setup are recorded once; the
# Megatron-Bridge recipes that capture the whole iteration also fuse the grouped MLP into one
# kernel, Megatron-Bridge #2885) and where one kernel runs every expert (torch._grouped_mm).
EXPERT_GEMM_S = 25e-6


# Host time per MoE layer pass when the runtime issues the layer from Python without CUDA
# graphs: the router, the token permutation and its all-to-all splits (read back to the host for
# dropless routing), the grouped expert GEMMs with their FP8 quantisation, the unpermutation --
# a few hundred kernel launches and their Python dispatch. A layer pass cannot take less than
# the host needs to issue it, so with small micro-batches MoE layers are host-bound
# (Megatron-Core MoE README: CUDA graphs for dropless MoE "to reduce CPU overhead"). Fitted by
# bench/moe_fit.py on the measured MoE runs (the Megatron-Bridge Qwen3-30B-A3B runs at
# micro-batch 1 take 8.8-9.6 ms per layer and micro-batch on B200 and H100 where the GPU needs
# 3-6 ms). Bounded by what a pass of a host-bound run without the read-back took in all: the
# token-dropping Qwen3-30B-A3B run on 8 B200 at micro-batch 1, 14.51 s / (48 layers x 64
# micro-batches x 2 passes) = 2.36 ms (bench/moe_fit.py host_bound_s), which the fit reaches.
# 2.0 ms until session 11's re-fit (2.5 ms, above that bound), 2.36 ms in its second; with the
# dropless read-back (2.0 ms) 4.36 ms per dropless pass, within the micro-batch-1 dropless
# runs' 4.4-4.8 ms per pass.
HOST_PER_LAYER_PASS_S = 2.36e-3


# Kernel launches of one Megatron-Core MoE transformer layer forward on either side of the
# dropless read-back (alltoall dispatcher, ``cuda_sync_point = "before_ep_alltoall"``, fused
# permutation, Transformer Engine modules; megatron/core/transformer/moe/token_dispatcher.py,
# router.py, moe_layer.py, transformer_layer.py). Before it: the attention block (input norm
# fused into the QKV linear: norm + GEMM, fused RoPE, the attention kernel, the output GEMM,
# bias-dropout-add: 6), the pre-MLP norm (1), the router (gating GEMM, the fused score / top-k,
# the auxiliary loss's sums: 4), ``MoEAlltoAllTokenDispatcher.preprocess`` (``routing_map.sum``,
# ``.long()``, the input splits' reshape-sum, the counts' all-gather over TP x EP, the local
# slice's ``.contiguous()``, three sums, the two device-to-host copies: 10) and permutation 1
# (fused: 1): 22. After it: the two all-to-alls (tokens, probs), ``sort_chunks_by_idxs`` of
# tokens and probs (2), the grouped MLP (FP8 casts of the two GEMM inputs, FC1, the weighted
# SwiGLU, FC2: 5), the unsort (1), the combine all-to-all (1), unpermutation 1 (1), the
# residual add (1): 13. The host's issue time per pass (:data:`HOST_PER_LAYER_PASS_S`) splits
# in that proportion (planner.cost.moe.host_floor_s).
PRE_SYNC_LAUNCHES = 22
POST_SYNC_LAUNCHES = 13


def expert_cast_bytes(mlp: Mlp, h: int, etp: int, dtype: str) -> float:
    """HBM bytes per routed token copy of the FP8 quantisation before the expert GEMMs, forward
    (the backward's casts of the output gradients ride on the element-wise backward factor):
    Transformer Engine's grouped linears quantise the input of each expert GEMM -- the permuted
    token (``h``) before FC1 and the activation (``F / etp``) before FC2 -- reading it in 16 bits
    and writing an FP8 row-wise copy for the GEMM and a column-wise copy for the weight gradient
    (2 + 1 + 1 bytes per element; the 1x32 / 128-element scales add ~3 %). A dense layer's casts
    are small beside its wide GEMMs and sit in the calibrated FP8 GEMM factor; a small expert's
    (Qwen3-30B-A3B: h 2048, F 768) are a large share of its GEMM time. None in 16 bits."""
    if dtype != "fp8":
        return 0.0
    return 4.0 * (h + mlp.ffn_hidden / etp)


def routed_tokens(tokens: float, mlp: Mlp, tp: int, etp: int, load: float = 1.0) -> float:
    """Token copies one GPU's local experts compute for ``tokens`` (its micro-batch tokens)."""
    return tokens / tp * mlp.top_k * etp * load


def tokens_per_expert(tokens: float, mlp: Mlp, tp: int, etp: int, ep: int,
                      load: float = 1.0) -> float:
    """Rows of one local expert's grouped GEMM: the GPU's routed copies over its E / ep experts."""
    return routed_tokens(tokens, mlp, tp, etp, load) * ep / mlp.num_experts


def dispatch_elements(tokens: float, h: int, mlp: Mlp, tp: int) -> float:
    """Elements one GPU sends in one dispatch (and, balanced, receives): its sequence shard's
    token copies."""
    return tokens / tp * mlp.top_k * h


def reachable_units(units: int, groups: int = 1, groups_per_token: int = 1) -> float:
    """Expected units (NVLink domains, or ranks) of the ``units`` an EP group's experts are
    spread evenly over (in expert order) that one token's kept expert groups cover, under
    group-limited routing (:class:`planner.ir.Mlp`: ``groups_per_token`` of ``groups`` equal
    groups in expert order). A group spans ``units / groups`` units where the units are more;
    where the groups are more, each unit holds ``groups / units`` of them and a unit is covered
    unless none of its groups is kept (drawn without replacement). Unlimited routing, and
    groups that do not tile the units, reach every unit (the conservative side)."""
    if groups_per_token >= groups or units <= 1:
        return float(units)
    if units % groups == 0:
        return float(groups_per_token * (units // groups))
    if groups % units == 0:
        per_unit = groups // units
        missed = math.comb(groups - per_unit, groups_per_token) / math.comb(groups,
                                                                           groups_per_token)
        return units * (1.0 - missed)
    return float(units)


def units_hit(units: int, top_k: int, groups: int = 1, groups_per_token: int = 1) -> float:
    """Expected distinct units of ``units`` one token's ``top_k`` experts fall on, the experts
    drawn independently and evenly over the units its kept groups cover
    (:func:`reachable_units`; all of them without group-limited routing)."""
    reach = reachable_units(units, groups, groups_per_token)
    if reach <= 1:
        return float(min(top_k, 1)) if units >= 1 else 0.0
    return reach * (1.0 - (1.0 - 1.0 / reach) ** top_k)


def remote_domain_copies(domains: int, top_k: int, groups: int = 1,
                         groups_per_token: int = 1) -> float:
    """Expected remote NVLink domains one token's ``top_k`` experts fall into, the experts
    spread evenly over ``domains`` domains of the EP group (each expert drawn independently):
    every domain is equally likely to be hit and the token's own is one of ``domains``, so
    ``(domains - 1) / domains`` of :func:`units_hit`. Without group-limited routing that is
    ``(D - 1)(1 - (1 - 1/D)^top_k)``; DeepSeek-V3's node-limited routing (8 groups = 8 nodes of
    EP64, 4 kept, top-8) crosses the network 3.15 times per token instead of 4.59 (report
    §2.1.2 and §3.2.2: "each token will be dispatched to at most 4 nodes, thereby reducing IB
    traffic")."""
    if domains <= 1:
        return 0.0
    return units_hit(domains, top_k, groups, groups_per_token) * (domains - 1) / domains


def distinct_ranks(ranks: int, top_k: int, groups: int = 1, groups_per_token: int = 1) -> float:
    """Expected distinct ranks of ``ranks`` (experts spread evenly over them) one token's
    ``top_k`` experts fall on: the copies a dispatcher that sends a token once per destination
    rank moves (DeepEP / HybridEP; the flat dispatcher sends one copy per expert)."""
    if ranks <= 1:
        return float(min(top_k, 1))
    return units_hit(ranks, top_k, groups, groups_per_token)


def _ep_groups(mlp: Mlp, ep: int) -> tuple[int, int]:
    """The expert groups as the EP group sees them: (groups, kept per token), or (1, 1) where
    the groups do not tile the EP ranks' contiguous expert slices (then every rank may be hit)."""
    if not mlp.group_limited or (ep % mlp.expert_groups and mlp.expert_groups % ep):
        return 1, 1
    return mlp.expert_groups, mlp.groups_per_token


def all_to_all_s(elements: float, elem_bytes: float, mlp: Mlp, ep: int, options: MoeOptions,
                 flat: Link, intra: Link, inter: Link, domains: int) -> float:
    """Seconds of one dispatch (or combine) of ``elements`` per GPU over the EP group.

    ``flat`` is the EP group's link; ``intra`` the link among the EP members of one NVLink
    domain and ``inter`` the link among one member per domain (the same rail), ``domains`` the
    NVLink domains the group spans: the hierarchical dispatcher uses those.
    """
    if ep <= 1 or elements <= 0:
        return 0.0
    size = elements * elem_bytes * options.load_factor
    if options.dispatcher != "deepep":
        return comm.all_to_all_s(size, ep, flat)
    per_token = size / mlp.top_k
    groups = _ep_groups(mlp, ep)
    ranks_hit = distinct_ranks(ep, mlp.top_k, *groups)
    if domains <= 1:  # inside one NVLink domain: once per destination rank
        return comm.all_to_all_s(per_token * ranks_hit, ep, flat)
    per_domain = max(ep // domains, 1)
    network = per_token * remote_domain_copies(domains, mlp.top_k, *groups)
    net_s = network / inter.bandwidth_bytes_per_s + (domains - 1) * inter.latency_s
    nvl_s = comm.all_to_all_s(per_token * ranks_hit, per_domain, intra) \
        if per_domain > 1 else 0.0
    return max(net_s, nvl_s)


def sm_reserve_share(options: MoeOptions, num_sms: int) -> float:
    """Compute seconds a second of the dispatcher's hidden all-to-all costs: DeepEP's kernels
    hold :data:`DEEPEP_SMS` of the GPU's ``num_sms`` for as long as they run, so the compute
    they overlap runs on the rest and falls behind by that share of the overlap (0 for the
    NCCL all-to-all, whose SM use sits in the fitted ``comm_slowdown``)."""
    if options.dispatcher != "deepep" or num_sms <= 0:
        return 0.0
    return min(DEEPEP_SMS / num_sms, 1.0)


def dispatch_combine_s(tokens: float, h: int, mlp: Mlp, tp: int, etp: int, ep: int,
                       elem_bytes: float, options: MoeOptions, flat: Link, intra: Link,
                       inter: Link, domains: int, etp_link: Link, passes: int,
                       num_sms: int = 0) -> float:
    """Exposed seconds of a MoE layer's token movement for one micro-batch: ``passes`` of
    dispatch + combine (2 forward and backward, 3 when the block is recomputed), each with its
    ETP gather and scatter, less the overlapped fraction; the overlapped all-to-all still
    costs the compute it slows where the dispatcher holds SMs (:func:`sm_reserve_share` of a
    GPU with ``num_sms``)."""
    elements = dispatch_elements(tokens, h, mlp, tp)
    a2a = 2 * all_to_all_s(elements, elem_bytes, mlp, ep, options, flat, intra, inter, domains)
    etp_s = 0.0
    if etp > 1:
        gathered = elements * etp * elem_bytes * options.load_factor
        etp_s = comm.all_gather_s(gathered, etp, etp_link) + comm.reduce_scatter_s(
            gathered, etp, etp_link)
    hidden = options.a2a_overlap
    return passes * ((a2a + etp_s) * (1.0 - hidden)
                     + a2a * hidden * sm_reserve_share(options, num_sms))


def _host_per_pass_s(options: MoeOptions) -> float:
    """The host's issue time of one pass of a MoE layer (with the dropless read-back's)."""
    return HOST_PER_LAYER_PASS_S + (DROPLESS_SYNC_S if options.host_synchronised else 0.0)


def _synchronised_pass_s(per_pass: float, pre_sync_gpu_s: float, forward_gpu_s: float) -> float:
    """Seconds of one synchronised forward pass (:func:`host_floor_s`): the pre-sync kernels
    while the host issues them, then the post-sync ones while it issues the rest, the host's
    issue split by the launches on either side of the read-back."""
    host_pre_s = HOST_PER_LAYER_PASS_S * PRE_SYNC_LAUNCHES / (PRE_SYNC_LAUNCHES
                                                             + POST_SYNC_LAUNCHES)
    return (max(host_pre_s, pre_sync_gpu_s)
            + max(per_pass - host_pre_s, max(0.0, forward_gpu_s - pre_sync_gpu_s)))


def host_floor_s(gpu_s: float, passes: float, extra_host_s: float = 0.0,
                 options: MoeOptions = MoeOptions(), pre_sync_gpu_s: float = 0.0,
                 forward_gpu_s: float = 0.0, sync_passes: int = 1) -> float:
    """Seconds a MoE layer's ``passes`` (forward, backward, recomputed forward) wait on the host
    beyond their ``gpu_s`` of device work. Issued from Python, the host needs
    :data:`HOST_PER_LAYER_PASS_S` per pass, :data:`DROPLESS_SYNC_S` more where dropless routing
    reads the token counts back, plus ``extra_host_s`` of other launches the option repeats. A
    CUDA graph that captures the layer replays it with one launch (no floor).

    Without a read-back the host runs ahead of the device across passes (kernel launches are
    asynchronous), so the layer takes the longer of the host's and the device's whole time.

    The read-back (Megatron-Core's alltoall / flex dispatcher, dropless with EP:
    ``cuda_sync_point = "before_ep_alltoall"``, the splits moved to the CPU before the
    all-to-all; DeepEP's normal-mode dispatch likewise waits on the CPU for the received counts)
    drains the device's queue once per forward pass (``sync_passes``: the forward, and the
    recomputed forward under full recomputation; the backward reuses the forward's splits). So a
    synchronised pass is a cycle of its own: the host can neither run ahead into it nor carry
    its slack out of it. Inside one, the device runs the pre-sync kernels (attention, router,
    permutation; ``pre_sync_gpu_s``, :func:`pre_sync_passes`) while the host issues them, then
    the host blocks on the counts; after the read-back it issues the post-sync kernels
    (all-to-all, expert GEMMs, combine) while the device runs them. So each takes
    ``max(host_pre, pre_sync_gpu_s) + max(host_post, forward_gpu_s - pre_sync_gpu_s)``, the
    host's issue time split by the launches before and after the sync point
    (:data:`PRE_SYNC_LAUNCHES`, :data:`POST_SYNC_LAUNCHES`; the read-back's own host work,
    :data:`DROPLESS_SYNC_S`, comes after it) -- and the rest (backward, ``extra_host_s``) takes
    ``max(host, device)`` on its own. A host-bound forward no longer
    hides a device-bound backward: at Qwen3-30B-A3B's micro-batch 4 the forward waits on the
    host while the backward waits on the device, and the two add."""
    if options.host_captured:
        return 0.0
    per_pass = _host_per_pass_s(options)
    if not options.host_synchronised or sync_passes <= 0:
        return max(0.0, passes * per_pass + extra_host_s - gpu_s)
    synced = sync_passes * _synchronised_pass_s(per_pass, pre_sync_gpu_s, forward_gpu_s)
    rest_gpu_s = max(0.0, gpu_s - sync_passes * forward_gpu_s)
    rest = max((passes - sync_passes) * per_pass + extra_host_s, rest_gpu_s)
    return max(0.0, synced + rest - gpu_s)


def host_wait_split_s(gpu_s: float, passes: float, extra_host_s: float = 0.0,
                      options: MoeOptions = MoeOptions(), pre_sync_gpu_s: float = 0.0,
                      forward_gpu_s: float = 0.0, sync_passes: int = 1) -> tuple[float, float]:
    """:func:`host_floor_s` split into (the forward's wait, the backward phase's wait: the
    backward and any recomputed forward), the two summing to it. The device is idle while it
    waits on the host, so communication that runs on a stream of its own and is not itself
    queued behind the read-back hides there as behind compute (planner.cost.terms: the
    data-parallel gradient reduction, launched asynchronously from the backward's hooks, and the
    parameter all-gathers, launched asynchronously ahead of the forward; the read-back
    synchronises the compute stream only). A synchronised forward waits
    ``max(host_pre, pre) + max(host_post, post) - forward_gpu_s``; without a read-back the
    host's issue runs ahead across passes and the wait splits as the host's issue does."""
    total = host_floor_s(gpu_s, passes, extra_host_s, options, pre_sync_gpu_s, forward_gpu_s,
                         sync_passes)
    if total <= 0.0 or passes <= 0:
        return 0.0, 0.0
    per_pass = _host_per_pass_s(options)
    if not options.host_synchronised or sync_passes <= 0:
        forward = total * per_pass / (passes * per_pass + extra_host_s)
    else:
        forward = max(0.0, _synchronised_pass_s(per_pass, pre_sync_gpu_s, forward_gpu_s)
                      - forward_gpu_s)
    forward = min(forward, total)
    return forward, total - forward


def pre_sync_passes(recompute: str) -> int:
    """Forward passes of a MoE layer that read the token counts back: the forward, and the
    recomputed forward under full recomputation (selective recomputation repeats the attention
    core only, per-op checkpointing keeps the router's outputs)."""
    return 2 if recompute == "full" else 1


def host_passes(recompute: str) -> tuple[float, int]:
    """(expert passes, other kernel launches) the host issues for a MoE layer under a
    recomputation policy: forward and backward; full recomputation repeats the forward, per-op
    checkpointing half of it, selective only the attention core (one kernel launch)."""
    if recompute == "full":
        return 3.0, 0
    if recompute == "op":
        return 2.5, 0
    if recompute == "selective":
        return 2.0, 1
    return 2.0, 0


def dispatch_buffer_bytes(tokens: float, h: int, mlp: Mlp, tp: int, etp: int,
                          elem_bytes: float, options: MoeOptions) -> float:
    """Transient bytes while a MoE layer runs backward: the send and receive buffers of one
    all-to-all (the permuted copies and the received ones, gathered over ETP), sized by the
    busiest rank's load or, sync-free, by the pre-sized rank capacity."""
    elements = dispatch_elements(tokens, h, mlp, tp) * options.buffer_factor
    return elements * elem_bytes * (1 + etp)


def ep_domains(ep: int, stride: int, domain_gpus: int) -> int:
    """NVLink domains an EP group of ``ep`` ranks ``stride`` apart spans (ranks node-major,
    groups aligned): 1 while ``ep x stride`` fits in one domain."""
    span = ep * stride
    if span <= domain_gpus:
        return 1
    return math.ceil(span / domain_gpus) if stride <= domain_gpus else ep
