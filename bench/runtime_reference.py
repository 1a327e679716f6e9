"""Documented references of the runtimes that do not install on the CI machine.

Megatron-core needs Python >= 3.12 and vLLM brings its own torch, so the CI checks their
exports against these transcriptions instead (``bench/export_runtimes.py`` runs the real
parsers where they are installed; docs/exports.md has the manual step). Each reference is an
``argparse`` parser with the runtime's own option names, types and choices (an unknown or
misspelt option fails as it does there) followed by the validation rules the runtime applies
to those options, each citing where it was read:

* Megatron-LM ``megatron/training/arguments.py`` (``_add_*_args`` and ``validate_args``) at
  d98e8a64, ``megatron/core/transformer/transformer_config.py`` (recompute rules),
  ``megatron/core/transformer/pipeline_parallel_layer_layout.py`` (layout strings: stages in
  VPP-major order, chunk k on pipeline rank k mod pp) and
  ``megatron/core/num_microbatches_calculator.py`` (micro-batches = global / (micro x dp)).
* vLLM ``vllm/engine/arg_utils.py`` (``EngineArgs.add_cli_args``) and
  ``vllm/config/parallel.py`` (world size = tp x pp per data-parallel rank; the expert group
  is tp x dp with ``--enable-expert-parallel``).

A rule that fails raises :class:`Rejected` with the runtime's own message; otherwise the
function returns what the runtime derives, in the keys :func:`bench.export_runtimes.compare`
reads.
"""
from __future__ import annotations

import argparse
from typing import Any

from planner.errors import PlannerError
from planner.pipeline_layout import parse_layout


