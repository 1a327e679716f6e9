"""Memory headroom and the tie-break toward lower memory (planner/solve/headroom.py, search.py,
inner.py, bruteforce.py).

The search keeps ``--memory-headroom`` of every GPU free of the plan and, among plans of equal
step time, returns the leaner one: CP-SAT by a second solve that holds the step time and
minimises the peak, brute force by ranking (step time, peak memory). The brute-force agreement
with headroom runs on random instances in tests/test_solver_oracle.py; here the parts alone.
"""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from clusters import load_cluster
from conftest import run_cli
from models.native import build_native
from planner.config import ParallelConfig
from planner.cost.context import make_context
from planner.errors import ErrorKind, PlannerError
from planner.hardware import GIB
from planner.solve.bruteforce import brute_force
from planner.solve.costs import stage_problem
from planner.solve.headroom import DEFAULT_HEADROOM, NO_HEADROOM, MemoryHeadroom
from planner.solve.inner import solve_stages
from planner.solve.search import SearchOptions, search
from planner.strategy import LayerOption, Recompute

TINY = load_cluster("tiny")


def native(blocks, hidden=256, heads=4, seq_len=1024):
    return build_native({"name": f"n{blocks}", "num_layers": blocks, "hidden_size": hidden,
                         "num_heads": heads, "ffn_hidden_size": 4 * hidden, "vocab_size": 1024,
                         "seq_len": seq_len})


@pytest.mark.parametrize("text,fraction,gib", [
    ("0.05", 0.05, 0.0), ("5%", 0.05, 0.0), (" 12.5 % ", 0.125, 0.0), ("0", 0.0, 0.0),
    ("4GiB", 0.0, 4.0), ("0.5 gib", 0.0, 0.5), (0.1, 0.1, 0.0)])
def test_parse_fractions_and_amounts(text, fraction, gib):
    h = MemoryHeadroom.parse(text)
    assert (h.fraction, h.gib) == pytest.approx((fraction, gib))
    assert MemoryHeadroom.parse(h.describe()) == h  # the recorded spelling reads back


@pytest.mark.parametrize("text", ["", "abc", "-0.1", "0.6", "60%", "-1GiB", "nan", "inf",
                                  "4GB", "1e999"])
def test_parse_refuses_bad_values(text):
    with pytest.raises(PlannerError) as error:
        MemoryHeadroom.parse(text)
    assert error.value.kind is ErrorKind.INVALID_INPUT
    assert "--memory-headroom" in error.value.message


def test_limit_is_capacity_less_the_headroom():
    assert MemoryHeadroom(0.05).limit_bytes(80 * GIB) == pytest.approx(76 * GIB)
    assert MemoryHeadroom(0.0, 4.0).limit_bytes(80 * GIB) == pytest.approx(76 * GIB)
    assert MemoryHeadroom(0.0, 100.0).limit_bytes(80 * GIB) == 0.0
    assert NO_HEADROOM.limit_bytes(80 * GIB) == 80 * GIB
    assert DEFAULT_HEADROOM.describe() == "5%"


def test_search_keeps_the_headroom_and_records_it():
    model = native(6, hidden=512, heads=8)
    hw = replace(TINY, num_nodes=1, gpus_per_node=2, gpu=replace(TINY.gpu, memory_gib=0.6))
    full = search(model, hw, 8, 1024, options=SearchOptions(memory_headroom=NO_HEADROOM))
    kept = search(model, hw, 8, 1024, options=SearchOptions(memory_headroom=MemoryHeadroom(0.2)))
    capacity = hw.memory_bytes_per_gpu
    assert full.best.peak_memory_bytes > 0.8 * capacity  # the instance is memory bound ...
    assert kept.best.peak_memory_bytes <= 0.8 * capacity  # ... and the headroom holds
    assert kept.best.step_time_s > full.best.step_time_s  # at a price in time
    assert kept.record.memory_headroom == "20%"
    assert kept.record.memory_limit_gib == pytest.approx(0.8 * 0.6)
    assert kept.record.status == "OPTIMAL"
    # the oracle agrees under the same headroom
    want = brute_force(model, hw, 8, 1024, headroom=MemoryHeadroom(0.2)).best
    assert kept.best.step_time_s == pytest.approx(want.step_time_s, rel=1e-6)


def _tied_problem(lean_first: bool):
    """One stage whose two block options cost the same time and differ in memory: the
    selective option is given the no-recompute option's time terms and half (or twice) its
    stored activations."""
    model = native(4)
    hw = replace(TINY, num_nodes=1, gpus_per_node=1, gpu=replace(TINY.gpu, memory_gib=64))
    config = ParallelConfig(tp=1, pp=1, dp=1, global_batch=4, seq_len=1024, micro_batch=1)
    options = (LayerOption(Recompute.NONE), LayerOption(Recompute.SELECTIVE))
    problem = stage_problem(make_context(model, hw, config), options)
    cls = problem.classes[0]
    none = cls.costs[0]
    other = replace(none, act_stored_bytes=none.act_stored_bytes * (0.5 if lean_first else 2))
    cls = replace(cls, options=options, costs=(none, other))
    return replace(problem, classes=(cls,))


def test_equal_time_goes_to_the_leaner_option():
    picked_fat = False
    for lean_selective in (True, False):
        problem = _tied_problem(lean_selective)
        lean = Recompute.SELECTIVE if lean_selective else Recompute.NONE
        plain = solve_stages(problem, tie_break=False)
        tied = solve_stages(problem)
        assert tied.status == "OPTIMAL"
        assert tied.objective_s == pytest.approx(plain.objective_s, rel=1e-9)
        assert [o.recompute for o in tied.placement.options[1:-1]] == [lean] * 4
        picked_fat |= any(o.recompute is not lean for o in plain.placement.options[1:-1])
    assert picked_fat  # without the tie-break some order keeps a fatter option


def test_plan_cli_records_the_headroom_and_refuses_bad_values(capsys):
    def run(*args):
        return run_cli(["plan", "-m", "tiny", "-c", "tiny", "--global-batch", "16", *args],
                       capsys)

    code, stdout, stderr = run("--memory-headroom", "0.25GiB", "--json")
    assert code == 0, stderr
    doc = json.loads(stdout)
    assert doc["solver"]["memory_headroom"] == "0.25GiB"
    limit = doc["solver"]["memory_limit_gib"]
    assert limit == pytest.approx(TINY.gpu.memory_gib - 0.25)
    assert all(s["memory_gib"]["total"] <= limit + 1e-9 for s in doc["stages"])
    code, _, stderr = run("--memory-headroom", "lots")
    assert code == 2 and "--memory-headroom" in stderr
    assert "Traceback" not in stderr
