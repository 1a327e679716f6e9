"""Memory beyond HBM: optimizer states in host memory (ZeRO-Offload) as a per-layer option the
solver weighs against recomputation and sharding; the cluster file's host section."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from clusters import load_cluster
from clusters.schema import cluster_from_mapping
from models.params import BlockShape, EmbeddingShape, HeadShape, assemble
from planner.config import ParallelConfig, RuntimeOptions
from planner.cost import offload
from planner.cost.context import make_context
from planner.cost.model import evaluate
from planner.cost.terms import OPTIMIZER_BYTES_PER_PARAM, layer_terms, option_valid
from planner.errors import PlannerError
from planner.hardware import GIB, HostMemory
from planner.ir import Attention, Mlp
from planner.solve.bruteforce import brute_force
from planner.solve.search import SearchOptions, search
from planner.solve.space import Pins
from planner.strategy import LayerOption, LayerPlacement, Recompute

HOST = HostMemory(memory_gib=1.0, link_gbytes_per_s=25, memory_bandwidth_gbytes_per_s=50,
                  cpu_cores=8, core_gflops=50)


def model(blocks=3, h=256):
    shape = BlockShape(hidden=h, attention=Attention(4, 4, h // 4, h // 4),
                       mlp=Mlp(4 * h, gated=False), norm_bias=True)
    return assemble(name="m", family="test", embedding=EmbeddingShape(8000, h),
                    blocks=[(f"b.{i}", shape) for i in range(blocks)],
                    head=HeadShape(8000, h), default_seq_len=256, max_seq_len=None,
                    source="test")


@pytest.fixture(scope="module")
def tiny():
    return replace(load_cluster("tiny"), cpu_memory=HOST)


def test_offload_moves_the_optimizer_states_and_costs_the_host_step(tiny):
    m = model()
    c = ParallelConfig(tp=1, pp=1, dp=8, micro_batch=1, global_batch=8, seq_len=256,
                       zero_stage=1)
    ctx = make_context(m, tiny, c)
    block = m.layers[1]
    on_gpu = layer_terms(ctx, block, LayerOption())
    off = layer_terms(ctx, block, LayerOption(offload=True))
    owned = block.params / 8  # ZeRO-1 over 8 ranks
    assert off.optimizer_bytes == 0 and on_gpu.optimizer_bytes > 0
    assert off.host_bytes == pytest.approx(on_gpu.optimizer_bytes + 4 * owned)
    assert off.params_bytes == on_gpu.params_bytes and off.grads_bytes == on_gpu.grads_bytes
    state = ctx.options.state_bytes(ctx.config.zero_stage)
    link = owned * (state.grad_reduce_bytes + state.weights) / (25e9 * 0.8)
    adam = max(owned * OPTIMIZER_BYTES_PER_PARAM / (50e9 * 0.8),
               owned * offload.ADAM_FLOPS_PER_PARAM / (8 * 50e9))
    assert off.optimizer_s == pytest.approx(link + adam)
    assert off.time_s == on_gpu.time_s  # per micro-batch nothing changes
    # a cluster without a host section has no offload option
    bare = make_context(m, load_cluster("tiny"), c)
    assert not option_valid(bare, block, LayerOption(offload=True))


def test_host_capacity_is_part_of_fits(tiny):
    m = model()
    c = ParallelConfig(tp=1, pp=1, dp=8, micro_batch=1, global_batch=8, seq_len=256)
    options = tuple(LayerOption(offload=True) for _ in m.layers)
    roomy = evaluate(m, tiny, c, LayerPlacement((0,) * len(m.layers), options))
    assert roomy.fits and roomy.stages[0].host_bytes > 0
    small = replace(tiny, cpu_memory=replace(HOST, memory_gib=roomy.stages[0].host_bytes / GIB / 2))
    assert not evaluate(m, small, c, LayerPlacement((0,) * len(m.layers), options)).fits


@pytest.mark.parametrize("gpu_gib,host_gib,pins", [
    (0.35, 1.0, Pins(offload="optimizer", tp=1, pp=1, micro_batch=1)),
    (0.35, 1.0, Pins(offload="optimizer", tp=2, pp=2, micro_batch=1, zero=0)),
    (0.35, 2e6 / GIB, Pins(offload="optimizer", tp=1, pp=1, micro_batch=1, zero=0)),
    (0.21, 1.0, Pins(offload="activations", tp=1, pp=1, micro_batch=1)),
    (0.21, 1.5e6 / GIB, Pins(offload="activations", tp=1, pp=1, micro_batch=1)),
    (0.21, 1.0, Pins(offload="both", tp=1, pp=2, micro_batch=1, zero=0)),
])
def test_solver_matches_brute_force_with_offload(tiny, gpu_gib, host_gib, pins):
    """GPU memory tight enough that something must give: offload (optimizer states, activations
    or both), recompute or shard; the host capacity binds in the third and fifth cases. The
    solver's optimum is the oracle's."""
    m = model()
    cluster = replace(tiny, gpu=replace(tiny.gpu, memory_gib=gpu_gib),
                      cpu_memory=replace(HOST, memory_gib=host_gib))
    runtime = RuntimeOptions()
    oracle = brute_force(m, cluster, 64, 256, pins=pins, runtime=runtime, budget=2_000_000)
    found = search(m, cluster, 64, 256, pins=pins,
                   options=SearchOptions(time_limit_s=60, runtime=runtime))
    assert oracle.best is not None and found.record.status == "OPTIMAL"
    assert found.best.step_time_s == pytest.approx(oracle.best.step_time_s, rel=1e-6)
    assert found.best.fits


def test_offload_beats_recomputation_when_memory_binds(tiny):
    """With 0.2 GiB per GPU the GPU-only plan recomputes a block (every micro-batch); with
    offload on, the solver keeps the optimizer states of two blocks on the host instead (paid
    once per step) and is faster, within the host's capacity."""
    m = model()
    cluster = replace(tiny, gpu=replace(tiny.gpu, memory_gib=0.2 / 0.95))  # 5 % headroom
    plain = search(m, cluster, 64, 256, pins=Pins(tp=1, pp=1)).best
    found = search(m, cluster, 64, 256, pins=Pins(offload="optimizer", tp=1, pp=1)).best
    assert any(o.recompute is Recompute.FULL for o in plain.placement.options)
    assert found.step_time_s < plain.step_time_s
    assert any(o.offload for o in found.placement.options)
    assert not any(o.recompute is Recompute.FULL for o in found.placement.options)
    assert all(s.host_bytes <= HOST.capacity_bytes for s in found.stages)


