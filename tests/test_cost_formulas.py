"""Oracle tests: the cost model's formulas against published closed forms.

ZeRO (Rajbhandari et al. 2020) Figure 1 / Table 1, Korthikanti et al. 2022 Table 2 activation
memory, Narayanan et al. 2021 Eq. 3 FLOPs, the 1F1B bubble, nccl-tests collective formulas.
"""
from __future__ import annotations

import math

import pytest

from planner.topology import Link
from planner.config import RUNTIME_STATE_BYTES, RuntimeOptions
from planner.strategy import Recompute
from planner.cost import comm
from planner.cost.memory import (block_activation_bytes_per_token, in_flight_micro_batches,
                                 layer_activation_bytes, zero_state_bytes)
from planner.cost.pipeline import bubble_time_s, pipeline_time_s
from planner.ir import Attention, Layer, LayerKind, Mlp

ZERO = RUNTIME_STATE_BYTES["zero-paper"]


@pytest.mark.parametrize("stage,expected_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.875)])
def test_zero_worked_example_7_5b_on_64_gpus(stage, expected_gb):
    # ZeRO Figure 1: 7.5B parameters, N_d = 64, K = 12; GB = 1e9 bytes.
    states = zero_state_bytes(7.5e9, 64, stage, ZERO)
    assert states.total / 1e9 == pytest.approx(expected_gb, rel=3e-3)


@pytest.mark.parametrize("psi,nd,pos,posg,posgp", [
    (7.5e9, 4, 52.5, 41.25, 30.0),
    (128e9, 16, 608.0, 368.0, 128.0),
    (1e12, 1024, 4012.0, 2014.0, 15.62),
])
def test_zero_table_1(psi, nd, pos, posg, posgp):
    got = [zero_state_bytes(psi, nd, s, ZERO).total / 1e9 for s in (1, 2, 3)]
    assert got == pytest.approx([pos, posg, posgp], rel=2e-3)


def test_zero_table_2_max_model_size_mp16():
    # ZeRO Table 2: 32 GB V100, MP = 16, 1024 GPUs (N_d = 64), P_os: 121.6B parameters fit.
    per_gpu = zero_state_bytes(121.6e9 / 16, 64, 1, ZERO).total
    assert per_gpu / 1e9 == pytest.approx(32.0, rel=0.01)


def test_megatron_keeps_18_bytes_per_parameter():
    # Korthikanti et al. 2022 §6: bf16 weights + fp32 main_grad + fp32 Adam = 18 B/param without ZeRO.
    assert zero_state_bytes(1e9, 8, 0, RUNTIME_STATE_BYTES["megatron"]).total == 18e9
    # distributed optimizer: 6 + 12/d
    assert zero_state_bytes(1e9, 8, 1, RUNTIME_STATE_BYTES["megatron"]).total == 6e9 + 12e9 / 8


def test_deepspeed_bf16_shards_gradients_from_zero_2():
    # DeepSpeed's engine builds BF16_Optimizer for ZeRO-0/1 only (runtime/engine.py): its bf16
    # .grad and unsharded fp32 accumulation buffer (6 B/param), and the bf16 copy of that
    # buffer the data-parallel all-reduce casts it to (engine.py allreduce_bucket,
    # communication_data_type: 2 B/param, 2 B on the wire); from ZeRO-2 a bf16 model gets the
    # ZeRO optimizer (stage_1_and_2.py, stage3.py): 16-bit gradients sharded with the stage,
    # an fp32 gradient partition next to the fp32 master, m and v (16 B/param sharded)
    options = RuntimeOptions(runtime="deepspeed-bf16")
    one = zero_state_bytes(1e9, 8, 1, options.state_bytes(1))
    assert one.grads == 8e9 and one.optimizer == 12e9 / 8
    assert options.state_bytes(1).grad_reduce_bytes == 2.0
    for stage in (2, 3):
        states = zero_state_bytes(1e9, 8, stage, options.state_bytes(stage))
        assert states.grads == 2e9 / 8 and states.optimizer == 16e9 / 8
        assert options.state_bytes(stage) == RUNTIME_STATE_BYTES["deepspeed"]
    megatron = RuntimeOptions(runtime="megatron")
    assert megatron.state_bytes(3) == megatron.state_bytes(0) == RUNTIME_STATE_BYTES["megatron"]


def test_bf16_optimizer_all_reduces_the_whole_gradient_then_gathers():
    # DeepSpeed BF16_Optimizer (as BLOOM ran it, ZeRO-1 layout): engine.py allreduce_bucket
    # all-reduces every flat gradient group over the data-parallel group, then each rank steps
    # its partition and BF16_Optimizer.step all-gathers the bf16 weights (all_gather_dp_groups).
    # Megatron's distributed optimizer reduce-scatters instead: half the reduction's volume.
    from planner.cost.terms import dp_collectives

    link = Link(bandwidth_bytes_per_s=10e9, latency_s=0.0, tier="ib", crosses_nodes=True)
    n, size = 8, 4e9
    assert RuntimeOptions(runtime="deepspeed-bf16").state_bytes(1).reduce_all
    assert not RuntimeOptions(runtime="megatron").state_bytes(1).reduce_all
    for reduce_all, reduce_s in ((True, comm.all_reduce_s(size, n, link)),
                                 (False, comm.reduce_scatter_s(size, n, link))):
        *_, red, _, gat, _ = dp_collectives(1, n, 1, link, link, False, reduce_all=reduce_all)
        assert red.slope_s_per_byte * size == pytest.approx(reduce_s)
        assert gat.slope_s_per_byte * size == pytest.approx(comm.all_gather_s(size, n, link))
    # the reduction is twice the reduce-scatter's: 2 (n-1)/n of the bytes on the wire
    twice = 2 * comm.reduce_scatter_s(size, n, link)
    assert comm.all_reduce_s(size, n, link) == pytest.approx(twice)
    # ZeRO-0 all-reduces with or without it, and ZeRO-2/3 keep their per-micro-batch reduction
    for zero, per_mb in ((0, False), (2, True), (3, True)):
        assert dp_collectives(zero, n, 1, link, link, per_mb, reduce_all=True) == \
            dp_collectives(zero, n, 1, link, link, per_mb)


def gpt_block(h: int, a: int) -> Layer:
    params = 12 * h * h + 13 * h
    return Layer("block.0", LayerKind.BLOCK, h, params, params, tp_replicated_params=6 * h,
                 attention=Attention(a, a, h // a, h // a), mlp=Mlp(4 * h, gated=False))


S, B, H, A = 2048, 4, 12288, 96


@pytest.mark.parametrize("t", [1, 2, 8])
def test_korthikanti_activation_memory_tensor_parallel(t):
    layer = gpt_block(H, A)
    per_token, _ = block_activation_bytes_per_token(layer, t, False, S, "eager", True)
    expected = S * B * H * (10 + 24 / t + 5 * A * S / (H * t))
    assert per_token * S * B == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("t", [2, 8])
def test_korthikanti_sequence_parallel_and_selective(t):
    layer = gpt_block(H, A)
    stored, _ = layer_activation_bytes(layer, B, S, t, 1, True, Recompute.NONE, "eager", True)
    assert stored == pytest.approx(S * B * H / t * (34 + 5 * A * S / H), rel=1e-12)
    stored, working = layer_activation_bytes(layer, B, S, t, 1, True, Recompute.SELECTIVE,
                                             "eager", True)
    assert stored == pytest.approx(34 * S * B * H / t, rel=1e-12)
    assert working == pytest.approx(5 * A * S * S * B / t, rel=1e-12)


def test_full_recompute_stores_the_layer_input_only():
    layer = gpt_block(H, A)
    stored, working = layer_activation_bytes(layer, B, S, 8, 1, False, Recompute.FULL, "eager", True)
    assert stored == 2 * S * B * H
    assert working == pytest.approx(S * B * H * (10 + 24 / 8 + 5 * A * S / (H * 8)), rel=1e-12)


def test_flash_attention_drops_the_quadratic_term():
    layer = gpt_block(H, A)
    flash, _ = block_activation_bytes_per_token(layer, 8, True, S, "flash", False)
    eager, _ = block_activation_bytes_per_token(layer, 8, True, S, "eager", False)
    assert eager - flash == pytest.approx(2 * A / 8 * S - 4 * A / 8)


def test_one_f_one_b_holds_p_micro_batches_on_the_first_stage():
    assert in_flight_micro_batches(0, 8, 64) == 8
    assert in_flight_micro_batches(7, 8, 64) == 1
    assert in_flight_micro_batches(0, 8, 3) == 3
    # interleaved: Korthikanti's factor (1 + (p-1)/(p v)) on L/p layers times p
    p, v = 8, 4
    assert in_flight_micro_batches(0, p, 64, v) == pytest.approx(p * (1 + (p - 1) / (p * v)))


def test_pipeline_bubble():
    t, p, m = 0.1, 8, 32
    assert pipeline_time_s([t] * p, m) == pytest.approx((m + p - 1) * t)
    assert bubble_time_s([t] * p, m) / (m * t) == pytest.approx((p - 1) / m)
    assert bubble_time_s([t] * p, m, 4) / (m * t) == pytest.approx((p - 1) / (4 * m))
    # uneven stages: the slowest stage paces the steady state
    assert pipeline_time_s([0.1, 0.2, 0.1], 10) == pytest.approx(9 * 0.2 + 0.4)


LINK = Link(bandwidth_bytes_per_s=100e9, latency_s=5e-6, tier="test", crosses_nodes=False)


def test_ring_collectives_follow_nccl_tests_bus_bandwidth():
    size, n = 1e9, 8
    # NCCL picks ring or tree: the bandwidth term is the same, latency the smaller of the two
    assert comm.all_reduce_s(size, n, LINK) == pytest.approx(
        2 * (n - 1) / n * size / 100e9 + min(2 * (n - 1), 2 * 3 + 2) * 5e-6)
    assert comm.all_gather_s(size, n, LINK) == pytest.approx((n - 1) / n * size / 100e9 + 7 * 5e-6)
    assert comm.all_to_all_s(size, n, LINK) == pytest.approx((n - 1) / n * size / 100e9 + 7 * 5e-6)
    assert comm.all_reduce_s(size, 1, LINK) == 0.0
    # sequence parallelism moves the same volume as the all-reduce (Korthikanti §4.2.2)
    assert comm.tp_collective_s(size, n, LINK, True) == pytest.approx(
        comm.all_reduce_s(size, n, LINK), rel=1e-2)


def test_tree_latency_wins_for_large_groups():
    n = 1024
    ring_latency = 2 * (n - 1) * 5e-6
    assert comm.all_reduce_s(1.0, n, LINK) < ring_latency
    assert comm.all_reduce_s(1.0, n, LINK) >= 2 * math.log2(n) * 5e-6


def test_eager_attention_dropout_bytes_per_score():
    # Megatron-LM's attention core runs FusedScaleMaskSoftmax, then attention_dropout (an
    # unfused torch.nn.Dropout) on the b x a/t x s x s probabilities. Per 16-bit score element:
    # forward reads the probabilities (2 B), writes the dropped ones (2 B) and a bool mask
    # (1 B); backward reads the mask (1 B) and the gradient (2 B), writes the gradient (2 B).
    from clusters.loader import gpu_preset
    from planner.cost.compute import EAGER_DROPOUT_BYTES, Shard, hbm_bytes_per_s, layer_compute

    assert EAGER_DROPOUT_BYTES == (2 + 2 + 1, 1 + 2 + 2)
    layer = gpt_block(2048, 16)
    shard = Shard(micro_batch=2, seq_len=1024, tp=2, dtype="bf16")
    gpu = gpu_preset("a100-sxm4-80gb")
    hbm = hbm_bytes_per_s(gpu)
    scores = 2 * (16 // 2) * 1024 * 1024
    assert scores == 16_777_216
    core_bytes = 83_886_080  # 5 B x 16,777,216 scores, forward and backward each
    hidden_bytes = 25_165_824  # the hidden dropouts' 6 B x h per token: 6 x 2048 x 2048 tokens

    def run(kernel, dropout):
        return layer_compute(layer, shard, gpu, RuntimeOptions(attention_kernel=kernel,
                                                               dropout=dropout))

    off, on = run("eager", False), run("eager", True)
    assert on.attn_core_fwd_s - off.attn_core_fwd_s == pytest.approx(core_bytes / hbm, rel=1e-9)
    assert on.attn_core_bwd_s - off.attn_core_bwd_s == pytest.approx(core_bytes / hbm, rel=1e-9)
    assert on.fwd_s - off.fwd_s == pytest.approx((core_bytes + hidden_bytes) / hbm, rel=1e-9)
    assert on.bwd_s - off.bwd_s == pytest.approx((core_bytes + 2 * hidden_bytes) / hbm, rel=1e-9)
    # selective recomputation repeats the attention core, dropout included
    assert on.recompute_s(Recompute.SELECTIVE) - off.recompute_s(Recompute.SELECTIVE) \
        == pytest.approx(core_bytes / hbm, rel=1e-9)
    # flash kernels apply the dropout inside the kernel: no traffic on the core
    off, on = run("flash", False), run("flash", True)
    assert on.attn_core_fwd_s == off.attn_core_fwd_s and on.attn_core_bwd_s == off.attn_core_bwd_s
    assert on.fwd_s - off.fwd_s == pytest.approx(hidden_bytes / hbm, rel=1e-9)


def test_eager_attention_gemms_do_not_hide_their_score_traffic():
    # The eager core's batched GEMMs are charged compute + HBM traffic, not the roofline's max.
    # Shape: micro-batch 2 x 16 heads / tp 2 = 16 batched GEMMs, s = 1024, head_dim 128, bf16.
    # QK^T (1024 x 1024 x 128) moves Q and K (1024 x 128 each) and writes the 1024 x 1024
    # scores; PV (1024 x 128 x 1024) reads the probabilities and V, writes the context:
    # 16 x (2 x 131,072 + 1,048,576) = 20,971,520 elements, 41,943,040 bytes, each.
    from clusters.loader import gpu_preset
    from planner.cost.compute import (EAGER_SOFTMAX_BYTES, KERNEL_LAUNCH_S, Shard,
                                      _tile_efficiency, hbm_bytes_per_s, layer_compute)

    layer = gpt_block(2048, 16)
    shard = Shard(micro_batch=2, seq_len=1024, tp=2, dtype="bf16")
    gpu = gpu_preset("a100-sxm4-80gb")
    hbm = hbm_bytes_per_s(gpu)
    flops = 2 * 1024 * 1024 * 128 * 16  # each of the two GEMMs
    traffic_s = 41_943_040 / hbm
    math_s = sum(flops / (gpu.peak_flops("bf16") * gpu.matmul_efficiency
                          * _tile_efficiency(m, n, k, 16, gpu.num_sms))
                 for m, n, k in ((1024, 1024, 128), (1024, 128, 1024)))
    softmax_s = EAGER_SOFTMAX_BYTES[0] * 16 * 1024 * 1024 / hbm
    got = layer_compute(layer, shard, gpu, RuntimeOptions(attention_kernel="eager"))
    want = math_s + 2 * traffic_s + 2 * KERNEL_LAUNCH_S + softmax_s
    assert got.attn_core_fwd_s == pytest.approx(want, rel=1e-9)


# FlashAttention-2 (Dao 2023, arXiv:2307.08691) Fig. 4 (a) and (b), "Pytorch" bars: standard
# attention (baddbmm, softmax, bmm; benchmarks/benchmark_flash_attention.py of
# Dao-AILab/flash-attention: no dropout, no mask) forward + backward on an A100 80GB SXM4, fp16,
# batch x sequence = 16k tokens, hidden 2048, in TFLOP/s of 3.5 x 4 x b s^2 a d FLOPs.
FA2_PYTORCH_TFLOPS = {64: {512: 36, 1024: 40, 2048: 43, 4096: 45, 8192: 46},
                      128: {512: 53, 1024: 67, 2048: 76, 4096: 79, 8192: 86}}


def test_eager_attention_core_reads_the_published_pytorch_attention():
    from clusters.loader import gpu_preset
    from planner.cost.compute import Shard, layer_compute

    gpu = gpu_preset("a100-sxm4-80gb")
    errors = []
    for head_dim, runs in FA2_PYTORCH_TFLOPS.items():
        heads = 2048 // head_dim
        layer = gpt_block(2048, heads)
        for seq, measured in runs.items():
            batch = 16_384 // seq
            lc = layer_compute(layer, Shard(micro_batch=batch, seq_len=seq, dtype="fp16"), gpu,
                               RuntimeOptions(attention_kernel="eager"))
            tflops = 3.5 * 4 * batch * seq * seq * heads * head_dim / lc.attn_core_s / 1e12
            errors.append(tflops / measured - 1)
    # the roofline's max (math hiding the score traffic) reads these 61-94 % fast
    assert max(abs(e) for e in errors) < 0.35
    assert sorted(abs(e) for e in errors)[len(errors) // 2] < 0.10
