"""Megatron-Core's activation-offload rule (planner/offload_rules.py) as a constraint of the
search: with ``--pin offload=activations|both`` the CP-SAT model (planner/solve/offload_model.py)
finds the brute-force optimum over exactly the offload Megatron-Core runs (pp 1, no
recomputation anywhere, the first N < L blocks per class), and every plan it returns is one
``check --runtime megatron`` passes and the Megatron exporter writes as
``--cpu-offloading --cpu-offloading-num-layers N`` with no warning.

The instances are small and memory-bound so that, in the binding cases, the free optimum
(activation offload on any block, with pipelines and recomputation) is one Megatron cannot run:
the rule must cost step time there, or it is not in the search.
"""
from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusters import load_cluster
from models.native import build_native
from planner import offload_rules
from planner.check_runtime import runtime_problems
from planner.errors import ErrorKind, PlannerError
from planner.export import export_plan
from planner.ir import LayerKind
from planner.plan import make_plan
from planner.plan_types import Plan
from planner.profiles import profile
from planner.solve import inner
from planner.solve.bruteforce import brute_force
from planner.solve.search import SearchOptions, search
from planner.solve.space import Pins
from planner.strategy import LayerOption, Recompute
from test_graph_offload import HOST

REL = 1e-6  # CP-SAT's integer ticks (tests/test_solver_oracle.py says why)
TINY = replace(load_cluster("tiny"), cpu_memory=HOST)


def native(blocks: int, **extra):
    return build_native({"name": f"n{blocks}", "num_layers": blocks, "hidden_size": 256,
                         "num_heads": 4, "ffn_hidden_size": 1024, "vocab_size": 1024,
                         "seq_len": 1024, **extra})


N4 = native(4)
MOE = native(5, moe={"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 512,
                     "first_dense_layers": 2})  # two block classes: 2 dense, 3 MoE
PINS = dict(tp=1, micro_batch=1)
CASES = {  # (model, GPU GiB, pins, the rule binds); a pinned pp 2 is refused (below)
    "every-block": (N4, 0.2, Pins(offload="activations", pp=1, **PINS), True),
    "both": (N4, 0.2, Pins(offload="both", pp=1, **PINS), True),
    "two-classes-all": (MOE, 0.22, Pins(offload="activations", pp=1, **PINS), True),
    "two-classes-first-3": (MOE, 0.24, Pins(offload="activations", pp=1, **PINS), False),
    "searched-pp": (N4, 0.21, Pins(offload="activations", **PINS), True),
}


def cluster(memory_gib: float):
    return replace(TINY, gpu=replace(TINY.gpu, memory_gib=memory_gib))


def solve(model, memory_gib, pins):
    return search(model, cluster(memory_gib), 64, 1024, pins=pins,
                  options=SearchOptions(time_limit_s=60))


def oracle(model, memory_gib, pins):
    return brute_force(model, cluster(memory_gib), 64, 1024, pins=pins, budget=300_000).best


def free_rule(monkeypatch) -> None:
    """The search before the rule: every option, no constraint, brute force unfiltered."""
    monkeypatch.setattr(offload_rules, "searchable", lambda options, pp: tuple(options))
    monkeypatch.setattr(offload_rules, "allows", lambda *args: True)
    monkeypatch.setattr(inner, "add_offload_rule", lambda *args: None)


def blocks(ev) -> list[LayerOption]:
    return [o for o, layer in zip(ev.placement.options, ev.model.layers)
            if layer.kind is LayerKind.BLOCK]


def as_plan(ev) -> Plan:
    return Plan.from_dict(make_plan(ev, model_spec=ev.model.name, cluster_spec="tiny"))


@pytest.mark.parametrize("name", list(CASES))
def test_solver_finds_the_brute_force_optimum_under_the_rule(name, monkeypatch):
    model, memory_gib, pins, binds = CASES[name]
    found, want = solve(model, memory_gib, pins), oracle(model, memory_gib, pins)
    assert want is not None and found.record.status == "OPTIMAL"
    assert found.best.step_time_s == pytest.approx(want.step_time_s, rel=REL)
    assert offload_rules.plan_refusals(as_plan(found.best)) == []
    assert offload_rules.plan_refusals(as_plan(want)) == []
    if not binds:  # the first 3 blocks (2 dense, 1 MoE) offloaded, in Megatron's order
        assert [o.act_offload for o in blocks(found.best)] == [True] * 3 + [False] * 2
        return
    free_rule(monkeypatch)
    free = oracle(model, memory_gib, pins)
    assert free.step_time_s < want.step_time_s * (1 - 1e-3)
    assert offload_rules.plan_refusals(as_plan(free)) != []
    # the CP-SAT constraints are what bind: without them the search finds the free optimum
    assert solve(model, memory_gib, pins).best.step_time_s == \
        pytest.approx(free.step_time_s, rel=REL)


