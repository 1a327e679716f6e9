"""Infeasibility explained: when no plan fits, say by how much at best and what would help.

Consumes the search's candidates; produces a :class:`~planner.errors.PlannerError` of kind
DOES_NOT_FIT whose message and details carry the smallest per-GPU memory any plan in the space
needs (by category, against capacity) and the levers that would close the gap, each with the
number it gives (torchrec's "possible solutions" style).
"""
from __future__ import annotations

import math
import time
from dataclasses import replace

from planner.cost.model import Evaluation, evaluate
from planner.errors import ErrorKind, PlannerError
from planner.hardware import GIB, Cluster
from planner.ir import ModelGraph
from planner.solve.candidates import candidates
from planner.solve.headroom import NO_HEADROOM, MemoryHeadroom
from planner.solve.space import Pins
from planner.strategy import LayerOption, default_placement


def leanest_option(pins: Pins) -> LayerOption:
    """The allowed block option that stores the least (full recomputation unless pinned)."""
    return max(pins.block_options(), key=lambda o: o.memory_rank)


def _leanest(model: ModelGraph, cluster: Cluster, cands, pins: Pins) -> Evaluation | None:
    """The uniform plan with the smallest peak memory among the candidates' best shapes."""
    best = None
    option = leanest_option(pins)
    for cand in sorted(cands, key=lambda c: c.memory_lb_bytes)[:25]:
        ev = evaluate(model, cluster, cand.config, default_placement(model, cand.config, option),
                      options=cand.problem.ctx.options)
        if best is None or ev.peak_memory_bytes < best.peak_memory_bytes:
            best = ev
    return best


EXPLAIN_BUDGET_S = 10.0  # the "more GPUs" search gives up after this (or the search's time)


def _fits_with_nodes(model, cluster, global_batch, seq_len, dtype, runtime, pins,
                     deadline: float, headroom: MemoryHeadroom = NO_HEADROOM,
                     gate=None) -> int | None:
    """The smallest node count (cluster x 2, x 4, ... x 64) with a uniform plan at the leanest
    allowed option that fits under the user's pins (and ``gate``, the search's memory gate:
    its quantile within the headroom's limit, the search's own test,
    :meth:`planner.solve.gate.MemoryGate.peak_limit_bytes`, with the bigger cluster's band);
    None when none does, the cluster has no inter-node tier, or time is up. Pinned degrees
    that grow with the GPU count (dp) are dropped: they cannot hold on a bigger cluster."""
    if len(cluster.tiers) < 2:
        return None
    for factor in (2, 4, 8, 16, 32, 64):
        bigger = replace(cluster, num_nodes=cluster.num_nodes * factor)
        try:
            found = candidates(model, bigger, global_batch, seq_len, dtype, pins, runtime,
                               deadline)
        except PlannerError:  # out of time
            return None
        option = leanest_option(pins)
        for cand in sorted(found, key=lambda c: c.memory_lb_bytes)[:10]:
            ev = evaluate(model, bigger, cand.config, default_placement(model, cand.config, option),
                          options=runtime)
            limit = headroom.limit_bytes(bigger.memory_bytes_per_gpu)
            if ev.peak_memory_bytes <= (limit if gate is None
                                        else gate.peak_limit_bytes(ev, limit)):
                return bigger.num_nodes
    return None


