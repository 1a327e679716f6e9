"""Time of one engine iteration of one serving worker: decode tokens of running sequences plus
(chunked) prefill tokens of new ones.

Reuses the training cost model's leaf terms, never a copy of them:

* GEMMs, element-wise traffic and launch overhead of every layer:
  :func:`planner.cost.compute.layer_compute` on a :class:`~planner.cost.compute.Shard` of the
  iteration's tokens (one token per sequence in decode, ``seq_len = 1``). The GEMM roofline there
  is ``max(FLOPs / (peak x shape efficiency), bytes / HBM bandwidth)``: at a small batch a decode
  GEMM is bound by reading its weights, at a large batch by compute; fp8 / fp4 weights halve /
  quarter the bytes.
* Collectives: :mod:`planner.cost.comm` (alpha-beta ring/tree all-reduce for TP, all-to-all for
  expert parallelism with data-parallel attention, point-to-point between pipeline stages) over
  the links :func:`planner.topology.group_link` derives from the cluster's topology.

Serving-specific terms written here:

* Decode attention reads each running sequence's whole KV cache once per step (FlashDecoding /
  paged attention): ``bytes = seqs x context x kv_bytes_per_token`` at the decode HBM efficiency,
  or its FLOPs ``2 x seqs x context x heads x (d_qk + d_v)`` at the GPU's attention efficiency,
  whichever is slower. MLA decodes in the absorbed form (DeepSeek-V2 §2.1.2 / App. C):
  ``d_qk = kv_lora_rank + rope``, ``d_v = kv_lora_rank``, reading only the latent cache.
* Prefill attention of ``P`` new tokens of prompts of ``isl`` tokens: each token attends on
  average to ``isl / 2`` keys (causal), chunked or not: ``2 x P x isl/2 x heads x (d_qk + d_v)``.
* Split layers: attention runs on ``tp`` ranks with ``seqs / attention_dp`` sequences and the
  rank's own prompts (a prompt on the one rank that holds its request; the busiest rank sets
  the iteration), MoE layers on ``ep`` x ``moe_tp`` ranks (each routed expert sees ``tokens x
  top_k / experts`` tokens of every rank).
* Pipeline parallelism: ``pp`` micro-batches of ``seqs / pp`` sequences in flight; a token's
  step passes every stage once (``pp`` stage times plus ``pp - 1`` activation hand-offs).
* A fixed per-iteration overhead (scheduler, sampling, CUDA-graph launch).
* Eager iterations: the runtimes replay CUDA graphs only for decode-only batches
  (TensorRT-LLM ``cuda_graph_config``: generation-only batches; SGLang ``--cuda-graph-max-bs``:
  decode batches; vLLM ``cudagraph_capture_sizes``: batches of at most 512 tokens by default,
  fewer than a prompt chunk). An iteration that carries prompt tokens is issued layer by layer
  from Python, and a MoE layer takes at least the host's time to issue it
  (:func:`serving_host_floor_s`, one forward pass per layer, the static-shape case of the
  training model's :func:`planner.cost.moe.host_floor_s` at its own constant; the runtimes'
  fused MoE kernels take the routing on the device, so no token-count read-back).
* Piecewise-captured iterations: where the deployment states the token counts its runtime
  captures piecewise CUDA graphs of (``ServingConfig.prefill_capture_num_tokens``: TensorRT-LLM
  ``torch_compile_config: {enable_piecewise_cuda_graph: true, capture_num_tokens: [...]}``),
  a prompt-carrying iteration of at most the largest captured count of tokens (per attention
  group) runs the graph of the smallest captured count at or above its tokens: the attention
  core stays eager at the iteration's own tokens (TensorRT-LLM "Torch Compile & Piecewise CUDA
  Graph": "runs cudagraph-unsupported components (primarily attention) in eager mode while
  capturing and replaying the supported parts"), everything else (the embedding and each
  block's GEMMs, MoE layer and collectives; the output head still runs on the sampled
  positions only) replays at the padded count with one launch per piece, so the
  MoE host floor does not apply (a replayed graph needs no per-kernel issue,
  :func:`planner.cost.moe.host_floor_s`), and the eager attention core costs its kernels'
  launches as in any iteration (the leaf model's per-kernel launch term; no floor, as for
  every dense layer). An iteration of more tokens runs fully eager as above.

The decode HBM efficiency, prefill efficiency and per-step overhead are calibrated constants
(:data:`planner.serve.runtime.CALIBRATED`), applied by handing the leaf terms a GPU whose HBM
bandwidth or GEMM / attention efficiencies are scaled by them.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Mapping

from planner.topology import group_link
from planner.config import RuntimeOptions
from planner.cost import comm
from planner.cost.compute import (HBM_EFFICIENCY, KERNEL_LAUNCH_S, Shard, _mlp_gemms,
                                  elementwise_bytes, gemm_time_s, layer_compute)
from planner.hardware import Cluster, Gpu
from planner.ir import Attention, Layer, LayerKind, ModelGraph
from planner.serve._cache import Ident
from planner.serve.floor import experts_hit_fraction
from planner.serve.memory import ACT_BYTES, kv_elements_per_token
from planner.serve.workload import KV_BYTES, WorkerConfig

OPTIONS = RuntimeOptions(attention_kernel="flash", dropout=False)
FLASH_FALLBACK = 0.8  # as planner.cost.compute: flash efficiency = 0.8 x matmul when none given
# Host time to issue one eager MoE layer forward in a serving runtime (vLLM / SGLang /
# TensorRT-LLM; their MoE kernels size their work on the device, so no read-back). It was the training floor
# (planner.cost.moe.HOST_PER_LAYER_PASS_S, 2.0 ms) when session 5 fitted the serving constants
# with it (docs/inference.md: whole prompts and the eager MoE host floor, re-fitted together);
# session 11 re-fitted the training floor on Megatron-Core / NeMo / AutoModel training layers
# (2.5 ms: bench/moe_fit.py), which are not these runtimes' layers, so serving keeps its value.
SERVING_HOST_PER_LAYER_PASS_S = 2.0e-3


@dataclass(frozen=True)
class IterationTime:
    """Seconds of one iteration of one worker, by kind (the sum is the step)."""

    gemm_s: float  # GEMMs + element-wise + launches (layer_compute minus attention core)
    attention_s: float  # attention core: decode KV reads, prefill attention
    comm_s: float
    overhead_s: float
    host_s: float = 0.0  # MoE layers waiting on the host to issue them (eager iterations)

    @property
    def total_s(self) -> float:
        return self.gemm_s + self.attention_s + self.comm_s + self.overhead_s + self.host_s

    def as_dict(self) -> dict:
        return {"gemm_s": self.gemm_s, "attention_s": self.attention_s, "comm_s": self.comm_s,
                "overhead_s": self.overhead_s, "host_s": self.host_s, "total_s": self.total_s}


@dataclass(frozen=True)
class Calibration:
    """The calibrated constants (planner/serve/runtime.py CALIBRATED): two of the iteration
    cost, and three of each runtime (its per-iteration overhead and its scheduler), the latter
    as ``(runtime, value)`` pairs."""

    decode_hbm_efficiency: float
    prefill_efficiency: float
    step_overhead_s: tuple[tuple[str, float], ...]
    prefill_queue_fraction: tuple[tuple[str, float], ...]
    prefill_interference: tuple[tuple[str, float], ...]

    @classmethod
    def from_mapping(cls, values: Mapping[str, object]) -> "Calibration":
        def per_runtime(key: str) -> tuple[tuple[str, float], ...]:
            value = values[key]
            if isinstance(value, Mapping):
                return tuple(sorted((k, float(v)) for k, v in value.items()))
            return (("*", float(value)),)
        return cls(float(values["decode_hbm_efficiency"]), float(values["prefill_efficiency"]),
                   per_runtime("step_overhead_s"), per_runtime("prefill_queue_fraction"),
                   per_runtime("prefill_interference"))

    @staticmethod
    def _pick(pairs: tuple[tuple[str, float], ...], runtime: str) -> float:
        table = dict(pairs)
        return table.get(runtime, table.get("*", 0.0))

    def overhead_s(self, runtime: str) -> float:
        return self._pick(self.step_overhead_s, runtime)

    def queue_fraction(self, runtime: str) -> float:
        return self._pick(self.prefill_queue_fraction, runtime)

    def interference(self, runtime: str) -> float:
        return self._pick(self.prefill_interference, runtime)


@lru_cache(maxsize=256)
def serving_gpu(gpu: Gpu, decode_hbm_efficiency: float, prefill_efficiency: float) -> Gpu:
    """The GPU as the leaf terms should see it when serving (see the module docstring)."""
    attention = gpu.attention_efficiency or FLASH_FALLBACK * gpu.matmul_efficiency
    return replace(gpu,
                   hbm_bandwidth_gbytes_per_s=gpu.hbm_bandwidth_gbytes_per_s *
                   decode_hbm_efficiency / HBM_EFFICIENCY,
                   matmul_efficiency=gpu.matmul_efficiency * prefill_efficiency,
                   attention_efficiency=attention * prefill_efficiency)


def _compute_dtype(dtype: str, gpu: Gpu) -> str:
    """GEMM dtype: the serving precision where the GPU has a unit for it."""
    return dtype if dtype in gpu.peak_tflops else "bf16"


def _attention_dims(att: Attention, decode: bool) -> tuple[int, int]:
    if att.is_mla and decode:
        return att.kv_lora_rank + att.rope_head_dim, att.kv_lora_rank
    return att.head_dim, att.v_head_dim


def attention_core_s(att: Attention, gpu: Gpu, tp: int, kv_dtype: str, decode_seqs: float,
                     context: float, prefill_tokens: float, prefill_keys: float,
                     hbm_bytes_per_s: float, queries_per_seq: float = 1.0) -> float:
    """Attention core of one layer on one GPU (see the module docstring); a decoding sequence
    brings ``queries_per_seq`` query tokens (speculative verification) that share one read of
    its KV cache."""
    heads = att.num_heads / tp
    rate = gpu.peak_flops("bf16") * (gpu.attention_efficiency or
                                     FLASH_FALLBACK * gpu.matmul_efficiency)
    t = 0.0
    if decode_seqs > 0:
        keys = context if att.sliding_window is None else min(context, att.sliding_window)
        dqk, dv = _attention_dims(att, decode=True)
        flops = 2.0 * decode_seqs * queries_per_seq * keys * heads * (dqk + dv)
        read = decode_seqs * keys * kv_elements_per_token(att, tp) * KV_BYTES[kv_dtype]
        t += max(flops / rate, read / hbm_bytes_per_s) + KERNEL_LAUNCH_S
    if prefill_tokens > 0:
        keys = prefill_keys if att.sliding_window is None else min(prefill_keys,
                                                                   att.sliding_window)
        dqk, dv = _attention_dims(att, decode=False)
        t += 2.0 * prefill_tokens * keys * heads * (dqk + dv) / rate + KERNEL_LAUNCH_S
    return t


def _links(cluster: Cluster, worker: WorkerConfig):
    """Links of the worker's groups, from its mesh's strides: TP, the expert-parallel group
    (all-to-all with data-parallel attention) and neighbouring pipeline stages."""
    return _links_cached(Ident(cluster), worker)


@lru_cache(maxsize=4096)
def _links_cached(cluster_key, worker: WorkerConfig):
    cluster = cluster_key.obj
    mesh = worker.mesh
    tp = group_link(cluster, mesh.tp, mesh.stride("tp"))
    moe = group_link(cluster, mesh.ep, mesh.stride("ep"))
    pp = group_link(cluster, 2 if mesh.pp > 1 else 1, mesh.stride("pp"))
    return tp, moe, pp


def _layer_part_s(layer: Layer, tokens: float, tp: int, ep: int, dtype: str, gpu: Gpu) -> float:
    """GEMMs + element-wise of ``layer`` for ``tokens`` tokens on one GPU (no attention core)."""
    if tokens <= 0:
        return 0.0
    n = max(1, math.ceil(tokens))
    cost = layer_compute(layer, Shard(micro_batch=n, seq_len=1, tp=tp, ep=ep, dtype=dtype),
                         gpu, OPTIONS)
    return cost.fwd_s - cost.attn_core_fwd_s


def _moe_part_s(layer: Layer, tokens: float, tp: int, ep: int, dtype: str, gpu: Gpu) -> float:
    """Router, routed and shared experts of an MoE layer on one GPU of an ep x tp group whose
    ranks each dispatch ``tokens`` tokens (the training model's MoE GEMM shapes and roofline)."""
    if tokens <= 0:
        return 0.0
    n = max(1, math.ceil(tokens))
    mlp = layer.mlp
    shard = Shard(micro_batch=n, seq_len=1, tp=tp, ep=ep, dtype=dtype, etp=tp)
    gemms = _mlp_gemms(mlp, layer.hidden, n, shard)
    # At a small batch not every expert receives a token: with T tokens routed over the group,
    # each expert is hit with probability 1 - (1 - k/E)^T (uniform routing); only hit experts'
    # weights are read, each by a correspondingly larger share of the tokens.
    local = mlp.num_experts // ep
    hit = experts_hit_fraction(mlp.top_k, mlp.num_experts, tokens * ep)
    if hit < 1.0:
        gemms = [replace(g, m=max(1, round(g.m / hit)), count=max(1, math.ceil(local * hit)))
                 if g.count == local and local > 1 else g for g in gemms]
    hbm = gpu.hbm_bandwidth_gbytes_per_s * 1e9 * HBM_EFFICIENCY
    moved = elementwise_bytes(replace(layer, attention=None, num_norms=0), shard, OPTIONS)
    return sum(gemm_time_s(g, gpu, dtype) for g in gemms) + moved / hbm


def iteration_time(model: ModelGraph, cluster: Cluster, worker: WorkerConfig, dtype: str,
                   kv_dtype: str, calib: Calibration, *, decode_seqs: float, context: float,
                   prefill_tokens: float = 0.0, prefill_isl: float = 0.0,
                   prefill_requests: float = 0.0, runtime: str = "*",
                   draft_tokens: int = 0,
                   capture_num_tokens: tuple[int, ...] = (),
                   prefill_rank_tokens: float | None = None) -> IterationTime:
    """One iteration of a worker (all stages): ``decode_seqs`` running sequences at an average
    ``context`` tokens each, plus ``prefill_tokens`` tokens of prompts of ``prefill_isl``
    tokens (``prefill_requests`` of them finish their prompt and sample a first token).

    ``draft_tokens`` > 0: speculative decoding with the model's multi-token-prediction module
    (DeepSeek-V3 §2.2 / §5.4.3): the module runs ``draft_tokens`` times, one block plus the
    shared head at one token per sequence each, and the main model then verifies
    ``1 + draft_tokens`` tokens per sequence in one pass (its GEMMs and attention FLOPs see
    that many tokens; each sequence's KV cache is still read once). ``runtime``: whose
    per-iteration overhead applies. ``capture_num_tokens``: the token counts the runtime
    captures piecewise CUDA graphs of for prompt-carrying iterations (module docstring; empty:
    they run eagerly).

    ``prefill_rank_tokens``: with data-parallel attention, the prompt tokens of the busiest
    attention-DP rank. A request lives on one rank (its KV cache is there) and that rank
    prefills its prompt (or chunk) whole; the ranks step together (the MoE layers' all-to-all),
    so the iteration takes that rank's time: its attention, dense layers and all-to-all buffers
    at its own tokens, the experts at every rank's tokens (``prefill_tokens`` in all). None:
    ``prefill_tokens`` spread evenly over the ranks (each carrying its own prompts alike, as a
    loaded prefill worker's pass, :func:`planner.serve.evaluate.prefill_pass`)."""
    rank = None
    if prefill_rank_tokens is not None and worker.attention_dp > 1:
        rank = float(prefill_rank_tokens)
    return _iteration_time(Ident(model), Ident(cluster), worker, dtype, kv_dtype, calib,
                           float(decode_seqs), float(context), float(prefill_tokens),
                           float(prefill_isl), float(prefill_requests), runtime,
                           int(draft_tokens), tuple(capture_num_tokens), rank)


def captured_tokens(tokens: float, capture: tuple[int, ...]) -> int | None:
    """The captured token count a piecewise CUDA graph replays an iteration of ``tokens``
    tokens at (the smallest of ``capture`` at or above them), or None when ``tokens`` exceed
    every captured count (the iteration runs eagerly)."""
    if not capture or tokens > capture[-1]:
        return None
    return capture[bisect.bisect_left(capture, math.ceil(tokens))]


def _layers_time(classes, cluster: Cluster, w: WorkerConfig, gpu: Gpu, hbm: float,
                 gemm_dtype: str, kv_dtype: str, micro: int, seqs_group: float, width: float,
                 context: float, prefill_group: float, prefill_isl: float,
                 sampled: float, capture: tuple[int, ...] = (),
                 prefill_stage: float | None = None) -> tuple[float, float, float, float]:
    """(GEMM + element-wise, attention core, communication, host wait) seconds of ``classes``
    (``(layer, count)`` pairs) for one micro-batch per attention group: ``seqs_group``
    decoding sequences of ``width`` tokens each and ``prefill_group`` prefill tokens (with
    prefill tokens the iteration runs eagerly: the MoE host floor, module docstring; unless
    ``capture``, the piecewise-captured token counts, holds its tokens: then the blocks' parts
    other than the attention core run at the captured count and no host floor applies).
    ``prefill_group`` is the busiest group's; ``prefill_stage`` every group's prefill tokens
    of the micro-batch, which the experts see (None: ``prefill_group`` on each group)."""
    tokens_group = seqs_group * width + prefill_group
    graph = captured_tokens(tokens_group, capture) if prefill_group > 0 else None
    tokens_graph = float(graph) if graph is not None else tokens_group  # captured pieces' rows
    if prefill_stage is None or graph is not None:  # (a replayed graph: every group its size)
        tokens_stage = tokens_graph * w.attention_dp  # all tokens of a micro-batch in a stage
    else:
        tokens_stage = seqs_group * width * w.attention_dp + prefill_stage
    link_tp, link_moe, _ = _links(cluster, w)
    gemm = attention = communication = host = 0.0
    for layer, count in classes:
        if layer.kind is not LayerKind.BLOCK:
            embed_tokens = tokens_graph if layer.kind is LayerKind.EMBEDDING else sampled
            gemm += count * _layer_part_s(layer, embed_tokens, w.tp, 1, "bf16", gpu)
            if layer.kind is LayerKind.EMBEDDING:
                communication += count * comm.all_reduce_s(
                    tokens_graph * layer.hidden * ACT_BYTES, w.tp, link_tp)
            continue
        att, mlp = layer.attention, layer.mlp
        split = mlp is not None and mlp.is_moe
        if not split:  # one layer, one shard: attention and MLP on the same tp ranks
            t = _layer_part_s(layer, tokens_graph, w.tp, 1, gemm_dtype, gpu)
        else:  # attention on tp ranks, experts over ep x moe_tp ranks
            t = _layer_part_s(replace(layer, mlp=None), tokens_graph, w.tp, 1, gemm_dtype, gpu)
            t += _moe_part_s(layer, tokens_stage / w.ep, w.moe_tp, w.ep, gemm_dtype, gpu)
        a = c = 0.0
        if att is not None:
            a = attention_core_s(att, gpu, w.tp, kv_dtype, seqs_group, context, prefill_group,
                                 prefill_isl / 2, hbm, queries_per_seq=width)
            c += comm.all_reduce_s(tokens_graph * layer.hidden * ACT_BYTES, w.tp, link_tp)
        if mlp is not None:
            if split and w.attention_dp > 1:  # dispatch and combine of the routed tokens
                buffer = tokens_graph * mlp.top_k * layer.hidden * ACT_BYTES
                c += 2 * comm.all_to_all_s(buffer, w.ep, link_moe)
                if w.tp > 1:
                    c += comm.all_reduce_s(tokens_graph * layer.hidden * ACT_BYTES, w.tp,
                                           link_tp)
            else:  # row-parallel output (or the experts' partial sums) reduced over tp
                c += comm.all_reduce_s(tokens_graph * layer.hidden * ACT_BYTES, w.tp, link_tp)
        gemm += count * t
        attention += count * a
        communication += count * c
        if split and prefill_group > 0 and graph is None:
            host += count * serving_host_floor_s(t + a + c)
    return gemm, attention, communication, host


def serving_host_floor_s(gpu_s: float) -> float:
    """Seconds one eager MoE layer forward waits on the host beyond its ``gpu_s``: the
    static-shape case of :func:`planner.cost.moe.host_floor_s` (one pass, no read-back, the host
    running ahead of the device) at :data:`SERVING_HOST_PER_LAYER_PASS_S`."""
    return max(0.0, SERVING_HOST_PER_LAYER_PASS_S - gpu_s)


@lru_cache(maxsize=65536)
def _iteration_time(model_key, cluster_key, worker, dtype, kv_dtype, calib, decode_seqs, context,
                    prefill_tokens, prefill_isl, prefill_requests, runtime,
                    draft_tokens, capture=(), prefill_rank=None) -> IterationTime:
    model, cluster = model_key.obj, cluster_key.obj
    gpu = serving_gpu(cluster.gpu, calib.decode_hbm_efficiency, calib.prefill_efficiency)
    hbm = gpu.hbm_bandwidth_gbytes_per_s * 1e9 * HBM_EFFICIENCY  # = raw x decode efficiency
    gemm_dtype = _compute_dtype(dtype, gpu)
    w = worker
    micro = w.pp  # micro-batches in flight (one per stage)
    seqs_group = decode_seqs / w.attention_dp / micro  # per attention group, per micro-batch
    width = 1.0 + draft_tokens
    if prefill_rank is None:  # the prompt tokens spread evenly over the attention groups
        prefill_group = prefill_tokens / w.attention_dp / micro
        sampled = (decode_seqs * width + prefill_requests) / w.attention_dp / micro
        prefill_stage = None
    else:  # the busiest group's, its own requests sampling their first tokens
        prefill_group = prefill_rank / micro
        rank_requests = prefill_requests * prefill_rank / prefill_tokens if prefill_tokens else 0.0
        sampled = (decode_seqs * width / w.attention_dp + rank_requests) / micro
        prefill_stage = prefill_tokens / micro
    classes = [(cls.layer, cls.count) for cls in model.layer_classes()]
    args = (cluster, w, gpu, hbm, gemm_dtype, kv_dtype, micro)
    gemm, attention, communication, host = _layers_time(classes, *args, seqs_group, width,
                                                        context, prefill_group, prefill_isl,
                                                        sampled, capture, prefill_stage)
    if draft_tokens and seqs_group > 0:
        # the MTP module: one block (as the model's last) and the shared output head, at one
        # token per sequence, once per draft token
        block = [cls.layer for cls in model.layer_classes()
                 if cls.layer.kind is LayerKind.BLOCK][-1]
        head = [(cls.layer, 1) for cls in model.layer_classes()
                if cls.layer.kind is LayerKind.HEAD]
        # it lives on the last pipeline stage and runs there once per micro-batch, adding
        # pp x its time to the iteration (see the wall-time note below)
        g, a, c, _ = _layers_time([(block, 1)] + head, *args, seqs_group, 1.0, context, 0.0,
                                  0.0, seqs_group)
        gemm += draft_tokens * micro * g
        attention += draft_tokens * micro * a
        communication += draft_tokens * micro * c
    # Wall time of one iteration (every sequence one step): each stage runs its 1/pp of the
    # layers once per micro-batch and there are pp micro-batches, so pp x (layers/pp) x
    # (one micro-batch) = the sum above over all layers at one micro-batch's tokens; plus the
    # hand-offs between stages.
    if w.pp > 1:
        _, _, link_pp = _links(cluster, w)
        tokens_group = seqs_group * width + prefill_group
        communication += (w.pp - 1) * comm.p2p_s(tokens_group * model.hidden * ACT_BYTES,
                                                 link_pp)
    return IterationTime(gemm, attention, communication, calib.overhead_s(runtime), host)
