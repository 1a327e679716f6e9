"""Graph path vs config path on every HF fixture config (torch.export on the meta device).

The config path is pure arithmetic (models/hf_config.py); the graph path builds the model with
transformers on the meta device, exports it and groups its operators (models/graph). They must
agree exactly on parameters (total and active, each equal to the published count) and within 1 %
on forward FLOPs per token (GEMMs + attention cores, at the traced sequence length).
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from models.graph.group import group_layers  # noqa: E402
from models.graph.torch_import import hf_config_graph  # noqa: E402
from models.hf_config import import_hf_config  # noqa: E402
from planner.cost.compute import Shard, attention_core_flops, layer_gemms  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"
CONFIGS = Path(__file__).parent.parent / "models" / "hf_configs"
EXPECTED = json.loads((FIXTURES / "expected_params.json").read_text())
NAMES = sorted(k for k in EXPECTED if not k.startswith("_"))
# Families whose config importer places every parameter where the graph does: their layers
# (signatures: counts, TP-replicated counts, attention and MLP shapes) must be identical.
SAME_LAYERS = {"gpt2.json", "bert-base-uncased.json", "Llama-3.1-8B-Instruct.json",
               "Llama-3.1-70B-Instruct.json", "Mixtral-8x7B-v0.1.json",
               "Qwen2.5-72B-Instruct.json", "DeepSeek-V3.json"}

# Blocks traced per module list: a kind per distinct block (DeepSeek-V3: dense and MoE; T5: each
# stack's block 0, which owns the relative-position table, and the rest).
TRACED_BLOCKS = {"DeepSeek-V3.json": {"model.layers": 2}, "t5-small.json": {"encoder.block": 2,
                 "decoder.block": 2}, "gpt2.json": {"transformer.h": 1},
                 "bert-base-uncased.json": {"bert.encoder.layer": 1}}
TRACED_BLOCKS.update({n: {"model.layers": 1} for n in NAMES if n not in TRACED_BLOCKS})


@lru_cache(maxsize=None)
def _imported(name: str):
    config = json.loads((CONFIGS / name).read_text())
    ops = hf_config_graph(config, name=name)
    return config, ops, group_layers(ops)


def config_flops(model, seq_len: int) -> float:
    """Forward FLOPs of one sequence by the cost model's GEMM list (eager attention: the full
    score matrix, as the traced SDPA computes it)."""
    shard = Shard(1, seq_len)
    total = 0.0
    for cls in model.layer_classes():
        flops = sum(g.flops for g in layer_gemms(cls.layer, shard))
        if cls.layer.attention is not None:
            flops += attention_core_flops(cls.layer.attention, shard, "eager")
        total += flops * cls.count
    return total


@pytest.mark.parametrize("name", NAMES)
def test_parameter_count_equals_config_path_and_published(name):
    config, ops, graph = _imported(name)
    by_config = import_hf_config(config, name=name)
    expected = EXPECTED[name]
    total = expected.get("total", expected.get("total_with_mlm_head"))
    assert graph.params == by_config.params == total
    assert ops.num_params == total  # every parameter tensor counted once (tied ones too)
    # one block of each kind was traced (models/graph/replicate.py), the rest replicated
    traced = {k: v["traced"] for k, v in ops.metadata.get("replicated_blocks", {}).items()}
    assert traced == TRACED_BLOCKS[name]
    if "active" in expected:
        assert graph.active_params == by_config.active_params == expected["active"]


@pytest.mark.parametrize("name", NAMES)
def test_flops_per_token_within_one_percent(name):
    config, ops, graph = _imported(name)
    by_config = import_hf_config(config, name=name)
    graph_flops = ops.flops_per_token()
    assert graph_flops > 0
    expected = config_flops(by_config, ops.seq_len) / ops.seq_len
    assert graph_flops == pytest.approx(expected, rel=0.01)
    # the layers recognised from the operators give the operators' FLOPs back
    assert config_flops(graph, ops.seq_len) / ops.seq_len == pytest.approx(graph_flops, rel=0.01)


@pytest.mark.parametrize("name", sorted(SAME_LAYERS))
def test_layers_identical_to_config_path(name):
    config, _, graph = _imported(name)
    # the routing's expert groups come from the config, as import_hf_config_graph adds them
    from models.hf_moe import with_expert_groups
    graph = with_expert_groups(graph, config)
    by_config = import_hf_config(config, name=name)
    ours = [(c.layer.signature, c.count) for c in graph.layer_classes()]
    theirs = [(c.layer.signature, c.count) for c in by_config.layer_classes()]
    assert ours == theirs
    assert graph.tied_embeddings == by_config.tied_embeddings


def test_t5_blocks_recognised():
    """T5: encoder blocks non-causal, decoder blocks causal with cross-attention; block 0 of
    each stack owns its relative-position table (the graph says so), so it is its own class."""
    _, _, graph = _imported("t5-small.json")
    blocks = list(graph.blocks())
    assert len(blocks) == 12
    enc, dec = blocks[:6], blocks[6:]
    assert all(not b.attention.causal and not b.attention.cross_attention for b in enc)
    assert all(b.attention.causal and b.attention.cross_attention for b in dec)
    assert enc[0].params - enc[1].params == 32 * 8  # relative_attention_num_buckets x heads
    assert graph.layers[-1].tied_params == 32128 * 512
    assert [c.count for c in graph.layer_classes()] == [1, 1, 4, 1, 1, 5, 1]


def test_deepseek_mla_and_moe_recognised():
    _, _, graph = _imported("DeepSeek-V3.json")
    moe = graph.layers[4]
    assert moe.attention.is_mla and moe.attention.q_lora_rank == 1536
    assert moe.attention.kv_lora_rank == 512 and moe.attention.rope_head_dim == 64
    assert moe.mlp.num_experts == 256 and moe.mlp.top_k == 8
    assert moe.mlp.shared_ffn_hidden == 2048
    assert [c.count for c in graph.layer_classes()] == [1, 3, 58, 1]


def test_graph_path_reads_the_routing_groups():
    """The operator graph shows no routing groups; import_hf_config_graph takes DeepSeek-V3's
    node-limited routing (n_group 8, topk_group 4) from the config, as the config path does."""
    from models.graph.torch_import import import_hf_config_graph
    config = json.loads((CONFIGS / "DeepSeek-V3.json").read_text())
    graph = import_hf_config_graph(config, name="ds")
    mlp = next(b.mlp for b in graph.blocks() if b.mlp.is_moe)
    assert (mlp.expert_groups, mlp.groups_per_token) == (8, 4)


def test_building_a_config_without_a_dtype_reads_no_deprecated_attribute():
    """gpt2's config.json sets no dtype; the importer read ``hf_config.torch_dtype`` after
    ``dtype`` came back None, and transformers >= 4.56 printed '`torch_dtype` is deprecated!
    Use `dtype` instead!' on every ``--importer graph`` run of such a config."""
    import json
    from pathlib import Path

    import transformers

    from models.graph.torch_import import build_hf_model

    config = json.loads((Path(__file__).parent.parent / "models" / "hf_configs" /
                         "gpt2.json").read_text())
    config.pop("torch_dtype", None)
    config.pop("dtype", None)
    cls = transformers.PretrainedConfig
    if not hasattr(cls, "torch_dtype") or not isinstance(cls.__dict__.get("torch_dtype"),
                                                         property):
        pytest.skip("this transformers has no deprecated torch_dtype property")
    original = cls.__dict__["torch_dtype"]
    reads = []

    def counted(self):
        reads.append(1)
        return original.fget(self)

    cls.torch_dtype = property(counted, original.fset)
    try:
        build_hf_model(config)
    finally:
        cls.torch_dtype = original
    assert reads == []
