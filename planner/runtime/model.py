"""A llama-style decoder ``nn.Module`` built from a :class:`~planner.ir.ModelGraph`.

One module per IR layer, in the IR's order, so that a plan's per-layer decisions (pipeline
stage, recomputation) map one to one onto modules:

* ``EmbeddingLayer``: ``tok_embeddings`` (vocab x hidden).
* ``Block``: ``attention_norm`` (RMSNorm), ``attention`` (``q_proj``, ``k_proj``, ``v_proj``,
  ``o_proj``, no bias, RoPE, causal SDPA, grouped-query heads), ``ffn_norm`` (RMSNorm), ``mlp``
  (SwiGLU: ``gate_proj``, ``up_proj``, ``down_proj``), or in a mixture-of-experts block
  :class:`MoeMlp`: ``router`` (hidden x E, no bias), ``experts["e"]`` (E SwiGLU MLPs of the
  expert width) and ``shared`` (one SwiGLU of the shared experts' total width, if any), routed
  force-balanced (:mod:`planner.runtime.experts`); a model's first blocks may be dense.
* ``Head``: ``norm`` (RMSNorm) and ``lm_head`` (hidden x vocab, or the embedding when tied).

:func:`build_decoder` refuses a graph it cannot reproduce exactly (MLA, biases, LayerNorm,
cross attention, sliding windows, learned positions): the module's parameter count must equal
``ModelGraph.params`` layer by layer (:func:`check_parameter_counts`).

Activation checkpointing per block: ``Block.recompute`` is ``"none"``, ``"selective"`` (only the
attention core, the grouped-query SDPA, runs under ``torch.utils.checkpoint``) or
``"full"`` (the whole block). :data:`MEASURE` switches on the bookkeeping that lets
:mod:`planner.runtime.measure` see the tensors a checkpoint keeps alive (its inputs).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from planner.errors import ErrorKind, PlannerError
from planner.ir import LayerKind, ModelGraph
from planner.runtime.experts import (AllToAll, GatherRows, ScatterRows, balanced_experts,
                                     exchange_counts)

try:
    from torch.distributed.tensor import DTensor, Shard
except ImportError:  # pragma: no cover - PyTorch 2.4
    from torch.distributed._tensor import DTensor, Shard

RMS_EPS = 1e-5
_SDPA_GQA = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 5)  # enable_gqa
ROPE_THETA = 10000.0


class _Flags:
    measure = False  # save checkpoint inputs through an identity node (see keep_for_measure)


MEASURE = _Flags()


class _Keep(torch.autograd.Function):
    """Identity whose forward saves its input for backward: the input then passes through the
    active ``saved_tensors_hooks`` and is released when backward reaches this node. Used so a
    measurement hook sees the tensors a checkpointed region keeps alive (its inputs)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


