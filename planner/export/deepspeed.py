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
``bf16.enabled`` / ``fp16.enabled``, ``tensor_parallel.autotp_size``.

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
from planner.export.quoting import json_text


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
    if tp > 1:
        config["tensor_parallel"] = {"autotp_size": tp}
    if pp > 1:
        split = blocks_per_rank(doc)
        warnings.append(
            f"pipeline: DeepSpeed sets the pipeline degree in code, not in this file: build the "
            f"model as PipelineModule(layers=..., num_stages={pp}, partition_method=...) with "
            f"blocks per stage {', '.join(map(str, split))} (embedding on stage 0, head on "
            f"stage {pp - 1}); train_batch_size above assumes that degree")
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
        warnings.append(f"expert parallelism {p['ep']}: set in model code "
                        f"(deepspeed.moe.layer.MoE(..., ep_size={p['ep']})), not in this file")
    if any(x["recompute"] != "none" for x in doc["layers"]):
        warnings.append(f"recompute: DeepSpeed recomputes what model code wraps in "
                        f"deepspeed.checkpointing.checkpoint; the plan has "
                        f"{describe_recompute(doc)}"
                        + ("; selective (attention-core) recomputation has no DeepSpeed "
                           "switch: wrap the attention core only"
                           if any(x["recompute"] == "selective" for x in doc["layers"]) else ""))
    if p["dtype"] == "fp8":
        warnings.append("dtype fp8: exported bf16; FP8 GEMMs come from Transformer Engine "
                        "layers in model code, not from the DeepSpeed config")
    if not runtime["runtime"].startswith("deepspeed"):
        warnings.append(f"memory: the plan assumed the {runtime['runtime']!r} optimizer-state "
                        f"layout; with DeepSpeed's ZeRO optimizer"
                        + (memory_note(plan, zero_stage=zero, runtime_runtime="deepspeed")
                           or " model-state memory differs"))
    text = json_text(config) + "\n"
    return ExportResult("deepspeed", text, tuple(warnings), ".json", tuple(_dp_notes(doc)))


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
