"""DeepSpeed's TrainSchedule with blocking transfers (bench/deepspeed_lockstep.py), the reference
behind docs/accuracy.md's finding that lock-step does not reorder the BLOOM-prequel runs."""
import pytest

from bench.deepspeed_lockstep import simulate, train_schedule
from planner.cost.pipeline import pipeline_time_s


@pytest.mark.parametrize("pp,m", [(2, 1), (2, 5), (3, 3), (4, 16), (6, 7), (12, 40)])
def test_every_pass_once_and_every_transfer_matched(pp, m):
    orders = [train_schedule(s, pp, m) for s in range(pp)]
    for s, order in enumerate(orders):
        passes = [i for i in order if i[0] in ("F", "B")]
        assert sorted(passes) == sorted([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
        for i in range(m):  # a micro-batch's backward after its forward
            assert passes.index(("B", i)) > passes.index(("F", i))
        # 1F1B: p - s - 1 warm-up forwards and the first steady one before the first backward
        assert passes.index(("B", 0)) == min(pp - s, m)
    for s in range(pp - 1):  # what s sends to s + 1 is what s + 1 receives, in order
        sent = [i[2:] for i in orders[s] if i[:2] == ("send", s + 1)]
        got = [i[2:] for i in orders[s + 1] if i[:2] == ("recv", s)]
        assert sent == got == [("act", i) for i in range(m)]
        back = [i[2:] for i in orders[s + 1] if i[:2] == ("send", s)]
        assert back == [i[2:] for i in orders[s] if i[:2] == ("recv", s + 1)]
        assert back == [("grad", i) for i in range(m)]


@pytest.mark.parametrize("pp,m", [(2, 4), (4, 16), (8, 8), (12, 128)])
def test_without_transfers_it_is_1f1b(pp, m):
    # equal stages, free transfers: (m + p - 1)(F + B), the closed form exactly
    got = simulate([1.0] * pp, [2.5] * pp, 0.0, m)
    assert got == pytest.approx((m + pp - 1) * 3.5)
    assert got == pytest.approx(pipeline_time_s([3.5] * pp, m))


@pytest.mark.parametrize("pp,m", [(3, 5), (4, 16), (6, 64), (8, 8), (12, 128)])
def test_equal_stages_pay_four_blocking_transfers_in_the_middle(pp, m):
    # a middle stage exchanges twice per micro-batch, a send and a receive in series each:
    # it paces at F + B + 4c; the fill and drain save (2p + 4) c (hand-computed: p 4, m 16,
    # F 1, B 2.5, c 0.1 -> 19 x 3.9 - 1.2 = 72.9 s, where the closed form with the planner's
    # two transfers per stage says 19 x 3.7 = 70.3 s)
    c = 0.1
    got = simulate([1.0] * pp, [2.5] * pp, c, m)
    assert got == pytest.approx((m + pp - 1) * (3.5 + 4 * c) - (2 * pp + 4) * c)
    assert got > pipeline_time_s([3.5 + 2 * c] * pp, m)


@pytest.mark.parametrize("pp,m", [(2, 4), (4, 16), (6, 64), (12, 128)])
def test_a_head_paced_pipeline_takes_the_closed_form_less_one_exchange(pp, m):
    # the vocabulary head makes the last stage the slowest (the BLOOM-prequel sweep): it paces
    # at F + B + 2c like the closed form's stage, and the lock-step order comes to the closed
    # form minus one transfer each way
    c = 0.1
    fwd, bwd = [1.0] * pp, [2.5] * pp
    fwd[-1] += 0.3
    bwd[-1] += 0.6
    closed = pipeline_time_s([f + b + 2 * c for f, b in zip(fwd, bwd)], m)
    assert simulate(fwd, bwd, c, m) == pytest.approx(closed - 2 * c)
