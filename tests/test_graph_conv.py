"""Convolution cost: implicit-GEMM shapes and FLOPs from the graph, channel-parallel layouts,
activation memory, and plans of convolutional ONNX graphs (never run)."""
from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("onnx")

from clusters import load_cluster  # noqa: E402
from models.graph.onnx_import import load_onnx  # noqa: E402
from planner.config import ParallelConfig  # noqa: E402
from planner.cost import comm  # noqa: E402
from planner.cost.compute import Shard, conv_gemms, layer_gemms  # noqa: E402
from planner.cost.context import make_context  # noqa: E402
from planner.cost.memory import ACT_BYTES, conv_activation_bytes  # noqa: E402
from planner.cost.terms import layer_terms  # noqa: E402
from planner.ir import Conv, Layer, LayerKind  # noqa: E402
from planner.strategy import LayerOption, Recompute  # noqa: E402
from test_graph_onnx import resnet  # noqa: E402


def test_conv_flops_and_implicit_gemm():
    c = Conv(in_channels=64, out_channels=128, kernel=9, in_pixels=56 * 56, out_pixels=28 * 28)
    assert c.flops == 2 * 9 * 64 * 128 * 28 * 28  # 2 K C_in C_out H_out W_out / groups
    layer = Layer("b", LayerKind.BLOCK, 128, c.weights, c.weights, convs=(c,))
    (g,) = conv_gemms(layer, Shard(micro_batch=4, seq_len=1))
    # NVIDIA conv guide: M = N P Q, N = C_out, K = C_in R S
    assert (g.m, g.n, g.k, g.count) == (4 * 28 * 28, 128, 64 * 9, 1)
    assert g.flops == 4 * c.flops
    # the input is read once (not the 9x im2col matrix), the output written once
    assert g.io_elements == 4 * (64 * 56 * 56 + 128 * 28 * 28) + c.weights
    depthwise = Conv(256, 256, 9, 784, 784, groups=256)
    assert depthwise.flops == 2 * 9 * 256 * 784
    (d,) = conv_gemms(Layer("d", LayerKind.BLOCK, 256, 0, 0, convs=(depthwise,)),
                      Shard(micro_batch=2, seq_len=1, tp=2))
    assert (d.count, d.n, d.k) == (128, 1, 9)  # whole groups per channel-parallel rank


def test_graph_conv_layers_carry_the_builders_flops(tmp_path):
    path = tmp_path / "resnet.onnx"
    b = resnet(path)
    graph = load_onnx(path)
    per_sample = sum(c.flops for layer in graph.layers for c in layer.convs)
    assert per_sample == pytest.approx(b.conv_flops)
    shard = Shard(micro_batch=3, seq_len=graph.default_seq_len)
    gemm = sum(g.flops for layer in graph.layers for g in layer_gemms(layer, shard)
               if layer.convs)
    assert gemm >= 3 * b.conv_flops  # the convolutions (+ nothing else but the classifier)
    conv_gemm = sum(g.flops for layer in graph.layers for g in conv_gemms(layer, shard))
    assert conv_gemm == pytest.approx(3 * b.conv_flops)
    # block convolution weights are channel-parallel; the stem stays replicated
    block = graph.layers[1]
    assert block.tp_replicated_params < block.params
    assert graph.layers[0].tp_replicated_params == graph.layers[0].params


def test_channel_parallel_splits_work_and_adds_collectives(tmp_path):
    path = tmp_path / "resnet.onnx"
    resnet(path, width=16, image=32)
    graph = load_onnx(path)
    cluster = load_cluster("tiny")
    block = graph.layers[1]

    def terms(tp, recompute=Recompute.NONE):
        c = ParallelConfig(tp=tp, pp=1, dp=8 // tp, micro_batch=4, global_batch=32,
                           seq_len=graph.default_seq_len)
        return layer_terms(make_context(graph, cluster, c), block, LayerOption(recompute))

    one, two = terms(1), terms(2)
    assert one.comm_s == 0.0 and two.comm_s > 0.0
    assert two.hw_flops == pytest.approx(one.hw_flops / 2, rel=1e-9)
    link = make_context(graph, cluster, ParallelConfig(
        tp=2, pp=1, dp=4, micro_batch=4, global_batch=32, seq_len=1)).links.tp
    fwd = sum(comm.all_gather_s(4 * c.out_channels * c.out_pixels * ACT_BYTES, 2, link)
              for c in block.convs)
    bwd = sum(comm.all_reduce_s(4 * c.in_channels * c.in_pixels * ACT_BYTES, 2, link)
              for c in block.convs)
    assert two.comm_s == pytest.approx(fwd + bwd)
    # activations: per convolution its normalisation input (split) and its activation output
    first = block.convs[0]
    expected = 4 * ACT_BYTES * (first.in_channels * first.in_pixels + sum(
        c.out_channels * c.out_pixels * 1.5 for c in block.convs))
    assert two.act_stored_bytes == pytest.approx(expected)
    full = conv_activation_bytes(block, 4, 2, Recompute.FULL)
    assert full[0] == 4 * ACT_BYTES * first.in_channels * first.in_pixels
    assert terms(1, Recompute.FULL).act_stored_bytes < one.act_stored_bytes


def test_cli_plans_a_resnet_onnx_data_parallel(tmp_path, capsys):
    """A small ResNet on 8 GPUs: data parallelism, no channel-parallel all-gathers."""
    from cli.main import main

    path = tmp_path / "resnet.onnx"
    resnet(path, blocks=(2, 2, 2), width=32, image=64)
    with pytest.raises(SystemExit) as done:
        main(["plan", "--model", str(path), "--cluster", "tiny", "--global-batch", "256",
              "--json", "-o", str(tmp_path / "plan.json")])
    out, err = capsys.readouterr()
    assert done.value.code == 0, err
    plan = json.loads(out)
    text = json.dumps(plan)
    assert '"tp": 1' in text and math.isfinite(plan["predicted"]["step_time_s"])
