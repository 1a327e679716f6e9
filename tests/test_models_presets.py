"""Built-in model presets: every one loads, with the published size and the right layout."""
from __future__ import annotations

import fnmatch
import sys
from pathlib import Path

import pytest

from models import PresetInfo, list_presets, load_model
from models.catalog import PACKAGE_DIR, _index
from planner.errors import ErrorKind, PlannerError
from planner.ir import LayerKind

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = None

ROOT = Path(__file__).resolve().parents[1]

# name -> (published size, relative tolerance, default seq_len, blocks)
PUBLISHED = {
    # GPT-3 sizes are the rounded labels of Brown et al. 2020 Table 2.1; with Megatron's padded
    # 51200 vocabulary the exact counts are 1.318B, 2.654B, 6.662B, 12.858B and 174.616B, so
    # the small ones sit 1-2 % off their label.
    "gpt3-1.3b": (1.3e9, 0.02, 2048, 24),
    "gpt3-2.7b": (2.7e9, 0.02, 2048, 32),
    "gpt3-6.7b": (6.7e9, 0.01, 2048, 32),
    "gpt3-13b": (13.0e9, 0.02, 2048, 40),
    "gpt3-175b": (175.0e9, 0.01, 2048, 96),
    "llama-2-7b": (6_738_415_616, 0, 4096, 32),
    "llama-2-70b": (68_976_648_192, 0, 4096, 80),
    "llama-3.1-8b": (8_030_261_248, 0, 8192, 32),
    "llama-3.1-70b": (70_553_706_496, 0, 8192, 80),
    "llama-3.1-405b": (405_853_388_800, 0, 8192, 126),
    "mixtral-8x7b": (46_702_792_704, 0, 4096, 32),
    "deepseek-v3": (671_026_404_352, 0, 4096, 61),
    "qwen2.5-72b": (72_706_203_648, 0, 4096, 80),
    # MoE presets: exact counts of the models transformers 5.23 builds from the same configs on
    # the meta device; tests/test_moe_models.py checks them against the published figures.
    "qwen3-30b-a3b": (30_532_122_624, 0, 4096, 48),
    "qwen3-235b-a22b": (235_093_634_560, 0, 4096, 94),
    "gpt-oss-120b": (116_829_156_672, 0, 4096, 36),
    "gpt-oss-20b": (20_914_757_184, 0, 4096, 24),
    "llama-4-scout": (107_769_861_120, 0, 8192, 48),
    "llama-4-maverick": (400_711_848_960, 0, 8192, 48),
    "kimi-k2": (1_026_408_209_408, 0, 4096, 61),
    "mixtral-8x22b": (140_630_071_296, 0, 4096, 56),
    "tiny": (2_885_888, 0, 128, 4),
    "tiny-moe": (7_020_800, 0, 128, 4),
}


def _gpt3_exact(layers: int, h: int) -> int:
    return 12 * layers * h * h + 13 * layers * h + (51200 + 2048) * h + 2 * h


def test_preset_set_is_complete():
    assert sorted(PUBLISHED) == [p.name for p in list_presets()]


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_loads_with_published_size(name):
    size, rel, seq, blocks = PUBLISHED[name]
    graph = load_model(name)
    if rel:
        assert graph.params == pytest.approx(size, rel=rel)
    else:
        assert graph.params == size
    assert graph.name == name and graph.source == f"preset:{name}"
    assert graph.default_seq_len == seq and graph.num_blocks == blocks
    assert graph.max_seq_len is None or graph.default_seq_len <= graph.max_seq_len


def test_gpt3_exact_counts_and_175b_range():
    shapes = {"gpt3-1.3b": (24, 2048), "gpt3-2.7b": (32, 2560), "gpt3-6.7b": (32, 4096),
              "gpt3-13b": (40, 5120), "gpt3-175b": (96, 12288)}
    for name, (layers, h) in shapes.items():
        assert load_model(name).params == _gpt3_exact(layers, h)
    assert 174.6e9 <= load_model("gpt3-175b").params <= 175.0e9
    g = load_model("gpt3-175b")
    assert g.tied_embeddings and g.vocab == 51200 and g.layers[1].attention.num_heads == 96


def test_mixtral_preset_active():
    assert load_model("mixtral-8x7b").active_params == 12_879_925_248


def test_layer_classes_group_identical_blocks():
    classes = load_model("llama-3.1-70b").layer_classes()
    assert [(c.layer.kind, c.count) for c in classes] == [
        (LayerKind.EMBEDDING, 1), (LayerKind.BLOCK, 80), (LayerKind.HEAD, 1)]
    ds = load_model("deepseek-v3").layer_classes()
    assert [c.count for c in ds] == [1, 3, 58, 1]
    assert not ds[1].layer.mlp.is_moe and ds[2].layer.mlp.is_moe


def test_names_are_case_insensitive_and_seq_len_overrides():
    assert load_model("LLaMA-3.1-8B").name == "llama-3.1-8b"
    graph = load_model("llama-3.1-8b", seq_len=16384)
    assert graph.default_seq_len == 16384
    assert load_model("llama-3.1-8b").default_seq_len == 8192  # the cached graph is unchanged


def test_seq_len_beyond_learned_positions_is_rejected():
    with pytest.raises(PlannerError) as info:
        load_model("gpt3-175b", seq_len=4096)
    assert info.value.kind is ErrorKind.INVALID_INPUT and "2048" in info.value.message


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "4096", float("nan"), 10**12])
def test_seq_len_validation(bad):
    with pytest.raises(PlannerError) as info:
        load_model("tiny", seq_len=bad)
    assert info.value.kind is ErrorKind.INVALID_INPUT


def test_list_presets_rows():
    rows = list_presets()
    assert [r.name for r in rows] == sorted(r.name for r in rows)
    by_name = {r.name: r for r in rows}
    assert isinstance(by_name["tiny"], PresetInfo)
    assert by_name["deepseek-v3"].num_layers == 61
    assert by_name["deepseek-v3"].active_params < by_name["deepseek-v3"].params
    assert by_name["llama-3.1-405b"].params == 405_853_388_800
    assert all(r.description and r.source for r in rows)


def test_tiny_preset_shape():
    graph = load_model("tiny")
    block = graph.layers[1]
    assert graph.hidden == 256 and graph.vocab == 1024 and not graph.tied_embeddings
    assert block.attention.num_heads == 8 and block.attention.num_kv_heads == 4
    assert block.mlp.gated and block.mlp.ffn_hidden == 512 and block.tp_replicated_params == 512


def test_preset_files_are_package_data():
    """Every file the index names must match a package-data glob in pyproject.toml, so presets
    load when the package is installed outside the repository."""
    if tomllib is None:
        pytest.skip("tomllib needs Python 3.11")
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["models"]
    files = ["presets/index.yaml"] + [
        str(entry.file.relative_to(PACKAGE_DIR)) for entry in _index().values()]
    for rel in files:
        assert (PACKAGE_DIR / rel).is_file(), rel
        assert any(fnmatch.fnmatch(rel, pattern) for pattern in globs), rel


def test_native_preset_seq_len_agrees_with_index():
    import yaml
    for entry in _index().values():
        if entry.file.suffix == ".yaml":
            data = yaml.safe_load(entry.file.read_text())
            assert data["seq_len"] == entry.seq_len and data["name"] == entry.name
