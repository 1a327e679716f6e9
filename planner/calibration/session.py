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

from planner.calibration.apply import calibrate
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
                  attention_kernel: str = "flash", calibration: str | Path | None = None,
                  compiled: bool = False, moe=None, recompute_modules=None,
                  cross_entropy: str | None = None, fp8_attention: bool = False,
                  dropout: bool = False) -> Setup:
    """``moe``: MoE routing / dispatch options (planner.moe.MoeOptions) of the runtime;
    ``recompute_modules``: what selective recomputation repeats (Megatron
    ``--recompute-modules``; planner/cost/recompute_modules.py); ``cross_entropy``: the loss's
    logit precision (planner.cost.memory.LOGIT_BYTES); ``fp8_attention``: the attention core in
    FP8 (RuntimeOptions.fp8_attention), refused unless the dtype is fp8 and the runtime has
    it; ``dropout``: the run trains with attention and hidden dropout (RuntimeOptions.dropout:
    the 1-byte masks, their element-wise traffic, and the eager attention core's dropout)."""
    prof, layout = resolve_runtime(runtime, dtype)
    if fp8_attention and dtype != "fp8":
        raise invalid(f"--fp8-attention needs FP8 GEMMs (--dtype fp8), not --dtype {dtype}")
    if fp8_attention and not prof.fp8_attention:
        raise invalid(f"--fp8-attention: runtime {prof.name} has no FP8 attention",
                      "use --runtime megatron (--fp8-dot-product-attention), or drop the option")
    cal = load(calibration) if calibration is not None else shipped()
    if cal is not None and cal.runtime is not None and cal.runtime != prof.name:
        raise invalid(f"calibration profile {calibration} was fitted for runtime {cal.runtime}, "
                      f"not {prof.name}", f"pass --runtime {cal.runtime}, or calibrate "
                                          f"{prof.name} runs")
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
    cluster, options = calibrate(cluster, options, cal.constants if cal else None, compiled)
    return Setup(cluster, options, prof, cal)


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
    high = mfu_reason(calibration.bands, ev.mfu, regime.generation, regime.key, regime.runtime)
    if high:
        reasons.add(high)
    reasons = sorted(reasons)
    def r(values):
        return [float(f"{v:.6g}") for v in values]

    return {"step_time_s_interval": r(t.interval), "peak_memory_gib_interval": r(m.interval),
            "interval_coverage": coverage, "regime": regime.key,
            "extrapolating": [f"extrapolating: {r}" for r in reasons]}
