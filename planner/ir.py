"""Model IR: the one description of a network that every importer produces and the cost model reads.

A :class:`ModelGraph` is an ordered tuple of :class:`Layer` s in execution order (embedding,
blocks, head). Each layer carries its exact parameter count and the shapes the cost model needs to
derive FLOPs, activation bytes and communication volumes (see ``planner/cost/``). Consecutive
identical layers share a ``signature`` so the solver can treat "80 identical blocks" as one class
with a count (:meth:`ModelGraph.layer_classes`). :meth:`ModelGraph.graph` gives the same layers as
a networkx DiGraph (the form op-level importers such as ONNX will produce later).

Consumes: nothing (plain data). Produced by: ``models/`` importers.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum
from functools import cached_property
from typing import ClassVar, Iterator

import networkx as nx

from planner.hashing import cached_hash, state_without_hash


class LayerKind(str, Enum):
    EMBEDDING = "embedding"  # token (+ position / type) embeddings, embedding norm
    BLOCK = "block"  # a transformer block: attention + MLP/MoE + norms
    HEAD = "head"  # final norm + output projection (LM head, pooler, classifier)
    # multi-token prediction (DeepSeek-V3 §2.2, Megatron --mtp-num-layers): one more transformer
    # block after the head, on the last pipeline stage, fed the main model's hidden state and
    # the next token's embedding through a 2h -> h projection; a HEAD layer follows it
    MTP = "mtp"


@dataclass(frozen=True)
class Attention:
    """Shape of one attention sub-layer.

    ``head_dim`` is the query/key width per head, ``v_head_dim`` the value width per head (they
    differ for MLA). For MLA (DeepSeek-V2/V3) ``q_lora_rank`` / ``kv_lora_rank`` are the low-rank
    latent widths; the projections then go through those latents.
    """

    num_heads: int
    num_kv_heads: int
    head_dim: int
    v_head_dim: int
    causal: bool = True
    sliding_window: int | None = None
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    rope_head_dim: int = 0
    cross_attention: bool = False  # encoder-decoder: an extra attention over encoder states

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None


@dataclass(frozen=True)
class Mlp:
    """Shape of one MLP or MoE sub-layer.

    Dense: ``num_experts == 1`` and ``ffn_hidden`` is the FFN width. MoE: ``ffn_hidden`` is the
    width of one routed expert, ``top_k`` experts are active per token, and ``shared_ffn_hidden``
    is the total width of always-active shared experts (0 if none).

    Group-limited (node-limited) routing: the routed experts form ``expert_groups`` equal
    groups in expert order and each token picks its ``top_k`` experts inside
    ``groups_per_token`` of them (DeepSeek-V3 report §2.1.2 "node-limited routing", each token
    to at most M = 4 nodes, §4.2; HF ``n_group`` / ``topk_group`` with ``topk_method``
    ``noaux_tc`` or ``group_limited_greedy``; Megatron-Core ``--moe-router-num-groups`` /
    ``--moe-router-group-topk``). ``groups_per_token == expert_groups`` (the default 1 / 1) is
    unlimited routing.
    """

    ffn_hidden: int
    gated: bool
    num_experts: int = 1
    top_k: int = 1
    shared_ffn_hidden: int = 0
    expert_groups: int = 1
    groups_per_token: int = 1
    # plan files and model hashes (planner.serialize) leave them out while unlimited, so the
    # models written before they existed keep their bytes and hashes
    PLAIN_OMIT_DEFAULT: ClassVar[tuple[str, ...]] = ("expert_groups", "groups_per_token")

    @property
    def num_mtp(self) -> int:
        """Multi-token prediction modules after the head (models/mtp.py)."""
        return sum(1 for layer in self.layers if layer.kind is LayerKind.MTP)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def group_limited(self) -> bool:
        """Whether each token's experts lie in fewer than all expert groups."""
        return self.groups_per_token < self.expert_groups


@dataclass(frozen=True)
class Conv:
    """One convolution of a layer, per sample. It runs as an implicit GEMM of
    ``M = out_pixels`` (x the micro-batch), ``N = out_channels / groups``,
    ``K = in_channels / groups x kernel`` per group (NVIDIA Deep Learning Performance guide,
    "Convolutional Layers": forward propagation as GEMM, M = N·P·Q, N = K, K = C·R·S), whose
    FLOPs are ``2·K·C_in·C_out·H_out·W_out / groups`` per sample."""

    in_channels: int
    out_channels: int
    kernel: int  # kernel elements (kh x kw, kd x kh x kw)
    in_pixels: int  # input spatial elements per sample (H_in x W_in)
    out_pixels: int  # output spatial elements per sample (H_out x W_out)
    groups: int = 1

    @property
    def flops(self) -> float:
        """Forward FLOPs per sample."""
        return 2.0 * self.kernel * self.in_channels * self.out_channels * self.out_pixels \
            / self.groups

    @property
    def weights(self) -> int:
        return self.out_channels * self.in_channels // self.groups * self.kernel


