"""What the CPU runtime can execute of a plan, and how it executes it: the plan read as a
:class:`~planner.plan_types.Plan`, the support policy (which degrees and shapes the verification
runtime runs), the model chunks of the pipeline, the runtime options of the CPU run, and the
human-readable summary of the PyTorch APIs that apply each part of the plan.

Consumes a plan file, document or Plan; produces a Plan checked as runnable (or a PlannerError
of kind UNSUPPORTED / INVALID_INPUT naming why not). No processes are started here.
"""
from __future__ import annotations

import os
from typing import Sequence


from planner.config import ParallelConfig, RuntimeOptions
from planner.strategy import LayerPlacement
from planner.plan_types import Plan
from planner.errors import ErrorKind, PlannerError, invalid
from planner.ir import LayerKind, ModelGraph
from planner.runtime.model import decoder_shape


MAX_PROCESSES = 16
MEASURED_ACT_BYTES = 4  # the runtime trains in fp32: activations moved are 4 bytes an element

ZERO_IMPLEMENTATION = {
    0: "replicated parameters; gradients all-reduced (averaged) over dp after the last "
       "micro-batch (manual all_reduce on each local gradient shard)",
    1: "gradients all-reduced over dp, then torch.distributed.optim.ZeroRedundancyOptimizer "
       "(Adam): each dp rank keeps Adam states of the whole parameters assigned to it (greedy "
       "by size) and broadcasts them after its step",
    2: "ZeroRedundancyOptimizer (as ZeRO-1) plus gradient partitioning: a "
       "post-accumulate-grad hook reduces every parameter's gradient to the dp rank that owns "
       "it after each micro-batch's backward and frees it elsewhere (DeepSpeed ZeRO-2 "
       "semantics at whole-parameter granularity; FSDP2 with reshard_after_forward=False would "
       "also shard the resting weights, i.e. be ZeRO-3 memory)",
    3: "FSDP2 fully_shard per layer and per stage root over the dp mesh (weights, gradients "
       "and Adam states sharded on dim 0; weights all-gathered for forward and backward, "
       "gradients reduce-scattered per micro-batch)",
}


def read_plan(plan: "str | os.PathLike | dict | Plan") -> tuple[Plan, str]:
    """The :class:`~planner.plan_types.Plan` (read and schema-validated by
    :mod:`planner.plan_io` when given a path) and its name."""
    from planner.plan_types import Plan

    if isinstance(plan, Plan):
        return plan, "<plan>"
    if isinstance(plan, dict):
        return Plan.from_dict(plan), "<plan document>"
    from planner.plan_io import load_plan, read_json_file

    try:
        doc = load_plan(plan)
    except PlannerError as error:
        if "jsonschema" not in error.message:
            raise
        # without jsonschema: strict JSON parsing only; Plan.from_dict checks what it reads
        doc = read_json_file(plan, "plan file")
    decoded = Plan.from_dict(doc)
    if len(decoded.placement.stage) != len(decoded.model.layers):
        raise invalid(f"plan has {len(decoded.placement.stage)} layer decisions for a model of "
                      f"{len(decoded.model.layers)} layers")
    return decoded, str(plan)


def pipeline_chunks(stages: Sequence[int], pp: int, virtual_stages: int) -> list[list[int]]:
    """Model chunks in pipeline order (runs of consecutive layers on one rank); chunk ``k``
    runs on pipeline rank ``k mod pp`` (PyTorch's and Megatron's interleaved layout)."""
    chunks: list[tuple[int, list[int]]] = []
    for index, stage in enumerate(stages):
        if chunks and chunks[-1][0] == stage:
            chunks[-1][1].append(index)
        else:
            chunks.append((stage, [index]))
    expected = pp * virtual_stages
    layout = [rank for rank, _ in chunks]
    if len(chunks) != expected or any(rank != k % pp for k, rank in enumerate(layout)):
        raise invalid(f"the plan's layer stages {list(stages)} do not form {expected} model "
                      f"chunks placed round-robin on {pp} pipeline ranks")
    return [layers for _, layers in chunks]


def unsupported(message: str) -> PlannerError:
    return PlannerError(ErrorKind.UNSUPPORTED, message)


