"""Predict a calibration run with a set of constants: the one bridge from runs to the cost model.

``predict(run, constants)`` applies the constants (planner/calibration/apply.py) to the run's
inputs and evaluates it with the library's cost model (:func:`planner.cost.model.evaluate`), so
the fit, the accuracy report and ``shardplan calibrate`` judge exactly what ``plan`` and
``evaluate`` compute.

Memory read by the allocator (torchtitan's max reserved) excludes the CUDA context that
nvidia-smi shows; the comparison subtracts it (about 0.5 GiB on A100/H100, planner/hardware.py).
When a run's recomputation is not published, it is taken as the least recomputation under which
the run fits (it did run): none, else Megatron's ``--recompute-method block
--recompute-num-layers n`` with the fewest fully recomputed blocks per stage. Such a run's fit
verdict is not judged (it was used to infer the setting). A run that offloads activations to
the host (``offloaded_layers``) is evaluated with its published recomputation and its memory
verdict is not judged either: the cost model has no host offload (planner/calibration/runs.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from planner.calibration.apply import calibrate
from planner.calibration.constants import Constants
from planner.calibration.runs import CalibrationRun
from planner.cost.model import Evaluation, evaluate
from planner.hardware import GIB
from planner.ir import LayerKind
from planner.placement import runtime_placement
from planner.strategy import NO_OPTION, LayerOption, LayerPlacement, Recompute

CUDA_CONTEXT_GIB = 0.5


@dataclass(frozen=True)
class Prediction:
    step_time_s: float
    memory_gib: float  # in the unit and reading of the run's measurement
    fits: bool
    fit_judged: bool  # False when the recomputation was inferred from fitting
    recompute: str  # what was evaluated ('full on 20/80 blocks': partial block recompute)
    evaluation: Evaluation


def placement_of(run: CalibrationRun, recompute: Recompute,
                 full_blocks_per_stage: int | None = None, every_nth: int = 0) -> LayerPlacement:
    """The run's placement: one policy for every block, or the first ``n`` blocks of every
    stage fully recomputed (Megatron block method), or every ``every_nth`` block fully
    recomputed (torchtitan ``selective_ac_option = N``). The stages are the runtime's default
    placement (planner/placement.py), with the run's published ``partition_method`` if any."""
    base = runtime_placement(run.model, run.config, run.profile, LayerOption(recompute),
                             run.pp_partition)
    if full_blocks_per_stage is None and not every_nth:
        return base
    seen: dict[int, int] = {}
    options = []
    block = 0
    for layer, stage in zip(run.model.layers, base.stage):
        if layer.kind is not LayerKind.BLOCK:
            options.append(NO_OPTION)
            continue
        seen[stage] = seen.get(stage, 0) + 1
        if every_nth:
            full = block % every_nth == 0
        else:
            full = seen[stage] <= (full_blocks_per_stage or 0)
        options.append(LayerOption(Recompute.FULL if full else Recompute.NONE))
        block += 1
    return LayerPlacement(base.stage, tuple(options))


def _evaluate(run: CalibrationRun, constants: Constants | None,
              placement: LayerPlacement) -> Evaluation:
    cluster, options = calibrate(run.cluster, run.options, constants, run.compiled)
    return evaluate(run.model, cluster, run.config, placement, options=options)


def _fewest_full_blocks(run: CalibrationRun, constants: Constants | None) -> Evaluation:
    per_stage = -(-run.model.num_blocks // run.config.pp)
    best = _evaluate(run, constants, placement_of(run, Recompute.FULL))
    lo, hi = 1, per_stage
    while lo < hi:  # smallest n that fits (memory falls as n grows)
        mid = (lo + hi) // 2
        trial = _evaluate(run, constants, placement_of(run, Recompute.NONE, mid))
        if trial.fits:
            best, hi = trial, mid
        else:
            lo = mid + 1
    return best


def predict(run: CalibrationRun, constants: Constants | None = None) -> Prediction:
    judged = run.recompute_published and not run.offloaded_layers
    if run.recompute_published or run.offloaded_layers:
        ev = _evaluate(run, constants, placement_of(run, run.recompute, every_nth=run.every_nth))
    else:
        ev = _evaluate(run, constants, placement_of(run, Recompute.NONE))
        if not ev.fits:
            ev = _fewest_full_blocks(run, constants)
    memory = ev.peak_memory_bytes / GIB
    if run.measured.memory_reading == "allocator":
        memory -= CUDA_CONTEXT_GIB
    full = sum(r is Recompute.FULL for r in ev.placement.recompute)
    policies = {r for r, layer in zip(ev.placement.recompute, run.model.layers)
                if layer.kind is LayerKind.BLOCK}
    label = policies.pop().value if len(policies) == 1 else \
        f"full on {full}/{run.model.num_blocks} blocks"
    if run.offloaded_layers:
        label += f", {run.offloaded_layers} offloaded"
    return Prediction(ev.step_time_s, memory, ev.fits, judged, label, ev)