@dataclass(frozen=True)
class Layer:
    """One pipeline-placeable unit.

    Parameter fields (all exact counts):

    * ``params`` — parameters this layer owns (tied weights are owned by the embedding).
    * ``active_params`` — parameters used per token (differs from ``params`` for MoE).
    * ``tied_params`` — parameters this layer uses but another layer owns (a tied LM head). A
      pipeline stage holding this layer keeps a copy (Megatron keeps the word embedding on the
      first and last stage and all-reduces its gradient), so memory counts them, totals do not.
    * ``tp_replicated_params`` — parameters not divided by tensor parallelism (norm weights,
      biases of row-parallel outputs, routers).
    * ``expert_params`` — routed-expert parameters (divided by expert parallelism).
    """

    name: str
    kind: LayerKind
    hidden: int
    params: int
    active_params: int
    tied_params: int = 0
    tp_replicated_params: int = 0
    expert_params: int = 0
    attention: Attention | None = None
    mlp: Mlp | None = None
    vocab: int = 0
    # Norm layers in the block (2 for pre-LN blocks, 4 for gemma2's sandwich norms); they set
    # the memory-bound traffic and the stored norm inputs in the cost model.
    num_norms: int = 2
    # Tokens per sequence this layer runs on when they are not the workload's sequence length
    # (0): a vision encoder in front of a language model runs on the image's patch tokens.
    seq_len: int = 0
    # Convolutions (ResNet / UNet blocks, a patch-embedding stem), in execution order.
    convs: tuple[Conv, ...] = ()

    # the generated hash's value, computed once (the cost caches key on layers)
    __hash__ = cached_hash
    __getstate__ = state_without_hash

    @property
    def signature(self) -> tuple:
        """Everything but the name: equal signatures mean identical cost."""
        return (self.kind, self.hidden, self.params, self.active_params, self.tied_params,
                self.tp_replicated_params, self.expert_params, self.attention, self.mlp,
                self.vocab, self.num_norms, self.seq_len, self.convs)


@dataclass(frozen=True)
class LayerClass:
    """A run of consecutive identical layers: ``count`` copies starting at index ``start``."""

    layer: Layer
    start: int
    count: int


@dataclass(frozen=True)
class ModelGraph:
    name: str
    family: str  # model_type of the source (llama, gpt2, native, ...)
    layers: tuple[Layer, ...]
    hidden: int
    vocab: int
    default_seq_len: int
    max_seq_len: int | None = None
    tied_embeddings: bool = False
    source: str = ""
    metadata: tuple[tuple[str, str], ...] = field(default=())

    __hash__ = cached_hash  # the generated hash's value, computed once (cost caches key on it)
    __getstate__ = state_without_hash

    @property
    def params(self) -> int:
        return sum(layer.params for layer in self.layers)

    @property
    def active_params(self) -> int:
        return sum(layer.active_params for layer in self.layers)

    @cached_property  # read by every ParallelConfig.validate of the search's enumeration
    def num_blocks(self) -> int:
        return sum(1 for layer in self.layers if layer.kind is LayerKind.BLOCK)

    @property
    def num_mtp(self) -> int:
        """Multi-token prediction modules after the head (models/mtp.py)."""
        return sum(1 for layer in self.layers if layer.kind is LayerKind.MTP)

    @property
    def is_moe(self) -> bool:
        return any(layer.mlp is not None and layer.mlp.is_moe for layer in self.layers)

    def blocks(self) -> Iterator[Layer]:
        return (layer for layer in self.layers if layer.kind is LayerKind.BLOCK)

    def layer_classes(self) -> list[LayerClass]:
        """Group consecutive layers with the same signature (computed once per graph)."""
        return list(self._classes)

    @cached_property
    def _classes(self) -> tuple[LayerClass, ...]:
        classes: list[LayerClass] = []
        for index, layer in enumerate(self.layers):
            if classes and classes[-1].layer.signature == layer.signature:
                last = classes[-1]
                classes[-1] = LayerClass(last.layer, last.start, last.count + 1)
            else:
                classes.append(LayerClass(layer, index, 1))
        return tuple(classes)

    def graph(self) -> nx.DiGraph:
        """The layers as a chain DiGraph; node attribute ``layer`` holds the :class:`Layer`."""
        g = nx.DiGraph(name=self.name)
        for index, layer in enumerate(self.layers):
            g.add_node(index, name=layer.name, kind=layer.kind.value, layer=layer)
            if index:
                g.add_edge(index - 1, index)
        return g

    def with_name(self, name: str) -> "ModelGraph":
        return replace(self, name=name)
