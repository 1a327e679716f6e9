"""DeepSpeed config JSON for a plan.

Consumes a validated plan document; produces a ``ds_config.json``. Keys from
deepspeed.ai/docs/config-json, the AutoTP training docs and ``deepspeed/runtime/config.py``.

Batch: ``DeepSpeedConfig`` asserts ``train_batch_size == train_micro_batch_size_per_gpu x
gradient_accumulation_steps x world_size``, where ``world_size`` is the data-parallel size *it
is given*: ``mpu.get_data_parallel_world_size()`` when ``deepspeed.initialize`` gets an
``mpu`` (for a ``PipelineModule`` the mpu is the module's own ``PipelineParallelGrid``, built
from its ``topology``), else the whole process group. The three keys are the plan's global
batch, micro-batch and number of micro-batches, which hold for the plan's dp; when dp is not
the whole world (tp, pp or cp > 1) the export's notes say how the runtime gets dp (a
``PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=dp)`` for pipeline plans, an
``mpu`` otherwise). Also
``zero_optimization.stage`` (+ ``overlap_comm`` for the plan's overlapped gradient reduction),
``bf16.enabled`` / ``fp16.enabled``, ``tensor_parallel.autotp_size``,
``zero_optimization.offload_optimizer`` (ZeRO-Offload, when the plan offloads every layer's
optimizer states).

What the JSON cannot hold is a warning: the pipeline degree and split (set in code with
``PipelineModule(num_stages=..., partition_method=...)``), interleaving (DeepSpeed's pipeline
engine runs one schedule), ZeRO-2/3 under pipeline parallelism (its pipeline engine refuses
them), Megatron-style sequence parallelism, context and expert parallelism (set in model code),
and recomputation (``deepspeed.checkpointing.checkpoint`` called in model code).
"""
from __future__ import annotations

from typing import Any

from planner.plan_types import Plan
from planner.export.base import ExportResult, blocks_per_rank, describe_recompute, memory_note
from planner.export.layouts import number_ranges
from planner.export.offload import offloaded, optimizer_offload_warning
from planner.export.quoting import json_text
from planner.export.retarget import retarget_warning


def export(plan: Plan) -> ExportResult:
    doc = plan.to_dict()
    p, runtime = doc["parallelism"], doc["runtime"]
    warnings: list[str] = []
    tp, pp, v = p["tp"], p["pp"], p["virtual_stages"]
    zero = p["zero_stage"]
    if pp > 1 and zero >= 2:
        warnings.append(f"ZeRO-{zero} with pipeline parallelism: DeepSpeed's pipeline engine "
                        f"accepts ZeRO 0 and 1 only; exported stage 1"
                        + memory_note(plan, zero_stage=1))
        zero = 1
    config: dict[str, Any] = {
        "train_batch_size": p["global_batch"],
        "train_micro_batch_size_per_gpu": p["micro_batch"],
        "gradient_accumulation_steps": p["num_micro_batches"],
        "zero_optimization": {"stage": zero},
        "bf16": {"enabled": p["dtype"] in ("bf16", "fp8")},
        "fp16": {"enabled": p["dtype"] == "fp16"},
    }
    if zero >= 1:
        config["zero_optimization"]["overlap_comm"] = bool(runtime["overlap_grad_reduce"])
    changes: dict[str, Any] = {}
    if p.get("dp_shard"):  # hybrid sharding: DeepSpeed's form of it, MiCS, is gone
        changes["dp_shard"] = 0
        warnings.append(
            f"hybrid sharding (dp_shard {p['dp_shard']}, {p['dp'] // p['dp_shard']} replicas): "
            f"DeepSpeed 0.19 has no MiCS (its config refuses zero_optimization.mics_shard_size:"
            f" 'MiCS ZeRO-3 sharding has been removed', deepspeedai/DeepSpeed#8489); exported "
            f"ZeRO-{zero} sharded over all dp {p['dp']}" + memory_note(plan, dp_shard=0))
    if p.get("hpz") and zero == 3:  # ZeRO++ hpZ: the secondary weight partition's ranks
        config["zero_optimization"]["zero_hpz_partition_size"] = p["hpz"]
    if offloaded(plan, "offload"):
        _offload(plan, zero, config, warnings)
    if tp > 1:
        config["tensor_parallel"] = {"autotp_size": tp}
    notes = _dp_notes(doc)
    if pp > 1:
        split = blocks_per_rank(doc)
        even = len(set(split)) == 1
        notes.append(
            f"deepspeed: the pipeline is built in code, not in this file: "
            f"PipelineModule(layers=..., num_stages={pp}, ...) with blocks per stage "
            f"{', '.join(map(str, split))} (embedding on stage 0, head on stage {pp - 1}); "
            + ("partition_method='type:' + the block class's name balances the blocks so"
               if even else
               "DeepSpeed's partition methods balance counts or parameters, so give a "
               "PipelineModule subclass whose _partition_layers sets these stage bounds"))
    if pp > 1 and p["schedule"] not in ("1f1b", "interleaved-1f1b"):
        warnings.append(f"schedule {p['schedule']}: DeepSpeed's pipeline engine runs 1F1B only "
                        f"(no zero-bubble schedule), with its larger bubble")
    if v > 1:
        warnings.append(f"interleaving: DeepSpeed's pipeline engine has no interleaved "
                        f"schedule; the plan's {v} virtual stages per rank run as plain 1F1B "
                        f"with a larger bubble" + memory_note(plan, virtual_stages=1))
    if p["sp"]:
        warnings.append("sequence parallelism: DeepSpeed's AutoTP has no Megatron-style "
                        "sequence parallelism; activations are not split over tp"
                        + memory_note(plan, sp=False))
    if p["cp"] > 1:
        warnings.append(f"context parallelism {p['cp']}: not expressible in the DeepSpeed "
                        f"config; DeepSpeed-Ulysses sequence parallelism is set up in model code "
                        f"and is a different algorithm (all-to-all over heads, not ring "
                        f"attention)")
    if p["ep"] > 1:
        # DeepSpeed-MoE keeps each expert whole (etp 1) or slices it over the tp group
        # (enable_expert_tensor_parallelism=True, deepspeed/moe/layer.py): the plan's etp
        etp = plan.mesh.expert_tp
        sliced = ", enable_expert_tensor_parallelism=True" if etp > 1 and etp == tp else ""
        notes.append(f"deepspeed: expert parallelism is set in model code: "
                     f"deepspeed.moe.layer.MoE(..., ep_size={p['ep']}{sliced})"
                     + (f" (each expert sliced over the tp {tp} ranks, as the plan's etp "
                        f"{etp})" if sliced else ""))
        if etp not in (1, tp):
            changes["etp"] = 1
            warnings.append(f"expert tensor parallelism {etp}: DeepSpeed-MoE keeps experts "
                            f"whole or slices them over all tp {tp} ranks; the note keeps them "
                            f"whole (etp 1)" + memory_note(plan, etp=1))
    _recompute(doc, warnings, notes)
    if p["dtype"] == "fp8":
        warnings.append("dtype fp8: exported bf16; FP8 GEMMs come from Transformer Engine "
                        "layers in model code, not from the DeepSpeed config")
    if zero != p["zero_stage"]:
        changes["zero_stage"] = zero
    retarget = retarget_warning(plan, "deepspeed", **changes)
    if retarget:
        warnings.append(retarget)
    text = json_text(config) + "\n"
    return ExportResult("deepspeed", text, tuple(warnings), ".json", tuple(notes))


