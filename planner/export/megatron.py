"""Megatron-LM / Megatron-Core command-line arguments for a plan.

Consumes a validated plan document; produces a bash file defining an array
``MEGATRON_PARALLEL_ARGS`` (one flag and its value per line, every word and comment through
:mod:`planner.export.quoting`) to splice into
a ``pretrain_gpt.py`` command line next to the model-shape, data and optimizer arguments, which
the plan does not fix.

Flag names from Megatron-LM (``megatron/training/arguments.py`` at d98e8a64, and the flags its
examples/ and tests/functional_tests/ scripts use): parallel sizes, ``--sequence-parallel``,
``--num-virtual-stages-per-pipeline-rank`` (works with even and uneven splits;
``--virtual-pipeline-model-parallel-size`` has no CLI flag), ``--decoder-first/last-pipeline-
num-layers``, ``--pipeline-model-parallel-layout`` (``E`` embedding, ``t`` decoder layer, ``L``
loss, ``|`` between stages; megatron/core/transformer/pipeline_parallel_layer_layout.py reads
the stages in VPP-major order), batch sizes, ``--recompute-*``, ``--use-distributed-optimizer``,
``--overlap-grad-reduce`` / ``--overlap-param-gather``, ``--num-layers``, ``--seq-length``,
``--cpu-offloading`` / ``--cpu-offloading-num-layers``.
Also long-standing Megatron-LM arguments.py flags: ``--bf16`` / ``--fp16``, ``--fp8-format``,
``--attention-dropout`` / ``--hidden-dropout`` and ``--tp-comm-overlap``.

Pipeline split: Megatron's default (no flag) spreads the decoder layers evenly with the
embedding on the first and the loss on the last stage, as the plan's layers do when the counts
are equal. Uneven first/last stages use the two ``--decoder-*-pipeline-num-layers`` flags; any
other split (and uneven chunks when interleaved) is written exactly as a
``--pipeline-model-parallel-layout``.
"""
from __future__ import annotations

from typing import Any

from planner.cost.recompute_modules import DEFAULT_RECOMPUTE_MODULES
from planner.moe import DEFAULT_A2A_OVERLAP, SYNC_FREE_RANK_CAPACITY
from planner.offload_rules import offloaded_blocks, plan_refusals
from planner.pipeline_layout import chunk_symbols, format_layout, parse_layout
from planner.plan_types import Plan
from planner.export.base import (ExportResult, blocks_per_rank, chunks, describe_recompute,
                                 headline, launch_size, memory_note, recompute_counts)
from planner.export import recompute_rules as rules
from planner.export.offload import (activation_offload_warning, offloaded,
                                    optimizer_offload_warning)
from planner.export.quoting import bash_array_file, parse_bash_array_file
from planner.export.retarget import retarget_warning

ARRAY = "MEGATRON_PARALLEL_ARGS"


def layout_string(doc: dict[str, Any]) -> str:
    """The exact ``--pipeline-model-parallel-layout`` of the plan: one segment per chunk
    (planner/pipeline_layout.py), or the plan's recorded ``pipeline_layout`` as written where
    it says the same (``evaluate --pipeline-layout``)."""
    parts = tuple(chunk_symbols(c.has_embedding, c.num_blocks, c.num_mtp, c.has_head)
                  for c in chunks(doc))
    recorded = doc["parallelism"].get("pipeline_layout")
    if recorded and parse_layout(recorded).chunks == parts:
        return recorded
    return format_layout(parts)


def _pipeline(doc: dict[str, Any], args: list, warnings: list[str]) -> None:
    p = doc["parallelism"]
    pp, v = p["pp"], p["virtual_stages"]
    if pp == 1:
        return
    if p["schedule"] not in ("1f1b", "interleaved-1f1b"):
        warnings.append(f"schedule {p['schedule']}: Megatron-LM runs 1F1B and interleaved 1F1B "
                        f"only (no zero-bubble schedule); exported as "
                        f"{'interleaved 1F1B' if v > 1 else '1F1B'} over the same model chunks, "
                        f"with its larger bubble" + ("; the V's chunks go round-robin"
                                                    if v > 1 else ""))
    parts = chunks(doc)
    counts = [c.num_blocks for c in parts]
    if p.get("pipeline_layout"):  # an explicit layout stays one
        args.append(("--pipeline-model-parallel-layout", layout_string(doc)))
        return
    if v > 1:
        if len(set(counts)) == 1 and len(parts) == pp * v:
            args.append(("--num-virtual-stages-per-pipeline-rank", v))
        else:
            args.append(("--pipeline-model-parallel-layout", layout_string(doc)))
        return
    per_rank = blocks_per_rank(doc)
    if len(set(per_rank)) == 1:
        return  # Megatron's default even split
    middle = per_rank[1:-1]
    if 0 not in per_rank and len(set(middle)) <= 1:
        if pp == 2:
            args.append(("--decoder-first-pipeline-num-layers", per_rank[0]))
            return
        if per_rank[0] != middle[0]:
            args.append(("--decoder-first-pipeline-num-layers", per_rank[0]))
        if per_rank[-1] != middle[0]:
            args.append(("--decoder-last-pipeline-num-layers", per_rank[-1]))
        return
    args.append(("--pipeline-model-parallel-layout", layout_string(doc)))


