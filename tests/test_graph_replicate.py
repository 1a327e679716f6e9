"""Tracing one block per kind and replicating it gives the full trace's operator graph.

``hf_config_graph`` traces only the first block of each kind (models/graph/replicate.py) and
copies it to the full depth. On small configs of the block patterns the fixtures have (uniform
decoder stacks, dense-first MoE with per-layer router buffers, alternating sliding / full
attention, T5's two stacks whose block 0 owns the relative-position table) the replicated graph
must equal a full trace op by op (inputs by position, scopes, parameters, FLOPs, bytes, shapes,
attributes, sharding) and group into the same layers.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from models.graph.group import group_layers  # noqa: E402
from models.graph.replicate import reduce_blocks, restore  # noqa: E402
from models.graph.torch_import import build_hf_model, hf_config_graph  # noqa: E402

CONFIGS = Path(__file__).parent.parent / "models" / "hf_configs"
SMALL = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=1024)
CASES = {  # name, config overrides, blocks traced per reduced list
    "deepseek": ("DeepSeek-V3.json", dict(SMALL, num_hidden_layers=3, first_k_dense_replace=1,
                                          n_routed_experts=4, num_experts_per_tok=2,
                                          moe_intermediate_size=128, q_lora_rank=64,
                                          kv_lora_rank=32, num_key_value_heads=4, n_group=2,
                                          topk_group=1), [2]),
    "t5": ("t5-small.json", dict(num_layers=3, num_decoder_layers=2, d_model=128, d_ff=256,
                                 num_heads=4, d_kv=32, vocab_size=1024), [2]),
}


def _config(name: str, **overrides) -> dict:
    return dict(json.loads((CONFIGS / name).read_text()), **overrides)


def _canonical(graph):
    pos = {name: i for i, name in enumerate(graph.order())}
    return [(tuple(pos[p] for p in op.input_ops), op.kind, op.target, op.scope,
             op.scope_types, op.params, op.flops, op.bytes_read, op.bytes_written, op.inputs,
             op.outputs, {k: pos.get(v, v) if isinstance(v, str) else v
                          for k, v in op.attrs.items()}, op.shardable)
            for op in graph.ops()]


@pytest.mark.parametrize("case", sorted(CASES))
def test_replicated_graph_equals_full_trace(case):
    name, overrides, traced = CASES[case]
    config = _config(name, **overrides)
    replicated = hf_config_graph(config, name=case)
    full = hf_config_graph(config, name=case, replicate_blocks=False)
    # only the first block of each kind was traced
    assert [v["traced"] for v in replicated.metadata["replicated_blocks"].values()] == traced
    assert "replicated_blocks" not in full.metadata
    assert list(replicated.params.items()) == list(full.params.items())
    assert _canonical(replicated) == _canonical(full)
    assert sorted(replicated.g.edges(data="tensor"), key=str) != [] and \
        len(replicated.g.edges) == len(full.g.edges)
    ours, theirs = group_layers(replicated, name=case), group_layers(full, name=case)
    assert [layer.signature for layer in ours.layers] == \
        [layer.signature for layer in theirs.layers]
    assert ours.params == theirs.params


def test_block_kinds_from_modules_and_per_layer_lists():
    """Kinds without tracing: gpt-oss alternates sliding / full attention (the config's
    ``layer_types``, nothing in the parameters); Llama's three ``eos_token_id`` values are no
    per-layer list of a 3-layer model; the lists are put back whole."""
    oss = build_hf_model(_config("gpt-oss-20b.json", **dict(
        SMALL, num_hidden_layers=4, vocab_size=202000, num_local_experts=4, head_dim=64,
        layer_types=["sliding_attention", "full_attention"] * 2)))
    (lst,) = reduce_blocks(oss)
    assert (lst.path, lst.kinds, lst.reps) == ("model.layers", [0, 1, 0, 1], [0, 1])
    assert len(oss.model.layers) == 2
    restore(oss, [lst])
    assert len(oss.model.layers) == 4
    llama = build_hf_model(_config("Llama-3.1-8B-Instruct.json", **dict(
        SMALL, num_hidden_layers=3)))
    assert len(llama.config.eos_token_id) == 3
    (lst,) = reduce_blocks(llama)
    assert lst.kinds == [0, 0, 0] and lst.reps == [0]
