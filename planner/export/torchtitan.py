"""torchtitan job configuration for a plan: TOML tables plus the CLI-override form.

Consumes a validated plan document; produces a TOML fragment with the ``[training]``,
``[parallelism]`` and ``[activation_checkpoint]`` tables of a torchtitan job file (TOML era, up
to v0.2.2, ``torchtitan/config/job_config.py``), merged into the user's job file, and in its
header the equivalent ``--parallelism.*`` overrides, which torchtitan >= 0.3 (Python config
registry, tyro CLI) accepts too. Key names from /work/shared/reference/ecosystem.md B2.

Mapping:

* ZeRO -> FSDP2 over ``data_parallel_shard_degree`` (torchtitan shards over dp_shard x cp, as
  the plan's ZeRO does over dp x cp): ZeRO-3 = ``fsdp_reshard_after_forward = "always"``,
  ZeRO-2 = ``"never"`` (parameters stay gathered between forward and backward). ZeRO-1 has no
  FSDP2 form (exported as ZeRO-2, with a warning); ZeRO-0 is DDP (``data_parallel_replicate_
  degree``) when nothing else is parallel, since torchtitan's DDP is 1-D only.
* Batch: ``local_batch_size`` is per data-parallel rank. Without PP it is the micro-batch and
  ``global_batch_size`` makes torchtitan accumulate gradients over the plan's micro-batches;
  with PP it is the whole per-rank batch, split into ``pipeline_parallel_microbatch_size``.
* Pipeline split: ``module_fqns_per_model_part`` lists the modules of each model part exactly
  (torchtitan's own split counts the embedding and output as layers and would differ), with
  torchtitan's decoder module names ``tok_embeddings``, ``layers.N``, ``norm``, ``output``
  (llama3, qwen3, deepseek_v3). Interleaved plans have pp x v parts; torchtitan's looped
  schedules give part k to rank k mod pp, as the plan does.
* Recomputation: ``mode`` none / full / selective (``selective_ac_option = "op"``); a per-layer
  mix becomes layer-selective AC (``selective_ac_option = "N"``: every N-th block).
"""
from __future__ import annotations

import json
import math
from typing import Any

from planner.plan_types import Plan
from planner.export.base import (ExportResult, chunks, describe_recompute, headline, memory_note,
                                 recompute_counts)

MODULE_NAMES = ("tok_embeddings", "layers.{}", "norm", "output")


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string: same escapes as JSON
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {type(value).__name__}")


def model_parts(doc: dict[str, Any]) -> list[list[str]]:
    parts = []
    for c in chunks(doc):
        names = [MODULE_NAMES[0]] if c.has_embedding else []
        names += [MODULE_NAMES[1].format(i) for i in c.block_indices]
        if c.has_head:
            names += [MODULE_NAMES[2], MODULE_NAMES[3]]
        parts.append(names)
    return parts