def _recompute(plan: Plan, doc: dict[str, Any], args: list, warnings: list[str],
               notes: list[str]) -> None:
    p = doc["parallelism"]
    values = [x["recompute"] for x in doc["layers"] if x["kind"] == "block"]
    counts = recompute_counts(values)
    if counts["full"] == counts["selective"] == 0:
        return
    if counts["full"] == len(values):
        args += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"),
                 ("--recompute-num-layers", 1)]
        return
    modules = tuple(plan.runtime.recompute_modules)
    selective = [("--recompute-granularity", "selective")]  # core_attn by default
    if modules != DEFAULT_RECOMPUTE_MODULES:
        selective.append(("--recompute-modules", *modules))
    if counts["selective"] == len(values):
        args += selective
        return
    planned = describe_recompute(doc)
    if counts["full"] == 0:
        # selective on some blocks only: Megatron's selective switch covers every layer
        args += selective
        warnings.append(
            f"recompute: the plan recomputes {', '.join(modules)} of some blocks only "
            f"({planned}); Megatron's --recompute-granularity selective applies to every layer, "
            f"so the remaining {counts['none']} blocks also recompute it (a little slower, never "
            f"more memory)")
        return
    # Megatron's block method recomputes the first N layers of every pipeline stage (of every
    # model chunk when interleaved), all with the same N. N is exact when every rank then
    # holds the plan's number of recomputed blocks of each class (the cost model's view, so
    # memory and time are the plan's): planner.export.recompute_rules.
    parts = chunks(doc)
    unit = "model chunk" if p["virtual_stages"] > 1 else "stage"
    exact = rules.exact_count(plan, rules.megatron_block, max(c.num_blocks for c in parts))
    if exact is not None:
        args += [("--recompute-granularity", "full"), ("--recompute-method", "block"),
                 ("--recompute-num-layers", exact)]
        if rules.megatron_block(plan, exact) != rules.block_settings(plan):
            notes.append(f"megatron: --recompute-method block recomputes the first {exact} "
                         f"blocks of each {unit}, not the very blocks the plan marks "
                         f"({planned}): the same number of each block class on every "
                         f"pipeline rank, so the plan's memory and step time")
        return
    recomputed = [sum(1 for r in c.recompute if r != "none") for c in parts]
    n = max(recomputed)
    args += [("--recompute-granularity", "full"), ("--recompute-method", "block"),
             ("--recompute-num-layers", n)]
    reasons = []
    if counts["selective"]:
        reasons.append(f"the plan's {counts['selective']} selective blocks become full "
                       f"recomputation (Megatron has one granularity)")
    reasons.append(f"per-{unit} counts {', '.join(map(str, recomputed))} give no single "
                   f"--recompute-num-layers, so every {unit} recomputes its first {n} blocks "
                   f"(slower than planned, never more memory)")
    warnings.append(f"recompute: plan has {planned}; exported --recompute-method block "
                    f"--recompute-num-layers {n}: " + "; ".join(reasons))


