"""Shared test configuration and helpers.

Property tests run derandomized: the same examples on every run and machine, so CI never turns
red on a case no one can replay. New random exploration is a deliberate, local act:
``pytest --hypothesis-profile=explore``.

Plan builders shared by the plan-file tests (``from conftest import build_plan, ...``): plans are
made from ``evaluate`` + ``make_plan`` (milliseconds) rather than a search, so any shape can be
built: uneven pipeline stages, per-layer recomputation, interleaving, MoE.
"""
from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

from hypothesis import settings

from clusters import load_cluster
from models import load_model
from planner.config import ParallelConfig, RuntimeOptions, resolve_dp
from planner.cost.model import evaluate
from planner.ir import LayerKind
from planner.plan import dumps, make_plan
from planner.plan_io import validate_plan
from planner.strategy import LayerPlacement, Recompute, uniform

MIXTRAL = str(Path(__file__).resolve().parents[1] / "models" / "hf_configs" /
              "Mixtral-8x7B-v0.1.json")

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile("ci")


def build_plan(model: str = "tiny", cluster: str = "tiny", *, nodes: int | None = None,
               global_batch: int = 16, tp: int = 1, pp: int = 1, dp: int | None = None,
               cp: int = 1, ep: int = 1, sp: bool | None = None, zero: int = 1,
               micro_batch: int = 1, virtual_stages: int = 1, recompute: str = "none",
               stage_blocks: list[int] | None = None, block_recompute: list[str] | None = None,
               dtype: str = "bf16", seq_len: int | None = None,
               block_act_offload: list[bool] | None = None, offload: bool = False,
               runtime: RuntimeOptions = RuntimeOptions()) -> dict:
    """A plan document (as read back from JSON) for one configuration.

    ``stage_blocks``: blocks per pipeline stage (embedding on stage 0, head on the last), else
    the default split; ``block_recompute``: one of none/selective/full per block;
    ``block_act_offload``: each block's activation offload (LayerOption.act_offload);
    ``offload``: every layer's optimizer states in host memory (LayerOption.offload)."""
    graph = load_model(model, seq_len=seq_len)
    hw = load_cluster(cluster, nodes=nodes)
    if dp is None:
        dp = resolve_dp(hw.num_gpus, tp, pp, cp)
    config = ParallelConfig(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, global_batch=global_batch,
                            seq_len=graph.default_seq_len, sp=(tp > 1) if sp is None else sp,
                            zero_stage=zero, micro_batch=micro_batch,
                            virtual_stages=virtual_stages, dtype=dtype)
    config.validate(graph, hw)
    placement = uniform(graph, config, recompute)
    if stage_blocks is not None or block_recompute is not None:
        base = placement
        stages = list(base.stage)
        if stage_blocks is not None:
            assert sum(stage_blocks) == graph.num_blocks
            owner = [s for s, n in enumerate(stage_blocks) for _ in range(n)]
            b = 0
            for i, layer in enumerate(graph.layers):
                if layer.kind is LayerKind.BLOCK:
                    stages[i] = owner[b]
                    b += 1
        recompute_list = list(base.recompute)
        if block_recompute is not None:
            assert len(block_recompute) == graph.num_blocks
            b = 0
            for i, layer in enumerate(graph.layers):
                if layer.kind is LayerKind.BLOCK:
                    recompute_list[i] = Recompute(block_recompute[b])
                    b += 1
        placement = LayerPlacement.of(stages, recompute_list)
    if block_act_offload is not None:
        assert len(block_act_offload) == graph.num_blocks
        flags = iter(block_act_offload)
        placement = replace(placement, options=tuple(
            replace(option, act_offload=next(flags)) if layer.kind is LayerKind.BLOCK
            else option for layer, option in zip(graph.layers, placement.options)))
    if offload:
        placement = replace(placement, options=tuple(replace(option, offload=True)
                                                     for option in placement.options))
    ev = evaluate(graph, hw, config, placement, runtime)
    doc = make_plan(ev, model_spec=model, cluster_spec=cluster, nodes=nodes)
    return validate_plan(json.loads(dumps(doc)))


def write(doc: dict, path: Path) -> Path:
    path.write_text(dumps(doc))
    return path


def edited(doc: dict, edit) -> dict:
    out = copy.deepcopy(doc)
    edit(out)
    return out


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    """Run ``shardplan ARGS`` through the real entry point; (exit code, stdout, stderr)."""
    from cli.main import main

    capsys.readouterr()
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as done:  # main() always exits
        code = done.code if isinstance(done.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err
