"""``plan --fallbacks K``: the re-plans for the K most likely failure classes are stored in the
plan file, equal what ``replan`` gives for the same failure, stay within the churn budget, and
``check`` re-validates them."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from clusters import load_cluster
from planner.config import ParallelConfig
from planner.hetero.fallbacks import FAILURE_CLASSES, failure_ranks
from planner.hetero.replan import replan
from planner.plan_io import load_plan
from planner.plan_types import Plan

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import edited, run_cli  # noqa: E402

PLAN = ["plan", "-m", "gpt3-6.7b", "-c", "dgx-h100", "--nodes", "4", "--global-batch", "64",
        "--time-limit", "60", "--pin", "virtual_stages=1"]


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fallbacks")
    from cli.main import main

    out = {}
    for name, extra in (("any", ["--fallbacks", "3"]),
                        ("held", ["--fallbacks", "2", "--fallback-max-moved-layers", "0"])):
        target = folder / f"{name}.json"
        with pytest.raises(SystemExit) as done:
            main(PLAN + extra + ["-o", str(target), "--json"])
        assert done.value.code == 0
        out[name] = target
    return out


def test_failure_classes_follow_the_fabric():
    cluster = load_cluster("dgx-h100", nodes=4)
    config = ParallelConfig(tp=8, pp=2, dp=2, global_batch=64, seq_len=2048)
    assert failure_ranks(cluster, config, "gpu") == [0]
    assert failure_ranks(cluster, config, "node") == list(range(8))
    # one NIC per GPU, rail-optimized leaves: leaf 0 of scalable unit 0 is behind GPU 0 of
    # each of its nodes (all 4 nodes here: the unit is 32 nodes)
    assert failure_ranks(cluster, config, "switch") == [0, 8, 16, 24]


def test_fallbacks_are_stored_and_equal_replan(planned):
    doc = load_plan(planned["any"])
    plan = Plan.from_dict(doc)
    assert plan.to_dict() == doc  # a recorded section: the round trip stays exact
    entries = doc["fallbacks"]
    assert [e["failure"] for e in entries] == list(FAILURE_CLASSES)
    for entry in entries:
        if entry["status"] != "ok":
            assert entry["reason"]
            continue
        direct = replan(plan.model, plan.cluster, plan.config, plan.placement, plan.runtime,
                        failed=entry["failed_ranks"])
        assert entry["predicted"]["fits"]
        assert entry["predicted"]["step_time_s"] == pytest.approx(
            direct.chosen.step_time_s, rel=1e-5)
        assert entry["replan"]["gpus_used"] == direct.chosen.config.num_gpus
        assert entry["parallelism"]["dp"] * entry["parallelism"]["tp"] * \
            entry["parallelism"]["pp"] * entry["parallelism"]["cp"] <= \
            plan.config.num_gpus - len(entry["failed_ranks"])
    assert entries[0]["status"] == "ok"


def test_fallbacks_keep_the_churn_budget(planned):
    for entry in load_plan(planned["held"])["fallbacks"]:
        assert entry["max_moved_layers"] == 0
        if entry["status"] == "ok":
            assert entry["replan"]["moved_layers"] == 0


def test_check_validates_the_fallbacks(planned, capsys, tmp_path):
    path = planned["any"]
    code, out, _ = run_cli(["check", path, "--json"], capsys)
    assert code == 0 and json.loads(out)["ok"]
    doc = load_plan(path)
    # a fallback that needs more GPUs than survive its failure
    bad = edited(doc, lambda d: d["fallbacks"][0]["parallelism"].update(
        dp=d["fallbacks"][0]["parallelism"]["dp"] * 4,
        global_batch=d["fallbacks"][0]["parallelism"]["global_batch"] * 4))
    target = tmp_path / "bad.json"
    target.write_text(json.dumps(bad))
    code, out, _ = run_cli(["check", target, "--json"], capsys)
    report = json.loads(out)
    assert code == 1
    assert any(p["code"] == "fallback" and "gpu failure" in p["message"]
               for p in report["problems"])
    # a fallback that no longer fits memory: no tensor parallelism, no recomputation, the
    # whole batch in one micro-batch
    def heavier(d):
        f = d["fallbacks"][1]
        f["recompute"] = ["none" for _ in f["recompute"]]
        p = f["parallelism"]
        p.update(tp=1, sp=False, micro_batch=p["global_batch"] // p["dp"])
    target.write_text(json.dumps(edited(doc, heavier)))
    code, out, _ = run_cli(["check", target, "--json"], capsys)
    report = json.loads(out)
    assert code == 1 and any("node failure" in p["message"] and "GiB" in p["message"]
                             for p in report["problems"] if p["code"] == "fallback")


def test_fallbacks_of_a_plan_across_pools_equal_replan_and_are_checked(tmp_path, capsys):
    from test_hetero_solver import POOLS

    cluster = tmp_path / "pools.yaml"
    cluster.write_text(POOLS.replace("memory_gib: 0.16", "memory_gib: 0.3"))
    out = tmp_path / "plan.json"
    pins = [x for kv in ("tp=1", "dp=4", "pp=2", "micro_batch=2") for x in ("--pin", kv)]
    code, _, err = run_cli(["plan", "-m", "tiny", "-c", cluster, "--global-batch", "16",
                            "--time-limit", "60", "--fallbacks", "2", "-o", out, "--json",
                            *pins], capsys)
    assert code == 0, err
    doc = load_plan(out)
    plan = Plan.from_dict(doc)
    assert plan.across_pools and sorted(plan.stage_pools) == ["fast", "slow"]
    gpu, node = doc["fallbacks"]
    # runtime rank 0 is stage 0's first GPU; its node (2 GPUs) holds replicas 0 and 1 of
    # that stage, which leave: dp 4 -> 2 on one node of each pool
    assert gpu["failed_ranks"] == [0] and node["failed_ranks"] == [0, 1]
    for entry in (gpu, node):
        assert entry["status"] == "ok" and entry["parallelism"]["dp"] == 2
        assert entry["pool_nodes"] == {"fast": 1, "slow": 1}
        assert sorted(entry["stage_pools"]) == ["fast", "slow"]
    again = replan(plan.model, plan.cluster, plan.config, plan.placement, plan.runtime,
                   failed=[0], stage_pools=plan.stage_pools)
    assert again.chosen.step_time_s == pytest.approx(gpu["predicted"]["step_time_s"], rel=1e-4)
    assert set(again.chosen.moved_state_by_link) <= {"nvlink", "ethernet", "inter_pool"}
    code, report, _ = run_cli(["check", out, "--json"], capsys)
    assert code == 0 and json.loads(report)["ok"], report
    # `shardplan replan` on the plan across pools writes a checkable plan across the survivors
    new = tmp_path / "new.json"
    code, printed, err = run_cli(["replan", out, "--failed", "0", "-o", new, "--json"], capsys)
    assert code == 0, err
    assert json.loads(printed)["replan"]["failed_ranks"] == [0]
    code, report, _ = run_cli(["check", new, "--json"], capsys)
    assert code == 0 and json.loads(report)["ok"], report
    bad = edited(doc, lambda d: d["fallbacks"][0]["parallelism"].update(dp=8, global_batch=32))
    target = tmp_path / "bad.json"
    target.write_text(json.dumps(bad))
    code, report, _ = run_cli(["check", target, "--json"], capsys)
    assert code == 1 and any(p["code"] == "fallback" and "gpu failure" in p["message"]
                             for p in json.loads(report)["problems"])


def test_fallbacks_keep_the_plans_headroom_or_say_so_and_are_shown(tmp_path, capsys):
    """A re-plan chose among options under the GPU's whole memory, while the plan was searched
    under --memory-headroom (5 %: 76 GiB of 80): llama-3.1-8b on 16 H100, gbs 64, stored a
    'gpu' fallback (drop-replicas, dp 2) peaking at 78.99 GiB (98.7 % of the GPU) without a
    word, and neither plan nor show printed the fallbacks at all."""
    import json

    from conftest import run_cli

    path = tmp_path / "plan.json"
    code, _, err = run_cli(["plan", "-m", "llama-3.1-8b", "-c", "dgx-h100", "--nodes", "2",
                            "--global-batch", "64", "--fallbacks", "1", "-o", path], capsys)
    assert code == 0, err
    doc = json.loads(path.read_text())
    limit = doc["solver"]["memory_limit_gib"]
    (gpu,) = doc["fallbacks"]
    assert gpu["status"] == "ok"
    if gpu["predicted"]["peak_memory_gib"] > limit:  # no option within the headroom: said
        (note,) = gpu["replan"]["notes"]
        assert f"above the {limit:g} GiB the plan was searched under" in note
    code, _, err = run_cli(["show", path], capsys)
    text = " ".join(err.split())
    assert code == 0 and "Fallbacks" in text and "drop-replicas" in text
    assert "note: gpu: no re-plan keeps the plan's memory headroom" in text


def test_a_replan_prefers_one_within_the_headroom(tmp_path):
    """Given the limit the plan was searched under, a re-plan within it wins over a faster one
    above it, and the note names the faster one; without any within it, the fastest is kept
    and said to exceed it."""
    from test_hetero_replan import plan_file

    from planner.hetero.replan import replan
    from planner.plan_types import Plan

    old = Plan.load(plan_file(tmp_path))
    free = replan(old.model, old.cluster, old.config, old.placement, old.runtime, failed=[5],
                  allow_batch_change=True)
    peaks = sorted(o.evaluation.peak_memory_bytes / 2**30 for o in free.considered
                   if o.evaluation.fits)
    fastest = free.chosen.evaluation.peak_memory_bytes / 2**30
    below = replan(old.model, old.cluster, old.config, old.placement, old.runtime, failed=[5],
                   allow_batch_change=True, memory_limit_gib=0.5 * peaks[0])
    assert below.chosen.strategy == free.chosen.strategy
    assert any("no re-plan keeps the plan's memory headroom" in n for n in below.notes)
    # drop-replicas (0.326 s, 5.50 GiB) vs drop-replicas+rebalance (0.315 s, 5.72 GiB)
    roomier = [p for p in peaks if p < fastest]
    assert roomier
    limited = replan(old.model, old.cluster, old.config, old.placement, old.runtime,
                     failed=[5], allow_batch_change=True, memory_limit_gib=roomier[-1])
    assert limited.chosen.evaluation.peak_memory_bytes / 2**30 <= roomier[-1]
    assert limited.chosen.strategy != free.chosen.strategy
    assert any("chose the fastest re-plan within it" in n for n in limited.notes)
