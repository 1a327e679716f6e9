"""Planning across pools: the evaluation composes the one-pool cost terms, the CP-SAT model with
the stage-to-pool decision agrees with it and with a brute-force oracle, and the search beats
both one-pool baselines."""
from __future__ import annotations

import textwrap
from dataclasses import replace

import pytest

from clusters import load_cluster
from models import load_model
from planner.config import ParallelConfig, RuntimeOptions
from planner.cost.model import evaluate
from planner.errors import PlannerError
from planner.hetero.bounds import (cheap_bounds, memory_time_bound, quick_bounds,
                                   slowest_stage_bound)
from planner.hetero.bruteforce import brute_force_pools, contiguous_assignments
from planner.hetero.evaluate import hetero_evaluate
from planner.hetero.ilp import solve_pools
from planner.hetero.layout import StagePools, stage_ranks
from planner.hetero.search import hetero_search
from planner.hetero.terms import pool_terms
from planner.solve.search import SearchOptions, search
from planner.solve.space import Pins
from planner.strategy import uniform

# Two fictional pools of the tiny test GPU: "fast" at 10 TFLOP/s, "slow" at 4, little memory so
# that recomputation and the split matter.
POOLS = textwrap.dedent("""\
    shardplan_cluster: 1
    name: two-tiny
    pools:
      - name: fast
        gpu: tiny-gpu
        gpu_overrides: {memory_gib: 0.16}
        gpus_per_node: 2
        num_nodes: 2
        tiers:
          - {name: nvlink, bandwidth_gbytes_per_s: 50, latency_us: 1.0}
          - {name: ethernet, bandwidth_gbytes_per_s: 5, latency_us: 5.0}
      - name: slow
        gpu: tiny-gpu
        gpu_overrides: {memory_gib: 0.16, peak_tflops: {bf16: 4, fp16: 4}}
        gpus_per_node: 2
        num_nodes: 2
        tiers:
          - {name: nvlink, bandwidth_gbytes_per_s: 50, latency_us: 1.0}
          - {name: ethernet, bandwidth_gbytes_per_s: 5, latency_us: 5.0}
    inter_pool: {bandwidth_gbytes_per_s: 2, latency_us: 20.0}
    """)


@pytest.fixture(scope="module")
def pools(tmp_path_factory):
    path = tmp_path_factory.mktemp("pools") / "two-tiny.yaml"
    path.write_text(POOLS)
    return load_cluster(str(path), multi_pool=True)


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny")


def config(**kw) -> ParallelConfig:
    base = dict(tp=1, pp=2, dp=2, global_batch=16, seq_len=128, micro_batch=2)
    return ParallelConfig(**(base | kw))


def test_one_pool_evaluation_is_the_one_pool_cost_model():
    model = load_model("gpt3-13b")
    cluster = load_cluster("dgx-h100", nodes=8)
    for zero, recompute in ((1, "full"), (3, "selective"), (0, "none")):
        cfg = ParallelConfig(tp=8, pp=4, dp=2, global_batch=64, seq_len=2048, zero_stage=zero,
                             sp=True)
        placement = uniform(model, cfg, recompute)
        one = evaluate(model, cluster, cfg, placement)
        het = hetero_evaluate(model, cluster, cfg, StagePools((cluster.name,) * 4), placement)
        assert het.step_time_s == pytest.approx(one.step_time_s, rel=1e-12)
        assert [s.memory.total for s in het.stages] == \
            pytest.approx([s.memory.total for s in one.stages], rel=1e-12)


def test_stage_ranks_are_pool_major_and_contiguous(pools):
    pp = StagePools(("slow", "fast", "slow"))
    assert [list(r) for r in stage_ranks(pools, pp, 2, 1)] == [[4, 5], [0, 1], [6, 7]]
    assert pp.crossings() == (True, True) and pp.next_to_crossing(0)


def test_a_stage_costs_its_pools_gpu(pools, tiny):
    cfg = config()
    terms = {t.name: t for t in pool_terms(tiny, pools, cfg)}
    fast = terms["fast"].problem.classes[0].costs[0]
    slow = terms["slow"].problem.classes[0].costs[0]
    assert slow.fwd_s > 1.3 * fast.fwd_s  # 4 vs 10 TFLOP/s; memory-bound parts are equal
    assert terms["fast"].max_stages == 2 and terms["slow"].max_stages == 2
    # next to a crossing the boundary pays the 2 GB/s inter-pool link
    assert terms["fast"].cross.boundary_s > terms["slow"].inner.boundary_s


