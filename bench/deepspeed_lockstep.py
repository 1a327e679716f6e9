"""DeepSpeed's pipeline engine instruction by instruction with blocking transfers, against the
closed-form 1F1B step the deepspeed profile charges (docs/accuracy.md, "Why the misses").

DeepSpeed's ``PipelineEngine`` of the BLOOM-prequel sweep (microsoft/DeepSpeed commit 2151c78,
2022-02: deepspeed/runtime/pipe/schedule.py ``TrainSchedule``, engine.py, p2p.py) runs
``2 (m + p - 1)`` steps on every stage. Step ``k`` of stage ``s`` is a forward when ``k`` and
``s`` have the same parity, else a backward (``_step_to_micro_batch``); a forward step receives
its input from ``s - 1`` and then sends the previous step's input gradient back
(``RecvActivation``, ``SendGrad``), a backward step sends the previous forward's output on and
then receives its output gradient (``SendActivation``, ``RecvGrad``). Every transfer is a
blocking ``dist.send`` / ``dist.recv`` (p2p.py, torch >= 1.8) on the compute stream, and the
receiver reads the partition's metadata with ``meta.tolist()`` (utils.py
``PartitionedTensor.from_meta``, a host sync): a transfer starts when both ranks have reached it
and holds both for its duration, so a stage's compute never overlaps its neighbour's transfer
and the stages advance in lock-step. :func:`simulate` executes that order under these
semantics. The planner's closed form charges every stage two transfers per micro-batch inside
its stage time (``boundary_s``) and lets the slowest stage pace: ``m max t + sum t - max t``
(planner/cost/pipeline.py).

What the order gives (tests/test_deepspeed_lockstep.py): a middle stage holds four transfers per
micro-batch (two exchanges, each a send and a receive in series), the end stages two. With the
last stage paced by the vocabulary head (every BLOOM-prequel configuration), the lock-step
order takes the closed form less one transfer each way; with equal stages the middle stages
pace, ``(m + p - 1)(F + B + 4c) - (2p + 4) c`` for ``p >= 3``.

    python bench/deepspeed_lockstep.py   # every DeepSpeed run with PP: closed form vs lock-step

Evaluates each such calibration run with the shipped constants twice (the pipeline's closed
form, then the lock-step makespan of the same stage times, a transfer costing half the
stage's ``boundary_s``: one partitioned send plus the receiver's all-gather) and prints the
change of its step time, of the step-time statistics and of the rank agreement; then two
diagnostics of docs/accuracy.md's finding (:func:`head_hidden_rows`,
:func:`per_micro_batch`). Nothing is fitted.
"""
from __future__ import annotations

import dataclasses
import statistics
import sys
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

Instr = tuple  # ("F" | "B", micro-batch) or ("send" | "recv", peer stage, "act" | "grad", mb)


def train_schedule(stage: int, pp: int, m: int) -> list[Instr]:
    """Stage ``stage``'s instructions under DeepSpeed's ``TrainSchedule`` (data loading and the
    step's reductions left out)."""

    def micro_batch(k: int) -> tuple[int, bool]:  # TrainSchedule._step_to_micro_batch
        if k % 2 == stage % 2:
            return (k - stage) // 2, True  # _even/_odd_step_forward_id
        if k % 2 == 0:  # even step, odd stage: _even_step_backward_id
            return k // 2 - pp + (stage + 1) // 2, False
        return (k - 1) // 2 - pp + 1 + stage // 2, False  # _odd_step_backward_id

    def valid(i: int) -> bool:
        return 0 <= i < m

    out: list[Instr] = []
    prev = -1
    for k in range(2 * (m + pp - 1)):
        mb, forward = micro_batch(k)
        if forward and stage > 0:
            if valid(mb):
                out.append(("recv", stage - 1, "act", mb))
            if valid(prev):
                out.append(("send", stage - 1, "grad", prev))
        if not forward and stage < pp - 1:
            if valid(prev):
                out.append(("send", stage + 1, "act", prev))
            if valid(mb):
                out.append(("recv", stage + 1, "grad", mb))
        if valid(mb):
            out.append(("F" if forward else "B", mb))
        prev = mb
    return out


def simulate(fwd_s: Sequence[float], bwd_s: Sequence[float], transfer_s: float,
             num_micro_batches: int) -> float:
    """Makespan of the TrainSchedule orders: a stage computes its forward or backward in
    ``fwd_s[s]`` / ``bwd_s[s]`` seconds; a send and its matching receive start when both
    stages have reached them and hold both for ``transfer_s``."""
    pp = len(fwd_s)
    orders = [train_schedule(s, pp, num_micro_batches) for s in range(pp)]
    pc = [0] * pp
    clock = [0.0] * pp
    while any(pc[s] < len(orders[s]) for s in range(pp)):
        moved = False
        for s in range(pp):
            while pc[s] < len(orders[s]):
                ins = orders[s][pc[s]]
                if ins[0] in ("F", "B"):
                    clock[s] += fwd_s[s] if ins[0] == "F" else bwd_s[s]
                    pc[s] += 1
                    moved = True
                    continue
                kind, peer, what, mb = ins
                other = orders[peer][pc[peer]] if pc[peer] < len(orders[peer]) else None
                if other != ("recv" if kind == "send" else "send", s, what, mb):
                    break  # blocked until the peer reaches the matching call
                clock[s] = clock[peer] = max(clock[s], clock[peer]) + transfer_s
                pc[s] += 1
                pc[peer] += 1
                moved = True
        if not moved:
            raise RuntimeError(f"TrainSchedule deadlocked at {pc}")
    return max(clock)