def _experts(plan: Plan, args: list, warnings: list[str], notes: list[str]) -> None:
    """MoE: the expert mesh (``--expert-model-parallel-size``, ``--expert-tensor-parallel-size``;
    edp follows) and the ``--moe-*`` options the plan's costs assume (Megatron-Core MoE README:
    grouped GEMM, permute fusion, the alltoall or DeepEP flex dispatcher, capacity, EP overlap).
    The model-shape flags (experts, top-k, widths, MoE layer pattern) are written too, since
    the expert split is meaningless without them."""
    blocks = list(plan.model.blocks())
    moe = [b.mlp for b in blocks if b.mlp is not None and b.mlp.is_moe]
    if not moe:
        return
    mlp, mesh, opts = moe[0], plan.mesh, plan.runtime.moe
    if mesh.ep > 1:
        args.append(("--expert-model-parallel-size", mesh.ep))
    args.append(("--expert-tensor-parallel-size", mesh.expert_tp))
    pattern = [1 if (b.mlp is not None and b.mlp.is_moe) else 0 for b in blocks]
    freq = "([1]*{})".format(len(pattern)) if all(pattern) else "[" + ",".join(map(str, pattern)) + "]"
    args += [("--num-experts", mlp.num_experts), ("--moe-router-topk", mlp.top_k),
             ("--moe-ffn-hidden-size", mlp.ffn_hidden), ("--moe-layer-freq", freq)]
    if mlp.shared_ffn_hidden:
        args.append(("--moe-shared-expert-intermediate-size", mlp.shared_ffn_hidden))
    if mlp.group_limited:  # group-limited (node-limited) routing: the costed dispatch assumes it
        args += [("--moe-router-num-groups", mlp.expert_groups),
                 ("--moe-router-group-topk", mlp.groups_per_token)]
    args += [("--moe-grouped-gemm",), ("--moe-permute-fusion",)]
    sync_free = opts.cuda_graph == "full_iteration" and opts.dropless
    if opts.dispatcher == "deepep" and sync_free:  # sync-free needs the HybridEP backend
        args += [("--moe-token-dispatcher-type", "flex"),
                 ("--moe-flex-dispatcher-backend", "hybridep")]
    elif opts.dispatcher == "deepep":
        args += [("--moe-token-dispatcher-type", "flex"), ("--moe-enable-deepep",)]
    else:
        args.append(("--moe-token-dispatcher-type", "alltoall"))
    if not opts.dropless:
        args += [("--moe-expert-capacity-factor", opts.capacity_factor),
                 ("--moe-pad-expert-input-to-capacity",)]
    if opts.cuda_graph == "full_iteration":  # Megatron-Core full-iteration graph, sync-free MoE
        args += [("--cuda-graph-impl", "local"), ("--cuda-graph-scope", "full_iteration")]
        if sync_free:  # buffers pre-sized: Megatron-Core paged stash (docs: MoE paged stash)
            args += [("--use-transformer-engine-op-fuser",),
                     ("--moe-expert-rank-capacity-factor", SYNC_FREE_RANK_CAPACITY),
                     ("--moe-paged-stash",)]
            if opts.dispatcher != "deepep":
                warnings.append("megatron: sync-free dropless MoE under a full-iteration CUDA "
                                "graph needs the flex dispatcher with the HybridEP backend "
                                "(--moe-dispatcher deepep); the plan's alltoall dispatcher "
                                "reads token counts back, which the graph cannot capture")
    elif opts.cuda_graph == "moe":  # each MoE layer captured by Transformer Engine
        args += [("--cuda-graph-impl", "transformer_engine"), ("--cuda-graph-scope", "moe")]
    if opts.a2a_overlap > DEFAULT_A2A_OVERLAP and mesh.ep > 1:  # more than runtimes hide anyway
        args += [("--overlap-moe-expert-parallel-comm",), ("--delay-wgrad-compute",)]
        notes.append(f"megatron: the plan hides {opts.a2a_overlap:g} of the expert all-to-all "
                     f"behind compute; exported --overlap-moe-expert-parallel-comm "
                     f"--delay-wgrad-compute, Megatron's way of hiding it")
    if len({(b.mlp.num_experts, b.mlp.top_k, b.mlp.ffn_hidden) for b in blocks
            if b.mlp is not None and b.mlp.is_moe}) > 1:
        warnings.append("MoE layers of different shapes: Megatron takes one --num-experts / "
                        "--moe-ffn-hidden-size; the first MoE layer's are exported")


