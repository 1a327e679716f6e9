"""Brute-force oracle: the exact optimum of small instances, by enumerating every placement.

Consumes the same inputs as :func:`planner.solve.search.search` (model, cluster, global batch,
sequence length, dtype, pins, runtime options); produces a :class:`BruteForceResult` holding the
fastest :class:`~planner.cost.model.Evaluation` that fits (or None) and how many placements were
enumerated. Tests use it to check the solver's optimum exactly; it is far too slow for real runs.

What is enumerated (the solver's space, nothing else):

* every outer configuration of :func:`planner.solve.space.enumerate_configs`;
* every contiguous split of the blocks into ``pp`` stages of >= 1 block; with interleaving
  (``virtual_stages > 1``) only Megatron-LM's: pp x v equal chunks, chunk k on rank k mod pp
  (:func:`planner.strategy.interleaved_rank`), as the solver does (the V schedules ZB-V and
  DualPipeV: chunk k on rank k, then 2 pp - 1 - k, the head back on rank 0); with a pinned
  pipeline layout (``Pins.pipeline_layout``) only the layout's blocks per chunk;
* every per-block :class:`~planner.strategy.LayerOption` assignment from the options the pins
  allow (``Pins.block_options``: the mesh layout with none / selective / full recomputation)
  whose recomputation the runtime's rule expresses exactly
  (:func:`planner.recompute_rules.settings_of`: Megatron's first N blocks of every chunk,
  torchtitan's one setting for all blocks) and whose activation offload Megatron-Core runs
  (:func:`planner.offload_rules.allows`: pp 1, no recomputation anywhere, the first N < L
  blocks per class; :func:`planner.offload_rules.searchable` drops the options no placement of
  the configuration may use);
* non-block layers on the stages of :func:`planner.strategy.default_placement` (the embedding
  on stage 0, the other non-block layers (head) on the last stage), with every option
  :func:`planner.strategy.edge_options` gives them (``NO_OPTION`` only, unless per-layer
  layouts are on; a tied embedding and head take the same layout).

Each placement is scored by the cost model and ranked as the search ranks plans: step time,
then peak memory (an equal step time goes to the leaner placement; then the first found), and
it must fit the memory the search allows (the GPU's memory less the headroom,
:mod:`planner.solve.headroom`). ``literal=True`` calls
:func:`planner.cost.model.evaluate` on every placement. The default computes the same numbers
with the same cost terms ``evaluate`` is made of (``layer_terms``, ``stage_memory``,
``stage_time``, ``step_time`` of :mod:`planner.cost.terms`, in the same order, so every float is
bit-identical), caching a stage's memory and time per (stage, layers, options) and skipping two
kinds of placement
that cannot win: one with a stage over the limit (``fits`` is a maximum over stages), and one
whose pipeline time alone is above the incumbent's step time (every other step-time term is
>= 0). The winner is re-evaluated with ``evaluate`` and must match to the last bit.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Iterator, Sequence

from planner import offload_rules
from planner.config import ParallelConfig, RuntimeOptions
from planner.cost.context import make_context
from planner.cost.model import Evaluation, evaluate
from planner.cost.terms import (LayerTerms, boundary_reshard_s, layer_terms,
                                option_valid, pipeline_s, stage_host_bytes, stage_memory,
                                stage_time, step_time, tied_config_terms)
from planner.hardware import Cluster
from planner.ir import LayerKind, ModelGraph
from planner.profiles import profile as runtime_profile
from planner.recompute_rules import chunk_runs, settings_of
from planner.solve.headroom import DEFAULT_HEADROOM, MemoryHeadroom
from planner.solve.space import Pins, enumerate_configs
from planner.strategy import (NO_OPTION, LayerOption, LayerPlacement, edge_options,
                               block_ranks, head_stage, interleaved_rank)

DEFAULT_BUDGET = 200_000  # placements; about a minute of enumeration on one core


@dataclass(frozen=True)
class BruteForceResult:
    best: Evaluation | None  # fastest placement that fits, None when nothing fits
    placements: int  # placements enumerated over all configurations
    configs: int  # outer configurations enumerated
    scored: int  # placements whose step time was computed (the rest were cut, see docstring)


def _splits(num_blocks: int, pp: int, virtual_stages: int, placement: str = "loop",
            fixed: Sequence[int] | None = None) -> Iterator[tuple[int, ...]]:
    """The stage of each block: every contiguous split into ``pp`` non-empty stages (cut points
    in lexicographic order), or only the interleaved one (round-robin, or the V's), or only
    ``fixed`` where given (an explicit pipeline layout's: planner.strategy.block_ranks)."""
    if fixed is not None:
        yield tuple(fixed)
        return
    if virtual_stages > 1:
        yield tuple(interleaved_rank(b, num_blocks, pp, virtual_stages, placement)
                    for b in range(num_blocks))
        return
    for cuts in itertools.combinations(range(1, num_blocks), pp - 1):
        bounds = (0,) + cuts + (num_blocks,)
        yield tuple(s for s in range(pp) for _ in range(bounds[s + 1] - bounds[s]))


def _config_splits(num_blocks: int, config) -> Iterator[tuple[int, ...]]:
    """:func:`_splits` of a configuration: its pipeline layout's, else its chunks' or every
    contiguous one."""
    return _splits(num_blocks, config.pp, config.virtual_stages, config.schedule_spec.placement,
                   block_ranks(config, num_blocks) if config.pipeline_layout else None)


def _num_splits(num_blocks: int, pp: int, virtual_stages: int) -> int:
    return 1 if virtual_stages > 1 else math.comb(num_blocks - 1, pp - 1)


def _allowed(pins: Pins, config: ParallelConfig,
             runtime: RuntimeOptions = RuntimeOptions()) -> tuple[LayerOption, ...]:
    return pins.block_options(config, runtime_profile(runtime.profile))


def count_placements(model: ModelGraph, cluster: Cluster, global_batch: int, seq_len: int,
                     dtype: str = "bf16", pins: Pins = Pins(),
                     runtime: RuntimeOptions = RuntimeOptions()) -> int:
    """How many placements :func:`brute_force` would enumerate (cheap: no cost model calls)."""
    blocks = model.num_blocks
    edges = len(model.layers) - blocks
    rule = runtime_profile(runtime.profile).recompute_rule
    total = 0
    for c in enumerate_configs(model, cluster, global_batch, seq_len, dtype, pins,
                               runtime_profile(runtime.profile)):
        allowed = _allowed(pins, c, runtime)
        if rule == "per-block":
            per_split = (1 if c.pipeline_layout else _num_splits(blocks, c.pp, c.virtual_stages)) \
                * len(allowed) ** blocks
        else:
            per_split = sum(_space_size(rule, stages, allowed)
                            for stages in _config_splits(blocks, c))
        total += per_split * len(edge_options(allowed)) ** edges
    return total


def _space_size(rule: str, stages: Sequence[int], allowed: Sequence[LayerOption]) -> int:
    """Per-block option tuples of one split whose recomputation the rule expresses."""
    vectors = settings_of(rule, chunk_runs(stages), {o.recompute.value for o in allowed})
    if vectors is None:
        return len(allowed) ** len(stages)
    per_value = {v: sum(1 for o in allowed if o.recompute.value == v) for vec in vectors
                 for v in vec}
    return sum(math.prod(per_value[v] for v in vec) for vec in vectors)


def _placement(model: ModelGraph, pp: int, block_stage: Sequence[int],
               block_options: Sequence[LayerOption],
               fixed: dict[int, LayerOption] | None = None, head: int = -1) -> LayerPlacement:
    """Full-model placement from per-block choices; non-block layers on default_placement's
    stages (the head on ``head``, -1: the last) with the options ``fixed`` gives them
    (NO_OPTION by default)."""
    stage, options, b = [], [], 0
    for i, layer in enumerate(model.layers):
        if layer.kind is LayerKind.BLOCK:
            stage.append(block_stage[b])
            options.append(block_options[b])
            b += 1
        else:
            stage.append(0 if layer.kind is LayerKind.EMBEDDING else head % pp)
            options.append((fixed or {}).get(i, NO_OPTION))
    return LayerPlacement(tuple(stage), tuple(options))


def _edge_assignments(model: ModelGraph, ctx, allowed) -> list[dict[int, LayerOption]]:
    """Every choice of options for the non-block layers (the embedding and head layouts), in
    lexicographic order; a tied embedding and head take the same layout."""
    edges = [i for i, layer in enumerate(model.layers) if layer.kind is not LayerKind.BLOCK]
    per = [[o for o in edge_options(allowed) if option_valid(ctx, model.layers[i], o)]
           for i in edges]
    out = []
    for combo in itertools.product(*per):
        choice = dict(zip(edges, combo))
        if model.tied_embeddings:
            tied = [choice[i].layout for i in edges
                    if model.layers[i].kind is LayerKind.EMBEDDING or model.layers[i].tied_params]
            if len(set(tied)) > 1:
                continue
        out.append(choice)
    return out


def brute_force(model: ModelGraph, cluster: Cluster, global_batch: int, seq_len: int,
                dtype: str = "bf16", pins: Pins = Pins(),
                runtime: RuntimeOptions = RuntimeOptions(), *, budget: int = DEFAULT_BUDGET,
                literal: bool = False, headroom: MemoryHeadroom = DEFAULT_HEADROOM,
                gate=None) -> BruteForceResult:
    """The fastest placement that fits over the solver's whole space (see module docstring).
    ``gate``: a :class:`planner.solve.gate.MemoryGate`: a placement must then fit at its
    band's quantile, its peak at most the limit over the factor of its configuration and
    of the recomputation policies its blocks use (the definition, placement by placement).

    Raises ValueError when the enumeration would exceed ``budget`` placements. An equal step
    time goes to the lower peak memory; full ties keep the first placement found (configurations in ``enumerate_configs`` order, splits and
    option tuples in lexicographic order).
    """
    total = count_placements(model, cluster, global_batch, seq_len, dtype, pins, runtime)
    if total > budget:
        raise ValueError(f"brute force would enumerate {total} placements of {model.name} on "
                         f"{cluster.num_gpus} GPUs, over the budget of {budget}; pin choices or "
                         "use a smaller instance")
    limit = headroom.limit_bytes(cluster.memory_bytes_per_gpu)
    best: tuple[tuple[float, float], ParallelConfig, LayerPlacement] | None = None
    configs = placements = scored = 0
    for config in enumerate_configs(model, cluster, global_batch, seq_len, dtype, pins,
                                    runtime_profile(runtime.profile)):
        configs += 1
        incumbent = best[0] if best is not None else (math.inf, math.inf)
        allowed = _allowed(pins, config, runtime)
        within = _gate_limit(gate, config, limit)
        if literal:
            found, n, k = _literal(model, cluster, config, runtime, allowed, incumbent, within)
        else:
            found, n, k = _fast(model, cluster, config, runtime, allowed, incumbent, within)
        placements += n
        scored += k
        if found is not None:
            best = (found[0], config, found[1])
    if best is None:
        return BruteForceResult(None, placements, configs, scored)
    ev = evaluate(model, cluster, best[1], best[2], runtime)
    kinds = {r.value for r, layer in zip(ev.placement.recompute, model.layers)
             if layer.kind is LayerKind.BLOCK}
    if ev.peak_memory_bytes > _gate_limit(gate, best[1], limit)(kinds) or (ev.step_time_s, ev.peak_memory_bytes) != best[0]:
        raise RuntimeError(f"brute force: evaluate() disagrees with the enumeration on "
                           f"{best[1]} {best[2]}: {ev.step_time_s!r} vs {best[0]!r}")
    return BruteForceResult(ev, placements, configs, scored)


def _gate_limit(gate, config: ParallelConfig, limit: float):
    """The peak a placement of ``config`` may reach, by the set of its blocks' recomputation
    policies: ``limit``, over the gate's factor for them when a gate is on (its attribute
    ``least``: the most any placement may reach, for cuts stage by stage)."""
    if gate is None or not gate.active:
        def within(kinds) -> float:
            return limit
        within.least = limit
        return within
    cache: dict[frozenset, float] = {}

    def within(kinds) -> float:
        key = frozenset(kinds)
        if key not in cache:
            factor = gate.factor(config, key)
            cache[key] = limit if factor == 1.0 else limit / factor
        return cache[key]
    # the factor only grows with the set of policies (an unseen one widens the band)
    within.least = max(within((v,)) for v in ("none", "selective", "full", "op"))
    return within


def _block_classes(model: ModelGraph) -> list[int]:
    """The layer class of every block (blocks of one class share their layout)."""
    out = []
    for ci, cls in enumerate(model.layer_classes()):
        if cls.layer.kind is LayerKind.BLOCK:
            out += [ci] * cls.count
    return out


def _consistent(classes: Sequence[int], rec: Sequence[LayerOption]) -> bool:
    """One layout per block class (the solver's space: layouts per class run)."""
    seen: dict[int, object] = {}
    return all(seen.setdefault(c, r.layout) is r.layout for c, r in zip(classes, rec))


def _rule_filter(rule: str, stages: Sequence[int], allowed: Sequence[LayerOption],
                 signatures: Sequence = ()):
    """Whether per-block options ``rec`` recompute as the runtime's rule can on this split
    (:func:`planner.recompute_rules.settings_of`, the rule's settings) and offload activations
    as Megatron-Core can (:func:`planner.offload_rules.allows`; ``signatures``: each block's
    layer signature)."""
    vectors = settings_of(rule, chunk_runs(stages), {o.recompute.value for o in allowed})
    ok = None if vectors is None else set(vectors)
    pp = max(stages, default=0) + 1
    if not any(o.act_offload for o in allowed):
        if ok is None:
            return lambda rec: True
        return lambda rec: tuple(r.recompute.value for r in rec) in ok

    def ruled(rec) -> bool:
        settings = tuple(r.recompute.value for r in rec)
        if ok is not None and settings not in ok:
            return False
        return offload_rules.allows(pp, settings, [r.act_offload for r in rec], signatures)
    return ruled


def _literal(model, cluster, config, runtime, allowed, incumbent, within):
    """Every placement through ``evaluate``: slow, the definition."""
    best = None
    n = 0
    ctx = make_context(model, cluster, config, runtime)
    blocks = [layer for layer in model.layers if layer.kind is LayerKind.BLOCK]
    classes = _block_classes(model)
    signatures = [layer.signature for layer in blocks]
    per_block = [[o for o in allowed if option_valid(ctx, layer, o)] for layer in blocks]
    head = head_stage(config)
    rule = runtime_profile(runtime.profile).recompute_rule
    for fixed, stages in itertools.product(
            _edge_assignments(model, ctx, allowed),
            list(_config_splits(model.num_blocks, config))):
        ruled = _rule_filter(rule, stages, allowed, signatures)
        for rec in itertools.product(*per_block):
            if not _consistent(classes, rec) or not ruled(rec):
                continue
            n += 1
            ev = evaluate(model, cluster, config,
                          _placement(model, config.pp, stages, rec, fixed, head), runtime)
            rank = (ev.step_time_s, ev.peak_memory_bytes)
            if ev.fits and ev.peak_memory_bytes <= within(
                    {r.recompute.value for r in rec}) and \
                    rank < (best[0] if best else incumbent):
                best = (rank, ev.placement)
    return best, n, n


def _fast(model, cluster, config, runtime, allowed, incumbent, within):
    """The same numbers as ``evaluate`` from its building blocks, with exact cuts, for every
    choice of the non-block layers' options."""
    ctx = make_context(model, cluster, config, runtime)
    best, n, k = None, 0, 0
    for fixed in _edge_assignments(model, ctx, allowed):
        found, dn, dk = _fast_edges(model, cluster, config, ctx, allowed, fixed,
                                    best[0] if best else incumbent, within)
        n, k = n + dn, k + dk
        if found is not None:
            best = found
    return best, n, k


def _fast_edges(model, cluster, config, ctx, allowed, fixed_options, incumbent, within):
    """:func:`_fast` with the non-block layers' options ``fixed_options``."""
    emb = [i for i, layer in enumerate(model.layers) if layer.kind is LayerKind.EMBEDDING]
    terms = tied_config_terms(ctx, fixed_options.get(emb[0], NO_OPTION).layout if emb
                              else NO_OPTION.layout)
    capacity = within.least  # a stage over the most any placement may reach: none fits
    pp, v = config.pp, config.virtual_stages
    head = head_stage(config)
    layers = model.layers
    block_index = [i for i, layer in enumerate(layers) if layer.kind is LayerKind.BLOCK]
    first_fixed = [i for i, layer in enumerate(layers)
                   if layer.kind is LayerKind.EMBEDDING]
    last_fixed = [i for i, layer in enumerate(layers)
                  if layer.kind not in (LayerKind.BLOCK, LayerKind.EMBEDDING)]
    cost: dict[tuple[int, LayerOption], LayerTerms] = {}
    classes = _block_classes(model)
    valid = {b: [o for o in allowed if option_valid(ctx, layers[i], o)]
             for b, i in enumerate(block_index)}
    block_of = {i: b for b, i in enumerate(block_index)}  # layer index -> block number
    signatures = [layers[i].signature for i in block_index]

    def layer(i: int, option: LayerOption) -> LayerTerms:
        key = (i, option)
        if key not in cost:
            cost[key] = layer_terms(ctx, layers[i], option)
        return cost[key]

    # One stage's choices: for the blocks ``members`` on stage s, every option tuple
    # whose stage fits, with its costs (in layer order, as evaluate builds them) and its time.
    # ``keep``: the recompute settings of these blocks that some setting of the runtime's rule
    # gives them on this split (None: any); the other tuples could never pass ``ruled`` below.
    stage_cache: dict[tuple[int, tuple[int, ...], frozenset | None], list] = {}
    single_layout = len({o.layout for o in allowed}) == 1

    def stage_options(s: int, members: tuple[int, ...], keep: frozenset | None) -> list:
        key = (s, members, keep)
        if key in stage_cache:
            return stage_cache[key]
        fixed = (first_fixed if s == 0 else []) + (last_fixed if s == head else [])
        # the stage's layers in layer order (as evaluate sums them): a block's position in
        # the option tuple, or its fixed option
        order = [(i, members.index(block_of[i]) if i in block_of else fixed_options.get(
            i, NO_OPTION)) for i in sorted(fixed + [block_index[b] for b in members])]
        out = []
        for rec in itertools.product(*(valid[b] for b in members)):
            if keep is not None and tuple(r.recompute.value for r in rec) not in keep:
                continue
            if not single_layout and not _consistent([classes[b] for b in members], rec):
                continue
            costs = [layer(i, rec[at] if isinstance(at, int) else at) for i, at in order]
            memory = stage_memory(terms, s, costs).total
            if memory <= capacity and stage_host_bytes(costs) <= terms.host_capacity_bytes:
                out.append((rec, costs, stage_time(terms, costs), memory))
        stage_cache[key] = out
        return out

    layered = len({o.layout for o in allowed}) > 1 or \
        any(o is not NO_OPTION for o in fixed_options.values())
    best = None
    n = k = 0
    bound = incumbent
    rule = runtime_profile(ctx.options.profile).recompute_rule
    values = {o.recompute.value for o in allowed}
    num_blocks = model.num_blocks
    for stages in _config_splits(num_blocks, config):
        n += _space_size(rule, stages, allowed)
        ruled = _rule_filter(rule, stages, allowed, signatures)
        members = [tuple(b for b, s in enumerate(stages) if s == i) for i in range(pp)]
        vectors = settings_of(rule, chunk_runs(stages), values)
        keep = [None if vectors is None else frozenset(tuple(vec[b] for b in members[i])
                                                      for vec in vectors) for i in range(pp)]
        options = [stage_options(i, members[i], keep[i]) for i in range(pp)]
        for combo in itertools.product(*options):
            rec = [NO_OPTION] * num_blocks
            for i, (stage_rec, _, _, _) in enumerate(combo):
                for b, r in zip(members[i], stage_rec):
                    rec[b] = r
            if not ruled(rec):
                continue
            if layered:
                if not _consistent(classes, rec):
                    continue
                placement = _placement(model, pp, stages, rec, fixed_options, head)
                reshard = boundary_reshard_s(ctx, layers, placement.options, placement.stage, pp)
                times = [t + r for (_, _, t, _), r in zip(combo, reshard)]
            else:
                times = [t for _, _, t, _ in combo]
            stage_costs = [costs for _, costs, _, _ in combo]
            if pipeline_s(terms, stage_costs, times) > bound[0]:
                continue  # the other step-time terms are >= 0: cannot beat the incumbent
            k += 1
            total = step_time(terms, stage_costs, times).step_time_s
            rank = (total, max(memory for _, _, _, memory in combo))
            if rank < bound and rank[1] <= within({r.recompute.value for r in rec}):
                best = (rank, _placement(model, pp, stages, rec, fixed_options, head))
                bound = rank
    return best, n, k
