"""Runtime profiles: what each training runtime can run, how it lays out memory, how it overlaps.

A plan is only useful if its runtime can execute it as planned, so the search enumerates only
what the target runtime offers (``allows``), and the cost model reads the runtime's memory
layout and overlap behaviour from here. Four profiles:

* ``megatron``: Megatron-LM / Megatron-Core / NeMo / Megatron-Bridge. Distributed optimizer
  (``--use-distributed-optimizer`` = ZeRO-1), Megatron-FSDP
  (``--data-parallel-sharding-strategy optim|optim_grads|optim_grads_params`` = ZeRO-1/2/3),
  ``--sequence-parallel``, ``--context-parallel-size``, ``--expert-model-parallel-size``,
  interleaved 1F1B with uneven first/last stages (``--decoder-first/last-pipeline-num-layers``,
  ``--pipeline-model-parallel-layout``), recompute ``--recompute-granularity selective``
  (``--recompute-modules core_attn`` by default) or ``full`` (``--recompute-method
  uniform|block``, ``--recompute-num-layers``), ``--tp-comm-overlap`` (Transformer Engine
  userbuffers), ``--overlap-grad-reduce`` / ``--overlap-param-gather``, hybrid sharding of the
  distributed optimizer with ``--num-distributed-optimizer-instances`` (each instance shards
  over dp / instances ranks, instances all-reduce their gradient shards)
  (NVIDIA/Megatron-LM ``megatron/training/arguments.py`` and ``examples/``).
* ``torchtitan``: FSDP2 (``fully_shard``, ``data_parallel_shard_degree``; HSDP with
  ``data_parallel_replicate_degree``; ``fsdp_reshard_after_forward`` default/always/never),
  DTensor TP with sequence parallel implied, async TP (``enable_async_tensor_parallel``),
  ``context_parallel_degree``, ``expert_parallel_degree``, ``pipeline_parallel_schedule`` from
  PyTorch's ``get_schedule_class`` (1F1B, Interleaved1F1B, GPipe, LoopedBFS,
  InterleavedZeroBubble, ZBVZeroBubble, DualPipeV; the planner searches 1F1B, Interleaved1F1B
  and the zero-bubble three, planner/cost/pipeline.py), uneven stages via
  ``pipeline_parallel_first/last_stage_less_layers``; ``activation_checkpoint.mode``
  none / full / selective with ``selective_ac_option`` "op" (per-op SAC) or N (every N-th
  layer) (pytorch/torchtitan v0.2.2 ``torchtitan/config/job_config.py``). No ZeRO-1/2: FSDP2 always shards
  parameters; ``reshard_after_forward=never`` keeps them gathered between forward and
  backward (ZeRO-2-like traffic, ZeRO-3 state layout).
* ``deepspeed``: DeepSpeed and Megatron-DeepSpeed: ``zero_optimization.stage`` 0-3,
  ``overlap_comm``, AutoTP, PipelineModule (1F1B only, no interleaving), no hybrid sharding
  (MiCS is removed from DeepSpeed 0.19, deepspeedai/DeepSpeed#8489), ZeRO++'s hpZ secondary weight
  partition of ZeRO-3 (``zero_optimization.zero_hpz_partition_size``, one node's GPUs: the
  DeepSpeed ZeRO++ tutorial; Wang et al., "ZeRO++", 2023, §3.2), activation
  checkpointing (``checkpoint_num_layers``), fp16 or the BF16_Optimizer (DeepSpeed config-json
  docs, deepspeed.ai/docs/config-json).
* ``fsdp``: PyTorch FSDP1 as used by Composer / llm-foundry and fms-fsdp:
  ``sharding_strategy`` FULL_SHARD / SHARD_GRAD_OP / HYBRID_SHARD / NO_SHARD, forward and
  backward prefetch, ``activation_checkpointing`` (every block), ``limit_all_gathers``; no TP,
  PP or CP in those stacks.

Old optimizer-layout names (``--runtime deepspeed-bf16``, ``torch-fp32``, ``zero-paper``) stay
valid: :func:`resolve_runtime` maps them to a profile and keeps the layout.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from planner.errors import invalid


@dataclass(frozen=True)
class RecomputePolicy:
    """A recomputation policy under the runtime's own name, and what it does."""

    name: str  # the runtime's spelling, e.g. "selective:op"
    planner: str  # the cost model's policy: none | selective | full | op | every-nth
    every_nth: int = 0  # for every-nth: checkpoint one block in N
    description: str = ""


