"""Gradient accumulation over separate pipeline schedule runs (ParallelConfig.schedule_calls):
the step runs the schedule k times on m / k micro-batches each, each with its own fill, drain
and data-parallel sync, then one optimizer step (NeMo AutoModel's GA loop of
``schedule.step`` calls); FSDP under PP keeps MoE weights gathered as it does dense ones."""
from __future__ import annotations

from dataclasses import replace

import pytest

from clusters import load_cluster
from models import load_model
from planner.config import ParallelConfig, RuntimeOptions
from planner.cost.model import evaluate
from planner.cost.terms import keeps_unsharded
from planner.errors import PlannerError
from planner.strategy import Recompute, uniform

CLUSTER = load_cluster("dgx-h100", nodes=2)


def _config(**kw) -> ParallelConfig:
    base = dict(tp=1, pp=2, dp=8, global_batch=256, seq_len=2048, zero_stage=1, micro_batch=1)
    base.update(kw)
    return ParallelConfig(**base)


def _eval(model, config, options=RuntimeOptions()):
    config.validate(model, CLUSTER)
    return evaluate(model, CLUSTER, config, uniform(model, config, Recompute.FULL), options)


def test_k_schedule_runs_are_k_pipelines_and_syncs_and_one_optimizer_step():
    model = load_model("gpt3-1.3b")
    exposed = RuntimeOptions(overlap_grad_reduce=False)  # so that the sync shows
    one_run = _eval(model, _config(global_batch=64), exposed)  # 4 micro-batches per rank
    four = _eval(model, _config(global_batch=256, schedule_calls=4), exposed)
    single = _eval(model, _config(global_batch=256), exposed)  # 16, one schedule
    a, b = one_run.breakdown, four.breakdown
    assert b.pipeline_s == pytest.approx(4 * a.pipeline_s, rel=1e-12)
    assert b.bubble_s == pytest.approx(4 * a.bubble_s, rel=1e-12)
    assert a.dp_exposed_s > 0 and b.dp_exposed_s == pytest.approx(4 * a.dp_exposed_s, rel=1e-12)
    assert b.optimizer_s == a.optimizer_s and b.embedding_sync_s == a.embedding_sync_s
    # the activations in flight are one run's: the same peak as a run of 4 micro-batches
    assert four.peak_memory_bytes == one_run.peak_memory_bytes
    # three more fills and drains than one schedule over the 16 micro-batches
    assert four.step_time_s > single.step_time_s
    assert four.breakdown.bubble_s > 2 * single.breakdown.bubble_s


@pytest.mark.parametrize("calls", [3, 0, -1, 2.0])
def test_schedule_calls_must_split_the_micro_batches(calls):
    with pytest.raises(PlannerError) as err:
        _config(schedule_calls=calls).validate(load_model("gpt3-1.3b"), CLUSTER)
    assert "schedule" in err.value.message


def test_a_schedule_run_needs_the_schedules_micro_batches():
    # interleaved 1F1B runs its micro-batches in groups of pp: 16 per rank in 8 runs of 2 do
    # not fill pp 4 (one run of 16 does)
    model = load_model("gpt3-1.3b")
    ok = _config(pp=4, dp=4, global_batch=64, virtual_stages=2)
    ok.validate(model, CLUSTER)
    with pytest.raises(PlannerError):
        replace(ok, schedule_calls=8).validate(model, CLUSTER)


def test_fsdp_under_pp_keeps_weights_gathered_for_moe_as_for_dense():
    """torchtitan and NeMo AutoModel pass reshard_after_forward=not pp_enabled to fully_shard
    for every model; the rule is the runtime's, memory decides the fit."""
    assert keeps_unsharded(3, 2, "torchtitan") and not keeps_unsharded(3, 1, "torchtitan")
    assert not keeps_unsharded(2, 2, "torchtitan") and not keeps_unsharded(3, 2, "megatron")
