"""MoE importers and presets: exact total and active parameter counts against the published ones.

Two independent references per model:

* ``META``: the count of the model transformers 5.23 builds from the same ``config.json`` on the
  meta device (``sum(p.numel() for p in model.parameters())``; active = total minus the routed
  experts plus top_k / num_experts of them). Kimi-K2 was built as a ``deepseek_v3`` config,
  Llama 4 as ``Llama4ForCausalLM`` from its ``text_config``.
* ``PUBLISHED``: the figures the model publishers state (model cards, by name), which are rounded.
  The convention for "active" differs: Mistral, DeepSeek, Qwen and Moonshot count both embedding
  tables; OpenAI's gpt-oss model card (Table 1) counts the unembedding but not the embedding.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from models import load_model
from models.hf_config import import_hf_config
from planner.errors import ErrorKind, PlannerError
from planner.ir import LayerKind

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "models" / "hf_configs"

# preset -> (total, active incl. both embedding tables), transformers 5.23 meta-device counts
META = {
    "deepseek-v3": (671_026_404_352, 37_552_282_624),
    "kimi-k2": (1_026_408_209_408, 32_861_477_888),
    "qwen3-30b-a3b": (30_532_122_624, 3_353_032_704),
    "qwen3-235b-a22b": (235_093_634_560, 22_190_763_520),
    "gpt-oss-120b": (116_829_156_672, 5_711_982_912),
    "gpt-oss-20b": (20_914_757_184, 4_187_440_704),
    "llama-4-scout": (107_769_861_120, 17_172_894_720),
    "llama-4-maverick": (400_711_848_960, 17_184_691_200),
    "mixtral-8x7b": (46_702_792_704, 12_879_925_248),
    "mixtral-8x22b": (140_630_071_296, 39_161_468_928),
}

# preset -> (published total, published active, relative tolerance, source)
PUBLISHED = {
    "deepseek-v3": (671e9, 37e9, 0.02, "DeepSeek-V3 model card / tech report: 671B total, 37B "
                    "activated (without the 14B MTP module)"),
    "kimi-k2": (1.0e12, 32e9, 0.03, "Kimi-K2-Instruct model card: 1T total, 32B activated"),
    "qwen3-30b-a3b": (30.5e9, 3.3e9, 0.02, "Qwen3-30B-A3B model card: 30.5B total, 3.3B "
                      "activated"),
    "qwen3-235b-a22b": (235e9, 22e9, 0.01, "Qwen3-235B-A22B model card: 235B total, 22B "
                        "activated"),
    "llama-4-maverick": (400e9, 17e9, 0.02, "Llama 4 model card: Maverick 17B activated, 400B "
                         "total"),
    "mixtral-8x7b": (46.7e9, 12.9e9, 0.005, "Mistral AI Mixtral of experts: 46.7B total, 12.9B "
                     "active"),
    "mixtral-8x22b": (141e9, 39e9, 0.01, "Mistral AI Mixtral 8x22B: 141B total, 39B active"),
}


@pytest.mark.parametrize("name", sorted(META))
def test_counts_equal_transformers_meta_device(name):
    graph = load_model(name)
    assert (graph.params, graph.active_params) == META[name]


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_counts_match_published(name):
    total, active, rel, source = PUBLISHED[name]
    graph = load_model(name)
    assert graph.params == pytest.approx(total, rel=rel), source
    assert graph.active_params == pytest.approx(active, rel=rel), source


def _embedding(graph) -> int:
    return graph.layers[0].params


def test_gpt_oss_matches_model_card_table():
    """OpenAI gpt-oss model card, Table 1 (billions): 120b: MLP 114.71, attention 0.96,
    embed + unembed 1.16, active 5.13, total 116.83; 20b: 19.12, 0.64, 1.16, 3.61, 20.91."""
    card = {"gpt-oss-120b": (114.71, 0.96, 1.16, 5.13, 116.83),
            "gpt-oss-20b": (19.12, 0.64, 1.16, 3.61, 20.91)}
    for name, (mlp_b, attn_b, emb_b, active_b, total_b) in card.items():
        graph = load_model(name)
        h, heads, kv, d, ffn = 2880, 64, 8, 64, 2880
        block = graph.layers[1]
        experts = block.mlp.num_experts
        mlp = experts * (3 * h * ffn + 2 * ffn + h) + experts * h + experts  # + biases, router
        attn = h * heads * d + heads * d + 2 * (h * kv * d + kv * d) + heads * d * h + h + heads
        assert block.params == mlp + attn + 2 * h  # + 2 RMSNorms
        layers = graph.num_blocks
        assert round(mlp * layers / 1e9, 2) == mlp_b
        assert round(attn * layers / 1e9, 2) == attn_b
        assert round((_embedding(graph) + graph.layers[-1].params - h) / 1e9, 2) == emb_b
        assert round((graph.active_params - _embedding(graph)) / 1e9, 2) == active_b
        assert round(graph.params / 1e9, 2) == total_b


def test_gpt_oss_alternates_sliding_and_full_attention():
    blocks = list(load_model("gpt-oss-120b").blocks())
    assert [b.attention.sliding_window for b in blocks[:4]] == [128, None, 128, None]
    assert all(b.mlp.is_moe and b.mlp.top_k == 4 and b.mlp.num_experts == 128 for b in blocks)
    assert blocks[0].expert_params == 128 * (3 * 2880 * 2880 + 2 * 2880 + 2880)


def test_llama4_scout_language_model_and_published_active():
    """Llama 4 model card: Scout 17B activated, 109B total. The 109B includes the vision encoder
    (about 0.9B), which the planner does not import; the language model is 107.77B."""
    graph = load_model("llama-4-scout")
    assert graph.active_params == pytest.approx(17e9, rel=0.02)
    assert graph.params == pytest.approx(109e9, rel=0.015) and graph.params < 109e9
    block = graph.layers[1]
    assert block.mlp.num_experts == 16 and block.mlp.top_k == 1
    assert block.mlp.shared_ffn_hidden == 8192 and block.mlp.ffn_hidden == 8192
    h = 5120
    assert block.params == (2 * h * h + 2 * h * 1024) + 17 * 3 * h * 8192 + 16 * h + 2 * h


def test_llama4_maverick_interleaves_dense_and_moe_layers():
    graph = load_model("llama-4-maverick")
    kinds = [b.mlp.is_moe for b in graph.blocks()]
    assert kinds == [i % 2 == 1 for i in range(48)]  # interleave_moe_layer_step 2
    dense = graph.layers[1]
    assert dense.mlp.ffn_hidden == 16384 and not dense.mlp.is_moe  # intermediate_size_mlp
    assert [c.count for c in graph.layer_classes()] == [1] + [1] * 48 + [1]


def test_llama4_explicit_moe_layers_and_bad_index():
    config = json.loads((CONFIGS / "Llama-4-Scout-17B-16E.json").read_text())
    text = dict(config["text_config"], num_hidden_layers=4, moe_layers=[1, 3])
    graph = import_hf_config({"model_type": "llama4", "text_config": text}, name="x")
    assert [b.mlp.is_moe for b in graph.blocks()] == [False, True, False, True]
    with pytest.raises(PlannerError) as info:
        import_hf_config({"text_config": dict(text, moe_layers=[4])}, name="x")
    assert info.value.kind is ErrorKind.INVALID_INPUT and "moe_layers" in info.value.message


def test_kimi_k2_is_deepseek_v3_with_384_experts():
    graph = load_model("kimi-k2")
    classes = graph.layer_classes()
    assert [c.count for c in classes] == [1, 1, 60, 1]  # embedding, 1 dense, 60 MoE, head
    moe = classes[2].layer
    assert moe.mlp.num_experts == 384 and moe.mlp.top_k == 8 and moe.mlp.shared_ffn_hidden == 2048
    assert moe.attention.is_mla and moe.attention.num_heads == 64
    # the same file read as a deepseek_v3 config gives the same graph
    config = json.loads((CONFIGS / "Kimi-K2-Instruct.json").read_text())
    same = import_hf_config(dict(config, model_type="deepseek_v3"), name="kimi-k2")
    assert same.params == graph.params and same.active_params == graph.active_params


def test_deepseek_v3_records_its_mtp_depth():
    assert dict(load_model("deepseek-v3").metadata)["mtp_layers"] == "1"
    assert "mtp_layers" not in dict(load_model("kimi-k2").metadata)  # num_nextn_predict_layers 0


def test_model_type_from_architecture_name():
    config = json.loads((CONFIGS / "gpt-oss-20b.json").read_text())
    del config["model_type"]
    assert import_hf_config(config, name="x").params == META["gpt-oss-20b"][0]


def test_gpt_oss_top_k_above_experts_is_rejected():
    config = json.loads((CONFIGS / "gpt-oss-20b.json").read_text())
    with pytest.raises(PlannerError) as info:
        import_hf_config(dict(config, num_experts_per_tok=64, experts_per_token=64), name="x")
    assert info.value.kind is ErrorKind.INVALID_INPUT


def test_expert_parameters_split_from_dense():
    for name in ("qwen3-30b-a3b", "llama-4-scout", "gpt-oss-20b"):
        graph = load_model(name)
        for layer in graph.layers:
            if layer.kind is LayerKind.BLOCK and layer.mlp.is_moe:
                per_expert = layer.expert_params // layer.mlp.num_experts
                assert layer.params - layer.active_params == \
                    per_expert * (layer.mlp.num_experts - layer.mlp.top_k)


def test_tiny_moe_preset_counts():
    """h 256, 8 heads / 4 KV heads of 32; one dense block (F 512), three MoE blocks of 8
    experts (F 256, top-2) + a shared expert (F 256); untied 1024-token vocabulary."""
    graph = load_model("tiny-moe")
    h, attn, norms = 256, 256 * 256 * 2 + 256 * 128 * 2, 2 * 256
    expert = 3 * h * 256
    dense = attn + 3 * h * 512 + norms
    moe = attn + 8 * expert + h * 8 + expert + norms
    embeddings = 2 * 1024 * h + h
    assert graph.params == dense + 3 * moe + embeddings
    assert graph.active_params == dense + 3 * (moe - 6 * expert) + embeddings
