"""Every way a model spec can be wrong raises PlannerError with the right kind and a message
that says what is wrong (never a raw parser or OS exception)."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from models import load_model
from models.reading import MAX_FILE_BYTES
from planner.errors import ErrorKind, PlannerError

ROOT = Path(__file__).resolve().parents[1]
LLAMA = json.loads((ROOT / "models" / "hf_configs" / "Llama-3.1-8B-Instruct.json").read_text())
NATIVE_YAML = """\
shardplan_model: 1
num_layers: 2
hidden_size: 64
num_heads: 4
ffn_hidden_size: 128
vocab_size: 100
"""


def _fails(spec, kind=ErrorKind.INVALID_INPUT, *needles, **kwargs) -> PlannerError:
    with pytest.raises(PlannerError) as info:
        load_model(spec, **kwargs)
    err = info.value
    assert err.kind is kind, err.message
    for needle in needles:
        assert needle.lower() in err.message.lower(), err.message
    return err


def _file(tmp_path: Path, name: str, content: str | bytes) -> str:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return str(path)


def _config(tmp_path: Path, **changes) -> str:
    cfg = dict(LLAMA)
    for key, value in changes.items():
        if value is _DROP:
            cfg.pop(key)
        else:
            cfg[key] = value
    return _file(tmp_path, "config.json", json.dumps(cfg))


_DROP = object()


# -- files -----------------------------------------------------------------------------------

def test_missing_file(tmp_path):
    _fails(str(tmp_path / "nope.json"), ErrorKind.INVALID_INPUT, "not found")


def test_directory_points_at_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    err = _fails(str(tmp_path) + "/", ErrorKind.INVALID_INPUT, "directory")
    assert any("config.json" in hint for hint in err.hints)


def test_empty_file(tmp_path):
    _fails(_file(tmp_path, "empty.json", ""), ErrorKind.INVALID_INPUT, "empty")
    _fails(_file(tmp_path, "blank.yaml", "  \n\n"), ErrorKind.INVALID_INPUT, "empty")


def test_binary_garbage(tmp_path):
    _fails(_file(tmp_path, "model.json", bytes(range(256)) * 4), ErrorKind.INVALID_INPUT, "UTF-8")
    _fails(_file(tmp_path, "w.yaml", b"\x00\x01\x02garbage\xff"), ErrorKind.INVALID_INPUT)
    _fails(_file(tmp_path, "w.bin", b"\x00\x01\x02garbage"), ErrorKind.INVALID_INPUT)


def test_truncated_json(tmp_path):
    text = json.dumps(LLAMA)[:-20]
    _fails(_file(tmp_path, "config.json", text), ErrorKind.INVALID_INPUT, "malformed JSON", "line")


def test_deeply_nested_json(tmp_path):
    _fails(_file(tmp_path, "deep.json", "[" * 100_000 + "]" * 100_000), ErrorKind.INVALID_INPUT)


def test_non_mapping_top_level(tmp_path):
    _fails(_file(tmp_path, "list.json", "[1, 2]"), ErrorKind.INVALID_INPUT, "mapping", "list")
    _fails(_file(tmp_path, "scalar.yaml", "42\n"), ErrorKind.INVALID_INPUT, "mapping")
    _fails(_file(tmp_path, "null.yaml", "~\n"), ErrorKind.INVALID_INPUT, "mapping")


def test_file_too_large(tmp_path):
    path = tmp_path / "huge.json"
    with path.open("wb") as handle:  # sparse: no real disk use
        handle.truncate(MAX_FILE_BYTES + 1)
    _fails(str(path), ErrorKind.INVALID_INPUT, "16 MiB")


def test_unrecognised_content(tmp_path):
    _fails(_file(tmp_path, "other.json", '{"foo": 1}'), ErrorKind.INVALID_INPUT,
           "shardplan_model", "model_type")


def test_content_detection_for_other_suffixes(tmp_path):
    graph = load_model(_file(tmp_path, "model.cfg", json.dumps(LLAMA)))
    assert graph.family == "llama"
    assert load_model(_file(tmp_path, "model.txt", NATIVE_YAML)).family == "native"


# -- JSON / YAML syntax ----------------------------------------------------------------------

def test_yaml_with_tabs(tmp_path):
    text = "shardplan_model: 1\nmoe:\n\tnum_experts: 2\n"
    err = _fails(_file(tmp_path, "tabs.yaml", text), ErrorKind.INVALID_INPUT, "YAML", "line")
    assert any("tab" in hint.lower() for hint in err.hints)


def test_yaml_duplicate_keys(tmp_path):
    _fails(_file(tmp_path, "dup.yaml", NATIVE_YAML + "hidden_size: 128\n"),
           ErrorKind.INVALID_INPUT, "duplicate", "hidden_size")


def test_json_duplicate_keys(tmp_path):
    text = json.dumps(LLAMA)[:-1] + ', "hidden_size": 1}'
    _fails(_file(tmp_path, "dup.json", text), ErrorKind.INVALID_INPUT, "duplicate", "hidden_size")


def test_yaml_anchors_are_allowed(tmp_path):
    text = NATIVE_YAML.replace("hidden_size: 64", "hidden_size: &h 64").replace(
        "ffn_hidden_size: 128", "ffn_hidden_size: *h")
    graph = load_model(_file(tmp_path, "anchors.yaml", text))
    assert graph.layers[1].mlp.ffn_hidden == 64


def test_yaml_merge_keys_may_override(tmp_path):
    text = ("base: &base {num_layers: 2, hidden_size: 64}\n" "x:\n  <<: *base\n  num_layers: 3\n")
    # merge + override is valid YAML; the document is then rejected for its unknown keys only
    _fails(_file(tmp_path, "merge.yaml", "shardplan_model: 1\n" + text), ErrorKind.INVALID_INPUT,
           "unknown key")


def test_yaml_billion_laughs_is_rejected_quickly(tmp_path):
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i, name in enumerate("bcdefghi"):
        prev = "abcdefghi"[i]
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    start = time.monotonic()
    _fails(_file(tmp_path, "bomb.yaml", "\n".join(lines) + "\n"), ErrorKind.INVALID_INPUT,
           "alias")
    assert time.monotonic() - start < 2.0


def test_yaml_recursive_alias_is_rejected(tmp_path):
    _fails(_file(tmp_path, "loop.yaml", "a: &a [*a]\n"), ErrorKind.INVALID_INPUT)


def test_yaml_python_tags_are_not_executed(tmp_path):
    text = "!!python/object/apply:os.system ['echo pwned']\n"
    _fails(_file(tmp_path, "evil.yaml", text), ErrorKind.INVALID_INPUT, "YAML")


# -- specs and presets -----------------------------------------------------------------------

def test_unknown_preset_lists_names_and_close_match():
    err = _fails("llama-3.1-8", ErrorKind.UNKNOWN_PRESET, "llama-3.1-8b", "tiny")
    assert err.details["did_you_mean"] == "llama-3.1-8b"
    assert "gpt3-175b" in err.details["presets"]


@pytest.mark.parametrize("spec", ["", "   ", "a\x00b", "x" * 5000, 42, None])
def test_bad_specs(spec):
    with pytest.raises(PlannerError) as info:
        load_model(spec)
    assert info.value.kind in (ErrorKind.INVALID_INPUT, ErrorKind.UNKNOWN_PRESET)


# -- HF config values ------------------------------------------------------------------------

def test_unknown_model_type_names_supported(tmp_path):
    err = _fails(_config(tmp_path, model_type="mamba"), ErrorKind.UNSUPPORTED, "mamba", "llama",
                 "deepseek_v3")
    assert "llama" in err.details["supported"]


def test_missing_model_type_without_architectures(tmp_path):
    _fails(_config(tmp_path, model_type=_DROP, architectures=_DROP), ErrorKind.INVALID_INPUT,
           "model_type")


def test_missing_required_key(tmp_path):
    _fails(_config(tmp_path, hidden_size=_DROP), ErrorKind.INVALID_INPUT, "missing", "hidden_size")


@pytest.mark.parametrize("value,needle", [
    (-4096, "positive"), (0, "positive"), (4096.0, "integer"), (1e30, "integer"),
    ("4096", "integer"), (True, "integer"), ([4096], "integer"), (10**30, "implausibly large"),
])
def test_bad_sizes(tmp_path, value, needle):
    _fails(_config(tmp_path, hidden_size=value), ErrorKind.INVALID_INPUT, "hidden_size", needle)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinite_sizes(tmp_path, literal):
    text = json.dumps(dict(LLAMA, num_hidden_layers=0)).replace(
        '"num_hidden_layers": 0', f'"num_hidden_layers": {literal}')
    _fails(_file(tmp_path, "c.json", text), ErrorKind.INVALID_INPUT, "num_hidden_layers")


def test_nan_in_yaml_native(tmp_path):
    _fails(_file(tmp_path, "n.yaml", NATIVE_YAML.replace("hidden_size: 64", "hidden_size: .nan")),
           ErrorKind.INVALID_INPUT, "hidden_size")
    _fails(_file(tmp_path, "i.yaml", NATIVE_YAML.replace("num_layers: 2", "num_layers: 1e30")),
           ErrorKind.INVALID_INPUT, "num_layers")


def test_heads_not_dividing_hidden(tmp_path):
    _fails(_config(tmp_path, hidden_size=4000, num_attention_heads=48, num_key_value_heads=8),
           ErrorKind.INVALID_INPUT, "divisible", "head_dim")


def test_kv_heads_not_dividing_heads(tmp_path):
    _fails(_config(tmp_path, num_key_value_heads=7), ErrorKind.INVALID_INPUT, "key/value heads")
    _fails(_config(tmp_path, num_key_value_heads=64), ErrorKind.INVALID_INPUT, "key/value heads")


def test_wrong_typed_flag(tmp_path):
    _fails(_config(tmp_path, tie_word_embeddings="no"), ErrorKind.INVALID_INPUT,
           "tie_word_embeddings", "true or false")


def test_top_k_above_experts(tmp_path):
    mixtral = json.loads((ROOT / "models" / "hf_configs" / "Mixtral-8x7B-v0.1.json").read_text())
    _fails(_file(tmp_path, "m.json", json.dumps(dict(mixtral, num_experts_per_tok=9))),
           ErrorKind.INVALID_INPUT, "num_experts_per_tok")


def test_text_config_must_be_mapping(tmp_path):
    _fails(_file(tmp_path, "mm.json", json.dumps({"model_type": "llava", "text_config": [1]})),
           ErrorKind.INVALID_INPUT, "text_config")


def test_bad_layer_types(tmp_path):
    mistral = {"model_type": "mistral", "sliding_window": 4096}
    _fails(_config(tmp_path, layer_types=["full_attention"], **mistral), ErrorKind.INVALID_INPUT,
           "layer_types")
    _fails(_config(tmp_path, layer_types=["linear_attention"] * 32, **mistral),
           ErrorKind.UNSUPPORTED, "linear_attention")
    _fails(_config(tmp_path, layer_types=["sliding_attention"] * 32, model_type="mistral",
                   sliding_window=None), ErrorKind.INVALID_INPUT, "sliding_window")


def test_bert_relative_positions_unsupported(tmp_path):
    bert = json.loads((ROOT / "models" / "hf_configs" / "bert-base-uncased.json").read_text())
    bad = dict(bert, position_embedding_type="relative_key")
    _fails(_file(tmp_path, "b.json", json.dumps(bad)), ErrorKind.UNSUPPORTED, "relative_key")


# -- native values ---------------------------------------------------------------------------

def test_unknown_native_key(tmp_path):
    err = _fails(_file(tmp_path, "m.yaml", NATIVE_YAML + "hiden_size: 3\n"),
                 ErrorKind.INVALID_INPUT, "hiden_size", "valid keys", "hidden_size")
    assert err.details["key"] == "hiden_size"


@pytest.mark.parametrize("line", ["num_layers: -2", "num_layers: 0", "num_layers: 2.0",
                                  "num_layers: .inf", "num_layers: '2'", "num_layers: null"])
def test_bad_native_sizes(tmp_path, line):
    text = NATIVE_YAML.replace("num_layers: 2", line)
    _fails(_file(tmp_path, "m.yaml", text), ErrorKind.INVALID_INPUT, "num_layers")


def test_native_heads_not_dividing_hidden(tmp_path):
    _fails(_file(tmp_path, "m.yaml", NATIVE_YAML.replace("num_heads: 4", "num_heads: 5")),
           ErrorKind.INVALID_INPUT, "divisible")