def lockstep_rows(rows):
    """The accuracy rows with every DeepSpeed run with PP re-timed by :func:`simulate`: the
    pipeline's closed form replaced by the lock-step makespan of the same stage times (a
    stage's TP communication and fixed costs split over its forward and backward like its
    compute). Returns (rows, [(relative change, run id)])."""
    from planner.cost.context import make_context
    from planner.cost.pipeline import pipeline_time_s
    from planner.cost.terms import config_terms, layer_terms

    out, changes = [], []
    for r in rows:
        ev = r.pred.evaluation
        if ev.options.profile != "deepspeed" or ev.config.pp == 1:
            out.append(r)
            continue
        ctx = make_context(ev.model, ev.cluster, ev.config, ev.options)
        terms = config_terms(ctx)
        fwd, bwd = [], []
        for st in ev.stages:
            layers = [layer_terms(ctx, ev.model.layers[i], ev.placement.options[i])
                      for i in st.layers]
            f = sum(x.fwd_s for x in layers)
            b = sum(x.bwd_s + x.recompute_s for x in layers)
            rest = st.time_s - terms.boundary_s - f - b
            fwd.append(f + rest * f / (f + b))
            bwd.append(b + rest * b / (f + b))
        m = ev.config.num_micro_batches
        closed = pipeline_time_s([s.time_s for s in ev.stages], m)
        locked = simulate(fwd, bwd, terms.boundary_s / 2, m)
        changes.append((locked / closed - 1, r.id))
        pred = dataclasses.replace(r.pred, step_time_s=ev.step_time_s - closed + locked)
        out.append(dataclasses.replace(r, pred=pred))
    return out, changes


def head_hidden_rows(rows):
    """Diagnostic: the accuracy rows with each DeepSpeed stage's per-block host overhead hidden
    behind the GPU time of its other layers (the head's GEMMs on the last stage) up to that
    time, the pipeline re-timed by the closed form. Host time is modelled additive; this is the
    one mechanism found that shortens the head's stage."""
    from planner.cost.context import make_context
    from planner.cost.pipeline import pipeline_time_s
    from planner.cost.terms import layer_terms
    from planner.ir import LayerKind

    out = []
    for r in rows:
        ev = r.pred.evaluation
        if ev.options.profile != "deepspeed" or ev.config.pp == 1:
            out.append(r)
            continue
        ctx = make_context(ev.model, ev.cluster, ev.config, ev.options)
        times = []
        for st in ev.stages:
            kinds = [ev.model.layers[i].kind for i in st.layers]
            other = sum(layer_terms(ctx, ev.model.layers[i], ev.placement.options[i]).compute_s
                        for i, k in zip(st.layers, kinds) if k is not LayerKind.BLOCK)
            host = 3 * kinds.count(LayerKind.BLOCK) * ev.options.block_overhead_s
            times.append(st.time_s - min(other, host))
        m = ev.config.num_micro_batches
        step = (ev.step_time_s - pipeline_time_s([s.time_s for s in ev.stages], m)
                + pipeline_time_s(times, m))
        out.append(dataclasses.replace(r, pred=dataclasses.replace(r.pred, step_time_s=step)))
    return out


def per_micro_batch(rows, date: str = "0225", tp: int = 8, micro_batch: int = 4):
    """Measured seconds per micro-batch of the BLOOM-prequel rows of one date, tp and
    micro-batch (the step less the model's data-parallel sync, optimizer step and tied-embedding
    sync, over the m + p - 1 slots of the pipeline) beside the model's middle and last stage
    times: [(pp, global batch, measured, middle, last)]."""
    out = []
    for r in rows:
        c, t = r.run.config, r.run.measured.step_time_s
        if not r.id.startswith(f"bloom-prequel-{date}") or c.pp == 1 or c.tp != tp or \
                c.micro_batch != micro_batch or t is None:
            continue
        ev = r.pred.evaluation
        b = ev.breakdown
        rest = t - b.dp_exposed_s - b.optimizer_s - b.embedding_sync_s
        out.append((c.pp, c.global_batch, rest / (c.num_micro_batches + c.pp - 1),
                    ev.stages[c.pp // 2].time_s, ev.stages[-1].time_s))
    return sorted(out)


def main() -> int:
    from bench.accuracy_runs import rank_agreement, run, stats

    rows, _ = run()
    locked, changes = lockstep_rows(rows)
    changes.sort()
    print(f"{len(changes)} DeepSpeed runs with PP: pipeline seconds lock-step / closed form - 1:"
          f" median {statistics.median(c for c, _ in changes):+.4%}, "
          f"min {changes[0][0]:+.3%} ({changes[0][1]}), max {changes[-1][0]:+.3%} "
          f"({changes[-1][1]})")
    for title, rs in (("closed form (shipped)", rows), ("lock-step", locked),
                      ("host hidden by head", head_hidden_rows(rows))):
        s = stats(rs)
        g = rank_agreement(rs)
        print(f"{title:22} rank {sum(x['agree'] for x in g)}/{sum(x['pairs'] for x in g)}; "
              f"time median {s['time_median']:.1%} max {s['time_max']:.1%} bias "
              f"{s['time_bias']:+.1%}")
    for tp, mbs in ((8, 4), (8, 2), (4, 2), (4, 4), (2, 2)):
        print(f"0225 tp {tp} mbs {mbs}, seconds per micro-batch, measured / model's middle "
              "stage / last:")
        for pp, gbs, got, mid, last in per_micro_batch(rows, "0225", tp, mbs):
            print(f"  pp {pp:2} GBS {gbs}: {got:.3f} / {mid:.3f} / {last:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
