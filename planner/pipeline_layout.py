"""Megatron-Core's ``--pipeline-model-parallel-layout``: read, check and write it, in one place.

The grammar is Megatron-Core's ``PipelineParallelLayerLayout.parse_str_to_list``
(megatron/core/transformer/pipeline_parallel_layer_layout.py): ``E`` the embedding, ``t`` a
decoder layer, ``m`` a multi-token-prediction layer, ``L`` the loss (final norm, output layer,
loss), ``|`` between model chunks; ``,`` is cosmetic and dropped; ``(...)*N`` repeats the
parenthesised text N times (no nesting), then ``x*N`` repeats one symbol N times. The chunks
are in model order, virtual-stage-major: chunk ``k`` of ``pp x v`` runs on pipeline rank
``k mod pp`` as its virtual stage ``k // pp``. Example: Llama 3.1 405B's 126 layers on pp 16 x v
4 with one layer fewer in the first and the last chunk (Llama 3 paper §3.3.2, "we reduce one
Transformer layer each from the first and the last stages") are ``Et|(tt|)*62tL``.

Megatron's checks (``__init__`` and ``validate_layer_layout``) are kept with the planner's
words: the chunk count is a multiple of pp; the embedding is the first and the loss the last
layer, once each; the decoder layers number ``--num-layers`` and the MTP layers
``--mtp-num-layers``, after every decoder layer. Two further rules are the planner's, where its
model differs: no chunk is empty (Megatron builds an empty chunk; the planner's placement, a
stage per layer, cannot hold one), and the MTP layers share the loss's chunk (the planner's
model graph runs them after the head, models/mtp.py).

Readers: ``shardplan evaluate --pipeline-layout`` and ``plan --pin pipeline_layout=``
(:class:`planner.config.ParallelConfig` ``pipeline_layout``, :func:`layer_chunks`,
:func:`planner.strategy.block_ranks`), bench/runtime_reference.py (Megatron's reading of
an exported command line), bench/moe_accuracy.py (the DeepSeek-V3 recipe layouts). Writer:
:func:`format_layout` (planner/export/megatron.py).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable

from planner.errors import invalid
from planner.ir import LayerKind, ModelGraph

SYMBOLS = {"E": "embedding", "t": "decoder layer", "m": "MTP layer", "L": "loss"}
# The most layers a layout may expand to: far beyond any model (the largest presets have a few
# hundred layers), small enough that a typo such as (t)*99999999 fails at once, not in memory.
MAX_LAYOUT_SYMBOLS = 1 << 16
_GROUP = re.compile(r"\(([^()]+)\)\*(\d+)")  # Megatron: r'\(([^)]+)\)\*(\d+)', no nesting
_SINGLE = re.compile(r"([EtmL|])\*(\d+)")  # Megatron: r'(.)\*(\d+)'
_EXAMPLE = "e.g. 'Et|(tt|)*62tL': E embedding, t decoder layer, m MTP layer, L loss, | chunks"


@dataclass(frozen=True)
class PipelineLayout:
    """A parsed layout: each model chunk's symbols, expanded, in model order."""

    chunks: tuple[str, ...]

    def __str__(self) -> str:
        return format_layout(self.chunks)

    @property
    def num_chunks(self) -> int:
        return len(self.chunks)

    @property
    def blocks(self) -> tuple[int, ...]:
        """Decoder layers (blocks) per chunk."""
        return tuple(chunk.count("t") for chunk in self.chunks)

    def virtual_stages(self, pp: int) -> int:
        """Chunks per pipeline rank; the chunk count must be a multiple of ``pp``."""
        if self.num_chunks % pp:
            raise invalid(f"the pipeline layout has {self.num_chunks} chunks, not a multiple of "
                          f"pp {pp} (chunk k runs on rank k mod pp: pp x virtual stages chunks)",
                          f"write {pp} x v chunks separated by |")
        return self.num_chunks // pp

    def rank_blocks(self, pp: int) -> list[list[int]]:
        """Blocks of each rank's chunks: ``[rank][virtual stage]`` (Megatron's 2-D layout)."""
        v = self.virtual_stages(pp)
        return [[self.blocks[k * pp + r] for k in range(v)] for r in range(pp)]

    def check(self, num_blocks: int, num_mtp: int = 0, model: str = "the model") -> None:
        """Megatron's ``validate_layer_layout`` (:meth:`megatron_check`) and the planner's two
        rules (module doc); raises PlannerError (INVALID_INPUT) naming what does not match."""
        empty = [k for k, chunk in enumerate(self.chunks) if not chunk]
        if empty:
            raise invalid(f"pipeline layout chunk {empty[0]} is empty (of {self.num_chunks}): "
                          "the planner places every chunk's layers on its rank and cannot model "
                          "a chunk without layers", "give every chunk at least one layer")
        self.megatron_check(num_blocks, num_mtp, model)
        if num_mtp and self.chunks[-1].count("m") != num_mtp:
            raise invalid("pipeline layout: the MTP layers (m) must share the last chunk with "
                          "the loss (L); the planner's model runs them after the head")

    def megatron_check(self, num_blocks: int, num_mtp: int = 0,
                       model: str = "the model") -> None:
        """Megatron-Core's ``validate_layer_layout``: the embedding first and the loss last,
        once each; ``num_blocks`` decoder layers and ``num_mtp`` MTP layers, the decoder
        layers first."""
        flat = "".join(self.chunks)
        if not flat:
            raise invalid("the pipeline layout holds no layer", _EXAMPLE)
        for symbol, where, name in (("E", 0, "first"), ("L", -1, "last")):
            count = flat.count(symbol)
            if count != 1 or flat[where] != symbol:
                raise invalid(f"pipeline layout: the {SYMBOLS[symbol]} ({symbol}) must be the "
                              f"{name} layer, once; the layout has {count} and its {name} "
                              f"layer is {flat[where]!r}", _EXAMPLE)
        blocks = flat.count("t")
        if blocks != num_blocks:
            raise invalid(f"the pipeline layout holds {blocks} decoder layers (t) but {model} "
                          f"has {num_blocks} blocks",
                          f"write {num_blocks} t in all (its chunks hold {_runs(self.blocks)} "
                          f"= {blocks})")
        mtp = flat.count("m")
        if mtp != num_mtp:
            raise invalid(f"the pipeline layout holds {mtp} MTP layers (m) but {model} has "
                          f"{num_mtp} (--mtp-layers)")
        if mtp and "t" in flat[flat.index("m"):]:
            raise invalid("pipeline layout: the decoder layers (t) must come before the MTP "
                          "layers (m)")

    def validate(self, pp: int, virtual_stages: int | None, num_blocks: int, num_mtp: int = 0,
                 model: str = "the model") -> int:
        """:meth:`check`, the chunk count against ``pp`` and, where given, ``virtual_stages``;
        returns the virtual stages."""
        self.check(num_blocks, num_mtp, model)
        v = self.virtual_stages(pp)
        if virtual_stages is not None and virtual_stages != v:
            raise invalid(f"the pipeline layout has {self.num_chunks} chunks = pp {pp} x {v} "
                          f"virtual stages, but --virtual-stages is {virtual_stages}",
                          "leave --virtual-stages out (the layout gives it) or write pp x "
                          "virtual stages chunks")
        return v