class Rejected(Exception):
    """The runtime would refuse these arguments."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse exits; the runtime's parser would too
        raise Rejected(message)


def _megatron_parser() -> _Parser:
    parser = _Parser(prog="pretrain_gpt.py", allow_abbrev=False, add_help=False)
    ints = ("--tensor-model-parallel-size", "--pipeline-model-parallel-size",
            "--context-parallel-size", "--expert-model-parallel-size",
            "--expert-tensor-parallel-size", "--num-layers", "--seq-length",
            "--micro-batch-size", "--global-batch-size", "--num-virtual-stages-per-pipeline-rank",
            "--num-layers-per-virtual-pipeline-stage", "--decoder-first-pipeline-num-layers",
            "--decoder-last-pipeline-num-layers", "--recompute-num-layers")
    for flag in ints:
        parser.add_argument(flag, type=int, default=None)
    parser.add_argument("--pipeline-model-parallel-layout", type=str, default=None)
    parser.add_argument("--recompute-granularity", choices=("full", "selective"), default=None)
    parser.add_argument("--recompute-method", choices=("uniform", "block"), default=None)
    parser.add_argument("--fp8-format", choices=("e4m3", "hybrid"), default=None)
    parser.add_argument("--attention-dropout", type=float, default=0.1)
    parser.add_argument("--hidden-dropout", type=float, default=0.1)
    for flag in ("--sequence-parallel", "--use-distributed-optimizer", "--overlap-grad-reduce",
                 "--overlap-param-gather", "--bf16", "--fp16", "--tp-comm-overlap",
                 "--fp8-dot-product-attention"):
        parser.add_argument(flag, action="store_true")
    # host offload (_add_training_args; transformer_config.py, megatron/core/optimizer/
    # cpu_offloading/README.md)
    for flag in ("--cpu-offloading", "--optimizer-cpu-offload",
                 "--use-precision-aware-optimizer", "--overlap-cpu-optimizer-d2h-h2d"):
        parser.add_argument(flag, action="store_true")
    parser.add_argument("--cpu-offloading-num-layers", type=int, default=0)
    parser.add_argument("--optimizer-offload-fraction", type=float, default=1.0)
    # MoE (_add_moe_args; megatron/core/transformer/moe/README.md)
    # group-limited routing: --moe-router-num-groups / --moe-router-group-topk (int, None)
    for flag in ("--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size",
                 "--moe-shared-expert-intermediate-size", "--moe-router-num-groups",
                 "--moe-router-group-topk"):
        parser.add_argument(flag, type=int, default=None)
    parser.add_argument("--moe-layer-freq", type=str, default="1")
    parser.add_argument("--moe-token-dispatcher-type", choices=("allgather", "alltoall", "flex"),
                        default="allgather")
    parser.add_argument("--moe-expert-capacity-factor", type=float, default=None)
    for flag in ("--moe-grouped-gemm", "--moe-permute-fusion", "--moe-enable-deepep",
                 "--moe-pad-expert-input-to-capacity", "--overlap-moe-expert-parallel-comm",
                 "--delay-wgrad-compute", "--moe-paged-stash",
                 "--use-transformer-engine-op-fuser"):
        parser.add_argument(flag, action="store_true")
    parser.add_argument("--moe-flex-dispatcher-backend", choices=("deepep", "hybridep"),
                        default=None)
    parser.add_argument("--moe-expert-rank-capacity-factor", type=float, default=None)
    parser.add_argument("--cross-entropy-loss-fusion", action="store_true")
    parser.add_argument("--cross-entropy-fusion-impl", choices=("native", "te"),
                        default="native")
    # --recompute-modules and CUDA graphs (_add_training_args; transformer_config.py)
    parser.add_argument("--recompute-modules", nargs="+", default=None,
                        choices=("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp",
                                 "moe", "shared_experts"))
    parser.add_argument("--cuda-graph-impl", choices=("none", "local", "transformer_engine"),
                        default="none")
    parser.add_argument("--cuda-graph-scope", nargs="+", default=[],
                        choices=("attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba",
                                 "full_iteration"))
    return parser


def _moe_rules(a: argparse.Namespace, world_size: int, tp: int, pp: int, ep: int) -> None:
    """validate_args / transformer_config.py / parallel_state.py rules on the expert options."""
    etp = a.expert_tensor_parallel_size or tp  # defaults to the tensor-parallel size
    if world_size % (etp * ep * pp):
        raise Rejected(f"world_size ({world_size}) is not divisible by expert_tensor_parallel_"
                       f"size x expert_model_parallel_size x pipeline_model_parallel_size "
                       f"({etp} x {ep} x {pp})")
    if ep > 1 and a.num_experts is None:
        raise Rejected("num_experts must be non None to use expert model parallelism")
    if a.num_experts is not None and a.num_experts % ep:
        raise Rejected("num_experts must be divisible by expert_model_parallel_size")
    if a.moe_enable_deepep and a.moe_token_dispatcher_type != "flex":
        raise Rejected("DeepEP is only supported with the flex token dispatcher")
    if a.moe_pad_expert_input_to_capacity and a.moe_expert_capacity_factor is None:
        raise Rejected("moe_expert_capacity_factor must be set to use "
                       "moe_pad_expert_input_to_capacity")
    if a.recompute_modules is not None and a.recompute_granularity != "selective":
        raise Rejected("recompute_modules is only used with recompute_granularity selective")
    if "full_iteration" in a.cuda_graph_scope and (a.cuda_graph_impl != "local"
                                                   or len(a.cuda_graph_scope) > 1):
        raise Rejected("full_iteration CUDA graph scope needs --cuda-graph-impl local and "
                       "cannot be combined with other scopes")
    if a.moe_paged_stash and (a.moe_expert_rank_capacity_factor is None
                              or a.moe_flex_dispatcher_backend != "hybridep"):
        # MoE paged stash (Megatron-LM docs): sync-free expert execution first
        raise Rejected("moe_paged_stash needs sync-free experts: "
                       "--moe-flex-dispatcher-backend hybridep and "
                       "--moe-expert-rank-capacity-factor")
    if a.moe_flex_dispatcher_backend is not None and a.moe_token_dispatcher_type != "flex":
        raise Rejected("moe_flex_dispatcher_backend needs the flex token dispatcher")
    if a.num_experts is not None and tp > 1 and not a.sequence_parallel:
        raise Rejected("When using MoE and tensor parallelism, sequence parallelism must be used")


def _offload_rules(a: argparse.Namespace, pp: int) -> None:
    """TransformerConfig.__post_init__ (layer-level CPU offload) and validate_args (the hybrid
    device optimizer)."""
    if a.cpu_offloading:
        if not 0 <= a.cpu_offloading_num_layers < (a.num_layers or 0):
            raise Rejected(f"CPU offloading can be done only for layers less than "
                           f"{a.num_layers}")
        if pp > 1:
            raise Rejected("Currently there is no support for Pipeline parallelism with CPU "
                           "offloading")
        if a.recompute_granularity is not None:
            raise Rejected("CPU offloading does not work when activation recomputation is "
                           "enabled")
    if a.optimizer_cpu_offload and not a.use_precision_aware_optimizer:
        raise Rejected("The optimizer cpu offload must be used in conjunction with "
                       "`--use-precision-aware-optimizer`")
    if not 0 <= a.optimizer_offload_fraction <= 1:
        raise Rejected("--optimizer-offload-fraction must be in [0, 1]")


def _layout_chunks(layout: str, pp: int, num_layers: int) -> list[list[int]]:
    """PipelineParallelLayerLayout's parse and validate_layer_layout (no MTP layers: this
    reference takes no --mtp-num-layers), through the planner's one reader of the syntax:
    the decoder layers of each rank's chunks, ``[rank][virtual stage]``."""
    try:
        parsed = parse_layout(layout)
        parsed.virtual_stages(pp)
        parsed.megatron_check(num_layers)
    except PlannerError as error:
        raise Rejected(error.message) from None
    return parsed.rank_blocks(pp)