@dataclass(frozen=True)
class RuntimeProfile:
    name: str
    title: str
    frameworks: tuple[str, ...]
    zero_stages: tuple[int, ...]  # data-parallel sharding stages it runs
    sharding_names: Mapping[int, str]  # stage -> the runtime's own spelling
    hsdp: bool  # shard inside a group, replicate across groups (--dp-shard N < dp)
    tp: bool
    sp: str  # "optional" (a flag), "with-tp" (always on with TP), "none"
    cp: bool
    ep: bool
    pp: bool
    schedules: tuple[str, ...]  # pipeline schedules it offers
    uneven_chunks: bool  # interleaved stages may hold unequal block counts
    recompute: tuple[RecomputePolicy, ...]
    state_layout: str  # key of planner.config.RUNTIME_STATE_BYTES (fp16 variant below)
    state_layout_fp16: str
    attention_kernel: str  # default attention kernel of current versions
    tp_comm_overlap: bool  # can hide TP collectives behind GEMMs
    grad_reduce_overlap: bool
    param_gather_overlap: bool
    per_phase_prefetch: bool  # FSDP-style: AGs prefetched per layer in fwd and bwd
    fp8_saved_inputs: bool  # FP8 runs keep the GEMM inputs for backward in FP8 (TE)
    allocator: str  # how its memory is read and cached (see memory model)
    notes: tuple[str, ...] = field(default_factory=tuple)
    searched_zero_stages: tuple[int, ...] | None = None  # default: all of zero_stages
    # stage-boundary activations split over the tensor group without SP: each rank sends 1/tp
    # and the receiver all-gathers over NVLink (Narayanan et al. 2021 §4.1 scatter/gather)
    pipe_partitioned: bool = False
    # FSDP under pipeline parallelism keeps the stage's gathered weights for the whole step and
    # accumulates unsharded gradients until the last micro-batch (torchtitan parallelize.py:
    # reshard_after_forward = not pp_enabled; PipelineStage syncs gradients on the last
    # micro-batch; FSDP2 accumulates them in reduce_dtype, fp32 by default)
    pp_keeps_unsharded: bool = False
    pipeline_zero_stages: tuple[int, ...] | None = None  # stages it runs with pp > 1 (None: all)
    tp_overlap_needs_compile: bool = False  # TP overlap only under torch.compile (async TP)
    # its element-wise ops (norms, RoPE, activation, bias / residual adds) without
    # torch.compile: "fused" (hand-fused kernels: Megatron's fused bias-GeLU / bias-SwiGLU /
    # bias-dropout-add and Transformer Engine's norms, the cost model's reference traffic), or
    # "eager" (one PyTorch kernel per op, calibrated as unfused_elementwise.<name>;
    # torch.compile or Transformer Engine's fused modules fuse them: compiled_elementwise)
    elementwise: str = "fused"
    # expert tensor parallel degrees it runs (MoE): "any" divisor of the stage (Megatron-Core's
    # --expert-tensor-parallel-size), "one-or-tp" (experts whole or split like the dense TP),
    # "one" (no expert tensor parallelism)
    expert_tp: str = "any"
    # hybrid sharding (HSDP, --dp-shard N < dp): the ZeRO stages it runs it with, its spelling,
    # and which shard groups: "any" divisor of dp, or "node" (one node's GPUs)
    hsdp_stages: tuple[int, ...] = ()
    hsdp_name: str = ""
    hsdp_shard: str = "any"
    # pipeline schedule -> the runtime's own name (its schedule option's value)
    schedule_names: Mapping[str, str] = field(default_factory=dict)
    # schedules it runs only with >= 2 model chunks per rank (torchtitan builds looped
    # PipelineScheduleMulti schedules with at least 2 stages per rank)
    multi_chunk_schedules: tuple[str, ...] = ()
    # which per-block recomputation mixes its flags express (planner/recompute_rules.py):
    # "per-block" (any), "uniform" (one setting for all blocks), "first-n" (Megatron's block
    # method: the first N blocks of every model chunk); the search keeps to it
    recompute_rule: str = "per-block"
    # ZeRO++ hpZ (planner.config.ParallelConfig.hpz): a secondary ZeRO-3 weight partition
    # inside a node, and the runtime's option that sets it
    hpz: bool = False
    hpz_name: str = ""
    # per-block activation offload to host memory (LayerOption.act_offload): the runtime's
    # option; "" where it offers none (the search then never picks it)
    activation_offload: str = ""
    # the attention core in FP8 under FP8 GEMMs (RuntimeOptions.fp8_attention): the runtime's
    # option; "" where it offers none
    fp8_attention: str = ""
    # GEMMs the runtime leaves in 16 bits under FP8 / FP4 GEMMs (RuntimeOptions.fp8_bf16_gemms,
    # planner.cost.compute.gemm_dtype): "head" (output / LM head), "router" (MoE router)
    fp8_bf16_gemms: tuple[str, ...] = ()
    # its grouped expert GEMMs run one GEMM per local expert (RuntimeOptions.
    # expert_gemm_per_expert, planner.cost.compute.gemm_time_s): Transformer Engine's
    # GroupedLinear (multi-stream cuBLASLt), DeepSpeed-MoE's loop over its experts; False where
    # one kernel runs every expert (torch._grouped_mm)
    expert_gemm_per_expert: bool = False
    # default pipeline stage placement (planner/placement.py): "" = Megatron's even split, or
    # DeepSpeed's PipelineModule partition_method (e.g. "type:transformer")
    pp_partition: str = ""
    # attention and hidden dropout (RuntimeOptions.dropout, plan --dropout): whether its
    # models have any (False: the run cannot train with the masks the plan counts)
    dropout: bool = True
    # a token-dropping MoE expert capacity (MoeOptions.capacity_factor, plan
    # --moe-capacity-factor): False where its MoE routes dropless only
    moe_capacity: bool = True

    def option_problems(self, dropout: bool, capacity_factor: float, is_moe: bool
                        ) -> list[tuple[str, str]]:
        """(option, why) for each run option the runtime cannot run: ``plan`` refuses them,
        ``evaluate`` and ``check --runtime`` report them (planner/check_runtime.py)."""
        out = []
        if dropout and not self.dropout:
            out.append(("--dropout", "its models have no attention or hidden dropout"))
        if is_moe and capacity_factor and not self.moe_capacity:
            out.append((f"--moe-capacity-factor {capacity_factor:g}",
                        "its MoE routes dropless (no token-dropping expert capacity)"))
        return out

    def refuse_options(self, options, is_moe: bool) -> None:
        """INVALID_INPUT naming each run option of ``options`` (a RuntimeOptions) the runtime
        cannot run: the search proposes only what it runs, as for a pin it cannot run."""
        bad = self.option_problems(options.dropout, options.moe.capacity_factor, is_moe)
        if bad:
            raise invalid(f"runtime {self.name} cannot run "
                          + "; ".join(f"{option} ({why})" for option, why in bad),
                          f"drop {' and '.join(option.split()[0] for option, _ in bad)}, or "
                          f"choose another --runtime")

    def allows_hpz(self, stage: int, hpz: int, gpus_per_node: int) -> bool:
        """The runtime keeps ZeRO ``stage``'s secondary weight partition over ``hpz`` ranks
        (searched: one node's GPUs, DeepSpeed's recommended value; any divisor when pinned)."""
        return self.hpz and stage == 3 and hpz >= 2

    def allows_hsdp(self, stage: int, shard_ranks: int, gpus_per_node: int) -> bool:
        """The runtime shards ZeRO ``stage`` over groups of ``shard_ranks`` GPUs (each
        holding tp x cp x dp_shard ranks) replicated across groups."""
        if not self.hsdp or stage not in self.hsdp_stages:
            return False
        return self.hsdp_shard == "any" or shard_ranks == gpus_per_node

    @property
    def search_zero_stages(self) -> tuple[int, ...]:
        """The stages the search tries unpinned (a pin may choose any of ``zero_stages``)."""
        return self.searched_zero_stages if self.searched_zero_stages is not None \
            else self.zero_stages

    def allows_zero(self, stage: int) -> bool:
        return stage in self.zero_stages

    def allows_zero_with(self, stage: int, pp: int) -> bool:
        """The runtime runs ZeRO ``stage`` with ``pp`` pipeline stages."""
        return self.allows_zero(stage) and (pp == 1 or self.pipeline_zero_stages is None
                                            or stage in self.pipeline_zero_stages)

    def allows_etp(self, etp: int, tp: int) -> bool:
        """The runtime splits routed experts over ``etp`` ranks with tensor parallel ``tp``."""
        if self.expert_tp == "one":
            return etp == 1
        if self.expert_tp == "one-or-tp":
            return etp in (1, tp)
        return True

    def allows_schedule(self, schedule: str) -> bool:
        return schedule in self.schedules

    def allows_schedule_with(self, schedule: str, virtual_stages: int) -> bool:
        """The runtime runs ``schedule`` with ``virtual_stages`` model chunks per rank."""
        return self.allows_schedule(schedule) and \
            (virtual_stages > 1 or schedule not in self.multi_chunk_schedules)

    def recompute_policy(self, name: str) -> RecomputePolicy:
        key = name.strip().lower()
        for policy in self.recompute:
            if policy.name == key:
                return policy
        raise invalid(f"runtime {self.name} has no recompute policy {name!r}",
                      f"choose one of {', '.join(p.name for p in self.recompute)}")

    def state_layout_for(self, dtype: str) -> str:
        return self.state_layout_fp16 if dtype == "fp16" else self.state_layout

    @property
    def compile_changes_cost(self) -> bool:
        """torch.compile changes what the cost model counts for this runtime: it fuses the
        eager element-wise ops, or it is what a TP overlap needs (torchtitan's async TP)."""
        return self.elementwise == "eager" or self.tp_overlap_needs_compile


