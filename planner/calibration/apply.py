"""Apply calibrated constants to a configuration's inputs: the one place constants meet the
cost model (used by ``evaluate``, ``plan``, ``check``, the fit and the accuracy report).

Consumes a cluster, runtime options and a :class:`Constants`; produces the runtime options the
cost terms read: the GPU generation's GEMM and attention efficiency, allocator overhead, NCCL
slowdown, per-micro-batch and per-block host overheads, element-wise fusion, FP8 GEMM efficiency and the
TP-communication overlap where the profile has it. The cluster is returned unchanged.
"""
from __future__ import annotations

from dataclasses import replace

from planner.calibration.constants import PARAM_NAMES, Constants
from planner.calibration.regimes import gpu_generation
from planner.config import RuntimeOptions
from planner.hardware import Cluster
from planner.profiles import profile


def elementwise_fused(profile_name: str, compiled: bool, elementwise: str = "") -> bool:
    """Whether the runtime's element-wise ops run fused: ``elementwise`` ("fused" / "eager")
    where given, else fused under torch.compile or where the profile's own kernels are fused
    (planner.profiles.RuntimeProfile.elementwise)."""
    if elementwise:
        return elementwise == "fused"
    return compiled or profile(profile_name).elementwise == "fused"


def recorded_elementwise(profile_name: str, compiled: bool, fused: bool | None) -> str:
    """RuntimeOptions.elementwise for a fusion choice: "" where ``fused`` (None: not chosen)
    is the default for the profile and ``compiled``, so that a plan made without the choice
    and one made with the default chosen are the same bytes."""
    if fused is None or fused == elementwise_fused(profile_name, compiled):
        return ""
    return "fused" if fused else "eager"


def calibrated_options(options: RuntimeOptions, constants: Constants, gpu_name: str,
                       compiled: bool | None = None,
                       fused_elementwise: bool | None = None) -> RuntimeOptions:
    """``compiled``: the runtime runs under torch.compile (fused element-wise ops, and async TP
    where the profile needs compile for it); eager otherwise; None: ``options.compiled``.
    ``fused_elementwise``: the runtime fuses its element-wise ops without torch.compile
    (Transformer Engine's fused norms, RoPE and activations in place of eager PyTorch's);
    ``None``: ``options.elementwise``, or as the profile does (:func:`elementwise_fused`).
    A profile whose own kernels are fused (``RuntimeProfile.elementwise``, Megatron's) keeps
    their traffic, the reference of ``x fused HBM bytes``; an eager one costs
    ``unfused_elementwise.<profile>`` eager and ``compiled_elementwise`` fused. The choice is
    recorded in the options (``compiled``, ``elementwise``). The GPU generation's
    efficiencies go into the options, not the cluster: the cluster stays the preset the user
    named (its content hash is the plan's input identity)."""
    prof = profile(options.profile)
    name = prof.name
    compiled = options.compiled if compiled is None else compiled
    choice = ("" if fused_elementwise is None else "fused" if fused_elementwise else "eager") \
        or options.elementwise
    fused = elementwise_fused(name, compiled, choice)
    changes: dict = {"compiled": compiled,
                     "elementwise": recorded_elementwise(name, compiled, fused)}
    gen = gpu_generation(gpu_name)
    if f"matmul_efficiency.{gen}" in PARAM_NAMES:  # generations not calibrated keep presets
        changes["matmul_efficiency"] = constants.get(f"matmul_efficiency.{gen}")
        changes["attention_efficiency"] = constants.get(f"attention_efficiency.{gen}")
    changes.update({
        "allocator_overhead": constants.get(f"allocator_overhead.{name}"),
        "comm_slowdown": constants.get("nccl_compute_slowdown"),
        "micro_batch_overhead_s": constants.get("microbatch_overhead_s"),
        "block_overhead_s": constants.get(f"block_overhead_s.{name}"),
        "fp8_gemm_factor": constants.get(f"fp8_relative_efficiency.{name}"
                                         if f"fp8_relative_efficiency.{name}" in PARAM_NAMES
                                         else "fp8_relative_efficiency"),
        "fp8_saved_inputs": prof.fp8_saved_inputs,
        "fp8_bf16_gemms": prof.fp8_bf16_gemms,
        "expert_gemm_per_expert": prof.expert_gemm_per_expert,
    })
    if prof.elementwise == "fused":  # its own fused kernels: the reference traffic
        changes["elementwise_factor"] = 1.0
    else:
        changes["elementwise_factor"] = constants.get(
            "compiled_elementwise" if fused else f"unfused_elementwise.{name}")
    key = f"tp_comm_overlap.{name}"
    if prof.tp_comm_overlap and key in PARAM_NAMES and \
            (compiled or not prof.tp_overlap_needs_compile):
        changes["tp_comm_overlap"] = constants.get(key)
    return replace(options, **changes)


def calibrate(cluster: Cluster, options: RuntimeOptions, constants: Constants | None,
              compiled: bool | None = None) -> tuple[Cluster, RuntimeOptions]:
    """Both at once; ``constants`` None leaves the inputs as they are (raw preset values)."""
    if constants is None:
        return cluster, options
    return cluster, calibrated_options(options, constants, cluster.gpu.name, compiled)