def _optimizer_offload(plan: Plan, doc: dict[str, Any], args: list, warnings: list[str],
                       notes: list[str]) -> None:
    """Optimizer offload of every layer (LayerOption.offload) as Megatron-Core's hybrid device
    optimizer: ``--optimizer-cpu-offload --optimizer-offload-fraction 1.0``, which needs
    ``--use-precision-aware-optimizer`` (validate_args) and so the distributed optimizer
    (megatron/core/optimizer/cpu_offloading). Its fraction takes parameters in parameter-group
    order, not by layer, so a per-layer subset has no exact form."""
    host = offloaded(plan, "offload")
    if not host:
        return
    if len(host) < len(plan.layers):
        warnings.append(optimizer_offload_warning(plan, "megatron"))
        return
    if doc["parallelism"]["zero_stage"] < 1:
        warnings.append(optimizer_offload_warning(
            plan, "megatron", "Megatron-Core's --optimizer-cpu-offload needs the distributed "
            "optimizer (ZeRO-1), which the plan does not use"))
        return
    args += [("--optimizer-cpu-offload",), ("--optimizer-offload-fraction", 1.0),
             ("--use-precision-aware-optimizer",)]
    notes.append("megatron: the optimizer step runs on the host (--optimizer-cpu-offload); the "
                 "plan charges the gradient and weight copies one after the other, so "
                 "--overlap-cpu-optimizer-d2h-h2d, which overlaps them, runs faster than planned")


def _activation_offload(plan: Plan, args: list, warnings: list[str]) -> None:
    """Per-block activation offload (LayerOption.act_offload) as Megatron-Core's layer-level
    CPU offload of the first ``--cpu-offloading-num-layers`` decoder layers, where its
    TransformerConfig accepts it (:func:`planner.offload_rules.plan_refusals`);
    ``--fine-grained-activation-offloading`` offloads the inputs of named modules in every
    layer, which is not the whole-block offload the plan costs."""
    offloaded = offloaded_blocks(plan)
    if not offloaded:
        return
    refused = plan_refusals(plan)
    if not refused:
        args += [("--cpu-offloading",), ("--cpu-offloading-num-layers", offloaded)]
        return
    warnings.append(activation_offload_warning(
        plan, "megatron", f"Megatron-Core's --cpu-offloading cannot run it ({'; '.join(refused)}) "
        f"and --fine-grained-activation-offloading offloads module inputs of every layer, not "
        f"whole blocks"))