_NONE = RecomputePolicy("none", "none", description="keep every activation")

PROFILES: Mapping[str, RuntimeProfile] = MappingProxyType({
    "megatron": RuntimeProfile(
        name="megatron", title="Megatron-LM / Megatron-Core / NeMo",
        frameworks=("Megatron-LM", "Megatron-Core", "NeMo", "Megatron-Bridge"),
        # Megatron-FSDP (ZeRO-2/3, --use-megatron-fsdp) runs when pinned but is not searched:
        # the Megatron exporter emits DDP / the distributed optimizer, so a searched plan must
        # be one of those to run without a fallback.
        zero_stages=(0, 1, 2, 3), searched_zero_stages=(0, 1),
        sharding_names=MappingProxyType({
            0: "DDP (no --use-distributed-optimizer)", 1: "--use-distributed-optimizer",
            2: "--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads",
            3: "--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params"}),
        hsdp=True, hsdp_stages=(1,),
        hsdp_name="--num-distributed-optimizer-instances (dp / dp_shard)",
        tp=True, sp="optional", cp=True, ep=True, pp=True,
        schedules=("1f1b", "interleaved-1f1b"), uneven_chunks=True,
        recompute=(_NONE,
                   RecomputePolicy("selective", "selective",
                                   description="--recompute-granularity selective "
                                               "(--recompute-modules core_attn)"),
                   RecomputePolicy("full", "full",
                                   description="--recompute-granularity full "
                                               "--recompute-method uniform")),
        state_layout="megatron", state_layout_fp16="megatron", attention_kernel="flash",
        tp_comm_overlap=True, grad_reduce_overlap=True, param_gather_overlap=True,
        per_phase_prefetch=False, fp8_saved_inputs=True,
        allocator="pytorch caching allocator, nvidia-smi reading",
        notes=("fp32 main_grad buffer (18 bytes/param before the distributed optimizer)",),
        recompute_rule="first-n",
        # Megatron-Core: Transformer Engine's CPU offload context over the first N layers, and
        # the fine-grained module-input offload (docs: "Fine-Grained Activation Offloading")
        activation_offload="--cpu-offloading --cpu-offloading-activations "
                           "--cpu-offloading-num-layers N (or --fine-grained-activation-"
                           "offloading)",
        # Transformer Engine's FP8 DotProductAttention (cuDNN), Megatron-LM arguments.py
        fp8_attention="--fp8-dot-product-attention",
        # outside Transformer Engine's FP8 autocast: GPTModel's output_layer is Megatron's own
        # tensor_parallel.ColumnParallelLinear (not a TE module), the MoE router's logits come
        # from moe_utils.router_gating_linear (torch.mm in the input or --moe-router-dtype)
        fp8_bf16_gemms=("head", "router"),
        # moe_grouped_gemm -> TEGroupedMLP -> Transformer Engine GroupedLinear, whose grouped
        # GEMM launches one cuBLASLt GEMM per expert over 4 compute streams
        # (common/gemm/cublaslt_gemm.cu multi_stream_cublas_gemm) and quantises each expert's
        # slice separately (split_quantize)
        expert_gemm_per_expert=True),
    "torchtitan": RuntimeProfile(
        name="torchtitan", title="torchtitan (FSDP2 + DTensor TP/CP/PP)",
        frameworks=("torchtitan", "FSDP2", "AutoModel"),
        zero_stages=(3,),
        sharding_names=MappingProxyType({3: "fully_shard (data_parallel_shard_degree)"}),
        hsdp=True, hsdp_stages=(3,),
        hsdp_name="data_parallel_shard_degree x data_parallel_replicate_degree",
        tp=True, sp="with-tp", cp=True, ep=True, pp=True,
        # PyTorch's get_schedule_class names (torch.distributed.pipelining.schedules):
        # InterleavedZeroBubble is ZB1P over >= 2 looped chunks, ZBVZeroBubble and DualPipeV
        # the V schedules with 2 chunks per rank (torchtitan pipeline_parallel.py, style "v")
        schedules=("1f1b", "interleaved-1f1b", "zb-h1", "zbv", "dualpipev"),
        schedule_names=MappingProxyType({
            "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B",
            "zb-h1": "InterleavedZeroBubble", "zbv": "ZBVZeroBubble",
            "dualpipev": "DualPipeV"}),
        multi_chunk_schedules=("zb-h1",),
        uneven_chunks=True,
        recompute=(_NONE,
                   RecomputePolicy("full", "full", description="activation_checkpoint.mode full"),
                   RecomputePolicy("selective:op", "op",
                                   description="mode selective, selective_ac_option op: saves "
                                               "matmul / attention outputs, recomputes the rest"),
                   RecomputePolicy("selective:2", "every-nth", every_nth=2,
                                   description="mode selective, selective_ac_option 2: full AC "
                                               "on every 2nd block"),
                   RecomputePolicy("selective:3", "every-nth", every_nth=3,
                                   description="full AC on every 3rd block")),
        state_layout="zero-paper", state_layout_fp16="zero-paper", attention_kernel="flash",
        tp_comm_overlap=True, grad_reduce_overlap=True, param_gather_overlap=True,
        per_phase_prefetch=True, fp8_saved_inputs=False,
        allocator="pytorch caching allocator, max_memory_reserved reading (no CUDA context)",
        pp_keeps_unsharded=True,
        # async TP (enable_async_tensor_parallel) raises "Async TP requires torch.compile"
        # without --compile.enable (torchtitan/distributed/tensor_parallel.py)
        tp_overlap_needs_compile=True,
        # torchtitan's models are plain nn.Modules (RMSNorm, apply_rotary_emb, F.silu(w1(x)) *
        # w3(x)): fused only under --compile.enable (torchtitan/models/llama3/model.py)
        elementwise="eager",
        # torchao conversion filters: Float8Converter swapped every nn.Linear but "output"
        # (module_filter_fn=lambda mod, fqn: fqn != "output"), the MX converter's filter_fqns
        # default to ["output"], and the MoE configs (Llama 4, DeepSeek-V3) filter
        # ["output", "router.gate"]
        fp8_bf16_gemms=("head", "router"),
        # 0.3's expert mesh is efsdp x ep (no ETP; experts whole on each EP rank); 0.2.2 takes
        # expert_tensor_parallel_degree 1 or tp: 1 runs on both
        expert_tp="one",
        # 0.3 applies one ActivationCheckpointing to every block (0.2.2's every-N-th layer
        # form is an export of 0.2.2 only): the search keeps to what both versions run
        recompute_rule="uniform",
        # no nn.Dropout in its models (torchtitan 0.3.0: torchtitan/models/llama3/model.py,
        # deepseek_v3/model.py) and a token-choice router without capacity
        # (torchtitan/models/common/moe.py TokenChoiceTopKRouter: every routed token reaches
        # its experts)
        dropout=False, moe_capacity=False,
        notes=("fp32 sharded parameters, bf16 all-gather (MixedPrecisionPolicy param_dtype)",
               "TP implies sequence parallel; async TP overlaps its collectives, compiled only")),
    "deepspeed": RuntimeProfile(
        name="deepspeed", title="DeepSpeed / Megatron-DeepSpeed",
        frameworks=("DeepSpeed", "Megatron-DeepSpeed", "GPT-NeoX"),
        zero_stages=(0, 1, 2, 3),
        sharding_names=MappingProxyType({0: "zero_optimization.stage 0",
                                         1: "zero_optimization.stage 1",
                                         2: "zero_optimization.stage 2",
                                         3: "zero_optimization.stage 3"}),
        # no hybrid sharding: MiCS (zero_optimization.mics_shard_size) was removed, DeepSpeed
        # 0.19's config refuses the key (deepspeed/runtime/config.py, deepspeedai/DeepSpeed#8489)
        hsdp=False,
        hpz=True, hpz_name="ZeRO++ hpZ (zero_optimization.zero_hpz_partition_size)",
        tp=True, sp="none", cp=False, ep=True, pp=True,
        schedules=("1f1b",), uneven_chunks=False,
        recompute=(_NONE,
                   RecomputePolicy("full", "full",
                                   description="activation_checkpointing, every block")),
        state_layout="deepspeed-bf16", state_layout_fp16="deepspeed", attention_kernel="flash",
        tp_comm_overlap=False, grad_reduce_overlap=True, param_gather_overlap=True,
        per_phase_prefetch=True, fp8_saved_inputs=False,
        allocator="pytorch caching allocator, nvidia-smi reading",
        # PipelineEngine asserts "ZeRO-2 and ZeRO-3 are incompatible with pipeline
        # parallelism" (deepspeed/runtime/pipe/engine.py)
        pipeline_zero_stages=(0, 1),
        # DeepSpeed-MoE keeps experts whole or slices them like TP
        # (deepspeed.moe.layer.MoE enable_expert_tensor_parallelism)
        expert_tp="one-or-tp",
        # deepspeed/moe/experts.py Experts.forward: one expert module per chunk, in a loop
        expert_gemm_per_expert=True,
        notes=("pipeline engine reduces gradients after the flush (no overlap with PP)",),
        # deepspeed/runtime/pipe/engine.py: is_pipe_partitioned = is_grad_partitioned =
        # is_model_parallel (PartitionedTensor over the slice-parallel group)
        pipe_partitioned=True,
        # Megatron-DeepSpeed GPTModelPipe: PipelineModule(..., partition_method=
        # 'type:transformer'): the blocks balanced, the remainder on the last stage
        pp_partition="type:transformer"),
    "fsdp": RuntimeProfile(
        name="fsdp", title="PyTorch FSDP1 (Composer / llm-foundry, fms-fsdp)",
        frameworks=("Composer", "llm-foundry", "fms-fsdp", "metaseq", "PyTorch FSDP"),
        zero_stages=(0, 2, 3),
        sharding_names=MappingProxyType({0: "NO_SHARD", 2: "SHARD_GRAD_OP", 3: "FULL_SHARD"}),
        hsdp=True, hsdp_stages=(2, 3), hsdp_shard="node",
        hsdp_name="sharding_strategy HYBRID_SHARD / _HYBRID_SHARD_ZERO2 (shard in a node)",
        tp=False, sp="none", cp=False, ep=False, pp=False,
        schedules=("1f1b",), uneven_chunks=False,
        recompute=(_NONE,
                   RecomputePolicy("full", "full",
                                   description="activation_checkpointing: true (every block)")),
        state_layout="zero-paper", state_layout_fp16="zero-paper", attention_kernel="flash",
        tp_comm_overlap=False, grad_reduce_overlap=True, param_gather_overlap=True,
        per_phase_prefetch=True, fp8_saved_inputs=False,
        allocator="pytorch caching allocator, nvidia-smi reading",
        notes=("flat parameters, fp32 master sharded, bf16 compute (mixed_precision PURE/DEFAULT)",),
        recompute_rule="uniform",
        # Hugging Face / llm-foundry / fms-fsdp modules in eager PyTorch; fused under
        # torch.compile (llm-foundry compile_config, fms-fsdp use_torch_compile)
        elementwise="eager"),
})

