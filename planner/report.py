"""JSON form of an evaluation: the document ``shardplan evaluate --json`` prints and the body a
plan file embeds. Keys are sorted on output, floats rounded to fixed digits so that identical
inputs give byte-identical documents.

Consumes an :class:`~planner.cost.model.Evaluation`; produces plain dicts.
"""
from __future__ import annotations

from typing import Any

from planner.cost.model import Evaluation
from planner.cost.recompute_modules import DEFAULT_RECOMPUTE_MODULES

FLOAT_DIGITS = 6


def rounded(value: Any) -> Any:
    """Round floats recursively to FLOAT_DIGITS significant-enough decimals (stable output)."""
    if isinstance(value, float):
        return float(f"{value:.{FLOAT_DIGITS}g}") if value == value else None
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v) for v in value]
    return value


def model_dict(ev: Evaluation) -> dict[str, Any]:
    m = ev.model
    return {"name": m.name, "family": m.family, "params": m.params,
            "active_params": m.active_params, "num_layers": m.num_blocks,
            "hidden": m.hidden, "vocab": m.vocab, "source": m.source}


def cluster_dict(ev: Evaluation) -> dict[str, Any]:
    c = ev.cluster
    out = {"name": c.name, "gpu": c.gpu.name, "num_gpus": c.num_gpus,
           "num_nodes": c.num_nodes, "gpus_per_node": c.gpus_per_node,
           "gpu_memory_gib": c.gpu.memory_gib}
    if c.gpus_per_host:  # hosts smaller than a node (NVL72 trays): written only then
        out["gpus_per_host"] = c.gpus_per_host
    return out


def parallelism_dict(ev: Evaluation) -> dict[str, Any]:
    c = ev.config
    recompute = sorted({r.value for r, layer in zip(ev.placement.recompute, ev.model.layers)
                        if layer.kind.value == "block"})
    mesh = c.mesh
    out = {"dp": c.dp, "tp": c.tp, "pp": c.pp, "cp": c.cp, "ep": c.ep,
           "etp": mesh.expert_tp, "edp": mesh.expert_dp, "sp": c.sp,
           "zero_stage": c.zero_stage, "micro_batch": c.micro_batch,
           "global_batch": c.global_batch, "seq_len": c.seq_len,
           "num_micro_batches": c.num_micro_batches, "virtual_stages": c.virtual_stages,
           "schedule": c.schedule, "dtype": c.dtype,
           "recompute": recompute[0] if len(recompute) == 1 else "per-layer"}
    if c.dp_shard:  # hybrid sharding (planner.mesh): written only when used
        out["dp_shard"] = c.dp_shard
    if c.hpz:  # ZeRO++ hpZ's secondary partition (planner.config): written only when used
        out["hpz"] = c.hpz
    if c.pipeline_layout:  # an explicit pipeline layout (planner/pipeline_layout.py), as given
        out["pipeline_layout"] = c.pipeline_layout
    return out


def stages_list(ev: Evaluation) -> list[dict[str, Any]]:
    names = [layer.name for layer in ev.model.layers]
    out = []
    for s in ev.stages:
        out.append({
            "index": s.index,
            "layers": [names[i] for i in s.layers],
            "num_layers": len(s.layers),
            "memory_gib": s.memory.gib(),
            "time_s": s.time_s,
            "compute_s": s.compute_s,
            "comm_s": s.comm_s,
        })
    return out


def predicted_dict(ev: Evaluation) -> dict[str, Any]:
    b = ev.breakdown
    return {
        "step_time_s": ev.step_time_s,
        "tokens_per_s": ev.tokens_per_s,
        "model_tflops_per_gpu": ev.model_tflops_per_gpu,
        "hardware_tflops_per_gpu": ev.hw_tflops_per_gpu,
        "mfu": ev.mfu,
        "peak_memory_gib": ev.peak_memory_bytes / 2**30,
        "fits": ev.fits,
        "time_breakdown_s": {
            "pipeline": b.pipeline_s, "bubble": b.bubble_s, "dp_exposed": b.dp_exposed_s,
            "optimizer": b.optimizer_s, "embedding_sync": b.embedding_sync_s,
        },
    }


def runtime_dict(o) -> dict[str, Any]:
    """The RuntimeOptions a plan records: check and export rebuild the same options."""
    out = {"runtime": o.runtime, "attention_kernel": o.attention_kernel,
           "dropout": o.dropout, "overlap_grad_reduce": o.overlap_grad_reduce,
           "overlap_param_gather": o.overlap_param_gather,
           "tp_comm_overlap": o.tp_comm_overlap,
           # runtime profile and calibrated behaviour (planner/profiles.py,
           # planner/calibration)
           "profile": o.profile, "allocator_overhead": o.allocator_overhead,
           "comm_slowdown": o.comm_slowdown,
           "micro_batch_overhead_s": o.micro_batch_overhead_s,
           "block_overhead_s": o.block_overhead_s,
           "elementwise_factor": o.elementwise_factor,
           "fp8_gemm_factor": o.fp8_gemm_factor,
           "fp8_saved_inputs": o.fp8_saved_inputs,
           "matmul_efficiency": o.matmul_efficiency,
           "attention_efficiency": o.attention_efficiency,
           "moe": {"imbalance": o.moe.imbalance, "capacity_factor": o.moe.capacity_factor,
                   "dispatcher": o.moe.dispatcher, "a2a_overlap": o.moe.a2a_overlap,
                   "cuda_graph": o.moe.cuda_graph}}
    if o.recompute_modules != DEFAULT_RECOMPUTE_MODULES:  # Megatron --recompute-modules
        out["recompute_modules"] = list(o.recompute_modules)
    if o.cross_entropy != "fp32":  # the loss's logit precision (planner.cost.memory)
        out["cross_entropy"] = o.cross_entropy
    if o.fp8_attention:  # the attention core in FP8 (planner.cost.compute)
        out["fp8_attention"] = True
    if o.fp8_bf16_gemms:  # GEMMs left in 16 bits under FP8 (planner.cost.compute.gemm_dtype)
        out["fp8_bf16_gemms"] = list(o.fp8_bf16_gemms)
    if o.expert_gemm_per_expert:  # one GEMM per local expert (planner.cost.compute.gemm_time_s)
        out["expert_gemm_per_expert"] = True
    if o.compiled:  # under torch.compile (planner.calibration.apply)
        out["compiled"] = True
    if o.elementwise:  # element-wise fusion other than the profile's default
        out["elementwise"] = o.elementwise
    return out


def evaluation_dict(ev: Evaluation) -> dict[str, Any]:
    return rounded({
        "model": model_dict(ev),
        "cluster": cluster_dict(ev),
        "parallelism": parallelism_dict(ev),
        "runtime": runtime_dict(ev.options),
        "stages": stages_list(ev),
        "predicted": predicted_dict(ev),
    })
