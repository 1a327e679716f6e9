"""Exact parameter arithmetic and IR layer construction, shared by every importer.

Consumes: family-neutral shape descriptions (:class:`EmbeddingShape`, :class:`BlockShape`,
:class:`HeadShape`) that the HF importer and the native format fill in.
Produces: :class:`planner.ir.Layer` objects with exact ``params``, ``active_params``,
``tp_replicated_params``, ``expert_params`` and ``tied_params``, and the assembled
:class:`planner.ir.ModelGraph`.

The formulas are the closed forms of Hugging Face transformers parameter counts, written out per
weight matrix the way the HF modeling files declare them (``modeling_llama``, ``modeling_gpt2``,
``modeling_deepseek_v3``, ...). Tensor-parallel placement follows Megatron-LM: column-parallel
weights and their biases are sharded; row-parallel weights are sharded but their biases are
replicated; norms, routers, MLA down-projections (and their latent norms), learned position /
token-type tables and small dense heads (BERT pooler / MLM transform, ViT patch projection) are
replicated.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Sequence

from planner.ir import Attention, Layer, LayerKind, Mlp, ModelGraph
from planner.errors import invalid
from planner.safe_input import control_character


@dataclass(frozen=True)
class Count:
    """Parameters of one piece of a layer, split the way the cost model needs them."""

    params: int = 0
    replicated: int = 0  # not divided by tensor parallelism
    expert: int = 0  # routed-expert parameters (all experts)
    active_expert: int = 0  # routed-expert parameters one token uses (top_k experts)

    def __add__(self, other: "Count") -> "Count":
        return Count(self.params + other.params, self.replicated + other.replicated,
                     self.expert + other.expert, self.active_expert + other.active_expert)

    def times(self, n: int) -> "Count":
        return Count(self.params * n, self.replicated * n, self.expert * n, self.active_expert * n)

    @property
    def active(self) -> int:
        return self.params - self.expert + self.active_expert


def total(parts: Iterable[Count]) -> Count:
    result = Count()
    for part in parts:
        result = result + part
    return result


# -- primitives ------------------------------------------------------------------------------

def column_linear(n_in: int, n_out: int, bias: bool = False) -> Count:
    """Column-parallel Linear: weight and bias both sharded along the output."""
    return Count(n_in * n_out + (n_out if bias else 0))


def row_linear(n_in: int, n_out: int, bias: bool = False) -> Count:
    """Row-parallel Linear: weight sharded along the input; the bias is added after the
    all-reduce, so every rank holds all of it."""
    b = n_out if bias else 0
    return Count(n_in * n_out + b, replicated=b)


def replicated_linear(n_in: int, n_out: int, bias: bool = False) -> Count:
    """A Linear that tensor parallelism does not split (router, MLA down-projection, pooler)."""
    n = n_in * n_out + (n_out if bias else 0)
    return Count(n, replicated=n)


def norm(width: int, bias: bool) -> Count:
    """RMSNorm (weight) or LayerNorm (weight + bias); always replicated."""
    n = width * (2 if bias else 1)
    return Count(n, replicated=n)


# -- shapes ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class BlockShape:
    """Everything that fixes one transformer block's parameters.

    ``attention`` and ``mlp`` are the IR shapes themselves; the flags say which optional
    weights exist. ``qkv_bias`` covers the input projections (for MLA: the q_a / kv_a
    down-projections), ``out_bias`` the attention output projection, ``mlp_bias`` the MLP
    (and expert) matrices.
    """

    hidden: int
    attention: Attention
    mlp: Mlp
    num_norms: int = 2
    norm_bias: bool = False  # LayerNorm (weight + bias) instead of RMSNorm
    qkv_bias: bool = False
    out_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm(head_dim) on q and on k
    shared_expert_gate: bool = False  # Qwen2-MoE: Linear(h, 1) gating the shared expert
    router_bias: bool = False  # gpt-oss: the router Linear(h, E) has a bias
    attention_sinks: bool = False  # gpt-oss: one learned sink logit per attention head


@dataclass(frozen=True)
class EmbeddingShape:
    """The embedding layer: a token table plus optional replicated extras."""

    vocab: int
    hidden: int
    positions: int = 0  # rows of a learned absolute position table
    token_types: int = 0  # rows of BERT's token-type table
    norm_bias: bool | None = None  # embedding LayerNorm (BERT): True; none: None
    extra_replicated: int = 0  # ViT patch projection + CLS token, T5 relative-bias tables


@dataclass(frozen=True)
class HeadShape:
    """The head layer: final norm(s), then an LM head, a BERT MLM head, or a pooler."""

    vocab: int
    hidden: int
    num_norms: int = 1
    norm_bias: bool = False
    lm_head: bool = True  # an output projection hidden -> vocab
    tied: bool = False  # ... whose weight the embedding owns
    lm_head_bias: bool = False  # BERT MLM decoder bias (sharded with the vocabulary)
    dense: int = 0  # replicated h x h + h transforms before the output (MLM transform, pooler)
    dense_norm_bias: bool | None = None  # LayerNorm after the MLM transform


# -- counting --------------------------------------------------------------------------------

def attention_count(h: int, a: Attention, *, qkv_bias: bool, out_bias: bool,
                    qk_norm: bool, sinks: bool = False) -> Count:
    """One attention sub-layer (twice the projections when it also cross-attends). ``sinks``:
    gpt-oss's per-head sink logits (``GptOssAttention.sinks``), split with the heads."""
    if a.is_mla:
        one = _mla_count(h, a, qkv_bias=qkv_bias, out_bias=out_bias)
    else:
        q = a.num_heads * a.head_dim
        kv = a.num_kv_heads * a.head_dim
        v = a.num_kv_heads * a.v_head_dim
        one = (column_linear(h, q, qkv_bias) + column_linear(h, kv, qkv_bias)
               + column_linear(h, v, qkv_bias)
               + row_linear(a.num_heads * a.v_head_dim, h, out_bias))
        if qk_norm:
            one = one + norm(a.head_dim, False) + norm(a.head_dim, False)
    if sinks:
        one = one + Count(a.num_heads)
    return one.times(2) if a.cross_attention else one


