"""``shardplan plan`` on a multi-pool cluster writes a plan file of schema_version 2 (stage to
pool), which the typed Plan reads back exactly and ``check``, ``show`` and ``export`` read; one-
pool plans are unchanged (schema_version 1, no stage_pools)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from planner.hetero.layout import stage_shares
from planner.plan_io import load_plan, validate_plan
from planner.plan_types import Plan

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import edited, run_cli  # noqa: E402

# the two tiny pools of test_hetero_solver ("fast" 10 TFLOP/s, "slow" 4), memory per pool
from test_hetero_solver import POOLS  # noqa: E402


def cluster_file(folder: Path, name: str = "pools.yaml", fast_gib=0.16, slow_gib=0.3) -> Path:
    path = folder / name
    fast, slow = POOLS.split("- name: slow")
    path.write_text(fast.replace("memory_gib: 0.16", f"memory_gib: {fast_gib}") + "- name: slow"
                    + slow.replace("memory_gib: 0.16", f"memory_gib: {slow_gib}"))
    return path


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pool-plan")
    cluster = cluster_file(folder)
    out = folder / "plan.json"
    from cli.main import main

    for target in (out, folder / "again.json"):
        with pytest.raises(SystemExit) as done:
            main(["plan", "-m", "tiny", "-c", str(cluster), "--global-batch", "16",
                  "--time-limit", "60", "-o", str(target), "--json"])
        assert done.value.code == 0
    return folder, cluster, out


def test_plan_across_pools_is_a_version_2_plan_file(planned):
    folder, _, path = planned
    doc = load_plan(path)  # schema-valid
    p = doc["parallelism"]
    assert doc["schema_version"] == 2 and len(p["stage_pools"]) == p["pp"]
    assert {row["name"] for row in doc["cluster"]["pools"]} == {"fast", "slow"}
    assert [s["pool"] for s in doc["stages"]] == p["stage_pools"]
    # each stage's capacity is its pool's GPU memory (a split stage's: the smaller)
    caps = {"fast": 0.16, "slow": 0.3}
    assert [s["capacity_gib"] for s in doc["stages"]] == \
        [min(caps[q] for q, _ in stage_shares(x, p["dp"])) for x in p["stage_pools"]]
    assert all(s["memory_gib"]["total"] <= s["capacity_gib"] for s in doc["stages"])
    used = sum(row["gpus_used"] for row in doc["cluster"]["pools"])
    assert used == p["tp"] * p["cp"] * p["dp"] * p["pp"]
    # same inputs, same bytes
    assert path.read_bytes() == (folder / "again.json").read_bytes()


def test_typed_plan_round_trip_is_exact_and_re_evaluates(planned):
    _, _, path = planned
    doc = load_plan(path)
    plan = Plan.from_dict(doc)
    assert plan.across_pools and plan.stage_pools == tuple(doc["parallelism"]["stage_pools"])
    assert plan.to_dict() == doc
    ev = plan.evaluate()
    assert ev.step_time_s == pytest.approx(doc["predicted"]["step_time_s"], rel=1e-5)
    assert [s.memory.gib()["total"] for s in ev.stages] == pytest.approx(
        [s["memory_gib"]["total"] for s in doc["stages"]], rel=1e-5)


def test_schema_ties_the_version_to_the_pool_fields(planned):
    _, _, path = planned
    doc = load_plan(path)
    with pytest.raises(Exception, match="stage_pools"):
        validate_plan(edited(doc, lambda d: d["parallelism"].pop("stage_pools")))
    with pytest.raises(Exception, match="schema"):  # version 1 may not carry stage_pools
        validate_plan(edited(doc, lambda d: d.update(schema_version=1)))


def test_check_uses_each_stages_pool_memory(planned, capsys, tmp_path):
    _, cluster, path = planned
    code, out, _ = run_cli(["check", path, "--json"], capsys)
    report = json.loads(out)
    assert code == 0 and report["ok"], report
    assert [s["capacity_gib"] for s in report["stages"]] == \
        [s["capacity_gib"] for s in load_plan(path)["stages"]]
    # the same cluster with less memory on one pool: that pool's stages fail, named
    doc = load_plan(path)
    dp = doc["parallelism"]["dp"]
    pool = stage_shares(doc["stages"][0]["pool"], dp)[0][0]  # stage 0's (first) pool
    need = max(s["memory_gib"]["total"] for s in doc["stages"]
               if pool in dict(stage_shares(s["pool"], dp)))
    small = cluster_file(tmp_path, "small.yaml", **{f"{pool}_gib": round(need * 0.9, 4)})
    code, out, _ = run_cli(["check", path, "-c", small, "--allow-stale", "--json"], capsys)
    report = json.loads(out)
    assert code == 1 and not report["ok"]
    bad = [p["message"] for p in report["problems"] if p["code"] == "memory"]
    # that pool's stages (and split stages with a share on it) fail, naming the pool
    assert bad and all(f"pool {pool!r}" in m or f"pool '{pool}:" in m for m in bad)


def test_check_refuses_a_stage_on_a_missing_pool(planned, capsys, tmp_path):
    _, _, path = planned
    doc = load_plan(path)
    bad = edited(doc, lambda d: d["parallelism"]["stage_pools"].__setitem__(0, "gone"))
    target = tmp_path / "bad.json"
    target.write_text(json.dumps(bad))
    code, out, _ = run_cli(["check", target, "--json"], capsys)
    assert code == 1 and "'gone'" in out


def test_show_and_export_name_the_pools(planned, capsys):
    _, _, path = planned
    code, _, err = run_cli(["show", path], capsys)
    assert code == 0 and "pool" in err and "GPUs used" in err
    code, out, err = run_cli(["export", path, "-f", "megatron"], capsys)
    assert code == 0
    assert "--pipeline-model-parallel-size" in out
    assert "nodes in stage order" in err and "node ranks" in err


def test_one_pool_plans_stay_version_1(capsys, tmp_path):
    target = tmp_path / "one.json"
    code, _, _ = run_cli(["plan", "-m", "tiny", "-c", "tiny", "--global-batch", "16",
                          "--time-limit", "30", "-o", target, "--json"], capsys)
    doc = load_plan(target)
    assert code == 0 and doc["schema_version"] == 1
    assert "stage_pools" not in doc["parallelism"] and "pools" not in doc["cluster"]
    assert not Plan.from_dict(doc).across_pools


def test_verify_runs_a_plan_across_two_pools(capsys, tmp_path):
    """Stage 0 on one pool, stage 1 on the other: the CPU runtime runs it as any plan (the
    GPU type does not exist there); losses against one process, held bytes against the
    per-pool prediction."""
    pytest.importorskip("torch", reason="PyTorch is not installed (pip install 'shardplan[torch]')")
    cluster = cluster_file(tmp_path)
    target = tmp_path / "two.json"
    code, _, _ = run_cli(["plan", "-m", "tiny", "-c", cluster, "--global-batch", "16",
                          "--pin", "pp=2", "--pin", "dp=4", "--pin", "tp=1", "-o", target,
                          "--json"], capsys)
    assert code == 0
    assert sorted(load_plan(target)["parallelism"]["stage_pools"]) == ["fast", "slow"]
    code, out, _ = run_cli(["verify", target, "--json"], capsys)
    report = json.loads(out)
    assert code == 0 and report["ok"], report
