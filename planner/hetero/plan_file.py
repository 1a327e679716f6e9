"""Plan files across pools: the plan document of a :class:`~planner.hetero.evaluate.HeteroEvaluation`.

A plan across pools is a plan file of ``schema_version`` 2 (one-pool plans stay version 1, byte
for byte): the same sections as a one-pool plan (planner/plan.py, planner/report.py), plus

* ``parallelism.stage_pools``: the pool of every pipeline stage (the stage-to-pool decision),
  or a split stage's spelling (``"h100:8+a100:24"``: replicas per pool, :mod:`planner.hetero.layout`);
* ``stages[i].pool``, ``.capacity_gib`` (that pool's GPU memory; a split stage's smallest) and
  ``.first_rank`` (the stage's first global rank, :mod:`planner.hetero.layout`);
* ``cluster``: name, GPU and node counts and ``pools`` (name, GPU, nodes, memory, GPUs used);
* ``inputs.cluster.ir``: the :class:`~planner.hardware.MultiPoolCluster`;
* ``runtime.pool_efficiency``: each pool's generation's calibrated GEMM and attention
  efficiencies (``[pool, matmul, attention]``), so that ``check`` re-evaluates as planned.

Consumes a HeteroEvaluation (and runners-up, the solver record, pins); produces the document.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

from planner.calibration.apply import calibrated_options
from planner.hardware import GIB, MultiPoolCluster
from planner.hetero.evaluate import HeteroEvaluation
from planner.hetero.layout import stage_ranks
from planner.report import (model_dict, parallelism_dict, predicted_dict, rounded, runtime_dict,
                             stages_list)


def pool_options(options, cluster: MultiPoolCluster, constants) -> Any:
    """``options`` with each pool's generation's calibrated efficiencies (``constants`` None:
    the GPU presets' own)."""
    if constants is None:
        return replace(options, pool_efficiency=())
    rows = []
    for pool in cluster.pools:
        o = calibrated_options(options, constants, pool.gpu.name)
        rows.append((pool.name, o.matmul_efficiency, o.attention_efficiency))
    return replace(options, matmul_efficiency=None, attention_efficiency=None,
                   pool_efficiency=tuple(rows))


def pool_cluster_dict(ev: HeteroEvaluation) -> dict[str, Any]:
    c = ev.cluster
    used = ev.gpus_per_pool()
    return {"name": c.name, "num_gpus": c.num_gpus, "num_nodes": c.num_nodes,
            "gpu": " + ".join(dict.fromkeys(p.gpu.name for p in c.pools)),
            "gpu_memory_gib": min(p.gpu.memory_gib for p in c.pools),
            "pools": [{"name": p.name, "gpu": p.gpu.name, "num_nodes": p.num_nodes,
                       "gpus_per_node": p.gpus_per_node, "num_gpus": p.num_gpus,
                       "first_rank": p.first_rank, "gpu_memory_gib": p.gpu.memory_gib,
                       "gpus_used": used[p.name]} for p in c.pools]}


def pool_evaluation_dict(ev: HeteroEvaluation) -> dict[str, Any]:
    """The one-pool evaluation document with the pool of every stage."""
    # a HeteroEvaluation reads like an Evaluation, but for its cluster
    doc = {"model": model_dict(ev), "cluster": pool_cluster_dict(ev),
           "parallelism": parallelism_dict(ev), "runtime": runtime_dict(ev.options),
           "stages": stages_list(ev), "predicted": predicted_dict(ev)}
    doc["parallelism"]["stage_pools"] = list(ev.stage_pools.pools)
    c = ev.config
    ranks = stage_ranks(ev.cluster, ev.stage_pools, c.dp, c.tp * c.cp)
    for entry, pool, cap, r, slow in zip(doc["stages"], ev.stage_pools.pools, ev.capacity_bytes,
                                         ranks, ev.slowdown):
        entry.update(pool=pool, capacity_gib=cap / GIB, first_rank=r[0], num_gpus=len(r))
        if slow != 1.0:
            entry["slowdown"] = slow
    if ev.options.pool_efficiency:
        doc["runtime"]["pool_efficiency"] = [list(row) for row in ev.options.pool_efficiency]
    return rounded(doc)


def pool_alternative_dict(ev: HeteroEvaluation, best: HeteroEvaluation) -> dict[str, Any]:
    doc = pool_evaluation_dict(ev)
    return {"parallelism": doc["parallelism"], "step_time_s": ev.step_time_s,
            "slower_than_best": ev.step_time_s / best.step_time_s - 1,
            "peak_memory_gib": ev.peak_memory_bytes / GIB,
            "stage_layers": [len(s.layers) for s in ev.stages]}


def make_pool_plan(best: HeteroEvaluation, *, model_spec: str, cluster_spec: str,
                   solver: dict | None = None, alternatives: Sequence[HeteroEvaluation] = (),
                   pins: dict | None = None) -> dict[str, Any]:
    """The plan document (schema_version 2)."""
    from planner.plan import POOL_SCHEMA_VERSION, inputs_dict, plan_document

    return plan_document(pool_evaluation_dict(best), best, POOL_SCHEMA_VERSION,
                         inputs_dict(best, model_spec, cluster_spec, None), solver,
                         [pool_alternative_dict(a, best) for a in alternatives], pins)
