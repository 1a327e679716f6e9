"""The runtimes' recompute rules (planner/recompute_rules.py) as a constraint of the search: the
CP-SAT model (planner/solve/recompute_model.py) finds the brute-force optimum over exactly the
settings the rule expresses, the bounds stay below it, and ``check --runtime`` names a mix the
rule cannot express.

The instances are small and memory-bound so that the free optimum (any per-block mix) is one
the runtime cannot run: the rule must cost step time there, or it is not in the search.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType

import pytest

from clusters import load_cluster
from models.native import build_native
from planner import profiles
from planner import recompute_rules as rules
from planner.calibration.session import runtime_setup
from planner.config import RuntimeOptions
from planner.cost.context import make_context
from planner.ir import LayerKind
from planner.plan_types import Plan
from conftest import build_plan
from planner.check_runtime import runtime_problems
from planner.solve.bounds import memory_lower_bound, time_lower_bound
from planner.solve.bruteforce import brute_force
from planner.solve.costs import stage_problem
from planner.solve.headroom import NO_HEADROOM
from planner.solve.search import SearchOptions, search
from planner.solve.space import Pins, enumerate_configs

REL = 1e-6  # CP-SAT's integer ticks (tests/test_solver_oracle.py says why)
TINY = load_cluster("tiny")


def cluster(memory_gib: float, gpus: int):
    return replace(TINY, num_nodes=1, gpus_per_node=gpus,
                   gpu=replace(TINY.gpu, memory_gib=memory_gib))


def native(blocks: int, hidden: int, heads: int, **extra):
    return build_native({"name": f"n{blocks}-h{hidden}", "num_layers": blocks,
                         "hidden_size": hidden, "num_heads": heads,
                         "ffn_hidden_size": 4 * hidden, "vocab_size": 1024, "seq_len": 1024,
                         **extra})


@dataclass(frozen=True)
class Case:
    runtime: str
    model: object
    memory_gib: float
    gpus: int
    global_batch: int
    pins: Pins


N6 = native(6, 512, 8)
N8 = native(8, 256, 4)
MOE = native(5, 256, 4, moe={"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 512,
                             "first_dense_layers": 2})  # two block classes
CASES = {  # each one's free optimum is a mix its runtime cannot run
    "megatron-pp2": Case("megatron", N6, 0.44, 2, 8, Pins(pp=2, virtual_stages=1)),
    "megatron-interleaved": Case("megatron", N8, 0.3, 2, 8, Pins(pp=2, virtual_stages=2)),
    "megatron-two-classes": Case("megatron", MOE, 0.2, 4, 8, Pins(pp=2, virtual_stages=1)),
    "torchtitan-pp2": Case("torchtitan", N6, 0.6, 2, 8, Pins(pp=2, virtual_stages=1)),
    "torchtitan-interleaved": Case("torchtitan", N8, 0.4, 2, 8, Pins(pp=2, virtual_stages=2)),
}


def options(case: Case) -> RuntimeOptions:
    return runtime_setup(cluster(case.memory_gib, case.gpus), case.runtime, "bf16").options


def free_rule(monkeypatch) -> None:
    """Every profile with the per-block rule: the search before the rule (the comparison)."""
    monkeypatch.setattr(profiles, "PROFILES", MappingProxyType(
        {k: replace(p, recompute_rule="per-block") for k, p in profiles.PROFILES.items()}))


def solve(case: Case):
    hw = cluster(case.memory_gib, case.gpus)
    return search(case.model, hw, case.global_batch, case.model.default_seq_len,
                  pins=case.pins, options=SearchOptions(runtime=options(case),
                                                        memory_headroom=NO_HEADROOM)).best


def oracle(case: Case):
    hw = cluster(case.memory_gib, case.gpus)
    return brute_force(case.model, hw, case.global_batch, case.model.default_seq_len,
                       pins=case.pins, runtime=options(case), headroom=NO_HEADROOM).best


def settings(ev) -> list[str]:
    return [o.recompute.value for o, layer in zip(ev.placement.options, ev.model.layers)
            if layer.kind is LayerKind.BLOCK]


def runs(ev):
    return rules.chunk_runs([s for s, layer in zip(ev.placement.stage, ev.model.layers)
                             if layer.kind is LayerKind.BLOCK])


def classes(ev) -> list[int]:
    return [ci for ci, cls in enumerate(ev.model.layer_classes())
            if cls.layer.kind is LayerKind.BLOCK for _ in range(cls.count)]


@pytest.mark.parametrize("name", list(CASES))
def test_solver_finds_the_brute_force_optimum_under_the_rule(name, monkeypatch):
    case = CASES[name]
    rule = profiles.profile(case.runtime).recompute_rule
    got, want = solve(case), oracle(case)
    assert got.step_time_s == pytest.approx(want.step_time_s, rel=REL)
    # brute force enumerates the rule's settings exactly; the solver's counts are one of them
    assert rules.allows(rule, runs(want), settings(want))
    assert rules.equivalent(rule, runs(got), classes(got), settings(got)) is not None
    # the rule binds: the free optimum is faster and is a mix the runtime cannot run
    free_rule(monkeypatch)
    free = oracle(case)
    assert free.step_time_s < want.step_time_s * (1 - 1e-3)
    assert rules.equivalent(rule, runs(free), classes(free), settings(free)) is None
    assert solve(case).step_time_s == pytest.approx(free.step_time_s, rel=REL)


def test_rule_settings_are_the_runtimes_flags():
    interleaved = rules.chunk_runs([0, 0, 1, 1, 0, 0, 1, 1])
    # Megatron: the first N of every chunk (N = 1), or one setting for all
    assert rules.first_n(interleaved, 1) == ("full", "none") * 4
    assert rules.settings_of("first-n", interleaved, {"none", "full", "selective"}) == [
        ("full",) * 8, ("none",) * 8, ("selective",) * 8, ("full", "none") * 4]
    assert not rules.allows("first-n", interleaved, ["full"] * 2 + ["none"] * 6)
    assert not rules.allows("first-n", interleaved, ["selective", "full"] * 4)
    # the same counts per rank and class cost the same: rank 0 holds blocks 0, 1, 4, 5
    assert rules.equivalent("first-n", interleaved, [0] * 8,
                            ["full", "none", "none", "full", "none", "full", "full", "none"]
                            ) == ("full", "none") * 4
    # torchtitan 0.3: one setting; 0.2.2's every-N-th block of each rank, counted over chunks
    assert rules.settings_of("uniform", interleaved, {"none", "op"}) == [("none",) * 8,
                                                                         ("op",) * 8]
    assert rules.every_nth(interleaved, 3) == ("none",) * 4 + ("full", "none") * 2
    assert rules.settings_of("per-block", interleaved, {"none", "full"}) is None


def test_bounds_keep_to_the_rule(monkeypatch):
    # one setting for all blocks: a bound is the best group's (none, full, op) whose memory
    # bound fits, never below the free bound; sound, since the search under these bounds
    # finds the brute-force optimum (test above), and tighter on some configurations
    case = CASES["torchtitan-pp2"]
    hw = cluster(case.memory_gib, case.gpus)
    prof = profiles.profile(case.runtime)
    capacity = hw.memory_bytes_per_gpu
    problems = [stage_problem(make_context(case.model, hw, c, options(case)),
                              case.pins.block_options(c, prof), capacity)
                for c in enumerate_configs(case.model, hw, case.global_batch,
                                           case.model.default_seq_len, "bf16", case.pins, prof)]
    ruled = [(time_lower_bound(p, capacity), memory_lower_bound(p)) for p in problems]
    free_rule(monkeypatch)
    free = [(time_lower_bound(p, capacity), memory_lower_bound(p)) for p in problems]
    assert all(r[0] >= f[0] and r[1] >= f[1] for r, f in zip(ruled, free))
    assert any(r[0] > f[0] * (1 + 1e-6) for r, f in zip(ruled, free))


def _made(runtime: str, block_recompute: list[str], pp: int = 2) -> Plan:
    hw = load_cluster("dgx-a100-80g")
    return Plan.from_dict(build_plan(model="gpt3-1.3b", cluster="dgx-a100-80g", global_batch=64,
                                     pp=pp, block_recompute=block_recompute,
                                     zero=3 if runtime == "torchtitan" else 1,
                                     runtime=runtime_setup(hw, runtime, "bf16").options))


@pytest.mark.parametrize("runtime,settings_,runs_ok", [
    ("megatron", (["full"] * 3 + ["none"] * 9) * 2, True),  # --recompute-num-layers 3
    ("megatron", ["full"] * 3 + ["none"] * 21, False),  # the first stage only
    ("megatron", ["selective"] * 24, True),
    ("torchtitan", ["op"] * 24, True),
    ("torchtitan", ["none", "none", "full"] * 8, True),  # 0.2.2's selective_ac_option "3"
    ("torchtitan", ["op"] * 18 + ["none"] * 6, False),
    ("deepspeed", ["full"] * 3 + ["none"] * 21, True),  # any block it wraps
])
def test_check_runtime_names_a_mix_the_rule_cannot_express(runtime, settings_, runs_ok):
    problems = [p.message for p in runtime_problems(_made(runtime, settings_),
                                                    profiles.profile(runtime))]
    named = [m for m in problems if "per-block recomputation" in m]
    assert (not named) is runs_ok, problems
    if runtime == "megatron" and not runs_ok:
        assert "rank 0: full 3; rank 1: -" in named[0] and "--recompute-num-layers N" in named[0]