def export(plan: Plan) -> ExportResult:
    doc = plan.to_dict()
    p, runtime = doc["parallelism"], doc["runtime"]
    warnings: list[str] = []
    notes: list[str] = []
    args: list[tuple[str, Any] | tuple[str]] = [
        ("--tensor-model-parallel-size", p["tp"]),
        ("--pipeline-model-parallel-size", p["pp"]),
    ]
    if p["sp"]:
        args.append(("--sequence-parallel",))
    if p["cp"] > 1:
        args.append(("--context-parallel-size", p["cp"]))
    _experts(plan, args, warnings, notes)
    if plan.model.num_mtp:  # multi-token prediction modules on the last stage (models/mtp.py)
        args.append(("--mtp-num-layers", plan.model.num_mtp))
    args += [("--num-layers", doc["model"]["num_layers"]), ("--seq-length", p["seq_len"]),
             ("--micro-batch-size", p["micro_batch"]), ("--global-batch-size", p["global_batch"])]
    _pipeline(doc, args, warnings)
    _recompute(plan, doc, args, warnings, notes)
    _optimizer_offload(plan, doc, args, warnings, notes)
    _activation_offload(plan, args, warnings)
    zero = p["zero_stage"]
    if zero >= 1:
        args.append(("--use-distributed-optimizer",))
    if p.get("hpz"):  # ZeRO++ hpZ (planner.config): DeepSpeed's, not Megatron's
        warnings.append(f"ZeRO++ hpZ (hpz {p['hpz']}): Megatron-LM has no secondary weight "
                        "partition; exported without it" + memory_note(plan, hpz=0))
    if p.get("dp_shard"):  # hybrid sharding: dp / dp_shard distributed-optimizer instances
        args.append(("--num-distributed-optimizer-instances", p["dp"] // p["dp_shard"]))
    if runtime["overlap_grad_reduce"]:
        args.append(("--overlap-grad-reduce",))
        if zero >= 1 and runtime["overlap_param_gather"]:
            args.append(("--overlap-param-gather",))
    elif zero >= 1 and runtime["overlap_param_gather"]:
        warnings.append("overlap: the plan overlaps the parameter all-gather but not the "
                        "gradient reduction; Megatron's --overlap-param-gather needs "
                        "--overlap-grad-reduce, so neither is exported (slower than planned)")
    if zero >= 2:
        warnings.append(
            f"ZeRO-{zero}: Megatron's data parallelism has no ZeRO-{zero}; exported "
            f"--use-distributed-optimizer, which shards only the optimizer states (ZeRO-1)"
            + memory_note(plan, zero_stage=1) + ". Megatron-FSDP (--use-megatron-fsdp "
            f"--data-parallel-sharding-strategy "
            f"{'optim_grads' if zero == 2 else 'optim_grads_params'}) is the sharded "
            f"alternative; it needs its own checkpoint format and is not emitted")
    if p["dtype"] == "fp16":
        args.append(("--fp16",))
    else:
        args.append(("--bf16",))
    if p["dtype"] == "fp8":
        args.append(("--fp8-format", "hybrid"))
        notes.append("megatron: dtype fp8 is exported as --bf16 --fp8-format hybrid "
                     "(Transformer Engine FP8 GEMMs, BF16 elsewhere); the scaling recipe is "
                     "Megatron's default, which the plan does not model")
        if runtime.get("fp8_attention"):  # the attention core in FP8 (planner.cost.compute)
            args.append(("--fp8-dot-product-attention",))
    loss = runtime.get("cross_entropy", "fp32")
    if loss == "fused":  # Transformer Engine's fused cross entropy (planner.cost.memory)
        args += [("--cross-entropy-loss-fusion",), ("--cross-entropy-fusion-impl", "te")]
    elif loss == "bf16":
        warnings.append("cross entropy: the plan keeps 16-bit logits without upcasting; "
                        "Megatron's unfused vocab-parallel cross entropy upcasts them to fp32 "
                        "(more head memory than planned); --cross-entropy-loss-fusion would "
                        "keep less")
    if not runtime["dropout"]:
        # the cost model counts no dropout masks; Megatron's defaults are 0.1
        args += [("--attention-dropout", 0.0), ("--hidden-dropout", 0.0)]
    else:  # the plan records that the run uses dropout, not its rate: Megatron's default
        notes.append("megatron: the plan trains with dropout (planned: the masks and their "
                     "traffic, not the rate); --attention-dropout / --hidden-dropout are left "
                     "at Megatron's default 0.1")
    # --tp-comm-overlap (Transformer Engine userbuffers) splits the sequence-parallel
    # all-gather / reduce-scatter: validate_args refuses it without --sequence-parallel, and
    # the cost model hides no TP collective without SP (planner.cost.terms)
    if runtime["tp_comm_overlap"] > 0 and p["tp"] > 1 and p["sp"]:
        args.append(("--tp-comm-overlap",))
    if runtime["attention_kernel"] == "eager":
        warnings.append("attention: the plan assumed eager attention (materialised scores); "
                        "Megatron picks a fused/flash backend by default, which stores less "
                        "activation memory than planned")
    retarget = retarget_warning(plan, "megatron", **({"zero_stage": 1} if zero >= 2 else {}))
    if retarget:
        warnings.append(retarget)
    # validate_args asserts CUDA_DEVICE_MAX_CONNECTIONS=1 for tp or cp > 1 before Blackwell
    # (megatron/training/arguments.py); it does no harm on newer GPUs
    env = "CUDA_DEVICE_MAX_CONNECTIONS=1 " if p["tp"] > 1 or p["cp"] > 1 else ""
    comments = [
        f"Megatron-LM parallelism arguments for {headline(doc)}",
        f"Generated by shardplan from a plan (schema_version {doc['schema_version']}). Model "
        f"shape, data, tokenizer and",
        "optimizer arguments are not part of the plan: add them to the command line.",
        f"Use:  source THIS_FILE; {env}torchrun --nproc-per-node "
        f"{launch_size(doc)[0]} --nnodes {launch_size(doc)[1]} "
        f"pretrain_gpt.py \"${{{ARRAY}[@]}}\" ...",
    ]
    if env:
        notes.append(f"megatron: run with {env.strip()} in the environment (tensor or context "
                     f"parallelism; Megatron's validate_args asserts it on GPUs before "
                     f"Blackwell), as the file's Use line does")
    return ExportResult("megatron", bash_array_file(comments, ARRAY, args), tuple(warnings),
                        ".sh", tuple(notes))


def parse_args_file(text: str) -> list[str]:
    """The argument list of an exported file (for tests and tools): shlex, comments dropped."""
    return parse_bash_array_file(text, ARRAY)