def export(plan: Plan) -> ExportResult:
    doc = plan.to_dict()
    p, runtime = doc["parallelism"], doc["runtime"]
    warnings: list[str] = []
    tp, pp, dp, cp, ep, v = p["tp"], p["pp"], p["dp"], p["cp"], p["ep"], p["virtual_stages"]
    zero = p["zero_stage"]
    # -- data parallelism / ZeRO
    replicate, shard, reshard = 1, dp, "never"
    if zero == 3:
        reshard = "always"
    elif zero == 1 and dp * cp > 1:
        warnings.append("ZeRO-1: torchtitan's FSDP2 cannot shard optimizer states alone; "
                        "exported FSDP with fsdp_reshard_after_forward = \"never\" (ZeRO-2: "
                        "gradients sharded too)" + memory_note(plan, zero_stage=2))
    elif zero == 0 and dp > 1:
        if tp == pp == cp == 1:
            replicate, shard = dp, 1
        else:
            warnings.append("ZeRO-0: torchtitan's DDP (data_parallel_replicate_degree) does not "
                            "combine with tensor, pipeline or context parallelism; exported FSDP "
                            "with fsdp_reshard_after_forward = \"never\" (ZeRO-2)"
                            + memory_note(plan, zero_stage=2))
    parallelism: dict[str, Any] = {
        "data_parallel_replicate_degree": replicate,
        "data_parallel_shard_degree": shard,
        "fsdp_reshard_after_forward": reshard,
        "tensor_parallel_degree": tp,
        "enable_async_tensor_parallel": bool(tp > 1 and runtime["tp_comm_overlap"] > 0),
        "pipeline_parallel_degree": pp,
        "context_parallel_degree": cp,
        "expert_parallel_degree": ep,
    }
    if ep > 1:
        parallelism["expert_tensor_parallel_degree"] = tp  # the plan splits experts over tp too
    if tp > 1 and not p["sp"]:
        warnings.append("sequence parallelism: the plan has it off, but TOML-era torchtitan "
                        "always applies it with TP, which stores less activation memory than "
                        "planned" + memory_note(plan, sp=True) + "; torchtitan >= 0.3 takes "
                        "--parallelism.enable_sequence_parallel false (in the header)")
    if parallelism["enable_async_tensor_parallel"]:
        warnings.append("enable_async_tensor_parallel needs [compile] enable = true in the job "
                        "file")
    if pp > 1:
        parallelism["pipeline_parallel_schedule"] = "Interleaved1F1B" if v > 1 else "1F1B"
        parallelism["pipeline_parallel_microbatch_size"] = p["micro_batch"]
        parallelism["module_fqns_per_model_part"] = model_parts(doc)
    # -- batch
    per_rank = p["global_batch"] // dp
    training = {
        "local_batch_size": per_rank if pp > 1 else p["micro_batch"],
        "global_batch_size": p["global_batch"],
        "seq_len": p["seq_len"],
        "mixed_precision_param": "bfloat16",
    }
    if p["dtype"] != "bf16":
        warnings.append(f"dtype {p['dtype']}: exported mixed_precision_param = \"bfloat16\"; "
                        + ("enable Float8 training in the job file's [float8] / converters "
                           "settings yourself" if p["dtype"] == "fp8" else
                           "torchtitan's FSDP mixed precision has no fp16 setting"))
    # -- recomputation
    values = [x["recompute"] for x in doc["layers"] if x["kind"] == "block"]
    counts = recompute_counts(values)
    ac: dict[str, Any]
    if counts["full"] == counts["selective"] == 0:
        ac = {"mode": "none"}
    elif counts["full"] == len(values):
        ac = {"mode": "full"}
    elif counts["selective"] == len(values):
        ac = {"mode": "selective", "selective_ac_option": "op"}
        warnings.append("recompute selective: torchtitan's op-level selective AC (\"op\") "
                        "saves matmul outputs and recomputes the rest, which is not the plan's "
                        "attention-core recomputation; activation memory differs")
    else:
        every = _checkpoint_every(doc)
        ac = {"mode": "selective", "selective_ac_option": str(every)}
        warnings.append(
            f"recompute: plan has {describe_recompute(doc)}; torchtitan has one setting for all "
            f"blocks, so exported layer-selective AC checkpointing every {every}"
            f"{_ordinal(every)} block (full recomputation of about "
            f"{math.ceil(len(values) / every)} of {len(values)} blocks"
            + (", selective blocks made full" if counts["selective"] else "")
            + "): on every stage at least as many blocks as planned, so more recomputation "
              "than planned and never more activation memory")
    warnings.append(f"memory: the plan's model states were predicted for the "
                    f"{runtime['runtime']!r} optimizer layout; torchtitan's FSDP2 keeps fp32 "
                    f"sharded parameters and gradients with bf16 compute copies, so model-state "
                    f"memory per GPU differs from the plan's")
    tables = {"training": training, "parallelism": parallelism, "activation_checkpoint": ac}
    overrides = " ".join(f"--parallelism.{k} {_cli_value(parallelism[k])}"
                         for k in ("data_parallel_replicate_degree", "data_parallel_shard_degree",
                                   "fsdp_reshard_after_forward", "tensor_parallel_degree",
                                   "pipeline_parallel_degree", "context_parallel_degree",
                                   "expert_parallel_degree", "pipeline_parallel_schedule")
                         if k in parallelism)
    if tp > 1:
        overrides += f" --parallelism.enable_sequence_parallel {_cli_value(p['sp'])}"
    lines = [
        f"# torchtitan job settings for {headline(doc)}",
        f"# Generated by shardplan from a plan (schema_version {doc['schema_version']}); merge "
        f"these tables into your job file",
        "# (torchtitan <= 0.2.2 TOML). Module names assume torchtitan's decoder models "
        "(tok_embeddings, layers.N, norm, output).",
        "# torchtitan >= 0.3 (Python configs): pass the parallelism as CLI overrides:",
        f"#   {overrides}",
        "# (batch sizes there are counted in tokens: num_tokens_per_train_step = "
        f"{p['global_batch'] * p['seq_len']})",
    ]
    for table, values_ in tables.items():
        lines.append("")
        lines.append(f"[{table}]")
        for key, value in values_.items():
            lines.append(f"{key} = {_toml_value(value)}")
    return ExportResult("torchtitan", "\n".join(lines) + "\n", tuple(warnings), ".toml")


def _checkpoint_every(doc: dict[str, Any]) -> int:
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


def _cli_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _ordinal(n: int) -> str:
    if 10 <= n % 100 <= 20:
        return "th"
    return {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
