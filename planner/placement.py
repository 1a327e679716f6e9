"""A runtime's default stage placement: which pipeline stage each layer lands on when the user
gives no layout (``evaluate``, the calibration runs, :func:`planner.cost.model.evaluate` without
a placement).

* Megatron-LM / Megatron-Core, torchtitan: :func:`planner.strategy.default_placement` (blocks
  spread evenly, earlier stages take the remainder).
* DeepSpeed ``PipelineModule(partition_method="type:REGEX")`` (its profile's ``pp_partition``,
  Megatron-DeepSpeed's ``GPTModelPipe`` passes ``"type:transformer"``; BLOOM's runs published
  ``"type:transformer|embedding"``): :func:`deepspeed_type_stages`.

The search (planner/solve/) chooses its own contiguous splits, which include every one of these.
"""
from __future__ import annotations

import re
from functools import lru_cache

from planner.errors import invalid
from planner.ir import LayerKind, ModelGraph
from planner.profiles import PROFILES, RuntimeProfile
from planner.strategy import NO_OPTION, LayerOption, LayerPlacement, default_placement

# The class names DeepSpeed's ``partition_method="type:REGEX"`` matches for each layer of a
# Megatron-DeepSpeed GPTModelPipe (megatron/model/gpt_model.py): the blocks are
# ParallelTransformerLayerPipe, the embedding is EmbeddingPipe, and a tied LM head is the same
# EmbeddingPipe (TiedLayerSpec 'embed', forward_fn _logits_helper) after the final layer norm.
_DEEPSPEED_CLASS = {LayerKind.BLOCK: "ParallelTransformerLayerPipe",
                    LayerKind.EMBEDDING: "EmbeddingPipe"}


@lru_cache(maxsize=256)
def partition_balanced(weights: tuple[int, ...], num_parts: int) -> tuple[int, ...]:
    """DeepSpeed's ``partition_balanced`` (deepspeed/runtime/utils.py, v0.12.5 on: the linear
    partition by dynamic programming that replaced the ``_lprobe`` bottleneck probe): the
    contiguous split into ``num_parts`` parts with the least spread between the heaviest and the
    lightest part, ties to the latest cut (its ``>=``); the parts' start indices and ``n``.
    Fewer items than parts: ``partition_uniform``'s one item each."""
    n, m = len(weights), num_parts
    if n <= m:
        return tuple(min(p, n) for p in range(m + 1))
    import numpy as np  # deferred: only a DeepSpeed pipeline needs it
    prefix = np.concatenate(([0.0], np.cumsum(np.asarray(weights, dtype=float))))
    seg = prefix[:, None] - prefix[None, :]  # seg[i, k]: the weight of items k..i-1
    earlier = np.tri(n + 1, k=-1, dtype=bool)  # k < i
    dp_max = np.full((n + 1, m + 1), np.inf)
    dp_min = np.full((n + 1, m + 1), np.inf)
    position = np.zeros((n + 1, m + 1), dtype=int)
    dp_max[0, 0] = 0.0
    with np.errstate(invalid="ignore"):  # inf - inf on unreachable cells: never chosen
        for j in range(1, m + 1):
            hi = np.maximum(dp_max[None, :, j - 1], seg)
            lo = np.minimum(dp_min[None, :, j - 1], seg)
            cost = np.where(earlier, np.nan_to_num(hi - lo, nan=np.inf), np.inf)
            # DeepSpeed's loop keeps the last k of least cost (``dp_cost[i, j] >= cost``)
            k = n - np.argmin(cost[:, ::-1], axis=1)
            rows = np.arange(n + 1)
            position[:, j] = k
            dp_max[:, j], dp_min[:, j] = hi[rows, k], lo[rows, k]
            dp_max[:j, j] = dp_min[:j, j] = np.inf  # fewer items than parts: unreachable
    parts = [n]
    for j in range(m, 0, -1):
        parts.append(int(position[parts[-1], j]))
    return tuple(parts[::-1])


def deepspeed_type_stages(model: ModelGraph, pp: int, method: str) -> tuple[int, ...]:
    """Each layer's pipeline stage under DeepSpeed's ``PipelineModule(partition_method=
    "type:REGEX")`` (deepspeed/runtime/pipe/module.py ``_partition_layers``): a layer whose class
    name matches REGEX (case-insensitive, ``_find_layer_type``) weighs 1, any other 0, split by
    :func:`partition_balanced`."""
    pattern = re.compile(method.split(":", 1)[1], re.IGNORECASE)
    names = [_DEEPSPEED_CLASS.get(layer.kind, "EmbeddingPipe" if layer.kind is LayerKind.HEAD
                                  and layer.tied_params else "LayerNorm")
             for layer in model.layers]
    parts = partition_balanced(tuple(1 if pattern.search(name) else 0 for name in names), pp)
    return tuple(next(s for s in range(pp) if parts[s] <= i < parts[s + 1])
                 for i in range(len(names)))


def runtime_placement(model: ModelGraph, config, prof: RuntimeProfile,
                      block_option: LayerOption = NO_OPTION, partition: str = ""
                      ) -> LayerPlacement:
    """The stages ``prof``'s runtime places the layers on by default (``partition``: a published
    ``partition_method`` overriding the profile's), ``block_option`` on every block. A DeepSpeed
    ``type:`` partition applies to a plain (non-interleaved) pipeline. An explicit
    ``config.pipeline_layout`` (planner/pipeline_layout.py) needs a runtime that runs uneven
    chunks (the profile's ``uneven_chunks``: Megatron's --pipeline-model-parallel-layout,
    torchtitan's per-stage layer counts) and excludes ``partition``."""
    if getattr(config, "pipeline_layout", ""):
        if not prof.uneven_chunks:
            runs = ", ".join(p.name for p in PROFILES.values() if p.uneven_chunks)
            raise invalid(f"runtime {prof.name} cannot run an explicit pipeline layout: its "
                          f"pipeline stages are not set layer by layer (profile uneven_chunks "
                          f"is off)", f"use --runtime {runs.split(', ')[0]} (runtimes that take "
                          f"one: {runs}), or leave --pipeline-layout out")
        if partition:
            raise invalid("--pipeline-layout and --pp-partition both set the pipeline split; "
                          "give one")
    base = default_placement(model, config, block_option)
    if partition and not prof.pp_partition:
        raise invalid(f"runtime {prof.name} has no pipeline partition method (got "
                      f"{partition!r})", "a partition method is DeepSpeed's PipelineModule "
                      "partition_method: pass it with --runtime deepspeed")
    if partition and (not partition.startswith("type:") or not partition[5:]):
        raise invalid(f"pipeline partition method {partition!r} is not 'type:REGEX'",
                      "e.g. type:transformer (Megatron-DeepSpeed's default) or "
                      "type:transformer|embedding (BLOOM's)")
    if partition:
        try:
            re.compile(partition[5:])
        except re.error as exc:
            raise invalid(f"pipeline partition method {partition!r}: bad regex ({exc})",
                          "give a Python regular expression after 'type:'") from None
    method = partition or prof.pp_partition
    if config.pp > 1 and config.virtual_stages == 1 and method.startswith("type:"):
        return LayerPlacement(deepspeed_type_stages(model, config.pp, method), base.options)
    return base
