"""Unit tests of the brute-force oracle itself (planner/solve/bruteforce.py).

The oracle is only worth something if it is the definition: its fast path (cached stage costs,
exact cuts) must give what calling ``evaluate`` on every placement gives, and it must enumerate
exactly the space it claims.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from clusters import load_cluster
from models.native import build_native
from planner.strategy import Recompute, interleaved_rank
from planner.ir import LayerKind
from planner.solve.bruteforce import _splits, brute_force, count_placements
from planner.solve.headroom import NO_HEADROOM
from planner.solve.space import Pins

TINY = load_cluster("tiny")


def cluster(memory_gib, nodes=1, gpus_per_node=4):
    return replace(TINY, num_nodes=nodes, gpus_per_node=gpus_per_node,
                   gpu=replace(TINY.gpu, memory_gib=memory_gib))


def native(blocks, hidden=256, heads=4, seq_len=1024, **extra):
    return build_native({"name": f"n{blocks}", "num_layers": blocks, "hidden_size": hidden,
                         "num_heads": heads, "ffn_hidden_size": 4 * hidden, "vocab_size": 1024,
                         "seq_len": seq_len, **extra})


def test_splits_are_every_contiguous_composition():
    assert list(_splits(4, 2, 1)) == [(0, 1, 1, 1), (0, 0, 1, 1), (0, 0, 0, 1)]
    assert len(list(_splits(6, 3, 1))) == 10  # C(5, 2)
    assert list(_splits(3, 1, 1)) == [(0, 0, 0)]
    assert list(_splits(3, 3, 1)) == [(0, 1, 2)]


def test_interleaved_split_is_megatrons_round_robin():
    assert list(_splits(8, 2, 2)) == [(0, 0, 1, 1, 0, 0, 1, 1)]
    assert list(_splits(8, 2, 2))[0] == tuple(interleaved_rank(b, 8, 2, 2) for b in range(8))


# Small enough that ``literal=True`` (evaluate() on every placement) runs in a few seconds.
LITERAL_CASES = [
    ("1-gpu-mixed-recompute", native(3, hidden=512, heads=8, seq_len=2048), cluster(0.5, 1, 1), 4,
     Pins()),
    ("1-gpu-does-not-fit", native(3, hidden=512, heads=8, seq_len=2048), cluster(0.3, 1, 1), 4,
     Pins()),
    ("pp2-uneven", native(5), cluster(0.17, 1, 4), 8,
     Pins(pp=2, virtual_stages=1, zero=0, micro_batch=1)),
    ("interleaved", native(4), cluster(0.2, 1, 2), 8, Pins(pp=2, virtual_stages=2, zero=1)),
    ("tied-pp2", native(4, tied_embeddings=True), cluster(0.2, 2, 1), 4, Pins(pp=2, zero=0)),
]


@pytest.mark.parametrize("model,hw,batch,pins", [c[1:] for c in LITERAL_CASES],
                         ids=[c[0] for c in LITERAL_CASES])
def test_fast_path_equals_evaluate_on_every_placement(model, hw, batch, pins):
    fast = brute_force(model, hw, batch, model.default_seq_len, pins=pins)
    slow = brute_force(model, hw, batch, model.default_seq_len, pins=pins, literal=True)
    assert (fast.best is None) == (slow.best is None)
    # and with no headroom (the cases' memory is tuned to the whole GPU)
    fast = brute_force(model, hw, batch, model.default_seq_len, pins=pins, headroom=NO_HEADROOM)
    slow = brute_force(model, hw, batch, model.default_seq_len, pins=pins, literal=True,
                       headroom=NO_HEADROOM)
    assert fast.placements == slow.placements == slow.scored
    assert fast.placements == count_placements(model, hw, batch, model.default_seq_len, pins=pins)
    assert fast.scored <= fast.placements
    if slow.best is None:
        assert fast.best is None
    else:  # the same placement: same arithmetic, same tie-breaking
        assert fast.best.step_time_s == slow.best.step_time_s
        assert (fast.best.config, fast.best.placement) == (slow.best.config, slow.best.placement)
        assert fast.best.fits


def test_literal_cases_cover_both_outcomes():
    outcomes = {c[0]: brute_force(c[1], c[2], c[3], c[1].default_seq_len, pins=c[4],
                                  headroom=NO_HEADROOM).best
                for c in LITERAL_CASES}
    assert outcomes["1-gpu-does-not-fit"] is None
    assert all(ev is not None for name, ev in outcomes.items() if name != "1-gpu-does-not-fit")
    mixed = outcomes["1-gpu-mixed-recompute"].placement.recompute
    assert {Recompute.NONE, Recompute.FULL} <= set(mixed)


def test_ample_memory_never_recomputes():
    # Recomputation only adds time; with memory to spare the optimum recomputes nothing.
    model = native(3)
    best = brute_force(model, cluster(1024, 1, 2), 4, model.default_seq_len).best
    assert set(best.placement.recompute) == {Recompute.NONE}


def test_non_block_layers_follow_default_placement():
    model = native(4)
    best = brute_force(model, cluster(1024, 1, 4), 8, model.default_seq_len,
                       pins=Pins(pp=4, zero=1)).best
    kinds = [layer.kind for layer in model.layers]
    assert best.placement.stage[kinds.index(LayerKind.EMBEDDING)] == 0
    assert best.placement.stage[kinds.index(LayerKind.HEAD)] == 3
    assert best.placement.stage[1:5] == (0, 1, 2, 3)


def test_pinned_recompute_is_the_only_option():
    model = native(3)
    pins = Pins(recompute=Recompute.SELECTIVE, pp=1)
    result = brute_force(model, cluster(1024, 1, 2), 4, model.default_seq_len, pins=pins)
    assert result.placements == result.configs  # one placement per configuration
    blocks = [r for r, layer in zip(result.best.placement.recompute, model.layers)
              if layer.kind is LayerKind.BLOCK]
    assert blocks == [Recompute.SELECTIVE] * 3


def test_refuses_instances_over_budget():
    model = native(6)
    pins = Pins(layouts="per-layer")  # (Megatron's recompute rule keeps the plain space small)
    total = count_placements(model, cluster(1024, 2, 4), 16, model.default_seq_len, pins=pins)
    assert total > 200_000
    with pytest.raises(ValueError, match=f"{total} placements"):
        brute_force(model, cluster(1024, 2, 4), 16, model.default_seq_len, pins=pins)
    with pytest.raises(ValueError, match="budget of 10"):
        brute_force(model, cluster(1024, 1, 1), 1, model.default_seq_len, budget=10)


def test_no_configuration_means_no_placement():
    model = native(1)
    result = brute_force(model, cluster(1024, 2, 4), 1, model.default_seq_len)
    assert (result.best, result.placements, result.configs) == (None, 0, 0)
