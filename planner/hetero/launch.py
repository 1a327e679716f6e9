"""How a runtime launches a plan across pools: which nodes take which ranks.

Megatron-LM, torchtitan and DeepSpeed number ranks with the pipeline stage outermost: runtime
rank ``r = i x S + j`` (``S = tp x cp x dp`` GPUs per stage) is GPU ``j`` of pipeline stage
``i``, and torchrun gives node ``k`` the ranks ``k x G .. k x G + G - 1`` (``G`` processes per
node). The plan puts stage ``i`` on pool ``stage_pools[i]`` (each pool's stages contiguous; a
split stage's first replicas on its first pool), so the job runs as planned when its nodes are
listed in runtime-rank order: each run of ranks on one pool as that pool's next nodes. Consumes a plan document (schema_version 2); produces the
export notes (what the user must do) and warnings (what a torchrun launch cannot express).
"""
from __future__ import annotations

from typing import Any


def launch_notes(doc: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(notes, warnings) for exporting a plan across pools; ([], []) for a one-pool plan."""
    p = doc["parallelism"]
    pools = p.get("stage_pools")
    if not pools:
        return [], []
    from planner.hetero.layout import stage_shares

    s = p["tp"] * p["cp"]
    by_name = {row["name"]: row for row in doc["cluster"]["pools"]}
    notes, warnings = [], []
    order, node = [], 0
    first = 0
    # runs of consecutive runtime ranks on one pool: (pool, first stage, last stage, GPUs)
    runs: list[list] = []
    for i, name in enumerate(pools):
        for pool, replicas in stage_shares(name, p["dp"]):
            if runs and runs[-1][0] == pool:
                runs[-1][2] = i
                runs[-1][3] += replicas * s
            else:
                runs.append([pool, i, i, replicas * s])
    gpn = {row["gpus_per_node"] for row in by_name.values()}
    for name, lo, hi, gpus in runs:
        row = by_name[name]
        nodes = -(-gpus // row["gpus_per_node"])
        order.append(f"pool {name} ({row['gpu']}): {nodes} node{'s' if nodes != 1 else ''} as "
                     f"node ranks {node}-{node + nodes - 1} for stage{'s' if hi > lo else ''} "
                     f"{lo}{f'-{hi}' if hi > lo else ''} (runtime ranks {first}-"
                     f"{first + gpus - 1})")
        if gpus % row["gpus_per_node"]:
            warnings.append(f"pools: the stages on pool {name} use {gpus} GPUs, not whole "
                            f"nodes of {row['gpus_per_node']}: a torchrun launch with one "
                            f"--nproc-per-node cannot start the next pool's stages on a new "
                            f"node; give the job a rank file (hostfile with slots) instead")
        node += nodes
        first += gpus
    if len(gpn) > 1:
        warnings.append("pools: the pools have different GPUs per node "
                        f"({', '.join(str(g) for g in sorted(gpn))}): torchrun takes one "
                        "--nproc-per-node, so launch each pool's nodes with its own count")
    notes.append("the plan runs its pipeline stages on different GPU pools; start the job with "
                 "its nodes in stage order: " + "; ".join(order))
    idle = [f"{row['name']} {row['num_gpus'] - row['gpus_used']}" for row in by_name.values()
            if row["gpus_used"] < row["num_gpus"]]
    if idle:
        notes.append("GPUs the plan leaves idle (not in the launch): " + ", ".join(idle))
    return notes, warnings
