"""Predict a calibration run with a set of constants: the one bridge from runs to the cost model.

``predict(run, constants)`` applies the constants (GPU-generation efficiencies, FP8 relative
efficiency, the runtime's TP overlap, ...) to the run's inputs and evaluates it with the
library's cost model (:func:`planner.cost.model.evaluate`), so the fit, the accuracy report and
``shardplan calibrate`` judge exactly what ``plan`` and ``evaluate`` compute.

Memory read by the allocator (torchtitan's max reserved) excludes the CUDA context that
nvidia-smi shows; the comparison subtracts it (about 0.5 GiB on A100/H100, planner/hardware.py).
When a run's recomputation is not published, it is taken as the runtime's cheapest policy
under which the run fits (it did run); such a run's fit verdict is not judged.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from planner.calibration.constants import PARAM_NAMES, Constants
from planner.calibration.regimes import gpu_generation
from planner.calibration.runs import CalibrationRun
from planner.config import Recompute
from planner.cost.model import Evaluation, evaluate
from planner.hardware import GIB, Cluster

CUDA_CONTEXT_GIB = 0.5
RECOMPUTE_ORDER = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)


@dataclass(frozen=True)
class Prediction:
    step_time_s: float
    memory_gib: float  # in the unit and reading of the run's measurement
    fits: bool
    fit_judged: bool  # False when the recomputation was inferred from fitting
    recompute: Recompute
    evaluation: Evaluation


def apply_constants(cluster: Cluster, dtype: str, constants: Constants) -> Cluster:
    gen = gpu_generation(cluster.gpu.name)
    gpu = cluster.gpu
    if f"matmul_efficiency.{gen}" in constants_names():
        eff = constants.get(f"matmul_efficiency.{gen}")
        if dtype == "fp8":
            eff *= constants.get("fp8_relative_efficiency")
        gpu = replace(gpu, matmul_efficiency=eff,
                      attention_efficiency=constants.get(f"attention_efficiency.{gen}"))
    return replace(cluster, gpu=gpu)


def constants_names() -> tuple[str, ...]:
    return PARAM_NAMES


def _evaluate(run: CalibrationRun, constants: Constants | None,
              recompute: Recompute) -> Evaluation:
    """``constants`` None: the library's shipped values as they are (the preset GPUs)."""
    cluster, options = run.cluster, run.options
    if constants is not None:
        cluster = apply_constants(run.cluster, run.config.dtype, constants)
    key = f"tp_comm_overlap.{run.profile.name}"
    if constants is not None and key in constants_names() and run.profile.tp_comm_overlap:
        options = replace(options, tp_comm_overlap=constants.get(key))
    config = replace(run.config, recompute=recompute)
    return evaluate(run.model, cluster, config, options=options)


def predict(run: CalibrationRun, constants: Constants | None = None) -> Prediction:
    judged = "no recompute" not in run.assumptions
    if judged:
        ev = _evaluate(run, constants, run.config.recompute)
    else:
        for recompute in RECOMPUTE_ORDER:
            ev = _evaluate(run, constants, recompute)
            if ev.fits:
                break
    memory = ev.peak_memory_bytes / GIB
    if run.measured.memory_reading == "allocator":
        memory -= CUDA_CONTEXT_GIB
    return Prediction(ev.step_time_s, memory, ev.fits, judged, ev.config.recompute, ev)
