"""An operation-order pipeline simulator: the reference the closed-form schedule terms of
:mod:`planner.cost.pipeline` are tested against (``tests/test_pipeline_sim.py``,
``bench/pipeline_sim.py``).

Each rank runs its operations in the order its runtime issues them; an operation starts when
its rank is free and its inputs have arrived (list scheduling, no reordering). Operations are
``F`` (forward), ``B`` (full backward: input and weight gradients), ``I`` (input gradient
only) and ``W`` (the deferred weight gradient of an earlier ``I``), of one micro-batch on one
model chunk ("stage" ``s`` of ``S = p v`` chunk stages; :func:`planner.cost.pipeline.chunk_rank`
maps it to its rank). An entry of a rank's order may hold two operations run as one (DualPipe's
overlapped forward-and-backward pair); it takes the sum of their times (no overlap of one's
communication with the other's compute is modelled, as in the closed form). A transfer between
two chunks on different ranks arrives ``p2p_s`` after its producer ends and does not occupy
either rank.

The orders, one function per schedule, transcribe the published ones:

* 1F1B and interleaved 1F1B: Megatron-LM's (:func:`megatron_order`; Narayanan et al. 2021
  §2.2).
* ZB-H1 / ZB1P: PyTorch's ``ScheduleInterleavedZeroBubble`` (``_get_1f1b_rank_ops`` with
  ``enable_zero_bubble``; Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, §3.1):
  ``(v - 1) m_r + p - 1 - r`` warm-up forwards, then F, I and, after the first ``r`` steady
  steps, the oldest pending W; the ``r`` deferred W passes close the rank's order.
* ZB-V: PyTorch's ``ScheduleZBVZeroBubble`` (Qi et al. §6, the handcrafted V schedule).
* DualPipeV: deepseek-ai/DualPipe ``dualpipev.py`` ``DualPipeV.step`` steps 1-8, with its
  ``WeightGradStore`` first-in-first-out queue of deferred W passes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

from planner.cost.pipeline import SCHEDULES, bubble_pieces, chunk_rank, pipeline_time_s

Op = tuple[str, int, int]  # (kind, micro-batch, chunk stage)
Entry = tuple[Op, ...]  # one or two operations the rank runs as one


@dataclass(frozen=True)
class StageTimes:
    """Seconds of one micro-batch on one chunk stage: forward, full backward (input and weight
    gradients, recomputation included) and the weight-gradient part of it."""

    fwd_s: float
    bwd_s: float
    wgrad_s: float = 0.0

    def of(self, kind: str) -> float:
        if kind == "F":
            return self.fwd_s
        if kind == "B":
            return self.bwd_s
        if kind == "I":
            return self.bwd_s - self.wgrad_s
        return self.wgrad_s


@dataclass(frozen=True)
class SimResult:
    makespan_s: float
    busy_s: tuple[float, ...]  # per rank
    # per rank, the peak of chunk activations held (a chunk's forward started, its input
    # gradient (I or B) not yet ended), in units of the rank's whole-stage activations: each
    # chunk weighs its share ``act_weight`` of the rank's chunks (1/v for equal chunks)
    peak_in_flight: tuple[float, ...]


def megatron_order(rank: int, pp: int, v: int, m: int) -> list[tuple[str, int, int]]:
    """Megatron-LM's 1F1B and interleaved 1F1B (``megatron/core/pipeline_parallel/
    schedules.py``): (kind, micro-batch, chunk) in the order ``rank`` runs them; 1F1B with
    ``pp - rank - 1`` warm-up forwards, interleaved with ``(pp - rank - 1) * 2 + (v - 1) * pp``,
    micro-batches in groups of pp, forward chunk ``(k // pp) % v``, backward chunk
    ``v - 1 - (k // pp) % v``."""
    total = m * v

    def forward(k: int) -> tuple[str, int, int]:
        group, pos = divmod(k, pp * v)
        return ("forward", group * pp + pos % pp, (k // pp) % v)

    def backward(k: int) -> tuple[str, int, int]:
        group, pos = divmod(k, pp * v)
        return ("backward", group * pp + pos % pp, v - 1 - (k // pp) % v)

    if v == 1:
        warmup = min(pp - rank - 1, m)
    else:
        warmup = min((pp - rank - 1) * 2 + (v - 1) * pp, total)
    ops = [forward(k) for k in range(warmup)]
    f, b = warmup, 0
    while f < total:
        ops.append(forward(f))
        f += 1
        ops.append(backward(b))
        b += 1
    while b < total:
        ops.append(backward(b))
        b += 1
    return ops


def _loop_orders(pp: int, v: int, m: int) -> list[list[Entry]]:
    kinds = {"forward": "F", "backward": "B"}
    return [[((kinds[kind], mb, chunk * pp + r),) for kind, mb, chunk in
             megatron_order(r, pp, v, m)] for r in range(pp)]


def _zb1p_orders(pp: int, v: int, m: int) -> list[list[Entry]]:
    rounds = max(1, m // pp)
    per_round = m // rounds
    if m % rounds:
        raise ValueError(f"ZB1P needs the micro-batches ({m}) to be a multiple of {rounds}")
    out = []
    for r in range(pp):
        total = m * v
        warmup = min((v - 1) * per_round + (pp - 1 - r), total)
        count: dict[tuple[str, int], int] = {}
        ops: list[Entry] = []
        backward_steps: list[int] = []

        def fstage(step: int) -> int:
            return ((step // per_round) % v) * pp + r

        def bstage(step: int) -> int:
            return (v - 1 - ((step - warmup) // per_round) % v) * pp + r

        def add(kind: str, s: int) -> None:
            mb = count.get((kind, s), 0)
            count[kind, s] = mb + 1
            ops.append(((kind, mb, s),))

        def weight() -> None:
            add("W", bstage(backward_steps[sum(n for (k, _), n in count.items() if k == "W")]))

        for step in range(total + warmup):  # warm-up, 1F1B steps, cool-down
            if step < total:
                add("F", fstage(step))
            if step < warmup:
                continue
            add("I", bstage(step))
            backward_steps.append(step)
            if step - warmup >= r:  # the first r backward steps defer their W
                weight()
        for _ in range(min(r, len(backward_steps))):  # the deferred W passes close the order
            weight()
        out.append(ops)
    return out


def _zbv_orders(pp: int, m: int) -> list[list[Entry]]:
    n = max(2 * pp - 1, m)
    out = []
    for r in range(pp):
        s0, s1 = r, 2 * pp - 1 - r
        cnt = {"f0": 0, "f1": 0, "b0": 0, "b1": 0}
        ops: list[Op] = []

        def add(kind: str, key: str, s: int) -> None:
            ops.append((kind, cnt[key], s))
            cnt[key] += 1

        for _ in range(2 * (pp - r) - 1):
            add("F", "f0", s0)
        for _ in range(r):
            add("F", "f1", s1)
            add("F", "f0", s0)
        for _ in range(pp - r):
            add("F", "f1", s1)
            ops.append(("I", cnt["b1"], s1))
            add("W", "b1", s1)
        while cnt["f1"] < cnt["f0"] or cnt["f0"] < n:
            if cnt["f0"] < n:
                add("F", "f0", s0)
            ops.append(("I", cnt["b0"], s0))
            add("W", "b0", s0)
            add("F", "f1", s1)
            ops.append(("I", cnt["b1"], s1))
            add("W", "b1", s1)
        w0, w1 = cnt["b0"], cnt["b1"]
        for _ in range(r):
            add("I", "b0", s0)
            add("I", "b1", s1)
        for _ in range(pp - r):
            add("I", "b0", s0)
            ops.append(("W", w0, s0))
            w0 += 1
        for w in range(w1, cnt["b1"]):
            ops.append(("W", w, s1))
        for w in range(w0, cnt["b0"]):
            ops.append(("W", w, s0))
        out.append([(op,) for op in ops if op[1] < m])  # PyTorch drops micro-batches >= m
    return out


def _dualpipev_orders(pp: int, m: int) -> list[list[Entry]]:
    if m < 2 * pp:
        raise ValueError(f"DualPipeV needs at least 2 x pp micro-batches ({m} < {2 * pp})")
    out = []
    for r in range(pp):
        stage = (r, 2 * pp - 1 - r)
        f, b = [0, 0], [0, 0]
        queue: list[Op] = []  # WeightGradStore: deferred W passes, first in first out
        ops: list[Entry] = []

        def fwd(phase: int) -> Op:
            f[phase] += 1
            return ("F", f[phase] - 1, stage[phase])

        def bwd(phase: int, zb: bool = False) -> Op:
            b[phase] += 1
            op = ("I" if zb else "B", b[phase] - 1, stage[phase])
            if zb:
                queue.append(("W", op[1], op[2]))
            return op

        def weight() -> None:
            ops.append((queue.pop(0),))

        for _ in range((pp - r - 1) * 2):  # step 1: nF0
            ops.append((fwd(0),))
        for _ in range(r + 1):  # step 2: nF0F1
            ops.append((fwd(0),))
            ops.append((fwd(1),))
        for _ in range(pp - r - 1):  # step 3: nB1W1F1 (zero bubble)
            ops.append((bwd(1, zb=True),))
            weight()
            ops.append((fwd(1),))
        for i in range(m - 2 * pp + r + 1):  # step 4: nF0B1F1B0 (overlapped pairs)
            if i == 0 and r == pp - 1:  # "we don't overlap these two chunks"
                ops.append((fwd(0),))
                ops.append((bwd(1),))
            else:
                ops.append((fwd(0), bwd(1)))
            ops.append((fwd(1), bwd(0)))
        for _ in range(pp - r - 1):  # step 5: nB1F1B0
            ops.append((bwd(1),))
            ops.append((fwd(1), bwd(0)))
        zb = False
        steps = r + 1
        for i in range(steps):  # step 6: nB1B0, the second half zero bubble
            if i == steps // 2 and r % 2 == 1:
                zb = True
            ops.append((bwd(1, zb),))
            if i == steps // 2 and r % 2 == 0:
                zb = True
            ops.append((bwd(0, zb),))
        for _ in range(pp - r - 1):  # step 7: nWB0 (zero bubble)
            weight()
            ops.append((bwd(0, zb=True),))
        for _ in range(r + 1):  # step 8: nW
            weight()
        assert not queue
        out.append(ops)
    return out


def schedule_orders(schedule: str, pp: int, virtual_stages: int,
                    num_micro_batches: int) -> list[list[Entry]]:
    """Per rank, the entries in the order the schedule's runtime issues them."""
    m, v = num_micro_batches, virtual_stages
    if schedule in ("1f1b", "interleaved-1f1b"):
        return _loop_orders(pp, v, m)
    if schedule == "zb-h1":
        return _zb1p_orders(pp, v, m)
    if v != 2:
        raise ValueError(f"{schedule} runs exactly 2 chunks per rank (got {v})")
    if schedule == "zbv":
        return _zbv_orders(pp, m)
    if schedule == "dualpipev":
        return _dualpipev_orders(pp, m)
    raise ValueError(f"no operation order for schedule {schedule!r}")


def simulate(schedule: str, times: Sequence[StageTimes], num_micro_batches: int,
             pp: int, p2p_s: float = 0.0,
             act_weight: Sequence[float] | None = None, hold_until_w: bool = False
             ) -> SimResult:
    """Run ``schedule`` over ``len(times) = pp v`` chunk stages (``times[s]``: chunk stage
    ``s`` in model order) for ``num_micro_batches`` micro-batches. ``act_weight[s]``: chunk
    ``s``'s share of its rank's stored activations (default: equal chunks, 1/v).
    ``hold_until_w``: a chunk's activations are freed by its W, not its input gradient (the
    weight gradients read the layers' saved inputs)."""
    n_stages = len(times)
    v = n_stages // pp
    if v * pp != n_stages:
        raise ValueError(f"{n_stages} chunk stages do not split over {pp} ranks")
    m = num_micro_batches
    placement = SCHEDULES[schedule].placement
    rank_of = [chunk_rank(s, pp, placement) for s in range(n_stages)]
    weight = list(act_weight) if act_weight is not None else [1.0 / v] * n_stages
    orders = schedule_orders(schedule, pp, v, m)
    # completion times by (slot, micro-batch, stage): slot 0 the forward, 1 the input
    # gradient (of an I or a B), 2 the weight gradient (W)
    done = [[[-1.0] * n_stages for _ in range(m)] for _ in range(3)]
    slot = {"F": 0, "I": 1, "B": 1, "W": 2}
    last = n_stages - 1
    # per entry: (duration, [(slot, mb, stage, latency)] it waits for, [(slot, mb, stage)] it
    # completes, activation weight it takes, activation weight it frees)
    plans = []
    for r, order in enumerate(orders):
        plan = []
        for entry in order:
            deps, outs, take, free_w, length = [], [], 0.0, 0.0, 0.0
            for kind, mb, s in entry:
                length += times[s].of(kind)
                if kind == "F":
                    if s > 0:
                        deps.append((0, mb, s - 1, p2p_s if rank_of[s - 1] != r else 0.0))
                    take += weight[s]
                elif kind == "W":
                    deps.append((1, mb, s, 0.0))
                    if hold_until_w:
                        free_w += weight[s]
                else:
                    if s == last:
                        deps.append((0, mb, s, 0.0))
                    else:
                        deps.append((1, mb, s + 1, p2p_s if rank_of[s + 1] != r else 0.0))
                    if not (hold_until_w and kind == "I"):
                        free_w += weight[s]
                outs.append((slot[kind], mb, s))
            plan.append((length, deps, outs, take, free_w))
        plans.append(plan)
    free = [0.0] * pp
    busy = [0.0] * pp
    held = [0.0] * pp
    peak = [0.0] * pp
    pos = [0] * pp
    remaining = sum(len(o) for o in plans)
    while remaining:
        progressed = False
        for r in range(pp):
            plan, i, start_r = plans[r], pos[r], free[r]
            while i < len(plan):
                length, deps, outs, take, free_w = plan[i]
                start = start_r
                for k, mb, s, lat in deps:
                    t = done[k][mb][s]
                    if t < 0.0:
                        break
                    if t + lat > start:
                        start = t + lat
                else:
                    end = start + length
                    held[r] += take
                    if held[r] > peak[r]:
                        peak[r] = held[r]
                    held[r] -= free_w
                    for k, mb, s in outs:
                        done[k][mb][s] = end
                    busy[r] += length
                    start_r = end
                    i += 1
                    continue
                break
            if i != pos[r]:
                remaining -= i - pos[r]
                pos[r], free[r] = i, start_r
                progressed = True
        if not progressed:
            raise RuntimeError(f"{schedule}: the operation order deadlocks")
    return SimResult(max(free), tuple(busy), tuple(peak))


@lru_cache(maxsize=4096)
def uneven_chunk_excess(schedule: str, pp: int, num_micro_batches: int,
                        chunk_weights: tuple[float, ...]) -> float:
    """How much longer the schedule's order runs than its closed form
    (:func:`planner.cost.pipeline.pipeline_time_s`) on chunks of these relative weights
    (model order; :func:`planner.cost.terms.chunk_weights`): ``simulator / closed form - 1``,
    rounded up to 1/1024, and 0 where the closed form is not below the order (equal chunks).
    The closed form sees only each rank's sum; unequal chunks inside a rank stretch the fill
    through the long chunks and slow the steady state where the ranks' chunk sizes differ.
    Chunk times F = w/3, B = 2w/3 (W = B/2 where the schedule splits the backward)."""
    n = len(chunk_weights)
    if pp <= 1 or n <= pp or not any(chunk_weights):
        return 0.0
    spec = SCHEDULES[schedule]
    split = 1 / 3 if spec.splits_backward else 0.0
    times = [StageTimes(x / 3, 2 * x / 3, split * x) for x in chunk_weights]
    stage = [0.0] * pp
    for s, x in enumerate(chunk_weights):
        stage[chunk_rank(s, pp, spec.placement)] += x
    total = sum(chunk_weights)
    closed = pipeline_time_s(stage, num_micro_batches, n // pp, bubble_pieces(spec, pp),
                             2 / 3 * total, split * total)
    ratio = makespan_s(schedule, times, num_micro_batches, pp) / closed
    return max(0.0, math.ceil((ratio - 1) * 1024 - 1e-9) / 1024)


EXTRAPOLATE_FROM = 5  # micro-batches per rank beyond which the steady state is extrapolated


def makespan_s(schedule: str, times: Sequence[StageTimes], num_micro_batches: int,
               pp: int) -> float:
    """:func:`simulate`'s makespan; past ``EXTRAPOLATE_FROM x pp`` micro-batches from two runs
    of ``3 pp + m mod pp`` and ``p`` more: the orders repeat every ``pp`` micro-batches once
    the warm-up is over, so the makespan grows by the same amount per ``pp`` (exact on the
    schedules and unequal chunks of ``tests/test_pipeline_sim.py``), and the cost stays that
    of a few hundred micro-batches' operations at any m."""
    m = num_micro_batches
    if m <= EXTRAPOLATE_FROM * pp:
        return simulate(schedule, times, m, pp).makespan_s
    first = 3 * pp + m % pp
    a = simulate(schedule, times, first, pp).makespan_s
    b = simulate(schedule, times, first + pp, pp).makespan_s
    return b + (b - a) * (m - first - pp) / pp