def _runs(counts: Iterable[int]) -> str:
    """Counts with repeats folded: 1, 2 x 62, 1."""
    out: list[list[int]] = []
    for n in counts:
        if out and out[-1][0] == n:
            out[-1][1] += 1
        else:
            out.append([n, 1])
    return ", ".join(f"{n} x {k}" if k > 1 else str(n) for n, k in out)


def parse_layout(text: str) -> PipelineLayout:
    """Megatron-Core's ``parse_str_to_list`` with clear errors (PlannerError, INVALID_INPUT)."""
    return _parse(text)


@lru_cache(maxsize=256)
def _parse(text: str) -> PipelineLayout:
    if not isinstance(text, str) or not text:
        raise invalid("the pipeline layout is empty", _EXAMPLE)
    body = text.replace(",", "")  # Megatron: "purely cosmetic commas"
    bad = sorted(set(body) - set(SYMBOLS) - set("|()*0123456789"))
    if bad:
        raise invalid(f"pipeline layout {text!r}: unknown character {bad[0]!r}", _EXAMPLE)
    for pattern in (_GROUP, _SINGLE):
        total = len(body) + sum(len(m.group(1)) * int(m.group(2)) - len(m.group(0))
                                for m in pattern.finditer(body))
        if total > MAX_LAYOUT_SYMBOLS:
            raise invalid(f"pipeline layout {text!r} expands to {total} symbols, more than "
                          f"{MAX_LAYOUT_SYMBOLS}", "check the repetition counts")
        body = pattern.sub(lambda m: m.group(1) * int(m.group(2)), body)
    stray = sorted(set(body) & set("()*0123456789"))
    if stray:
        raise invalid(f"pipeline layout {text!r}: {stray[0]!r} outside Megatron's repetitions "
                      "'(...)*N' (not nested) and 'x*N' of one symbol", _EXAMPLE)
    return PipelineLayout(tuple(body.split("|")))


def format_layout(chunks: Iterable[str]) -> str:
    """The layout string of these chunks (each chunk's symbols), expanded."""
    return "|".join(chunks)


def chunk_symbols(embedding: bool, blocks: int, mtp: int, loss: bool) -> str:
    """One chunk's symbols, in Megatron's order: ``E``, the decoder layers, MTP, ``L``."""
    return ("E" if embedding else "") + "t" * blocks + "m" * mtp + ("L" if loss else "")


def layer_chunks(model: ModelGraph, layout: PipelineLayout) -> tuple[int, ...]:
    """The chunk of each layer of ``model`` under ``layout`` (checked against it first): the
    n-th block in the chunk of the n-th ``t``, the layers before the first block (the
    embedding) in chunk 0, those after the last (head, MTP modules) in the last chunk."""
    layout.check(model.num_blocks, model.num_mtp, model.name)
    block_chunk = [k for k, n in enumerate(layout.blocks) for _ in range(n)]
    blocks = [i for i, layer in enumerate(model.layers) if layer.kind is LayerKind.BLOCK]
    out, b = [], 0
    for i, layer in enumerate(model.layers):
        if layer.kind is LayerKind.BLOCK:
            out.append(block_chunk[b])
            b += 1
        else:
            out.append(0 if not blocks or i < blocks[0] else layout.num_chunks - 1)
    return tuple(out)
