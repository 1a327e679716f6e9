"""Infeasibility explained: when no plan fits, say by how much at best and what would help.

Consumes the search's candidates; produces a :class:`~planner.errors.PlannerError` of kind
DOES_NOT_FIT whose message and details carry the smallest per-GPU memory any plan in the space
needs (by category, against capacity) and the levers that would close the gap, each with the
number it gives (torchrec's "possible solutions" style).
"""
from __future__ import annotations

from dataclasses import replace

from planner.config import Recompute
from planner.cost.model import Evaluation, evaluate
from planner.errors import ErrorKind, PlannerError
from planner.hardware import GIB, Cluster
from planner.ir import ModelGraph


def _leanest(model: ModelGraph, cluster: Cluster, cands) -> Evaluation | None:
    """The uniform plan with the smallest peak memory among the candidates' best shapes."""
    best = None
    for cand in sorted(cands, key=lambda c: c.memory_lb_bytes)[:25]:
        ev = evaluate(model, cluster, replace(cand.config, recompute=Recompute.FULL),
                      options=cand.problem.ctx.options)
        if best is None or ev.peak_memory_bytes < best.peak_memory_bytes:
            best = ev
    return best


def _fits_with_nodes(model, cluster, global_batch, seq_len, dtype, runtime, pins) -> int | None:
    from planner.solve.search import candidates

    for factor in (2, 4, 8, 16, 32, 64):
        bigger = replace(cluster, num_nodes=cluster.num_nodes * factor)
        found = candidates(model, bigger, global_batch, seq_len, dtype, pins, runtime)
        for cand in sorted(found, key=lambda c: c.memory_lb_bytes)[:10]:
            ev = evaluate(model, bigger, replace(cand.config, recompute=Recompute.FULL),
                          options=runtime)
            if ev.fits:
                return bigger.num_nodes
    return None


def does_not_fit(model: ModelGraph, cluster: Cluster, cands, global_batch: int, seq_len: int,
                 timed_out: bool) -> PlannerError:
    capacity = cluster.memory_bytes_per_gpu
    if timed_out:
        return PlannerError(ErrorKind.SOLVER_LIMIT,
                            f"the time limit ran out before any plan that fits was found "
                            f"({len(cands)} configurations in the space)",
                            ("raise --time-limit", "pin some degrees with --pin to shrink the space"))
    lean = _leanest(model, cluster, cands)
    details: dict = {"capacity_gib": capacity / GIB, "configurations": len(cands)}
    hints: list[str] = []
    message = f"no plan for {model.name} fits {cluster.num_gpus} x {cluster.gpu.name} " \
              f"({cluster.gpu.memory_gib:g} GiB each)"
    if lean is not None:
        worst = max(lean.stages, key=lambda s: s.memory.total)
        need = worst.memory.total
        details["smallest_peak_gib"] = need / GIB
        details["smallest_peak_breakdown_gib"] = worst.memory.gib()
        c = lean.config
        details["smallest_peak_config"] = {"tp": c.tp, "pp": c.pp, "dp": c.dp, "cp": c.cp,
                                           "zero_stage": c.zero_stage,
                                           "micro_batch": c.micro_batch, "recompute": "full"}
        message += (f": the leanest plan (tp {c.tp}, pp {c.pp}, dp {c.dp}, ZeRO-{c.zero_stage}, "
                    f"micro-batch {c.micro_batch}, full recomputation) needs "
                    f"{need / GIB:.1f} GiB per GPU, {(need - capacity) / GIB:.1f} GiB more than "
                    f"the {capacity / GIB:.1f} GiB available")
        mem = worst.memory
        hints.append(f"a GPU with at least {need / GIB:.0f} GiB of memory")
        states = (mem.params + mem.grads + mem.optimizer) / GIB
        hints.append(f"model states alone take {states:.1f} GiB on the fullest stage; "
                     "ZeRO-3 shards them over data-parallel ranks")
    runtime = cands[0].problem.ctx.options if cands else None
    if runtime is not None:
        from planner.solve.space import Pins

        nodes = _fits_with_nodes(model, cluster, global_batch, seq_len,
                                 cands[0].config.dtype, runtime, Pins())
        if nodes is not None:
            hints.insert(0, f"more GPUs: {nodes} nodes ({nodes * cluster.gpus_per_node} GPUs) "
                            f"give a plan that fits (now {cluster.num_nodes})")
            details["nodes_that_fit"] = nodes
    hints.append("a smaller micro-batch or sequence length shrinks activations")
    return PlannerError(ErrorKind.DOES_NOT_FIT, message, tuple(hints), details)