# calibrated runtime behaviour (NCCL slowing compute, a per-micro-batch overhead, gradient
# reduce behind backward, parameter gather not overlapped): the per-stage constraints are
# planner/solve/stage_model.py's, shared with the one-pool model
CALIBRATED = RuntimeOptions(comm_slowdown=0.3, micro_batch_overhead_s=2e-4,
                            overlap_grad_reduce=True, overlap_param_gather=False)


@pytest.mark.parametrize("kw,runtime", [
    (dict(), RuntimeOptions()), (dict(zero_stage=2), RuntimeOptions()),
    (dict(zero_stage=3), RuntimeOptions()), (dict(micro_batch=4), RuntimeOptions()),
    (dict(pp=3, dp=1), RuntimeOptions()), (dict(), CALIBRATED),
    (dict(zero_stage=3), CALIBRATED), (dict(zero_stage=1, pp=3, dp=1), CALIBRATED)])
def test_ilp_agrees_with_evaluate_and_brute_force(pools, tiny, kw, runtime):
    cfg = config(**kw)
    terms = pool_terms(tiny, pools, cfg, runtime)
    result = solve_pools(terms, cfg.pp)
    oracle = brute_force_pools(tiny, pools, cfg, runtime)
    if oracle.best is None:
        assert result.status == "INFEASIBLE"
        return
    assert result.status == "OPTIMAL"
    ev = hetero_evaluate(tiny, pools, cfg, result.stage_pools, result.placement, runtime,
                         terms=terms)
    assert ev.fits
    assert ev.step_time_s == pytest.approx(result.objective_s, rel=1e-6)
    assert ev.step_time_s == pytest.approx(oracle.best.step_time_s, rel=1e-6), \
        (result.stage_pools, oracle.best.stage_pools, oracle.placements)
    # the search's cut on the slowest stage keeps the optimum
    cut = solve_pools(terms, cfg.pp, min_slowest_s=slowest_stage_bound(terms, cfg.pp))
    assert cut.status == "OPTIMAL"
    assert cut.objective_s == pytest.approx(result.objective_s, rel=1e-6)


def test_ilp_with_stragglers_and_fixed_pools_matches_brute_force(pools, tiny):
    cfg = config(pp=3, dp=1)
    fixed = StagePools(("slow", "slow", "fast"))
    slow = (1.0, 2.5, 1.0)
    terms = pool_terms(tiny, pools, cfg)
    result = solve_pools(terms, 3, slowdown=slow, fixed_pools=fixed)
    oracle = brute_force_pools(tiny, pools, cfg, slowdown=slow, fixed_pools=fixed)
    assert result.stage_pools == fixed
    ev = hetero_evaluate(tiny, pools, cfg, fixed, result.placement, slowdown=slow, terms=terms)
    assert ev.step_time_s == pytest.approx(oracle.best.step_time_s, rel=1e-6)
    # the slowed stage gets the fewest blocks
    counts = [len([i for i in s.layers if tiny.layers[i].kind.value == "block"])
              for s in ev.stages]
    assert counts[1] == min(counts)


def test_churn_budget_is_respected(pools, tiny):
    cfg = config(pp=3, dp=1)
    terms = pool_terms(tiny, pools, cfg)
    fixed = StagePools(("slow", "slow", "fast"))
    free = solve_pools(terms, 3, slowdown=(1.0, 3.0, 1.0), fixed_pools=fixed)
    moved_free = _moved(free.placement, tiny, (2, 1, 1))
    assert moved_free >= 1
    held = solve_pools(terms, 3, slowdown=(1.0, 3.0, 1.0), fixed_pools=fixed,
                       old_counts=(2, 1, 1), max_moved=0)
    assert _moved(held.placement, tiny, (2, 1, 1)) == 0
    assert held.objective_s >= free.objective_s


def _moved(placement, model, old_counts) -> int:
    blocks = [i for i, layer in enumerate(model.layers) if layer.kind.value == "block"]
    old = [s for s, k in enumerate(old_counts) for _ in range(k)]
    return sum(1 for b, o in zip(blocks, old) if placement.stage[b] != o)


def test_bounds_are_below_the_optimum(pools, tiny):
    for kw in (dict(), dict(zero_stage=3), dict(pp=3, dp=1), dict(micro_batch=4)):
        cfg = config(**kw)
        terms = pool_terms(tiny, pools, cfg)
        oracle = brute_force_pools(tiny, pools, cfg)
        if oracle.best is None:
            continue
        best = oracle.best.step_time_s
        assert quick_bounds(terms, cfg.pp)[0] <= best * (1 + 1e-9)
        assert memory_time_bound(terms, cfg.pp) <= best * (1 + 1e-9)
        assert slowest_stage_bound(terms, cfg.pp) <= \
            max(s.time_s for s in oracle.best.stages) * (1 + 1e-9)
        assert cheap_bounds(tiny, pools, cfg, oracle.best.options)[0] <= best * (1 + 1e-9)