# Old --runtime values named optimizer-state layouts; each keeps its layout and maps to the
# profile that uses it (torch-fp32, the CPU verification runtime of planner/runtime, and the
# ZeRO paper's layout keep the default profile's search space, as before).
LEGACY_LAYOUTS = MappingProxyType({
    "deepspeed-bf16": "deepspeed", "torch-fp32": "megatron", "zero-paper": "megatron",
})
DEFAULT_RUNTIME = "megatron"


def profile(name: str) -> RuntimeProfile:
    """The profile ``name`` (a profile or a legacy layout name); INVALID_INPUT otherwise."""
    key = (name or "").strip().lower()
    key = LEGACY_LAYOUTS.get(key, key)
    if key not in PROFILES:
        raise invalid(f"unknown runtime {name!r}",
                      f"choose one of {', '.join(PROFILES)} (or a legacy layout: "
                      f"{', '.join(LEGACY_LAYOUTS)})")
    return PROFILES[key]


def resolve_runtime(name: str, dtype: str = "bf16") -> tuple[RuntimeProfile, str]:
    """(profile, state layout) for a ``--runtime`` value; a legacy layout name keeps its layout."""
    key = (name or "").strip().lower()
    prof = profile(key)
    layout = key if key in LEGACY_LAYOUTS else prof.state_layout_for(dtype)
    return prof, layout