def check_supported(plan: Plan, max_processes: int = MAX_PROCESSES) -> None:
    c, model = plan.config, plan.model
    shape = decoder_shape(model)  # raises UNSUPPORTED for non-llama graphs
    if c.cp > 1:
        raise unsupported(
            f"context parallelism (cp {c.cp}) is not executed: PyTorch's context_parallel "
            "(ring attention) has no rule for the CPU attention kernel (\"NotImplementedError: "
            "Operator aten._scaled_dot_product_flash_attention_for_cpu.default does not have a "
            "sharding strategy registered.\", PyTorch 2.13)")
    if shape.moe is not None:
        _check_moe(plan, shape)
    if c.num_gpus > max_processes:
        raise unsupported(f"the plan needs {c.num_gpus} processes; the limit is "
                          f"{max_processes} (--max-processes)")
    if shape.num_kv_heads % c.tp:
        raise unsupported(f"tp {c.tp} does not divide the {shape.num_kv_heads} KV heads "
                          "(KV-head replication is not built)")
    if shape.tied and (c.tp > 1 or c.pp > 1):
        raise unsupported("tied embeddings are executed only without TP and PP")
    if c.hpz:
        raise unsupported(f"ZeRO++ hpZ (hpz {c.hpz}) is not executed (verify runs FSDP2, "
                          "which has no secondary weight partition)")
    if c.pp > 1 and c.schedule not in ("1f1b", "interleaved-1f1b"):
        raise unsupported(f"the {c.schedule} pipeline schedule is not executed (verify runs "
                          "1F1B and interleaved 1F1B)")
    pipeline_chunks(plan.placement.stage, c.pp, c.virtual_stages)
    degrees = layer_degrees(plan)
    if any(t != c.tp for t in degrees):
        if plan.across_pools:
            raise unsupported("per-layer layouts in a plan across pools are not executed")
        if c.sp:
            raise unsupported("per-layer layouts with sequence parallelism are not executed "
                              "(the all-to-all between (batch/k, seq) and (batch, seq/k) "
                              "shards is not built)")
        if c.zero_stage:
            raise unsupported(f"per-layer layouts with ZeRO-{c.zero_stage} are not executed "
                              "(each layout has its own data group; verify runs them with "
                              "replicated states and per-group gradient all-reduces: zero 0)")
        for t in set(degrees):
            if shape.num_kv_heads % t:
                raise unsupported(f"a layout of tensor degree {t} does not divide the "
                                  f"{shape.num_kv_heads} KV heads")


