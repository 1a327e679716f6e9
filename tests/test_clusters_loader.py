"""Cluster YAML files: the schema, GPU references and overrides, and every error path."""
from __future__ import annotations

import math
import textwrap

import pytest

from clusters import load_cluster
from clusters.safe_yaml import MAX_FILE_BYTES
from planner.errors import ErrorKind, PlannerError

VALID = textwrap.dedent("""\
    shardplan_cluster: 1
    name: my-cluster
    gpu: h100-sxm
    gpus_per_node: 8
    num_nodes: 16
    nics_per_node: 8
    scalable_unit_nodes: 32
    spine_oversubscription: 1.0
    tiers:
      - {name: nvlink, bandwidth_gbytes_per_s: 450, latency_us: 3.0, efficiency: 0.8}
      - {name: infiniband, bandwidth_gbytes_per_s: 50, latency_us: 8.0, efficiency: 0.9}
    description: a test cluster
    source: test
    """)


def write(tmp_path, text, name="cluster.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def error_of(spec, **kwargs) -> PlannerError:
    with pytest.raises(PlannerError) as info:
        load_cluster(str(spec), **kwargs)
    return info.value


def test_valid_file_loads(tmp_path):
    cluster = load_cluster(str(write(tmp_path, VALID)))
    assert cluster.name == "my-cluster" and cluster.num_gpus == 128
    assert cluster.gpu.name == "h100-sxm" and cluster.gpu.memory_gib == 80
    assert cluster.tiers[1].effective_bandwidth_bytes_per_s == pytest.approx(45e9)
    assert cluster.tiers[1].domain_gpus == 128
    assert cluster.scalable_unit_nodes == 32 and cluster.spine_oversubscription == 1.0
    assert load_cluster(write(tmp_path, VALID), nodes=4).num_nodes == 4  # a Path works too


def test_gpu_override_makes_a_96_gib_h100(tmp_path):
    text = VALID.replace("gpu: h100-sxm\n", "gpu: h100-sxm\ngpu_overrides: {memory_gib: 96}\n")
    gpu = load_cluster(str(write(tmp_path, text))).gpu
    assert gpu.memory_gib == 96
    assert gpu.peak_tflops["bf16"] == 989.4 and gpu.num_sms == 132  # the rest is the preset's


def test_gpu_override_of_one_dtype_keeps_the_others(tmp_path):
    text = VALID.replace("gpu: h100-sxm\n",
                         "gpu: h100-sxm\ngpu_overrides: {peak_tflops: {fp8: 1000}}\n")
    gpu = load_cluster(str(write(tmp_path, text))).gpu
    assert gpu.peak_tflops["fp8"] == 1000 and gpu.peak_tflops["bf16"] == 989.4


def test_gpu_as_full_mapping(tmp_path):
    text = VALID.replace("gpu: h100-sxm\n", textwrap.dedent("""\
        gpu:
          name: my-gpu
          memory_gib: 24
          hbm_bandwidth_gbytes_per_s: 1000
          peak_tflops: {bf16: 100, fp16: 100, fp32: 20}
          num_sms: 64
          vendor: acme
        """))
    gpu = load_cluster(str(write(tmp_path, text))).gpu
    assert (gpu.name, gpu.memory_gib, gpu.vendor, gpu.peak_tflops["fp32"]) == \
        ("my-gpu", 24, "acme", 20)


def test_single_node_cluster_with_one_tier(tmp_path):
    text = VALID.replace("num_nodes: 16", "num_nodes: 1").replace(
        "  - {name: infiniband, bandwidth_gbytes_per_s: 50, latency_us: 8.0, efficiency: 0.9}\n",
        "")
    path = write(tmp_path, text)
    assert load_cluster(str(path)).num_gpus == 8
    error = error_of(path, nodes=2)
    assert error.kind is ErrorKind.INVALID_INPUT and "inter-node tier" in str(error)


# -- invalid values: (replace this, with that) -> message must name this field ---------------

BAD_VALUES = [
    ("bandwidth_gbytes_per_s: 50,", "bandwidth_gbytes_per_s: -50,", "tiers[1].bandwidth_gbytes_per_s"),
    ("bandwidth_gbytes_per_s: 50,", "bandwidth_gbytes_per_s: 0,", "tiers[1].bandwidth_gbytes_per_s"),
    ("bandwidth_gbytes_per_s: 50,", "bandwidth_gbytes_per_s: .nan,", "tiers[1].bandwidth_gbytes_per_s"),
    ("bandwidth_gbytes_per_s: 50,", "bandwidth_gbytes_per_s: .inf,", "tiers[1].bandwidth_gbytes_per_s"),
    ("bandwidth_gbytes_per_s: 50,", "bandwidth_gbytes_per_s: true,", "tiers[1].bandwidth_gbytes_per_s"),
    ("bandwidth_gbytes_per_s: 50,", "bandwidth_gbytes_per_s: '50',", "tiers[1].bandwidth_gbytes_per_s"),
    ("bandwidth_gbytes_per_s: 50,", "bandwidth_gbytes_per_s: 1e12,", "tiers[1].bandwidth_gbytes_per_s"),
    ("efficiency: 0.9}", "efficiency: 1.5}", "tiers[1].efficiency"),
    ("latency_us: 3.0,", "latency_us: -1,", "tiers[0].latency_us"),
    ("num_nodes: 16", "num_nodes: 0", "num_nodes"),
    ("num_nodes: 16", "num_nodes: 2000000", "num_nodes"),
    ("num_nodes: 16", "num_nodes: 16.5", "num_nodes"),
    ("num_nodes: 16", "num_nodes: 99999999999999999999999999", "num_nodes"),
    ("num_nodes: 16", "num_nodes: null", "num_nodes"),
    ("gpus_per_node: 8", "gpus_per_node: false", "gpus_per_node"),
    ("nics_per_node: 8", "nics_per_node: 16", "nics_per_node"),
    ("nics_per_node: 8", "nics_per_node: -1", "nics_per_node"),
    ("scalable_unit_nodes: 32", "scalable_unit_nodes: 0", "scalable_unit_nodes"),
    ("spine_oversubscription: 1.0", "spine_oversubscription: 0.5", "spine_oversubscription"),
    ("name: my-cluster", "name: ''", "name"),
    ("name: my-cluster", "name: [a]", "name"),
    ("shardplan_cluster: 1", "shardplan_cluster: 2", "shardplan_cluster"),
    ("gpu: h100-sxm", "gpu: 42", "gpu"),
    ("gpu: h100-sxm", "gpu: h100-sxm\ngpu_overrides: {memory_gib: 2000000}", "gpu_overrides.memory_gib"),
    ("gpu: h100-sxm", "gpu: h100-sxm\ngpu_overrides: {memory_gib: 0}", "gpu_overrides.memory_gib"),
    ("gpu: h100-sxm", "gpu: h100-sxm\ngpu_overrides: {num_sms: 1.5}", "gpu_overrides.num_sms"),
    ("gpu: h100-sxm", "gpu: h100-sxm\ngpu_overrides: {peak_tflops: {bf16: -1}}", "gpu_overrides.peak_tflops.bf16"),
    ("gpu: h100-sxm", "gpu: h100-sxm\ngpu_overrides: [1]", "gpu_overrides"),
    ("gpu: h100-sxm", "gpu: {name: g, memory_gib: 1, hbm_bandwidth_gbytes_per_s: 1, num_sms: 1, peak_tflops: {fp32: 1}}", "gpu.peak_tflops"),
    ("gpu: h100-sxm", "gpu: {name: g, memory_gib: 1, hbm_bandwidth_gbytes_per_s: 1, peak_tflops: {bf16: 1}}", "gpu.num_sms"),
    ("tiers:", "intra_node_topology: torus\ntiers:", "intra_node_topology"),
]


@pytest.mark.parametrize("old, new, field", BAD_VALUES)
def test_bad_value_names_the_field(tmp_path, old, new, field):
    assert old in VALID
    error = error_of(write(tmp_path, VALID.replace(old, new, 1)))
    assert error.kind is ErrorKind.INVALID_INPUT
    assert field in str(error), str(error)
    assert error.details.get("field") == field


def test_unknown_top_level_key_lists_valid_keys(tmp_path):
    error = error_of(write(tmp_path, VALID + "num_node: 3\n"))
    assert error.kind is ErrorKind.INVALID_INPUT
    assert "'num_node'" in str(error) and "num_nodes" in str(error) and "valid keys" in str(error)
    assert any("num_nodes" in hint for hint in error.hints)


def test_unknown_tier_key(tmp_path):
    error = error_of(write(tmp_path, VALID.replace("efficiency: 0.8}", "efficency: 0.8}")))
    assert "tiers[0].efficency" in str(error) and "latency_us" in str(error)


def test_unknown_gpu_override_key(tmp_path):
    error = error_of(write(tmp_path, VALID.replace(
        "gpu: h100-sxm\n", "gpu: h100-sxm\ngpu_overrides: {memory: 96}\n")))
    assert "gpu_overrides.memory" in str(error) and "memory_gib" in str(error)


def test_unknown_peak_tflops_dtype(tmp_path):
    error = error_of(write(tmp_path, VALID.replace(
        "gpu: h100-sxm\n", "gpu: h100-sxm\ngpu_overrides: {peak_tflops: {int4: 9}}\n")))
    assert "int4" in str(error) and "bf16" in str(error)


@pytest.mark.parametrize("key", ["shardplan_cluster", "name", "gpu", "gpus_per_node",
                                 "num_nodes", "tiers"])
def test_missing_required_key(tmp_path, key):
    lines = [line for line in VALID.splitlines(keepends=True) if not line.startswith(key + ":")]
    if key == "tiers":
        lines = [line for line in lines if not line.startswith("  - ")]
    error = error_of(write(tmp_path, "".join(lines)))
    assert error.kind is ErrorKind.INVALID_INPUT and repr(key) in str(error)


@pytest.mark.parametrize("tiers", ["[]", "5", "[1, 2]", "{name: a}"])
def test_bad_tier_lists(tmp_path, tiers):
    text = VALID.split("tiers:")[0] + f"tiers: {tiers}\n"
    error = error_of(write(tmp_path, text))
    assert error.kind is ErrorKind.INVALID_INPUT and "tiers" in str(error)


def test_three_tiers_refused(tmp_path):
    text = VALID.replace("description:", "  - {name: x, bandwidth_gbytes_per_s: 5, latency_us: 9}\n"
                                         "description:")
    assert "2 tiers" in str(error_of(write(tmp_path, text)))


def test_unknown_gpu_preset_in_file(tmp_path):
    error = error_of(write(tmp_path, VALID.replace("gpu: h100-sxm", "gpu: h100-sxn")))
    assert error.kind is ErrorKind.UNKNOWN_PRESET
    assert "h100-sxn" in str(error) and any("h100-sxm" in hint for hint in error.hints)


# -- file-level problems ---------------------------------------------------------------------

def test_duplicate_key_is_named(tmp_path):
    error = error_of(write(tmp_path, VALID + "num_nodes: 4\n"))
    assert error.kind is ErrorKind.INVALID_INPUT and "duplicate key 'num_nodes'" in str(error)


def test_tab_indentation_reports_line(tmp_path):
    text = VALID.replace("  - {name: nvlink", "\t- {name: nvlink")
    error = error_of(write(tmp_path, text))
    assert error.kind is ErrorKind.INVALID_INPUT and "line 10" in str(error)
    assert any("tab" in hint for hint in error.hints)


def test_malformed_yaml(tmp_path):
    error = error_of(write(tmp_path, "name: [unclosed\n"))
    assert error.kind is ErrorKind.INVALID_INPUT and "malformed YAML" in str(error)


@pytest.mark.parametrize("content, words", [
    (b"", "empty"), (b"   \n# only a comment\n", "empty"),
    (b"\x00\x01\x02binary", "binary"), (b"\xff\xfe\xfa not utf-8", "UTF-8"),
    (b"- a list\n", "mapping"), (b"just a string\n", "mapping"),
])
def test_bad_file_contents(tmp_path, content, words):
    path = tmp_path / "c.yaml"
    path.write_bytes(content)
    error = error_of(path)
    assert error.kind is ErrorKind.INVALID_INPUT and words in str(error)


def test_missing_file_and_directory(tmp_path):
    assert "not found" in str(error_of(tmp_path / "nope.yaml"))
    assert "directory" in str(error_of(tmp_path))


def test_oversized_file(tmp_path):
    path = tmp_path / "big.yaml"
    with path.open("wb") as handle:
        handle.truncate(MAX_FILE_BYTES + 1)  # sparse: no disk space used
    error = error_of(path)
    assert error.kind is ErrorKind.INVALID_INPUT and "MiB" in str(error)


def test_alias_bomb_is_refused_quickly(tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 12):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    error = error_of(write(tmp_path, "\n".join(lines) + "\n"))
    assert error.kind is ErrorKind.INVALID_INPUT and "aliases" in str(error)


def test_recursive_alias_is_refused(tmp_path):
    error = error_of(write(tmp_path, "a: &a [*a]\n"))
    assert error.kind is ErrorKind.INVALID_INPUT


def test_harmless_aliases_are_fine(tmp_path):
    text = VALID.replace("  - {name: nvlink, bandwidth_gbytes_per_s: 450, latency_us: 3.0, "
                         "efficiency: 0.8}", "  - &nv {name: nvlink, bandwidth_gbytes_per_s: 450, "
                         "latency_us: 3.0, efficiency: 0.8}")
    assert load_cluster(str(write(tmp_path, text))).tiers[0].name == "nvlink"


def test_deep_nesting_is_refused(tmp_path):
    error = error_of(write(tmp_path, "name: " + "[" * 5000 + "]" * 5000 + "\n"))
    assert error.kind is ErrorKind.INVALID_INPUT


def test_python_tags_are_refused(tmp_path):
    error = error_of(write(tmp_path, "name: !!python/object/apply:os.system ['true']\n"))
    assert error.kind is ErrorKind.INVALID_INPUT


@pytest.mark.parametrize("spec", ["", "   ", 42, None])
def test_bad_spec_types(spec):
    with pytest.raises(PlannerError) as info:
        load_cluster(spec)
    assert info.value.kind is ErrorKind.INVALID_INPUT


def test_nan_is_never_accepted(tmp_path):
    for field in ("latency_us: 3.0", "efficiency: 0.8"):
        name = field.split(":")[0]
        error = error_of(write(tmp_path, VALID.replace(field, f"{name}: .nan", 1)))
        assert "finite" in str(error) and f"tiers[0].{name}" in str(error)
    assert not math.isnan(load_cluster(str(write(tmp_path, VALID))).tiers[0].latency_us)
