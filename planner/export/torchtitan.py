"""torchtitan configuration for a plan, for the torchtitan version the user runs.

Consumes a validated plan document and a target version; produces

* ``0.3`` (default; torchtitan >= 0.3, Python config registry parsed by tyro): a bash file
  defining ``TORCHTITAN_ARGS``, the complete command line after ``-m torchtitan.train``:
  ``--module`` / ``--config`` (the registry entry of the model, when one matches), every
  parallelism, batch, pipeline micro-batch, split and recomputation setting the plan fixes,
  so no registry default is left standing for them. tyro's forms, read from torchtitan 0.3's
  ``ConfigManager`` (``tyro.cli`` over ``Trainer.Config``): booleans are flags
  (``--parallelism.enable_sequence_parallel`` / ``--parallelism.no-enable-sequence-parallel``,
  ``--training.disable_cuda_graphs``), a ``list[list[str]]`` is one comma-joined word per
  inner list, and activation checkpointing is a subcommand (``activation_checkpoint:full`` /
  ``:selective`` / ``:none``), which comes last because tyro reads the parent's flags before
  it. ``Trainer.Config`` refuses CUDA graphs with pipeline parallelism and with the
  expert-parallel token dispatchers, so ``--training.disable_cuda_graphs`` is set for pp > 1
  or ep > 1. 0.3 has no expert tensor parallelism and no layer-selective recomputation.
* ``0.2.2`` (torchtitan <= 0.2.2): the ``[training]``, ``[parallelism]`` and
  ``[activation_checkpoint]`` TOML tables of a job file. A per-layer mix of recomputation
  becomes layer-selective AC (``selective_ac_option = "N"``: every N-th block).

The mapping itself (FSDP, batch, split) is :mod:`planner.export.torchtitan_settings`.
"""
from __future__ import annotations

import math
from typing import Any

from planner.errors import invalid
from planner.plan_types import Plan
from planner.export.base import (ExportResult, describe_recompute, headline, launch_size,
                                 memory_note)
from planner.export.quoting import bash_array_file, comment, toml_key, toml_value
from planner.export import recompute_rules as rules
from planner.export.retarget import retarget_warning
from planner.export.torchtitan_settings import (block_recompute, checkpoint_every,
                                                dtype_warning, registry_entry, settings,
                                                uniform_recompute)

ARRAY = "TORCHTITAN_ARGS"
# what a compiled plan compiles: the model (the fused element-wise cost and async TP need it)
# and the loss; torchtitan's CompileConfig.components default, written out because registry
# entries change it (torchtitan/config/configs.py CompileConfig, 0.2.2 job_config.Compile)
COMPILE_COMPONENTS = ("model", "loss")
VERSIONS = ("0.3", "0.2.2")  # newest first: the default is VERSIONS[0]


def export(plan: Plan, version: str | None = None) -> ExportResult:
    version = resolve_version(version)
    if version == "0.3":
        return _export_cli(plan)
    return _export_toml(plan)


def resolve_version(version: str | None) -> str:
    """'0.3' for any 0.3.x, '0.2.2' for 0.1 .. 0.2.2 (the TOML era); refuses others."""
    if version is None:
        return VERSIONS[0]
    parts = version.strip().lstrip("v").split(".")
    try:
        numbers = tuple(int(x) for x in parts)
    except ValueError:
        numbers = ()
    if not numbers or len(numbers) > 3:
        raise invalid(f"torchtitan target version {version!r} is not a version number",
                      f"supported: {', '.join(VERSIONS)} (default {VERSIONS[0]})")
    numbers = numbers + (0,) * (3 - len(numbers))
    if numbers[:2] == (0, 3):
        return "0.3"
    if (0, 1, 0) <= numbers <= (0, 2, 2):
        return "0.2.2"
    raise invalid(f"torchtitan {version} is not a supported target version",
                  f"supported: 0.1 .. 0.2.2 (TOML job files) and 0.3.x (command line); "
                  f"default {VERSIONS[0]}")


