"""The operation-order pipeline simulator (planner/cost/pipeline_sim.py) and the closed-form
schedule terms (planner/cost/pipeline.py) against it: exact for equal stages, never
optimistic on uneven stages of one chunk per rank, activation peaks within the memory term."""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import pytest

from planner.cost.memory import in_flight_micro_batches
from planner.cost.pipeline import SCHEDULES, bubble_pieces, chunk_rank, pipeline_time_s
from planner.cost.pipeline_sim import (StageTimes, makespan_s, schedule_orders, simulate,
                                       uneven_chunk_excess)

CHUNKS = {"1f1b": 1, "interleaved-1f1b": 2, "zb-h1": 2, "zbv": 2, "dualpipev": 2}


def closed_s(schedule: str, times: list[StageTimes], m: int, pp: int) -> float:
    spec = SCHEDULES[schedule]
    stage = [0.0] * pp
    for s, t in enumerate(times):
        stage[chunk_rank(s, pp, spec.placement)] += t.fwd_s + t.bwd_s
    return pipeline_time_s(stage, m, len(times) // pp, bubble_pieces(spec, pp),
                           sum(t.bwd_s for t in times), sum(t.wgrad_s for t in times))


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
@pytest.mark.parametrize("pp,m", [(2, 4), (4, 8), (4, 12)])
def test_every_operation_once_on_its_rank(schedule, pp, m):
    v = CHUNKS[schedule]
    orders = schedule_orders(schedule, pp, v, m)
    placement = SCHEDULES[schedule].placement
    seen = Counter()
    for r, order in enumerate(orders):
        for entry in order:
            for kind, mb, s in entry:
                assert chunk_rank(s, pp, placement) == r
                seen[("B" if kind in "BI" else kind), mb, s] += 1
    for s in range(pp * v):
        for mb in range(m):
            assert seen["F", mb, s] == 1 and seen["B", mb, s] == 1
    split = {k for k in seen if k[0] == "W"}
    assert split == ({("W", mb, s) for mb in range(m) for s in range(pp * v)}
                     if schedule in ("zb-h1", "zbv") else split)


def test_1f1b_and_interleaved_match_narayanan():
    # (m + p - 1)(F + B) and (m + (p - 1)/v)(F + B) of equal stages. A latency l per
    # transfer adds at least the fill's and drain's 2 (p - 1) l, and at most what the planner
    # charges (each stage time carries its two transfers, boundary_s)
    t = [StageTimes(1.0, 2.0)] * 4
    assert simulate("1f1b", t, 8, 4).makespan_s == pytest.approx(11 * 3.0)
    late = simulate("1f1b", t, 8, 4, p2p_s=0.1).makespan_s
    assert 11 * 3.0 + 0.6 <= late <= 11 * 3.2
    half = [StageTimes(0.5, 1.0)] * 8
    assert simulate("interleaved-1f1b", half, 8, 4).makespan_s == pytest.approx((8 + 1.5) * 3)


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_closed_form_is_exact_for_equal_stages(schedule):
    # any F, I, W: W above I, F or both included (the published forms are exact only below);
    # ZB-V's pieces hold for W <= I (a GEMM's weight gradient has its input gradient's flops)
    v = CHUNKS[schedule]
    for pp in (2, 3, 4):
        for m in (2 * pp, 3 * pp):
            for f, i, w in ((1, 1, 1), (1, 1.3, 0.8), (0.4, 1, 1), (2, 1, 0.5), (1, 0.5, 1.5),
                            (1.22, 1.2, 0.3), (0.5, 2, 0)):
                if not SCHEDULES[schedule].splits_backward:
                    w = 0
                if schedule == "zbv":
                    w = min(w, i)
                times = [StageTimes(f / v, (i + w) / v, w / v)] * (pp * v)
                assert closed_s(schedule, times, m, pp) == \
                    pytest.approx(simulate(schedule, times, m, pp).makespan_s)


def test_published_zero_bubble_forms_are_optimistic_outside_their_range():
    # ZB-V at F = I = W keeps (p - 1) F (the first forward reaches rank p - 1 no sooner):
    # the (p - 1)(F + B - 3W) = 0 this planner used is 7 F optimistic at p = 8
    pp, m = 8, 16
    times = [StageTimes(1.0, 2.0, 1.0)] * 16
    assert simulate("zbv", times, m, pp).makespan_s == pytest.approx(m * 2 * 3 + 7)
    # ZB-H1 with W > I: the W passes cannot shorten the input-gradient chain (p - 1) I
    times = [StageTimes(1.0, 2.0, 1.5)] * pp
    assert simulate("zb-h1", times, m, pp).makespan_s == pytest.approx(m * 3 + 7 * 1.0)
    # DualPipeV with F > I: 2 (p - 1) F + (p - 1)(I - W), not DeepSeek's (p - 1)(F + 2I - W)
    times = [StageTimes(1.5, 2.0, 1.0)] * 16
    assert simulate("dualpipev", times, m, pp).makespan_s == \
        pytest.approx(m * 2 * 3.5 + 2 * 7 * 1.5)


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1"])
def test_never_optimistic_on_uneven_stages(schedule):
    rng = random.Random(7)
    for pp in (2, 3, 4):
        for m in (pp, 2 * pp, 4 * pp):
            for _ in range(6):
                share = rng.choice((0.0, 0.25, 0.5)) if schedule != "1f1b" else 0.0
                times = []
                for _s in range(pp):
                    x = rng.uniform(0.5, 1.5)
                    times.append(StageTimes(rng.uniform(0.3, 0.6) * x, x, share * x))
                sim = simulate(schedule, times, m, pp).makespan_s
                assert closed_s(schedule, times, m, pp) >= sim * (1 - 1e-12)


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_activation_peak_is_the_memory_term(schedule):
    # a chunk's activations held from its forward to its W (the weight gradients read the
    # GEMMs' saved inputs) or, unsplit, its backward: the order's peak per rank is the term
    v = CHUNKS[schedule]
    for pp in (2, 4):
        for m in (2 * pp, 4 * pp):
            times = [StageTimes(0.5 / v, 1.0 / v, 0.25 / v)] * (pp * v)
            peak = simulate(schedule, times, m, pp, hold_until_w=True).peak_in_flight
            terms = [in_flight_micro_batches(r, pp, m, v, schedule) for r in range(pp)]
            assert terms == pytest.approx(list(peak))
    # freed by the input gradient instead, ZB-H1 would hold 1F1B's p - r (Qi et al.'s "as
    # 1F1B" is its first rank)
    times = [StageTimes(0.5, 1.0, 0.25)] * 4
    assert simulate("zb-h1", times, 8, 4).peak_in_flight == (4, 3, 2, 1)


