"""Fallback plans: the re-plans for the most likely failure classes, precomputed at plan time
(``shardplan plan --fallbacks K``) and stored in the plan file, so that a job can switch to one
without planning while it is down; ``check`` re-validates them (:func:`fallback_problems`).

Failure classes, most likely first (Meta's Llama 3 report, "The Llama 3 Herd of Models", 2024,
section 3.3.4: of 419 unexpected interruptions in 54 days on 16k H100, 58.7% were GPU-side
-- faulty GPUs, HBM, NVLink, SRAM -- against 8.4% network switch and cable and a few percent
host failures):

* ``gpu``: one GPU (the representative is rank 0; by the mesh's symmetry any GPU of the same
  pipeline stage gives the same plan with other replicas dropped);
* ``node``: one node (the ranks of node 0);
* ``switch``: one rail-optimized leaf switch (planner/topology.py: leaf k of a scalable unit
  joins NIC k of each of its nodes), so the GPUs behind NIC 0 of every node of scalable unit 0
  lose the inter-node fabric.

Each fallback is :func:`planner.hetero.replan.replan` under the same churn budget, recorded
compactly: the surviving nodes, the decisions (``parallelism``, per-layer stage and
recomputation) and the prediction and churn. Consumes a one-pool plan's decisions; produces
the ``fallbacks`` section (plain dicts).
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Sequence

from planner.config import ParallelConfig, RuntimeOptions
from planner.errors import PlannerError, invalid
from planner.hardware import GIB, Cluster, MultiPoolCluster
from planner.ir import ModelGraph
from planner.strategy import LayerOption, LayerPlacement, Recompute

FAILURE_CLASSES = ("gpu", "node", "switch")
_DECISIONS = ("tp", "pp", "dp", "cp", "ep", "sp", "zero_stage", "micro_batch", "global_batch",
              "seq_len", "virtual_stages", "dtype")


def failure_ranks(cluster, config: ParallelConfig, kind: str,
                  stage_pools: Sequence[str] | None = None) -> list[int]:
    """The representative failed ranks (runtime ranks) of a failure class. Across pools: the
    GPU, node and leaf switch of the pool that holds runtime rank 0 (stage 0's first GPU)."""
    if stage_pools is not None:
        from planner.hetero.layout import StagePools
        from planner.hetero.survivors import RankLayout

        layout = RankLayout(cluster, config, StagePools(tuple(stage_pools)))
        first = layout._global_of[0]
        pool = cluster.pool_of_rank(first)
        local = failure_ranks(pool.as_cluster(), replace(config, tp=1, cp=1, pp=1,
                                                          dp=pool.num_gpus), kind)
        # stage 0 is the first stage on its pool: its GPUs start at the pool's first rank
        return layout.runtime_ranks([pool.first_rank + r for r in local
                                     if pool.first_rank + r in pool.ranks])
    gpn = cluster.gpus_per_node
    if kind == "gpu":
        return [0]
    if kind == "node":
        return list(range(min(gpn, config.num_gpus)))
    if kind == "switch":
        nics = cluster.nics_per_node or gpn
        behind = max(1, gpn // nics)  # GPUs that share NIC 0
        nodes = min(cluster.scalable_unit_nodes, math.ceil(config.num_gpus / gpn))
        return [n * gpn + j for n in range(nodes) for j in range(behind)
                if n * gpn + j < config.num_gpus]
    raise invalid(f"unknown failure class {kind!r}; known: {', '.join(FAILURE_CLASSES)}")


def compute_fallbacks(model: ModelGraph, cluster: Cluster, config: ParallelConfig,
                      placement: LayerPlacement, runtime: RuntimeOptions, k: int, *,
                      max_moved_layers: int | None = None,
                      time_limit_s: float = 5.0, stage_pools: Sequence[str] | None = None,
                      memory_limit_gib: float | None = None,
                      memory_gate=None) -> list[dict[str, Any]]:
    """The ``fallbacks`` section: one entry per failure class, the ``k`` most likely
    (``stage_pools``: a plan across pools', ``cluster`` then a MultiPoolCluster;
    ``memory_limit_gib`` and ``memory_gate``: the plan's search limit and memory gate, see
    :func:`planner.hetero.replan.replan`: a fallback passes ``check`` at the plan's recorded
    ``--memory-confidence``, or the failure class has none, with the reason)."""
    from planner.hetero.replan import replan

    if not 1 <= k <= len(FAILURE_CLASSES):
        raise invalid(f"--fallbacks must be 1..{len(FAILURE_CLASSES)} (failure classes "
                      f"{', '.join(FAILURE_CLASSES)}), got {k}")
    out = []
    for kind in FAILURE_CLASSES[:k]:
        ranks = failure_ranks(cluster, config, kind, stage_pools)
        entry: dict[str, Any] = {"failure": kind, "failed_ranks": ranks,
                                 "max_moved_layers": max_moved_layers}
        try:
            result = replan(model, cluster, config, placement, runtime, failed=ranks,
                            max_moved_layers=max_moved_layers, time_limit_s=time_limit_s,
                            stage_pools=stage_pools, memory_limit_gib=memory_limit_gib,
                            memory_gate=memory_gate)
        except PlannerError as error:
            entry.update(status="none", reason=error.message)
            out.append(entry)
            continue
        c = result.chosen
        ev = c.evaluation
        entry.update({
            "status": "ok", "strategy": c.strategy, "num_nodes": c.cluster.num_nodes,
            **({"pool_nodes": {p.name: p.num_nodes for p in c.cluster.pools},
                "stage_pools": list(ev.stage_pools.pools)} if stage_pools is not None else {}),
            "parallelism": {key: getattr(c.config, key) for key in _DECISIONS}
            # a pinned layout (plan --pin pipeline_layout) stays: its blocks keep their ranks
            | ({"pipeline_layout": c.config.pipeline_layout} if c.config.pipeline_layout
               else {}),
            "stage": list(c.placement.stage),
            "recompute": [o.recompute.value for o in c.placement.options],
            "predicted": {"step_time_s": ev.step_time_s, "fits": ev.fits,
                          "peak_memory_gib": ev.peak_memory_bytes / GIB},
            "replan": {"throughput_loss_pct": result.throughput_loss_pct,
                       "moved_layers": c.moved_layers, "moved_state_gib": c.moved_state_bytes / GIB,
                       "lost_state_gib": c.lost_state_bytes / GIB,
                       "dropped_replicas": list(c.dropped_replicas),
                       "gpus_used": c.config.num_gpus, "solver_status": c.solver_status,
                       **({"notes": list(result.notes)} if result.notes else {})},
        })
        out.append(entry)
    return out


def fallback_decisions(plan, entry: dict[str, Any], cluster=None):
    """(cluster of the survivors, ParallelConfig, LayerPlacement) of a stored fallback."""
    from planner.hetero.survivors import cut_pools, shrunk_cluster

    base = cluster or plan.cluster
    config = ParallelConfig(**entry["parallelism"])
    options = tuple(LayerOption(Recompute(r), o.layout)
                    for r, o in zip(entry["recompute"], plan.placement.options))
    placement = LayerPlacement(tuple(int(s) for s in entry["stage"]), options)
    if isinstance(base, MultiPoolCluster):
        return cut_pools(base, dict(entry["pool_nodes"])), config, placement
    return shrunk_cluster(base, entry["num_nodes"] * base.gpus_per_node), config, placement


def fallback_problems(plan, cluster: Cluster | None = None, memory_confidence: float = 0.5,
                      calibration=None) -> list[tuple[str, str]]:
    """(failure, message) for each stored fallback that no longer holds: its GPUs are not
    among the survivors, its layers are not the model's, or it does not fit memory under the
    current cost model (``cluster``: the cluster checked against, default the plan's), at the
    ``memory_confidence`` quantile of its peak's error band (``check``'s gate for the plan
    itself, :func:`planner.calibration.verdict.memory_verdict`, with the profile ``calibration``)."""
    from planner.calibration.verdict import memory_verdict
    from planner.cost.model import evaluate

    out = []
    base = cluster or plan.cluster
    for entry in plan.document.get("fallbacks", ()):
        kind = entry["failure"]
        if entry.get("status") != "ok":
            continue
        try:
            survivors, config, placement = fallback_decisions(plan, entry, base)
            alive = base.num_gpus - len(set(entry["failed_ranks"]))
            if config.num_gpus > alive:
                out.append((kind, f"it runs on {config.num_gpus} GPUs but only {alive} remain "
                                  f"after the failure of ranks {_ranks(entry['failed_ranks'])}"))
                continue
            if len(placement.stage) != len(plan.model.layers):
                out.append((kind, f"it places {len(placement.stage)} layers; the model has "
                                  f"{len(plan.model.layers)}"))
                continue
            if isinstance(survivors, MultiPoolCluster):
                from planner.hetero.evaluate import hetero_evaluate
                from planner.hetero.layout import StagePools

                ev = hetero_evaluate(plan.model, survivors, config,
                                     StagePools(tuple(entry["stage_pools"])), placement,
                                     plan.runtime)
            else:
                ev = evaluate(plan.model, survivors, config, placement, plan.runtime)
        except (PlannerError, KeyError, TypeError, ValueError) as error:
            out.append((kind, f"it cannot be evaluated: {getattr(error, 'message', error)}"))
            continue
        if not ev.fits:
            if isinstance(survivors, MultiPoolCluster):
                where = "its stages' pools' GPU memory (" + ", ".join(
                    f"{p.name} {p.gpu.memory_gib:g} GiB" for p in survivors.pools) + ")"
            else:
                where = f"the {survivors.gpu.memory_gib:g} GiB of each {survivors.gpu.name}"
            out.append((kind, f"it needs {ev.peak_memory_bytes / GIB:.2f} GiB per GPU, more "
                              f"than {where}"))
        elif memory_confidence != 0.5 and not isinstance(survivors, MultiPoolCluster):
            verdict = memory_verdict(ev, memory_confidence, calibration)
            capacity_gib = survivors.memory_bytes_per_gpu / GIB
            if verdict is not None and verdict[2] > capacity_gib:
                out.append((kind, f"at the {memory_confidence:.0%} quantile of its error band "
                                  f"it peaks at {verdict[2]:.2f} GiB per GPU, "
                                  f"{verdict[2] - capacity_gib:.2f} GiB over the "
                                  f"{survivors.gpu.memory_gib:g} GiB of each "
                                  f"{survivors.gpu.name}"))
    return out


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks[:8])) + (", ..." if len(ranks) > 8 else "")
