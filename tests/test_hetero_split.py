"""Stages whose data-parallel group spans pools (split stages): each replica on one pool, the
gradient reduction over the inter-pool link, the stage at its slower share's pace; the CP-SAT
model picks them where whole stages cannot make pp, and agrees with the brute-force oracle."""
from __future__ import annotations

import textwrap
from dataclasses import replace

import pytest

from clusters import load_cluster
from models import load_model
from planner.config import ParallelConfig, RuntimeOptions
from planner.cost.terms import stage_time
from planner.errors import PlannerError
from planner.hetero.bounds import (cheap_bounds, memory_time_bound, quick_bounds,
                                   slowest_stage_bound)
from planner.hetero.bruteforce import brute_force_pools
from planner.hetero.evaluate import hetero_evaluate
from planner.hetero.ilp import solve_pools
from planner.hetero.layout import StagePools, gpus_by_pool, stage_ranks, stage_shares
from planner.hetero.search import (config_splits, hetero_search, split_shapes,
                                   split_stage_counts)
from planner.hetero.terms import pool_terms
from planner.solve.search import SearchOptions
from planner.solve.space import Pins

# Two pools of 6 tiny GPUs (3 nodes of 2): a stage of 4 GPUs fits once in each and leaves 2
# GPUs on both, which one split stage (2 replicas on each pool) uses.
POOLS = textwrap.dedent("""\
    shardplan_cluster: 1
    name: two-odd
    pools:
      - name: fast
        gpu: tiny-gpu
        gpu_overrides: {memory_gib: 0.3}
        gpus_per_node: 2
        num_nodes: 3
        tiers:
          - {name: nvlink, bandwidth_gbytes_per_s: 50, latency_us: 1.0}
          - {name: ethernet, bandwidth_gbytes_per_s: 5, latency_us: 5.0}
      - name: slow
        gpu: tiny-gpu
        gpu_overrides: {memory_gib: 0.25, peak_tflops: {bf16: 4, fp16: 4}}
        gpus_per_node: 2
        num_nodes: 3
        tiers:
          - {name: nvlink, bandwidth_gbytes_per_s: 50, latency_us: 1.0}
          - {name: ethernet, bandwidth_gbytes_per_s: 5, latency_us: 5.0}
    inter_pool: {bandwidth_gbytes_per_s: 2, latency_us: 20.0}
    """)
SPLIT = (("fast", 2), ("slow", 2))


@pytest.fixture(scope="module")
def pools(tmp_path_factory):
    path = tmp_path_factory.mktemp("pools") / "two-odd.yaml"
    path.write_text(POOLS)
    return load_cluster(str(path), multi_pool=True)


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny")


def config(**kw) -> ParallelConfig:
    base = dict(tp=1, pp=3, dp=4, global_batch=16, seq_len=128, micro_batch=2)
    return ParallelConfig(**(base | kw))


