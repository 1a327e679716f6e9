"""Brute-force oracle across pools: every stage-to-pool assignment the CP-SAT model allows (each
pool's -- and split stage shape's -- stages contiguous, within every pool's GPUs), every split of the blocks into contiguous
stages, every multiset of options per stage whose recomputation the runtime's rule expresses
(:func:`planner.recompute_rules.equivalent`), each scored with
:func:`planner.hetero.evaluate.hetero_evaluate`. Exponential: small instances only (the tests
compare it with :func:`planner.hetero.ilp.solve_pools`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations, combinations_with_replacement, permutations, product
from typing import Iterator, Sequence

from planner.config import ParallelConfig, RuntimeOptions
from planner.hetero.evaluate import HeteroEvaluation, hetero_evaluate
from planner.hetero.layout import StagePools
from planner.hetero.terms import pool_terms
from planner.ir import LayerKind, ModelGraph
from planner.profiles import profile as runtime_profile
from planner.recompute_rules import chunk_runs, equivalent
from planner.strategy import BLOCK_OPTIONS, NO_OPTION, LayerOption, LayerPlacement

MAX_PLACEMENTS = 2_000_000


@dataclass(frozen=True)
class HeteroBruteForce:
    best: HeteroEvaluation | None
    placements: int


def contiguous_assignments(names: Sequence[str], slots: Sequence[int], pp: int
                           ) -> Iterator[StagePools]:
    """Every assignment of pp stages to pools in which each pool's stages are contiguous and
    at most its slots."""
    seen = set()
    for k in range(1, len(names) + 1):
        for chosen in permutations(range(len(names)), k):
            for cuts in combinations(range(1, pp), k - 1):
                bounds = (0,) + cuts + (pp,)
                pools: list[str] = []
                ok = True
                for j, p in enumerate(chosen):
                    count = bounds[j + 1] - bounds[j]
                    if count > slots[p]:
                        ok = False
                        break
                    pools += [names[p]] * count
                if ok and tuple(pools) not in seen:
                    seen.add(tuple(pools))
                    yield StagePools(tuple(pools))


def _splits(num_blocks: int, pp: int) -> Iterator[tuple[int, ...]]:
    for cuts in combinations(range(1, num_blocks), pp - 1):
        bounds = (0,) + cuts + (num_blocks,)
        yield tuple(bounds[i + 1] - bounds[i] for i in range(pp))


def brute_force_pools(model: ModelGraph, cluster, config: ParallelConfig,
                      options: RuntimeOptions = RuntimeOptions(),
                      block_options: tuple[LayerOption, ...] = BLOCK_OPTIONS,
                      slowdown: Sequence[float] | None = None,
                      fixed_pools: StagePools | None = None,
                      splits: Sequence[tuple[tuple[str, int], ...]] = ()) -> HeteroBruteForce:
    """The fastest placement that fits (None if none does), and how many were scored.
    ``splits``: the split stage shapes offered besides the pools (as to the CP-SAT model)."""
    terms = pool_terms(model, cluster, config, options, block_options, splits=splits)
    names = [t.name for t in terms]
    slots = [t.max_stages for t in terms]
    blocks = [i for i, layer in enumerate(model.layers) if layer.kind is LayerKind.BLOCK]
    pp = config.pp
    room = {pool: total for t in terms for pool, _, total in t.gpus}

    def within_gpus(stage_pools: StagePools) -> bool:
        used: dict[str, int] = {}
        for name in stage_pools.pools:
            for pool, per_stage, _ in terms[names.index(name)].gpus:
                used[pool] = used.get(pool, 0) + per_stage
        return all(n <= room[pool] for pool, n in used.items())

    assignments = [fixed_pools] if fixed_pools is not None else \
        [a for a in contiguous_assignments(names, slots, pp) if within_gpus(a)]
    best: HeteroEvaluation | None = None
    scored = 0
    rule = runtime_profile(options.profile).recompute_rule
    classes = [ci for ci, cls in enumerate(model.layer_classes())
               if cls.layer.kind is LayerKind.BLOCK for _ in range(cls.count)]
    for stage_pools in assignments:
        for counts in _splits(len(blocks), pp):
            per_stage = [list(combinations_with_replacement(block_options, k)) for k in counts]
            if math.prod(len(x) for x in per_stage) * len(assignments) > MAX_PLACEMENTS:
                raise ValueError("instance too large for the brute-force oracle")
            for choice in product(*per_stage):
                stage = []
                opts = []
                for s, combo in enumerate(choice):
                    stage += [s] * len(combo)
                    opts += list(combo)
                if rule != "per-block" and equivalent(
                        rule, chunk_runs(stage), classes,
                        [o.recompute.value for o in opts]) is None:
                    continue  # a mix the runtime's recompute rule cannot express
                placement = _placement(model, blocks, stage, opts, pp)
                ev = hetero_evaluate(model, cluster, config, stage_pools, placement, options,
                                     slowdown, terms)
                scored += 1
                if ev.fits and (best is None or ev.step_time_s < best.step_time_s):
                    best = ev
    return HeteroBruteForce(best, scored)


def _placement(model: ModelGraph, blocks: list[int], block_stage: list[int],
               block_options: list[LayerOption], pp: int) -> LayerPlacement:
    stage, options = [], []
    by_index = dict(zip(blocks, zip(block_stage, block_options)))
    for i, layer in enumerate(model.layers):
        if i in by_index:
            s, o = by_index[i]
            stage.append(s)
            options.append(o)
        else:
            stage.append(0 if layer.kind is LayerKind.EMBEDDING else pp - 1)
            options.append(NO_OPTION)
    return LayerPlacement(tuple(stage), tuple(options))
