"""Fuzz: whatever a model file or spec holds, load_model returns a ModelGraph or raises
PlannerError, never anything else."""
from __future__ import annotations

import json
import math

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from models import load_model
from models.hf_config import SUPPORTED
from models.native import KEYS as NATIVE_KEYS
from models.native import MOE_KEYS
from planner.errors import PlannerError
from planner.ir import ModelGraph

FUZZ = settings(max_examples=100, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

HF_KEYS = [
    "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
    "intermediate_size", "vocab_size", "head_dim", "max_position_embeddings",
    "tie_word_embeddings", "attention_bias", "mlp_bias", "sliding_window", "use_sliding_window",
    "max_window_layers", "layer_types", "num_local_experts", "num_experts", "num_experts_per_tok",
    "moe_intermediate_size", "shared_expert_intermediate_size", "decoder_sparse_step",
    "mlp_only_layers", "n_routed_experts", "n_shared_experts", "first_k_dense_replace",
    "moe_layer_freq", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
    "v_head_dim", "n_layer", "n_embd", "n_head", "n_positions", "n_inner", "multi_query",
    "new_decoder_architecture", "num_kv_heads", "parallel_attn", "bias", "ffn_hidden_size",
    "num_ln_in_parallel_attn", "type_vocab_size", "position_embedding_type", "num_layers",
    "num_decoder_layers", "d_model", "d_kv", "d_ff", "num_heads", "feed_forward_proj",
    "relative_attention_num_buckets", "image_size", "patch_size", "num_channels", "qkv_bias",
    "pooler_output_size", "architectures", "text_config",
]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-3, max_value=300),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(["full_attention", "sliding_attention", "gated-gelu", "absolute", "relu"]),
)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=8)
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20)),
    lambda inner: st.one_of(st.lists(inner, max_size=5),
                            st.dictionaries(st.text(max_size=10), inner, max_size=5)),
    max_leaves=20)

# Sizes that mostly pass validation, so the importers' arithmetic paths run too.
plausible = st.one_of(st.sampled_from([1, 2, 4, 8, 16, 32, 64, 96, 128]), values)


@pytest.fixture
def target(tmp_path):
    return tmp_path


def _check(spec: str) -> None:
    try:
        graph = load_model(spec)
    except PlannerError as err:
        assert err.message and isinstance(err.to_json(), dict)
        return
    assert isinstance(graph, ModelGraph)
    assert graph.params == sum(layer.params for layer in graph.layers)
    assert graph.active_params <= graph.params


@FUZZ
@given(data=st.binary(max_size=512), suffix=st.sampled_from([".json", ".yaml", ".yml", ".txt"]))
def test_random_bytes(target, data, suffix):
    path = target / f"model{suffix}"
    path.write_bytes(data)
    _check(str(path))


@FUZZ
@given(doc=json_values)
def test_random_json_documents(target, doc):
    path = target / "config.json"
    path.write_text(json.dumps(doc))
    _check(str(path))


@FUZZ
@given(model_type=st.sampled_from(SUPPORTED + ("nope",)),
       fields=st.dictionaries(st.sampled_from(HF_KEYS), plausible, max_size=14))
def test_hf_like_configs(target, model_type, fields):
    doc = dict(fields, model_type=model_type)
    path = target / "config.json"
    path.write_text(json.dumps(doc, allow_nan=True))
    _check(str(path))


@FUZZ
@given(fields=st.dictionaries(st.sampled_from(NATIVE_KEYS + ("extra",)), plausible, max_size=12),
       moe=st.one_of(st.none(), st.dictionaries(st.sampled_from(MOE_KEYS), plausible,
                                                max_size=5)))
def test_native_like_files(target, fields, moe):
    doc = dict(fields, shardplan_model=1)
    if moe is not None:
        doc["moe"] = moe
    path = target / "model.yaml"
    path.write_text(yaml.safe_dump(doc))
    _check(str(path))


@FUZZ
@given(spec=st.text(max_size=40))
def test_random_specs(spec):
    try:
        graph = load_model(spec)
    except PlannerError:
        return
    assert isinstance(graph, ModelGraph)


def test_fuzz_sanity_floats_are_never_sizes(target):
    path = target / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": math.inf}))
    with pytest.raises(PlannerError):
        load_model(str(path))
