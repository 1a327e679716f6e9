"""Parallel configuration and runtime options: what a plan chooses and how the runtime behaves.

:class:`ParallelConfig` holds the global choices: the mesh degrees (read as a
:class:`~planner.mesh.Mesh` through ``config.mesh``), the training workload it runs
(``config.workload``), ZeRO stage, micro-batch and schedule. The per-layer choices (pipeline
stage and :class:`~planner.strategy.LayerOption` of each layer) are a
:class:`~planner.strategy.LayerPlacement`;
:class:`RuntimeOptions` the properties of the runtime that will execute the plan and that the
cost model must know (attention kernel, overlap switches, which optimizer-state layout).

Validation turns every impossible combination into a :class:`~planner.errors.PlannerError`
whose message spells the arithmetic out (torchtitan's ``ParallelDims`` style).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property

from planner.cost.pipeline import SCHEDULES, default_schedule
from planner.errors import invalid
from planner.hardware import Cluster
from planner.ir import LayerKind, ModelGraph
from planner.mesh import Mesh
from planner.moe import MoeOptions
from planner.workload import TrainingWorkload


DTYPES = ("bf16", "fp16", "fp8")
ZERO_STAGES = (0, 1, 2, 3)


@dataclass(frozen=True)
class ParallelConfig:
    tp: int
    pp: int
    dp: int
    global_batch: int
    seq_len: int
    cp: int = 1
    ep: int = 1
    etp: int = 0  # expert tensor parallel degree; 0 = tp (Megatron-Core's default)
    sp: bool = False
    zero_stage: int = 0
    micro_batch: int = 1
    virtual_stages: int = 1
    dtype: str = "bf16"
    # HSDP: dp ranks of one ZeRO / FSDP shard group, replicated over dp / dp_shard groups;
    # 0 = the whole dp (plain ZeRO / FSDP). Normalised: dp_shard == dp is written as 0.
    dp_shard: int = 0
    # ZeRO++ hpZ (DeepSpeed zero_optimization.zero_hpz_partition_size): ZeRO-3 keeps a second
    # copy of the 16-bit weights sharded over groups of hpz consecutive ranks (one node), and
    # gathers from it in every pass but the step's first forward (planner.cost.terms); 0 = off
    hpz: int = 0
    # pipeline schedule (planner.cost.pipeline.SCHEDULES); "" = the default for virtual_stages
    # (1F1B, interleaved 1F1B). Normalised: the default is written as "".
    pipeline_schedule: str = ""
    # an explicit pipeline layout, Megatron-Core's --pipeline-model-parallel-layout syntax
    # (planner/pipeline_layout.py): the blocks of each of the pp x virtual_stages chunks as
    # written, chunk k on rank k mod pp; "" = the runtime's default split
    # (planner.strategy.default_placement)
    pipeline_layout: str = ""
    # gradient accumulation over separate pipeline schedule runs: the step runs the schedule
    # schedule_calls times on num_micro_batches / schedule_calls micro-batches each, each with
    # its own fill, drain and gradient sync (PyTorch pipelining syncs at a schedule's last
    # backward), then one optimizer step: NeMo AutoModel's recipes call schedule.step once per
    # local batch (NVIDIA-NeMo/Automodel @89e3a9fdd nemo_automodel/recipes/llm/benchmark.py,
    # the ga_steps loop). 1 = one schedule per step (Megatron-Core, torchtitan). An input of the
    # cost model for reading measured runs (bench/moe_accuracy.py); the search runs 1, and plan
    # files and exports do not carry it
    schedule_calls: int = 1

    def __post_init__(self):
        if self.pipeline_schedule and \
                self.pipeline_schedule == default_schedule(self.virtual_stages):
            object.__setattr__(self, "pipeline_schedule", "")

    @cached_property  # read in every cost term; the dataclass is frozen, so computed once
    def mesh(self) -> Mesh:
        """The device mesh (degrees, rank order, group strides): :class:`planner.mesh.Mesh`."""
        return Mesh(pp=self.pp, dp=self.dp, cp=self.cp, tp=self.tp, ep=self.ep, etp=self.etp,
                    dp_shard=self.dp_shard)

    @property
    def workload(self) -> TrainingWorkload:
        return TrainingWorkload(self.global_batch, self.seq_len, self.dtype)

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def num_micro_batches(self) -> int:
        return self.global_batch // (self.micro_batch * self.dp)

    @property
    def micro_batches_per_call(self) -> int:
        """Micro-batches of one pipeline schedule run (all of them unless ``schedule_calls``)."""
        return self.num_micro_batches // self.schedule_calls

    @property
    def schedule(self) -> str:
        return self.pipeline_schedule or default_schedule(self.virtual_stages)

    @property
    def schedule_spec(self):
        """The :class:`planner.cost.pipeline.PipelineSchedule` of the plan."""
        return SCHEDULES[self.schedule]

    def _validate_schedule(self) -> None:
        name = self.pipeline_schedule
        if not name:
            return
        if name not in SCHEDULES:
            raise invalid(f"--schedule must be one of {', '.join(SCHEDULES)}, got {name!r}")
        spec = SCHEDULES[name]
        if self.pp == 1:
            raise invalid(f"the {name} schedule needs --pp > 1")
        v = self.virtual_stages
        if v < spec.min_chunks or (spec.max_chunks and v > spec.max_chunks):
            need = (f"exactly {spec.min_chunks}" if spec.max_chunks == spec.min_chunks
                    else f"at least {spec.min_chunks}")
            raise invalid(f"the {name} schedule runs {need} model chunks per rank; "
                          f"--virtual-stages is {v}",
                          f"use --virtual-stages {spec.min_chunks}")
        if self.micro_batches_per_call < spec.min_micro_batches_per_rank * self.pp:
            raise invalid(f"the {name} schedule needs at least "
                          f"{spec.min_micro_batches_per_rank} x pp = "
                          f"{spec.min_micro_batches_per_rank * self.pp} micro-batches, the "
                          f"plan has {self.micro_batches_per_call}"
                          + (" a schedule call" if self.schedule_calls > 1 else ""),
                          "raise the global batch or lower the micro-batch size")

    def _validate_layout(self, model: ModelGraph) -> None:
        """An explicit pipeline layout: Megatron's rules (planner.pipeline_layout) against the
        model's blocks and MTP layers, pp x virtual_stages chunks (chunk k on rank k mod pp, or in a
        V under the V schedules: planner.strategy.layout_placement)."""
        from planner.pipeline_layout import parse_layout

        if not isinstance(self.pipeline_layout, str):
            raise invalid(f"--pipeline-layout must be a string, got {self.pipeline_layout!r}")
        if self.pp == 1:
            raise invalid("--pipeline-layout needs --pp > 1 (it splits the layers into pipeline "
                          "chunks)")
        parse_layout(self.pipeline_layout).validate(self.pp, self.virtual_stages,
                                                    model.num_blocks, model.num_mtp, model.name)

    def _validate_hpz(self, model: ModelGraph) -> None:
        """ZeRO++ hpZ: ZeRO-3, a proper divisor of dp, and ranks that are dp ranks only:
        DeepSpeed builds the secondary groups from consecutive global ranks
        (``deepspeed/utils/groups.py`` ``_create_zero_param_parallel_group``), which are one
        data-parallel group's only without tp, cp and pp; dense parameters only (routed
        experts shard over their own expert data-parallel group)."""
        h = self.hpz
        if not isinstance(h, int) or isinstance(h, bool) or h < 0:
            raise invalid(f"--hpz must be a positive integer, got {h!r}")
        if not h:
            return
        if self.zero_stage != 3:
            raise invalid(f"--hpz {h} needs ZeRO-3: hpZ's secondary partition holds ZeRO-3's "
                          "sharded weights", "use --zero 3")
        if h < 2 or h >= self.dp or self.dp % h:
            raise invalid(f"--hpz {h} must be a proper divisor of dp {self.dp} greater than 1 "
                          "(the secondary partition is sharded over hpz of the dp ranks)",
                          "use the GPUs per node, DeepSpeed's recommended value")
        if self.dp_shard:
            raise invalid("--hpz and --dp-shard are two kinds of hybrid sharding (ZeRO++ hpZ "
                          "and hybrid sharding); give one")
        if self.tp > 1 or self.cp > 1 or self.pp > 1:
            raise invalid(f"--hpz {h} runs with dp only (tp, cp and pp 1): DeepSpeed forms "
                          "the secondary groups from consecutive global ranks")
        if model.is_moe:
            raise invalid(f"--hpz {h}: hpZ with routed experts is not modelled")

    @property
    def micro_batches_fit_schedule(self) -> bool:
        """Looped interleaved schedules run the micro-batches in groups of pp (Megatron-LM
        schedules.py): their number must be a multiple of pp."""
        return not (self.virtual_stages > 1 and self.micro_batches_per_call % self.pp and
                    self.schedule_spec.placement == "loop")

    def validate(self, model: ModelGraph, cluster: Cluster) -> None:
        """Raise PlannerError(INVALID_INPUT) for any configuration no runtime could run."""
        for name in ("tp", "pp", "dp", "cp", "ep", "micro_batch", "global_batch", "seq_len",
                     "virtual_stages"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise invalid(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
        if not isinstance(self.etp, int) or isinstance(self.etp, bool) or self.etp < 0:
            raise invalid(f"--etp must be a positive integer, got {self.etp!r}")
        if not isinstance(self.dp_shard, int) or isinstance(self.dp_shard, bool) or \
                self.dp_shard < 0:
            raise invalid(f"--dp-shard must be a positive integer, got {self.dp_shard!r}")
        if self.dp_shard:
            if self.dp_shard >= self.dp or self.dp % self.dp_shard:
                raise invalid(f"--dp-shard {self.dp_shard} must be a proper divisor of dp "
                              f"{self.dp} (the shard group is dp_shard of the dp ranks, "
                              f"replicated dp / dp_shard times)",
                              "leave --dp-shard out (or give dp) to shard over all of dp")
            if self.zero_stage == 0:
                raise invalid(f"--dp-shard {self.dp_shard} needs ZeRO >= 1: ZeRO-0 shards "
                              "nothing", "use --zero 1, 2 or 3 with hybrid sharding")
        if self.zero_stage not in ZERO_STAGES:
            raise invalid(f"--zero must be one of 0, 1, 2, 3, got {self.zero_stage!r}")
        self._validate_hpz(model)
        if self.dtype not in DTYPES:
            raise invalid(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.dtype not in cluster.gpu.peak_tflops:
            usable = [d for d in DTYPES if d in cluster.gpu.peak_tflops]
            raise invalid(f"GPU {cluster.gpu.name} has no {self.dtype} peak throughput",
                          f"use --dtype {' or '.join(usable)}" if usable else
                          "this GPU has no 16-bit or 8-bit tensor units the planner models")
        n = self.num_gpus
        if n != cluster.num_gpus:
            raise invalid(
                f"degrees multiply to {n} GPUs (tp {self.tp} x cp {self.cp} x dp {self.dp} x pp "
                f"{self.pp}) but the cluster has {cluster.num_gpus} "
                f"({cluster.num_nodes} nodes x {cluster.gpus_per_node})",
                "leave --dp out to use what the GPU count leaves, or change --nodes")
        if self.global_batch % (self.micro_batch * self.dp):
            raise invalid(
                f"global batch {self.global_batch} is not divisible by micro-batch x dp = "
                f"{self.micro_batch} x {self.dp} = {self.micro_batch * self.dp}",
                "pick a global batch that is a multiple of micro_batch * dp")
        k = self.schedule_calls
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise invalid(f"schedule_calls must be a positive integer, got {k!r}")
        if self.num_micro_batches % k:
            raise invalid(f"{self.num_micro_batches} micro-batches do not split into "
                          f"{k} schedule calls of equal size")
        blocks = model.num_blocks
        if self.pipeline_layout:
            # the layout's own rules bound its chunks (none empty; a chunk may hold only the
            # embedding or only the loss: Llama 3 405B's 'E|(t|)*126L', 128 chunks, 126 blocks)
            self._validate_layout(model)
        elif self.pp * self.virtual_stages > max(blocks, 1):
            raise invalid(
                f"pp x virtual stages = {self.pp} x {self.virtual_stages} exceeds the "
                f"{blocks} blocks of {model.name}")
        if self.virtual_stages > 1 and self.pp == 1:
            raise invalid("--virtual-stages > 1 needs --pp > 1 (interleaved 1F1B)")
        self._validate_schedule()
        if not self.micro_batches_fit_schedule:
            raise invalid(
                f"interleaved 1F1B needs the number of micro-batches "
                f"({self.micro_batches_per_call}"
                f"{' a schedule call' if self.schedule_calls > 1 else ''}) "
                f"to be a multiple of pp ({self.pp}) (Megatron-LM schedules.py)")
        if self.sp and self.tp == 1:
            raise invalid("sequence parallelism (--sp) needs --tp > 1")
        if self.seq_len % self.cp:
            raise invalid(f"sequence length {self.seq_len} is not divisible by cp {self.cp}")
        if self.cp > 1 and self.seq_len % (2 * self.cp):
            raise invalid(
                f"context parallelism splits the sequence into 2 x cp = {2 * self.cp} chunks for "
                f"causal load balance; {self.seq_len} is not divisible by {2 * self.cp}")
        if self.sp and self.seq_len // self.cp % self.tp:
            raise invalid(f"sequence parallelism needs seq_len / cp = {self.seq_len // self.cp} "
                          f"to be divisible by tp {self.tp}")
        for cls in model.layer_classes():
            layer = cls.layer
            if layer.kind is not LayerKind.BLOCK:
                continue
            att = layer.attention
            if att is not None and att.num_heads % self.tp:
                raise invalid(f"tp {self.tp} does not divide the {att.num_heads} attention heads "
                              f"of {model.name}")
            if layer.mlp is not None and layer.mlp.is_moe:
                if layer.mlp.num_experts % self.ep:
                    raise invalid(f"ep {self.ep} does not divide the {layer.mlp.num_experts} "
                                  f"experts of {model.name}")
                etp = self.mesh.expert_tp
                if layer.mlp.ffn_hidden % etp:
                    raise invalid(f"etp {etp} does not divide the expert width "
                                  f"{layer.mlp.ffn_hidden} of {model.name}")
        if self.ep > 1 and not model.is_moe:
            raise invalid(f"--ep {self.ep} needs a mixture-of-experts model; "
                          f"{model.name} is dense")
        layout_error = self.mesh.expert_layout_error()
        if layout_error and model.is_moe:
            raise invalid(layout_error, "choose ep and etp whose product divides tp x cp x dp")
        check_seq_len(model, self.seq_len)


# a sequence longer than this many times the model's position range is a typo, not a run
ABSURD_SEQ_FACTOR = 64


def check_seq_len(model: ModelGraph, seq_len: int) -> None:
    """Refuse (invalid input) a sequence length that no configuration could make sense of: the
    search calls it before enumerating degrees, so it says this instead of 'no valid
    configuration' (every candidate refused by ParallelConfig.validate)."""
    if seq_len > (model.max_seq_len or math.inf) * ABSURD_SEQ_FACTOR:
        raise invalid(f"sequence length {seq_len} is absurd for {model.name} "
                      f"(max positions {model.max_seq_len})")


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter of each model state, and which ZeRO stage shards it.

    Sources: ZeRO (Rajbhandari et al. 2020 §3.1: 2 + 2 + K=12 for mixed-precision Adam);
    Megatron-LM keeps an fp32 ``main_grad`` (4 bytes) and its distributed optimizer shards the
    12 bytes of fp32 master weights and Adam moments (Korthikanti et al. 2022 §6 reproduce their
    Fig. 1 with 18 bytes/param; Korthikanti et al. 2022 §6); DeepSpeed's fp16 ZeRO-1/2 optimizer keeps
    fp16 gradients plus an fp32 gradient partition next to the fp32 master partition.
    """

    weights: float = 2.0  # bf16/fp16 working weights
    grads: float = 4.0  # gradient accumulation buffer
    optimizer: float = 12.0  # fp32 master weights + Adam m and v
    grads_sharded_from_stage: int = 2  # ZeRO stage from which the gradient buffer is sharded
    grad_reduce_bytes: float = 4.0  # element size of the data-parallel gradient reduction
    bucket_bytes: float = 0.0  # communication buckets allocated next to the states (ZeRO >= 1)
    # bytes per parameter of the flattened copy the data-parallel gradient reduction allocates
    # (unsharded; held in the allocator's cache beside the cached activations)
    reduce_copy_bytes: float = 0.0
    # the layout the runtime switches to from ZeRO-2 on (a different optimizer class), if any
    zero2_layout: str | None = None
    # the once-per-step gradient reduction is an all-reduce of the whole gradient even where
    # the optimizer states are sharded (ZeRO-1): each rank then updates its partition and the
    # updated weights are all-gathered (DeepSpeed BF16_Optimizer; a reduce-scatter otherwise)
    reduce_all: bool = False


RUNTIME_STATE_BYTES = {
    # Megatron-LM / Megatron-Core (bf16, fp32 main_grad, distributed optimizer = ZeRO-1).
    "megatron": StateBytes(),
    # DeepSpeed fp16 ZeRO optimizer (stage_1_and_2.py): fp16 grads (2) + fp32 grad partition (4)
    # + fp32 master/m/v (12); the fp32 partition and optimizer are sharded from ZeRO-1 on. Its
    # reduce and all-gather buckets default to 5e8 elements each (DeepSpeed config-json docs).
    "deepspeed": StateBytes(weights=2.0, grads=2.0, optimizer=16.0, grads_sharded_from_stage=2,
                            grad_reduce_bytes=2.0, bucket_bytes=2 * 5e8 * 2),
    # DeepSpeed BF16_Optimizer (bf16_optimizer.py, used by Megatron-DeepSpeed for BLOOM): the
    # bf16 .grad tensors (2) plus an unsharded fp32 accumulation buffer (4); fp32 master, m and
    # v (12) sharded over DP (published_runs.yaml, bloom176B-main-run notes). DeepSpeed's engine
    # (runtime/engine.py, _do_optimizer_sanity_check) builds it for ZeRO-1 (and ZeRO-0 under
    # pipeline parallelism) only: from ZeRO-2 on a bf16 model gets the ZeRO optimizer
    # (stage_1_and_2.py, stage3.py), the fp16 layout's bytes. The data-parallel reduction
    # (pipe/engine.py _bf16_reduce_grads -> engine.py buffered_allreduce_fallback ->
    # allreduce_no_retain -> allreduce_bucket) is handed the whole flat fp32 gradient of each
    # parameter group (BF16_Optimizer.get_grads_for_reduction), one tensor per bucket, which
    # flatten returns as a view; allreduce_bucket then casts it to the engine's
    # communication_data_type, bf16 for a bf16 run (tensor.to(...): 2 more bytes per
    # parameter), all-reduces that copy and copies it back. The copy is one block allocated
    # after the pipeline flush, which the cached activation blocks cannot serve, so the device
    # holds it beside them; the reduction moves 2 bytes per parameter.
    # The reduction is a full all-reduce (allreduce_bucket: dist.all_reduce over the data-parallel
    # group), not a reduce-scatter, although the fp32 master partition is sharded: each rank
    # then steps its partition and BF16_Optimizer.step all-gathers the updated bf16 weights
    # (utils.py all_gather_dp_groups). DeepSpeed of 2022-04 (pipe/engine.py _exec_reduce_grads)
    # runs bf16 under pipeline parallelism only this way (ZeRO stage 0; stage 1 raises
    # NotImplementedError), so the step moves an all-reduce and an all-gather.
    "deepspeed-bf16": StateBytes(weights=2.0, grads=6.0, optimizer=12.0,
                                 grads_sharded_from_stage=4, grad_reduce_bytes=2.0,
                                 reduce_copy_bytes=2.0, zero2_layout="deepspeed",
                                 reduce_all=True),
    # PyTorch in fp32 (the CPU verification runtime, planner/runtime): fp32 weights and
    # gradients, Adam's m and v (torch.optim.Adam state), no separate master copy.
    "torch-fp32": StateBytes(weights=4.0, grads=4.0, optimizer=8.0, grads_sharded_from_stage=2,
                             grad_reduce_bytes=4.0),
    # PyTorch FSDP2 on a bf16 model with torch.optim.Adam: no fp32 master copy, and Adam's
    # exp_avg / exp_avg_sq take the parameter's dtype (torch/optim/adam.py, zeros_like(p)), so
    # weights, gradients and both moments are 2 bytes each; FSDP2's MixedPrecisionPolicy
    # (reduce_dtype=float32) reduce-scatters in fp32 and keeps the sharded gradient in the
    # parameter's dtype. NeMo AutoModel runs this way: its models are cast to bf16
    # (initialize_weights(dtype=torch.bfloat16) -> cast_model_to_dtype; model_init.py's
    # local_torch_dtype defaults to bf16) and its MoE benchmark configs use torch.optim.Adam
    # (examples/benchmark/configs/*_te_deepep.yaml).
    "torch-bf16": StateBytes(weights=2.0, grads=2.0, optimizer=4.0, grads_sharded_from_stage=2,
                             grad_reduce_bytes=4.0),
    # Plain mixed-precision Adam with 16-bit gradients, as in the ZeRO paper (K = 12).
    "zero-paper": StateBytes(weights=2.0, grads=2.0, optimizer=12.0, grads_sharded_from_stage=2,
                             grad_reduce_bytes=2.0),
}


@dataclass(frozen=True)
class RuntimeOptions:
    """How the executing runtime behaves; defaults describe Megatron-Core with flash attention."""

    runtime: str = "megatron"  # key of RUNTIME_STATE_BYTES
    attention_kernel: str = "flash"  # "flash" (FlashAttention-2/cuDNN) or "eager" (materialised scores)
    dropout: bool = False  # hidden/attention dropout (adds 1-byte masks; GPT-3 era models used it)
    overlap_grad_reduce: bool = True  # DP reduce overlapped with the last micro-batch's backward
    overlap_param_gather: bool = True  # ZeRO all-gather overlapped with the next forward
    tp_comm_overlap: float = 0.0  # fraction of TP collectives hidden behind GEMMs (TE userbuffers)
    # Runtime-profile behaviour (planner/profiles.py) and calibrated constants
    # (planner/calibration/: defaults.yaml, or a user's ``--calibration`` profile).
    profile: str = "megatron"  # runtime profile: megatron, torchtitan, deepspeed, fsdp
    allocator_overhead: float = 0.25  # caching-allocator memory beyond live activations+buffers
    comm_slowdown: float = 0.0  # compute slowdown per second of overlapped NCCL traffic
    micro_batch_overhead_s: float = 0.0  # fixed host/launch seconds per micro-batch per stage
    block_overhead_s: float = 0.0  # fixed host seconds per block per forward / backward pass
    elementwise_factor: float = 1.0  # element-wise HBM traffic vs fused kernels (eager > 1)
    # what elementwise_factor and tp_comm_overlap were calibrated for (a record: the plan
    # keeps it, `check --runtime` and the torchtitan export read it): the runtime runs under
    # torch.compile; its element-wise ops "fused" or "eager" where that is not the profile's
    # default for ``compiled`` ("": the default; planner.calibration.apply)
    compiled: bool = False
    elementwise: str = ""
    fp8_gemm_factor: float = 1.0  # FP8 GEMM efficiency relative to 16-bit (of the FP8 peak)
    fp8_saved_inputs: bool = False  # GEMM inputs kept for backward in FP8 (Transformer Engine)
    # calibrated efficiencies of the GPU's generation (None: the GPU preset's own values)
    matmul_efficiency: float | None = None
    attention_efficiency: float | None = None
    moe: MoeOptions = MoeOptions()  # routing and token dispatch of MoE layers (planner/moe.py)
    # what a SELECTIVE layer recomputes: Megatron --recompute-modules (default core_attn; the
    # names and their bytes / work in planner/cost/recompute_modules.py)
    recompute_modules: tuple[str, ...] = ("core_attn",)
    # the loss over the vocabulary: "fp32" (logits upcast, the softmax kept in fp32), "bf16"
    # (no upcast) or "fused" (a fused kernel writes the gradient into the 16-bit logits);
    # bytes per logit in planner.cost.memory.LOGIT_BYTES
    cross_entropy: str = "fp32"
    # the attention core (QK^T, softmax, attention x V, forward and backward) in FP8 when the
    # GEMMs are (Transformer Engine's FP8 DotProductAttention; Megatron
    # --fp8-dot-product-attention): planner.cost.compute; needs dtype fp8 and a runtime
    # profile that offers it (RuntimeProfile.fp8_attention)
    fp8_attention: bool = False
    # GEMMs kept in 16 bits under FP8 / FP4 GEMMs ("head", "router"; the runtime profile's
    # RuntimeProfile.fp8_bf16_gemms, set with the calibrated constants): planner.cost.compute
    fp8_bf16_gemms: tuple[str, ...] = ()
    # the runtime's grouped expert GEMMs run one GEMM per local expert (the runtime profile's
    # RuntimeProfile.expert_gemm_per_expert, set with the calibrated constants): each expert
    # beyond the first adds planner.cost.moe.EXPERT_GEMM_S (planner.cost.compute.gemm_time_s)
    expert_gemm_per_expert: bool = False
    # on a multi-pool cluster, each pool's generation: (pool, matmul_efficiency,
    # attention_efficiency), replacing the two above on that pool (planner/hetero/terms.py)
    pool_efficiency: tuple[tuple[str, float | None, float | None], ...] = ()

    def for_pool(self, pool: str) -> "RuntimeOptions":
        """The options a stage on ``pool`` runs with (its generation's efficiencies)."""
        for name, matmul, attention in self.pool_efficiency:
            if name == pool:
                return replace(self, matmul_efficiency=matmul, attention_efficiency=attention,
                               pool_efficiency=())
        return self

    def state_bytes(self, zero_stage: int) -> StateBytes:
        """Bytes per parameter of the runtime's states under ZeRO stage ``zero_stage``."""
        state = RUNTIME_STATE_BYTES[self.runtime]
        if zero_stage >= 2 and state.zero2_layout is not None:
            return RUNTIME_STATE_BYTES[state.zero2_layout]
        return state


def resolve_dp(num_gpus: int, tp: int, pp: int, cp: int = 1) -> int:
    """The data-parallel degree the GPU count leaves once tp, pp and cp are fixed."""
    for name, value in (("tp", tp), ("pp", pp), ("cp", cp)):
        if not isinstance(value, int) or value < 1:
            raise invalid(f"--{name} must be a positive integer, got {value!r}")
    model_parallel = tp * pp * cp
    if num_gpus % model_parallel:
        raise invalid(
            f"tp x pp x cp = {tp} x {pp} x {cp} = {model_parallel} does not divide the "
            f"{num_gpus} GPUs of the cluster",
            "choose degrees whose product divides the GPU count, or change --nodes")
    return num_gpus // model_parallel
