"""Per-layer layouts for MoE blocks: the attention (and shared experts) of a MoE block take
their own tensor degree inside the stage while the routed experts stay on the stage's expert
mesh (etp x ep x edp); the dispatch / combine is the MoE term's, the resharding between
layers the layout term's. The solver's optimum is brute force's on a small MoE instance."""
from __future__ import annotations

import pytest

from clusters import load_cluster
from models import load_model
from planner.config import ParallelConfig
from planner.cost import moe
from planner.cost.context import make_context
from planner.cost.model import evaluate
from planner.cost.terms import layer_terms, layout_view, option_valid, reshard_s
from planner.solve.bruteforce import brute_force
from planner.solve.search import SearchOptions, search
from planner.solve.space import Pins
from planner.strategy import LayerOption, LayerPlacement, Layout, Recompute


@pytest.fixture(scope="module")
def tiny():
    return load_cluster("tiny")


@pytest.fixture(scope="module")
def tiny_moe():
    return load_model("tiny-moe")  # 1 dense + 3 MoE blocks (8 experts top-2 + a shared one)


def context(model, cluster, **kw):
    base = dict(tp=4, pp=1, dp=2, ep=4, etp=1, micro_batch=4, global_batch=16, seq_len=128)
    base.update(kw)
    c = ParallelConfig(**base)
    c.validate(model, cluster)
    return make_context(model, cluster, c)


def test_moe_block_layout_splits_attention_not_experts(tiny, tiny_moe):
    ctx = context(tiny_moe, tiny)
    block = next(x for x in tiny_moe.layers if x.mlp is not None and x.mlp.is_moe)
    mesh = layer_terms(ctx, block, LayerOption())
    rep = layer_terms(ctx, block, LayerOption(layout=Layout.REPLICATED))
    # the routed experts keep the expert mesh: 8 experts / ep 4, whole (etp 1), either way
    assert rep.expert_params == mesh.expert_params == block.expert_params / 4
    # the attention, router and shared expert: split 4 ways under the mesh, whole at tp=1
    dense = block.params - block.expert_params
    assert rep.dense_params == pytest.approx(dense)
    assert mesh.dense_params < dense
    # the MoE term: each GPU dispatches its sequence shard's tokens / tp x top_k copies, the
    # same under every attention degree (the layout's tensor group holds tp'/tp times the
    # mesh's sequences and splits them tp' ways), so the dispatch / combine is unchanged
    view = layout_view(ctx, Layout.REPLICATED)
    assert view.shard.expert_tp == 1 and view.shard.ep == 4  # the stage's expert mesh
    assert moe.dispatch_elements(view.shard.tokens, block.hidden, block.mlp, view.tp) == \
        moe.dispatch_elements(ctx.shard.tokens, block.hidden, block.mlp, 4)
    # the same work per GPU either way, less the mesh's replicated router (no SP: each of the
    # 4 tensor ranks routes all 4 sequences; replicated, each routes its one)
    router = 2 * 3 * block.mlp.num_experts * block.hidden * 128 * 3
    assert mesh.hw_flops - rep.hw_flops == pytest.approx(router)


def test_moe_layout_needs_heads_and_shared_width_to_divide(tiny, tiny_moe):
    ctx = context(tiny_moe, tiny, tp=2, dp=4, ep=2)
    block = tiny_moe.layers[-2]
    assert block.mlp.is_moe
    assert option_valid(ctx, block, LayerOption(layout=Layout.TP_DOUBLE))  # 8 heads, 256 wide
    ctx8 = context(tiny_moe, tiny, tp=8, dp=1, ep=8)
    # tp/2 = 4 divides 8 heads and the 256-wide shared expert; tp*2 = 16 does not exist (dp 1)
    assert option_valid(ctx8, block, LayerOption(layout=Layout.TP_HALF))
    assert not option_valid(ctx8, block, LayerOption(layout=Layout.TP_DOUBLE))


def test_evaluate_charges_resharding_into_and_out_of_moe_blocks(tiny, tiny_moe):
    ctx = context(tiny_moe, tiny)
    c = ctx.config
    rep = LayerOption(layout=Layout.REPLICATED)
    n = len(tiny_moe.layers)  # embedding, dense block, 3 MoE blocks, head
    options = (LayerOption(), LayerOption()) + (rep,) * 3 + (LayerOption(),)
    ev = evaluate(tiny_moe, tiny, c, LayerPlacement((0,) * n, options))
    base = evaluate(tiny_moe, tiny, c, LayerPlacement((0,) * n, (LayerOption(),) * n))
    per_mb = sum(layer_terms(ctx, x, o).time_s - layer_terms(ctx, x, LayerOption()).time_s
                 for x, o in zip(tiny_moe.layers, options))
    h = tiny_moe.hidden
    edges = reshard_s(ctx, h, Layout.MESH, Layout.REPLICATED) + \
        reshard_s(ctx, h, Layout.REPLICATED, Layout.MESH)
    assert edges > 0 and reshard_s(ctx, h, Layout.MESH, Layout.REPLICATED) > 0
    assert ev.stages[0].time_s - base.stages[0].time_s == pytest.approx(per_mb + edges)


@pytest.mark.parametrize("pins", [
    Pins(layouts="per-layer", tp=4, pp=1, ep=4, etp=1, micro_batch=4, recompute=Recompute.NONE),
    Pins(layouts="per-layer", tp=2, pp=2, ep=2, etp=1, micro_batch=2, zero=1,
         recompute=Recompute.NONE),
])
def test_solver_matches_brute_force_with_moe_layouts(tiny, tiny_moe, pins):
    """The dense block, the MoE blocks, the embedding and the head each pick a layout; the
    search's optimum is the oracle's (which enumerates every option of every block)."""
    oracle = brute_force(tiny_moe, tiny, 16, 128, pins=pins, budget=2_000_000)
    found = search(tiny_moe, tiny, 16, 128, pins=pins, options=SearchOptions(time_limit_s=60))
    assert found.record.status == "OPTIMAL"
    assert found.best.step_time_s == pytest.approx(oracle.best.step_time_s, rel=1e-6)
    moe_blocks = [o for x, o in zip(tiny_moe.layers, oracle.best.placement.options)
                  if x.mlp is not None and x.mlp.is_moe]
    # on 8 small GPUs the tensor-parallel all-reduces of 256-wide blocks cost more than they
    # save: the MoE blocks leave the mesh's degree (which the uniform space could not)
    assert all(o.layout is not Layout.MESH for o in moe_blocks)
    uniform = search(tiny_moe, tiny, 16, 128,
                     pins=Pins(**{**pins.__dict__, "layouts": None}))
    assert found.best.step_time_s < uniform.best.step_time_s
