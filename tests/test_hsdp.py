"""Hybrid sharding (HSDP, ``--dp-shard N``): ZeRO / FSDP states sharded over groups of N
data-parallel ranks and replicated across dp / N groups (planner/mesh.py, cost/terms.py,
solve/space.py, profiles.py, the plan file and the exporters)."""
from __future__ import annotations

import importlib.util
import json
from dataclasses import replace

import pytest

from clusters import load_cluster
from models import load_model
from planner.config import ParallelConfig, RuntimeOptions
from planner.cost import comm
from planner.cost.context import make_context
from planner.cost.model import evaluate
from planner.cost.terms import Affine, config_terms
from planner.errors import PlannerError
from planner.export import export_plan
from planner.mesh import Mesh
from planner.plan import dumps, make_plan
from planner.plan_io import validate_plan
from planner.plan_types import Plan
from planner.profiles import PROFILES
from planner.solve.bruteforce import brute_force
from planner.solve.headroom import NO_HEADROOM
from planner.solve.search import SearchOptions, search
from planner.solve.space import Pins, enumerate_configs
from planner.topology import group_link
from conftest import run_cli

TINY = load_cluster("tiny")  # 2 nodes x 4 GPUs
H100 = load_cluster("dgx-h100", nodes=4)
LLAMA = load_model("llama-3.1-8b")


def test_mesh_shard_and_replicate_groups():
    mesh = Mesh(pp=1, dp=8, cp=1, tp=2, dp_shard=4)
    assert (mesh.shard_group, mesh.replicas, mesh.shard_degree) == (4, 2, 4)
    assert mesh.stride("shard") == 2 and mesh.stride("replicate") == 8
    plain = Mesh(dp=8, tp=2)
    assert (plain.shard_group, plain.replicas, plain.shard_degree) == (8, 1, 8)
    assert "HSDP: shard 4 x replicate 2" in mesh.describe()


def _config(**kw):
    base = dict(tp=1, pp=1, dp=32, global_batch=256, seq_len=8192, zero_stage=3, micro_batch=1)
    return ParallelConfig(**{**base, **kw})


def test_states_are_sharded_over_the_shard_group_only():
    full = evaluate(LLAMA, H100, _config())
    hsdp = evaluate(LLAMA, H100, _config(dp_shard=8))
    for a, b in ((full.stages[0].memory, hsdp.stages[0].memory),):
        assert b.params == pytest.approx(a.params * 4, rel=1e-9)  # 32 / 8 more per GPU
        assert b.optimizer == pytest.approx(a.optimizer * 4, rel=1e-9)
        assert b.grads == pytest.approx(a.grads * 4, rel=1e-9)
    z1 = evaluate(LLAMA, H100, _config(zero_stage=1, dp_shard=16))
    z1_full = evaluate(LLAMA, H100, _config(zero_stage=1))
    assert z1.stages[0].memory.optimizer == pytest.approx(2 * z1_full.stages[0].memory.optimizer)
    assert z1.stages[0].memory.grads == pytest.approx(z1_full.stages[0].memory.grads)


def test_collectives_run_on_the_shard_and_replicate_links():
    c = _config(dp_shard=8)  # shard group: one node (8 GPUs); 4 replicas across nodes
    ctx = make_context(LLAMA, H100, c)
    t = config_terms(ctx)
    shard = group_link(H100, 8, 1)
    across = group_link(H100, 4, 8)
    assert ctx.links.dp == shard and ctx.links.replicate == across
    rs = Affine.of(comm.reduce_scatter_s, 8, shard)
    ar = Affine.of(comm.all_reduce_s, 4, across)
    # per micro-batch (ZeRO-3): reduce-scatter in the node, then 1/8 of it all-reduced across
    assert t.zero_reduce_dense.slope_s_per_byte == pytest.approx(
        rs.slope_s_per_byte + ar.slope_s_per_byte / 8)
    assert t.zero_reduce_dense.intercept_s == pytest.approx(rs.intercept_s + ar.intercept_s)
    ag = Affine.of(comm.all_gather_s, 8, shard).scaled(2)
    assert t.zero_gather_dense.slope_s_per_byte == pytest.approx(ag.slope_s_per_byte)
    # ZeRO-1: the same all-reduce once per step, after the once-per-step reduce-scatter
    t1 = config_terms(make_context(LLAMA, H100, _config(zero_stage=1, dp_shard=8)))
    assert t1.dp_reduce_dense.slope_s_per_byte == pytest.approx(
        rs.slope_s_per_byte + ar.slope_s_per_byte / 8)