def test_contiguous_assignments_respect_slots():
    got = {a.pools for a in contiguous_assignments(["a", "b"], [1, 2], 3)}
    assert got == {("a", "b", "b"), ("b", "b", "a")}


REAL = textwrap.dedent("""\
    shardplan_cluster: 1
    name: one-h100-two-a100
    pools:
      - {name: h100, preset: dgx-h100, num_nodes: 1}
      - {name: a100, preset: dgx-a100-80g, num_nodes: 2}
    inter_pool: {bandwidth_gbytes_per_s: 100, latency_us: 10.0, efficiency: 0.9}
    """)


def test_search_beats_both_one_pool_baselines(tmp_path):
    path = tmp_path / "real.yaml"
    path.write_text(REAL)
    cluster = load_cluster(str(path), multi_pool=True)
    model = load_model("gpt3-2.7b")
    options = SearchOptions(time_limit_s=120)
    result = hetero_search(model, cluster, 64, 2048, pins=Pins(tp=2, zero=1), options=options)
    assert result.record["status"] == "OPTIMAL"
    used = result.best.gpus_per_pool()
    assert used["h100"] > 0 and used["a100"] > 0
    # the H100 stages take more blocks than the A100 stages: balanced by speed
    blocks = {name: [] for name in used}
    for stage, name in zip(result.best.stages, result.best.stage_pools.pools):
        blocks[name].append(sum(1 for i in stage.layers
                                if model.layers[i].kind.value == "block"))
    assert min(blocks["h100"]) > max(blocks["a100"])
    fast_only = search(model, cluster.pools[0].as_cluster(), 64, 2048, options=options)
    slow = cluster.pools[1]
    all_slow = search(model, slow.as_cluster(num_nodes=cluster.num_gpus // slow.gpus_per_node),
                      64, 2048, options=options)
    assert result.best.step_time_s < 0.95 * fast_only.best.step_time_s
    assert result.best.step_time_s < 0.95 * all_slow.best.step_time_s


def test_search_refuses_experts_across_pools(pools):
    moe = load_model("tiny")
    mlp = replace(moe.layers[1].mlp, num_experts=4, top_k=2)
    layers = tuple(replace(layer, mlp=mlp) if layer.mlp else layer for layer in moe.layers)
    with pytest.raises(PlannerError, match="mixture-of-experts"):
        hetero_search(replace(moe, layers=layers), pools, 16, 128)


def test_plan_pools_cli_is_deterministic_json(tmp_path, capsys):
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from timeouts import deadline
    from cli.main import main

    path = tmp_path / "real.yaml"
    path.write_text(REAL)
    argv = ["plan-pools", "-m", "gpt3-2.7b", "-c", str(path), "--global-batch", "64",
            "--pin", "tp=2", "--pin", "zero=1", "--json"]
    outs = []
    for _ in range(2):
        with pytest.raises(SystemExit) as done, deadline(120):
            main(argv)
        out, _ = capsys.readouterr()
        assert done.value.code == 0
        outs.append(out)
    assert outs[0] == outs[1]
    doc = json.loads(outs[0])
    assert doc["kind"] == "shardplan-pool-plan" and doc["solver"]["status"] == "OPTIMAL"
    assert set(doc["parallelism"]["stage_pools"]) == {"h100", "a100"}
    assert all(s["memory_gib"]["total"] <= s["capacity_gib"] for s in doc["stages"])
    with pytest.raises(SystemExit) as done:
        main(["plan-pools", "-m", "gpt3-2.7b", "-c", "no-such-cluster", "--global-batch", "64",
              "--json"])
    assert done.value.code == 2


def test_plan_pools_searches_what_plan_searches(tmp_path, capsys):
    """``plan-pools`` is documented as ``plan``'s search across pools, as a report: same inputs,
    same configuration and step time. It searched with the bare RuntimeOptions() (no runtime
    profile, no calibrated per-pool efficiencies): llama-3.1-70b on h100-a100-1024 gave tp 4 pp 4
    at 6.098 s where plan finds tp 8 pp 2 at 5.568 s (and costs tp 4 pp 4 at 5.692 s)."""
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from timeouts import deadline
    from cli.main import main

    path = tmp_path / "real.yaml"
    path.write_text(REAL)
    common = ["-m", "gpt3-2.7b", "-c", str(path), "--global-batch", "64", "--pin", "tp=2",
              "--pin", "zero=1", "--json"]
    docs = []
    for argv in (["plan-pools", *common], ["plan", *common]):
        with pytest.raises(SystemExit) as done, deadline(120):
            main(argv)
        assert done.value.code == 0
        docs.append(json.loads(capsys.readouterr().out))
    pools, plan = docs
    assert pools["predicted"]["step_time_s"] == pytest.approx(plan["predicted"]["step_time_s"],
                                                              rel=1e-6)
    for key in ("tp", "pp", "dp", "micro_batch"):
        assert pools["parallelism"][key] == plan["parallelism"][key], key


@pytest.mark.parametrize("runtime", ["deepspeed", "torchtitan"])
def test_plan_across_pools_searches_only_what_the_runtime_runs(tmp_path, capsys, runtime):
    """plan --runtime R on a multi-pool cluster keeps to what R runs (README: 'search only what
    that runtime runs'), so check --runtime R passes its plan. gpt3-2.7b on h100-a100 gave
    deepspeed tp 2 with sequence parallelism and torchtitan ZeRO-1, both failed by check."""
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from timeouts import deadline
    from cli.main import main

    out = tmp_path / "plan.json"
    with pytest.raises(SystemExit) as done, deadline(120):
        main(["plan", "-m", "gpt3-2.7b", "-c", "h100-a100", "--global-batch", "64",
              "--runtime", runtime, "-o", str(out), "--time-limit", "60"])
    assert done.value.code == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        main(["check", str(out), "--runtime", runtime, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert done.value.code == 0, report.get("problems")


def test_plan_across_pools_keeps_to_the_runtimes_recompute_policies(capsys):
    """A recompute pin the runtime lacks is refused across pools as on one pool (exit 2); it
    planned deepspeed with selective recomputation, which check --runtime deepspeed fails. The
    unpinned search offers only the runtime's policies."""
    import json

    from cli.main import main
    from planner.profiles import profile

    with pytest.raises(SystemExit) as done:
        main(["plan", "-m", "gpt3-2.7b", "-c", "h100-a100", "--global-batch", "64",
              "--runtime", "deepspeed", "--pin", "recompute=selective", "--json"])
    assert done.value.code == 2
    assert "runtime deepspeed has no such policy" in json.loads(
        capsys.readouterr().out)["error"]["message"]
    from planner.hetero.search import _options
    assert {o.recompute.value for o in _options(Pins(), profile("deepspeed"))} == {"none",
                                                                                   "full"}


def test_no_configuration_across_pools_says_why_not_that_it_does_not_fit(capsys):
    """--runtime fsdp (no PP, no TP) leaves no configuration across h100-a100: the error says
    so and names what the runtime lacks; it said 'no plan ... fits the pools (0
    configurations, 0 past the memory bound)' and to add GPUs. Exit 1 as before (as on one
    pool)."""
    import json

    from cli.main import main

    with pytest.raises(SystemExit) as done:
        main(["plan", "-m", "gpt3-2.7b", "-c", "h100-a100", "--global-batch", "64",
              "--runtime", "fsdp", "--json"])
    assert done.value.code == 1
    error = json.loads(capsys.readouterr().out)["error"]
    assert "no configuration across the pools of 'h100-a100' is valid" in error["message"]
    assert "under runtime fsdp (no pipeline parallelism, no tensor parallelism)" in \
        error["message"]


def test_pool_solves_run_under_the_process_signal_policy(tmp_path, capsys, monkeypatch):
    """The pool ILP's CP-SAT solves go through planner.cpsat.solve, as the single-pool search's
    do: CP-SAT's own SIGINT handler would turn Ctrl-C inside a plan-pools / replan solve into
    "time limit reached" (a plan, exit 0). Before, planner.hetero.ilp called solver.solve."""
    from planner import cpsat
    from cli.main import main

    calls = []
    real = cpsat.solve

    def counted(solver, model):
        status = real(solver, model)
        calls.append(solver.parameters.catch_sigint_signal)  # as the solve ran
        return status

    monkeypatch.setattr(cpsat, "solve", counted)
    path = tmp_path / "real.yaml"
    path.write_text(REAL)
    with pytest.raises(SystemExit) as done:
        main(["plan-pools", "-m", "gpt3-2.7b", "-c", str(path), "--global-batch", "64",
              "--pin", "tp=2", "--pin", "zero=1", "--pin", "pp=2", "--json"])
    capsys.readouterr()
    assert done.value.code == 0
    assert calls and not any(calls)  # every pool solve, CP-SAT's handler off