def _mla_count(h: int, a: Attention, *, qkv_bias: bool, out_bias: bool) -> Count:
    """DeepSeek-V2/V3 multi-head latent attention (HF ``modeling_deepseek_v3``).

    q: h -> q_lora_rank (replicated) -> RMSNorm -> heads*(nope+rope); or h -> heads*(nope+rope)
    without a q LoRA. kv: h -> kv_lora_rank + rope (replicated, shared rope key) -> RMSNorm on the
    latent -> heads*(nope+v). out: heads*v -> h.
    """
    kv_rank = a.kv_lora_rank or 0
    nope = a.head_dim - a.rope_head_dim
    if a.q_lora_rank:
        q = (replicated_linear(h, a.q_lora_rank, qkv_bias) + norm(a.q_lora_rank, False)
             + column_linear(a.q_lora_rank, a.num_heads * a.head_dim))
    else:
        q = column_linear(h, a.num_heads * a.head_dim)
    kv = (replicated_linear(h, kv_rank + a.rope_head_dim, qkv_bias) + norm(kv_rank, False)
          + column_linear(kv_rank, a.num_heads * (nope + a.v_head_dim)))
    return q + kv + row_linear(a.num_heads * a.v_head_dim, h, out_bias)


def ffn_count(h: int, width: int, gated: bool, bias: bool) -> Count:
    """A dense MLP: (gate +) up, column-parallel; down, row-parallel."""
    up = column_linear(h, width, bias)
    return (up.times(2) if gated else up) + row_linear(width, h, bias)


def mlp_count(h: int, m: Mlp, *, bias: bool, shared_expert_gate: bool,
              router_bias: bool = False) -> Count:
    """Dense MLP, or MoE: router + routed experts (+ always-active shared experts)."""
    if not m.is_moe:
        return ffn_count(h, m.ffn_hidden, m.gated, bias)
    per_expert = ffn_count(h, m.ffn_hidden, m.gated, bias).params
    experts = Count(per_expert * m.num_experts, expert=per_expert * m.num_experts,
                    active_expert=per_expert * m.top_k)
    router = replicated_linear(h, m.num_experts, router_bias)
    shared = ffn_count(h, m.shared_ffn_hidden, m.gated, bias) if m.shared_ffn_hidden else Count()
    gate = replicated_linear(h, 1) if shared_expert_gate else Count()
    return experts + router + shared + gate


