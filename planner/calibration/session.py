"""What ``plan``, ``evaluate`` and ``check`` need from the calibration: the runtime's options
with the calibrated constants applied, and the error bands of a prediction.

:func:`runtime_setup` resolves ``--runtime`` (a profile, or a legacy state-layout name) and
``--calibration`` (a profile file from ``shardplan calibrate``; default: the shipped
``defaults.yaml``) into the cluster and :class:`~planner.config.RuntimeOptions` the cost model
reads. :func:`prediction_intervals` gives the ``predicted.*_interval`` fields of
``evaluate --json`` and of plan files.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from planner.calibration.apply import calibrate, recorded_elementwise
from planner.calibration.bands import NOMINAL_COVERAGE, band, mfu_reason
from planner.calibration.regimes import band_labels, recompute_kinds, regime_of
from planner.calibration.store import CalibrationProfile, load, shipped
from planner.config import RuntimeOptions
from planner.errors import invalid
from planner.hardware import GIB, Cluster
from planner.profiles import RuntimeProfile, resolve_runtime


@dataclass(frozen=True)
class Setup:
    cluster: Cluster
    options: RuntimeOptions
    profile: RuntimeProfile
    calibration: CalibrationProfile | None


def runtime_setup(cluster: Cluster, runtime: str = "megatron", dtype: str = "bf16",
                  attention_kernel: str = "flash",
                  calibration: str | Path | CalibrationProfile | None = None,
                  compiled: bool = False, moe=None, recompute_modules=None,
                  cross_entropy: str | None = None, fp8_attention: bool = False,
                  dropout: bool = False, elementwise: str | None = None) -> Setup:
    """``calibration``: a profile file, or a profile already read (a plan's recorded one);
    None: the shipped constants. ``moe``: MoE routing / dispatch options (planner.moe.MoeOptions) of the runtime;
    ``recompute_modules``: what selective recomputation repeats (Megatron
    ``--recompute-modules``; planner/cost/recompute_modules.py); ``cross_entropy``: the loss's
    logit precision (planner.cost.memory.LOGIT_BYTES); ``fp8_attention``: the attention core in
    FP8 (RuntimeOptions.fp8_attention), refused unless the dtype is fp8 and the runtime has
    it; ``dropout``: the run trains with attention and hidden dropout (RuntimeOptions.dropout:
    the 1-byte masks, their element-wise traffic, and the eager attention core's dropout);
    ``compiled`` / ``elementwise``: the runtime runs under torch.compile, its element-wise ops
    "fused" or "eager" (None: fused when compiled or where the profile's kernels are;
    :func:`compile_choice` refuses what the runtime cannot mean)."""
    prof, layout = resolve_runtime(runtime, dtype)
    fused = compile_choice(prof, compiled, elementwise)
    if fp8_attention and dtype != "fp8":
        raise invalid(f"--fp8-attention needs FP8 GEMMs (--dtype fp8), not --dtype {dtype}")
    if fp8_attention and not prof.fp8_attention:
        raise invalid(f"--fp8-attention: runtime {prof.name} has no FP8 attention",
                      "use --runtime megatron (--fp8-dot-product-attention), or drop the option")
    cal = calibration if isinstance(calibration, CalibrationProfile) else \
        load(calibration) if calibration is not None else shipped()
    if cal is not None and cal.runtime is not None and cal.runtime != prof.name:
        raise invalid(f"calibration profile {cal.constants.source} was fitted for runtime "
                      f"{cal.runtime}, not {prof.name}",
                      f"pass --runtime {cal.runtime}, or calibrate {prof.name} runs")
    overlap = prof.grad_reduce_overlap and prof.name != "deepspeed"
    options = RuntimeOptions(runtime=layout, profile=prof.name, attention_kernel=attention_kernel,
                             overlap_grad_reduce=overlap,
                             overlap_param_gather=prof.param_gather_overlap and overlap)
    if moe is not None:
        options = replace(options, moe=moe)
    if recompute_modules is not None:
        options = replace(options, recompute_modules=tuple(recompute_modules))
    if cross_entropy is not None:
        options = replace(options, cross_entropy=cross_entropy)
    if fp8_attention:
        options = replace(options, fp8_attention=True)
    if dropout:
        options = replace(options, dropout=True)
    options = replace(options, compiled=compiled,
                      elementwise=recorded_elementwise(prof.name, compiled, fused))
    cluster, options = calibrate(cluster, options, cal.constants if cal else None)
    return Setup(cluster, options, prof, cal)


def compile_choice(prof: RuntimeProfile, compiled: bool, elementwise: str | None
                   ) -> bool | None:
    """``--compile`` / ``--elementwise`` for runtime ``prof``: whether its element-wise ops are
    fused (None: not chosen, the default), or INVALID_INPUT where the choice means nothing the
    cost model can count: compile on a runtime whose kernels are fused already and that has no
    compiled-only overlap, eager element-wise ops under compile (Inductor fuses them), or eager
    ones on a runtime whose calibration knows only its fused kernels."""
    if elementwise not in (None, "fused", "eager"):
        raise invalid(f"--elementwise must be fused or eager, not {elementwise!r}")
    if compiled and not prof.compile_changes_cost:
        raise invalid(f"--compile: runtime {prof.name} runs its element-wise ops as fused "
                      f"kernels already and none of its overlaps needs torch.compile, so "
                      f"compiling changes nothing the cost model counts",
                      "drop --compile (it matters for --runtime torchtitan and fsdp)")
    if elementwise == "eager" and compiled:
        raise invalid("--elementwise eager with --compile: torch.compile (Inductor) fuses the "
                      "element-wise ops", "drop one of them")
    if elementwise == "eager" and prof.elementwise == "fused":
        raise invalid(f"--elementwise eager: runtime {prof.name} runs its element-wise ops as "
                      f"fused kernels (Megatron's fused bias-activation and bias-dropout-add, "
                      f"Transformer Engine's norms); the calibration has no eager constant for "
                      f"it", "drop --elementwise, or plan --runtime torchtitan or fsdp")
    return None if elementwise is None else elementwise == "fused"


def carried_compile(options: RuntimeOptions, prof: RuntimeProfile) -> dict:
    """``compiled`` / ``elementwise`` (runtime_setup's keywords) that carry a plan's recorded
    choice (``options``) over to runtime ``prof`` (``check --runtime``, an export to another
    runtime): compile where it changes ``prof``'s cost, an explicit element-wise choice where
    ``prof`` runs eager and uncompiled; what ``prof`` cannot mean is left at its default."""
    compiled = options.compiled and prof.compile_changes_cost
    keep = options.elementwise and not compiled and prof.elementwise == "eager"
    return {"compiled": compiled, "elementwise": options.elementwise if keep else None}


def prediction_intervals(ev, calibration: CalibrationProfile | None,
                         coverage: float = NOMINAL_COVERAGE) -> dict:
    """``step_time_s_interval`` and ``peak_memory_gib_interval`` ([low, high]) at ``coverage``,
    and why they are wider where the configuration leaves the calibration data."""
    if calibration is None:
        return {"extrapolating": ["no calibration profile: no error bands"]}
    if calibration.bands is None:  # a hand-written profile: constants only
        return {"extrapolating": ["the calibration profile has no bands: no error bands"]}
    c = ev.config
    regime = regime_of(ev.options.profile, ev.cluster.gpu.name, c.tp, c.pp, c.cp, c.zero_stage)
    labels = band_labels(regime)
    gpus, params = ev.cluster.num_gpus, ev.model.params
    kinds = recompute_kinds(ev.model, ev.placement)
    t = band(calibration.bands, "step_time", ev.step_time_s, labels, gpus, params, coverage,
             kinds)
    m = band(calibration.bands, "memory", ev.peak_memory_bytes / GIB, labels, gpus, params,
             coverage, kinds)
    # each note names its quantity: the step-time bands rest on many more runs than the
    # memory bands (only some sources publish memory)
    reasons = {f"step time: {r}" for r in t.extrapolating} | \
        {f"peak memory: {r}" for r in m.extrapolating}
    # the MFU as the plan records it (planner.report.rounded) and the headline prints it: a
    # note formatted from the unrounded value could print another last digit (65.3 % against
    # the headline's 65.2 % for a recorded 0.6525)
    from planner.report import rounded

    high = mfu_reason(calibration.bands, rounded(ev.mfu), regime.generation, regime.key,
                      regime.runtime)
    if high:
        reasons.add(high)
    reasons = sorted(reasons)
    def r(values):
        return [float(f"{v:.6g}") for v in values]

    return {"step_time_s_interval": r(t.interval), "peak_memory_gib_interval": r(m.interval),
            "interval_coverage": coverage, "regime": regime.key,
            "extrapolating": [f"extrapolating: {r}" for r in reasons]}
