"""The solver on MoE instances: ep and etp are searched jointly with the rest, and the optimum
equals the brute-force oracle's (planner/solve/bruteforce.py) over the same space.

tiny-moe (1 dense + 3 MoE blocks of 8 experts) on 2 nodes x 4 tiny GPUs: with ample memory the
optimum needs no expert parallelism; as memory shrinks it has to split the experts (ep x etp)
over 4 and then 8 GPUs, choosing between EP folded over the TP ranks and expert TP.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from clusters import load_cluster
from models import load_model
from planner.moe import MoeOptions
from planner.config import RuntimeOptions
from planner.solve.bruteforce import brute_force
from planner.solve.headroom import NO_HEADROOM
from planner.solve.search import SearchOptions, search
from planner.solve.space import Pins, enumerate_configs

TINY = load_cluster("tiny")
MODEL = load_model("tiny-moe")
REL = 1e-6


def cluster(memory_gib: float):
    return replace(TINY, gpu=replace(TINY.gpu, memory_gib=memory_gib))


# (id, memory GiB, pins, runtime, GPUs each expert's weights are split over at least: ep x etp)
CASES = [
    ("ample-memory-no-ep", 0.2, Pins(zero=1, sp=True), RuntimeOptions(), 1),
    ("tight-experts-split-4", 0.16, Pins(zero=1, sp=True), RuntimeOptions(), 4),
    ("tighter-experts-split-8", 0.145, Pins(zero=1, sp=True), RuntimeOptions(), 8),
    ("etp-pinned-to-tp", 0.16, Pins(zero=1, sp=True, etp=2), RuntimeOptions(), None),
    ("imbalanced-hierarchical", 0.16, Pins(zero=1, sp=True),
     RuntimeOptions(moe=MoeOptions(imbalance=1.3, dispatcher="deepep")), None),
    ("dropping-zero3", 0.16, Pins(zero=3, micro_batch=1),
     RuntimeOptions(moe=MoeOptions(capacity_factor=1.0)), None),
]


@pytest.mark.parametrize("memory,pins,runtime,expected", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_solver_matches_brute_force_on_moe(memory, pins, runtime, expected):
    hw = cluster(memory)
    # the memories above are tuned to the whole GPU: no search headroom on either side
    got = search(MODEL, hw, 16, 128, "bf16", pins,
                 SearchOptions(runtime=runtime, memory_headroom=NO_HEADROOM))
    want = brute_force(MODEL, hw, 16, 128, "bf16", pins, runtime, headroom=NO_HEADROOM).best
    assert got.record.status == "OPTIMAL" and want is not None
    assert got.best.step_time_s == pytest.approx(want.step_time_s, rel=REL)
    c = got.best.config
    mesh = c.mesh
    assert mesh.expert_tp * c.ep * mesh.expert_dp == c.tp * c.cp * c.dp
    if expected is not None:  # memory forces the routed experts over this many GPUs
        assert c.ep * mesh.expert_tp >= expected, (c.tp, c.ep, mesh.expert_tp)
    if pins.etp is not None:
        assert mesh.expert_tp == pins.etp


def test_space_folds_ep_over_tp_and_cp():
    """ep takes every divisor of tp x cp x dp / etp that divides the experts; etp is 1 or tp."""
    configs = list(enumerate_configs(MODEL, TINY, 16, 128, "bf16", Pins(pp=1, zero=1, sp=True,
                                                                          micro_batch=1)))
    meshes = {(c.tp, c.dp, c.ep, c.mesh.expert_tp) for c in configs}
    assert (4, 2, 8, 1) in meshes  # EP 8 over tp 4 x dp 2
    assert (4, 2, 2, 4) in meshes and (4, 2, 4, 4) not in meshes  # etp 4: 8 / 4 = 2 EP ranks
    assert all(c.ep <= 8 and 8 % c.ep == 0 for c in configs)


def test_time_bound_with_zero_traffic_never_exceeds_a_real_plan():
    """The bound counts ZeRO-2/3 per-micro-batch traffic no stage can hide; it must stay below
    every plan's step time (here: every uniform plan of every candidate)."""
    from planner.cost.model import evaluate
    from planner.solve.candidates import candidates
    from planner.strategy import default_placement

    hw = cluster(0.5)
    cands = [c for zero in (2, 3) for c in candidates(MODEL, hw, 16, 128, "bf16",
                                                      Pins(micro_batch=1, zero=zero),
                                                      RuntimeOptions())]
    checked = 0
    for cand in cands:
        if cand.config.zero_stage < 2:
            continue
        for option in Pins().block_options():
            ev = evaluate(MODEL, hw, cand.config, default_placement(MODEL, cand.config, option))
            assert cand.time_lb_s <= ev.step_time_s * (1 + 1e-9), cand.config
            checked += 1
    assert checked > 50


@pytest.mark.parametrize("runtime,allowed", [("megatron", "any"), ("torchtitan", "one"),
                                             ("deepspeed", "one-or-tp")])
def test_each_runtime_searches_only_the_expert_tp_it_runs(runtime, allowed):
    """torchtitan 0.3 has no expert tensor parallelism (its expert mesh is efsdp x ep),
    DeepSpeed-MoE keeps experts whole or slices them like TP, Megatron-Core takes any
    --expert-tensor-parallel-size; the search enumerates only those, and a pin the runtime
    cannot run is refused before any search."""
    from planner.errors import PlannerError
    from planner.profiles import PROFILES
    prof = PROFILES[runtime]
    assert prof.expert_tp == allowed
    seen = set()
    for pins in (Pins(), Pins(etp=2)):
        try:
            configs = list(enumerate_configs(MODEL, TINY, 16, 128, "bf16", pins, prof))
        except PlannerError as error:
            assert pins.etp == 2 and allowed == "one" and "etp=2" in error.message
            continue
        seen |= {(c.tp, c.mesh.expert_tp) for c in configs if c.ep > 1}
    assert seen, "some expert-parallel configuration is enumerated"
    if allowed == "one":
        assert {etp for _, etp in seen} == {1}
    elif allowed == "one-or-tp":
        assert all(etp in (1, tp) for tp, etp in seen)
    else:
        assert any(etp == 2 and tp == 4 for tp, etp in seen)  # a pinned etp below tp
