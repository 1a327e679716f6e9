"""Invariants every imported ModelGraph must satisfy (what the cost model relies on)."""
from __future__ import annotations

from pathlib import Path

import pytest

from models import list_presets, load_model
from planner.ir import LayerKind

ROOT = Path(__file__).resolve().parents[1]
SPECS = ([str(p) for p in sorted((ROOT / "models" / "hf_configs").glob("*.json"))]
         + [str(p) for p in sorted((ROOT / "tests" / "fixtures" / "hf_extra").glob("*.json"))
            if p.name != "expected_params.json"]
         + [p.name for p in list_presets()])


@pytest.mark.parametrize("spec", SPECS, ids=[Path(s).stem for s in SPECS])
def test_graph_invariants(spec):
    graph = load_model(spec)
    layers = graph.layers
    kinds = [layer.kind for layer in layers]
    assert kinds[0] is LayerKind.EMBEDDING and kinds[-1] is LayerKind.HEAD
    assert all(kind is LayerKind.BLOCK for kind in kinds[1:-1]) and graph.num_blocks >= 1
    assert layers[0].name == "embedding" and layers[-1].name == "head"
    assert len({layer.name for layer in layers}) == len(layers)

    assert graph.params == sum(layer.params for layer in layers)
    assert graph.active_params <= graph.params
    for layer in layers:
        assert layer.params > 0 and 0 < layer.active_params <= layer.params
        assert 0 <= layer.tp_replicated_params <= layer.params
        assert 0 <= layer.expert_params <= layer.params
        assert layer.hidden == graph.hidden
        if layer.kind is LayerKind.BLOCK:
            assert layer.attention is not None and layer.mlp is not None
            assert layer.attention.num_heads % layer.attention.num_kv_heads == 0
            assert layer.num_norms >= 1
            if layer.mlp.is_moe:
                assert layer.expert_params > 0 and layer.active_params < layer.params
                assert 1 <= layer.mlp.top_k <= layer.mlp.num_experts
                per_expert, rem = divmod(layer.expert_params, layer.mlp.num_experts)
                assert rem == 0
                assert layer.params - layer.active_params == \
                    per_expert * (layer.mlp.num_experts - layer.mlp.top_k)
            else:
                assert layer.expert_params == 0 and layer.active_params == layer.params
                assert layer.mlp.num_experts == 1
        else:
            assert layer.expert_params == 0 and layer.vocab == graph.vocab

    head, emb = layers[-1], layers[0]
    if graph.tied_embeddings:
        assert head.tied_params == graph.vocab * graph.hidden
        assert emb.params >= head.tied_params
    else:
        assert head.tied_params == 0
    assert all(layer.tied_params == 0 for layer in layers[:-1])
    assert graph.default_seq_len >= 1
    assert not graph.is_moe or graph.active_params < graph.params


def test_dense_models_have_no_expert_params():
    for name in ("llama-3.1-8b", "gpt3-175b", "qwen2.5-72b", "tiny"):
        graph = load_model(name)
        assert not graph.is_moe and sum(layer.expert_params for layer in graph.layers) == 0
        assert graph.active_params == graph.params
