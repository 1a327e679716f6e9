"""MoE cost terms: the folded expert mesh, the tokens each GPU's experts compute, the dispatch /
combine all-to-all over the topology, routing imbalance and capacity, expert states over edp."""
from __future__ import annotations

from dataclasses import replace

import pytest

from clusters import load_cluster
from models import load_model
from models.native import build_native
from planner.config import ParallelConfig, RuntimeOptions
from planner.cost import moe
from planner.cost.compute import Shard, layer_gemms
from planner.cost.context import make_context
from planner.cost.model import evaluate
from planner.cost.terms import layer_terms
from planner.errors import ErrorKind, PlannerError
from planner.mesh import Mesh
from planner.moe import MoeOptions
from planner.strategy import LayerOption, Recompute, uniform

MOE = build_native({"name": "moe", "num_layers": 4, "hidden_size": 1024, "num_heads": 8,
                    "vocab_size": 4096, "seq_len": 2048,
                    "moe": {"num_experts": 16, "top_k": 4, "expert_ffn_hidden_size": 1024}})
H100 = load_cluster("dgx-h100", nodes=2)  # 16 GPUs, 2 NVLink domains


@pytest.fixture(autouse=True)
def no_host_floor(monkeypatch):
    """These tests take the device-side terms apart; the host floor (a max over the layer's
    whole time, tested on its own below) would mask them where the tiny layers are host-bound."""
    from planner.cost import compute, terms
    monkeypatch.setattr(moe, "HOST_PER_LAYER_PASS_S", 0.0)
    monkeypatch.setattr(moe, "DROPLESS_SYNC_S", 0.0)
    for fn in (compute._layer_compute, terms._layer_terms, terms._layer_work,
               terms._config_terms):
        fn.cache_clear()
    yield
    for fn in (compute._layer_compute, terms._layer_terms, terms._layer_work,
               terms._config_terms):
        fn.cache_clear()


def config(**kw) -> ParallelConfig:
    base = dict(tp=1, pp=1, dp=16, global_batch=32, seq_len=2048)
    base.update(kw)
    return ParallelConfig(**base)


def block_terms(cfg: ParallelConfig, options: RuntimeOptions = RuntimeOptions(),
                recompute: Recompute = Recompute.NONE, cluster=H100):
    ctx = make_context(MOE, cluster, cfg, options)
    return ctx, layer_terms(ctx, MOE.layers[1], LayerOption(recompute))


# -- the folded expert mesh --------------------------------------------------------------------

def test_expert_mesh_partitions_each_stage():
    mesh = Mesh(pp=2, dp=4, cp=2, tp=2, ep=4, etp=1)  # stage of 16 GPUs: etp 1 x ep 4 x edp 4
    assert mesh.expert_dp == 4 and mesh.expert_shard_degree == 4
    for dim, size in (("etp", 1), ("ep", 4), ("edp", 4)):
        groups = {mesh.group(dim, r) for r in range(mesh.num_gpus)}
        assert all(len(g) == size for g in groups)
        assert sorted(r for g in groups for r in g) == list(range(32))  # a partition
    assert mesh.group("ep", 0) == (0, 1, 2, 3)  # EP spans the TP and CP ranks
    assert mesh.group("edp", 0) == (0, 4, 8, 12)
    assert mesh.group("ep", 16) == (16, 17, 18, 19)  # second pipeline stage


def test_expert_tp_equal_tp_keeps_ep_inside_dp_x_cp():
    """Megatron-Core's default (etp = tp): EP groups are ep consecutive dp x cp members."""
    mesh = Mesh(dp=4, cp=1, tp=2, ep=2)
    assert mesh.expert_tp == 2 and mesh.stride("ep") == 2
    assert mesh.group("ep", 0) == (0, 2) and mesh.group("ep", 5) == (5, 7)
    assert mesh.expert_dp == mesh.dp * mesh.cp // mesh.ep == 2


def test_expert_mesh_must_fold_into_the_stage():
    with pytest.raises(PlannerError) as info:
        config(tp=2, dp=8, ep=16, etp=2).validate(MOE, H100)  # 2 x 16 > 16 GPUs
    assert info.value.kind is ErrorKind.INVALID_INPUT and "etp x ep" in info.value.message
    config(tp=2, dp=8, ep=16, etp=1).validate(MOE, H100)  # EP spans the TP ranks
    with pytest.raises(PlannerError):
        config(ep=32).validate(MOE, H100)
    with pytest.raises(PlannerError):  # etp must divide the expert width
        replace(config(tp=2, dp=8, ep=2, etp=3)).validate(MOE, H100)


