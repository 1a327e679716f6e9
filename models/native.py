"""The native model file format (``shardplan_model: 1``), documented in docs/models.md.

Consumes: a parsed YAML/JSON mapping with the keys in :data:`KEYS` (``moe:`` with
:data:`MOE_KEYS`). Unknown keys are an error that names them and lists the valid ones.
Produces: a :class:`planner.ir.ModelGraph` of family ``"native"``, counted with the same
per-layer arithmetic as the HF importer (:mod:`models.params`).

Defaults describe a Llama-style decoder: RoPE, RMSNorm, gated (SwiGLU) MLP, no biases, untied
embeddings, causal attention, MHA (``num_kv_heads = num_heads``).
"""
from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Mapping

from planner.errors import ErrorKind, PlannerError, invalid
from planner.ir import Attention, Mlp, ModelGraph

from .fields import Fields, check_kv_heads, head_dim_of, short
from .hf_common import check_expert_groups
from .params import BlockShape, EmbeddingShape, HeadShape, assemble
from .reading import read_mapping

FORMAT_KEY = "shardplan_model"
FORMAT_VERSION = 1
DEFAULT_SEQ_LEN = 2048
DEFAULT_SEQ_CAP = 4096

KEYS = (
    FORMAT_KEY, "name", "description", "num_layers", "hidden_size", "num_heads", "num_kv_heads",
    "head_dim", "ffn_hidden_size", "gated_mlp", "vocab_size", "seq_len", "max_seq_len",
    "tied_embeddings", "position_embedding", "bias", "norm", "causal", "sliding_window", "moe",
)
MOE_KEYS = ("num_experts", "top_k", "expert_ffn_hidden_size", "shared_ffn_hidden_size",
            "first_dense_layers", "expert_groups", "groups_per_token")
POSITION_EMBEDDINGS = ("rope", "learned", "none")
NORMS = ("rmsnorm", "layernorm")


def looks_native(data: Mapping[str, Any]) -> bool:
    """A native file: has the format key, or (no HF ``model_type``) native shape keys."""
    if FORMAT_KEY in data:
        return True
    return "model_type" not in data and {"num_layers", "hidden_size"} <= set(data)


def load_native(path: str | Path) -> ModelGraph:
    path = Path(path)
    return build_native(read_mapping(path), where=str(path), default_name=path.stem,
                        source=str(path))