def test_searchable_options_keep_to_the_rule():
    options = Pins(offload="both", tp=1).block_options(None, profile("megatron"))
    act = [o for o in options if o.act_offload]
    assert act and all(o.recompute is Recompute.NONE for o in act)
    assert offload_rules.searchable(options, 2) == tuple(o for o in options if not o.act_offload)
    assert offload_rules.searchable(options, 1) == options
    # the rule, block by block: pp, recomputation anywhere, every block, not the first N
    assert offload_rules.allows(1, ["none"] * 3, [True, False, False], ["a", "b", "a"])
    assert offload_rules.allows(1, ["none"] * 3, [False, False, True], ["a", "b", "a"])
    assert not offload_rules.allows(1, ["none"] * 3, [False, True, False], ["a", "b", "a"])
    assert not offload_rules.allows(2, ["none"] * 3, [True, False, False], ["a"] * 3)
    assert not offload_rules.allows(1, ["none", "none", "full"], [True, False, False], ["a"] * 3)
    assert not offload_rules.allows(1, ["none"] * 3, [True] * 3, ["a"] * 3)


@settings(max_examples=10, deadline=None)
@given(memory_gib=st.sampled_from([0.215, 0.22, 0.225, 0.23, 0.24]),  # most offload
       two_classes=st.booleans(), pp=st.sampled_from([None, 1, 2]),
       offload=st.sampled_from(["activations", "both"]))
def test_every_searched_plan_is_one_megatron_runs(memory_gib, two_classes, pp, offload):
    """Whatever the search returns under megatron passes the rule, ``check --runtime
    megatron`` and the Megatron exporter's reference parser, with the offload flags written
    and no warning."""
    from bench.export_runtimes import megatron_reference

    pins = Pins(offload=offload, pp=pp, **PINS)
    try:
        found = solve(MOE if two_classes else N4, memory_gib, pins).best
    except PlannerError as error:  # nothing fits: a clear planner error, nothing to check
        refused = offload == "activations" and pp == 2  # test_pins_that_bar_offload_are_refused
        assert error.kind is (ErrorKind.INVALID_INPUT if refused else ErrorKind.INFEASIBLE), error
        return
    plan = as_plan(found)
    assert offload_rules.plan_refusals(plan) == []
    assert runtime_problems(plan, profile("megatron")) == []
    offloaded = offload_rules.offloaded_blocks(plan)
    result = export_plan(plan, "megatron")
    assert not [w for w in result.warnings if w.startswith("activation offload")]
    if offloaded:
        assert f"--cpu-offloading-num-layers {offloaded}" in result.text
        assert [o.act_offload for o in blocks(found)][:offloaded] == [True] * offloaded
        megatron_reference(plan.to_dict(), result.text)


@pytest.mark.parametrize("pins, why", [
    (Pins(offload="activations", pp=2), "pp=2 (no CPU offloading with pipeline parallelism)"),
    (Pins(offload="activations", recompute=Recompute.FULL),
     "recompute=full (CPU offloading refuses any recompute granularity)"),
])
def test_pins_that_bar_offload_are_refused(pins, why):
    """``--pin offload=activations`` with a pin under which Megatron-Core runs no activation
    offload is bad input (exit 2), not a search that silently offloads nothing; with
    ``offload=both`` the optimizer half stays searchable, so the same pins are accepted."""
    with pytest.raises(PlannerError) as caught:
        pins.check_runtime(profile("megatron"))
    assert caught.value.kind is ErrorKind.INVALID_INPUT and why in str(caught.value)
    replace(pins, offload="both").check_runtime(profile("megatron"))
    replace(pins, pp=1 if pins.pp else None, recompute=None).check_runtime(profile("megatron"))