# -- tokens and compute ------------------------------------------------------------------------

def _expert_flops(shard: Shard) -> float:
    width = 1024 // shard.expert_tp  # the routed experts' GEMMs: gate/up (n = 2F/etp), down
    gemms = layer_gemms(MOE.layers[1], shard)
    return sum(g.flops for g in gemms[-2:] if g.n == 2 * width or g.k == width)


@pytest.mark.parametrize("tp,etp,ep", [(1, 1, 1), (1, 1, 4), (2, 1, 8), (2, 2, 4), (4, 2, 16)])
def test_expert_flops_per_gpu_do_not_depend_on_the_expert_mesh(tp, etp, ep):
    """tokens / tp x top_k copies x 6 h F / ... per GPU: 2 h (2F) + 2 F h per copy forward."""
    shard = Shard(2, 2048, tp=tp, ep=ep, sp=tp > 1, etp=etp)
    copies = 2 * 2048 / tp * 4
    assert _expert_flops(shard) == pytest.approx(copies * 6 * 1024 * 1024, rel=1e-9)
    local_experts = 16 / ep
    assert moe.tokens_per_expert(4096, MOE.layers[1].mlp, tp, etp, ep) * local_experts == \
        pytest.approx(copies * etp)  # each ETP rank computes its group's copies at F / etp


def test_imbalance_and_capacity_scale_the_busiest_rank():
    assert MoeOptions(imbalance=1.5).load_factor == 1.5
    assert MoeOptions(imbalance=1.5, capacity_factor=1.25).load_factor == 1.25
    assert MoeOptions(imbalance=1.0, capacity_factor=2.0).load_factor == 1.0
    base = Shard(2, 2048, ep=4)
    assert _expert_flops(replace(base, expert_load=1.5)) == pytest.approx(1.5 * _expert_flops(base))
    _, balanced = block_terms(config(ep=8))
    _, skewed = block_terms(config(ep=8), RuntimeOptions(moe=MoeOptions(imbalance=1.5)))
    assert skewed.fwd_s > balanced.fwd_s and skewed.comm_s > balanced.comm_s
    assert skewed.act_stored_bytes > balanced.act_stored_bytes


@pytest.mark.parametrize("bad", [dict(imbalance=0.5), dict(capacity_factor=-1),
                                 dict(a2a_overlap=1.5), dict(dispatcher="nccl"),
                                 dict(imbalance=float("nan"))])
def test_moe_options_are_validated(bad):
    with pytest.raises(PlannerError) as info:
        MoeOptions(**bad).validate()
    assert info.value.kind is ErrorKind.INVALID_INPUT


# -- dispatch and combine ----------------------------------------------------------------------

def test_no_all_to_all_without_expert_parallelism():
    _, one = block_terms(config(ep=1))
    _, eight = block_terms(config(ep=8))
    assert eight.comm_s > one.comm_s
    assert one.comm_s == 0.0  # tp 1, cp 1: nothing else communicates inside the layer


def test_all_to_all_inside_a_node_is_faster_than_across_nodes():
    ctx8, inside = block_terms(config(ep=8))
    ctx16, across = block_terms(config(ep=16))
    assert ctx8.links.ep_domains == 1 and ctx16.links.ep_domains == 2
    assert not ctx8.links.ep.crosses_nodes and ctx16.links.ep.crosses_nodes
    assert across.comm_s > 2 * inside.comm_s


def test_flat_all_to_all_is_the_collective_over_the_ep_link():
    ctx, t = block_terms(config(ep=16))
    mlp = MOE.layers[1].mlp
    elements = moe.dispatch_elements(2048, 1024, mlp, 1)
    assert elements == 2048 * 4 * 1024
    one = moe.all_to_all_s(elements, 2, mlp, 16, MoeOptions(), ctx.links.ep, ctx.links.ep_intra,
                           ctx.links.ep_inter, ctx.links.ep_domains)
    from planner.cost import comm
    assert one == comm.all_to_all_s(elements * 2, 16, ctx.links.ep)
    # dispatch + combine, forward and backward, less the default overlap
    overlap = MoeOptions().a2a_overlap
    assert t.comm_s == pytest.approx(4 * one * (1 - overlap))


