"""What a plan means in torchtitan, before it is written for one torchtitan version.

Consumes a validated plan document; produces :class:`Settings` (the data-parallel / FSDP
degrees, batch, pipeline schedule and split, recomputation) and the warnings that hold for
every torchtitan version. :mod:`planner.export.torchtitan` writes them as the 0.2.2 TOML job
tables or the 0.3 command line. Option names were read from torchtitan's
``torchtitan/config/configs.py`` (``TrainingConfig``, ``ParallelismConfig``; tag v0.2.2's
``torchtitan/config/job_config.py`` for the TOML era) and ``torchtitan/trainer.py``
(``Trainer.Config.__post_init__``: the pipeline micro-batch must divide ``local_batch_size``).

* ZeRO -> FSDP2 over ``data_parallel_shard_degree`` (torchtitan shards over dp_shard x cp, as
  the plan's ZeRO does over dp x cp): ZeRO-3 = ``fsdp_reshard_after_forward = "always"``,
  ZeRO-2 = ``"never"`` (parameters stay gathered between forward and backward); ZeRO-3 under
  PP (dense or MoE) = ``"never"`` too, torchtitan's default with PP, which the cost model
  charges (``planner.cost.terms.keeps_unsharded``: weights gathered once per step). ZeRO-1 has no
  FSDP2 form (exported as ZeRO-2, with a warning); ZeRO-0 is DDP
  (``data_parallel_replicate_degree``) when nothing else is parallel, since torchtitan's DDP
  is 1-D only.
* Batch: ``local_batch_size`` is per data-parallel rank (torchtitan's batch mesh is
  dp_replicate x dp_shard, without cp, like the plan's dp). Without PP it is the micro-batch
  and ``global_batch_size`` makes torchtitan accumulate gradients over the plan's
  micro-batches; with PP it is the whole per-rank batch, split into
  ``pipeline_parallel_microbatch_size``.
* Pipeline split: ``module_fqns_per_model_part`` lists the modules of each model part exactly
  (torchtitan's own split counts the embedding and output as layers and would differ), with
  torchtitan's decoder module names ``tok_embeddings``, ``layers.N``, ``norm``, ``output``.
  Interleaved plans have pp x v parts; torchtitan's looped schedules give part k to rank
  k mod pp, as the plan does; its V schedules (ZBVZeroBubble, DualPipeV) part k to rank k,
  then 2 pp - 1 - k (``style="v"``), as the plan's V placement does. The schedule is
  ``pipeline_parallel_schedule`` under PyTorch's name (planner/profiles.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from planner.cost.terms import keeps_unsharded
from planner.export.base import chunks, memory_note
from planner.plan_types import Plan
from planner.profiles import profile

MODULE_NAMES = ("tok_embeddings", "layers.{}", "norm", "output")


@dataclass
class Settings:
    replicate: int
    shard: int
    reshard: str
    tp: int
    sp: bool
    pp: int
    cp: int
    ep: int
    local_batch: int
    global_batch: int
    seq_len: int
    schedule: str | None = None
    pp_micro_batch: int | None = None
    parts: list[list[str]] | None = None
    async_tp: bool = False
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    changes: dict[str, Any] = field(default_factory=dict)  # ParallelConfig fields it changed


def model_parts(doc: dict[str, Any]) -> list[list[str]]:
    parts = []
    for c in chunks(doc):
        names = [MODULE_NAMES[0]] if c.has_embedding else []
        names += [MODULE_NAMES[1].format(i) for i in c.block_indices]
        if c.has_head:
            names += [MODULE_NAMES[2], MODULE_NAMES[3]]
        parts.append(names)
    return parts


def settings(plan: Plan) -> Settings:
    doc = plan.to_dict()
    p, runtime = doc["parallelism"], doc["runtime"]
    warnings: list[str] = []
    notes: list[str] = []
    tp, pp, dp, cp, ep, v = p["tp"], p["pp"], p["dp"], p["cp"], p["ep"], p["virtual_stages"]
    zero = p["zero_stage"]
    replicate, shard, reshard = 1, dp, "never"
    changes: dict[str, Any] = {}
    if zero == 3:
        # under PP the cost model (torchtitan's profile) keeps the weights
        # gathered over the step, as torchtitan's "default" policy runs PP
        # (reshard_after_forward = not pp_enabled): write that, not "always", whose
        # per-micro-batch all-gathers the plan does not charge
        kept = keeps_unsharded(zero, pp, "torchtitan")
        reshard = "never" if kept else "always"
        if kept:
            notes.append(f"torchtitan: ZeRO-3 under pipeline parallelism: exported "
                         f"fsdp_reshard_after_forward \"never\" (torchtitan's default with PP): "
                         f"each stage's weights are gathered once and kept, and gradients "
                         f"reduce-scattered after the last of the {p['num_micro_batches']} "
                         f"micro-batches, as the plan's memory and time count them")
    elif zero == 1 and dp * cp > 1:
        changes["zero_stage"] = 2
        warnings.append("ZeRO-1: torchtitan's FSDP2 cannot shard optimizer states alone; "
                        "exported FSDP with fsdp_reshard_after_forward \"never\" (ZeRO-2: "
                        "gradients sharded too)" + memory_note(plan, zero_stage=2))
    elif zero == 0 and dp > 1:
        if tp == pp == cp == 1:
            replicate, shard = dp, 1
        else:
            changes["zero_stage"] = 2
            warnings.append("ZeRO-0: torchtitan's DDP (data_parallel_replicate_degree) does not "
                            "combine with tensor, pipeline or context parallelism; exported FSDP "
                            "with fsdp_reshard_after_forward \"never\" (ZeRO-2)"
                            + memory_note(plan, zero_stage=2))
    moe = plan.runtime.moe
    if plan.model.is_moe and moe.capacity_factor:  # torchtitan's token-choice MoE is dropless
        warnings.append(f"MoE capacity factor {moe.capacity_factor:g}: torchtitan's MoE routes "
                        f"dropless (no token-dropping capacity setting), so every routed "
                        f"token is computed" + memory_note(plan, runtime_moe=replace(
                            moe, capacity_factor=0.0)))
    if plan.model.is_moe and moe.dispatcher != "alltoall" and ep > 1:
        warnings.append(f"MoE dispatcher {moe.dispatcher}: torchtitan sets its MoE "
                        f"communication backend (moe_comm_backend deepep / hybridep) in a model "
                        f"registry entry, not on the command line or in the job file; the file "
                        f"runs the entry's own, all-to-all for the full-size models")
    if runtime.get("dropout"):
        warnings.append("dropout: torchtitan's models have no attention or hidden dropout; the "
                        "file trains without it (no masks: less activation memory and time "
                        "than planned)" + memory_note(plan, runtime_dropout=False))
    if plan.model.num_mtp:  # multi-token prediction modules on the last stage (models/mtp.py)
        warnings.append(
            f"multi-token prediction ({plan.model.num_mtp} MTP module(s) on the last stage): "
            f"not exported; torchtitan builds MTP only from a model registry's num_mtp_layers "
            f"(0.3: deepseek_v3's model_registry, set by no 671B config entry and no command "
            f"line option; none before 0.3), so the file trains without it and the last "
            f"stage computes and holds less than planned; give a config whose model_spec has "
            f"num_mtp_layers={plan.model.num_mtp}, with the MTP modules in the last model part")
    if p.get("hpz"):  # ZeRO++ hpZ (planner.config): DeepSpeed's, not FSDP2's
        changes["hpz"] = 0
        warnings.append(f"ZeRO++ hpZ (hpz {p['hpz']}): FSDP2 has no secondary weight "
                        "partition; exported plain FSDP, every gather over all of dp"
                        + memory_note(plan, hpz=0))
    if p.get("dp_shard") and shard == dp:  # hybrid sharding: dp_replicate x dp_shard
        replicate, shard = dp // p["dp_shard"], p["dp_shard"]
    per_rank = p["global_batch"] // dp
    out = Settings(replicate=replicate, shard=shard, reshard=reshard, tp=tp, sp=bool(p["sp"]),
                   pp=pp, cp=cp, ep=ep,
                   local_batch=per_rank if pp > 1 else p["micro_batch"],
                   global_batch=p["global_batch"], seq_len=p["seq_len"],
                   async_tp=bool(tp > 1 and p["sp"] and runtime["tp_comm_overlap"] > 0),
                   warnings=warnings, notes=notes, changes=changes)
    if pp > 1:
        out.schedule = profile("torchtitan").schedule_names.get(p["schedule"], "1F1B")
        out.pp_micro_batch = p["micro_batch"]
        out.parts = model_parts(doc)
    return out


def dtype_warning(doc: dict[str, Any], entry: tuple[str, str] | None = None) -> str | None:
    """The warning for a plan not in bf16, None where the export runs its precision: an fp8
    plan exported with a Float8 registry entry (``entry``, torchtitan >= 0.3)."""
    dtype = doc["parallelism"]["dtype"]
    if dtype == "bf16" or (dtype == "fp8" and entry and entry[1] in FLOAT8_ENTRIES.values()):
        return None
    return (f"dtype {dtype}: exported mixed_precision_param bfloat16; "
            + ("enable Float8 training yourself (torchtitan's Float8 linear converter in the "
               "job's model settings)" if dtype == "fp8" else
               "torchtitan's FSDP mixed precision has no fp16 setting"))


def block_recompute(doc: dict[str, Any]) -> list[str]:
    return [x["recompute"] for x in sorted(doc["layers"], key=lambda x: x["index"])
            if x["kind"] == "block"]


def uniform_recompute(doc: dict[str, Any]) -> str | None:
    """'none' / 'full' / 'selective' / 'op' when every block has that setting, else None."""
    values = block_recompute(doc)
    for kind in ("none", "full", "selective", "op"):
        if all(v == kind for v in values):
            return kind
    return None


def checkpoint_every(doc: dict[str, Any]) -> int:
    """The largest N such that checkpointing every N-th block recomputes, on every pipeline
    rank, at least as many blocks as the plan does there (full or selective)."""
    pp = doc["parallelism"]["pp"]
    blocks = [0] * pp
    wanted = [0] * pp
    for layer in doc["layers"]:
        if layer["kind"] == "block":
            blocks[layer["stage"]] += 1
            wanted[layer["stage"]] += layer["recompute"] != "none"
    for every in range(max(blocks), 1, -1):
        if all(b // every >= w for b, w in zip(blocks, wanted)):
            return every
    return 1


# torchtitan >= 0.3 config registry entries (``torchtitan/models/*/config_registry.py``) by
# model shape: (family prefix, blocks, hidden) -> (--module, --config)
REGISTRY = {
    ("llama", 32, 4096): ("llama3", "llama3_8b"),
    ("llama", 80, 8192): ("llama3", "llama3_70b"),
    ("llama", 126, 16384): ("llama3", "llama3_405b"),
    ("qwen3", 28, 1024): ("qwen3", "qwen3_0_6b"),
    ("qwen3", 28, 2048): ("qwen3", "qwen3_1_7b"),
    ("qwen3", 40, 5120): ("qwen3", "qwen3_14b"),
    ("qwen3", 48, 2048): ("qwen3", "qwen3_30b_a3b"),
    ("qwen3", 64, 5120): ("qwen3", "qwen3_32b"),
    ("deepseek_v3", 27, 2048): ("deepseek_v3", "deepseek_v3_16b"),
    ("deepseek_v3", 61, 7168): ("deepseek_v3", "deepseek_v3_671b"),
    ("gpt_oss", 24, 2880): ("gpt_oss", "gpt_oss_20b"),
    ("gpt_oss", 36, 2880): ("gpt_oss", "gpt_oss_120b"),
}


# entries with a Float8 variant (torchtitan 0.3 models/deepseek_v3/config_registry.py
# deepseek_v3_671b_float8: torchao Float8 on the dense Linears but lm_head and router.gate, and
# on the grouped expert GEMMs): an fp8 plan takes it, the only way 0.3's command line sets
# the model's converters. llama3_8b_mxfp8 is MXFP8 (block scaling, Blackwell), not this.
FLOAT8_ENTRIES = {"deepseek_v3_671b": "deepseek_v3_671b_float8"}


def registry_entry(doc: dict[str, Any]) -> tuple[str, str] | None:
    model = doc["model"]
    family = str(model.get("family", ""))
    for (prefix, blocks, hidden), entry in REGISTRY.items():
        if family.startswith(prefix) and model["num_layers"] == blocks and \
                model.get("hidden") == hidden:
            if doc["parallelism"]["dtype"] == "fp8" and entry[1] in FLOAT8_ENTRIES:
                return entry[0], FLOAT8_ENTRIES[entry[1]]
            return entry
    return None
