"""ZeRO++ hpZ (``--hpz N``, ``--pin hpz=N``): ZeRO-3 with a secondary 16-bit weight partition
inside a node, gathered over it in every pass but the step's first forward (planner/config.py,
cost/terms.py ``hpz_gathers``, solve/space.py, profiles.py, the plan file and the exporters).
DeepSpeed runs it (``zero_optimization.zero_hpz_partition_size``); no other profile does."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from clusters import load_cluster
from models import load_model
from planner.calibration.session import runtime_setup
from planner.config import ParallelConfig
from planner.cost import comm
from planner.cost.context import make_context
from planner.cost.model import evaluate
from planner.cost.terms import Affine, config_terms, layer_terms
from planner.errors import PlannerError
from planner.export import export_plan
from planner.plan import dumps, make_plan
from planner.plan_io import validate_plan
from planner.plan_types import Plan
from planner.profiles import PROFILES
from planner.solve.bruteforce import brute_force
from planner.solve.headroom import NO_HEADROOM
from planner.solve.search import SearchOptions, search
from planner.solve.space import Pins, enumerate_configs
from planner.strategy import NO_OPTION, Recompute, uniform
from planner.topology import group_link
from conftest import run_cli

H100 = load_cluster("dgx-h100", nodes=4)  # 32 GPUs, 8 per node
LLAMA = load_model("llama-3.1-8b")
TINY = load_cluster("tiny")  # 2 nodes x 4 GPUs
DS = runtime_setup(H100, "deepspeed", "bf16").options


def _config(**kw):
    base = dict(tp=1, pp=1, dp=32, global_batch=256, seq_len=8192, zero_stage=3, micro_batch=1)
    return ParallelConfig(**{**base, **kw})


def test_gathers_move_into_the_node_but_the_first_forward():
    config = _config(hpz=8)  # 8 micro-batches per step
    ctx = make_context(LLAMA, H100, config, DS)
    t, plain = config_terms(ctx), config_terms(make_context(LLAMA, H100, _config(), DS))
    everyone, node = ctx.links.dp, group_link(H100, 8, 1)
    primary = Affine.of(comm.all_gather_s, 32, everyone)
    secondary = Affine.of(comm.all_gather_s, 8, node)
    assert node.latency_s < everyone.latency_s and not node.crosses_nodes
    # per micro-batch: the backward gathers over the node, the forward too but for the
    # step's first, whose excess over all 32 ranks is spread over the 8 forwards
    m = config.num_micro_batches
    fwd = t.zero_gather_fwd_dense
    assert fwd.slope_s_per_byte == pytest.approx(
        secondary.slope_s_per_byte + (primary.slope_s_per_byte - secondary.slope_s_per_byte) / m)
    assert fwd.intercept_s == pytest.approx(
        secondary.intercept_s + (primary.intercept_s - secondary.intercept_s) / m)
    assert t.zero_gather_dense == fwd + secondary
    assert plain.zero_gather_dense == primary.scaled(2)
    assert plain.zero_gather_fwd_dense == primary
    assert t.zero_reduce_dense == plain.zero_reduce_dense  # gradients: over all 32
    assert t.dp_gather_dense == plain.dp_gather_dense == Affine()


def test_the_secondary_partition_costs_one_node_share_of_the_weights():
    block = next(layer for layer in LLAMA.layers if layer.kind.value == "block")
    a = layer_terms(make_context(LLAMA, H100, _config(), DS), block, NO_OPTION)
    b = layer_terms(make_context(LLAMA, H100, _config(hpz=8), DS), block, NO_OPTION)
    assert b.params_bytes - a.params_bytes == pytest.approx(a.dense_params * 2 / 8)
    assert (b.grads_bytes, b.optimizer_bytes) == (a.grads_bytes, a.optimizer_bytes)
    assert b.zero_traffic_s < a.zero_traffic_s
    # short sequences on the tiny cluster's 5 GB/s Ethernet: the gathers are exposed, and hpZ
    # takes the backward's and most forwards' off it
    hw = _tiny(80.0)
    full, hpz = (evaluate(LLAMA, hw, _config(dp=8, global_batch=64, seq_len=128, hpz=h),
                          options=runtime_setup(hw, "deepspeed", "bf16").options) for h in (0, 4))
    assert hpz.step_time_s < 0.9 * full.step_time_s
    assert hpz.peak_memory_bytes > full.peak_memory_bytes


@pytest.mark.parametrize("kw,match", [
    (dict(hpz=8, zero_stage=2), "needs ZeRO-3"), (dict(hpz=5), "proper divisor"),
    (dict(hpz=32), "proper divisor"), (dict(hpz=1), "proper divisor"),
    (dict(hpz=8, dp_shard=8), "give one"),
    (dict(hpz=4, tp=2, dp=16), "dp only"), (dict(hpz=-1), "positive")])
def test_invalid_secondary_groups_are_refused(kw, match):
    with pytest.raises(PlannerError, match=match):
        _config(**kw).validate(LLAMA, H100)


def _hpz(runtime: str | None, pins: Pins = Pins()):
    prof = PROFILES[runtime] if runtime else None
    return {(c.zero_stage, c.tp, c.hpz) for c in enumerate_configs(
        LLAMA, H100, 256, 8192, "bf16", replace(pins, micro_batch=1), prof) if c.pp == 1}


def test_the_space_has_hpz_where_deepspeed_runs_it():
    assert {h for _, _, h in _hpz("deepspeed")} == {0, 8}
    assert {(z, t) for z, t, h in _hpz("deepspeed") if h} == {(3, 1)}  # ZeRO-3 over dp only
    for runtime in (None, "megatron", "torchtitan", "fsdp"):  # no other space changes
        assert {h for _, _, h in _hpz(runtime)} == {0}
    assert {h for _, _, h in _hpz("deepspeed", Pins(hpz=4, zero=3))} == {4}  # pinned: any
    with pytest.raises(PlannerError, match="hpz=8"):
        _hpz("torchtitan", Pins(hpz=8))


# tiny under ZeRO-3: hpZ's best plan peaks at 2.5461 GiB, plain at 2.5448 (most of it the ZeRO
# optimizer's 5e8-element reduce and all-gather buckets, planner.config.RUNTIME_STATE_BYTES)
AMPLE_GIB, TIGHT_GIB = 4.0, 2.5454


def _tiny(memory_gib: float):
    return replace(TINY, gpu=replace(TINY.gpu, memory_gib=memory_gib))


@pytest.mark.parametrize("memory_gib,hpz", [(AMPLE_GIB, 4), (TIGHT_GIB, 0)])
def test_solver_agrees_with_brute_force_with_hpz_in_the_space(memory_gib, hpz):
    # ZeRO-3 over 8 ranks on 2 nodes: with room for the secondary copy the optimum keeps it;
    # where that copy does not fit, it gathers over all 8
    model, hw = load_model("tiny"), _tiny(memory_gib)
    runtime = runtime_setup(hw, "deepspeed", "bf16").options
    pins = Pins(zero=3, micro_batch=1, tp=1, pp=1)
    configs = list(enumerate_configs(model, hw, 16, model.default_seq_len, "bf16", pins,
                                     PROFILES["deepspeed"]))
    assert {(c.dp_shard, c.hpz) for c in configs} == {(0, 0), (0, 4)}  # no MiCS in 0.19
    got = search(model, hw, 16, model.default_seq_len, "bf16", pins,
                 SearchOptions(runtime=runtime, memory_headroom=NO_HEADROOM))
    want = brute_force(model, hw, 16, model.default_seq_len, "bf16", pins, runtime,
                       headroom=NO_HEADROOM).best
    assert got.record.status == "OPTIMAL"
    assert got.best.step_time_s == pytest.approx(want.step_time_s, rel=1e-6)
    assert got.best.config.hpz == want.config.hpz == hpz


@pytest.fixture(scope="module")
def hpz_plan() -> dict:
    config = _config(hpz=8)
    ev = evaluate(LLAMA, H100, config, uniform(LLAMA, config, Recompute.FULL), DS)
    assert ev.fits
    doc = make_plan(ev, model_spec="llama-3.1-8b", cluster_spec="dgx-h100", nodes=4)
    return validate_plan(json.loads(dumps(doc)))


def test_plan_file_records_and_reads_back_hpz(hpz_plan):
    assert hpz_plan["parallelism"]["hpz"] == 8
    plan = Plan.from_dict(hpz_plan)
    assert plan.config.hpz == 8
    assert plan.to_dict()["parallelism"] == hpz_plan["parallelism"]
    assert plan.evaluate().step_time_s == pytest.approx(hpz_plan["predicted"]["step_time_s"],
                                                        rel=1e-4)
    plain = make_plan(evaluate(LLAMA, H100, _config(), options=DS), model_spec="llama-3.1-8b",
                      cluster_spec="dgx-h100", nodes=4)
    assert "hpz" not in plain["parallelism"]  # plans without hpZ are unchanged


def test_exports_set_or_name_the_secondary_partition(hpz_plan):
    plan = Plan.from_dict(hpz_plan)
    ds = export_plan(plan, "deepspeed")
    config = json.loads(ds.text)
    assert config["zero_optimization"]["stage"] == 3
    assert config["zero_optimization"]["zero_hpz_partition_size"] == 8
    assert not any("hpZ" in w for w in ds.warnings)
    for runtime in ("megatron", "torchtitan"):
        assert any("ZeRO++ hpZ" in w for w in export_plan(plan, runtime).warnings)


def test_deepspeed_reads_the_exported_hpz(hpz_plan):
    zero_config = pytest.importorskip("deepspeed.runtime.zero.config")
    config = json.loads(export_plan(Plan.from_dict(hpz_plan), "deepspeed").text)
    parsed = zero_config.DeepSpeedZeroConfig(**config["zero_optimization"])
    assert parsed.zero_hpz_partition_size == 8 and int(parsed.stage) == 3


def test_check_runtime_and_the_cli(hpz_plan, tmp_path, capsys):
    path = tmp_path / "plan.json"
    path.write_text(dumps(hpz_plan))
    code, _, _ = run_cli(["check", str(path), "--runtime", "deepspeed"], capsys)
    assert code == 0
    code, _, err = run_cli(["check", str(path), "--runtime", "torchtitan"], capsys)
    assert code == 1 and "ZeRO++ hpZ" in err
    args = ["evaluate", "-m", "llama-3.1-8b", "-c", "dgx-h100", "--nodes", "4",
            "--global-batch", "256", "--tp", "1", "--pp", "1", "--zero", "3",
            "--runtime", "deepspeed", "--json"]
    code, out, _ = run_cli(args + ["--hpz", "8"], capsys)
    assert code == 0 and json.loads(out)["parallelism"]["hpz"] == 8
    code, _, err = run_cli(args[:-1] + ["--hpz", "3"], capsys)
    assert code == 2 and "proper divisor" in err