def test_offload_pin_needs_a_host_section():
    with pytest.raises(PlannerError, match="host"):
        search(model(), load_cluster("tiny"), 8, 256, pins=Pins(offload="optimizer"))


def test_cluster_host_section_is_validated():
    base = {"shardplan_cluster": 1, "name": "x", "gpu": "h100-sxm", "gpus_per_node": 8,
            "num_nodes": 1, "tiers": [{"name": "nvlink", "bandwidth_gbytes_per_s": 450,
                                       "latency_us": 2}]}
    from clusters.loader import _gpu_preset_data as gpu_presets

    host = {"memory_gib_per_gpu": 238.4, "link_gbytes_per_s": 63,
            "memory_bandwidth_gbytes_per_s_per_gpu": 76.8, "cpu_cores_per_gpu": 14,
            "core_gflops": 128}
    cluster = cluster_from_mapping({**base, "host": host}, "x.yaml", gpu_presets())
    assert cluster.cpu_memory.capacity_bytes == pytest.approx(238.4 * GIB)
    for bad, path in (({**host, "link_gbytes_per_s": -1}, "host.link_gbytes_per_s"),
                      ({**host, "link_efficiency": 1.5}, "host.link_efficiency"),
                      ({k: v for k, v in host.items() if k != "core_gflops"}, "host.core_gflops"),
                      ({**host, "memory_gib": 1}, "host.memory_gib")):
        with pytest.raises(PlannerError, match=path.replace(".", r"\.")):
            cluster_from_mapping({**base, "host": bad}, "x.yaml", gpu_presets())
    h100, gb200 = load_cluster("dgx-h100").cpu_memory, load_cluster("dgx-gb200-nvl72").cpu_memory
    assert h100.link == "PCIe Gen5 x16" and gb200.link == "NVLink-C2C"
    assert gb200.link_gbytes_per_s * 2 * 2 == 900  # 900 GB/s bidirectional per 2 GPUs


def test_cli_plan_with_offload_checks_and_exports_with_a_note(tmp_path, capsys):
    """`plan --pin offload=optimizer` on a cluster file with a host section (0.19 GiB GPUs:
    nothing fits on the GPUs alone): the plan file records the offloaded layers, `check`
    re-derives it, and an export says it cannot keep per-layer offload."""
    import json

    from cli.main import main

    preset = (Path(__file__).resolve().parent.parent / "clusters" / "presets" / "tiny.yaml")
    text = preset.read_text().replace("gpu: tiny-gpu", "gpu: tiny-gpu\ngpu_overrides: "
                                      "{memory_gib: 0.19}")
    text += ("host: {memory_gib_per_gpu: 1, link_gbytes_per_s: 25, cpu_cores_per_gpu: 8,\n"
             "       memory_bandwidth_gbytes_per_s_per_gpu: 50, core_gflops: 50}\n")
    cluster = tmp_path / "host.yaml"
    cluster.write_text(text)
    spec = tmp_path / "m.json"
    spec.write_text(json.dumps({
        "model_type": "gpt2", "n_layer": 3, "n_embd": 256, "n_head": 4, "vocab_size": 8000,
        "n_positions": 256}))
    plan = tmp_path / "plan.json"
    with pytest.raises(SystemExit) as done:
        main(["plan", "--model", str(spec), "--cluster", str(cluster), "--global-batch", "64",
              "--seq-len", "256", "--pin", "offload=optimizer", "--pin", "tp=1", "--pin",
              "pp=1", "-o", str(plan)])
    _, err = capsys.readouterr()
    assert done.value.code == 0, err
    doc = json.loads(plan.read_text())
    assert any(layer.get("offload") for layer in doc["layers"])
    assert doc["pins"]["offload"] == "optimizer"
    with pytest.raises(SystemExit) as done:
        main(["check", str(plan)])
    _, err = capsys.readouterr()
    assert done.value.code == 0, err
    with pytest.raises(SystemExit) as done:
        main(["export", str(plan), "-f", "deepspeed", "--strict"])
    _, err = capsys.readouterr()
    assert done.value.code == 1 and "offload:" in err
