"""Hugging Face importers of the mixture-of-experts families with their own layer layout:
DeepSeek-V3 / Kimi-K2 (MLA, dense-first layers, shared expert), gpt-oss (biased experts and
router, attention sinks, alternating sliding-window layers) and Llama 4 (MoE and dense layers
interleaved, a shared expert in every MoE layer).

Consumes: validated :class:`models.fields.Fields` of one ``config.json`` (the language-model
part: :func:`models.hf_config.import_hf_config` unwraps ``text_config``).
Produces: :class:`models.hf_common.Parts`. Field names and absent-key defaults are those of the
transformers config classes (``configuration_deepseek_v3``, ``configuration_gpt_oss``,
``configuration_llama4``); the parameter layout is that of the modeling files, and the counts
equal those of the models transformers 5.23 builds from the same configs on the meta device
(tests/test_moe_models.py).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from planner.errors import invalid
from planner.ir import Attention, Mlp, ModelGraph

from .fields import Fields, check_kv_heads, head_dim_of
from .hf_common import Parts, check_expert_groups, default_seq, moe_mlp, windows
from .params import BlockShape, EmbeddingShape, HeadShape


def expert_groups_of(f: Fields) -> tuple[int, int]:
    """(n_group, topk_group) of a DeepSeek-style config's group-limited routing (DeepSeek-V3
    report §2.1.2 node-limited routing; HF ``MoEGate``): the gate keeps ``topk_group`` of
    ``n_group`` expert groups per token under the "noaux_tc" (V3) and "group_limited_greedy"
    (V2) methods; "greedy" (V2-Lite, the V2 class default) ignores them. (1, 1): unlimited."""
    if f.data.get("topk_method", "greedy") == "greedy" or "n_group" not in f.data:
        return 1, 1
    n_group = f.integer("n_group", limit="experts")
    return n_group, f.integer("topk_group", default=n_group, limit="experts")


def with_expert_groups(graph: ModelGraph, config: Mapping[str, Any],
                       where: str = "config") -> ModelGraph:
    """``graph`` (from the operator-graph importer, which sees no routing) with the config's
    group-limited routing (:func:`expert_groups_of`) on its MoE layers, checked as the config
    reader checks it."""
    groups = expert_groups_of(Fields(config, where))
    if groups == (1, 1):
        return graph
    layers = []
    for layer in graph.layers:
        mlp = layer.mlp
        if mlp is not None and mlp.is_moe:
            check_expert_groups(where, mlp.num_experts, mlp.top_k, *groups,
                                names=("n_group", "topk_group"))
            layer = replace(layer, mlp=replace(mlp, expert_groups=groups[0],
                                               groups_per_token=groups[1]))
        layers.append(layer)
    return replace(graph, layers=tuple(layers))


def deepseek_v3(f: Fields) -> Parts:
    """``modeling_deepseek_v3``: MLA attention; the first ``first_k_dense_replace`` layers dense,
    then MoE every ``moe_layer_freq`` layers. The router's ``e_score_correction_bias`` is a
    buffer, not a parameter, and the MTP module (``num_nextn_predict_layers``) is not built by
    ``DeepseekV3ForCausalLM`` (Hugging Face transformers configuration classes); its depth is kept as ``mtp_layers``
    metadata for the cost model. Kimi-K2 (``model_type`` ``kimi_k2``) is this architecture with
    384 experts, 64 heads and one dense layer (moonshotai/Kimi-K2-Instruct config.json)."""
    layers = f.integer("num_hidden_layers", limit="layers")
    h = f.integer("hidden_size", limit="hidden")
    vocab = f.integer("vocab_size", limit="vocab")
    heads = f.integer("num_attention_heads", limit="heads")
    ffn = f.integer("intermediate_size", limit="ffn")
    # q_lora_rank: absent -> class default 1536; null -> no q LoRA (DeepSeek-V2-Lite style).
    q_rank = f.opt_integer("q_lora_rank", limit="hidden") if "q_lora_rank" in f.data else 1536
    kv_rank = f.integer("kv_lora_rank", default=512, limit="hidden")
    nope = f.integer("qk_nope_head_dim", default=128, limit="head_dim")
    rope = f.integer("qk_rope_head_dim", default=64, limit="head_dim")
    v_dim = f.integer("v_head_dim", default=128, limit="head_dim")
    experts = f.integer("n_routed_experts", "num_local_experts", default=256, limit="experts")
    top_k = f.integer("num_experts_per_tok", default=8, limit="experts")
    shared = f.integer("n_shared_experts", default=1, limit="experts", minimum=0)
    expert_ffn = f.integer("moe_intermediate_size", default=2048, limit="ffn")
    first_dense = f.integer("first_k_dense_replace", default=3, limit="layers", minimum=0)
    freq = f.integer("moe_layer_freq", default=1, limit="layers")
    max_pos = f.integer("max_position_embeddings", default=4096, limit="positions")
    bias = f.flag("attention_bias", default=False)
    tied = f.flag("tie_word_embeddings", default=False)
    mtp = f.integer("num_nextn_predict_layers", "num_mtp_layers", default=0, limit="layers",
                    minimum=0)
    groups = expert_groups_of(f)

    attention = Attention(num_heads=heads, num_kv_heads=heads, head_dim=nope + rope,
                          v_head_dim=v_dim, q_lora_rank=q_rank, kv_lora_rank=kv_rank,
                          rope_head_dim=rope)
    dense = Mlp(ffn_hidden=ffn, gated=True)
    moe = moe_mlp(f, expert_ffn, experts, top_k, shared * expert_ffn, groups) \
        if experts > 1 else dense
    blocks = []
    for i in range(layers):
        is_moe = i >= first_dense and i % freq == 0
        blocks.append((f"block.{i}", BlockShape(hidden=h, attention=attention,
                                                mlp=moe if is_moe else dense,
                                                qkv_bias=bias, out_bias=bias)))
    return Parts(embedding=EmbeddingShape(vocab=vocab, hidden=h), blocks=blocks,
                 head=HeadShape(vocab=vocab, hidden=h, tied=tied), max_seq_len=max_pos,
                 default_seq_len=default_seq(max_pos), positions="rope",
                 metadata=(("mtp_layers", str(mtp)),) if mtp else ())


def gpt_oss(f: Fields) -> Parts:
    """``modeling_gpt_oss``: every layer MoE. q/k/v/o projections biased (``attention_bias``,
    default true) plus one learned sink logit per head; the router ``Linear(h, E)`` has a bias;
    each expert is a gated MLP whose ``gate_up_proj`` and ``down_proj`` carry biases. Layers
    alternate sliding-window (even) and full attention unless ``layer_types`` says otherwise.
    The published counts (OpenAI, "gpt-oss-120b & gpt-oss-20b Model Card", Table 1) count the
    unembedding but not the embedding among the active parameters."""
    layers = f.integer("num_hidden_layers", limit="layers")
    h = f.integer("hidden_size", limit="hidden")
    vocab = f.integer("vocab_size", limit="vocab")
    heads = f.integer("num_attention_heads", limit="heads")
    kv = f.integer("num_key_value_heads", default=8, limit="heads")
    check_kv_heads(f, heads, kv)
    explicit = f.opt_integer("head_dim", limit="head_dim")
    d = head_dim_of(f, h, heads, explicit if explicit is not None else 64, "num_attention_heads")
    ffn = f.integer("intermediate_size", limit="ffn")
    experts = f.integer("num_local_experts", "num_experts", default=128, limit="experts")
    top_k = f.integer("num_experts_per_tok", "experts_per_token", default=4, limit="experts")
    max_pos = f.integer("max_position_embeddings", default=131072, limit="positions")
    sliding = f.opt_integer("sliding_window", limit="positions") if "sliding_window" in f.data \
        else 128
    bias = f.flag("attention_bias", default=True)
    tied = f.flag("tie_word_embeddings", default=False)
    train_seq = f.integer("initial_context_length", default=4096, limit="positions")
    mlp = moe_mlp(f, ffn, experts, top_k, 0) if experts > 1 else Mlp(ffn_hidden=ffn, gated=True)
    per_layer = windows(f, layers, sliding, lambda i: i % 2 == 0)
    blocks = []
    for i in range(layers):
        attention = Attention(num_heads=heads, num_kv_heads=kv, head_dim=d, v_head_dim=d,
                              sliding_window=per_layer[i])
        blocks.append((f"block.{i}", BlockShape(
            hidden=h, attention=attention, mlp=mlp, qkv_bias=bias, out_bias=bias,
            mlp_bias=True, router_bias=True, attention_sinks=True)))
    return Parts(embedding=EmbeddingShape(vocab=vocab, hidden=h), blocks=blocks,
                 head=HeadShape(vocab=vocab, hidden=h, tied=tied), max_seq_len=max_pos,
                 default_seq_len=min(train_seq, max_pos), positions="rope")


def llama4(f: Fields) -> Parts:
    """``modeling_llama4`` (``Llama4ForCausalLM``, the language model of Llama 4): layer i is MoE
    when it is in ``moe_layers`` (default: every ``interleave_moe_layer_step``-th layer, ending
    each step), else a dense gated MLP of ``intermediate_size_mlp``. A MoE layer holds
    ``num_local_experts`` routed experts of ``intermediate_size``, a bias-free router and one
    shared expert of ``intermediate_size``. The q/k norm (``use_qk_norm``) is a weightless L2
    norm; chunked local attention (``attention_chunk_size``) on the RoPE layers is not modelled
    (it equals full causal attention up to the chunk length, 8192). The vision encoder of the
    multimodal checkpoints is not imported."""
    layers = f.integer("num_hidden_layers", limit="layers")
    h = f.integer("hidden_size", limit="hidden")
    vocab = f.integer("vocab_size", limit="vocab")
    heads = f.integer("num_attention_heads", limit="heads")
    kv = f.integer("num_key_value_heads", default=8, limit="heads")
    check_kv_heads(f, heads, kv)
    explicit = f.opt_integer("head_dim", limit="head_dim")
    d = head_dim_of(f, h, heads, explicit if explicit is not None else 128, "num_attention_heads")
    expert_ffn = f.integer("intermediate_size", limit="ffn")
    dense_ffn = f.integer("intermediate_size_mlp", default=16384, limit="ffn")
    experts = f.integer("num_local_experts", "num_experts", default=16, limit="experts")
    top_k = f.integer("num_experts_per_tok", default=1, limit="experts")
    step = f.integer("interleave_moe_layer_step", default=1, limit="layers")
    max_pos = f.integer("max_position_embeddings", default=4096 * 32, limit="positions")
    bias = f.flag("attention_bias", default=False)
    tied = f.flag("tie_word_embeddings", default=False)
    if "moe_layers" in f.data and f.data["moe_layers"] is not None:
        moe_layers = set(f.int_list("moe_layers"))
        outside = sorted(i for i in moe_layers if i >= layers)
        if outside:
            raise invalid(f"{f.where}: 'moe_layers' names layer {outside[0]} but the model has "
                          f"{layers} layers")
    else:
        moe_layers = set(range(step - 1, layers, step))
    dense = Mlp(ffn_hidden=dense_ffn, gated=True)
    moe = moe_mlp(f, expert_ffn, experts, top_k, expert_ffn) if experts > 1 else dense
    attention = Attention(num_heads=heads, num_kv_heads=kv, head_dim=d, v_head_dim=d)
    blocks = [(f"block.{i}", BlockShape(hidden=h, attention=attention,
                                        mlp=moe if i in moe_layers else dense,
                                        qkv_bias=bias, out_bias=bias))
              for i in range(layers)]
    return Parts(embedding=EmbeddingShape(vocab=vocab, hidden=h), blocks=blocks,
                 head=HeadShape(vocab=vocab, hidden=h, tied=tied), max_seq_len=max_pos,
                 default_seq_len=default_seq(max_pos), positions="rope")
