"""``shardplan check`` of a plan across pools (schema_version 2).

Consumes a :class:`~planner.plan_types.Plan` whose ``stage_pools`` is set (and optionally a
model and a multi-pool cluster given anew); produces the structural problems of the pool
placement (:func:`pool_structure_problems`, called by :mod:`planner.plan_validate`) and the
memory check of every stage against **its pool's** GPU memory (:func:`pool_stage_checks`),
with the current cost model (:func:`planner.hetero.evaluate.hetero_evaluate`).
"""
from __future__ import annotations

from typing import Any

from planner.check_report import Problem, StageCheck
from planner.errors import PlannerError
from planner.hardware import GIB, MultiPoolCluster
from planner.hetero.evaluate import HeteroEvaluation, hetero_evaluate
from planner.hetero.layout import (StagePools, check_fits, gpus_by_pool, stage_ranks,
                                   stage_shares)


def pool_structure_problems(doc: dict[str, Any], cluster) -> list[Problem]:
    """The pool placement is impossible: no such pool, more stages than a pool's GPUs hold,
    interleaving across pools, or recorded pools / ranks that differ from the placement."""
    p = doc["parallelism"]
    pools = tuple(p["stage_pools"])
    if not isinstance(cluster, MultiPoolCluster):
        return [Problem("degrees", f"the plan places its stages on pools "
                                   f"({', '.join(dict.fromkeys(pools))}) but cluster "
                                   f"{cluster.name!r} has one pool")]
    out: list[Problem] = []
    if len(pools) != p["pp"]:
        return [Problem("degrees", f"parallelism.stage_pools lists {len(pools)} pools for pp "
                                   f"{p['pp']}")]
    try:
        check_fits(cluster, StagePools(pools), p["dp"], p["tp"] * p["cp"])
    except PlannerError as error:
        return [Problem("degrees", error.message)]
    if p["virtual_stages"] != 1 and len(set(pools)) > 1:
        out.append(Problem("config", "a plan across pools uses the 1F1B schedule (virtual "
                                     "stages 1): interleaved chunks are equal, stages on "
                                     "different GPUs are not"))
    ranks = stage_ranks(cluster, StagePools(pools), p["dp"], p["tp"] * p["cp"])
    for entry in doc["stages"]:
        i = entry["index"]
        if 0 <= i < len(pools) and (entry.get("pool") != pools[i]
                                    or entry.get("first_rank") != ranks[i][0]):
            out.append(Problem("stages", f"stages[{i}] records pool {entry.get('pool')!r} from "
                                         f"rank {entry.get('first_rank')} but stage_pools puts "
                                         f"it on {pools[i]!r} from rank {ranks[i][0]}"))
            break
    used = gpus_by_pool(StagePools(pools), p["dp"], p["tp"] * p["cp"])
    for row in doc["cluster"].get("pools", ()):
        if row["gpus_used"] != used.get(row["name"], 0):
            out.append(Problem("degrees", f"cluster.pools says pool {row['name']!r} uses "
                                          f"{row['gpus_used']} GPUs but its stages hold "
                                          f"{used.get(row['name'], 0)}"))
    return out


def pool_stage_checks(plan, model, cluster, options=None
                      ) -> tuple[HeteroEvaluation, tuple[StageCheck, ...], list[Problem]]:
    """The current cost model's memory of every stage against its pool's GPU memory
    (``options``: the runtime's, default the plan's)."""
    ev = hetero_evaluate(model, cluster, plan.config, StagePools(plan.stage_pools),
                         plan.placement, options or plan.runtime)
    recorded = {s["index"]: s["memory_gib"]["total"] for s in plan.document["stages"]}
    stages = tuple(StageCheck(s.index, s.memory, cap, recorded.get(s.index))
                   for s, cap in zip(ev.stages, ev.capacity_bytes))
    pools = {p.name: p for p in cluster.pools}

    def gpus(name: str) -> str:
        return " / ".join(dict.fromkeys(pools[p].gpu.name
                                        for p, _ in stage_shares(name, plan.config.dp)))

    problems = [Problem("memory", f"stage {s.index} needs {s.needed.total / GIB:.2f} GiB per GPU, "
                                  f"{s.over_gib:.2f} GiB more than the "
                                  f"{s.capacity_bytes / GIB:g} GiB of each "
                                  f"{gpus(name)} of pool {name!r}")
                for s, name in zip(stages, plan.stage_pools) if not s.fits]
    return ev, stages, problems