def does_not_fit(model: ModelGraph, cluster: Cluster, cands, global_batch: int, seq_len: int,
                 timed_out: bool, deadline: float = math.inf, pins: Pins = Pins(),
                 headroom: MemoryHeadroom = NO_HEADROOM,
                 memory_confidence: float | None = None, gate=None) -> PlannerError:
    """``memory_confidence``: the quantile of the peak-memory band the search gated at
    (planner/solve/gate.py; None: the prediction); ``gate``: that gate (its MemoryGate), which
    the "more GPUs" hint's plans must pass."""
    capacity = headroom.limit_bytes(cluster.memory_bytes_per_gpu)
    if timed_out:
        return PlannerError(ErrorKind.SOLVER_LIMIT,
                            f"the time limit ran out before any plan that fits was found "
                            f"({len(cands)} configurations in the space)",
                            ("raise --time-limit", "pin some degrees with --pin to shrink the space"))
    lean = _leanest(model, cluster, cands, pins)
    details: dict = {"capacity_gib": cluster.memory_bytes_per_gpu / GIB,
                     "memory_limit_gib": capacity / GIB, "configurations": len(cands)}
    hints: list[str] = []
    kept = "" if headroom == NO_HEADROOM else \
        f", {headroom.describe()} of it kept as headroom (--memory-headroom)"
    if memory_confidence is not None:
        kept += f"; at the {memory_confidence:.0%} quantile of the peak's error band " \
                f"(--memory-confidence)"
    message = f"no plan for {model.name} fits {cluster.num_gpus} x {cluster.gpu.name} " \
              f"({cluster.gpu.memory_gib:g} GiB each{kept})"
    if lean is not None:
        worst = max(lean.stages, key=lambda s: s.memory.total)
        need = worst.memory.total
        details["smallest_peak_gib"] = need / GIB
        details["smallest_peak_breakdown_gib"] = worst.memory.gib()
        c = lean.config
        recompute = leanest_option(pins).recompute.value
        details["smallest_peak_config"] = {"tp": c.tp, "pp": c.pp, "dp": c.dp, "cp": c.cp,
                                           "zero_stage": c.zero_stage,
                                           "micro_batch": c.micro_batch, "recompute": recompute}
        message += (f": the leanest plan (tp {c.tp}, pp {c.pp}, dp {c.dp}, ZeRO-{c.zero_stage}, "
                    f"micro-batch {c.micro_batch}, {recompute} recomputation) needs "
                    f"{need / GIB:.1f} GiB per GPU, {(need - capacity) / GIB:.1f} GiB more than "
                    f"the {capacity / GIB:.1f} GiB a plan may use")
        mem = worst.memory
        hints.append(f"a GPU with at least {need / GIB:.0f} GiB of memory")
        states = (mem.params + mem.grads + mem.optimizer) / GIB
        if c.dp * c.cp > 1 and c.zero_stage < 3:
            hints.append(f"model states alone take {states:.1f} GiB on the fullest stage; "
                         "ZeRO-3 shards them over the data-parallel ranks")
        else:
            hints.append(f"model states alone take {states:.1f} GiB on the fullest stage; "
                         "more GPUs spread them further")
    runtime = cands[0].problem.ctx.options if cands else None
    if runtime is not None:
        budget = max(deadline - time.monotonic(), 0.0) if math.isfinite(deadline) else 0.0
        nodes = _fits_with_nodes(model, cluster, global_batch, seq_len,
                                 cands[0].config.dtype, runtime, replace(pins, dp=None),
                                 time.monotonic() + max(budget, EXPLAIN_BUDGET_S), headroom,
                                 gate if gate is not None and gate.active else None)
        if nodes is not None:
            hints.insert(0, f"more GPUs: {nodes} nodes ({nodes * cluster.gpus_per_node} GPUs) "
                            f"give a plan that fits (now {cluster.num_nodes})")
            details["nodes_that_fit"] = nodes
    hints.append("a smaller micro-batch or sequence length shrinks activations")
    if memory_confidence is not None:
        details["memory_confidence"] = memory_confidence
        hints.append(f"a lower --memory-confidence (now {memory_confidence:g}; 0.5 gates at "
                     "the prediction)")
    if headroom != NO_HEADROOM:
        details["memory_headroom"] = headroom.describe()
        hints.append(f"a smaller --memory-headroom (now {headroom.describe()}; 0 plans to the "
                     "last byte)")
    return PlannerError(ErrorKind.DOES_NOT_FIT, message, tuple(hints), details)
