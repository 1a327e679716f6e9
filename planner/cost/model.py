"""The cost model's entry point: step time and per-GPU memory of one configuration, stage by stage.

Consumes a ModelGraph, a Cluster, a ParallelConfig, a LayerPlacement and RuntimeOptions; produces
an :class:`Evaluation`. It is made of the cost terms of :mod:`planner.cost.terms` and nothing else
(one :class:`~planner.cost.terms.LayerTerms` per layer and option, one
:class:`~planner.cost.terms.ConfigTerms` per configuration): the solver's CP-SAT model and the
search's bounds are built from the same records, so ``shardplan plan`` and ``shardplan
evaluate`` agree on a configuration by construction (``tests/test_cost_terms.py``). The rank
layout of the mesh is :class:`planner.mesh.Mesh`.
"""
from __future__ import annotations

from dataclasses import dataclass

from planner.config import ParallelConfig, RuntimeOptions
from planner.strategy import LayerPlacement
from planner.cost.compute import Shard, attention_core_flops, layer_gemms
from planner.cost.context import make_context
from planner.cost.terms import (LayerTerms, MemoryBreakdown, StepBreakdown, boundary_reshard_s,
                                config_terms, embedding_layout, layer_terms, stage_host_bytes,
                                stage_memory, stage_time, step_time, tied_config_terms)
from planner.hardware import Cluster
from planner.ir import ModelGraph
from planner.placement import runtime_placement
from planner.profiles import profile


@dataclass(frozen=True)
class StageResult:
    index: int
    layers: tuple[int, ...]
    memory: MemoryBreakdown
    time_s: float  # per micro-batch
    compute_s: float
    comm_s: float
    host_bytes: float = 0.0  # offloaded optimizer states in host memory, per GPU


@dataclass(frozen=True)
class Evaluation:
    model: ModelGraph
    cluster: Cluster
    config: ParallelConfig
    placement: LayerPlacement
    options: RuntimeOptions
    stages: tuple[StageResult, ...]
    breakdown: StepBreakdown
    model_flops: float  # per step, no recomputation (PaLM App. B convention, causal attention halved)
    hw_flops: float  # per step, recomputation included

    @property
    def step_time_s(self) -> float:
        return self.breakdown.step_time_s

    @property
    def tokens_per_s(self) -> float:
        return self.config.global_batch * self.config.seq_len / self.step_time_s

    @property
    def model_tflops_per_gpu(self) -> float:
        return self.model_flops / self.step_time_s / self.cluster.num_gpus / 1e12

    @property
    def hw_tflops_per_gpu(self) -> float:
        return self.hw_flops / self.step_time_s / self.cluster.num_gpus / 1e12

    @property
    def mfu(self) -> float:
        return self.model_tflops_per_gpu / self.cluster.gpu.peak_tflops[self.config.dtype]

    @property
    def peak_memory_bytes(self) -> float:
        return max(s.memory.total for s in self.stages)

    @property
    def fits(self) -> bool:
        """GPU memory, and host memory of offloaded optimizer states (Cluster.cpu_memory)."""
        host = self.cluster.cpu_memory.capacity_bytes if self.cluster.cpu_memory is not None else 0.0
        return self.peak_memory_bytes <= self.cluster.memory_bytes_per_gpu and \
            all(s.host_bytes <= host for s in self.stages if s.host_bytes)


def model_flops_per_step(model: ModelGraph, config: ParallelConfig) -> float:
    """Training FLOPs of one step without recomputation: 3 x forward, GEMMs at tp = 1, the
    attention core counted causally halved whatever kernel runs it (PaLM App. B convention)."""
    per_sequence = 0.0
    for cls in model.layer_classes():
        layer = cls.layer
        shard = Shard(1, layer.seq_len or config.seq_len)  # a vision encoder: its image tokens
        flops = sum(g.flops for g in layer_gemms(layer, shard))
        if layer.attention is not None:
            flops += attention_core_flops(layer.attention, shard, "flash")
        per_sequence += flops * cls.count
    return 3 * per_sequence * config.global_batch


def evaluate(model: ModelGraph, cluster: Cluster, config: ParallelConfig,
             placement: LayerPlacement | None = None,
             options: RuntimeOptions = RuntimeOptions()) -> Evaluation:
    """Predict step time and per-GPU memory of one configuration (validated first); without a
    placement, the runtime profile's default split (planner/placement.py) with no recomputation."""
    config.validate(model, cluster)
    if placement is None:
        placement = runtime_placement(model, config, profile(options.profile))
    ctx = make_context(model, cluster, config, options)
    terms = tied_config_terms(ctx, embedding_layout(model.layers, placement.options))
    stage_layers = [placement.layers_of_stage(s) for s in range(config.pp)]
    cache: dict = {}  # identical layers (same signature) cost the same: compute each once

    def cost(i: int) -> LayerTerms:
        key = (model.layers[i].signature, placement.options[i])
        if key not in cache:
            cache[key] = layer_terms(ctx, model.layers[i], placement.options[i])
        return cache[key]

    stage_costs = [[cost(i) for i in layers] for layers in stage_layers]
    reshard = boundary_reshard_s(ctx, model.layers, placement.options, placement.stage,
                                 config.pp)
    times = [stage_time(terms, costs) + reshard[s] for s, costs in enumerate(stage_costs)]
    stages = tuple(
        StageResult(index=s, layers=tuple(stage_layers[s]),
                    memory=stage_memory(terms, s, stage_costs[s]), time_s=times[s],
                    compute_s=sum(x.compute_s for x in stage_costs[s]),
                    comm_s=times[s] - sum(x.compute_s for x in stage_costs[s]),
                    host_bytes=stage_host_bytes(stage_costs[s]))
        for s in range(config.pp))
    breakdown = step_time(terms, stage_costs, times)
    m = config.num_micro_batches
    hw = sum(x.hw_flops for costs in stage_costs for x in costs) * m * config.dp * config.tp * config.cp
    return Evaluation(model, cluster, config, placement, options, stages, breakdown,
                      model_flops_per_step(model, config), hw)
