"""Two layer terms checked by hand: the context-parallel KV ring (each exchange hides behind one
attention step of its own pass, one GPU-to-GPU send per hop) and the TP synchronisation points
of a MoE block (the routed experts' TP traffic is the dispatcher's)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from clusters import load_cluster
from models.native import build_native
from planner.config import ParallelConfig, RuntimeOptions
from planner.cost import comm, moe
from planner.cost.compute import LayerCompute
from planner.cost.context import make_context
from planner.cost.terms import _tp_syncs, cp_ring_exposed_s, layer_terms
from planner.strategy import LayerOption, Recompute
from planner.topology import Link

MS = 1e-3


def core(fwd_s: float, bwd_s: float) -> LayerCompute:
    """A layer whose attention core takes ``fwd_s`` forward and ``bwd_s`` backward."""
    return LayerCompute(fwd_s, bwd_s, fwd_s, 0.0, 0.0, attn_core_bwd_s=bwd_s)


ATT = next(build_native({"name": "att", "num_layers": 1, "hidden_size": 1024, "num_heads": 8,
                    "num_kv_heads": 8, "ffn_hidden_size": 4096, "vocab_size": 4096,
                    "seq_len": 4096}).blocks()).attention
# 1,000 tokens x 8 KV heads x (128 + 128) x 2 bytes: 4.096 MB of K and V per exchange
TOKENS, KV_BYTES = 1000, 1000 * 8 * 256 * 2
ONE_GB_PER_S = Link(1e9, 0.0, "nvlink", False)


def test_each_exchange_hides_behind_one_step_of_its_own_pass():
    """cp 4: 3 exchanges per pass. Forward hop 4.096 ms against 8 / 4 = 2 ms of attention per
    step: 3 x 2.096 ms exposed; backward hop (K, V and their gradients) 8.192 ms against
    40 / 4 = 10 ms per step: hidden. The old lumped formula, 3 x 3 hops (36.9 ms) against the
    48 ms core, exposed nothing: the backward's slack absorbed the forward's wait."""
    exposed = cp_ring_exposed_s(ATT, TOKENS, 1, 4, ONE_GB_PER_S, core(8 * MS, 40 * MS))
    assert exposed == pytest.approx(3 * (KV_BYTES / 1e9 - 2 * MS))
    assert 3 * 3 * KV_BYTES / 1e9 < 48 * MS  # what the lumped form compared
    # recomputing the forward (full, or the attention core) repeats its ring
    assert cp_ring_exposed_s(ATT, TOKENS, 1, 4, ONE_GB_PER_S, core(8 * MS, 40 * MS),
                             recomputed=True) == pytest.approx(2 * exposed)
    # a long enough core hides both passes
    assert cp_ring_exposed_s(ATT, TOKENS, 1, 4, ONE_GB_PER_S, core(20 * MS, 40 * MS)) == 0.0


def test_a_ring_hop_gets_one_channel_of_the_group():
    """A CP group of 8 ranks, 4 on each of two nodes (stride 2 on 8-GPU nodes): the group's ring
    bandwidth sums one ring per NIC (4 channels); the hop between the nodes is one GPU's send
    through its own NIC, a quarter of it."""
    cluster = load_cluster("dgx-b200", nodes=4)
    ctx = make_context(build_native({"name": "m", "num_layers": 2, "hidden_size": 1024,
                                     "num_heads": 8, "ffn_hidden_size": 4096,
                                     "vocab_size": 4096, "seq_len": 8192}),
                       cluster, ParallelConfig(tp=2, pp=1, dp=1, cp=8, global_batch=1,
                                               seq_len=8192, sp=True))
    link = ctx.links.cp
    assert link.crosses_nodes and link.channels == 4
    per_nic = link.bandwidth_bytes_per_s / 4
    assert comm.ring_hop_s(1e9, link) == pytest.approx(1e9 / per_nic + link.latency_s)
    assert comm.p2p_s(1e9, link) < comm.ring_hop_s(1e9, link)  # the old per-hop bandwidth
    inside = make_context(ctx.model, cluster, ParallelConfig(
        tp=2, pp=1, dp=4, cp=4, global_batch=4, seq_len=8192, sp=True)).links.cp
    assert not inside.crosses_nodes and inside.channels == 1  # NVSwitch: the whole bandwidth
    assert comm.ring_hop_s(1e9, inside) == pytest.approx(comm.p2p_s(1e9, inside))


def moe_model(shared: int):
    spec = {"num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 1024}
    if shared:
        spec["shared_ffn_hidden_size"] = shared
    return build_native({"name": "moe", "num_layers": 2, "hidden_size": 1024, "num_heads": 8,
                         "vocab_size": 4096, "seq_len": 2048, "moe": spec})


def test_moe_block_has_the_attention_tp_sync_and_its_shared_experts():
    """Under SP a MoE block's routed experts move tokens through the dispatcher (costed by
    planner.cost.moe.dispatch_combine_s); the block's own TP syncs are the attention's and the
    shared experts' dense MLP's. Without SP the count stays the dense block's."""
    routed, with_shared = next(moe_model(0).blocks()), next(moe_model(2048).blocks())
    assert _tp_syncs(routed, sp=True) == (1, 1)
    assert _tp_syncs(with_shared, sp=True) == (2, 2)
    assert _tp_syncs(routed, sp=False) == (2, 2)
    dense = next(build_native({"name": "d", "num_layers": 2, "hidden_size": 1024, "num_heads": 8,
                          "ffn_hidden_size": 4096, "vocab_size": 4096,
                          "seq_len": 2048}).blocks())
    assert _tp_syncs(dense, sp=True) == (2, 2)


def test_moe_block_tp_time_is_one_sync_pair(monkeypatch):
    """The layer's exposed TP time of a routed-only MoE block at tp 2 is one all-gather +
    reduce-scatter forward and backward (no TP overlap), half the dense block's two."""
    monkeypatch.setattr(moe, "HOST_PER_LAYER_PASS_S", 0.0)
    monkeypatch.setattr(moe, "DROPLESS_SYNC_S", 0.0)
    from planner.cost import compute, terms
    for fn in (compute._layer_compute, terms._layer_terms, terms._layer_work):
        fn.cache_clear()
    model = moe_model(0)
    cfg = ParallelConfig(tp=2, pp=1, dp=4, ep=2, global_batch=8, seq_len=2048, sp=True)
    options = RuntimeOptions(tp_comm_overlap=0.0, moe=replace(RuntimeOptions().moe, a2a_overlap=1.0))
    ctx = make_context(model, load_cluster("dgx-h100", nodes=1), cfg, options)
    terms_ = layer_terms(ctx, next(model.blocks()), LayerOption(Recompute.NONE))
    hidden_bytes = ctx.shard.tokens * 1024 * 2
    one = comm.tp_collective_s(hidden_bytes, 2, ctx.links.tp, True)
    assert terms_.comm_s == pytest.approx(2 * one)  # forward + backward; a2a hidden (overlap 1)