def test_hierarchical_dispatch_sends_each_token_once_per_remote_domain():
    assert moe.remote_domain_copies(1, 8) == 0.0
    assert moe.remote_domain_copies(2, 1) == pytest.approx(0.5)
    assert moe.remote_domain_copies(8, 8) == pytest.approx(7 * (1 - (7 / 8) ** 8))
    assert moe.remote_domain_copies(1000, 8) == pytest.approx(8, rel=0.01)
    ds = load_model("deepseek-v3")
    h800 = load_cluster("hgx-h800", nodes=256)
    cfg = ParallelConfig(tp=1, pp=16, dp=128, ep=64, global_batch=15360, seq_len=4096,
                         zero_stage=1, dtype="fp8")
    block = next(b for b in ds.blocks() if b.mlp.is_moe)
    times = {}
    for dispatcher in ("alltoall", "deepep"):
        ctx = make_context(ds, h800, cfg, RuntimeOptions(moe=MoeOptions(dispatcher=dispatcher)))
        times[dispatcher] = layer_terms(ctx, block, LayerOption()).comm_s
        assert ctx.links.ep_domains == 8  # EP64 spans 8 nodes (DeepSeek-V3 report §3.2.2)
    assert times["deepep"] < 0.8 * times["alltoall"]


def test_node_limited_routing_crosses_fewer_domains():
    """DeepSeek-V3's node-limited routing (report §2.1.2, §4.2: each token to at most 4 nodes;
    HF n_group 8 / topk_group 4): on EP64 over 8 nodes the 8 groups are the 8 nodes, a token's
    top-8 experts lie in 4 of them: 4 (1 - (3/4)^8) domains hit, 7/8 of them remote."""
    limited = 4 * (1 - (3 / 4) ** 8) * 7 / 8
    assert moe.remote_domain_copies(8, 8, 8, 4) == pytest.approx(limited)
    assert limited == pytest.approx(3.15, abs=0.005)
    assert moe.remote_domain_copies(8, 8) == pytest.approx(4.59, abs=0.005)  # unlimited
    # unlimited routing (all groups kept, or one group) is the formula without groups
    for groups in ((8, 8), (1, 1)):
        assert moe.remote_domain_copies(8, 8, *groups) == pytest.approx(
            moe.remote_domain_copies(8, 8))
    # two groups per domain (EP over 4 nodes): a domain is missed when neither of its 2 groups
    # is among the 4 kept of 8, C(6,4)/C(8,4) = 15/70
    reach = 4 * (1 - 15 / 70)
    assert moe.reachable_units(4, 8, 4) == pytest.approx(reach)
    assert moe.remote_domain_copies(4, 8, 8, 4) == pytest.approx(
        reach * (1 - (1 - 1 / reach) ** 8) * 3 / 4)
    # a group spanning several ranks: 4 kept groups of 8 ranks each on EP64 = 32 ranks
    assert moe.distinct_ranks(64, 8, 8, 4) == pytest.approx(32 * (1 - (31 / 32) ** 8))
    # groups that do not tile the units reach them all (the conservative side)
    assert moe.reachable_units(6, 8, 4) == 6.0
    # the preset carries it (read from config.json), and the deepep dispatch is shorter for it
    ds = load_model("deepseek-v3")
    mlp = next(b for b in ds.blocks() if b.mlp.is_moe).mlp
    assert (mlp.expert_groups, mlp.groups_per_token) == (8, 4) and mlp.group_limited
    h800 = load_cluster("hgx-h800", nodes=256)
    cfg = ParallelConfig(tp=1, pp=16, dp=128, ep=64, global_batch=15360, seq_len=4096,
                         zero_stage=1, dtype="fp8")
    ctx = make_context(ds, h800, cfg, RuntimeOptions(moe=MoeOptions(dispatcher="deepep")))
    links = ctx.links
    args = (moe.dispatch_elements(4096, 7168, mlp, 1), 2, None, 64, ctx.options.moe, links.ep,
            links.ep_intra, links.ep_inter, links.ep_domains)
    limited_s = moe.all_to_all_s(*args[:2], mlp, *args[3:])
    free_s = moe.all_to_all_s(*args[:2], replace(mlp, groups_per_token=8), *args[3:])
    latency_s = 7 * links.ep_inter.latency_s  # IB-bound: the network phase sets the time
    assert limited_s - latency_s == pytest.approx(
        (free_s - latency_s) * limited / (7 * (1 - (7 / 8) ** 8)), rel=1e-6)


