"""The search's memory gate (planner/solve/gate.py, ``plan --memory-confidence``).

With a gate at the 90 % quantile of the peak-memory band, the solver's plan must be the
exhaustive enumeration's best under the same gate (planner/solve/bruteforce.py applies it
placement by placement, from the set of recomputation policies each one uses); the gate must
change plans where memory binds; Q = 0.5 must be the search without a gate; and a plan made at
Q must pass ``check`` at Q (its default gate then), where the plan made at 0.5 fails it.
"""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from clusters import load_cluster
from planner.calibration.regimes import recompute_kinds
from planner.calibration.store import shipped
from planner.check import memory_verdict
from planner.errors import ErrorKind, PlannerError
from planner.hardware import GIB
from planner.solve.bruteforce import brute_force
from planner.solve.gate import memory_gate
from planner.solve.headroom import NO_HEADROOM
from planner.solve.search import SearchOptions, search
from planner.solve.space import Pins
from planner.strategy import Recompute
from test_solver_oracle import N3, N5, N6, REL, native, shardplan

TINY = load_cluster("tiny")


def ampere(memory_gib: float, nodes: int = 1, gpus_per_node: int = 1):
    """The tiny cluster with an A100-named GPU: the ampere memory bands, whose runs all used
    full recomputation, so that plans without it (none, selective) get the widened band."""
    return replace(TINY, num_nodes=nodes, gpus_per_node=gpus_per_node,
                   gpu=replace(TINY.gpu, name="a100-tiny", memory_gib=memory_gib))


def gated(model, cluster, confidence=0.9):
    return memory_gate(confidence, None, model, cluster, SearchOptions().runtime.profile)


def solve(model, cluster, global_batch, pins=Pins(), confidence=0.9):
    try:
        result = search(model, cluster, global_batch, model.default_seq_len, "bf16", pins,
                        SearchOptions(memory_headroom=NO_HEADROOM,
                                      memory_gate=gated(model, cluster, confidence)))
    except PlannerError as error:
        assert error.kind is ErrorKind.DOES_NOT_FIT, error
        return None
    assert result.record.status == "OPTIMAL", result.record
    return result.best


def oracle(model, cluster, global_batch, pins=Pins(), confidence=0.9):
    return brute_force(model, cluster, global_batch, model.default_seq_len, "bf16", pins,
                       headroom=NO_HEADROOM, gate=gated(model, cluster, confidence)).best


def gate_gib(ev, confidence=0.9) -> float:
    """The peak at the ``confidence`` quantile, as ``check`` computes it."""
    return memory_verdict(ev, confidence, shipped())[2]