def _offload(plan: Plan, zero: int, config: dict[str, Any], warnings: list[str]) -> None:
    """Optimizer offload (LayerOption.offload) as ZeRO-Offload: ``offload_optimizer`` moves
    every parameter's optimizer states and the optimizer step to the host, with ZeRO 1-3; a
    per-layer subset, or offload under ZeRO-0, has no form in the config."""
    why = ""
    if len(offloaded(plan, "offload")) < len(plan.layers):
        why = ("DeepSpeed's offload_optimizer takes every parameter, not a per-layer subset")
    elif zero < 1:
        why = "DeepSpeed's offload_optimizer needs ZeRO stage 1-3; the plan runs ZeRO-0"
    if why:
        warnings.append(optimizer_offload_warning(plan, "deepspeed", why))
    else:
        config["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}


def _recompute(doc: dict[str, Any], warnings: list[str], notes: list[str]) -> None:
    """DeepSpeed recomputes what model code wraps in deepspeed.checkpointing.checkpoint: any
    set of whole blocks is exact; the attention core alone has no DeepSpeed switch."""
    blocks = [x for x in sorted(doc["layers"], key=lambda x: x["index"]) if x["kind"] == "block"]
    full = [b for b, x in enumerate(blocks) if x["recompute"] == "full"]
    other = sorted({x["recompute"] for x in blocks} - {"none", "full"})
    if full:
        notes.append(f"deepspeed: recomputation is set in model code: wrap blocks "
                     f"{number_ranges(full)} (of 0-{len(blocks) - 1}) in "
                     f"deepspeed.checkpointing.checkpoint"
                     + (" (all of them: PipelineModule(activation_checkpoint_interval=1))"
                        if len(full) == len(blocks) else ""))
    if other:
        warnings.append(f"recompute: the plan has {describe_recompute(doc)}"
                        f"{' and op-level' if 'op' in other else ''} recomputation; DeepSpeed "
                        f"has no switch for recomputing part of a block: wrap the attention "
                        f"core yourself, or it is not recomputed")


def data_parallel_size(doc: dict[str, Any]) -> int:
    """The data-parallel size DeepSpeed must see for the exported batch keys to hold."""
    return doc["parallelism"]["dp"]


def _dp_notes(doc: dict[str, Any]) -> list[str]:
    p = doc["parallelism"]
    tp, pp, dp, cp = p["tp"], p["pp"], p["dp"], p["cp"]
    world = tp * pp * dp * cp
    if dp == world:
        return []
    batch = (f"train_batch_size {p['global_batch']} = micro-batch {p['micro_batch']} x "
             f"{p['num_micro_batches']} accumulation steps x data-parallel size {dp}, and "
             f"DeepSpeed checks it against the data-parallel size it is given, not the "
             f"{world} GPUs")
    if pp > 1:
        return [f"deepspeed: {batch}: build the model as PipelineModule(..., topology="
                f"PipeModelDataParallelTopology(num_pp={pp}, num_mp={tp * cp}, num_dp={dp})) "
                f"(deepspeed.runtime.pipe.topology), whose grid DeepSpeed uses as the mpu"
                + (f"; the {cp} context-parallel ranks sit on its model axis with the {tp} "
                   f"tensor-parallel ones" if cp > 1 else "")]
    return [f"deepspeed: {batch}: pass deepspeed.initialize(..., mpu=MPU) an object whose "
            f"get_data_parallel_world_size() returns {dp} (for example Megatron-LM's "
            f"parallel_state initialised with tensor size {tp}"
            + (f" and context size {cp}" if cp > 1 else "") + ")"]