@pytest.mark.parametrize("kw,match", [
    (dict(dp_shard=5), "proper divisor"), (dict(dp_shard=32), "proper divisor"),
    (dict(zero_stage=0, dp_shard=8), "needs ZeRO >= 1"), (dict(dp_shard=-1), "positive")])
def test_invalid_shard_groups_are_refused(kw, match):
    with pytest.raises(PlannerError, match=match):
        _config(**kw).validate(LLAMA, H100)


def _shards(runtime: str | None, pins: Pins = Pins()):
    prof = PROFILES[runtime] if runtime else None
    return {(c.zero_stage, c.dp_shard) for c in enumerate_configs(
        LLAMA, H100, 256, 8192, "bf16", replace(pins, pp=1, micro_batch=1), prof)
        if c.tp == 1}


def test_the_space_has_hsdp_where_the_runtime_runs_it():
    assert {s for _, s in _shards(None)} == {0}  # no profile: only when pinned
    assert _shards("torchtitan") == {(3, 0), (3, 8)}  # one node per shard group
    assert {(z, s) for z, s in _shards("megatron") if s} == {(1, 8)}
    assert {s for _, s in _shards("torchtitan", Pins(dp_shard=16))} == {16}  # pinned: any
    fsdp = _shards("fsdp")
    assert {(z, s) for z, s in fsdp if s} == {(2, 8), (3, 8)}  # HYBRID_SHARD: one node
    assert {s for _, s in _shards(None, Pins(dp_shard=4))} == {4}
    assert _shards("deepspeed") == {(z, 0) for z in (0, 1, 2, 3)}  # MiCS is gone in 0.19
    for zero in (1, 3):
        with pytest.raises(PlannerError, match="dp_shard=8"):
            _shards("deepspeed", Pins(dp_shard=8, zero=zero))


def test_solver_agrees_with_brute_force_with_hsdp_in_the_space():
    model = load_model("tiny")
    runtime = RuntimeOptions(runtime="zero-paper", profile="torchtitan")
    for memory in (TINY.gpu.memory_gib, 0.136):  # ample; then just above the optimum's peak
        hw = replace(TINY, gpu=replace(TINY.gpu, memory_gib=memory))
        pins = Pins(micro_batch=1)
        configs = list(enumerate_configs(model, hw, 16, model.default_seq_len, "bf16", pins,
                                         PROFILES["torchtitan"]))
        assert any(c.dp_shard for c in configs)
        got = search(model, hw, 16, model.default_seq_len, "bf16", pins,
                     SearchOptions(runtime=runtime, memory_headroom=NO_HEADROOM))
        want = brute_force(model, hw, 16, model.default_seq_len, "bf16", pins, runtime,
                           headroom=NO_HEADROOM).best
        assert got.best.step_time_s == pytest.approx(want.step_time_s, rel=1e-6)
        assert got.record.status == "OPTIMAL"


@pytest.fixture(scope="module")
def hsdp_plan() -> dict:
    c = _config(dp_shard=8)
    ev = evaluate(LLAMA, H100, c, options=RuntimeOptions(runtime="zero-paper",
                                                         profile="torchtitan"))
    doc = make_plan(ev, model_spec="llama-3.1-8b", cluster_spec="dgx-h100", nodes=4)
    return validate_plan(json.loads(dumps(doc)))


def test_plan_file_records_and_reads_back_the_shard_group(hsdp_plan):
    assert hsdp_plan["parallelism"]["dp_shard"] == 8
    plan = Plan.from_dict(hsdp_plan)
    assert plan.config.dp_shard == 8 and plan.mesh.replicas == 4
    assert plan.to_dict()["parallelism"] == hsdp_plan["parallelism"]
    plain = make_plan(evaluate(LLAMA, H100, _config()), model_spec="llama-3.1-8b",
                      cluster_spec="dgx-h100", nodes=4)
    assert "dp_shard" not in plain["parallelism"]  # plans without HSDP are unchanged


def test_exports_name_the_runtimes_option(hsdp_plan):
    plan = Plan.from_dict(hsdp_plan)
    tt = export_plan(plan, "torchtitan").text
    assert "--parallelism.data_parallel_shard_degree 8" in tt
    assert "--parallelism.data_parallel_replicate_degree 4" in tt
    # DeepSpeed 0.19 refuses zero_optimization.mics_shard_size (MiCS removed): the export
    # shards over all of dp and says so, with the memory that costs
    ds = export_plan(plan, "deepspeed")
    assert json.loads(ds.text)["zero_optimization"] == {"stage": 3, "overlap_comm": True}
    assert any(w.startswith("hybrid sharding (dp_shard 8, 4 replicas): DeepSpeed 0.19 has no "
                            "MiCS") and "exported ZeRO-3 sharded over all dp 32" in w
               and "GiB peak per GPU" in w for w in ds.warnings), ds.warnings
    z1 = Plan.from_dict(hsdp_plan).with_changes(zero_stage=1)
    assert "--num-distributed-optimizer-instances 4" in export_plan(z1, "megatron").text


