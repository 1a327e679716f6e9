"""Apply calibrated constants to a configuration's inputs: the one place constants meet the
cost model (used by ``evaluate``, ``plan``, ``check``, the fit and the accuracy report).

Consumes a cluster, runtime options, the run's dtype and a :class:`Constants`; produces the
cluster (its GPU's GEMM and attention efficiency for the GPU generation) and the runtime
options (allocator overhead, NCCL slowdown, per-micro-batch overhead, element-wise fusion,
FP8 GEMM efficiency, TP-communication overlap where the profile has it) the cost terms read.
"""
from __future__ import annotations

from dataclasses import replace

from planner.calibration.constants import PARAM_NAMES, Constants
from planner.calibration.regimes import gpu_generation
from planner.config import RuntimeOptions
from planner.hardware import Cluster
from planner.profiles import profile


def calibrated_cluster(cluster: Cluster, constants: Constants) -> Cluster:
    gen = gpu_generation(cluster.gpu.name)
    if f"matmul_efficiency.{gen}" not in PARAM_NAMES:
        return cluster  # a generation the calibration does not cover keeps its preset values
    gpu = replace(cluster.gpu, matmul_efficiency=constants.get(f"matmul_efficiency.{gen}"),
                  attention_efficiency=constants.get(f"attention_efficiency.{gen}"))
    return replace(cluster, gpu=gpu)


def calibrated_options(options: RuntimeOptions, constants: Constants,
                       compiled: bool = False) -> RuntimeOptions:
    """``compiled``: the runtime fuses element-wise ops (torch.compile); eager otherwise."""
    prof = profile(options.profile)
    name = prof.name
    changes = {
        "allocator_overhead": constants.get(f"allocator_overhead.{name}"),
        "comm_slowdown": constants.get("nccl_compute_slowdown"),
        "micro_batch_overhead_s": constants.get("microbatch_overhead_s"),
        "fp8_gemm_factor": constants.get("fp8_relative_efficiency"),
        "fp8_saved_inputs": prof.fp8_saved_inputs,
    }
    key = f"unfused_elementwise.{name}"
    changes["elementwise_factor"] = 1.0 if compiled or key not in PARAM_NAMES else \
        constants.get(key)
    key = f"tp_comm_overlap.{name}"
    if prof.tp_comm_overlap and key in PARAM_NAMES:
        changes["tp_comm_overlap"] = constants.get(key)
    return replace(options, **changes)


def calibrate(cluster: Cluster, options: RuntimeOptions, constants: Constants | None,
              compiled: bool = False) -> tuple[Cluster, RuntimeOptions]:
    """Both at once; ``constants`` None leaves the inputs as they are (raw preset values)."""
    if constants is None:
        return cluster, options
    return calibrated_cluster(cluster, constants), calibrated_options(options, constants, compiled)
