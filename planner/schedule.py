"""The pipeline schedule of a plan as a timeline: which rank runs which micro-batch when.

Consumes a :class:`~planner.plan_types.Plan`; produces a :class:`Timeline`: per pipeline rank
the forward, recompute and backward operations of every micro-batch and model chunk with start
and end times, the exposed communication inside them, and the idle (bubble) spans. Per-chunk
times come from the cost model's layer terms (:func:`planner.cost.terms.layer_terms`: the
same ``fwd_s``, ``bwd_s``, ``recompute_s``, ``comm_s`` the plan's step time is made of), so
the timeline is the plan's own prediction laid out in time, not a second model.

Order of operations per rank: Megatron-LM's schedules (``megatron/core/pipeline_parallel/
schedules.py``): 1F1B with ``pp - rank - 1`` warm-up forwards; interleaved 1F1B with
``(pp - rank - 1) * 2 + (v - 1) * pp`` warm-up forwards, micro-batches taken in groups of pp,
forward chunk ``(k // pp) % v`` and backward chunk ``v - 1 - (k // pp) % v``. Each operation
starts when its rank is free and its input is ready (the previous chunk's forward, the next
chunk's backward). Boundary transfers are not drawn (they are inside the stage times).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from planner.cost.pipeline_sim import megatron_order as order


@dataclass(frozen=True)
class Op:
    rank: int
    kind: str  # "forward" | "backward" (a backward starts with its recompute, if any)
    micro_batch: int
    chunk: int  # model chunk on this rank (0 .. v-1)
    start_s: float
    end_s: float
    recompute_s: float  # the first part of a backward: recomputing the forward
    comm_s: float  # exposed communication inside the op (drawn at its end)


@dataclass(frozen=True)
class Timeline:
    pp: int
    virtual_stages: int
    num_micro_batches: int
    ops: tuple[Op, ...]
    pipeline_s: float  # end of the last backward

    def bubble_s(self, rank: int) -> float:
        busy = sum(op.end_s - op.start_s for op in self.ops if op.rank == rank)
        return self.pipeline_s - busy

    def idle_spans(self, rank: int) -> list[tuple[float, float]]:
        spans, t = [], 0.0
        for op in sorted((o for o in self.ops if o.rank == rank), key=lambda o: o.start_s):
            if op.start_s > t + 1e-12:
                spans.append((t, op.start_s))
            t = max(t, op.end_s)
        if t < self.pipeline_s - 1e-12:
            spans.append((t, self.pipeline_s))
        return spans


@dataclass(frozen=True)
class ChunkTimes:
    fwd_s: float
    bwd_s: float
    recompute_s: float
    comm_s: float


def simulate(times: list[list[ChunkTimes]], m: int) -> Timeline:
    """``times[rank][chunk]``; ``m`` micro-batches. Model chunk c of rank r is global stage
    ``c * pp + r`` (Megatron's interleaving)."""
    pp, v = len(times), len(times[0])
    if v > 1 and m % pp:
        raise ValueError(f"interleaved 1F1B needs the micro-batches ({m}) to be a multiple of "
                         f"pp ({pp})")
    queues = [order(r, pp, v, m) for r in range(pp)]
    pos = [0] * pp
    free = [0.0] * pp
    done: dict[tuple[str, int, int], float] = {}  # (kind, mb, global stage) -> end time
    ops: list[Op] = []
    last_stage = pp * v - 1
    remaining = sum(len(q) for q in queues)
    while remaining:
        progressed = False
        for r in range(pp):
            while pos[r] < len(queues[r]):
                kind, mb, chunk = queues[r][pos[r]]
                stage = chunk * pp + r
                if kind == "forward":
                    dep = ("forward", mb, stage - 1) if stage > 0 else None
                else:
                    dep = ("backward", mb, stage + 1) if stage < last_stage else \
                        ("forward", mb, stage)
                if dep is not None and dep not in done:
                    break
                t = times[r][chunk]
                start = max(free[r], done[dep] if dep else 0.0)
                if kind == "forward":
                    comm = t.comm_s * t.fwd_s / max(t.fwd_s + t.bwd_s, 1e-30)
                    length, rec = t.fwd_s + comm, 0.0
                else:
                    comm = t.comm_s - t.comm_s * t.fwd_s / max(t.fwd_s + t.bwd_s, 1e-30)
                    length, rec = t.recompute_s + t.bwd_s + comm, t.recompute_s
                end = start + length
                ops.append(Op(r, kind, mb, chunk, start, end, rec, comm))
                done[(kind, mb, stage)] = end
                free[r] = end
                pos[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("pipeline schedule deadlocked (inconsistent order)")
    return Timeline(pp, v, m, tuple(ops), max(op.end_s for op in ops))


def chunk_times(plan: Any) -> list[list[ChunkTimes]]:
    """Per rank and chunk, the sums of the cost model's layer terms for the plan."""
    from planner.cost.context import make_context
    from planner.cost.terms import layer_terms

    pp, v = plan.config.pp, plan.config.virtual_stages
    if getattr(plan, "across_pools", False):  # each stage costed on its pool's GPU and links
        from planner.hetero.terms import stage_contexts

        contexts = stage_contexts(plan.model, plan.cluster, plan.config, plan.stage_pools,
                                  plan.runtime)
    else:
        contexts = [make_context(plan.model, plan.cluster, plan.config, plan.runtime)] * pp
    stages = list(plan.placement.stage)
    sums = [[[0.0, 0.0, 0.0, 0.0] for _ in range(v)] for _ in range(pp)]
    # chunks are runs of equal stage: the k-th run is chunk k // pp of rank k % pp
    run, previous = -1, None
    for i, layer in enumerate(plan.model.layers):
        if stages[i] != previous:
            run += 1
            previous = stages[i]
        rank, chunk = stages[i], (run // pp if v > 1 else 0)
        t = layer_terms(contexts[rank], layer, plan.placement.options[i])
        cell = sums[rank][chunk]
        cell[0] += t.fwd_s
        cell[1] += t.bwd_s
        cell[2] += t.recompute_s
        cell[3] += t.comm_s
    factors = stage_slowdowns(plan)
    return [[ChunkTimes(*(x * factors[rank] for x in cell)) for cell in row]
            for rank, row in enumerate(sums)]


def stage_slowdowns(plan: Any) -> list[float]:
    """Per pipeline stage, the straggler factor a re-plan around ``--slow`` ranks costed it
    with (planner/hetero/evaluate.py: the stage's time per micro-batch times the factor of its
    slowest surviving rank); 1 for a plan that is not such a re-plan."""
    pp = plan.config.pp
    out = [1.0] * pp
    replan = (getattr(plan, "document", None) or {}).get("replan") or {}
    slow = {int(rank): float(f) for rank, f in (replan.get("slow_ranks") or {}).items()}
    if not slow:
        return out
    mesh = plan.config.mesh
    rank_map = replan.get("rank_map") or range(mesh.num_gpus)
    for new, old in enumerate(rank_map):  # new rank -> the old plan's rank; pp is kept
        if old in slow:
            stage = mesh.coords(new)["pp"]
            out[stage] = max(out[stage], slow[old])
    return out


DRAWN_SCHEDULES = ("1f1b", "interleaved-1f1b")


def drawn(plan: Any) -> bool:
    """The plan's schedule has an operation order here (the zero-bubble schedules ZB-H1, ZB-V
    and DualPipeV are costed by their closed-form bubbles, planner/cost/pipeline.py, and not
    laid out as a timeline)."""
    return plan.config.pp == 1 or plan.config.schedule in DRAWN_SCHEDULES


def plan_timeline(plan: Any) -> Timeline | None:
    """The plan's timeline; None for a schedule without an operation order (:func:`drawn`)."""
    if not drawn(plan):
        return None
    return simulate(chunk_times(plan), plan.config.num_micro_batches)