def keep_for_measure(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    if not MEASURE.measure or not torch.is_grad_enabled():
        return tensors
    return tuple(_Keep.apply(t) if t.requires_grad else t for t in tensors)


@dataclass(frozen=True)
class MoeShape:
    """A MoE block's MLP: ``num_experts`` routed SwiGLU experts of width ``expert_ffn``, each
    token to ``top_k`` of them, plus always-active shared experts of total width
    ``shared_ffn`` (0: none)."""

    num_experts: int
    top_k: int
    expert_ffn: int
    shared_ffn: int

    def params(self, h: int) -> int:
        return h * self.num_experts + 3 * h * (self.num_experts * self.expert_ffn
                                               + self.shared_ffn)


@dataclass(frozen=True)
class DecoderShape:
    hidden: int
    vocab: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden: int  # the dense blocks' SwiGLU width (0: every block is MoE)
    tied: bool
    layer_kinds: tuple[LayerKind, ...]
    moe: MoeShape | None = None
    moe_layers: frozenset[int] = frozenset()  # IR indices of the MoE blocks

    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    def block_params(self, moe: bool = False) -> int:
        h, d = self.hidden, self.head_dim
        attention = h * self.num_heads * d * 2 + h * self.num_kv_heads * d * 2
        mlp = self.moe.params(h) if moe and self.moe else 3 * h * self.ffn_hidden
        return 2 * h + attention + mlp

    def head_params(self) -> int:
        return self.hidden + (0 if self.tied else self.vocab * self.hidden)


def _unsupported(message: str) -> PlannerError:
    return PlannerError(ErrorKind.UNSUPPORTED, message,
                        ("the PyTorch verification runtime builds bias-free llama-style "
                         "decoders (RMSNorm, RoPE, GQA attention, SwiGLU MLP)",))


def decoder_shape(graph: ModelGraph) -> DecoderShape:
    """The decoder dimensions of ``graph``; raises UNSUPPORTED for anything else."""
    kinds = tuple(layer.kind for layer in graph.layers)
    if not kinds or kinds[0] is not LayerKind.EMBEDDING or kinds[-1] is not LayerKind.HEAD or \
            any(k is not LayerKind.BLOCK for k in kinds[1:-1]) or len(kinds) < 3:
        raise _unsupported(f"{graph.name}: expected embedding, blocks, head; got "
                           f"{', '.join(k.value for k in kinds)}")
    positions = dict(graph.metadata).get("positions", "rope")
    if positions == "graph":  # models/graph/group.py: the importer does not name the encoding
        raise _unsupported(f"{graph.name}: imported from an operator graph (ONNX or "
                           "torch.export), whose position encoding is computed in the graph and "
                           "not rebuilt here; verify a plan of the same degrees for its "
                           "config.json or a preset")
    if positions not in ("rope", "none"):
        raise _unsupported(f"{graph.name}: {positions} position embeddings are not built")
    first = graph.layers[1]
    att, mlp = first.attention, first.mlp
    if att is None or mlp is None:
        raise _unsupported(f"{graph.name}: blocks without attention or MLP are not built")
    if att.is_mla or att.cross_attention or att.sliding_window is not None or not att.causal:
        raise _unsupported(f"{graph.name}: only causal full attention without MLA or cross "
                           "attention is built")
    if att.head_dim != att.v_head_dim:
        raise _unsupported(f"{graph.name}: head_dim {att.head_dim} != v_head_dim {att.v_head_dim}")
    # a model's first blocks may be dense (DeepSeek-V3, tiny-moe): one dense and one MoE shape
    blocks = [(i, layer) for i, layer in enumerate(graph.layers) if layer.kind is LayerKind.BLOCK]
    moe_mlps = {layer.mlp for _, layer in blocks if layer.mlp is not None and layer.mlp.is_moe}
    dense_mlps = {layer.mlp for _, layer in blocks if layer.mlp is not None
                  and not layer.mlp.is_moe}
    if any(not m.gated for m in moe_mlps | dense_mlps):
        raise _unsupported(f"{graph.name}: only gated (SwiGLU) MLPs and experts are built")
    moe = None
    if moe_mlps:
        m = next(iter(moe_mlps))
        moe = MoeShape(m.num_experts, m.top_k, m.ffn_hidden, m.shared_ffn_hidden)
    dense = next(iter(dense_mlps)).ffn_hidden if dense_mlps else 0
    shape = DecoderShape(graph.hidden, graph.vocab, att.num_heads, att.num_kv_heads,
                         att.head_dim, dense, graph.tied_embeddings, kinds, moe,
                         frozenset(i for i, layer in blocks if layer.mlp in moe_mlps))
    for index, layer in enumerate(graph.layers):
        if layer.kind is LayerKind.BLOCK and (layer.attention != att or layer.num_norms != 2
                                              or len(moe_mlps) > 1 or len(dense_mlps) > 1):
            raise _unsupported(f"{graph.name}: blocks differ in shape ({layer.name}); only "
                               "decoders of uniform blocks (dense ones, then or among them "
                               "MoE ones of one shape) are built")
        expected = {LayerKind.EMBEDDING: shape.embedding_params(),
                    LayerKind.BLOCK: shape.block_params(index in shape.moe_layers),
                    LayerKind.HEAD: shape.head_params()}
        if layer.params != expected[layer.kind]:
            raise _unsupported(
                f"{graph.name}: layer {layer.name} has {layer.params:,} parameters; a bias-free "
                f"llama-style {layer.kind.value} of this shape has {expected[layer.kind]:,} "
                "(biases, LayerNorm or extra weights, such as a router bias or a shared-expert "
                "gate, are not built)")
    return shape


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = RMS_EPS) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rope(x: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (rotate-half form) of ``x`` (batch, heads, seq, head_dim)."""
    seq, dim = x.shape[-2], x.shape[-1]
    half = dim // 2
    inv = 1.0 / (ROPE_THETA ** (torch.arange(0, half, dtype=torch.float32) / half))
    angles = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1).to(x.dtype)
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1).to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal SDPA of (batch, heads, seq, head_dim) tensors; K and V may have fewer heads
    (grouped-query attention, ``enable_gqa``: the CPU flash kernel reads them unexpanded)."""
    if q.shape[1] == k.shape[1]:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if _SDPA_GQA:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    rep = q.shape[1] // k.shape[1]  # PyTorch 2.4: expand K and V to the query heads
    return F.scaled_dot_product_attention(q, k.repeat_interleave(rep, dim=1),
                                          v.repeat_interleave(rep, dim=1), is_causal=True)


class Attention(nn.Module):
    def __init__(self, shape: DecoderShape, rotary: bool) -> None:
        super().__init__()
        h, d = shape.hidden, shape.head_dim
        self.head_dim = d
        self.rotary = rotary
        self.selective = False
        self.q_proj = nn.Linear(h, shape.num_heads * d, bias=False)
        self.k_proj = nn.Linear(h, shape.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, shape.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(shape.num_heads * d, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s = x.shape[0], x.shape[1]
        # -1 heads: under tensor parallelism the projections hold heads / tp heads
        q = self.q_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        if self.rotary:
            q, k = rope(q), rope(k)
        if self.selective and torch.is_grad_enabled():
            q, k, v = keep_for_measure(q, k, v)
            out = checkpoint(attention_core, q, k, v, use_reentrant=False)
        else:
            out = attention_core(q, k, v)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class Mlp(nn.Module):
    """SwiGLU of width ``width`` (a dense block's MLP, one routed expert, the shared ones)."""

    def __init__(self, hidden: int, width: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, width, bias=False)
        self.up_proj = nn.Linear(hidden, width, bias=False)
        self.down_proj = nn.Linear(width, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MoeMlp(nn.Module):
    """A mixture-of-experts MLP: router, ``E`` routed SwiGLU experts (``experts["e"]``, by
    global index), shared experts. Routing is force-balanced (:mod:`planner.runtime.experts`).

    Expert parallelism (:meth:`shard_experts`): this rank keeps experts ``[r·E/ep, (r+1)·E/ep)``
    of its EP group; the routed copies, sorted by expert, go to their expert's rank
    (dispatch), are computed there and come back (combine), each an ``all_to_all_single`` with
    split sizes after the per-expert counts are exchanged. With expert tensor parallelism each
    kept expert holds its ``F / etp`` slice of the width, and the received copies are gathered
    over the ETP group before the experts and the partial outputs reduce-scattered after them.
    Without either (``ep`` = ``etp`` = 1) the same sorted copies are computed locally: the
    reference run takes this path.

    Under tensor parallelism the input is a DTensor sharded on the sequence (``Shard(1)``:
    :func:`planner.runtime.parallelize.apply_tensor_parallel`), as Megatron-Core's ``MoELayer``
    takes the sequence-parallel shard: the router (a replicated DTensor weight, so its gradient
    is the TP group's partial sum) and the routed experts see this rank's ``seq / tp``
    positions only, routed by their global position; the shared experts are a TP-split SwiGLU
    on the same shard; the output is the shard again (``Shard(1)``)."""

    def __init__(self, hidden: int, moe: MoeShape) -> None:
        super().__init__()
        self.num_experts, self.top_k = moe.num_experts, moe.top_k
        self.router = nn.Linear(hidden, moe.num_experts, bias=False)
        self.experts = nn.ModuleDict({str(e): Mlp(hidden, moe.expert_ffn)
                                      for e in range(moe.num_experts)})
        self.shared = Mlp(hidden, moe.shared_ffn) if moe.shared_ffn else None
        self.ep, self.ep_rank, self.ep_group = 1, 0, None
        self.etp, self.etp_group = 1, None

    def shard_experts(self, group, ep_rank: int, ep: int, etp_group=None, etp_rank: int = 0,
                      etp: int = 1) -> None:
        """Keep this EP rank's ``E / ep`` experts (the others are deleted), each cut to this
        ETP rank's ``F / etp`` slice of its width (gate / up rows, down columns)."""
        if self.num_experts % ep:
            raise ValueError(f"ep {ep} does not divide the {self.num_experts} experts")
        per = self.num_experts // ep
        for e in range(self.num_experts):
            if not ep_rank * per <= e < (ep_rank + 1) * per:
                del self.experts[str(e)]
        if etp > 1:
            for expert in self.experts.values():
                width = expert.gate_proj.out_features
                if width % etp:
                    raise ValueError(f"etp {etp} does not divide the expert width {width}")
                cut = slice(etp_rank * width // etp, (etp_rank + 1) * width // etp)
                with torch.no_grad():
                    for name in ("gate_proj", "up_proj"):
                        linear = getattr(expert, name)
                        linear.weight = nn.Parameter(linear.weight[cut].clone())
                        linear.out_features = width // etp
                    expert.down_proj.weight = nn.Parameter(
                        expert.down_proj.weight[:, cut].clone())
                    expert.down_proj.in_features = width // etp
        self.ep, self.ep_rank, self.ep_group = ep, ep_rank, group
        self.etp, self.etp_group = etp, etp_group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mesh = None
        if isinstance(x, DTensor):  # this rank's sequence shard (tensor parallelism)
            mesh = x.device_mesh
            logits_all = self.router(x).to_local()
            x_local = x.to_local()
        else:
            logits_all = self.router(x)
            x_local = x
        b, s, h = x_local.shape
        k, num = self.top_k, self.num_experts
        flat = x_local.reshape(b * s, h)
        start = mesh.get_local_rank() * s if mesh is not None else 0
        chosen = balanced_experts(start + s, k, num)[start:].repeat(b, 1)  # (tokens, k)
        logits = logits_all.reshape(b * s, num).float().gather(1, chosen)
        gates = F.softmax(logits, dim=-1).to(x_local.dtype)  # over the top_k (post-softmax)
        expert_of_copy = chosen.reshape(-1)  # copy c = token c // k, its (c % k)-th choice
        order = torch.argsort(expert_of_copy, stable=True)
        counts = torch.bincount(expert_of_copy, minlength=num)
        copies = flat.index_select(0, order // k)  # sorted by expert
        if self.ep_group is None and self.etp_group is None:
            out = self._experts(copies, [(e, int(n)) for e, n in enumerate(counts.tolist())])
        else:
            out = self._routed(copies, counts)
        routed = torch.empty_like(out).index_copy(0, order, out)  # back to copy order
        routed = (routed.view(b * s, k, h) * gates.unsqueeze(-1)).sum(1).view(b, s, h)
        if self.shared is not None:
            # under TP a TP-split SwiGLU on the shard (all-gather in, reduce-scatter out)
            routed = routed + self.shared(x)
        if mesh is not None:
            return DTensor.from_local(routed, mesh, (Shard(1),), run_check=False)
        return routed

    def _routed(self, copies: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Dispatch over EP, gather over ETP, the local experts, scatter, combine."""
        per = self.num_experts // self.ep
        if self.ep_group is not None:
            send = counts.view(self.ep, per).sum(1).tolist()
            received = exchange_counts(counts, self.ep_group).view(self.ep, per)
            recv = received.sum(1).tolist()
            rows = AllToAll.apply(copies, recv, send, self.ep_group, self.ep_rank)
        else:
            received = counts.view(1, per)
            rows = copies
        if self.etp_group is not None:  # every ETP member's received rows, in member order
            members = [torch.empty_like(received) for _ in range(self.etp)]
            dist.all_gather(members, received.contiguous(), group=self.etp_group)
            received = torch.cat(members)
            rows = GatherRows.apply(rows, self.etp_group, self.etp)
        chunks = [(self.ep_rank * per + e, int(received[src, e]))
                  for src in range(received.shape[0]) for e in range(per)]
        out = self._experts(rows, chunks)
        if self.etp_group is not None:  # partial sums over the width slices, own rows back
            out = ScatterRows.apply(out, self.etp_group, self.etp)
        if self.ep_group is not None:
            out = AllToAll.apply(out, send, recv, self.ep_group, self.ep_rank)
        return out

    def _experts(self, rows: torch.Tensor, chunks: list[tuple[int, int]]) -> torch.Tensor:
        """``rows`` in consecutive chunks of (expert, count), each through its expert. Every
        kept expert runs, on no rows if none came (FSDP2 gathers its weights in its forward
        and reduce-scatters its gradient on every rank of its group)."""
        outs, start, ran = [], 0, set()
        for expert, n in chunks:
            outs.append(self.experts[str(expert)](rows[start:start + n]))
            ran.add(str(expert))
            start += n
        for name, expert in self.experts.items():
            if name not in ran:
                outs.append(expert(rows[:0]))
        return torch.cat(outs) if outs else rows[:0]


class EmbeddingLayer(nn.Module):
    def __init__(self, shape: DecoderShape) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(shape.vocab, shape.hidden)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.tok_embeddings(tokens)


class Block(nn.Module):
    def __init__(self, shape: DecoderShape, rotary: bool, moe: bool = False) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(shape.hidden)
        self.attention = Attention(shape, rotary)
        self.ffn_norm = RMSNorm(shape.hidden)
        self.mlp = MoeMlp(shape.hidden, shape.moe) if moe and shape.moe else \
            Mlp(shape.hidden, shape.ffn_hidden)
        self.recompute = "none"

    def set_recompute(self, mode: str) -> None:
        if mode not in ("none", "selective", "full"):
            raise ValueError(f"recompute must be none, selective or full, got {mode!r}")
        self.recompute = mode
        self.attention.selective = mode == "selective"

    def _body(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.mlp(self.ffn_norm(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recompute == "full" and torch.is_grad_enabled():
            (x,) = keep_for_measure(x)
            return checkpoint(self._body, x, use_reentrant=False)
        return self._body(x)


class Head(nn.Module):
    def __init__(self, shape: DecoderShape, tied_to: nn.Embedding | None = None) -> None:
        super().__init__()
        self.norm = RMSNorm(shape.hidden)
        self.lm_head = nn.Linear(shape.hidden, shape.vocab, bias=False)
        if tied_to is not None:
            self.lm_head.weight = tied_to.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(x))


class Decoder(nn.Module):
    """Layers in IR order under ``layers["<ir index>"]``; a pipeline stage keeps a subset (the
    names, and so the parameter FQNs, stay those of the whole model)."""

    def __init__(self, layers: dict[int, nn.Module]) -> None:
        super().__init__()
        self.layers = nn.ModuleDict({str(i): m for i, m in sorted(layers.items())})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers.values():
            x = layer(x)
        return x

    def indices(self) -> list[int]:
        return [int(k) for k in self.layers]


def build_decoder(graph: ModelGraph, seed: int = 0) -> Decoder:
    """The whole model, initialised deterministically from ``seed`` (PyTorch default inits of
    nn.Linear / nn.Embedding, RMSNorm weights 1). Same seed, same weights on every process."""
    shape = decoder_shape(graph)
    rotary = dict(graph.metadata).get("positions", "rope") == "rope"
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        layers: dict[int, nn.Module] = {}
        embedding = None
        for index, kind in enumerate(shape.layer_kinds):
            if kind is LayerKind.EMBEDDING:
                embedding = layers[index] = EmbeddingLayer(shape)
            elif kind is LayerKind.BLOCK:
                layers[index] = Block(shape, rotary, index in shape.moe_layers)
            else:
                tied = embedding.tok_embeddings if shape.tied and embedding is not None else None
                layers[index] = Head(shape, tied)
    finally:
        torch.random.set_rng_state(generator_state)
    return Decoder(layers)


def module_parameter_count(module: nn.Module) -> int:
    """Distinct parameters (a tied weight counted once)."""
    return sum(p.numel() for p in module.parameters())


def check_parameter_counts(graph: ModelGraph, decoder: Decoder) -> None:
    """Raise AssertionError unless each layer, and the whole, has exactly the IR's count."""
    for index, layer in enumerate(graph.layers):
        module = decoder.layers[str(index)]
        count = sum(p.numel() for p in module.parameters())
        if layer.kind is LayerKind.HEAD and graph.tied_embeddings:
            count -= graph.vocab * graph.hidden  # owned by the embedding
        if count != layer.params:
            raise AssertionError(f"{layer.name}: module has {count} parameters, IR {layer.params}")
    total = module_parameter_count(decoder)
    if total != graph.params:
        raise AssertionError(f"model has {total} parameters, IR {graph.params}")


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy over every position of the (micro-)batch."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1))


def synthetic_batch(seed: int, step: int, batch: int, seq_len: int, vocab: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic token data for ``step``: (inputs, labels), each (batch, seq_len) int64.

    Tokens follow a Zipf-like unigram distribution (p(k) ~ 1/(k+1)) so that the loss has
    something to learn in a few steps; the same (seed, step) gives the same tokens on every
    process, which then slices out its data-parallel share.
    """
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    weights = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float64)
    tokens = torch.multinomial(weights.float(), batch * (seq_len + 1), replacement=True,
                               generator=generator).view(batch, seq_len + 1)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


__all__ = ["Block", "Decoder", "DecoderShape", "EmbeddingLayer", "Head", "MEASURE", "MoeMlp",
           "MoeShape", "RMSNorm",
           "build_decoder", "check_parameter_counts", "decoder_shape", "lm_loss",
           "synthetic_batch"]
