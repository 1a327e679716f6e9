"""Native model file format (``shardplan_model: 1``)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from models import load_model
from models.native import build_native
from planner.errors import ErrorKind, PlannerError

ROOT = Path(__file__).resolve().parents[1]

LLAMA2_7B = {
    "shardplan_model": 1, "name": "llama2-7b-native", "num_layers": 32, "hidden_size": 4096,
    "num_heads": 32, "ffn_hidden_size": 11008, "vocab_size": 32000, "seq_len": 4096,
    "max_seq_len": 4096,
}


def _write(tmp_path: Path, name: str, data: dict) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data) if name.endswith((".yaml", ".yml")) else json.dumps(data))
    return path


def test_defaults_describe_a_llama_decoder_and_match_the_hf_count():
    graph = build_native(LLAMA2_7B)
    hf = load_model(str(ROOT / "models" / "hf_configs" / "Llama-2-7b-hf.json"))
    assert graph.params == hf.params == 6_738_415_616
    assert [layer.signature for layer in graph.layers] == [layer.signature for layer in hf.layers]
    assert graph.family == "native" and graph.name == "llama2-7b-native"
    assert graph.default_seq_len == 4096 and graph.max_seq_len == 4096


def test_tiny_counts_by_hand():
    graph = load_model("tiny")
    h, v, ffn, kv_width = 256, 1024, 512, 4 * 32
    block = 2 * h * h + 2 * h * kv_width + 3 * h * ffn + 2 * h
    assert graph.layers[1].params == block
    assert graph.params == 4 * block + 2 * v * h + h == 2_885_888
    assert graph.layers[1].attention.num_kv_heads == 4 and graph.default_seq_len == 128


@pytest.mark.parametrize("layers,hidden,heads", [(24, 2048, 16), (96, 12288, 96)])
def test_gpt3_style_closed_form(layers, hidden, heads):
    """Megatron GPT: 12Lh^2 + 13Lh + (V + P)h + 2h (Narayanan et al. 2021 Eq. 2)."""
    data = {"shardplan_model": 1, "num_layers": layers, "hidden_size": hidden, "num_heads": heads,
            "ffn_hidden_size": 4 * hidden, "gated_mlp": False, "vocab_size": 51200,
            "seq_len": 2048, "position_embedding": "learned", "norm": "layernorm", "bias": True,
            "tied_embeddings": True}
    graph = build_native(data)
    h, n_layers = hidden, layers
    assert graph.params == 12 * n_layers * h * h + 13 * n_layers * h + (51200 + 2048) * h + 2 * h
    assert graph.max_seq_len == 2048  # learned positions default to seq_len rows
    assert graph.layers[0].tp_replicated_params == 2048 * h
    assert graph.layers[-1].tied_params == 51200 * h
    block = graph.layers[1]
    assert block.tp_replicated_params == 4 * h + 2 * h  # LayerNorms + two row-parallel biases


def test_moe_section():
    data = dict(LLAMA2_7B, moe={"num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 1024,
                                "shared_ffn_hidden_size": 2048, "first_dense_layers": 2})
    graph = build_native(data)
    blocks = list(graph.blocks())
    assert [b.mlp.is_moe for b in blocks[:3]] == [False, False, True]
    moe = blocks[2]
    per_expert = 3 * 4096 * 1024
    assert moe.expert_params == 8 * per_expert
    assert moe.params - moe.active_params == 6 * per_expert
    assert moe.mlp.shared_ffn_hidden == 2048
    assert [c.count for c in graph.layer_classes()] == [1, 2, 30, 1]


def test_moe_without_dense_layers_needs_no_ffn_size():
    data = {k: v for k, v in LLAMA2_7B.items() if k != "ffn_hidden_size"}
    data["moe"] = {"num_experts": 4, "top_k": 1, "expert_ffn_hidden_size": 512}
    graph = build_native(data)
    assert all(b.mlp.is_moe for b in graph.blocks())


def test_yaml_and_json_agree(tmp_path):
    a = load_model(str(_write(tmp_path, "m.yaml", LLAMA2_7B)))
    b = load_model(str(_write(tmp_path, "m.json", LLAMA2_7B)))
    assert a.params == b.params and a.layers == b.layers
    assert a.source.endswith("m.yaml")


def test_detected_by_content_without_version_key(tmp_path):
    data = {k: v for k, v in LLAMA2_7B.items() if k != "shardplan_model"}
    graph = load_model(str(_write(tmp_path, "model.yml", data)))
    assert graph.family == "native"


def test_name_defaults_to_file_stem(tmp_path):
    data = {k: v for k, v in LLAMA2_7B.items() if k != "name"}
    assert load_model(str(_write(tmp_path, "my-model.yaml", data))).name == "my-model"


def test_explicit_head_dim_and_gqa():
    graph = build_native(dict(LLAMA2_7B, hidden_size=5000, head_dim=128, num_kv_heads=8))
    attn = graph.layers[1].attention
    assert attn.head_dim == 128 and attn.num_kv_heads == 8


def test_non_causal_encoder_and_sliding_window():
    graph = build_native(dict(LLAMA2_7B, causal=False, sliding_window=1024))
    assert not graph.layers[1].attention.causal
    assert graph.layers[1].attention.sliding_window == 1024


def test_position_embedding_none_and_rmsnorm_vs_layernorm():
    rms = build_native(dict(LLAMA2_7B, position_embedding="none"))
    ln = build_native(dict(LLAMA2_7B, norm="layernorm"))
    assert ln.params - rms.params == 32 * 2 * 4096 + 4096  # a bias per norm, plus the final one


@pytest.mark.parametrize("change,needle", [
    ({"num_layerz": 3}, "num_layerz"),
    ({"moe": {"num_experts": 8, "top_k": 2, "expert_ffn": 1}}, "expert_ffn"),
])
def test_unknown_keys_are_named_with_valid_list(change, needle):
    with pytest.raises(PlannerError) as info:
        build_native(dict(LLAMA2_7B, **change))
    err = info.value
    assert err.kind is ErrorKind.INVALID_INPUT
    assert needle in err.message and "valid keys" in err.message


def test_unknown_key_suggests_close_match():
    with pytest.raises(PlannerError) as info:
        build_native(dict(LLAMA2_7B, hidden_sise=1))
    assert any("hidden_size" in hint for hint in info.value.hints)


@pytest.mark.parametrize("change,needle", [
    ({"shardplan_model": 2}, "version"),
    ({"norm": "batchnorm"}, "norm"),
    ({"position_embedding": "alibi"}, "position_embedding"),
    ({"seq_len": 8192, "max_seq_len": 4096}, "max_seq_len"),
    ({"moe": {"num_experts": 4, "top_k": 8, "expert_ffn_hidden_size": 8}}, "top_k"),
    ({"moe": {"num_experts": 1, "top_k": 1, "expert_ffn_hidden_size": 8}}, "num_experts"),
    ({"moe": {"num_experts": 4, "top_k": 1, "expert_ffn_hidden_size": 8,
              "first_dense_layers": 99}}, "first_dense_layers"),
    ({"moe": [1, 2]}, "moe"),
    ({"gated_mlp": "yes"}, "gated_mlp"),
    ({"name": 5}, "name"),
])
def test_invalid_native_values(change, needle):
    with pytest.raises(PlannerError) as info:
        build_native(dict(LLAMA2_7B, **change))
    assert needle in info.value.message
    expected = ErrorKind.UNSUPPORTED if needle == "version" else ErrorKind.INVALID_INPUT
    assert info.value.kind is expected


def test_docs_examples_load():
    """The YAML examples in docs/models.md are valid native files."""
    text = (ROOT / "docs" / "models.md").read_text()
    blocks = [part.split("```", 1)[0] for part in text.split("```yaml\n")[1:]]
    assert len(blocks) >= 2
    for block in blocks:
        graph = build_native(yaml.safe_load(block))
        assert graph.params > 0 and graph.family == "native"


def test_native_moe_takes_group_limited_routing():
    """``moe.expert_groups`` / ``groups_per_token`` (planner.ir.Mlp; DeepSeek-V3's node-limited
    routing): read, defaulting to unlimited, and checked as the HF reader checks them."""
    from planner.errors import PlannerError
    base = {"name": "g", "num_layers": 2, "hidden_size": 256, "num_heads": 4, "vocab_size": 512,
            "seq_len": 128, "moe": {"num_experts": 16, "top_k": 4, "expert_ffn_hidden_size": 128}}
    mlp = build_native(base).layers[1].mlp
    assert (mlp.expert_groups, mlp.groups_per_token, mlp.group_limited) == (1, 1, False)
    grouped = dict(base, moe=dict(base["moe"], expert_groups=4, groups_per_token=2))
    mlp = build_native(grouped).layers[1].mlp
    assert (mlp.expert_groups, mlp.groups_per_token, mlp.group_limited) == (4, 2, True)
    bad = dict(base, moe=dict(base["moe"], expert_groups=3))
    with pytest.raises(PlannerError, match="expert_groups \\(3\\) must divide"):
        build_native(bad)