def test_check_runtime_knows_who_runs_hsdp(hsdp_plan, tmp_path, capsys):
    path = tmp_path / "plan.json"
    path.write_text(dumps(hsdp_plan))
    code, _, _ = run_cli(["check", str(path), "--runtime", "torchtitan"], capsys)
    assert code == 0
    code, _, err = run_cli(["check", str(path), "--runtime", "megatron"], capsys)
    assert code == 1 and "hybrid sharding of ZeRO-3" in err


def test_cli_dp_shard_on_evaluate_and_plan(capsys):
    code, out, _ = run_cli(["evaluate", "-m", "llama-3.1-8b", "-c", "dgx-h100", "--nodes", "4",
                            "--global-batch", "256", "--tp", "1", "--pp", "1", "--zero", "3",
                            "--dp-shard", "8", "--runtime", "torchtitan", "--json"], capsys)
    assert code == 0 and json.loads(out)["parallelism"]["dp_shard"] == 8
    code, out, err = run_cli(["evaluate", "-m", "llama-3.1-8b", "-c", "dgx-h100", "--nodes", "4",
                              "--global-batch", "256", "--tp", "1", "--pp", "1", "--zero", "3",
                              "--dp-shard", "5"], capsys)
    assert code == 2 and "proper divisor" in err
    code, out, _ = run_cli(["plan", "-m", "tiny", "-c", "tiny", "--global-batch", "16",
                            "--runtime", "torchtitan", "--dp-shard", "2", "--json"], capsys)
    assert code == 0 and json.loads(out)["parallelism"]["dp_shard"] == 2


def test_a_plan_whose_shard_group_does_not_divide_dp_is_not_exported(hsdp_plan):
    """The exporters refuse a malformed plan (planner/plan_validate.py); dp 32 with shard groups
    of 12 was written as replicate 2 x shard 12 = 24 ranks before."""
    from planner.plan_validate import plan_problems

    bad = json.loads(json.dumps(hsdp_plan))
    bad["parallelism"]["dp_shard"] = 12
    problems = plan_problems(Plan.from_dict(bad))
    assert [p.code for p in problems] == ["config"]
    assert "dp_shard 12 is not a proper divisor of dp 32" in problems[0].message
    with pytest.raises(PlannerError):
        export_plan(Plan.from_dict(bad), "torchtitan")
    assert plan_problems(Plan.from_dict(hsdp_plan)) == []


def test_replan_of_an_hsdp_plan_keeps_equal_shard_groups():
    """A failure takes a node (8 replicas) of dp 32 in shard groups of 16: the new plan shards
    over the largest divisor of dp no larger than the group (dp 24, batch rounded: 12), or over
    all of dp where that is no larger (dp 16, batch kept: plain sharding); never a group that
    does not divide dp (the re-plan wrote dp_shard 16 on dp 24 and on dp 16 before: plans
    that `check` refused and the torchtitan export wrote as replicate 1 x shard 16)."""
    from planner.hetero.replan import replan
    from planner.plan_validate import plan_problems

    ev = evaluate(LLAMA, H100, _config(dp_shard=16),
                  options=RuntimeOptions(runtime="zero-paper", profile="torchtitan"))
    doc = make_plan(ev, model_spec="llama-3.1-8b", cluster_spec="dgx-h100", nodes=4)
    old = Plan.from_dict(validate_plan(json.loads(dumps(doc))))
    for allow, want in ((False, (16, 0)), (True, (24, 12))):
        result = replan(old.model, old.cluster, old.config, old.placement, old.runtime,
                        failed=[5], allow_batch_change=allow)
        c = result.chosen.config
        assert (c.dp, c.dp_shard) == want
        c.validate(old.model, result.chosen.cluster)


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                    reason="deepspeed is not installed (pip install -e '.[runtimes]')")
def test_deepspeed_accepts_the_export_of_an_hsdp_plan(hsdp_plan):
    """DeepSpeed 0.19.8's DeepSpeedConfig raised on the mics_shard_size the export wrote
    ('MiCS ZeRO-3 sharding has been removed')."""
    from bench.export_runtimes import run_worker

    result = export_plan(Plan.from_dict(hsdp_plan), "deepspeed")
    done = run_worker("deepspeed", [{"text": result.text, "notes": list(result.notes),
                                     "world": 32}])
    assert done[0]["accepted"], done[0]
    assert done[0]["derived"]["dp"] == 32
