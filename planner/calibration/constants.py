"""The calibrated constants of the cost model: what the fit may move, its bounds, and the file.

Every constant is a physical quantity with a plausible range (the bounds of the fit); none is
specific to a calibration entry. ``defaults.yaml`` next to this module holds the values the
library ships; ``bench/calibrate_defaults.py`` reproduces it from the calibration files, and
``shardplan calibrate`` writes the same format for a user's own runs (a profile file).

Sources of the bounds: cuBLAS / hipBLASLt GEMM microbenchmarks reach 75-90 % of dense peak on
large shapes (NVIDIA Deep Learning Performance guide); FlashAttention-2 reaches 50-73 % of peak
forward on A100 and 35-40 % on H100, FlashAttention-3 / cuDNN 75 % on H100 (Dao 2023; Shah et
al. 2024); FP8 GEMMs reach a lower fraction of their doubled peak (Transformer Engine
benchmarks: 1.3-1.7x over BF16, i.e. 0.65-0.85 relative); Transformer Engine userbuffers hide
most TP communication (Megatron-Core ``--tp-comm-overlap``); NCCL kernels occupy SMs and HBM
bandwidth while they overlap compute (NCCL docs: channels = SMs).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from planner.errors import invalid

DEFAULTS_FILE = Path(__file__).resolve().parent / "defaults.yaml"
FORMAT_KEY = "shardplan_calibration"
GENERATIONS = ("ampere", "hopper", "blackwell")


@dataclass(frozen=True)
class Param:
    name: str
    low: float
    high: float
    default: float
    unit: str
    meaning: str


# The fitted parameters, in the order of the fit vector.
PARAMS: tuple[Param, ...] = (
    Param("matmul_efficiency.ampere", 0.55, 0.95, 0.75, "fraction of dense peak",
          "large-GEMM efficiency of cuBLAS on A100"),
    Param("matmul_efficiency.hopper", 0.50, 0.95, 0.70, "fraction of dense peak",
          "large-GEMM efficiency on H100/H200"),
    Param("matmul_efficiency.blackwell", 0.45, 0.95, 0.65, "fraction of dense peak",
          "large-GEMM efficiency on B200/GB200/B300"),
    Param("attention_efficiency.ampere", 0.30, 0.80, 0.60, "fraction of dense peak",
          "flash-attention forward efficiency on A100"),
    Param("attention_efficiency.hopper", 0.25, 0.80, 0.40, "fraction of dense peak",
          "flash-attention forward efficiency on H100/H200"),
    Param("attention_efficiency.blackwell", 0.25, 0.80, 0.40, "fraction of dense peak",
          "flash-attention forward efficiency on Blackwell"),
    Param("fp8_relative_efficiency", 0.40, 1.00, 0.80, "fraction",
          "FP8 GEMM efficiency relative to BF16 (of the doubled FP8 peak)"),
    Param("fp8_relative_efficiency.torchtitan", 0.40, 1.00, 0.80, "fraction",
          "as above, torchao Float8Linear (amax and cast kernels outside the GEMM; Transformer "
          "Engine fuses them)"),
    # Priors (the defaults) without a microbenchmark of their own sit mid-range and are tied
    # across runtimes in the fit (planner/calibration/fit.py TIES).
    Param("tp_comm_overlap.megatron", 0.0, 0.90, 0.45, "fraction",
          "TP collectives hidden behind GEMMs by Megatron-Core --tp-comm-overlap"),
    Param("tp_comm_overlap.torchtitan", 0.0, 0.90, 0.45, "fraction",
          "TP collectives hidden by torchtitan async TP"),
    # eager PyTorch: every op of a block's element-wise chain (norm, bias, activation, residual
    # add) its own kernel that reads and writes HBM, against one pass for a fused kernel
    # (Megatron's fused bias-GeLU / bias-dropout-add): about twice the bytes
    Param("unfused_elementwise.torchtitan", 1.0, 4.0, 2.0, "x fused HBM bytes",
          "element-wise HBM traffic of eager PyTorch (no torch.compile) over fused kernels"),
    Param("unfused_elementwise.fsdp", 1.0, 4.0, 2.0, "x fused HBM bytes",
          "element-wise HBM traffic of eager PyTorch in Composer / llm-foundry"),
    Param("compiled_elementwise", 1.0, 4.0, 1.25, "x fused HBM bytes",
          "element-wise HBM traffic under torch.compile (Inductor fuses pointwise chains "
          "between graph breaks at module hooks and attention kernels)"),
    Param("nccl_compute_slowdown", 0.0, 0.50, 0.0, "fraction of overlapped comm time",
          "compute slowdown while NCCL kernels run alongside (they take SMs and HBM bandwidth)"),
    # Fixed host-side seconds the GPU does not hide. Per micro-batch and stage: the schedule's
    # bookkeeping. Per block and pass (forward, backward, recomputed forward): its kernel
    # launches, module hooks (FSDP's per-block all-gather / reduce-scatter hooks) and activation-
    # checkpointing bookkeeping (DeepSpeed's CheckpointFunction saves and restores the CPU and
    # CUDA RNG states of every checkpointed block); Megatron-Core recipes capture CUDA graphs.
    # Bounds: a few hundred launches / Python calls (~5-20 us each) per block or stage. Priors:
    # an eager block pass launches some 50-100 kernels and hooks (~1 ms); a Transformer Engine
    # block fuses most of them (~0.2 ms).
    Param("microbatch_overhead_s", 0.0, 0.030, 0.0, "seconds per micro-batch per stage",
          "fixed host overhead of one micro-batch on one stage"),
    Param("block_overhead_s.megatron", 0.0, 0.005, 0.0002, "seconds per block per pass",
          "fixed host overhead of one transformer block, Megatron-Core"),
    Param("block_overhead_s.torchtitan", 0.0, 0.005, 0.001, "seconds per block per pass",
          "as above, torchtitan (FSDP2 hooks)"),
    Param("block_overhead_s.deepspeed", 0.0, 0.005, 0.001, "seconds per block per pass",
          "as above, DeepSpeed / Megatron-DeepSpeed (activation checkpointing)"),
    Param("block_overhead_s.fsdp", 0.0, 0.005, 0.001, "seconds per block per pass",
          "as above, FSDP1 (Composer / llm-foundry)"),
    Param("allocator_overhead.megatron", 0.0, 0.40, 0.25, "fraction of activations+buffers",
          "memory the caching allocator holds beyond live tensors (fragmentation, cache)"),
    Param("allocator_overhead.torchtitan", 0.0, 0.40, 0.25, "fraction of activations+buffers",
          "as above, torchtitan (FSDP2, per-parameter sharding)"),
    Param("allocator_overhead.deepspeed", 0.0, 0.40, 0.25, "fraction of activations+buffers",
          "as above, DeepSpeed / Megatron-DeepSpeed"),
    Param("allocator_overhead.fsdp", 0.0, 0.40, 0.25, "fraction of activations+buffers",
          "as above, FSDP1 (flat parameters; limit_all_gathers)"),
)
PARAM_NAMES = tuple(p.name for p in PARAMS)

@dataclass(frozen=True)
class Constants:
    """Values of :data:`PARAMS` by name (missing names take the Param default)."""

    values: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    source: str = "built-in defaults"

    def get(self, name: str) -> float:
        if name in self.values:
            return float(self.values[name])
        for p in PARAMS:
            if p.name == name:
                return p.default
        raise KeyError(name)

    def vector(self) -> list[float]:
        return [self.get(p.name) for p in PARAMS]

    @staticmethod
    def from_vector(vector, source: str = "fit") -> "Constants":
        return Constants(MappingProxyType({p.name: float(v) for p, v in zip(PARAMS, vector)}),
                         source)

    def with_values(self, **updates: float) -> "Constants":
        merged = dict(self.values)
        merged.update({k.replace("__", "."): v for k, v in updates.items()})
        return replace(self, values=MappingProxyType(merged))


def validate_values(data: Any, where: str) -> dict[str, float]:
    """Check a mapping of constant name -> number against the names and bounds."""
    if not isinstance(data, Mapping):
        raise invalid(f"{where}: constants: expected a mapping of name -> number")
    out: dict[str, float] = {}
    bounds = {p.name: p for p in PARAMS}
    for key, value in data.items():
        if key not in bounds:
            raise invalid(f"{where}: constants.{key}: unknown constant",
                          f"valid constants: {', '.join(PARAM_NAMES)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise invalid(f"{where}: constants.{key}: expected a number, got {value!r}")
        p = bounds[key]
        if not p.low <= float(value) <= p.high:
            raise invalid(f"{where}: constants.{key} = {value} is outside the plausible range "
                          f"[{p.low}, {p.high}] ({p.meaning})")
        out[key] = float(value)
    return out


def _field_names() -> tuple[str, ...]:
    return tuple(f.name for f in fields(Constants))