# (id, model, cluster memory GiB, nodes, GPUs per node, global batch, pins)
CASES = [
    ("6-blocks-2-gpus", N6, 0.4, 1, 2, 8, Pins()),
    ("6-blocks-2-gpus-tight", N6, 0.34, 1, 2, 8, Pins()),
    ("5-blocks-4-gpus", N5, 0.2, 1, 4, 8, Pins()),
    ("5-blocks-4-gpus-pp2", N5, 0.25, 1, 4, 8, Pins(pp=2)),
    ("3-blocks-1-gpu", N3, 0.5, 1, 1, 4, Pins()),
    ("3-blocks-1-gpu-tight", N3, 0.48, 1, 1, 4, Pins()),
    ("3-blocks-1-gpu-nothing-passes", N3, 0.44, 1, 1, 4, Pins()),
    ("4-blocks-2-gpus-v2", native(4, hidden=256, seq_len=1024), 0.3, 1, 2, 8,
     Pins(pp=2, virtual_stages=2)),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_solver_matches_exhaustive_enumeration_under_the_gate(case):
    _, model, memory, nodes, per_node, gbs, pins = case
    cluster = ampere(memory, nodes, per_node)
    got, want = solve(model, cluster, gbs, pins), oracle(model, cluster, gbs, pins)
    assert (got is None) == (want is None), (got and got.config, want and want.config)
    if got is None:
        return
    assert got.step_time_s == pytest.approx(want.step_time_s, rel=REL), \
        (got.config, got.placement, want.config, want.placement)
    for ev in (got, want):  # both fit the gate as check computes it
        assert gate_gib(ev) * GIB <= cluster.memory_bytes_per_gpu * (1 + 1e-12)


def test_the_gate_binds_and_the_split_by_recomputation_matters():
    """On the tight instances the gated optimum is slower than the point one (the gate
    changes the plan), and at least one gated optimum keeps a policy the band widens for
    (none or selective): a gate that took the widest factor for every configuration would
    have lost it."""
    slower = widened = 0
    for _, model, memory, nodes, per_node, gbs, pins in CASES:
        cluster = ampere(memory, nodes, per_node)
        point, gated_best = oracle(model, cluster, gbs, pins, 0.5), oracle(model, cluster, gbs,
                                                                          pins)
        if point is None or gated_best is None:
            continue
        slower += gated_best.step_time_s > point.step_time_s * (1 + 1e-6)
        gate = gated(model, cluster)
        kinds = recompute_kinds(model, gated_best.placement)
        widened += gate.factor(gated_best.config, kinds) > gate.factor(gated_best.config,
                                                                       ("full",))
    assert slower >= 2
    assert widened >= 1


def test_half_is_the_search_without_a_gate():
    cluster = ampere(0.4, 1, 2)
    plain = search(N6, cluster, 8, N6.default_seq_len, "bf16", Pins(),
                   SearchOptions(memory_headroom=NO_HEADROOM))
    half = search(N6, cluster, 8, N6.default_seq_len, "bf16", Pins(),
                  SearchOptions(memory_headroom=NO_HEADROOM,
                                memory_gate=gated(N6, cluster, 0.5)))
    assert half.record.as_dict() | {"solve_time_s": 0} == \
        plain.record.as_dict() | {"solve_time_s": 0}
    assert "memory_confidence" not in plain.record.as_dict()
    assert (half.best.config, half.best.placement) == (plain.best.config, plain.best.placement)


def test_a_gate_nothing_passes_says_so():
    with pytest.raises(PlannerError) as info:
        search(N3, ampere(0.3), 4, N3.default_seq_len, "bf16", Pins(recompute=Recompute.FULL),
               SearchOptions(memory_gate=gated(N3, ampere(0.3), 0.99)))
    assert info.value.kind is ErrorKind.DOES_NOT_FIT
    assert info.value.details["memory_confidence"] == 0.99
    assert any("--memory-confidence" in h for h in info.value.hints)


# --- the CLI: plan at Q, check at Q --------------------------------------------------------------

def run_cli(*args: str) -> tuple[int, str, str]:
    done = shardplan(*args)
    return done.returncode, done.stdout, done.stderr


# the dogfood instance: at 0.5 the plan peaks at 75.14 GiB of 80 and its band reaches 85.68
ARGS = ["-m", "qwen3-30b-a3b", "-c", "dgx-h100", "--nodes", "2", "--global-batch", "256",
        "--seq-len", "4096", "--time-limit", "120"]


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    out = tmp_path_factory.mktemp("gate")
    paths = {}
    for q in ("0.5", "0.9"):
        paths[q] = out / f"plan-{q}.json"
        code, _, err = run_cli("plan", *ARGS, "--memory-confidence", q, "-o", str(paths[q]))
        assert code == 0, err
    return paths


def test_plan_at_09_passes_check_at_09_and_the_point_plan_does_not(plans):
    point = json.loads(plans["0.5"].read_text())
    strict = json.loads(plans["0.9"].read_text())
    assert "memory_confidence" not in point["solver"]  # old plans keep their bytes
    assert strict["solver"]["memory_confidence"] == 0.9
    # the point plan's band reaches past the GPU; the gated one's 90 % quantile is within
    # the headroom's limit
    assert point["predicted"]["peak_memory_gib_interval"][1] > 80
    assert strict["predicted"]["peak_memory_gib"] < point["predicted"]["peak_memory_gib"]
    code, out, _ = run_cli("check", str(plans["0.5"]), "--memory-confidence", "0.9", "--json")
    assert code == 1, out
    code, out, _ = run_cli("check", str(plans["0.9"]), "--json")  # its recorded Q
    assert code == 0, out
    report = json.loads(out)
    assert report["memory_confidence"] == 0.9
    assert report["memory_gate_gib"] <= strict["solver"]["memory_limit_gib"] * (1 + 1e-9)
    code, out, _ = run_cli("check", str(plans["0.5"]), "--json")  # recorded: none, 0.5
    assert code == 0 and json.loads(out)["memory_confidence"] == 0.5
    # an explicit --memory-confidence wins over the recorded one
    code, out, _ = run_cli("check", str(plans["0.9"]), "--memory-confidence", "0.99", "--json")
    assert json.loads(out)["memory_confidence"] == 0.99


@pytest.mark.parametrize("value", ["0.3", "1", "x"])
def test_bad_confidence_exits_2(value):
    code, _, _ = run_cli("plan", *ARGS, "--memory-confidence", value)
    assert code == 2


def test_confidence_across_pools_is_refused():
    code, _, err = run_cli("plan", "-m", "tiny", "-c", "h100-a100", "--global-batch", "8",
                           "--memory-confidence", "0.9")
    assert code == 2, err
    assert "--memory-confidence" in err


def test_the_oracles_fast_cuts_agree_with_evaluating_every_placement():
    """bruteforce's stage-by-stage cut under a gate (the loosest limit any placement may
    reach) loses nothing: the same optimum as ``evaluate`` on every placement."""
    cluster = ampere(0.5)
    fast = brute_force(N3, cluster, 4, N3.default_seq_len, "bf16", headroom=NO_HEADROOM,
                       gate=gated(N3, cluster)).best
    literal = brute_force(N3, cluster, 4, N3.default_seq_len, "bf16", headroom=NO_HEADROOM,
                          gate=gated(N3, cluster), literal=True).best
    assert fast is not None
    assert (fast.config, fast.placement) == (literal.config, literal.placement)