def test_deepep_hidden_all_to_all_costs_its_sms():
    """DeepEP's kernels hold 20 SMs while they run (DeepSeek-V3 report §3.2.2; deep_ep
    Buffer.num_sms, Megatron --moe-deepep-num-sms 20): the compute they overlap runs on the
    other SMs, so the hidden share still costs 20 / num_sms of its length; the flat NCCL
    all-to-all's hidden share costs nothing here (its SM use is the fitted comm_slowdown)."""
    gpu_sms = H100.gpu.num_sms
    assert gpu_sms == 132
    opts = {o: RuntimeOptions(moe=MoeOptions(dispatcher="deepep", a2a_overlap=o))
            for o in (0.0, 0.9)}
    _, exposed = block_terms(config(ep=16), opts[0.0])
    _, hidden = block_terms(config(ep=16), opts[0.9])
    assert hidden.comm_s == pytest.approx(exposed.comm_s * (0.1 + 0.9 * 20 / 132))
    assert moe.sm_reserve_share(MoeOptions(dispatcher="deepep"), 132) == pytest.approx(20 / 132)
    assert moe.sm_reserve_share(MoeOptions(dispatcher="alltoall"), 132) == 0.0
    flat = {o: block_terms(config(ep=16), RuntimeOptions(moe=MoeOptions(a2a_overlap=o)))[1]
            for o in (0.0, 0.9)}
    assert flat[0.9].comm_s == pytest.approx(0.1 * flat[0.0].comm_s)


def test_a2a_overlap_hides_a_fraction_and_recompute_repeats_the_forward():
    none = RuntimeOptions(moe=MoeOptions(a2a_overlap=0.0))
    _, plain = block_terms(config(ep=16), none)
    _, half = block_terms(config(ep=16), RuntimeOptions(moe=MoeOptions(a2a_overlap=0.5)))
    assert half.comm_s == pytest.approx(0.5 * plain.comm_s)
    _, full = block_terms(config(ep=16), none, recompute=Recompute.FULL)
    assert full.comm_s == pytest.approx(1.5 * plain.comm_s)
    _, dropping = block_terms(config(ep=16), RuntimeOptions(moe=MoeOptions(capacity_factor=1.0,
                                                                           a2a_overlap=0.0)))
    assert dropping.comm_s == pytest.approx(plain.comm_s)  # capacity 1 = the balanced share


def test_expert_tensor_parallel_gathers_over_its_group():
    _, no_etp = block_terms(config(tp=2, dp=8, ep=8, etp=1, sp=True))
    _, etp2 = block_terms(config(tp=2, dp=8, ep=8, etp=2, sp=True))
    assert etp2.comm_s > no_etp.comm_s  # + all-gather / reduce-scatter over the ETP pair


# -- memory ------------------------------------------------------------------------------------

def test_expert_states_are_sharded_over_edp():
    cfg = config(ep=4, zero_stage=1)  # edp = 16 / 4 = 4
    ctx, t = block_terms(cfg)
    layer = MOE.layers[1]
    expert = layer.expert_params / 4
    dense = layer.params - layer.expert_params
    assert t.expert_params == expert and t.dense_params == dense
    assert t.optimizer_bytes == pytest.approx(12 * dense / 16 + 12 * expert / 4)
    assert t.params_bytes == pytest.approx(2 * (dense + expert))
    assert ctx.links.edp.crosses_nodes  # edp members are 4 ranks apart x 4: two nodes


def test_dispatch_buffers_are_working_memory():
    _, t = block_terms(config(ep=8))
    buffers = moe.dispatch_buffer_bytes(2048, 1024, MOE.layers[1].mlp, 1, 1, 2, MoeOptions())
    assert buffers == 2048 * 4 * 1024 * 2 * 2  # send and receive
    assert t.act_working_bytes == pytest.approx(buffers)


def test_published_deepseek_v3_layout_is_evaluated():
    """DeepSeek-V3 report §3.2: PP16, EP64 over 8 nodes, ZeRO-1 on 2,048 H800."""
    ds = load_model("deepseek-v3")
    h800 = load_cluster("hgx-h800", nodes=256)
    cfg = ParallelConfig(tp=1, pp=16, dp=128, ep=64, global_batch=15360, seq_len=4096,
                         zero_stage=1, dtype="fp8")
    ev = evaluate(ds, h800, cfg, uniform(ds, cfg, Recompute.FULL))
    assert ev.fits and cfg.mesh.expert_dp == 2


