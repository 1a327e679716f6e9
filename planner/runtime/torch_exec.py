"""Execute a plan with PyTorch distributed on CPU processes and check it against the planner.

:func:`verify_plan` takes a plan file (or its document), starts ``world_size`` CPU processes
(``torch.multiprocessing`` with the forkserver start method, gloo, ``MASTER_ADDR=127.0.0.1`` and
a free port), and in each one:

1. builds the DeviceMesh the plan describes with ``init_device_mesh("cpu", ...)``, dims and
   shape from :class:`planner.mesh.Mesh` (the one statement of the rank layout);
2. builds the whole model (:func:`planner.runtime.model.build_decoder`, same seed everywhere)
   and keeps the layers of its pipeline stage(s), as the plan assigns them layer by layer;
3. applies the plan with PyTorch's own APIs: tensor parallelism with DTensor
   ``parallelize_module`` (torchtitan's per-module plan: ColwiseParallel q/k/v/gate/up,
   RowwiseParallel o/down, embedding Rowwise, LM head Colwise, SequenceParallel norms and
   PrepareModuleInput when the plan's sp is on), activation checkpointing per layer
   (``torch.utils.checkpoint``: "full" the whole block, "selective" the attention core), data
   parallelism by ZeRO stage (see :data:`ZERO_IMPLEMENTATION`), and pipeline stages with
   ``torch.distributed.pipelining`` (``PipelineStage`` + ``Schedule1F1B``, or
   ``ScheduleInterleaved1F1B`` when the plan has virtual stages);
4. trains ``steps`` Adam steps on deterministic synthetic tokens (global batch and
   micro-batches as the plan says) and records its losses, the bytes of parameters, gradients
   and optimizer states it holds, and the peak of activations saved for backward.

The parent process trains the same model on the same data in one process (whole global batch,
no micro-batches) and compares the loss curves, and compares each rank's held bytes with the
cost model's prediction, recomputed exactly with :func:`planner.cost.model.evaluate` under
``RuntimeOptions(runtime="torch-fp32")`` on the plan's own config and placement.

MoE blocks (router, routed SwiGLU experts, shared experts) run force-balanced
(:mod:`planner.runtime.experts`); with expert parallelism (ep > 1) each rank keeps ``E / ep``
experts of every MoE block, dispatch and combine are ``all_to_all_single`` over the EP group
of the expert mesh (:class:`planner.mesh.Mesh`), expert gradients are reduced over the expert
data-parallel group, and the bytes those all-to-alls move are compared with the cost model's
(:func:`planner.runtime.support.a2a_prediction`).

Under tensor parallelism a MoE block runs on each TP rank's sequence shard (Megatron-Core's
``MoELayer``), its experts on the expert mesh (etp x ep x edp over the stage's tp x dp ranks),
with the ETP gather and scatter when etp > 1; under ZeRO-3 the experts are FSDP2-sharded over
edp (torchtitan). The first step's expert gradients are compared with the reference's.

Limits: context parallelism (cp > 1) is not executed; MoE plans with expert parallelism or TP
run under ZeRO 0 to 3 (ZeRO-3 with tp 1); tied embeddings only without TP and PP.

Modules, one job each: :mod:`~planner.runtime.support` (the plan as a Plan, what runs, the
pipeline chunks), :mod:`~planner.runtime.parallelize` (TP/SP, FSDP2, ZeRO-2 hooks),
:mod:`~planner.runtime.worker` (one rank), :mod:`~planner.runtime.launch` (the processes),
:mod:`~planner.runtime.reference` (the single-process run), :mod:`~planner.runtime.verify_report`
(the report); this module runs them in order (:func:`verify_plan`).
"""
from __future__ import annotations

import os
import time
from typing import Mapping


from planner.config import ParallelConfig
from planner.plan_types import Plan
from planner.errors import invalid
from planner.ir import ModelGraph
from planner.runtime.launch import DEFAULT_TIMEOUT_S, RunFailed, run_distributed
from planner.runtime.reference import reference_run
from planner.runtime.support import (MAX_PROCESSES, a2a_prediction, check_supported,
                                     etp_prediction, expert_state_prediction,
                                     implementation_summary,
                                     layer_degrees, pipeline_chunks, read_plan,
                                     reshard_prediction, runtime_options)
from planner.runtime.verify_report import (STATE_CATEGORIES, RankReport, VerifyReport,  # noqa: F401
                                           a2a_checks, expert_grad_check,
                                           expert_state_checks,
                                           predicted_stored_activations,
                                           reshard_checks, state_checks)


