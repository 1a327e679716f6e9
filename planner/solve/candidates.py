"""Propose and bound: every valid outer configuration of the space with its lower bounds.

Consumes a model, a cluster, the training inputs, the user's pins and the runtime options;
produces :class:`Candidate` values (configuration, its :class:`~planner.solve.costs.StageProblem`
and its time and memory lower bounds from :mod:`planner.solve.bounds`), sorted by time bound.
The search (:mod:`planner.solve.search`) solves them in that order; the infeasibility
explanation (:mod:`planner.solve.explain`) reads them to say how close the space came.
"""
from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field

from planner.config import ParallelConfig, RuntimeOptions
from planner.cost.context import make_context
from planner.errors import ErrorKind, PlannerError
from planner.hardware import Cluster
from planner.ir import ModelGraph
from planner.profiles import profile as runtime_profile
from planner.solve.bounds import (fitting_time_lower_bound, free_memory_lower_bound,
                                  free_time_lower_bound, rule_problems)
from planner.solve.costs import StageProblem, stage_problem
from planner.solve.space import Pins, enumerate_configs


@dataclass(frozen=True)
class Candidate:
    config: ParallelConfig
    problem: StageProblem
    time_lb_s: float  # no placement of this configuration is faster
    memory_lb_bytes: float
    capacity_bytes: float = math.inf  # what a stage may use
    # the problem cut to each group of the runtime's recompute rule (bounds.rule_problems)
    parts: tuple[StageProblem, ...] = field(default=(), compare=False, repr=False)
    # the block recomputation policies this candidate's placements keep (None: all its
    # options'): a configuration with two memory gates is two candidates (planner/solve/gate.py)
    recompute: frozenset | None = None

    def block_options(self, allowed: tuple) -> tuple:
        """``allowed`` cut to this candidate's recomputation policies."""
        if self.recompute is None:
            return allowed
        return tuple(o for o in allowed if o.recompute.value in self.recompute)

    @functools.cached_property
    def fit_lb_s(self) -> float:
        """No placement that fits the memory limit is faster (>= time_lb_s; inf: none fits).
        Computed when first read: the search reads it only for the candidates that come up in
        its queue (by ``time_lb_s``), a few hundred of DeepSeek-V3's 20,000 on 2,048 GPUs."""
        if self.memory_lb_bytes > self.capacity_bytes:
            return math.inf
        parts = self.parts or (self.problem,)
        return max(self.time_lb_s, min(fitting_time_lower_bound(q) for q in parts))


def candidates(model: ModelGraph, cluster: Cluster, global_batch: int, seq_len: int,
               dtype: str, pins: Pins, runtime: RuntimeOptions,
               deadline: float = math.inf, memory_limit_bytes: float | None = None,
               gate=None) -> list[Candidate]:
    """Every valid outer configuration with its bounds, sorted by time bound; raises
    SOLVER_LIMIT if ``deadline`` (time.monotonic()) passes while enumerating.
    ``memory_limit_bytes``: what a stage may use (default: the GPU's memory). ``gate``: a
    :class:`planner.solve.gate.MemoryGate`; a configuration's stages may then use the limit
    over its gate's factor, and a configuration with two gates is two candidates."""
    prof = runtime_profile(runtime.profile)  # the search enumerates what the runtime can run
    out = []
    capacity = cluster.memory_bytes_per_gpu if memory_limit_bytes is None else memory_limit_bytes
    # The memory lower bound grows with the micro-batch (states do not depend on it, stored
    # activations are proportional to it) and the space yields micro-batches in increasing
    # order: once one is over capacity, the larger ones of the same configuration are too.
    over: set[tuple] = set()
    # Configurations that differ only in their virtual stages share their layers' terms
    # (:func:`terms_key`): computed once, with each configuration's own context.
    shared: dict[tuple, tuple[StageProblem, list[StageProblem]]] = {}
    for config in enumerate_configs(model, cluster, global_batch, seq_len, dtype, pins, prof):
        if time.monotonic() > deadline:
            raise PlannerError(ErrorKind.SOLVER_LIMIT,
                               f"the time limit ran out while enumerating configurations "
                               f"({len(out)} so far) before any plan was solved",
                               ("raise --time-limit", "pin some degrees with --pin"))
        family = _without_micro_batch(config)
        if family in over:
            continue
        ctx = make_context(model, cluster, config, runtime)
        key = terms_key(config)
        allowed = None
        variants: list[tuple[frozenset | None, float]] = [(None, 1.0)]
        if gate is not None and gate.active:
            allowed = pins.block_options(config, prof)
            variants = gate.variants(config, {o.recompute.value for o in allowed})
        all_over = True
        for kept, factor in variants:
            # the limit over the factor the band's quantile puts on the prediction (gate.py)
            limit = capacity if factor == 1.0 else capacity / factor
            if (key, kept) in shared:
                base, base_parts = shared[key, kept]
                problem = base.with_context(ctx)
                parts = [problem if q is base else q.with_context(ctx) for q in base_parts]
            else:
                options = pins.block_options(config, prof) if kept is None else \
                    tuple(o for o in allowed if o.recompute.value in kept)
                problem = stage_problem(ctx, options, limit)
                parts = rule_problems(problem)
                shared[key, kept] = (problem, parts)
            # under the recompute rule: the least over the rule's groups of settings (bounds.py)
            memories = [free_memory_lower_bound(q) for q in parts]
            memory_lb = min(memories)
            all_over = all_over and memory_lb > limit
            fitting = [q for q, mem in zip(parts, memories) if mem <= limit] or parts
            time_lb = min(free_time_lower_bound(q) for q in fitting)
            out.append(Candidate(config, problem, time_lb, memory_lb, limit, tuple(parts),
                                 kept))
        if all_over:
            over.add(family)
    # stable, deterministic order: the time bound first, then the config's fields
    out.sort(key=lambda c: (c.time_lb_s, config_key(c.config), sorted(c.recompute or ())))
    return out


def terms_key(c: ParallelConfig) -> tuple:
    """What a configuration's layer terms and block options depend on: every field but its
    virtual stages, which change only configuration terms (in-flight micro-batches, boundary
    transfers, the bubble: :func:`planner.cost.terms.config_terms`), except under a V
    placement, where the head's stored activations are divided by its chunk's in-flight count
    (``tests/test_graph_search_speed.py`` checks the terms agree). ZeRO++ hpZ is a field like
    the others: its secondary partition is in the layers' states and gathers."""
    if c.schedule_spec.placement == "v":
        return config_key(c)
    return (c.tp, c.pp, c.dp, c.cp, c.ep, c.mesh.expert_tp, c.micro_batch, c.zero_stage,
            not c.sp, c.dp_shard, c.pipeline_schedule, c.hpz)


def config_key(c: ParallelConfig) -> tuple:
    return (c.tp, c.pp, c.dp, c.cp, c.ep, c.mesh.expert_tp, c.micro_batch, c.virtual_stages,
            c.zero_stage, not c.sp, c.dp_shard, c.pipeline_schedule, c.hpz)


def _without_micro_batch(c: ParallelConfig) -> tuple:
    return (c.tp, c.pp, c.dp, c.cp, c.ep, c.etp, c.virtual_stages, c.zero_stage, c.sp,
            c.dp_shard, c.pipeline_schedule, c.hpz)
