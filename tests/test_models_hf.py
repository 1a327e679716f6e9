"""HF config.json importer: exact parameter counts and per-family structure."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from models import load_model
from models.hf_config import SUPPORTED, import_hf_config, load_hf_config
from planner.ir import LayerKind

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "models" / "hf_configs"
EXTRA = ROOT / "tests" / "fixtures" / "hf_extra"
EXPECTED = json.loads((ROOT / "tests" / "fixtures" / "expected_params.json").read_text())
EXTRA_EXPECTED = json.loads((EXTRA / "expected_params.json").read_text())


def _rows(table: dict) -> list[tuple[str, dict]]:
    return [(name, row) for name, row in table.items() if not name.startswith("_")]


def _config(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


@pytest.mark.parametrize("name,row", _rows(EXPECTED))
def test_fixture_totals_are_exact(name, row):
    graph = load_model(str(FIXTURES / name))
    assert graph.params == row.get("total", row.get("total_with_mlm_head"))
    if "active" in row:
        assert graph.active_params == row["active"]


@pytest.mark.parametrize("name,row", _rows(EXTRA_EXPECTED))
def test_derived_config_totals_are_exact(name, row):
    graph = load_model(str(EXTRA / name))
    assert graph.params == row["total"], row["source"]
    if "active" in row:
        assert graph.active_params == row["active"]
    if "active_approx" in row:
        assert graph.active_params == pytest.approx(row["active_approx"], rel=0.01)


def test_bert_bare_encoder_count_via_importer_option():
    graph = load_hf_config(FIXTURES / "bert-base-uncased.json", bert_head="pooler")
    assert graph.params == EXPECTED["bert-base-uncased.json"]["total_bare_encoder"]
    head = graph.layers[-1]
    assert head.tied_params == 0 and head.params == 768 * 768 + 768


def test_bert_mlm_head_is_tied_with_decoder_bias():
    graph = load_model(str(FIXTURES / "bert-base-uncased.json"))
    head, emb = graph.layers[-1], graph.layers[0]
    assert graph.tied_embeddings
    assert head.tied_params == 30522 * 768
    assert head.params == (768 * 768 + 768) + 2 * 768 + 30522  # transform, LayerNorm, bias
    # word table sharded; positions, token types, LayerNorm replicated
    assert emb.tp_replicated_params == 512 * 768 + 2 * 768 + 2 * 768
    assert graph.default_seq_len == 512 and graph.max_seq_len == 512
    assert all(not b.attention.causal for b in graph.blocks())


def test_mixtral_active_and_expert_split():
    graph = load_model(str(FIXTURES / "Mixtral-8x7B-v0.1.json"))
    block = graph.layers[1]
    per_expert = 3 * 4096 * 14336
    assert block.expert_params == 8 * per_expert
    assert block.params - block.active_params == 6 * per_expert
    assert block.mlp.num_experts == 8 and block.mlp.top_k == 2 and block.mlp.ffn_hidden == 14336
    assert block.mlp.shared_ffn_hidden == 0 and block.mlp.gated
    # norms (2h) and router (8h) are replicated
    assert block.tp_replicated_params == 2 * 4096 + 8 * 4096
    assert graph.is_moe


def test_deepseek_v3_structure():
    graph = load_model(str(FIXTURES / "DeepSeek-V3.json"))
    classes = graph.layer_classes()
    assert [(c.layer.kind, c.count) for c in classes] == [
        (LayerKind.EMBEDDING, 1), (LayerKind.BLOCK, 3), (LayerKind.BLOCK, 58), (LayerKind.HEAD, 1)]
    dense, moe = classes[1].layer, classes[2].layer
    attn = dense.attention
    assert attn.is_mla and attn.q_lora_rank == 1536 and attn.kv_lora_rank == 512
    assert (attn.head_dim, attn.v_head_dim, attn.rope_head_dim) == (192, 128, 64)
    assert attn.num_heads == attn.num_kv_heads == 128
    assert dense.mlp.num_experts == 1 and dense.mlp.ffn_hidden == 18432
    assert dense.expert_params == 0
    assert moe.mlp.num_experts == 256 and moe.mlp.top_k == 8
    assert moe.mlp.ffn_hidden == 2048 and moe.mlp.shared_ffn_hidden == 2048
    assert moe.expert_params == 256 * 3 * 7168 * 2048
    h = 7168
    mla_replicated = h * 1536 + 1536 + h * (512 + 64) + 512  # q_a, q norm, kv_a, kv norm
    assert dense.tp_replicated_params == 2 * h + mla_replicated
    assert moe.tp_replicated_params == 2 * h + mla_replicated + 256 * h  # + router
    # the score-correction bias is a buffer: 58 * 256 would overshoot the published total
    assert graph.params == EXPECTED["DeepSeek-V3.json"]["total"]
    assert graph.active_params == pytest.approx(37.55e9, rel=0.001)
    # node-limited routing (report §2.1.2): n_group 8, topk_group 4 under topk_method noaux_tc
    assert (moe.mlp.expert_groups, moe.mlp.groups_per_token) == (8, 4)


@pytest.mark.parametrize("changes, groups", [
    ({}, (8, 4)),
    ({"topk_method": "greedy"}, (1, 1)),  # V2-Lite's gate ignores the groups
    ({"topk_method": "group_limited_greedy", "n_group": 8, "topk_group": 3}, (8, 3)),  # V2
    ({"n_group": 1, "topk_group": 1}, (1, 1)),  # Kimi K2: one group
])
def test_deepseek_group_limited_routing_is_read(changes, groups):
    config = json.loads((FIXTURES / "DeepSeek-V3.json").read_text()) | changes
    graph = import_hf_config(config, name="ds")
    mlp = next(b.mlp for b in graph.blocks() if b.mlp.is_moe)
    assert (mlp.expert_groups, mlp.groups_per_token) == groups


@pytest.mark.parametrize("changes, message", [
    ({"n_group": 7}, "n_group (7) must divide the 256 routed experts"),
    ({"topk_group": 9}, "topk_group (9) must be between 1 and n_group (8)"),
    ({"n_group": 128, "topk_group": 2}, "topk_group (2) groups of 2 experts hold fewer than the 8"),
])
def test_bad_expert_groups_are_refused(changes, message):
    from planner.errors import PlannerError
    config = json.loads((FIXTURES / "DeepSeek-V3.json").read_text()) | changes
    with pytest.raises(PlannerError) as error:
        import_hf_config(config, name="ds")
    assert message in error.value.message


def test_t5_layout():
    graph = load_model(str(FIXTURES / "t5-small.json"))
    names = [layer.name for layer in graph.layers]
    assert names == (["embedding"] + [f"encoder.{i}" for i in range(6)]
                     + [f"decoder.{i}" for i in range(6)] + ["head"])
    enc, dec = graph.layers[1], graph.layers[7]
    assert not enc.attention.causal and not enc.attention.cross_attention and enc.num_norms == 2
    assert dec.attention.causal and dec.attention.cross_attention and dec.num_norms == 3
    assert enc.mlp == dec.mlp and not enc.mlp.gated and enc.mlp.ffn_hidden == 2048
    assert graph.default_seq_len == 512 and graph.tied_embeddings
    assert [c.count for c in graph.layer_classes()] == [1, 6, 6, 1]
    assert graph.layers[0].tp_replicated_params == 2 * 32 * 8  # relative-bias tables


def test_t5_gated_variant():
    cfg = dict(_config("t5-small.json"), feed_forward_proj="gated-gelu", tie_word_embeddings=False)
    graph = import_hf_config(cfg, name="t5-v1_1")
    assert graph.layers[1].mlp.gated
    base = load_model(str(FIXTURES / "t5-small.json")).params
    extra_ffn = 12 * 512 * 2048  # one more d_model x d_ff matrix per block
    assert graph.params == base + extra_ffn + 32128 * 512  # untied LM head


def test_gpt2_ties_by_default_and_learned_positions():
    graph = load_model(str(FIXTURES / "gpt2.json"))
    assert "tie_word_embeddings" not in _config("gpt2.json")
    assert graph.tied_embeddings and graph.layers[-1].tied_params == 50257 * 768
    assert graph.layers[0].tp_replicated_params == 1024 * 768
    block = graph.layers[1]
    assert block.tp_replicated_params == 4 * 768 + 768 + 768  # 2 LayerNorms, 2 row biases
    assert graph.max_seq_len == 1024 and graph.default_seq_len == 1024
    assert dict(graph.metadata)["positions"] == "learned"


def test_llama_defaults_and_shapes():
    graph = load_model(str(FIXTURES / "Llama-3.1-8B-Instruct.json"))
    block = graph.layers[1]
    assert block.attention.num_heads == 32 and block.attention.num_kv_heads == 8
    assert block.attention.head_dim == 128 and block.attention.sliding_window is None
    assert block.mlp.gated and block.mlp.ffn_hidden == 14336 and block.num_norms == 2
    assert block.tp_replicated_params == 2 * 4096
    assert not graph.tied_embeddings and graph.layers[-1].params == 128256 * 4096 + 4096
    assert graph.max_seq_len == 131072 and graph.default_seq_len == 4096
    assert graph.family == "llama" and graph.name == "Llama-3.1-8B-Instruct"
    # absent tie_word_embeddings: the llama class default is False
    cfg = {k: v for k, v in _config("Llama-3.1-8B-Instruct.json").items()
           if k != "tie_word_embeddings"}
    assert not import_hf_config(cfg, name="x").tied_embeddings


def test_llama_attention_and_mlp_bias_flags():
    base = _config("Llama-3.1-8B-Instruct.json")
    plain = import_hf_config(base, name="x").params
    biased = import_hf_config(dict(base, attention_bias=True, mlp_bias=True), name="x")
    h, kv, ffn = 4096, 8 * 128, 14336
    assert biased.params - plain == 32 * ((h + 2 * kv + h) + (2 * ffn + h))
    block = biased.layers[1]
    assert block.tp_replicated_params == 2 * h + h + h  # norms, o_proj and down_proj biases


def test_qwen2_qkv_bias():
    graph = load_model(str(FIXTURES / "Qwen2.5-72B-Instruct.json"))
    block = graph.layers[1]
    assert block.attention.sliding_window is None  # use_sliding_window is false
    h, kv = 8192, 8 * 128
    assert block.params == (2 * h * h + 2 * h * kv + h + 2 * kv) + 3 * h * 29568 + 2 * h


def test_qwen3_head_dim_and_qk_norm():
    graph = load_model(str(EXTRA / "Qwen3-30B-A3B.json"))
    block = graph.layers[1]
    assert block.attention.head_dim == 128 and 2048 // 32 == 64  # explicit head_dim wins
    assert block.tp_replicated_params == 2 * 2048 + 2 * 128 + 128 * 2048  # norms, q/k norms, router
    assert block.mlp.num_experts == 128 and block.mlp.shared_ffn_hidden == 0


def test_qwen_moe_sparse_step_and_dense_layers():
    cfg = json.loads((EXTRA / "Qwen1.5-MoE-A2.7B.json").read_text())
    graph = import_hf_config(dict(cfg, decoder_sparse_step=2, mlp_only_layers=[3]), name="x")
    kinds = [b.mlp.is_moe for b in graph.blocks()]
    assert kinds[:6] == [False, True, False, False, False, True]
    moe = graph.layers[2]
    assert moe.mlp.shared_ffn_hidden == 5632 and moe.mlp.top_k == 4
    # router (60h) and the shared-expert gate (h) are replicated
    assert moe.tp_replicated_params == 2 * 2048 + 60 * 2048 + 2048
    dense = graph.layers[1]
    assert dense.mlp.ffn_hidden == 5632 and dense.expert_params == 0


def test_gemma2_sandwich_norms_and_alternating_windows():
    graph = load_model(str(EXTRA / "gemma-2-9b.json"))
    blocks = list(graph.blocks())
    assert all(b.num_norms == 4 for b in blocks)
    assert [b.attention.sliding_window for b in blocks[:4]] == [4096, None, 4096, None]
    assert graph.tied_embeddings  # no tie key in the file: the gemma class default ties
    assert blocks[0].attention.head_dim == 256


def test_layer_types_override_sliding_pattern():
    cfg = json.loads((EXTRA / "gemma-2-9b.json").read_text())
    types = ["full_attention"] * 41 + ["sliding_attention"]
    graph = import_hf_config(dict(cfg, layer_types=types), name="x")
    windows = [b.attention.sliding_window for b in graph.blocks()]
    assert windows[-1] == 4096 and set(windows[:-1]) == {None}


def test_mistral_sliding_window_and_falcon_multi_query():
    cfg = dict(_config("Llama-3.1-8B-Instruct.json"), model_type="mistral", sliding_window=4096)
    graph = import_hf_config(cfg, name="m")
    assert {b.attention.sliding_window for b in graph.blocks()} == {4096}
    falcon = load_model(str(EXTRA / "falcon-7b.json"))
    block = falcon.layers[1]
    assert block.attention.num_kv_heads == 1 and block.attention.head_dim == 64
    assert block.num_norms == 1 and not block.mlp.gated and block.mlp.ffn_hidden == 4 * 4544
    assert falcon.tied_embeddings


def test_falcon_new_decoder_architecture():
    cfg = dict(json.loads((EXTRA / "falcon-7b.json").read_text()), new_decoder_architecture=True,
               num_kv_heads=71, hidden_size=4544)
    graph = import_hf_config(cfg, name="f")
    block = graph.layers[1]
    assert block.attention.num_kv_heads == 71 and block.num_norms == 2
    h = 4544
    assert block.params == 4 * h * h + 8 * h * h + 2 * 2 * h


def test_vit_tokens_and_no_vocab():
    graph = load_model(str(EXTRA / "vit-base-patch16-224-in21k.json"))
    assert graph.default_seq_len == 197 and graph.max_seq_len == 197
    assert graph.vocab == 0 and graph.layers[-1].tied_params == 0
    assert all(not b.attention.causal for b in graph.blocks())


def test_phi3_and_neox_shapes():
    phi = load_model(str(EXTRA / "Phi-3-mini-4k-instruct.json"))
    assert phi.layers[1].attention.sliding_window == 2047 and phi.layers[1].mlp.gated
    neox = load_model(str(EXTRA / "gpt-neox-20b.json"))
    block = neox.layers[1]
    assert not block.mlp.gated and block.mlp.ffn_hidden == 24576 and not neox.tied_embeddings
    assert block.tp_replicated_params == 4 * 6144 + 6144 + 6144


def test_text_config_is_imported(tmp_path):
    path = tmp_path / "llava-like.json"
    path.write_text(json.dumps({"model_type": "llava", "vision_config": {"model_type": "clip"},
                                "text_config": _config("Llama-3.1-8B-Instruct.json")}))
    graph = load_model(str(path))
    assert graph.params == EXPECTED["Llama-3.1-8B-Instruct.json"]["total"]
    assert graph.family == "llama" and graph.name == "llava-like"


def test_model_type_inferred_from_architectures(tmp_path):
    cfg = {k: v for k, v in _config("Mixtral-8x7B-v0.1.json").items() if k != "model_type"}
    path = tmp_path / "mixtral.json"
    path.write_text(json.dumps(cfg))
    graph = load_model(str(path))
    assert graph.family == "mixtral" and graph.params == EXPECTED["Mixtral-8x7B-v0.1.json"]["total"]


def test_v5_schema_spellings_are_accepted():
    old = load_model(str(EXTRA / "Qwen3-30B-A3B.json"))
    new = load_model(str(EXTRA / "Qwen3-30B-A3B-v5-schema.json"))
    assert new.params == old.params and new.active_params == old.active_params
    assert dict(new.metadata)["dtype"] == "bfloat16"


def test_explicit_head_dim_need_not_divide_hidden():
    cfg = dict(_config("Llama-3.1-8B-Instruct.json"), hidden_size=5000, head_dim=128)
    graph = import_hf_config(cfg, name="odd")
    assert graph.layers[1].attention.head_dim == 128


def test_supported_families_listed():
    assert set(SUPPORTED) == {"gpt2", "gpt_neox", "llama", "mistral", "mixtral", "qwen2",
                              "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2", "phi3",
                              "falcon", "deepseek_v3", "bert", "t5", "vit", "gpt_oss",
                              "llama4", "llama4_text", "kimi_k2"}