DEFAULT_STEPS = 3
DEFAULT_SEED = 0
DEFAULT_LR = 3e-3
# fp32 everywhere; the distributed run sums the same products in another order (TP partial sums,
# DP/FSDP gradient averaging, micro-batch accumulation), which moves each loss by a few fp32
# ulps (~1e-7 relative); Adam's first steps normalise gradients, so differences stay at that
# level for a few steps (docs/verification.md: at most 1.1e-7 over nine plan shapes). 1e-4
# leaves three orders of magnitude of margin while a real fault moves the loss by 1e-3 or more
# (stale gradients under TP + ZeRO-1 moved the third loss by 2.3e-3).
LOSS_RTOL = 1e-4


def verify_plan(plan: str | os.PathLike | dict | Plan, *, steps: int = DEFAULT_STEPS,
                seed: int = DEFAULT_SEED, lr: float = DEFAULT_LR, rtol: float = LOSS_RTOL,
                timeout_s: float = DEFAULT_TIMEOUT_S,
                max_processes: int = MAX_PROCESSES,
                slow: Mapping[int, float] | None = None) -> VerifyReport:
    """Run ``plan`` for ``steps`` training steps on CPU processes and compare it with a
    single-process run (losses) and with the cost model (held bytes). Raises PlannerError for
    plans this runtime cannot execute; a failure inside the distributed run is reported in
    ``VerifyReport.error`` (with the exact exception). ``slow``: injected stragglers, rank ->
    factor (the rank sleeps ``(factor - 1) x`` its compute time every step): the losses and
    held bytes must not change."""
    if steps < 1:
        raise invalid(f"--steps must be at least 1, got {steps}")
    t0 = time.perf_counter()
    typed, name = read_plan(plan)
    doc = typed.document
    check_supported(typed, max_processes)
    c = typed.config
    slow = dict(slow or {})
    for r, f in slow.items():
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < c.num_gpus:
            raise invalid(f"--slow: rank {r!r} is not a rank of the plan (0 .. {c.num_gpus - 1})")
        if not (isinstance(f, (int, float)) and 1.0 <= f <= 100.0):
            raise invalid(f"--slow: factor {f!r} of rank {r} is not in [1, 100]")
    options = runtime_options(typed)
    ev = typed.evaluate(options=options)  # across pools: each stage on its pool
    notes = []
    plan_runtime = typed.runtime.runtime
    if plan_runtime != "torch-fp32":
        notes.append(f"the plan was made for runtime {plan_runtime!r}; predictions here are "
                     "re-evaluated with the torch-fp32 state layout this runtime has")
    else:
        for stage, predicted in zip(doc.get("stages", []), ev.stages):
            for key in STATE_CATEGORIES:
                written = predicted.memory.gib()[key]
                in_plan = stage["memory_gib"][key]
                if abs(written - in_plan) > 1e-5 * max(abs(in_plan), 1e-9):
                    notes.append(f"stage {stage['index']} {key}: the plan says {in_plan} GiB, "
                                 f"evaluate gives {written:.6g} GiB")
    if options.dropout:
        notes.append("the plan assumes dropout; the runtime trains without it")
    notes.append("activations: measured = peak bytes of fp32 tensors saved for backward "
                 "(parameters excluded, checkpoint inputs included, recompute working set not "
                 "seen); the prediction assumes 16-bit activations (ACT_BYTES = 2), so 2x the "
                 "predicted stored bytes is the like-for-like figure; eager PyTorch also saves "
                 "what fused kernels avoid (RoPE inputs, RMSNorm's normalised input, both "
                 "SwiGLU branches and their product, fp32 log-softmax of the loss)")
    chunks = pipeline_chunks(typed.placement.stage, c.pp, c.virtual_stages)
    degrees = layer_degrees(typed)
    changes = reshard_prediction(typed)
    a2a_per_micro_batch = a2a_prediction(typed)
    etp_per_micro_batch = etp_prediction(typed)
    moe_options = typed.runtime.moe  # what the plan assumed (runtime_options keeps defaults)
    if a2a_per_micro_batch and (moe_options.load_factor != 1.0
                                or moe_options.dispatcher != "alltoall"):
        notes.append(f"the plan assumes MoE routing imbalance {moe_options.imbalance:g}, "
                     f"capacity factor {moe_options.capacity_factor:g} and the "
                     f"{moe_options.dispatcher} dispatcher; the runtime routes force-balanced "
                     "and dropless with a flat all_to_all_single, so the all-to-all bytes are "
                     "predicted for that (load factor 1, flat)")
    t_ref = time.perf_counter()
    reference, reference_expert_sq = reference_run(typed.model, c, steps, seed, lr)
    t_dist = time.perf_counter()
    job = {"model": _model_dict(typed.model), "config": _config_dict(c), "chunks": chunks,
           "recompute": [r.value for r in typed.placement.recompute], "steps": steps,
           "seed": seed, "lr": lr, "slow": {str(r): float(f) for r, f in slow.items()},
           "degrees": degrees}
    report = VerifyReport(plan=name, parallelism=dict(doc.get("parallelism", {})),
                          world_size=c.num_gpus, steps=steps, seed=seed, lr=lr, loss_rtol=rtol,
                          reference_losses=reference, distributed_losses=[], ranks=[],
                          implementation=implementation_summary(c, typed.placement,
                                                                typed.model),
                          notes=notes, slow_ranks=dict(slow))
    if changes:
        report.implementation["layouts"] = (
            "per-layer tensor degrees " + ", ".join(
                f"{layer.name} {t}" for layer, t in zip(typed.model.layers, degrees))
            + "; each layout's parallelize_module over t consecutive ranks of the stage "
            "(DeviceMesh (pp, data, tensor) per degree), the activation redistributed "
            "between layouts by DTensor redistribute on the merging ranks' mesh (Shard(0) "
            "-> Replicate(): all-gather; Replicate() -> Shard(0): slice, backward "
            "all-gather), gradients all-reduced over each layer's own data group")
    if slow:
        notes.append("stragglers injected: " + ", ".join(
            f"rank {r} x{f:g}" for r, f in sorted(slow.items())) + " (the rank sleeps (factor - "
            "1) x its compute time every step before the gradient sync; losses and held bytes "
            "must be those of the plan without them)")
    try:
        results = run_distributed(job, c.num_gpus, timeout_s)
    except RunFailed as failure:
        report.error = str(failure)
        report.error_traceback = failure.traceback_text
        report.seconds = {"reference": t_dist - t_ref, "distributed": time.perf_counter() - t_dist,
                          "total": time.perf_counter() - t0}
        return report
    t_end = time.perf_counter()
    memory = [s.memory for s in ev.stages]
    stored = predicted_stored_activations(typed, options)
    checks = state_checks(c, memory, results)
    reporter = next(r for r in results if r["coords"]["pp"] == c.pp - 1
                    and r["coords"]["dp"] == 0 and r["coords"]["tp"] == 0
                    and r["coords"]["cp"] == 0)
    report.distributed_losses = list(reporter["losses"])
    from planner.cost.memory import ACT_BYTES

    report.reshard = reshard_checks(changes, results, c.global_batch // (c.micro_batch * c.dp),
                                    ACT_BYTES)
    report.a2a = a2a_checks(a2a_per_micro_batch, results, c.num_micro_batches,
                            etp_per_micro_batch)
    report.expert_grads = expert_grad_check(reference_expert_sq, results, c, rtol)
    report.expert_states = expert_state_checks(expert_state_prediction(typed), results,
                                               c.mesh)
    names = [layer.name for layer in typed.model.layers]
    for r in results:
        report.ranks.append(RankReport(
            rank=r["rank"], coords=r["coords"], stage=r["stage"],
            layers=[[names[i] for i in chunk] for chunk in r["chunks"]],
            states=checks[r["rank"]],
            optimizer_step_counters=int(r["held"]["optimizer_step_counters"]),
            activations_predicted=float(memory[r["stage"]].activations),
            activations_predicted_stored=stored[r["stage"]],
            activations_measured=int(r["activation_peak_bytes"]),
            setup_s=r["setup_s"], step_s=r["step_s"],
            grad_layout_differences=r.get("grad_layout_differences", []),
            slowdown=float(slow.get(r["rank"], 1.0)),
            injected_delay_s=list(r.get("injected_delay_s", []))))
    report.seconds = {"reference": t_dist - t_ref, "distributed": t_end - t_dist,
                      "total": time.perf_counter() - t0}
    return report


def _model_dict(model: ModelGraph) -> dict:
    from planner.serialize import model_to_dict

    return model_to_dict(model)


def _config_dict(c: ParallelConfig) -> dict:
    return {"tp": c.tp, "pp": c.pp, "dp": c.dp, "cp": c.cp, "sp": c.sp, "ep": c.ep,
            "etp": c.etp,
            "zero_stage": c.zero_stage, "micro_batch": c.micro_batch,
            "global_batch": c.global_batch, "seq_len": c.seq_len,
            "virtual_stages": c.virtual_stages}