def megatron(args: list[str], *, world_size: int, env: dict[str, str],
             device_arch: int) -> dict[str, Any]:
    """Megatron-LM's reading of the exported arguments on ``world_size`` GPUs of compute
    capability ``device_arch`` (major version: 8 A100, 9 H100/H200, 10 B200)."""
    a = _megatron_parser().parse_args(args)
    tp = a.tensor_model_parallel_size or 1
    pp = a.pipeline_model_parallel_size or 1
    cp = a.context_parallel_size or 1
    ep = a.expert_model_parallel_size or 1
    if world_size % (tp * pp * cp):
        raise Rejected(f"world size ({world_size}) is not divisible by total_model_size "
                       f"({tp * pp * cp})")
    dp = world_size // (tp * pp * cp)
    _moe_rules(a, world_size, tp, pp, ep)
    _offload_rules(a, pp)
    if (tp > 1 or cp > 1) and device_arch < 10 and env.get("CUDA_DEVICE_MAX_CONNECTIONS") != "1":
        raise Rejected("Using tensor model parallelism or context parallelism require setting "
                       "the environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1")
    if a.micro_batch_size is None or a.micro_batch_size <= 0:
        raise Rejected("micro_batch_size must be a positive integer")
    global_batch = a.global_batch_size or a.micro_batch_size * dp
    if global_batch % (a.micro_batch_size * dp):
        raise Rejected(f"global batch size ({global_batch}) is not divisible by micro batch "
                       f"size ({a.micro_batch_size}) times data parallel size ({dp})")
    micro_batches = global_batch // (a.micro_batch_size * dp)
    layers = a.num_layers
    if layers is None:
        raise Rejected("--num-layers is required")
    given = sum(x is not None for x in (a.num_layers_per_virtual_pipeline_stage,
                                        a.num_virtual_stages_per_pipeline_rank,
                                        a.pipeline_model_parallel_layout))
    if given > 1:
        raise Rejected("No more than one of the following arguments can be set at the same "
                       "time: --num-layers-per-virtual-pipeline-stage, "
                       "--num-virtual-stages-per-pipeline-rank,--pipeline-model-parallel-layout")
    first, last = a.decoder_first_pipeline_num_layers, a.decoder_last_pipeline_num_layers
    if pp == 1 and (first is not None or last is not None or given):
        raise Rejected("uneven or virtual pipeline arguments need pipeline parallelism")
    chunks: list[list[int]]  # chunks[rank] = decoder layers of each of the rank's model chunks
    if a.pipeline_model_parallel_layout is not None:
        if first is not None or last is not None:
            raise Rejected("--pipeline-model-parallel-layout excludes the "
                           "--decoder-first/last-pipeline-num-layers arguments")
        chunks = _layout_chunks(a.pipeline_model_parallel_layout, pp, layers)
        vpp = len(chunks[0])
    else:
        if a.num_layers_per_virtual_pipeline_stage is not None:
            if first is not None or last is not None:
                raise Rejected("please use --num-virtual-stages-per-pipeline-rank to specify "
                               "virtual pipeline parallel degree when enable uneven pipeline "
                               "parallelism")
            if layers % pp or (layers // pp) % a.num_layers_per_virtual_pipeline_stage:
                raise Rejected("number of layers per pipeline stage must be divisible number "
                               "of layers per virtual pipeline stage")
            vpp = layers // pp // a.num_layers_per_virtual_pipeline_stage
        else:
            vpp = a.num_virtual_stages_per_pipeline_rank or 1
        if first is None and last is None:
            if layers % pp:
                raise Rejected("Number of layers should be divisible by the "
                               "pipeline-model-parallel size")
            per_rank = [layers // pp] * pp
        else:
            # transformer_config.py: the middle stages share what first/last leave evenly
            middle_ranks = pp - (first is not None) - (last is not None)
            rest = layers - (first or 0) - (last or 0)
            if rest < 0 or (middle_ranks and rest % middle_ranks) or \
                    (not middle_ranks and rest):
                raise Rejected("Remaining layers cannot be evenly split over the middle "
                               "pipeline stages")
            even = rest // middle_ranks if middle_ranks else 0
            per_rank = [even] * pp
            if first is not None:
                per_rank[0] = first
            if last is not None:
                per_rank[-1] = last
        for n in per_rank:
            if n % vpp:
                raise Rejected(f"layers per pipeline rank ({n}) must be divisible by the "
                               f"virtual pipeline size ({vpp})")
        chunks = [[n // vpp] * vpp for n in per_rank]
    if vpp > 1 and micro_batches % pp:
        raise Rejected(f"number of microbatches ({micro_batches}) is not divisible by "
                       f"pipeline-model-parallel-size ({pp}) when using interleaved schedule")
    if cp > 1 and a.seq_length % (cp * 2):
        raise Rejected("seq-length should be a multiple of 2 * context-parallel-size if "
                       "context-parallel-size > 1")
    if a.overlap_param_gather and not (a.use_distributed_optimizer and a.overlap_grad_reduce):
        raise Rejected("--overlap-param-gather only supported with distributed optimizer and "
                       "--overlap-grad-reduce")
    if a.bf16 and a.fp16:
        raise Rejected("cannot have both fp16 and bf16 enabled")
    # transformer_config.py recompute rules
    granularity, method, recompute_layers = (a.recompute_granularity, a.recompute_method,
                                             a.recompute_num_layers)
    if granularity == "selective" and (method is not None or recompute_layers is not None):
        raise Rejected("When using recompute_granularity: selective recompute_method and "
                       "recompute_num_layers must be None")
    if granularity == "full":
        if method is None:
            raise Rejected('Using recompute_granularity: full so recompute_method must be '
                           '"block" or "uniform"')
        if recompute_layers is None:
            raise Rejected(f"When using recompute_granularity: full recompute_num_layers must "
                           f"be between 1 and num_layers_per_pipeline_rank: {layers // pp}")
    sp = bool(a.sequence_parallel) and tp > 1  # validate_args turns it off for tp 1
    if a.tp_comm_overlap and not sp:
        raise Rejected("Tensor parallel communication/GEMM overlap can happen only when "
                       "sequence parallelism is enabled")
    blocks_recomputed = []
    for rank in chunks:
        row = []
        for n in rank:
            if granularity == "full":
                row.append(n if method == "uniform" else min(n, recompute_layers))
            else:
                row.append(0)
        blocks_recomputed.append(row)
    return {"tp": tp, "pp": pp, "cp": cp, "ep": ep, "dp": dp, "micro_batch": a.micro_batch_size,
            "global_batch": global_batch, "num_micro_batches": micro_batches,
            "virtual_stages": vpp, "layers_per_chunk": chunks, "sp": sp,
            "recompute": granularity or "none", "full_recompute_per_chunk": blocks_recomputed,
            "zero_stage": 1 if a.use_distributed_optimizer else 0,
            "dtype": "fp16" if a.fp16 else ("fp8" if a.fp8_format else "bf16"),
            "fp8_attention": a.fp8_dot_product_attention}


VLLM_DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")


def vllm(args: list[str], *, world_size: int) -> dict[str, Any]:
    """vLLM's reading of ``vllm serve MODEL ARGS`` for the engine's parallel layout."""
    parser = _Parser(prog="vllm serve", allow_abbrev=False, add_help=False)
    parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    parser.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    parser.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    parser.add_argument("--enable-expert-parallel", "-ep", action="store_true")
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--dtype", choices=VLLM_DTYPES, default="auto")
    a = parser.parse_args(args)
    for name in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
        if getattr(a, name) < 1:
            raise Rejected(f"{name} must be >= 1")
    per_replica = a.tensor_parallel_size * a.pipeline_parallel_size
    gpus = per_replica * a.data_parallel_size
    if gpus > world_size:
        raise Rejected(f"the engine needs {gpus} GPUs, the cluster has {world_size}")
    return {"tp": a.tensor_parallel_size, "pp": a.pipeline_parallel_size,
            "dp": a.data_parallel_size,
            "ep": a.tensor_parallel_size * a.data_parallel_size if a.enable_expert_parallel
            else 1, "seq_len": a.max_model_len, "dtype": a.dtype, "gpus": gpus}
