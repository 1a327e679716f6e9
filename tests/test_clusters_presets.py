"""Cluster and GPU presets load, scale with --nodes, and carry the documented numbers."""
from __future__ import annotations

import pytest

from clusters import gpu_preset, list_cluster_presets, list_gpu_presets, load_cluster
from clusters.loader import PRESET_DIR
from planner.errors import ErrorKind, PlannerError
from planner.hardware import Cluster, Gpu

CLUSTER_PRESETS = ["dgx-a100-40g", "dgx-a100-80g", "dgx-b200", "dgx-b300", "dgx-gb200-nvl72",
                   "dgx-gb300-nvl72", "dgx-h100", "dgx-h200", "hgx-h800", "mi300x", "tiny"]
GPU_PRESETS = ["a100-sxm4-40gb", "a100-sxm4-80gb", "b200", "b300", "gb200", "gb300", "h100-sxm",
               "h200-sxm",
               "h800-sxm", "mi300x", "tiny-gpu", "v100-sxm2-32gb"]


def test_every_cluster_preset_loads_sorted_with_default_nodes():
    presets = list_cluster_presets()
    assert [c.name for c in presets] == CLUSTER_PRESETS
    for cluster in presets:
        assert isinstance(cluster, Cluster)
        assert cluster.num_nodes == (2 if cluster.name == "tiny" else 1)
        assert cluster.tiers[0].domain_gpus == cluster.gpus_per_node
        assert cluster.tiers[-1].domain_gpus == cluster.num_gpus
        assert cluster.source and cluster.description
        assert (PRESET_DIR / f"{cluster.name}.yaml").is_file()
        for tier in cluster.tiers:
            assert 0 < tier.efficiency <= 1 and tier.latency_us > 0


def test_every_gpu_preset_loads():
    gpus = list_gpu_presets()
    assert [g.name for g in gpus] == GPU_PRESETS
    for gpu in gpus:
        assert isinstance(gpu, Gpu)
        assert gpu.memory_gib > 0 and gpu.num_sms > 0
        assert "fp16" in gpu.peak_tflops


@pytest.mark.parametrize("name, memory, hbm, bf16, sms", [
    ("a100-sxm4-40gb", 40, 1555, 312, 108),
    ("a100-sxm4-80gb", 80, 2039, 312, 108),
    ("h100-sxm", 80, 3350, 989.4, 132),
    ("h200-sxm", 141, 4800, 989.4, 132),
    ("h800-sxm", 80, 3350, 989.4, 132),
    ("b200", 180, 8000, 2250, 148),
    ("gb200", 185, 8000, 2500, 148),
    ("b300", 288, 8000, 2250, 148),
    ("gb300", 277.5, 8000, 2500, 160),
    ("mi300x", 192, 5300, 1307.4, 304),
    ("tiny-gpu", 2, 100, 10, 8),
])
def test_gpu_numbers_match_reference(name, memory, hbm, bf16, sms):
    gpu = gpu_preset(name)
    assert (gpu.memory_gib, gpu.hbm_bandwidth_gbytes_per_s, gpu.peak_tflops["bf16"],
            gpu.num_sms) == (memory, hbm, bf16, sms)


def test_v100_has_fp16_tensor_cores_but_no_bf16():
    v100 = gpu_preset("V100-SXM2-32GB")
    assert v100.peak_tflops["fp16"] == 125 and v100.hbm_bandwidth_gbytes_per_s == 900
    assert v100.num_sms == 80 and "bf16" not in v100.peak_tflops


@pytest.mark.parametrize("name, nvlink, nic", [
    ("dgx-a100-40g", 300, 25), ("dgx-a100-80g", 300, 25), ("dgx-h100", 450, 50),
    ("dgx-h200", 450, 50), ("dgx-b200", 900, 50), ("mi300x", 448, 50), ("tiny", 50, 5),
    ("dgx-b300", 900, 100), ("dgx-gb200-nvl72", 900, 50),
])
def test_tier_bandwidths_per_direction(name, nvlink, nic):
    cluster = load_cluster(name)
    assert cluster.tiers[0].bandwidth_gbytes_per_s == nvlink
    assert cluster.tiers[1].bandwidth_gbytes_per_s == nic


