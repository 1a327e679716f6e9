"""Uneven interleaved chunks in the search (planner/solve/space.py): where the runtime runs
unequal chunks (Megatron's --pipeline-model-parallel-layout, torchtitan's per-stage layer
counts), the search also tries the v whose pp x v chunks do not divide the blocks; the
solver (interleaved_rank's fixed assignment) agrees with brute force on them."""
from __future__ import annotations

from dataclasses import replace

import pytest

from clusters import load_cluster
from models import load_model
from models.native import build_native
from planner.config import RuntimeOptions
from planner.export import export_plan
from planner.plan import make_plan
from planner.plan_types import Plan
from planner.profiles import PROFILES
from planner.solve.bruteforce import brute_force
from planner.solve.headroom import NO_HEADROOM
from planner.solve.search import SearchOptions, search
from planner.solve.space import Pins, enumerate_configs
from planner.strategy import interleaved_rank

TINY = load_cluster("tiny")
N5 = build_native({"name": "n5", "num_layers": 5, "hidden_size": 256, "num_heads": 4,
                   "ffn_hidden_size": 1024, "vocab_size": 1024, "seq_len": 1024})


def _vs(runtime, model=N5, pins=Pins(pp=2, micro_batch=1)):
    prof = PROFILES[runtime] if runtime else None
    hw = replace(TINY, num_nodes=1, gpus_per_node=2)
    return sorted({c.virtual_stages for c in enumerate_configs(
        model, hw, 8, model.default_seq_len, "bf16", pins, prof)})


def test_uneven_v_only_where_the_runtime_runs_it():
    assert _vs(None) == [1]  # 5 blocks: no v > 1 splits them evenly over 2 ranks
    assert _vs("megatron") == [1, 2]  # 4 chunks of 2, 1, 1, 1 blocks
    assert _vs("deepspeed") == [1]  # no interleaving at all
    assert _vs("torchtitan") == [1, 2]


def test_405b_interleaves_its_126_layers():
    model = load_model("llama-3.1-405b")
    hw = load_cluster("dgx-h100", nodes=2048)
    vs = {c.virtual_stages for c in enumerate_configs(
        model, hw, 2048, model.default_seq_len, "bf16", Pins(tp=8, pp=16, micro_batch=1),
        PROFILES["megatron"])}
    assert vs == {1, 2, 3, 4, 5, 6, 7}  # 16 x 8 = 128 chunks > 126 blocks
    ranks = [interleaved_rank(b, 126, 16, 7) for b in range(126)]
    per_rank = [ranks.count(r) for r in range(16)]
    assert sum(per_rank) == 126 and max(per_rank) - min(per_rank) == 1


@pytest.mark.parametrize("memory_gib", [2.0, 0.3])
def test_solver_agrees_with_brute_force_on_uneven_chunks(memory_gib):
    hw = replace(TINY, num_nodes=1, gpus_per_node=2, gpu=replace(TINY.gpu, memory_gib=memory_gib))
    runtime = RuntimeOptions(profile="megatron")
    pins = Pins(pp=2, virtual_stages=2, micro_batch=1, zero=1)
    got = search(N5, hw, 8, N5.default_seq_len, "bf16", pins,
                 SearchOptions(runtime=runtime, memory_headroom=NO_HEADROOM))
    want = brute_force(N5, hw, 8, N5.default_seq_len, "bf16", pins, runtime,
                       headroom=NO_HEADROOM).best
    assert got.record.status == "OPTIMAL"
    assert got.best.step_time_s == pytest.approx(want.step_time_s, rel=1e-6)
    assert got.best.config.virtual_stages == 2
    blocks = [s for s, layer in zip(got.best.placement.stage, N5.layers)
              if layer.kind.value == "block"]
    assert blocks == [interleaved_rank(b, 5, 2, 2) for b in range(5)]


def test_megatron_export_writes_the_uneven_layout():
    hw = replace(TINY, num_nodes=1, gpus_per_node=2)
    got = search(N5, hw, 8, N5.default_seq_len, "bf16", Pins(pp=2, virtual_stages=2),
                 SearchOptions(runtime=RuntimeOptions(profile="megatron"))).best
    plan = Plan.from_dict(make_plan(got, model_spec="n5", cluster_spec="tiny"))
    text = export_plan(plan, "megatron").text
    assert "--pipeline-model-parallel-layout 'Ett|t|t|tL'" in text  # 2, 1, 1, 1 blocks