def test_unbalanced_orders_are_refused():
    with pytest.raises(ValueError, match="2 x pp"):
        schedule_orders("dualpipev", 4, 2, 6)
    with pytest.raises(ValueError, match="exactly 2 chunks"):
        schedule_orders("zbv", 4, 3, 8)


@pytest.mark.parametrize("schedule,pp,v,m,blocks", [
    ("interleaved-1f1b", 2, 2, 4, 6), ("interleaved-1f1b", 4, 3, 8, 14), ("zb-h1", 4, 2, 8, 10),
    ("zb-h1", 3, 3, 6, 11), ("zbv", 3, 2, 6, 8), ("dualpipev", 2, 2, 4, 5)])
def test_unequal_chunks_cost_what_their_order_takes(schedule, pp, v, m, blocks):
    # the first blocks mod (p v) chunks one block longer (planner.strategy.interleaved_chunk):
    # the closed form on the ranks' sums x (1 + excess) is the order's makespan, rounded up
    # (or, with no excess, at least the order's makespan)
    base, extra = divmod(blocks, pp * v)
    weights = tuple(float(base + (c < extra)) for c in range(pp * v))
    excess = uneven_chunk_excess(schedule, pp, m, weights)
    split = 1 / 3 if SCHEDULES[schedule].splits_backward else 0.0
    times = [StageTimes(x / 3, 2 * x / 3, split * x) for x in weights]
    sim = simulate(schedule, times, m, pp).makespan_s
    closed = closed_s(schedule, times, m, pp)
    assert sim <= closed * (1 + excess) * (1 + 1e-12)
    if excess:
        assert closed * (1 + excess) <= sim * (1 + 1 / 1024) + 1e-12
    assert uneven_chunk_excess(schedule, pp, m, (1.0,) * (pp * v)) == 0.0  # equal: exact


def test_chunk_weights_and_the_evaluated_pipeline():
    # 6 blocks in 4 chunks: 2, 2, 1, 1 blocks, the head on the last; evaluate's stage times
    # carry the order's excess, equal chunks none
    from clusters import load_cluster
    from models.native import build_native
    from planner.config import ParallelConfig
    from planner.cost.model import evaluate
    from planner.cost.terms import chunk_weights

    def native(blocks):
        return build_native({"name": f"n{blocks}", "num_layers": blocks, "hidden_size": 128,
                             "num_heads": 4, "ffn_hidden_size": 512, "vocab_size": 512,
                             "seq_len": 128})

    six, eight = native(6), native(8)
    w = chunk_weights(six, 4)
    assert w[:3] == (2.0, 2.0, 1.0) and w[3] > 1.0  # the head's vocab x hidden projection
    assert uneven_chunk_excess("interleaved-1f1b", 2, 4, w) > 0.0
    assert uneven_chunk_excess("interleaved-1f1b", 2, 4, chunk_weights(eight, 4)) == 0.0
    cluster = load_cluster("tiny")
    config = ParallelConfig(tp=1, pp=2, dp=4, global_batch=16, seq_len=128, micro_batch=2,
                            virtual_stages=2)
    ev = evaluate(six, cluster, config)
    flat = evaluate(six, cluster, replace(config, virtual_stages=1))
    assert ev.breakdown.pipeline_s > 0 and ev.breakdown.bubble_s >= 0
    assert ev.step_time_s != flat.step_time_s


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_long_pipelines_extrapolate_exactly(schedule):
    # past 5 p micro-batches the makespan grows by one period per p micro-batches
    v = CHUNKS[schedule]
    pp, blocks = 4, 4 * v + 3
    base, extra = divmod(blocks, pp * v)
    weights = [float(base + (c < extra)) for c in range(pp * v)]
    weights[-1] += 0.7  # the head
    split = 1 / 3 if SCHEDULES[schedule].splits_backward else 0.0
    times = [StageTimes(x / 3, 2 * x / 3, split * x) for x in weights]
    for m in (24, 36, 44):
        assert makespan_s(schedule, times, m, pp) == \
            pytest.approx(simulate(schedule, times, m, pp).makespan_s, rel=1e-12)