# -- command line and plan file ----------------------------------------------------------------

def _cli(capsys, *args: str):
    import json

    from cli.main import main
    with pytest.raises(SystemExit) as done:
        main(list(args))
    out, err = capsys.readouterr()
    return done.value.code, (json.loads(out) if out.strip().startswith("{") else None), err


def test_evaluate_takes_ep_and_etp_and_reports_the_expert_mesh(capsys):
    code, doc, err = _cli(capsys, "evaluate", "-m", "qwen3-30b-a3b", "-c", "dgx-h100", "--nodes", "2",
                          "--global-batch", "64", "--tp", "2", "--pp", "1", "--ep", "16",
                          "--etp", "1", "--moe-imbalance", "1.2", "--json")
    assert code == 0, err
    p = doc["parallelism"]
    assert (p["tp"], p["dp"], p["ep"], p["etp"], p["edp"]) == (2, 8, 16, 1, 1)
    assert doc["runtime"]["moe"]["imbalance"] == 1.2
    code, _, err = _cli(capsys, "evaluate", "-m", "qwen3-30b-a3b", "-c", "dgx-h100", "--nodes", "2",
                        "--global-batch", "64", "--tp", "2", "--pp", "1", "--ep", "16",
                        "--etp", "2")
    assert code == 2 and "etp x ep" in err


def test_plan_writes_the_expert_mesh_and_check_reads_it_back(tmp_path, capsys):
    out = tmp_path / "plan.json"
    code, _, err = _cli(capsys, "plan", "-m", "tiny-moe", "-c", "tiny", "--global-batch", "16",
                        "--pin", "pp=1", "-o", str(out))
    assert code == 0, err
    import json
    p = json.loads(out.read_text())["parallelism"]
    assert p["etp"] * p["ep"] * p["edp"] == p["tp"] * p["cp"] * p["dp"]
    code, _, err = _cli(capsys, "check", str(out))
    assert code == 0, err


def test_host_floor_binds_small_micro_batches_only(monkeypatch):
    """A MoE layer pass takes at least the host's time to issue it: the floor lifts a tiny
    micro-batch's layer to passes x the per-pass time (3 passes under full recomputation) and
    leaves a layer whose device work is longer untouched. Dropless routing adds the read-back
    of the token counts to each pass; a capacity factor does not read back; a CUDA graph that
    captures the layer removes the floor. The read-back also waits for the device to run the
    forward up to the router (the layer without its MLP), once per forward pass, where that
    takes longer than the host's issue of the same kernels (a quarter of the pass's here)."""
    monkeypatch.setattr(moe, "HOST_PER_LAYER_PASS_S", 4e-3)
    monkeypatch.setattr(moe, "DROPLESS_SYNC_S", 1e-3)
    monkeypatch.setattr(moe, "PRE_SYNC_LAUNCHES", 1)
    monkeypatch.setattr(moe, "POST_SYNC_LAUNCHES", 3)
    from planner.cost import terms
    from planner.cost.compute import layer_compute
    terms._layer_terms.cache_clear()
    terms._layer_work.cache_clear()  # (shared between contexts: keyed by value)
    ctx, small = block_terms(config(ep=4))
    attention = replace(MOE.layers[1], mlp=None)
    pre_sync_s = layer_compute(attention, ctx.shard, H100.gpu, ctx.options).fwd_s
    assert 0 < pre_sync_s < 1e-3  # hidden behind the host's 1 ms issue of the same kernels
    assert small.time_s == pytest.approx(2 * 5e-3)
    _, full = block_terms(config(ep=4), recompute=Recompute.FULL)
    assert full.time_s == pytest.approx(3 * 5e-3)
    _, selective = block_terms(config(ep=4), recompute=Recompute.SELECTIVE)
    assert selective.time_s > small.time_s  # re-issues the attention core
    _, dropping = block_terms(config(ep=4), RuntimeOptions(moe=MoeOptions(capacity_factor=1.0)))
    assert dropping.time_s == pytest.approx(2 * 4e-3)
    for graph in (MoeOptions(cuda_graph="full_iteration"),
                  MoeOptions(capacity_factor=1.0, cuda_graph="moe")):
        _, captured = block_terms(config(ep=4), RuntimeOptions(moe=graph))
        assert captured.time_s < 2 * 4e-3  # the device time alone
    assert moe.host_floor_s(1.0, 2, pre_sync_gpu_s=0.1, forward_gpu_s=0.4) == 0.0
    assert moe.host_floor_s(0.0, 3) == pytest.approx(3 * 5e-3)
    assert moe.host_floor_s(0.0, 3, options=MoeOptions(capacity_factor=1.25)) == \
        pytest.approx(3 * 4e-3)
    assert moe.host_floor_s(0.0, 3, options=MoeOptions(cuda_graph="full_iteration")) == 0.0
    # the pre-sync device time beyond the host's pre-sync issue (1 ms) adds where the host binds
    assert moe.host_floor_s(0.0, 2, pre_sync_gpu_s=2e-3) == pytest.approx(2 * 5e-3 + 1e-3)
    assert moe.host_floor_s(20e-3, 2, pre_sync_gpu_s=2e-3, forward_gpu_s=7e-3) == 0.0
    assert moe.host_floor_s(0.0, 2, options=MoeOptions(capacity_factor=1.0),
                            pre_sync_gpu_s=2e-3) == pytest.approx(2 * 4e-3)


