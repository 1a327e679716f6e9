"""The JSON form of a plan across pools (``shardplan plan-pools``): plain dicts, sorted keys,
units in key names, rounded like the one-pool reports (:func:`planner.report.rounded`).

It is a report, not a plan file: the plan-file schema, ``check`` and the exporters read one-pool
plans (docs/heterogeneous.md says what a multi-pool plan file would need)."""
from __future__ import annotations

from typing import Any

from planner.hardware import GIB
from planner.hetero.evaluate import HeteroEvaluation
from planner.hetero.layout import stage_ranks
from planner.ir import LayerKind
from planner.report import rounded

KIND = "shardplan-pool-plan"


def pools_dict(cluster) -> list[dict[str, Any]]:
    return [{"name": p.name, "gpu": p.gpu.name, "num_nodes": p.num_nodes,
             "gpus_per_node": p.gpus_per_node, "first_rank": p.first_rank,
             "memory_gib": p.gpu.memory_gib, "num_gpus": p.num_gpus} for p in cluster.pools]


def hetero_dict(ev: HeteroEvaluation, solver: dict | None = None) -> dict[str, Any]:
    c = ev.config
    ranks = stage_ranks(ev.cluster, ev.stage_pools, c.dp, c.tp * c.cp)
    names = [layer.name for layer in ev.model.layers]
    stages = []
    for s, pool, cap, r in zip(ev.stages, ev.stage_pools.pools, ev.capacity_bytes, ranks):
        stages.append({
            "index": s.index, "pool": pool, "first_rank": r[0], "num_gpus": len(r),
            "layers": [names[i] for i in s.layers],
            "num_blocks": sum(1 for i in s.layers if ev.model.layers[i].kind is LayerKind.BLOCK),
            "recompute": [ev.placement.options[i].recompute.value for i in s.layers],
            "memory_gib": s.memory.gib(), "capacity_gib": cap / GIB,
            "time_s": s.time_s, "slowdown": ev.slowdown[s.index]})
    b = ev.breakdown
    return rounded({
        "kind": KIND,
        "model": {"name": ev.model.name, "params": ev.model.params},
        "cluster": {"name": ev.cluster.name, "num_gpus": ev.cluster.num_gpus,
                    "pools": pools_dict(ev.cluster)},
        "parallelism": {"tp": c.tp, "pp": c.pp, "dp": c.dp, "cp": c.cp, "sp": c.sp,
                        "zero_stage": c.zero_stage, "micro_batch": c.micro_batch,
                        "global_batch": c.global_batch, "seq_len": c.seq_len,
                        "num_micro_batches": c.num_micro_batches, "dtype": c.dtype,
                        "schedule": c.schedule, "stage_pools": list(ev.stage_pools.pools)},
        "gpus_used": ev.gpus_per_pool(),
        "stages": stages,
        "predicted": {"step_time_s": ev.step_time_s, "tokens_per_s": ev.tokens_per_s,
                      "model_tflops_per_gpu": ev.model_tflops_per_gpu, "fits": ev.fits,
                      "time_breakdown_s": {"pipeline": b.pipeline_s, "bubble": b.bubble_s,
                                           "dp_exposed": b.dp_exposed_s,
                                           "optimizer": b.optimizer_s,
                                           "embedding_sync": b.embedding_sync_s}},
        "solver": solver or {"status": "EVALUATED"},
    })