def test_split_shapes_fill_the_left_over_gpus(pools):
    assert split_shapes(pools, 1, 1, 4) == [SPLIT]
    assert split_stage_counts(pools, 1, 1, 4, blocks=4) == [3]  # 1 + 1 whole, 1 split
    assert config_splits(pools, config()) == [SPLIT]
    assert config_splits(pools, config(pp=2)) == []  # whole stages make pp 2
    names = StagePools(("fast", "fast:2+slow:2", "slow"))
    assert stage_shares("fast:2+slow:2", 4) == SPLIT
    assert [list(r) for r in stage_ranks(pools, names, 4, 1)] == \
        [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert gpus_by_pool(names, 4, 1) == {"fast": 6, "slow": 6}
    for bad in ("fast:3+slow:2", "fast:2+fast:2", "fast:x+slow:2"):
        with pytest.raises(PlannerError):
            stage_shares(bad, 4)


def test_a_split_stage_runs_at_its_slower_share_and_reduces_across_pools(pools, tiny):
    cfg = config()
    terms = {t.name: t for t in pool_terms(tiny, pools, cfg, splits=[SPLIT])}
    split, fast, slow = terms["fast:2+slow:2"], terms["fast"], terms["slow"]
    assert split.gpus == (("fast", 2, 6), ("slow", 2, 6)) and split.max_stages == 1
    for ci, cls in enumerate(split.problem.classes):
        for r, x in enumerate(cls.costs):
            f, s = fast.problem.classes[ci].costs[r], slow.problem.classes[ci].costs[r]
            assert x.fwd_s == max(f.fwd_s, s.fwd_s) == s.fwd_s  # 4 vs 10 TFLOP/s
            assert x.state_bytes == f.state_bytes == s.state_bytes  # same shards
            # the gradient reduction crosses the 2 GB/s inter-pool link
            assert x.dp_reduce_s > max(f.dp_reduce_s, s.dp_reduce_s)
    assert split.inner.capacity_bytes == slow.inner.capacity_bytes < fast.inner.capacity_bytes
    # evaluate reads the same terms: a split stage is never faster than the slow pool's
    ev = hetero_evaluate(tiny, pools, cfg, StagePools(("fast", "fast:2+slow:2", "slow")))
    assert ev.gpus_per_pool() == {"fast": 6, "slow": 6}
    layers, opts = ev.stages[1].layers, ev.placement.options
    for pool in (fast, slow):  # next to a crossing on both sides, as the split stage is
        alone = stage_time(pool.config_terms(True), [pool.layer(tiny.layers[i], opts[i])
                                                     for i in layers])
        assert ev.stages[1].time_s >= alone * (1 - 1e-12)


@pytest.mark.parametrize("kw", [dict(), dict(zero_stage=1), dict(zero_stage=3),
                                dict(micro_batch=4), dict(micro_batch=1)])
def test_ilp_with_split_stages_agrees_with_evaluate_and_brute_force(pools, tiny, kw):
    cfg = config(**kw)
    splits = config_splits(pools, cfg)
    terms = pool_terms(tiny, pools, cfg, splits=splits)
    result = solve_pools(terms, cfg.pp)
    oracle = brute_force_pools(tiny, pools, cfg, splits=splits)
    assert oracle.best is not None and result.status == "OPTIMAL"
    # pp 3 needs the split stage: two whole stages at most
    assert "fast:2+slow:2" in result.stage_pools.pools
    ev = hetero_evaluate(tiny, pools, cfg, result.stage_pools, result.placement, terms=terms)
    assert ev.fits and sum(ev.gpus_per_pool().values()) == 12
    assert ev.step_time_s == pytest.approx(result.objective_s, rel=1e-6)
    assert ev.step_time_s == pytest.approx(oracle.best.step_time_s, rel=1e-6), \
        (result.stage_pools, oracle.best.stage_pools)
    # the search's bounds stay below the optimum with split stages, and its cut keeps it
    best = oracle.best.step_time_s * (1 + 1e-9)
    assert cheap_bounds(tiny, pools, cfg, RuntimeOptions(), splits)[0] <= best
    assert quick_bounds(terms, cfg.pp)[0] <= best
    assert memory_time_bound(terms, cfg.pp) <= best
    cut = solve_pools(terms, cfg.pp, min_slowest_s=slowest_stage_bound(terms, cfg.pp))
    assert cut.status == "OPTIMAL" and cut.objective_s == pytest.approx(result.objective_s,
                                                                        rel=1e-6)


def test_the_search_offers_split_stages_and_proves_its_plan(pools, tiny):
    pins = Pins(tp=1, dp=4, micro_batch=2, zero=0, sp=False)
    result = hetero_search(tiny, pools, 16, 128, pins=pins,
                           options=SearchOptions(time_limit_s=60))
    assert result.record["status"] == "OPTIMAL"
    pps = {result.best.config.pp} | {a.config.pp for a in result.alternatives}
    best = result.best
    # every pp the space holds was weighed: 1 and 2 whole stages, 3 with the split stage
    three = hetero_search(tiny, pools, 16, 128, pins=replace(pins, pp=3),
                          options=SearchOptions(time_limit_s=60)).best
    assert "fast:2+slow:2" in three.stage_pools.pools
    assert best.step_time_s <= three.step_time_s * (1 + 1e-9) and pps


def test_a_split_plan_file_checks_exports_and_round_trips(tmp_path, capsys):
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from conftest import run_cli
    from planner.plan_io import load_plan
    from planner.plan_types import Plan

    cluster = tmp_path / "two-odd.yaml"
    cluster.write_text(POOLS)
    out = tmp_path / "plan.json"
    pins = [x for kv in ("tp=1", "dp=4", "pp=3", "micro_batch=2") for x in ("--pin", kv)]
    code, _, err = run_cli(["plan", "-m", "tiny", "-c", cluster, "--global-batch", "16",
                            "--time-limit", "60", "-o", out, "--json", *pins], capsys)
    assert code == 0, err
    doc = load_plan(out)  # schema-valid
    assert "fast:2+slow:2" in doc["parallelism"]["stage_pools"]
    assert {r["name"]: r["gpus_used"] for r in doc["cluster"]["pools"]} == {"fast": 6, "slow": 6}
    split = next(s for s in doc["stages"] if s["pool"] == "fast:2+slow:2")
    assert split["capacity_gib"] == 0.25 and split["num_gpus"] == 4
    plan = Plan.from_dict(doc)
    assert plan.to_dict() == doc
    assert plan.evaluate().step_time_s == pytest.approx(doc["predicted"]["step_time_s"],
                                                        rel=1e-5)
    code, report, _ = run_cli(["check", out, "--json"], capsys)
    assert code == 0 and json.loads(report)["ok"], report
    code, _, err = run_cli(["export", out, "-f", "megatron"], capsys)
    assert code == 0 and "node ranks" in err


def test_the_search_across_pools_keeps_the_memory_headroom(tmp_path, tiny):
    import sys
    from pathlib import Path

    from planner.solve.headroom import MemoryHeadroom

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_hetero_solver import POOLS as TIGHT  # 0.16 GiB GPUs: memory binds

    path = tmp_path / "two-tiny.yaml"
    path.write_text(TIGHT)
    tight = load_cluster(str(path), multi_pool=True)
    runs = {}
    for fraction in (0.0, 0.1):
        result = hetero_search(tiny, tight, 16, 128, pins=Pins(tp=1, micro_batch=2),
                               options=SearchOptions(time_limit_s=60, memory_headroom=
                                                     MemoryHeadroom(fraction=fraction)))
        best = result.best
        assert result.record["status"] == "OPTIMAL"
        assert result.record["memory_headroom"] == f"{fraction * 100:g}%"
        runs[fraction] = (best.step_time_s, max(s.memory.total / cap for s, cap in
                                                zip(best.stages, best.capacity_bytes)))
    assert runs[0.0][1] > 0.9 >= runs[0.1][1]  # the headroom binds: 10 % of every pool kept
    assert runs[0.1][0] > runs[0.0][0]
