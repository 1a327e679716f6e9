"""Per-layer-class cost tables for one outer configuration: what the inner solver optimises over.

Consumes a :class:`~planner.cost.context.CostContext` and the per-block options to consider;
produces a :class:`StageProblem` holding, for every run of identical blocks and every
:class:`~planner.strategy.LayerOption`, the :class:`~planner.cost.terms.LayerTerms` record the
cost model adds up for a stage, and the configuration's :class:`~planner.cost.terms.ConfigTerms`.
The CP-SAT model (:mod:`planner.solve.inner`) and the bounds (:mod:`planner.solve.bounds`) read
these records and nothing else, so they agree with ``evaluate`` by construction.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cached_property

from planner.cost.context import CostContext
from planner.cost.terms import (ConfigTerms, LayerTerms, config_terms, embedding_sync_s,
                                layer_terms, option_valid, reshard_s)
from planner.ir import LayerKind
from planner.strategy import BLOCK_OPTIONS, NO_OPTION, LayerOption, block_ranks, edge_options


@dataclass(frozen=True)
class BlockClass:
    """``count`` identical blocks at layer indices ``start .. start+count-1``."""

    start: int  # index in model.layers
    first_block: int  # index among blocks
    count: int
    options: tuple[LayerOption, ...]
    costs: tuple[LayerTerms, ...]  # one per option


@dataclass(frozen=True)
class StageProblem:
    ctx: CostContext
    classes: tuple[BlockClass, ...]
    num_blocks: int
    pre: tuple[int, ...]  # non-block layer indices before the first block (stage 0)
    post: tuple[int, ...]  # non-block layer indices after the last block (last stage)
    pre_costs: tuple[LayerTerms, ...]  # with the mesh layout (NO_OPTION)
    post_costs: tuple[LayerTerms, ...]
    # the bytes per GPU a stage may use: the GPU's memory less the search's headroom
    # (planner/solve/headroom.py); None: the whole GPU (ConfigTerms.capacity_bytes)
    capacity_bytes: float | None = None
    # Per non-block layer (pre then post), the options it may take (NO_OPTION first) and their
    # terms: with per-layer layouts the embedding and head pick a layout too.
    edge_options: tuple[tuple[LayerOption, ...], ...] = ()
    edge_costs: tuple[tuple[LayerTerms, ...], ...] = ()

    @cached_property  # the bounds read it many times per configuration
    def terms(self) -> ConfigTerms:
        return config_terms(self.ctx)

    @cached_property
    def block_ranks(self) -> tuple[int, ...] | None:
        """Each block's rank where the configuration fixes it (interleaved chunks, an explicit
        pipeline layout), None where the solver places the blocks: planner.strategy.block_ranks"""
        return block_ranks(self.ctx.config, self.num_blocks)

    @property
    def memory_limit_bytes(self) -> float:
        return self.terms.capacity_bytes if self.capacity_bytes is None else self.capacity_bytes

    def edge_choices(self, index: int) -> tuple[tuple[LayerOption, LayerTerms], ...]:
        """(option, terms) of non-block layer ``index`` (mesh only when none were given)."""
        edges = self.pre + self.post
        if not self.edge_options:
            fixed = self.pre_costs + self.post_costs
            return ((NO_OPTION, fixed[edges.index(index)]),)
        k = edges.index(index)
        return tuple(zip(self.edge_options[k], self.edge_costs[k]))

    def fixed_extreme(self, name: str, pick=min) -> float:
        """Sum over the non-block layers of ``pick`` of the term ``name`` over their options
        (bounds: the least any choice of embedding and head layouts can cost)."""
        key = ("fixed", name, pick)
        if key not in self._sums:
            if not self.edge_options:  # the mesh terms only (edge_choices' fallback), in order
                value = sum(getattr(x, name) for x in self.pre_costs + self.post_costs)
            else:  # edge_costs[k]: the options' terms of layer (pre + post)[k]
                value = sum(pick(getattr(x, name) for x in costs) for costs in self.edge_costs)
            self._sums[key] = value
        return self._sums[key]

    def class_sum(self, names: str | tuple[str, ...], pick=min) -> float:
        """Sum over the block classes of ``count x pick`` over the class's options of the
        term ``names`` (a tuple: their sum): the bounds' per-class extremes."""
        key = ("classes", names, pick)
        if key not in self._sums:
            attrs = (names,) if isinstance(names, str) else names
            self._sums[key] = sum(pick(sum(getattr(x, a) for a in attrs) for x in cls.costs)
                                  * cls.count for cls in self.classes)
        return self._sums[key]

    @cached_property
    def _sums(self) -> dict:
        # these sums read the layer terms only, never the context, so copies made by
        # with_context share them
        return {}

    def with_context(self, ctx: CostContext) -> "StageProblem":
        """The same layer terms under another configuration's context (one that shares them:
        :func:`planner.solve.candidates.terms_key`); faster than ``dataclasses.replace``, and
        the block and edge sums are shared. Caches that read the context are not copied."""
        new = object.__new__(StageProblem)
        new.__dict__.update({name: self.__dict__[name] for name in _FIELDS})
        new.__dict__["ctx"] = ctx
        new.__dict__["_sums"] = self._sums
        return new

    def sync_choices(self) -> tuple[tuple[int, tuple[float, ...]], ...]:
        """(embedding index, the tied table's gradient-sync seconds per option of it), for
        the embedding(s) among the non-block layers (``embedding_sync_s`` of its layout)."""
        return self._sync_choices

    @cached_property  # the bounds read it several times per configuration
    def _sync_choices(self) -> tuple[tuple[int, tuple[float, ...]], ...]:
        layers = self.ctx.model.layers
        return tuple((j, tuple(embedding_sync_s(self.ctx, o.layout)
                               for o, _ in self.edge_choices(j)))
                     for j in self.pre if layers[j].kind is LayerKind.EMBEDDING)

    def least_sync_s(self) -> float:
        """The least tied-table sync any choice of the embedding's layout gives (bounds)."""
        choices = self.sync_choices()
        return min(choices[0][1]) if choices else self.terms.embedding_sync_s

    def layouts(self, ci: int) -> tuple:
        """The layouts class ``ci``'s options use (in option order, each once)."""
        return tuple(dict.fromkeys(o.layout for o in self.classes[ci].options))

    def reshard_s(self, before_index: int, after_index: int, before, after) -> float:
        """Resharding seconds between layer ``before_index`` (layout ``before``) and the next
        layer ``after_index`` (layout ``after``): :func:`planner.cost.terms.reshard_s`."""
        del before_index
        layer = self.ctx.model.layers[after_index]
        return reshard_s(self.ctx, layer.hidden, before, after, layer.seq_len)