def test_synchronised_forward_is_its_own_cycle(monkeypatch):
    """The dropless read-back drains the device queue in each forward pass, so a host-bound
    forward cannot hide behind a device-bound backward; inside the forward, the host issues the
    pre-sync kernels while the device runs them, blocks on the counts, then issues the post-sync
    kernels while the device runs those: max(h_pre, d_pre) + max(h_post, d_post), the backward
    max(host, its device time), and the two add. Hand-computed: 4 ms of issue per pass, a
    quarter of its launches before the sync (h_pre 1 ms, h_post 3 + the read-back's 1 ms = 4
    ms); 1 ms before the router, 3 ms forward and 7 ms backward on the device:
    max(1, 1) + max(4, 2) + max(5, 7) = 12 ms, 2 ms beyond the device's 10 (the host's whole
    issue before the pre-sync device time, max(5 + 1, 3) + 7, gave 3 ms)."""
    monkeypatch.setattr(moe, "HOST_PER_LAYER_PASS_S", 4e-3)
    monkeypatch.setattr(moe, "DROPLESS_SYNC_S", 1e-3)
    monkeypatch.setattr(moe, "PRE_SYNC_LAUNCHES", 1)
    monkeypatch.setattr(moe, "POST_SYNC_LAUNCHES", 3)
    assert moe.host_floor_s(10e-3, 2, pre_sync_gpu_s=1e-3, forward_gpu_s=3e-3,
                            sync_passes=1) == pytest.approx(2e-3)
    # full recomputation: the recomputed forward syncs again, 2 x (1 + 4) + max(5, 7) - 13
    assert moe.host_floor_s(13e-3, 3, pre_sync_gpu_s=1e-3, forward_gpu_s=3e-3,
                            sync_passes=2) == pytest.approx(4e-3)
    # long attention before the router (Llama 4 Scout at 8,192 tokens): 4 ms pre-sync, 6 ms
    # forward, 12 ms backward: max(1, 4) + max(4, 2) + max(5, 12) - 18 = 2 ms (the host's whole
    # issue ahead of the pre-sync device time, max(5 + 4, 6) + 12 - 18, gave 3 ms)
    assert moe.host_floor_s(18e-3, 2, pre_sync_gpu_s=4e-3, forward_gpu_s=6e-3) == \
        pytest.approx(2e-3)
    # a device-bound forward hides its host time: max(1, 1) + max(4, 7) + max(5, 7) - 15 = 0
    assert moe.host_floor_s(15e-3, 2, pre_sync_gpu_s=1e-3, forward_gpu_s=8e-3) == 0.0
    # static shapes (capacity factor): no read-back, the host runs ahead across passes
    assert moe.host_floor_s(10e-3, 2, options=MoeOptions(capacity_factor=1.0),
                            pre_sync_gpu_s=1e-3, forward_gpu_s=3e-3) == 0.0