def build_native(data: Mapping[str, Any], *, where: str = "model", default_name: str = "model",
                 source: str = "") -> ModelGraph:
    """Validate ``data`` and build its ModelGraph."""
    _check_keys(data, KEYS, where)
    f = Fields(data, where)
    version = data.get(FORMAT_KEY, FORMAT_VERSION)
    if isinstance(version, bool) or version != FORMAT_VERSION:
        raise PlannerError(ErrorKind.UNSUPPORTED,
                           f"{where}: {FORMAT_KEY}: {short(version)} is not a version this tool "
                           f"reads (it reads {FORMAT_VERSION})")
    name = f.text("name", default=default_name).strip() or default_name
    description = f.text("description", default="")
    layers = f.integer("num_layers", limit="layers")
    h = f.integer("hidden_size", limit="hidden")
    heads = f.integer("num_heads", limit="heads")
    kv = f.integer("num_kv_heads", default=heads, limit="heads")
    check_kv_heads(f, heads, kv)
    d = head_dim_of(f, h, heads, f.opt_integer("head_dim", limit="head_dim"), "num_heads")
    vocab = f.integer("vocab_size", limit="vocab")
    gated = f.flag("gated_mlp", default=True)
    bias = f.flag("bias", default=False)
    layernorm = f.choice("norm", NORMS, default="rmsnorm") == "layernorm"
    positions = f.choice("position_embedding", POSITION_EMBEDDINGS, default="rope")
    tied = f.flag("tied_embeddings", default=False)
    causal = f.flag("causal", default=True)
    window = f.opt_integer("sliding_window", limit="positions")

    max_seq = f.opt_integer("max_seq_len", limit="positions")
    default_seq = min(max_seq, DEFAULT_SEQ_CAP) if max_seq else DEFAULT_SEQ_LEN
    seq = f.integer("seq_len", default=default_seq, limit="positions")
    if max_seq is not None and seq > max_seq:
        raise invalid(f"{where}: seq_len ({seq}) exceeds max_seq_len ({max_seq})")
    if positions == "learned" and max_seq is None:
        max_seq = seq  # the position table needs a size; default to the training length

    moe, first_dense = _moe(data.get("moe"), f, layers)
    needs_dense = moe is None or first_dense > 0
    ffn = f.integer("ffn_hidden_size", limit="ffn") if needs_dense \
        else f.opt_integer("ffn_hidden_size", limit="ffn")
    dense = Mlp(ffn_hidden=ffn or (moe.ffn_hidden if moe else 0), gated=gated)

    attention = Attention(num_heads=heads, num_kv_heads=kv, head_dim=d, v_head_dim=d,
                          causal=causal, sliding_window=window)

    def block(is_moe: bool) -> BlockShape:
        return BlockShape(hidden=h, attention=attention, mlp=moe if (is_moe and moe) else dense,
                          norm_bias=layernorm, qkv_bias=bias, out_bias=bias, mlp_bias=bias)

    blocks = [(f"block.{i}", block(i >= first_dense)) for i in range(layers)]
    embedding = EmbeddingShape(vocab=vocab, hidden=h,
                               positions=max_seq if positions == "learned" and max_seq else 0)
    head = HeadShape(vocab=vocab, hidden=h, norm_bias=layernorm, tied=tied)
    return assemble(name=name, family="native", embedding=embedding, blocks=blocks, head=head,
                    default_seq_len=seq, max_seq_len=max_seq, source=source,
                    metadata=[("positions", positions)]
                    + ([("description", description)] if description else []))


def _moe(value: Any, f: Fields, layers: int) -> tuple[Mlp | None, int]:
    if value is None:
        return None, 0
    where = f"{f.where}: moe"
    if not isinstance(value, dict):
        raise invalid(f"{where} must be a mapping with keys {', '.join(MOE_KEYS)}")
    _check_keys(value, MOE_KEYS, where)
    m = Fields(value, where)
    experts = m.integer("num_experts", limit="experts", minimum=2)
    top_k = m.integer("top_k", limit="experts")
    if top_k > experts:
        raise invalid(f"{where}: top_k ({top_k}) exceeds num_experts ({experts})")
    expert_ffn = m.integer("expert_ffn_hidden_size", limit="ffn")
    shared = m.integer("shared_ffn_hidden_size", default=0, limit="ffn", minimum=0)
    first_dense = m.integer("first_dense_layers", default=0, limit="layers", minimum=0)
    if first_dense > layers:
        raise invalid(f"{where}: first_dense_layers ({first_dense}) exceeds num_layers ({layers})")
    groups = m.integer("expert_groups", default=1, limit="experts")
    per_token = m.integer("groups_per_token", default=groups, limit="experts")
    check_expert_groups(where, experts, top_k, groups, per_token,
                        names=("expert_groups", "groups_per_token"))
    gated = f.flag("gated_mlp", default=True)
    return Mlp(ffn_hidden=expert_ffn, gated=gated, num_experts=experts, top_k=top_k,
               shared_ffn_hidden=shared, expert_groups=groups,
               groups_per_token=per_token), first_dense


def _check_keys(data: Mapping[str, Any], valid: tuple[str, ...], where: str) -> None:
    for key in data:
        if key not in valid:
            close = difflib.get_close_matches(str(key), valid, n=1)
            hint = (f"Did you mean {close[0]!r}?",) if close else ()
            raise PlannerError(ErrorKind.INVALID_INPUT,
                               f"{where}: unknown key {short(key)}; valid keys: {', '.join(valid)}",
                               hint, {"key": str(key)[:60], "valid": list(valid)})
