"""The re-planner costs a plan as the plan was costed: the same expert mesh and HSDP groups.

``replan`` and ``plan --fallbacks`` evaluate the old plan and every option with
:func:`planner.hetero.evaluate.hetero_evaluate`, whose stage terms (planner/hetero/terms.py)
built the links of a stage as tp / cp / dp / ep groups with the EP group ``tp`` apart and no
expert-tensor, expert-data or HSDP replicate group, and the layer shard without ``etp`` or the
routing load. A plan's own prediction (planner.cost.model.evaluate) uses the mesh
(planner.mesh: EP ``etp`` apart). So:

* qwen3-30b-a3b, tp 4 dp 4 ep 8 etp 1 on 16 H100: ``replan --failed 3`` exited with "a group of
  8 ranks with stride 4 needs 29 GPUs; cluster 'dgx-h100' has 16" (the EP group laid out
  ``tp`` apart);
* deepseek-v3, tp 4 pp 16 dp 4 ep 16 etp 1 on 256 H100: the re-plan said "step 17.605 s" for
  the plan whose file predicts 13.859 s;
* llama-3.1-8b, ZeRO-3 --dp-shard 8 on 32 H100: 4.696 s for the plan's 4.714 s.

Now the re-planner's stage links are :func:`planner.cost.context.stage_links` of the plan's
mesh, so its evaluation of an unchanged plan is the plan's prediction.
"""
from __future__ import annotations

import pytest

from clusters import load_cluster
from models import load_model
from planner.config import ParallelConfig, RuntimeOptions
from planner.cost.model import evaluate
from planner.hardware import GIB
from planner.hetero.evaluate import hetero_evaluate
from planner.hetero.layout import StagePools
from planner.hetero.replan import replan
from planner.moe import MoeOptions
from planner.strategy import uniform

CASES = {
    "moe-etp1": ("qwen3-30b-a3b", 2, dict(tp=4, pp=1, dp=4, ep=8, etp=1, global_batch=128,
                                          micro_batch=2, seq_len=4096, zero_stage=1),
                 RuntimeOptions(), "full"),
    "moe-etp1-pp-imbalance": (
        "deepseek-v3", 32, dict(tp=4, pp=16, dp=4, ep=16, etp=1, global_batch=1024,
                                seq_len=4096, zero_stage=1, dtype="fp8"),
        RuntimeOptions(moe=MoeOptions(imbalance=1.3)), "none"),
    "hsdp": ("llama-3.1-8b", 4, dict(tp=1, pp=1, dp=32, dp_shard=8, global_batch=128,
                                     seq_len=8192, zero_stage=3),
             RuntimeOptions(runtime="zero-paper", profile="torchtitan"), "none"),
}


def _setup(name):
    spec, nodes, fields, options, recompute = CASES[name]
    model, cluster = load_model(spec), load_cluster("dgx-h100", nodes=nodes)
    config = ParallelConfig(sp=fields["tp"] > 1, **fields)
    config.validate(model, cluster)
    return model, cluster, config, options, uniform(model, config, recompute)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_replanner_evaluates_a_plan_as_the_plan_does(name):
    model, cluster, config, options, placement = _setup(name)
    want = evaluate(model, cluster, config, placement, options)
    got = hetero_evaluate(model, cluster, config, StagePools((cluster.name,) * config.pp),
                          placement, options)
    assert got.step_time_s == pytest.approx(want.step_time_s, rel=1e-9)
    assert got.peak_memory_bytes / GIB == \
        pytest.approx(want.peak_memory_bytes / GIB, rel=1e-9)


def test_a_moe_plan_with_experts_whole_on_a_tp_group_is_replanned():
    model, cluster, config, options, placement = _setup("moe-etp1")
    result = replan(model, cluster, config, placement, options, failed=[3],
                    allow_batch_change=True, time_limit_s=30)
    assert result.old.step_time_s == pytest.approx(
        evaluate(model, cluster, config, placement, options).step_time_s, rel=1e-9)
    assert result.chosen is not None