def _ordinal(n: int) -> str:
    if 10 <= n % 100 <= 20:
        return "th"
    return {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")


def _export_cli(plan: Plan) -> ExportResult:
    doc = plan.to_dict()
    s = settings(plan)
    warnings, notes = list(s.warnings), list(s.notes)
    rows: list[tuple[Any, ...]] = []
    entry = registry_entry(doc)
    dtype = dtype_warning(doc, entry)
    if dtype:
        warnings.append(dtype)
    if entry:
        rows.append(("--module", entry[0], "--config", entry[1]))
    else:
        notes.append(f"torchtitan: no config registry entry matches the model "
                     f"({doc['model']['num_layers']} blocks, hidden "
                     f"{doc['model'].get('hidden')}); put --module and --config for your "
                     f"model in front of {ARRAY} (see the Use line)")
    rows += [
        ("--parallelism.data_parallel_replicate_degree", s.replicate),
        ("--parallelism.data_parallel_shard_degree", s.shard),
        ("--parallelism.fsdp_reshard_after_forward", s.reshard),
        ("--parallelism.tensor_parallel_degree", s.tp),
        ("--parallelism.enable_sequence_parallel" if s.sp or s.tp == 1 else
         "--parallelism.no-enable-sequence-parallel",),
        ("--parallelism.pipeline_parallel_degree", s.pp),
    ]
    if s.pp > 1:  # the split takes one word per part: the next flag ends it
        rows += [("--parallelism.pipeline_parallel_schedule", s.schedule),
                 ("--parallelism.pipeline_parallel_microbatch_size", s.pp_micro_batch),
                 ("--parallelism.module_fqns_per_model_part",
                  *(",".join(part) for part in s.parts))]
    rows += [
        ("--parallelism.context_parallel_degree", s.cp),
        ("--parallelism.expert_parallel_degree", s.ep),
        ("--training.local_batch_size", s.local_batch),
        ("--training.global_batch_size", s.global_batch),
        ("--training.seq_len", s.seq_len),
        ("--training.mixed_precision_param", "bfloat16"),
    ]
    if s.pp > 1 or s.ep > 1:
        rows.append(("--training.disable_cuda_graphs",))
    etp = plan.mesh.expert_tp
    if s.ep > 1 and etp > 1:
        warnings.append(f"expert tensor parallelism: torchtitan 0.3 has none (its expert mesh "
                        f"is efsdp x ep); the plan splits each expert over etp {etp}, "
                        f"torchtitan keeps experts whole on each of the ep {s.ep} ranks, so "
                        f"expert weights take up to {etp}x the planned memory")
    if s.async_tp or plan.runtime.compiled:  # torchtitan refuses async TP uncompiled
        # the components too: a registry entry may compile the loss alone (deepseek_v3_16b /
        # _671b: components ["loss"]), which leaves the model eager and makes CompileConfig
        # refuse async TP ("Async TP requires 'model' in --compile.components")
        rows.append(("--compile.components", ",".join(COMPILE_COMPONENTS)))
        rows.append(("--compile.enable",))
    if s.async_tp:
        rows.append(("--compile.enable_async_tensor_parallel",))
        _async_tp_message(plan, warnings, notes, "--compile.enable")
    rows.append((f"activation_checkpoint:{_cli_recompute(doc, warnings)}",))
    retarget = retarget_warning(plan, "torchtitan", **s.changes)
    if retarget:
        warnings.append(retarget)
    gpus, nodes = launch_size(doc)
    module = "" if entry else "--module MODULE --config CONFIG "
    comments = [
        f"torchtitan 0.3 command line for {headline(doc)}",
        f"Generated by shardplan from a plan (schema_version {doc['schema_version']}): every "
        f"parallelism, batch, pipeline and recomputation setting of the plan; data, tokenizer,",
        "optimizer and checkpoint settings come from the --config registry entry.",
        f"Use:  source THIS_FILE; torchrun --nproc-per-node {gpus} --nnodes {nodes} "
        f"-m torchtitan.train {module}\"${{{ARRAY}[@]}}\"",
    ]
    text = bash_array_file(comments, ARRAY, rows)
    return ExportResult("torchtitan", text, tuple(warnings), ".sh", tuple(notes))


def _async_tp_message(plan: Plan, warnings: list[str], notes: list[str], flag: str) -> None:
    """torchtitan overlaps TP collectives only as async TP, which it runs compiled."""
    from planner.calibration.store import shipped

    eager = plan.runtime.elementwise_factor
    cal = shipped()  # torch.compile's residual element-wise traffic (calibrated)
    compiled = cal.constants.get("compiled_elementwise") if cal is not None else 1.0
    if plan.runtime.compiled or eager <= max(compiled, 1.0) + 1e-9:  # costed as compiled
        notes.append(f"torchtitan: async tensor parallelism (the plan's TP overlap) runs only "
                     f"under torch.compile: exported {flag}, as the plan's fused element-wise "
                     f"cost assumes")
    else:
        warnings.append(f"tp_comm_overlap: exported async tensor parallelism, which torchtitan "
                        f"runs only under torch.compile ({flag}); the plan's element-wise cost "
                        f"is eager ({eager:g}x fused traffic), so the compiled run's time and "
                        f"activation memory are lower than planned")


def _op_everywhere(doc: dict[str, Any], values: list[str]) -> str:
    return (f"recompute: the plan has {describe_recompute(doc)}; torchtitan applies one AC "
            f"setting to every block, so exported per-op SAC on all {len(values)} blocks "
            f"(slower than planned, never more activation memory)")


def _cli_recompute(doc: dict[str, Any], warnings: list[str]) -> str:
    kind = uniform_recompute(doc)
    if kind == "none":
        return "none"
    if kind == "full":
        return "full"
    if kind == "op":  # torchtitan's SelectiveAC is per-op SAC, the plan's "op" policy
        return "selective"
    if kind == "selective":
        warnings.append("recompute selective: torchtitan's selective AC saves matmul outputs "
                        "and recomputes the other ops, which is not the plan's attention-core "
                        "recomputation; activation memory differs")
        return "selective"
    values = block_recompute(doc)
    if set(values) <= {"none", "op"}:
        warnings.append(_op_everywhere(doc, values))
        return "selective"
    warnings.append(f"recompute: the plan has {describe_recompute(doc)}; torchtitan 0.3 has one "
                    f"setting for all blocks (no layer-selective AC), so exported full "
                    f"recomputation of all {len(values)} blocks: slower than planned, never more "
                    f"activation memory")
    return "full"


def _export_toml(plan: Plan) -> ExportResult:
    doc = plan.to_dict()
    s = settings(plan)
    warnings, notes = list(s.warnings), list(s.notes)
    dtype = dtype_warning(doc)
    if dtype:
        warnings.append(dtype)
    parallelism: dict[str, Any] = {
        "data_parallel_replicate_degree": s.replicate,
        "data_parallel_shard_degree": s.shard,
        "fsdp_reshard_after_forward": s.reshard,
        "tensor_parallel_degree": s.tp,
        "enable_async_tensor_parallel": s.async_tp,
        "pipeline_parallel_degree": s.pp,
        "context_parallel_degree": s.cp,
        "expert_parallel_degree": s.ep,
    }
    if s.ep > 1:  # the plan's expert mesh (planner.mesh): etp x ep x edp
        etp = plan.mesh.expert_tp
        parallelism["expert_tensor_parallel_degree"] = etp
        if etp not in (1, s.tp):
            warnings.append(f"expert tensor parallelism {etp}: torchtitan takes "
                            f"expert_tensor_parallel_degree 1 or tp ({s.tp}) only")
    changes = dict(s.changes)
    if s.tp > 1 and not s.sp:
        changes["sp"] = True
        warnings.append("sequence parallelism: the plan has it off, but torchtitan <= 0.2.2 "
                        "always applies it with TP, which stores less activation memory than "
                        "planned" + memory_note(plan, sp=True) + "; torchtitan 0.3 can turn it "
                        "off (--target-version 0.3)")
    tables: list[tuple[str, dict[str, Any]]] = []
    if s.async_tp or plan.runtime.compiled:  # torchtitan refuses async TP uncompiled
        tables.append(("compile", {"enable": True, "components": list(COMPILE_COMPONENTS)}))
    if s.async_tp:
        _async_tp_message(plan, warnings, notes, "[compile] enable = true")
    if s.pp > 1:
        parallelism["pipeline_parallel_schedule"] = s.schedule
        parallelism["pipeline_parallel_microbatch_size"] = s.pp_micro_batch
        parallelism["module_fqns_per_model_part"] = s.parts
    training = {"local_batch_size": s.local_batch, "global_batch_size": s.global_batch,
                "seq_len": s.seq_len, "mixed_precision_param": "bfloat16"}
    ac = _toml_recompute(plan, doc, warnings)
    retarget = retarget_warning(plan, "torchtitan", **changes)
    if retarget:
        warnings.append(retarget)
    lines = [
        f"# torchtitan job settings for {comment(headline(doc))}",
        f"# Generated by shardplan from a plan (schema_version {doc['schema_version']}) for "
        f"torchtitan <= 0.2.2 (TOML job files); merge",
        "# these tables into your job file. Module names assume torchtitan's decoder models "
        "(tok_embeddings, layers.N, norm, output).",
        "# torchtitan 0.3 reads no TOML: export with --target-version 0.3 for its command line.",
    ]
    for table, values_ in (("training", training), ("parallelism", parallelism),
                           ("activation_checkpoint", ac), *tables):
        lines.append("")
        lines.append(f"[{toml_key(table)}]")
        for key, value in values_.items():
            lines.append(f"{toml_key(key)} = {toml_value(value, key)}")
    return ExportResult("torchtitan", "\n".join(lines) + "\n", tuple(warnings), ".toml",
                        tuple(notes))


def _toml_recompute(plan: Plan, doc: dict[str, Any], warnings: list[str]) -> dict[str, Any]:
    """The [activation_checkpoint] table: one mode for all blocks, or layer-selective AC
    (every N-th block of each rank), exact when it costs what the plan's mix does."""
    kind = uniform_recompute(doc)
    if kind in ("none", "full"):
        return {"mode": kind}
    if kind == "op":  # per-op SAC, the plan's "op" policy
        return {"mode": "selective", "selective_ac_option": "op"}
    if kind == "selective":
        warnings.append("recompute selective: torchtitan's op-level selective AC (\"op\") "
                        "saves matmul outputs and recomputes the rest, which is not the plan's "
                        "attention-core recomputation; activation memory differs")
        return {"mode": "selective", "selective_ac_option": "op"}
    values = block_recompute(doc)
    if set(values) <= {"none", "op"}:
        warnings.append(_op_everywhere(doc, values))
        return {"mode": "selective", "selective_ac_option": "op"}
    exact = rules.exact_count(plan, rules.every_nth, len(values))
    if exact is not None:
        return {"mode": "selective", "selective_ac_option": str(exact)}
    every = checkpoint_every(doc)
    selective = sum(1 for v in values if v == "selective")
    warnings.append(
        f"recompute: plan has {describe_recompute(doc)}; torchtitan has one setting for all "
        f"blocks, so exported layer-selective AC checkpointing every {every}"
        f"{_ordinal(every)} block (full recomputation of about "
        f"{math.ceil(len(values) / every)} of {len(values)} blocks"
        + (", selective blocks made full" if selective else "")
        + "): on every stage at least as many blocks as planned, so more recomputation "
          "than planned and never more activation memory")
    return {"mode": "selective", "selective_ac_option": str(every)}