def test_preset_names_are_case_insensitive_and_cached():
    assert load_cluster("DGX-H100") is load_cluster("dgx-h100")
    assert load_cluster(" Tiny ").name == "tiny"


@pytest.mark.parametrize("nodes", [1, 2, 3, 16, 1000, 2048])
def test_nodes_scales_a_preset(nodes):
    cluster = load_cluster("dgx-h100", nodes=nodes)
    assert cluster.num_nodes == nodes and cluster.num_gpus == 8 * nodes
    assert cluster.tiers[-1].domain_gpus == 8 * nodes
    assert cluster.tiers[0].domain_gpus == 8
    assert load_cluster("dgx-h100").num_nodes == 1  # the preset itself is unchanged


@pytest.mark.parametrize("nodes", [0, -1, True, 2.5, "4", 10**7])
def test_bad_node_counts(nodes):
    with pytest.raises(PlannerError) as info:
        load_cluster("dgx-h100", nodes=nodes)
    assert info.value.kind is ErrorKind.INVALID_INPUT
    assert "nodes" in str(info.value)


def test_unknown_cluster_preset_suggests_close_match():
    with pytest.raises(PlannerError) as info:
        load_cluster("dgx-h10")
    assert info.value.kind is ErrorKind.UNKNOWN_PRESET
    assert "dgx-h100" in str(info.value)
    assert any("dgx-h100" in hint for hint in info.value.hints)


def test_unknown_gpu_preset():
    with pytest.raises(PlannerError) as info:
        gpu_preset("h100-sxn")
    assert info.value.kind is ErrorKind.UNKNOWN_PRESET
    assert any("h100-sxm" in hint for hint in info.value.hints)


def test_gb200_nvl72_is_one_nvlink_domain_of_72_gpus():
    """GB200 NVL72: the NVLink domain (tier 0) spans the rack's 72 GPUs, not a 4-GPU tray."""
    rack = load_cluster("dgx-gb200-nvl72", nodes=2)
    assert rack.gpus_per_node == 72 and rack.tiers[0].domain_gpus == 72
    assert rack.tiers[1].domain_gpus == 144


def test_h100_96gb_via_gpu_overrides(tmp_path):
    path = tmp_path / "h100-96.yaml"
    path.write_text("shardplan_cluster: 1\nname: h100-96\ngpu: h100-sxm\n"
                    "gpu_overrides: {memory_gib: 96}\ngpus_per_node: 8\nnum_nodes: 1\n"
                    "tiers:\n  - {name: nvlink, bandwidth_gbytes_per_s: 450, latency_us: 2}\n")
    cluster = load_cluster(str(path))
    assert cluster.gpu.memory_gib == 96 and cluster.gpu.peak_tflops["bf16"] == 989.4


def test_h800_cluster_is_deepseek_v3s():
    """DeepSeek-V3 Technical Report §3.1/3.2.2: 2,048 H800 in 8-GPU nodes; NVLink 160 GB/s
    achieved (400 GB/s bidirectional at 0.8 efficiency), IB 50 GB/s per GPU."""
    cluster = load_cluster("hgx-h800", nodes=256)
    assert cluster.num_gpus == 2048 and cluster.gpus_per_node == 8
    nvlink, ib = cluster.tiers[0], cluster.tiers[-1]
    assert nvlink.bandwidth_gbytes_per_s * nvlink.efficiency == 160
    assert ib.bandwidth_gbytes_per_s == 50
    assert cluster.gpu.peak_tflops["fp8"] == gpu_preset("h100-sxm").peak_tflops["fp8"]
