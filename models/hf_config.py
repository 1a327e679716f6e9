"""Hugging Face ``config.json`` importer.

Consumes: a parsed ``config.json`` mapping (or a path to one), keyed by ``model_type``.
Produces: a :class:`planner.ir.ModelGraph` whose per-layer parameter counts equal those of the
model transformers would build from the same config (pure arithmetic; transformers is not
needed). Families: see :data:`SUPPORTED`.

Field names per family and the absent-key defaults are those of the transformers config
classes (Hugging Face transformers configuration classes). The shape keys (layers, hidden, heads, vocab, FFN
width) are required, because a silently defaulted size would plan for the wrong model; flags
and secondary sizes take the class default when absent or null (GPT-2, Gemma, Falcon, BERT and
T5 tie their embeddings by default; the Llama family does not).

Nested multimodal configs (``text_config``) import their language model.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from planner.errors import ErrorKind, PlannerError, invalid
from planner.ir import Attention, Mlp, ModelGraph

from .fields import Fields, check_kv_heads, head_dim_of
from .hf_common import Parts, default_seq as _seq, moe_mlp as _moe, windows as _windows
from .hf_moe import deepseek_v3, gpt_oss, llama4
from .params import BlockShape, EmbeddingShape, HeadShape, assemble
from .reading import read_mapping

BERT_HEADS = ("mlm", "pooler")


def load_hf_config(path: str | Path, *, bert_head: str = "mlm") -> ModelGraph:
    """Read ``path`` and import it; the graph is named after the file stem."""
    path = Path(path)
    return import_hf_config(read_mapping(path), name=path.stem, source=str(path),
                            where=str(path), bert_head=bert_head)


def import_hf_config(config: Mapping[str, Any], *, name: str, source: str = "",
                     where: str = "config", bert_head: str = "mlm") -> ModelGraph:
    """Import a parsed config. ``bert_head``: "mlm" (BertForMaskedLM, the default) or "pooler"
    (the bare BertModel with its pooler)."""
    if bert_head not in BERT_HEADS:
        raise invalid(f"bert_head must be one of {', '.join(BERT_HEADS)}, got {bert_head!r}")
    text = config.get("text_config")
    if text is not None:
        if not isinstance(text, dict):
            raise invalid(f"{where}: 'text_config' must be a mapping")
        config, where = text, f"{where} (text_config)"
    fields = Fields(config, where)
    model_type = _model_type(fields)
    parts = _bert(fields, bert_head) if model_type == "bert" else _FAMILIES[model_type](fields)
    metadata = [("positions", parts.positions), *parts.metadata]
    dtype = config.get("torch_dtype", config.get("dtype"))
    if isinstance(dtype, str):
        metadata.append(("dtype", dtype))
    archs = config.get("architectures")
    if isinstance(archs, list) and archs and isinstance(archs[0], str):
        metadata.append(("architecture", archs[0]))
    return assemble(name=name, family=model_type, embedding=parts.embedding, blocks=parts.blocks,
                    head=parts.head, default_seq_len=parts.default_seq_len,
                    max_seq_len=parts.max_seq_len, source=source, metadata=metadata)


# -- model_type ------------------------------------------------------------------------------

# Architecture class-name prefixes, for configs saved without a model_type.
_ARCH_PREFIXES = {
    "Llama": "llama", "Mistral": "mistral", "Mixtral": "mixtral", "Qwen2Moe": "qwen2_moe",
    "Qwen2": "qwen2", "Qwen3Moe": "qwen3_moe", "Qwen3": "qwen3", "Gemma2": "gemma2",
    "Gemma": "gemma", "Phi3": "phi3", "Falcon": "falcon", "DeepseekV3": "deepseek_v3",
    "GptOss": "gpt_oss", "Llama4": "llama4",
    "GPT2": "gpt2", "GPTNeoX": "gpt_neox", "Bert": "bert", "T5": "t5", "ViT": "vit",
}


def _model_type(fields: Fields) -> str:
    value = fields.data.get("model_type")
    if value is None:
        archs = fields.data.get("architectures")
        arch = archs[0] if isinstance(archs, list) and archs else None
        matches = [p for p in _ARCH_PREFIXES if isinstance(arch, str) and arch.startswith(p)]
        if not matches:
            raise invalid(f"{fields.where}: no 'model_type' key, so the model family is unknown",
                          f"Add \"model_type\": one of {', '.join(SUPPORTED)}.")
        return _ARCH_PREFIXES[max(matches, key=len)]
    if not isinstance(value, str):
        raise invalid(f"{fields.where}: 'model_type' must be a string")
    if value not in _FAMILIES:
        raise PlannerError(
            ErrorKind.UNSUPPORTED,
            f"{fields.where}: model_type {value[:60]!r} is not supported; supported model types: "
            f"{', '.join(SUPPORTED)}",
            ("Describe the model in the native format instead (docs/models.md).",),
            {"model_type": value[:60], "supported": list(SUPPORTED)})
    return value


# -- shared pieces ---------------------------------------------------------------------------

def _mha(fields: Fields, hidden: int, heads_key: str, heads: int, *, causal: bool) -> Attention:
    d = head_dim_of(fields, hidden, heads, None, heads_key)
    return Attention(num_heads=heads, num_kv_heads=heads, head_dim=d, v_head_dim=d,
                     causal=causal)


# -- Llama-style decoders (llama, mistral, mixtral, qwen*, gemma*, phi3) ----------------------

@dataclass(frozen=True)
class _Rules:
    """How one llama-style family differs (transformers ``configuration_*`` / ``modeling_*``)."""

    tied: bool = False  # class default of tie_word_embeddings
    max_pos: int = 2048  # class default of max_position_embeddings
    kv_default: int | None = None  # None: = num_attention_heads
    head_dim: int | None = None  # class default of head_dim; None: hidden / heads
    # none | attention_bias: the flag biases q,k,v,o | qkv: q,k,v always biased (Qwen2) |
    # qkv_flag: q,k,v biased unless qkv_bias is false (Qwen2-MoE)
    bias: str = "none"
    mlp_bias_flag: bool = False  # Llama's mlp_bias biases gate/up/down
    num_norms: int = 2
    qk_norm: bool = False
    moe: str = ""  # "" | mixtral | qwen
    experts: tuple[int, int, int, int] = (0, 0, 0, 0)  # defaults: E, top-k, expert F, shared F
    shared_expert: bool = False  # Qwen2-MoE: shared expert + its sigmoid gate
    sliding: str = "none"  # none | always | qwen | alternate
    sliding_default: int | None = None


_LLAMA_RULES = {
    "llama": _Rules(bias="attention_bias", mlp_bias_flag=True),
    "mistral": _Rules(max_pos=131072, kv_default=8, sliding="always", sliding_default=4096),
    "mixtral": _Rules(max_pos=131072, kv_default=8, moe="mixtral", experts=(8, 2, 0, 0),
                      sliding="always"),
    "qwen2": _Rules(max_pos=32768, bias="qkv", sliding="qwen", sliding_default=4096),
    "qwen2_moe": _Rules(max_pos=32768, bias="qkv_flag", moe="qwen",
                        experts=(60, 4, 1408, 5632), shared_expert=True, sliding="qwen",
                        sliding_default=4096),
    "qwen3": _Rules(max_pos=32768, head_dim=128, bias="attention_bias", qk_norm=True,
                    sliding="qwen", sliding_default=4096),
    "qwen3_moe": _Rules(max_pos=32768, bias="attention_bias", qk_norm=True, moe="qwen",
                        experts=(128, 8, 768, 0), sliding="qwen", sliding_default=4096),
    "gemma": _Rules(tied=True, max_pos=8192, kv_default=16, head_dim=256, bias="attention_bias"),
    "gemma2": _Rules(tied=True, max_pos=8192, kv_default=8, head_dim=256, bias="attention_bias",
                     num_norms=4, sliding="alternate", sliding_default=4096),
    "phi3": _Rules(max_pos=4096, sliding="always"),
}


def _llama_like(f: Fields, rules: _Rules) -> Parts:
    layers = f.integer("num_hidden_layers", limit="layers")
    h = f.integer("hidden_size", limit="hidden")
    vocab = f.integer("vocab_size", limit="vocab")
    heads = f.integer("num_attention_heads", limit="heads")
    kv = f.integer("num_key_value_heads", default=rules.kv_default or heads, limit="heads")
    check_kv_heads(f, heads, kv)
    explicit = f.opt_integer("head_dim", limit="head_dim")
    d = head_dim_of(f, h, heads, explicit if explicit is not None else rules.head_dim,
                    "num_attention_heads")
    ffn = f.integer("intermediate_size", limit="ffn")
    max_pos = f.integer("max_position_embeddings", default=rules.max_pos, limit="positions")
    tied = f.flag("tie_word_embeddings", default=rules.tied)
    qkv_bias, out_bias, mlp_bias = _llama_biases(f, rules)
    dense = Mlp(ffn_hidden=ffn, gated=True)
    mlps = _llama_mlps(f, rules, layers, dense)
    windows = _llama_windows(f, rules, layers)

    blocks = []
    for i in range(layers):
        attention = Attention(num_heads=heads, num_kv_heads=kv, head_dim=d, v_head_dim=d,
                              sliding_window=windows[i])
        shape = BlockShape(hidden=h, attention=attention, mlp=mlps[i], num_norms=rules.num_norms,
                           qkv_bias=qkv_bias, out_bias=out_bias, mlp_bias=mlp_bias,
                           qk_norm=rules.qk_norm,
                           shared_expert_gate=rules.shared_expert and mlps[i].shared_ffn_hidden > 0)
        blocks.append((f"block.{i}", shape))
    return Parts(embedding=EmbeddingShape(vocab=vocab, hidden=h), blocks=blocks,
                 head=HeadShape(vocab=vocab, hidden=h, tied=tied), max_seq_len=max_pos,
                 default_seq_len=_seq(max_pos), positions="rope")


def _llama_biases(f: Fields, rules: _Rules) -> tuple[bool, bool, bool]:
    """(q/k/v bias, o_proj bias, MLP bias)."""
    mlp_bias = f.flag("mlp_bias", default=False) if rules.mlp_bias_flag else False
    if rules.bias == "attention_bias":
        attn_bias = f.flag("attention_bias", default=False)
        return attn_bias, attn_bias, mlp_bias
    if rules.bias == "qkv":
        return True, False, mlp_bias  # Qwen2: q/k/v carry a bias, hard-coded
    if rules.bias == "qkv_flag":
        return f.flag("qkv_bias", default=True), False, mlp_bias
    return False, False, mlp_bias


def _llama_mlps(f: Fields, rules: _Rules, layers: int, dense: Mlp) -> list[Mlp]:
    """Per-layer MLP: Mixtral makes every layer MoE (``intermediate_size`` is per expert);
    Qwen-MoE makes layer i MoE when (i + 1) % decoder_sparse_step == 0 and i is not in
    ``mlp_only_layers``, with experts of ``moe_intermediate_size``."""
    e_def, k_def, f_def, s_def = rules.experts
    if rules.moe == "mixtral":
        experts = f.integer("num_local_experts", "num_experts", default=e_def, limit="experts")
        top_k = f.integer("num_experts_per_tok", default=k_def, limit="experts")
        if experts == 1:
            return [dense] * layers
        return [_moe(f, dense.ffn_hidden, experts, top_k, 0)] * layers
    if rules.moe == "qwen":
        experts = f.integer("num_experts", "num_local_experts", default=e_def,
                            limit="experts", minimum=0)
        top_k = f.integer("num_experts_per_tok", default=k_def, limit="experts")
        expert_ffn = f.integer("moe_intermediate_size", default=f_def, limit="ffn")
        shared = f.integer("shared_expert_intermediate_size", default=s_def, limit="ffn",
                           minimum=0) if rules.shared_expert else 0
        step = f.integer("decoder_sparse_step", default=1, limit="layers")
        dense_only = set(f.int_list("mlp_only_layers"))
        if experts <= 1:
            return [dense] * layers
        moe = _moe(f, expert_ffn, experts, top_k, shared)
        return [moe if i not in dense_only and (i + 1) % step == 0 else dense
                for i in range(layers)]
    return [dense] * layers


def _llama_windows(f: Fields, rules: _Rules, layers: int) -> list[int | None]:
    """Per-layer sliding window (None: full attention)."""
    sliding = f.opt_integer("sliding_window", limit="positions") if "sliding_window" in f.data \
        else rules.sliding_default
    if rules.sliding == "always":
        return _windows(f, layers, sliding, lambda i: True)
    if rules.sliding == "qwen" and f.flag("use_sliding_window", default=False):
        # Qwen2/3: sliding attention only when enabled, for layers >= max_window_layers
        start = f.integer("max_window_layers", default=28, limit="layers", minimum=0)
        return _windows(f, layers, sliding, lambda i: i >= start)
    if rules.sliding == "alternate":
        return _windows(f, layers, sliding, lambda i: i % 2 == 0)  # gemma2: even layers local
    return [None] * layers


# -- GPT-2, GPT-NeoX, Falcon -----------------------------------------------------------------

def _gpt2(f: Fields) -> Parts:
    """``modeling_gpt2``: learned positions, pre-LN, fused c_attn with bias, 4h GeLU MLP,
    final ln_f, LM head tied by default."""
    layers = f.integer("n_layer", "num_hidden_layers", limit="layers")
    h = f.integer("n_embd", "hidden_size", limit="hidden")
    heads = f.integer("n_head", "num_attention_heads", limit="heads")
    vocab = f.integer("vocab_size", limit="vocab")
    positions = f.integer("n_positions", "max_position_embeddings", "n_ctx", default=1024,
                          limit="positions")
    ffn = f.integer("n_inner", default=4 * h, limit="ffn")
    tied = f.flag("tie_word_embeddings", default=True)
    shape = BlockShape(hidden=h, attention=_mha(f, h, "n_head", heads, causal=True),
                       mlp=Mlp(ffn_hidden=ffn, gated=False), norm_bias=True, qkv_bias=True,
                       out_bias=True, mlp_bias=True)
    return Parts(embedding=EmbeddingShape(vocab=vocab, hidden=h, positions=positions),
                 blocks=[(f"block.{i}", shape) for i in range(layers)],
                 head=HeadShape(vocab=vocab, hidden=h, norm_bias=True, tied=tied),
                 max_seq_len=positions, default_seq_len=_seq(positions), positions="learned")


def _gpt_neox(f: Fields) -> Parts:
    """``modeling_gpt_neox``: two LayerNorms per layer (parallel residual or not), fused QKV
    with bias (``attention_bias``), 4h GeLU MLP with bias, untied ``embed_out``."""
    layers = f.integer("num_hidden_layers", limit="layers")
    h = f.integer("hidden_size", limit="hidden")
    heads = f.integer("num_attention_heads", limit="heads")
    vocab = f.integer("vocab_size", limit="vocab")
    ffn = f.integer("intermediate_size", limit="ffn")
    max_pos = f.integer("max_position_embeddings", default=2048, limit="positions")
    bias = f.flag("attention_bias", default=True)
    tied = f.flag("tie_word_embeddings", default=False)
    shape = BlockShape(hidden=h, attention=_mha(f, h, "num_attention_heads", heads, causal=True),
                       mlp=Mlp(ffn_hidden=ffn, gated=False), norm_bias=True, qkv_bias=bias,
                       out_bias=bias, mlp_bias=True)
    return Parts(embedding=EmbeddingShape(vocab=vocab, hidden=h),
                 blocks=[(f"block.{i}", shape) for i in range(layers)],
                 head=HeadShape(vocab=vocab, hidden=h, norm_bias=True, tied=tied),
                 max_seq_len=max_pos, default_seq_len=_seq(max_pos), positions="rope")


def _falcon(f: Fields) -> Parts:
    """``modeling_falcon``. KV heads: ``num_kv_heads`` with the new decoder architecture
    (40B/180B), 1 with ``multi_query`` (7B), else all heads. LayerNorms per layer: new
    architecture ``num_ln_in_parallel_attn`` (default 2); old architecture 1 with
    ``parallel_attn``, else 2. ``bias`` covers every linear layer."""
    layers = f.integer("num_hidden_layers", "n_layer", limit="layers")
    h = f.integer("hidden_size", limit="hidden")
    heads = f.integer("num_attention_heads", "n_head", limit="heads")
    vocab = f.integer("vocab_size", limit="vocab")
    ffn = f.integer("ffn_hidden_size", default=4 * h, limit="ffn")
    max_pos = f.integer("max_position_embeddings", default=2048, limit="positions")
    new_arch = f.flag("new_decoder_architecture", default=False)
    multi_query = f.flag("multi_query", default=True)
    parallel = f.flag("parallel_attn", default=True)
    bias = f.flag("bias", default=False)
    tied = f.flag("tie_word_embeddings", default=True)
    alibi = f.flag("alibi", default=False)
    if new_arch:
        kv = f.integer("num_kv_heads", default=heads, limit="heads")
        norms = f.integer("num_ln_in_parallel_attn", default=2, limit="small")
        if norms not in (1, 2):
            raise invalid(f"{f.where}: 'num_ln_in_parallel_attn' must be 1 or 2, got {norms}")
    else:
        kv = 1 if multi_query else heads
        norms = 1 if parallel else 2
    check_kv_heads(f, heads, kv)
    d = head_dim_of(f, h, heads, None, "num_attention_heads")
    attention = Attention(num_heads=heads, num_kv_heads=kv, head_dim=d, v_head_dim=d)
    shape = BlockShape(hidden=h, attention=attention, mlp=Mlp(ffn_hidden=ffn, gated=False),
                       num_norms=norms, norm_bias=True, qkv_bias=bias, out_bias=bias,
                       mlp_bias=bias)
    return Parts(embedding=EmbeddingShape(vocab=vocab, hidden=h),
                 blocks=[(f"block.{i}", shape) for i in range(layers)],
                 head=HeadShape(vocab=vocab, hidden=h, norm_bias=True, tied=tied),
                 max_seq_len=max_pos, default_seq_len=_seq(max_pos),
                 positions="alibi" if alibi else "rope")


# -- encoders: BERT, ViT; encoder-decoder: T5 ------------------------------------------------

def _encoder_block(f: Fields, h: int, heads: int, ffn: int, qkv_bias: bool) -> BlockShape:
    """Post-LN BERT/ViT layer: q/k/v (+bias), output dense + bias, 2 LayerNorms, GeLU MLP."""
    return BlockShape(hidden=h, attention=_mha(f, h, "num_attention_heads", heads, causal=False),
                      mlp=Mlp(ffn_hidden=ffn, gated=False), norm_bias=True, qkv_bias=qkv_bias,
                      out_bias=True, mlp_bias=True)


def _bert(f: Fields, head_kind: str = "mlm") -> Parts:
    """``modeling_bert``. Embeddings: word + learned position + token-type tables and a
    LayerNorm. Head "mlm" (BertForMaskedLM, no pooler): transform dense + LayerNorm, decoder
    tied to the word embedding, decoder bias. Head "pooler" (BertModel): dense + tanh."""
    layers = f.integer("num_hidden_layers", limit="layers")
    h = f.integer("hidden_size", limit="hidden")
    heads = f.integer("num_attention_heads", limit="heads")
    vocab = f.integer("vocab_size", limit="vocab")
    ffn = f.integer("intermediate_size", limit="ffn")
    max_pos = f.integer("max_position_embeddings", default=512, limit="positions")
    types = f.integer("type_vocab_size", default=2, limit="small", minimum=0)
    kind = f.text("position_embedding_type", default="absolute")
    if kind != "absolute":
        raise PlannerError(ErrorKind.UNSUPPORTED, f"{f.where}: BERT position_embedding_type "
                           f"{kind[:40]!r} is not supported (only 'absolute')")
    tied = f.flag("tie_word_embeddings", default=True)
    shape = _encoder_block(f, h, heads, ffn, qkv_bias=True)
    if head_kind == "mlm":
        head = HeadShape(vocab=vocab, hidden=h, num_norms=0, dense=h * h + h,
                         dense_norm_bias=True, tied=tied, lm_head_bias=True)
    else:
        head = HeadShape(vocab=vocab, hidden=h, num_norms=0, dense=h * h + h, lm_head=False)
    return Parts(embedding=EmbeddingShape(vocab=vocab, hidden=h, positions=max_pos,
                                          token_types=types, norm_bias=True),
                 blocks=[(f"block.{i}", shape) for i in range(layers)], head=head,
                 max_seq_len=max_pos, default_seq_len=max_pos, positions="learned")


def _pair(f: Fields, key: str, default: int) -> tuple[int, int]:
    value = f.data.get(key)
    if isinstance(value, list) and len(value) == 2:
        return (f.check_int(f"{key}[0]", value[0], limit="positions"),
                f.check_int(f"{key}[1]", value[1], limit="positions"))
    size = f.integer(key, default=default, limit="positions")
    return size, size


def _vit(f: Fields) -> Parts:
    """``modeling_vit`` (ViTModel with its pooler). Embeddings: CLS token, patch projection
    (a Conv2d C*p*p -> h with bias) and (patches + 1) learned positions; final LayerNorm;
    pooler dense. Sequence = (image/patch)^2 + 1 tokens."""
    layers = f.integer("num_hidden_layers", limit="layers")
    h = f.integer("hidden_size", limit="hidden")
    heads = f.integer("num_attention_heads", limit="heads")
    ffn = f.integer("intermediate_size", limit="ffn")
    image = _pair(f, "image_size", 224)
    patch = _pair(f, "patch_size", 16)
    channels = f.integer("num_channels", default=3, limit="small")
    qkv_bias = f.flag("qkv_bias", default=True)
    pooler = f.integer("pooler_output_size", default=h, limit="hidden")
    if patch[0] > image[0] or patch[1] > image[1]:
        raise invalid(f"{f.where}: patch_size {patch} is larger than image_size {image}")
    tokens = (image[0] // patch[0]) * (image[1] // patch[1]) + 1
    patch_proj = channels * patch[0] * patch[1] * h + h
    shape = _encoder_block(f, h, heads, ffn, qkv_bias=qkv_bias)
    return Parts(embedding=EmbeddingShape(vocab=0, hidden=h, positions=tokens,
                                          extra_replicated=h + patch_proj),
                 blocks=[(f"block.{i}", shape) for i in range(layers)],
                 head=HeadShape(vocab=0, hidden=h, num_norms=1, norm_bias=True, lm_head=False,
                                dense=h * pooler + pooler),
                 max_seq_len=tokens, default_seq_len=tokens, positions="learned")


def _t5(f: Fields) -> Parts:
    """``modeling_t5``: shared embedding; encoder blocks (self-attention, FF, 2 RMS-style norms)
    and decoder blocks (+ cross-attention, 3 norms); no biases; gated FF for
    ``feed_forward_proj`` "gated-*". Each stack's first layer owns a relative-position bias
    table (buckets x heads); this importer puts both tables in the embedding layer and both
    final norms in the head, so that every encoder block and every decoder block is identical."""
    enc_layers = f.integer("num_layers", limit="layers")
    dec_layers = f.integer("num_decoder_layers", default=enc_layers, limit="layers")
    h = f.integer("d_model", limit="hidden")
    heads = f.integer("num_heads", limit="heads")
    d_kv = f.integer("d_kv", default=64, limit="head_dim")
    ffn = f.integer("d_ff", limit="ffn")
    vocab = f.integer("vocab_size", limit="vocab")
    buckets = f.integer("relative_attention_num_buckets", default=32, limit="small")
    proj = f.text("feed_forward_proj", default="relu")
    tied = f.flag("tie_word_embeddings", default=True)
    mlp = Mlp(ffn_hidden=ffn, gated=proj.startswith("gated-"))

    def attention(decoder: bool) -> Attention:
        return Attention(num_heads=heads, num_kv_heads=heads, head_dim=d_kv, v_head_dim=d_kv,
                         causal=decoder, cross_attention=decoder)

    encoder = BlockShape(hidden=h, attention=attention(False), mlp=mlp)
    decoder = BlockShape(hidden=h, attention=attention(True), mlp=mlp, num_norms=3)
    blocks = ([(f"encoder.{i}", encoder) for i in range(enc_layers)]
              + [(f"decoder.{i}", decoder) for i in range(dec_layers)])
    rel_bias = buckets * heads * ((enc_layers > 0) + (dec_layers > 0))
    return Parts(embedding=EmbeddingShape(vocab=vocab, hidden=h, extra_replicated=rel_bias),
                 blocks=blocks, head=HeadShape(vocab=vocab, hidden=h, num_norms=2, tied=tied),
                 max_seq_len=None, default_seq_len=512, positions="relative")


def _llama_family(name: str) -> Callable[[Fields], Parts]:
    rules = _LLAMA_RULES[name]
    return lambda fields: _llama_like(fields, rules)


_FAMILIES: dict[str, Callable[..., Parts]] = {
    **{name: _llama_family(name) for name in _LLAMA_RULES},
    "deepseek_v3": deepseek_v3,
    "kimi_k2": deepseek_v3,  # moonshotai/Kimi-K2: DeepseekV3Config with 384 experts
    "gpt_oss": gpt_oss,
    "llama4": llama4,  # a flat Llama-4 config; the multimodal one nests llama4_text
    "llama4_text": llama4,
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
    "falcon": _falcon,
    "bert": _bert,
    "vit": _vit,
    "t5": _t5,
}

SUPPORTED: tuple[str, ...] = tuple(sorted(_FAMILIES))

__all__ = ["SUPPORTED", "BERT_HEADS", "import_hf_config", "load_hf_config"]
