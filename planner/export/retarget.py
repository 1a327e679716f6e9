"""Whether a plan was made for the runtime it is exported to, and what changes if it was not.

Consumes a :class:`~planner.plan_types.Plan` (its recorded runtime profile, state layout and
calibrated runtime behaviour) and a target runtime profile name (``megatron``, ``torchtitan``,
``deepspeed``: :mod:`planner.profiles`); produces

* :func:`made_for`: True when the plan was searched for that runtime (``plan --runtime X``):
  its profile is X and its optimizer-state layout is X's. Such a plan's memory and time already
  are the runtime's, and its export must carry no fallback;
* :func:`retarget_warning`: for any other plan, the one warning that says exactly what the
  export changes about the runtime: each behaviour the two profiles differ in (state layout,
  allocator, overlaps, calibrated efficiencies), and the cost model's peak memory and step time
  of the exported file under the target's profile, against the plan's.

The target's behaviour is the one ``plan --runtime X`` would use: the profile's options with
the shipped calibration (:func:`planner.calibration.session.runtime_setup`).
"""
from __future__ import annotations

from dataclasses import fields
from typing import Any

from planner.config import RuntimeOptions
from planner.errors import PlannerError
from planner.hardware import GIB
from planner.plan_types import Plan
from planner.profiles import PROFILES

# RuntimeOptions fields a runtime profile (and its calibration) decides, with how to name them
_BEHAVIOUR = {
    "runtime": "optimizer-state layout", "overlap_grad_reduce": "gradient-reduce overlap",
    "overlap_param_gather": "parameter-gather overlap", "tp_comm_overlap": "TP overlap",
    "allocator_overhead": "allocator overhead", "comm_slowdown": "NCCL compute slowdown",
    "micro_batch_overhead_s": "per-micro-batch overhead s",
    "block_overhead_s": "per-block host overhead s",
    "elementwise_factor": "element-wise factor", "fp8_gemm_factor": "FP8 GEMM factor",
    "fp8_saved_inputs": "FP8 saved inputs", "fp8_bf16_gemms": "GEMMs left in 16 bits under FP8",
    "expert_gemm_per_expert": "one GEMM per local expert",
    "matmul_efficiency": "GEMM efficiency",
    "attention_efficiency": "attention efficiency", "pool_efficiency": "pools' efficiencies",
}


def made_for(plan: Plan, runtime: str) -> bool:
    """The plan was made for ``runtime``: its profile and its state layout are that runtime's."""
    prof = PROFILES[runtime]
    return (plan.runtime.profile == runtime and
            plan.runtime.runtime == prof.state_layout_for(plan.config.dtype))


def target_options(plan: Plan, runtime: str) -> RuntimeOptions:
    """The runtime options ``plan --runtime RUNTIME`` gives the plan's cluster and dtype."""
    from planner.calibration.session import carried_compile, runtime_setup

    carried = carried_compile(plan.runtime, PROFILES[runtime])
    if plan.across_pools:  # each pool's generation's efficiencies (planner/hetero/plan_file.py)
        from planner.hetero.plan_file import pool_options

        setup = runtime_setup(plan.cluster.pools[0].as_cluster(), runtime, plan.config.dtype,
                              plan.runtime.attention_kernel, moe=plan.runtime.moe, **carried)
        return pool_options(setup.options, plan.cluster,
                            setup.calibration.constants if setup.calibration else None)
    setup = runtime_setup(plan.cluster, runtime, plan.config.dtype,
                          plan.runtime.attention_kernel, moe=plan.runtime.moe, **carried)
    return setup.options


def behaviour_changes(plan: Plan, runtime: str) -> dict[str, tuple[Any, Any]]:
    """field -> (the plan's value, the target profile's) for each behaviour that differs."""
    target = target_options(plan, runtime)
    out = {}
    for f in fields(RuntimeOptions):
        if f.name in _BEHAVIOUR:
            was, now = getattr(plan.runtime, f.name), getattr(target, f.name)
            if was != now:
                out[f.name] = (was, now)
    return out


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if value is None:
        return "preset"
    return str(value)


def retarget_warning(plan: Plan, runtime: str, **exported: Any) -> str | None:
    """None when the plan was made for ``runtime``; else the warning naming what the target's
    profile changes, with the cost model's prediction for the file as exported (``exported``:
    the ParallelConfig fields the export itself changed, e.g. ``zero_stage=1``)."""
    if made_for(plan, runtime):
        return None
    changes = behaviour_changes(plan, runtime)
    made = plan.runtime.profile
    parts = [f"{_BEHAVIOUR[name]} {_value(a)} -> {_value(b)}"
             for name, (a, b) in sorted(changes.items())]
    what = "; ".join(parts) if parts else "no behaviour differs"
    text = (f"runtime: the plan was made for {made} (state layout {plan.runtime.runtime!r}), "
            f"not {runtime}; {runtime}'s profile changes: {what}")
    try:
        ev = plan.with_changes(**exported, **{f"runtime_{k}": b for k, (_, b) in
                                              changes.items()}).evaluate()
    except (PlannerError, KeyError, ValueError, TypeError):
        return text + " (the changed plan cannot be evaluated)"
    predicted = plan.document["predicted"]
    verdict = "fits" if ev.fits else "does NOT fit"
    also = ", ".join(f"{k} {v}" for k, v in sorted(exported.items()))
    capacity = ("each stage's pool's GPU" if plan.across_pools
                else f"{ev.cluster.gpu.memory_gib:g}")
    return (text + f". Under {runtime}'s profile" + (f", with {also} as exported" if also else "")
            + f", the cost model predicts the plan's degrees and placement at "
            f"{ev.peak_memory_bytes / GIB:.1f} GiB peak per GPU instead of "
            f"{predicted['peak_memory_gib']:.1f} ({verdict} in {capacity}), "
            f"step time {ev.step_time_s:.4g} s instead of {predicted['step_time_s']:.4g}; "
            f"`shardplan plan --runtime {runtime}` searches a plan for it")
