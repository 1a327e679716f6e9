"""Remedies for a plan over capacity: single changes (full or selective recomputation of a stage,
a higher ZeRO stage, recomputation everywhere, micro-batch 1), then all of them at once, each
re-evaluated with the cost model and reported with the GiB it saves on every stage over capacity.

Consumes the plan's model, cluster, config, placement and runtime options and its evaluation;
produces :class:`~planner.check_report.Remedy` values.
"""
from __future__ import annotations

from dataclasses import replace

from planner.check_report import Remedy
from planner.config import ParallelConfig, RuntimeOptions
from planner.cost.model import Evaluation, evaluate
from planner.errors import PlannerError
from planner.hardware import GIB, Cluster
from planner.ir import LayerKind, ModelGraph
from planner.strategy import LayerPlacement, Recompute

def _stage_totals(ev: Evaluation) -> list[float]:
    return [s.memory.total for s in ev.stages]


def _try(model, cluster, config, placement, options) -> Evaluation | None:
    try:
        return evaluate(model, cluster, config, placement, options)
    except PlannerError:
        return None


def remedies(model: ModelGraph, cluster: Cluster, config: ParallelConfig,
              placement: LayerPlacement, options: RuntimeOptions,
              before: Evaluation) -> list[Remedy]:
    capacity = cluster.memory_bytes_per_gpu
    totals = _stage_totals(before)
    over = [s for s, t in enumerate(totals) if t > capacity]
    blocks = [i for i, layer in enumerate(model.layers) if layer.kind is LayerKind.BLOCK]

    def with_recompute(targets: list[int], value: Recompute, only_from: tuple[Recompute, ...]):
        options = list(placement.options)
        for i in targets:
            if options[i].recompute in only_from:
                options[i] = replace(options[i], recompute=value)
        return LayerPlacement(placement.stage, tuple(options))

    candidates: list[tuple[str, str, ParallelConfig, LayerPlacement]] = []
    for s in over:
        on_stage = [i for i in blocks if placement.stage[i] == s]
        if any(placement.recompute[i] is not Recompute.FULL for i in on_stage):
            candidates.append((f"recompute=full@stage:{s}",
                               f"full recomputation of the {len(on_stage)} blocks on stage {s}",
                               config, with_recompute(on_stage, Recompute.FULL,
                                                      (Recompute.NONE, Recompute.SELECTIVE))))
        if any(placement.recompute[i] is Recompute.NONE for i in on_stage):
            candidates.append((f"recompute=selective@stage:{s}",
                               f"selective recomputation (attention core) on stage {s}",
                               config, with_recompute(on_stage, Recompute.SELECTIVE,
                                                      (Recompute.NONE,))))
    if config.dp * config.cp > 1:
        for z in range(config.zero_stage + 1, 4):
            candidates.append((f"zero={z}", f"ZeRO-{z} (shard {_ZERO_SHARDS[z]} over dp x cp = "
                                            f"{config.dp * config.cp})",
                               replace(config, zero_stage=z), placement))
    if config.pp > 1:  # with one stage this is the per-stage change above
        if any(placement.recompute[i] is not Recompute.FULL for i in blocks):
            candidates.append(("recompute=full", "full recomputation of every block", config,
                               with_recompute(blocks, Recompute.FULL,
                                              (Recompute.NONE, Recompute.SELECTIVE))))
    if config.micro_batch > 1:
        candidates.append(("micro_batch=1", f"micro-batch 1 instead of {config.micro_batch} "
                                            f"({config.global_batch // config.dp} micro-batches "
                                            f"per step)",
                           replace(config, micro_batch=1), placement))
    out: list[Remedy] = []
    for key, change, cfg, plc in candidates:
        ev = _try(model, cluster, cfg, plc, options)
        if ev is None:
            continue
        after = _stage_totals(ev)
        out.append(Remedy(key, change, tuple((s, (totals[s] - after[s]) / GIB) for s in over),
                          max(after) / GIB, max(after) <= capacity))
    if not any(r.fits for r in out):
        # everything at once: the most memory this pipeline split can save
        cfg = replace(config, zero_stage=3 if config.dp * config.cp > 1 else config.zero_stage,
                      micro_batch=1)
        plc = with_recompute(blocks, Recompute.FULL, (Recompute.NONE, Recompute.SELECTIVE))
        ev = _try(model, cluster, cfg, plc, options)
        if ev is not None and (cfg != config or plc != placement):
            after = _stage_totals(ev)
            out.append(Remedy("combined", "all of: " + ", ".join(
                part for part in ("ZeRO-3" if cfg.zero_stage != config.zero_stage else "",
                                  "full recomputation of every block" if plc != placement else "",
                                  "micro-batch 1" if cfg.micro_batch != config.micro_batch else "")
                if part), tuple((s, (totals[s] - after[s]) / GIB) for s in over),
                max(after) / GIB, max(after) <= capacity))
    return out


_ZERO_SHARDS = {1: "optimizer states", 2: "optimizer states and gradients",
                3: "optimizer states, gradients and parameters"}