_FIELDS = tuple(f.name for f in fields(StageProblem))


def stage_problem(ctx: CostContext, options: tuple[LayerOption, ...] = BLOCK_OPTIONS,
                  capacity_bytes: float | None = None) -> StageProblem:
    model = ctx.model
    layers = model.layers
    block_idx = [i for i, layer in enumerate(layers) if layer.kind is LayerKind.BLOCK]
    first, last = block_idx[0], block_idx[-1]
    if block_idx != list(range(first, last + 1)):
        raise ValueError("non-block layers between blocks are not supported by the solver")
    classes: list[BlockClass] = []
    for cls in model.layer_classes():
        if cls.layer.kind is not LayerKind.BLOCK:
            continue
        mine = tuple(o for o in options if option_valid(ctx, cls.layer, o))
        costs = tuple(layer_terms(ctx, cls.layer, o) for o in mine)
        classes.append(BlockClass(cls.start, cls.start - first, cls.count, mine, costs))
    pre = tuple(range(0, first))
    post = tuple(range(last + 1, len(layers)))
    edge_opts = tuple(tuple(o for o in edge_options(options) if option_valid(ctx, layers[i], o))
                      for i in pre + post)
    return StageProblem(
        ctx, tuple(classes), len(block_idx), pre, post,
        tuple(layer_terms(ctx, layers[i], NO_OPTION) for i in pre),
        tuple(layer_terms(ctx, layers[i], NO_OPTION) for i in post), capacity_bytes,
        edge_opts, tuple(tuple(layer_terms(ctx, layers[i], o) for o in opts)
                         for i, opts in zip(pre + post, edge_opts)))