def _check_moe(plan: Plan, shape) -> None:
    """What runs of a MoE plan: experts on the expert mesh (etp x ep x edp folding each stage's
    tp x dp ranks), the attention and dense parts under TP with or without sp, ZeRO 0, 1 or 2,
    FSDP2 (ZeRO-3) with tp 1, force-balanced routing that is exact per rank."""
    c, moe = plan.config, shape.moe
    mesh = c.mesh
    experts_split = c.ep > 1 or c.tp > 1
    if c.zero_stage == 3 and c.tp > 1:
        raise unsupported(
            f"FSDP2 (ZeRO-3) of a MoE plan with tensor parallelism (tp {c.tp}) is not executed: "
            "verify runs MoE under ZeRO-3 with tp 1 (dense parts fully_shard over dp, experts "
            "over edp); with TP it runs ZeRO 0 or 1")
    if c.dp_shard:
        raise unsupported(f"hybrid sharding (dp_shard {c.dp_shard}) of a MoE plan is not "
                          "executed")
    if any(t != c.tp for t in layer_degrees(plan)):
        raise unsupported("per-layer layouts of a MoE plan are not executed")
    error = mesh.expert_layout_error()
    if error:
        raise invalid(error)
    if moe.num_experts % c.ep:
        raise invalid(f"ep {c.ep} does not divide the {moe.num_experts} experts")
    if moe.expert_ffn % mesh.expert_tp:
        raise unsupported(f"etp {mesh.expert_tp} does not divide the expert width "
                          f"{moe.expert_ffn}")
    if experts_split and c.seq_len % c.tp:
        raise unsupported(f"tp {c.tp} does not divide seq_len {c.seq_len}: the MoE layer runs "
                          "on each TP rank's sequence shard")
    if experts_split and (c.seq_len // c.tp * moe.top_k) % moe.num_experts:
        per_rank = (f"seq_len / tp x top_k ({c.seq_len} / {c.tp} x {moe.top_k})" if c.tp > 1
                    else f"seq_len x top_k ({c.seq_len} x {moe.top_k})")
        raise unsupported(
            f"force-balanced routing needs {per_rank} divisible by the {moe.num_experts} "
            "experts (planner.runtime.experts: each rank's sequence shard covers the experts "
            "round-robin), so that every EP rank receives exactly its share and the all-to-all "
            "bytes are exact; choose another --seq-len")


def _token_exchange_prediction(plan: Plan, etp: int) -> list[float]:
    from planner.cost import moe
    from planner.moe import MoeOptions
    from planner.topology import Link

    c = plan.config
    unit = Link(bandwidth_bytes_per_s=1.0, latency_s=0.0, tier="unit", crosses_nodes=False)
    options = MoeOptions(a2a_overlap=0.0)  # imbalance 1, dropless, flat all-to-all
    contexts = plan.stage_contexts(runtime_options(plan))
    out = [0.0] * c.pp
    for index, layer in enumerate(plan.model.layers):
        if layer.mlp is None or not layer.mlp.is_moe:
            continue
        stage = plan.placement.stage[index]
        ctx = contexts[stage]
        # forward, backward and the recomputed forward (planner.cost.terms._layer_work)
        passes = 3 if plan.placement.recompute[index].value == "full" else 2
        out[stage] += moe.dispatch_combine_s(
            ctx.shard.tokens, layer.hidden, layer.mlp, ctx.shard.tp, etp, c.ep,
            MEASURED_ACT_BYTES, options, unit, unit, unit, 1, unit, passes)
    return out


def a2a_prediction(plan: Plan) -> list[float]:
    """Per pipeline stage: the bytes one rank receives per micro-batch in its MoE blocks'
    token dispatch and combine (all-to-all over the EP group) and, with expert tensor
    parallelism, their ETP gather and scatter, forward and backward, in fp32 as the runtime
    moves them. This is the cost model's own term (:func:`planner.cost.moe.dispatch_combine_s`:
    the flat all-to-all of :func:`planner.cost.comm.all_to_all_s`, each rank keeping 1/ep of
    its ``tokens / tp x top_k`` copies of ``h`` elements and moving ``(ep - 1)/ep`` of them;
    with ``etp > 1`` the all-gather and reduce-scatter of ``etp`` such buffers,
    :func:`planner.cost.comm.all_gather_s`; per dispatch and per combine, forward and
    backward, again in the recomputed forward) evaluated on a link of 1 byte/s without
    latency, so its seconds are bytes; at the runtime's routing: balanced (load factor 1), the
    flat dispatcher, nothing hidden. Empty when the experts are neither split over EP nor over
    ETP."""
    c = plan.config
    if not plan.model.is_moe or (c.ep <= 1 and c.mesh.expert_tp <= 1):
        return []
    return _token_exchange_prediction(plan, c.mesh.expert_tp)


def etp_prediction(plan: Plan) -> list[float]:
    """Of :func:`a2a_prediction`, the ETP gather and scatter's part per stage: the same cost
    term less its value at etp 1 (the dispatch elements do not depend on etp). Empty at etp 1."""
    c = plan.config
    total = a2a_prediction(plan)
    if not total or c.mesh.expert_tp <= 1:
        return []
    return [t - a for t, a in zip(total, _token_exchange_prediction(plan, 1))]


def expert_state_prediction(plan: Plan) -> list[dict[str, float]]:
    """Per pipeline stage: the bytes of routed-expert parameters, gradients and optimizer
    states one rank holds, as the cost model counts them: each MoE layer's ``expert_params``
    on one GPU (:func:`planner.cost.terms.layer_terms`: ``E / (ep x etp)`` experts) through
    :func:`planner.cost.memory.zero_state_bytes` over the expert data-parallel group
    (``Mesh.expert_shard_degree``) with the torch-fp32 state layout. Empty without experts."""
    from planner.cost.memory import zero_state_bytes
    from planner.cost.terms import layer_terms

    c, model, placement = plan.config, plan.model, plan.placement
    if not model.is_moe:
        return []
    options = runtime_options(plan)
    state = options.state_bytes(c.zero_stage)
    contexts = plan.stage_contexts(options)
    out = [{"params": 0.0, "grads": 0.0, "optimizer": 0.0} for _ in range(c.pp)]
    for index, layer in enumerate(model.layers):
        if layer.mlp is None or not layer.mlp.is_moe:
            continue
        stage = placement.stage[index]
        held = layer_terms(contexts[stage], layer, placement.options[index]).expert_params
        states = zero_state_bytes(held, c.mesh.expert_shard_degree, c.zero_stage, state)
        for key in out[stage]:
            out[stage][key] += getattr(states, key)
    return out


def layer_degrees(plan: Plan) -> list[int]:
    """Each layer's tensor degree under its layout (:class:`planner.strategy.Layout`), as the
    cost model reads it; INVALID_INPUT for a layout that does not divide the mesh."""
    out = plan.layer_tensor_degrees()
    for layer, option, degree in zip(plan.model.layers, plan.placement.options, out):
        if degree is None:
            raise invalid(f"layer {layer.name}: layout {option.layout.value} does not divide "
                          f"the mesh (tp {plan.config.tp}, dp {plan.config.dp})")
    return out


def reshard_prediction(plan: Plan) -> list[dict]:
    """Per layout change between consecutive layers: what the cost model charges
    (:func:`planner.cost.terms.reshard_collective`), and the bytes one rank of the later
    layer's stage receives per micro-batch in the ring all-gather ((k - 1)/k of the gathered
    buffer; the activation in the cost model's 16-bit ACT_BYTES)."""
    from planner.cost.context import make_context
    from planner.cost.terms import reshard_collective

    layers, options = plan.model.layers, plan.placement.options
    if all(o.layout is options[0].layout for o in options) or plan.across_pools:
        return []  # (check_supported refuses layouts across pools)
    ctx = make_context(plan.model, plan.cluster, plan.config, runtime_options(plan))
    out = []
    for i in range(1, len(layers)):
        coll = reshard_collective(ctx, layers[i].hidden, options[i - 1].layout,
                                  options[i].layout, layers[i].seq_len)
        if coll is None:
            continue
        out.append({"layer": layers[i].name, "stage": plan.placement.stage[i],
                    "from": options[i - 1].layout.value, "to": options[i].layout.value,
                    "collective": coll.kind, "ranks": coll.ranks,
                    "received_bytes": (coll.ranks - 1) / coll.ranks * coll.size_bytes,
                    "seconds": coll.seconds()})
    return out


def runtime_options(plan: Plan) -> RuntimeOptions:
    """What the CPU runtime is: torch-fp32 states, the plan's attention kernel and dropout."""
    rt = plan.runtime
    return RuntimeOptions(runtime="torch-fp32", attention_kernel=rt.attention_kernel,
                          dropout=rt.dropout)


def schedule_name(config: ParallelConfig) -> str:
    """The PyTorch schedule class for the plan's pipeline. PyTorch's Schedule1F1B refuses fewer
    micro-batches than stages ("Number of microbatches (1) must be greater than or equal to the
    number of stages (2)"), which the planner allows; with m <= pp micro-batches 1F1B has no
    steady phase and is exactly GPipe (all m forwards, then all m backwards; min(pp - i, m) = m
    in flight on every stage), so ScheduleGPipe runs it."""
    if config.virtual_stages > 1:
        return "ScheduleInterleaved1F1B"
    return "ScheduleGPipe" if config.num_micro_batches < config.pp else "Schedule1F1B"


def implementation_summary(config: ParallelConfig, placement: LayerPlacement,
                           model: ModelGraph) -> dict[str, str]:
    c = config
    out = {"mesh": f"init_device_mesh('cpu', ({c.pp}, {c.dp}, {c.cp}, {c.tp}), "
                   f"mesh_dim_names=('pp', 'dp', 'cp', 'tp')), gloo"}
    if c.tp > 1:
        out["tp"] = ("DTensor parallelize_module: ColwiseParallel q/k/v/gate/up, RowwiseParallel "
                     "o/down, embedding RowwiseParallel, lm_head ColwiseParallel (output "
                     "Replicate)" + ("; SequenceParallel norms, PrepareModuleInput(Shard(1) -> "
                                     "Replicate) before attention and MLP" if c.sp else "")
                     + ("; a MoE block's MLP as under ep" if model.is_moe else ""))
    if c.dp > 1 or c.zero_stage:
        out["dp"] = f"ZeRO-{c.zero_stage}: {ZERO_IMPLEMENTATION[c.zero_stage]}"
    if c.pp > 1:
        name = schedule_name(c)
        if name == "ScheduleGPipe":
            name += (f" (the plan's 1F1B with {c.num_micro_batches} micro-batch(es) < pp "
                     f"{c.pp}: identical order and memory; Schedule1F1B refuses m < pp)")
        counts = [sum(1 for i in placement.layers_of_stage(s)
                      if model.layers[i].kind is LayerKind.BLOCK) for s in range(c.pp)]
        out["pp"] = (f"torch.distributed.pipelining PipelineStage x {c.pp * c.virtual_stages} + "
                     f"{name}, {c.num_micro_batches} micro-batches; blocks per rank {counts}")
    moe = next((layer.mlp for layer in model.layers if layer.mlp is not None
                and layer.mlp.is_moe), None)
    if moe is not None:
        mesh = c.mesh
        shared = (f"shared experts as one SwiGLU of width {moe.shared_ffn_hidden}, "
                  if moe.shared_ffn_hidden else "")
        out["moe"] = (f"{moe.num_experts} routed SwiGLU experts (top {moe.top_k}), {shared}a "
                      "softmax router whose logits at the assigned experts are the gate "
                      "weights; routing force-balanced: copy j of position s to expert "
                      "(s x top_k + j) mod E (planner.runtime.experts)")
        if c.ep > 1 or c.tp > 1:
            etp = mesh.expert_tp
            zero = {1: "; ZeRO-1: one ZeroRedundancyOptimizer over dp for dense and one over edp "
                       "for expert parameters",
                    2: "; ZeRO-2: as ZeRO-1, each dense gradient reduced to its owner over dp "
                       "and each expert gradient to its owner over edp after every micro-batch",
                    3: "; ZeRO-3: FSDP2 fully_shard of each routed expert over the edp mesh "
                       "(its gradients rescaled by edp / dp after FSDP2's average over edp), then "
                       "of each layer and the stage root over dp (torchtitan's MoE FSDP)"
                    }.get(c.zero_stage, "")
            out["ep"] = (
                f"expert mesh etp {etp} x ep {c.ep} x edp {mesh.expert_dp} over each stage's "
                f"tp x dp ranks: {moe.num_experts // c.ep} experts per rank"
                + (f", each cut to {moe.ffn_hidden // etp} of its {moe.ffn_hidden} columns"
                   if etp > 1 else "")
                + (f"; each TP rank routes its seq / {c.tp} positions (Megatron-Core MoELayer "
                   "on the sequence-parallel shard" + ("" if c.sp else ", the replicated input "
                   "split on the sequence and the output all-gathered: Megatron-Core refuses "
                   "MoE with TP and without SP in training") + "), router weight a Replicate "
                   "DTensor, shared experts Colwise / Rowwise on the shard"
                   if c.tp > 1 else "")
                + ("; per-expert counts, then dispatch and combine with dist.all_to_all_single "
                   "(split sizes, dropless) over the EP group, backward the transposed exchange"
                   if c.ep > 1 else "")
                + ("; received rows all-gathered over the ETP group before the experts and the "
                   "partial outputs reduce-scattered after them (Megatron-Core "
                   "token_dispatcher.py dispatch_postprocess / combine_preprocess), backward "
                   "the transposes" if etp > 1 else "")
                + "; expert gradients reduced over edp, dense ones over dp" + zero)
    modes = sorted({placement.recompute[i].value for i, layer in enumerate(model.layers)
                    if layer.kind is LayerKind.BLOCK})
    if modes != ["none"]:
        out["recompute"] = ("torch.utils.checkpoint(use_reentrant=False) per block: full = the "
                            "whole block, selective = the attention core (SDPA); "
                            f"modes in this plan: {', '.join(modes)}")
    return out