def block_count(s: BlockShape) -> Count:
    return (attention_count(s.hidden, s.attention, qkv_bias=s.qkv_bias, out_bias=s.out_bias,
                            qk_norm=s.qk_norm, sinks=s.attention_sinks)
            + mlp_count(s.hidden, s.mlp, bias=s.mlp_bias, shared_expert_gate=s.shared_expert_gate,
                        router_bias=s.router_bias)
            + norm(s.hidden, s.norm_bias).times(s.num_norms))


def embedding_count(e: EmbeddingShape) -> Count:
    table = Count(e.vocab * e.hidden)  # vocab-parallel: sharded
    extras = (e.positions + e.token_types) * e.hidden + e.extra_replicated
    emb_norm = norm(e.hidden, e.norm_bias) if e.norm_bias is not None else Count()
    return table + Count(extras, replicated=extras) + emb_norm


def head_count(d: HeadShape) -> Count:
    """Head parameters this layer owns (a tied LM head's weight is not among them)."""
    own = norm(d.hidden, d.norm_bias).times(d.num_norms)
    if d.dense:
        own = own + Count(d.dense, replicated=d.dense)
    if d.dense_norm_bias is not None:
        own = own + norm(d.hidden, d.dense_norm_bias)
    if d.lm_head and not d.tied:
        own = own + Count(d.vocab * d.hidden)
    if d.lm_head and d.lm_head_bias:
        own = own + Count(d.vocab)
    return own


# -- layers ----------------------------------------------------------------------------------

def _layer(name: str, kind: LayerKind, hidden: int, c: Count, **extra) -> Layer:
    return Layer(name=name, kind=kind, hidden=hidden, params=c.params, active_params=c.active,
                 tp_replicated_params=c.replicated, expert_params=c.expert, **extra)


def block_layer(name: str, s: BlockShape) -> Layer:
    return _layer(name, LayerKind.BLOCK, s.hidden, block_count(s), attention=s.attention,
                  mlp=s.mlp, num_norms=s.num_norms)


def embedding_layer(e: EmbeddingShape) -> Layer:
    return _layer("embedding", LayerKind.EMBEDDING, e.hidden, embedding_count(e), vocab=e.vocab,
                  num_norms=0 if e.norm_bias is None else 1)


def head_layer(d: HeadShape) -> Layer:
    tied = d.vocab * d.hidden if (d.lm_head and d.tied) else 0
    norms = d.num_norms + (0 if d.dense_norm_bias is None else 1)
    return _layer("head", LayerKind.HEAD, d.hidden, head_count(d), vocab=d.vocab,
                  tied_params=tied, num_norms=norms)


def assemble(*, name: str, family: str, embedding: EmbeddingShape,
             blocks: Sequence[tuple[str, BlockShape]], head: HeadShape, default_seq_len: int,
             max_seq_len: int | None, source: str,
             metadata: Sequence[tuple[str, str]] = ()) -> ModelGraph:
    """Build the ModelGraph: embedding, blocks in order, head."""
    bad = control_character(name)
    if bad is not None:  # the name goes into plans, exported shell and TOML files, terminals
        raise invalid(f"{source}: the model name {name!r} contains the control character {bad}",
                      "give the model a name without control characters (the 'name' key, or "
                      "the file name of a config.json)")
    cache: dict[BlockShape, Layer] = {}
    layers = [embedding_layer(embedding)]
    for block_name, shape in blocks:
        if shape not in cache:
            cache[shape] = block_layer(block_name, shape)
        layers.append(_renamed(cache[shape], block_name))
    layers.append(head_layer(head))
    return ModelGraph(name=name, family=family, layers=tuple(layers), hidden=embedding.hidden,
                      vocab=embedding.vocab, default_seq_len=default_seq_len,
                      max_seq_len=max_seq_len, tied_embeddings=head.lm_head and head.tied,
                      source=source, metadata=tuple(metadata))


def _renamed(layer: Layer, name: str) -> Layer:
    return layer if layer.name == name else replace(layer, name=name)