def framework_compiled(framework: str) -> bool:
    """Whether a framework description ('torchtitan (FSDP + torch.compile)', calibration
    files' ``training.framework``) runs under torch.compile: ``plan --compile``."""
    return "compile" in (framework or "").lower()


def profile_for_framework(framework: str) -> RuntimeProfile:
    """The profile of a framework description such as 'Megatron-Core r0.8.0' or
    'Composer/llm-foundry, PyTorch FSDP FULL_SHARD' (calibration files' ``training.framework``).
    First match wins, most specific first (Megatron-DeepSpeed before Megatron)."""
    text = (framework or "").lower()
    order = (("megatron-deepspeed", "deepspeed"), ("deepspeed", "deepspeed"),
             ("gpt-neox", "deepspeed"), ("torchtitan", "torchtitan"), ("fsdp2", "torchtitan"),
             ("automodel", "torchtitan"), ("composer", "fsdp"), ("llm-foundry", "fsdp"),
             ("fms-fsdp", "fsdp"), ("metaseq", "fsdp"), ("fsdp", "fsdp"),
             ("megatron", "megatron"), ("nemo", "megatron"))
    for needle, name in order:
        if needle in text:
            return PROFILES[name]
    raise invalid(f"framework {framework!r} matches no runtime profile",
                  f"name one of: {', '.join(sorted({n for n, _ in order}))}")