def test_the_host_wait_splits_into_forward_and_backward(monkeypatch):
    """The device's wait on the host, by phase (what side-stream communication can hide in,
    planner.cost.terms.step_time): the same constants as above, hand-computed. The forward
    waits max(1, 1) + max(4, 2) - 3 = 2 ms; a 3 ms backward waits max(5, 3) - 3 = 2 ms more;
    a 7 ms backward none; a recomputed forward's wait is in the backward phase; without a
    read-back the wait splits as the host's issue does."""
    monkeypatch.setattr(moe, "HOST_PER_LAYER_PASS_S", 4e-3)
    monkeypatch.setattr(moe, "DROPLESS_SYNC_S", 1e-3)
    monkeypatch.setattr(moe, "PRE_SYNC_LAUNCHES", 1)
    monkeypatch.setattr(moe, "POST_SYNC_LAUNCHES", 3)
    split = moe.host_wait_split_s
    assert split(6e-3, 2, pre_sync_gpu_s=1e-3, forward_gpu_s=3e-3) == \
        pytest.approx((2e-3, 2e-3))
    assert split(10e-3, 2, pre_sync_gpu_s=1e-3, forward_gpu_s=3e-3) == \
        pytest.approx((2e-3, 0.0))
    assert split(13e-3, 3, pre_sync_gpu_s=1e-3, forward_gpu_s=3e-3, sync_passes=2) == \
        pytest.approx((2e-3, 2e-3))
    assert split(15e-3, 2, pre_sync_gpu_s=1e-3, forward_gpu_s=8e-3) == (0.0, 0.0)
    # static shapes: 2 x 4 ms of issue over 6 ms of device work, half of the 2 ms each
    assert split(6e-3, 2, options=MoeOptions(capacity_factor=1.0), pre_sync_gpu_s=1e-3,
                 forward_gpu_s=3e-3) == pytest.approx((1e-3, 1e-3))
    for args in ((6e-3, 2), (10e-3, 2), (15e-3, 2)):  # the parts add up to the floor
        assert sum(split(*args, pre_sync_gpu_s=1e-3, forward_gpu_s=3e-3)) == \
            pytest.approx(moe.host_floor_s(*args, pre_sync_gpu_s=1e-3, forward_gpu_s=3e-3))


def test_cuda_graph_options_are_checked_and_size_sync_free_buffers():
    with pytest.raises(PlannerError):  # a MoE-layer graph needs static shapes
        MoeOptions(cuda_graph="moe").validate()
    with pytest.raises(PlannerError):
        MoeOptions(cuda_graph="layers").validate()
    MoeOptions(capacity_factor=1.0, cuda_graph="moe").validate()
    sync_free = MoeOptions(cuda_graph="full_iteration")
    assert not sync_free.host_synchronised and sync_free.host_captured
    assert MoeOptions().host_synchronised and not MoeOptions(capacity_factor=1.0).host_synchronised
    # sync-free dropless buffers are pre-sized at the rank capacity (1.5 x the balanced share)
    mlp = MOE.layers[1].mlp
    base = moe.dispatch_buffer_bytes(2048, 1024, mlp, 1, 1, 2, MoeOptions())
    assert moe.dispatch_buffer_bytes(2048, 1024, mlp, 1, 1, 2, sync_free) == \
        pytest.approx(1.5 * base)


def test_fp8_expert_casts_cost_their_hbm_traffic():
    """FP8 expert GEMMs quantise their inputs (the permuted token before FC1, the activation
    before FC2): 2 bytes read, a row-wise and a column-wise FP8 copy written, per element and
    routed copy; nothing in 16 bits, nothing for a dense MLP. The MoE layer's element-wise
    bytes grow by exactly that traffic."""
    from planner.cost.compute import elementwise_bytes
    mlp = MOE.layers[1].mlp
    assert moe.expert_cast_bytes(mlp, 1024, 1, "bf16") == 0.0
    assert moe.expert_cast_bytes(mlp, 1024, 1, "fp8") == 4.0 * (1024 + 1024)
    assert moe.expert_cast_bytes(mlp, 1024, 2, "fp8") == 4.0 * (1024 + 512)
    layer, opts = MOE.layers[1], RuntimeOptions()
    shard = Shard(micro_batch=1, seq_len=2048, ep=4)
    fp8 = replace(shard, dtype="fp8")
    copies = moe.routed_tokens(shard.tokens, mlp, 1, 1)
    assert elementwise_bytes(layer, fp8, opts) - elementwise_bytes(layer, shard, opts) == \
        pytest.approx(copies * moe.expert_cast_bytes(mlp, 1024, 1, "fp8"))
