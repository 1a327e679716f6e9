"""Per-layer layouts (tensor x data factoring per block class) and resharding costs: formulas,
evaluate, and the CP-SAT solver against brute force on small non-uniform models."""
from __future__ import annotations

import pytest

from clusters import load_cluster
from models.params import BlockShape, EmbeddingShape, HeadShape, assemble
from planner.config import ParallelConfig
from planner.cost import comm
from planner.cost.context import make_context
from planner.cost.memory import ACT_BYTES
from planner.cost.model import evaluate
from planner.cost.terms import (embedding_sync_s, layer_terms, layout_view, option_valid,
                                reshard_s)
from planner.ir import Attention, Mlp
from planner.solve.bruteforce import brute_force
from planner.solve.search import SearchOptions, search
from planner.solve.space import Pins
from planner.strategy import LayerOption, LayerPlacement, Layout, Recompute
from planner.topology import group_link


def vlm(vision=2, text=2, hv=256, ht=512, vocab=32000, tied=False, hidden_embedding=None):
    """A vision encoder (narrow, non-causal) in front of a wider decoder: two block classes."""
    def block(h, heads, causal):
        return BlockShape(hidden=h, attention=Attention(heads, heads, h // heads, h // heads,
                                                        causal=causal),
                          mlp=Mlp(4 * h, gated=False), norm_bias=True)
    blocks = [(f"vision.{i}", block(hv, 4, False)) for i in range(vision)] + \
        [(f"text.{i}", block(ht, 8, True)) for i in range(text)]
    return assemble(name="vlm", family="test",
                    embedding=EmbeddingShape(vocab, hidden_embedding or hv),
                    blocks=blocks, head=HeadShape(vocab, ht, tied=tied), default_seq_len=256,
                    max_seq_len=None, source="test")


@pytest.fixture(scope="module")
def tiny():
    return load_cluster("tiny")


def config(model, cluster, **kw):
    base = dict(tp=2, pp=1, dp=4, micro_batch=2, global_batch=16, seq_len=256)
    base.update(kw)
    c = ParallelConfig(**base)
    c.validate(model, cluster)
    return c


def test_layout_degrees():
    assert Layout.MESH.tensor_degree(4, 2) == 4
    assert Layout.TP_HALF.tensor_degree(4, 2) == 2 and Layout.TP_HALF.tensor_degree(2, 2) is None
    assert Layout.TP_DOUBLE.tensor_degree(4, 2) == 8 and Layout.TP_DOUBLE.tensor_degree(4, 3) is None
    assert Layout.REPLICATED.tensor_degree(4, 2) == 1 and Layout.REPLICATED.tensor_degree(1, 8) is None


def test_node_layout_is_the_widest_group_inside_a_node():
    # tp 1 x dp 8 on nodes of 8: the whole node; of 4: four ranks; tp 2 x dp 8 on 8: 8
    assert Layout.NODE.tensor_degree(1, 8, 8) == 8 and Layout.NODE.tensor_degree(1, 8, 4) == 4
    assert Layout.NODE.tensor_degree(2, 8, 8) == 8
    # where it would repeat the mesh's or tp*2's degree it does not exist
    assert Layout.NODE.tensor_degree(1, 8, 2) is None and Layout.NODE.tensor_degree(4, 4, 8) is None
    assert Layout.NODE.tensor_degree(1, 8) is None  # node size unknown


def test_tied_table_is_one_copy_on_one_stage(tiny):
    """With one pipeline stage the tied embedding and LM head read one table: the head holds
    no second copy; with two stages the last one keeps its own (Megatron-LM)."""
    model = vlm(tied=True, hidden_embedding=512, hv=512)
    head = model.layers[-1]
    assert head.tied_params == 32000 * 512
    one = layer_terms(make_context(model, tiny, config(model, tiny)), head, LayerOption())
    two = layer_terms(make_context(model, tiny, config(model, tiny, pp=2, dp=2)), head,
                      LayerOption())
    assert one.dense_params == head.params / 2 + head.tp_replicated_params / 2
    assert two.dense_params == pytest.approx(
        (head.params + head.tied_params - head.tp_replicated_params) / 2
        + head.tp_replicated_params)


def test_layer_sequence_length_sets_its_tokens(tiny):
    """A vision encoder runs on its image tokens: a block with seq_len 64 costs what the same
    block costs in a 64-token workload."""
    from dataclasses import replace

    model = vlm()
    block = model.layers[1]
    short = replace(block, seq_len=64)
    c256, c64 = config(model, tiny), config(model, tiny, seq_len=64)
    a = layer_terms(make_context(model, tiny, c256), short, LayerOption())
    b = layer_terms(make_context(model, tiny, c64), block, LayerOption())
    assert a.fwd_s == b.fwd_s and a.act_stored_bytes == b.act_stored_bytes
    assert a.comm_s == b.comm_s and a.fwd_s < layer_terms(make_context(model, tiny, c256), block,
                                                           LayerOption()).fwd_s


def test_views_keep_the_stage_batch(tiny):
    model = vlm()
    ctx = make_context(model, tiny, config(model, tiny))
    mesh, double, rep = (layout_view(ctx, lay) for lay in
                         (Layout.MESH, Layout.TP_DOUBLE, Layout.REPLICATED))
    # the stage's tp x dp = 8 ranks process dp x micro_batch = 8 sequences in every layout
    for view in (mesh, double, rep):
        assert view.micro_batch * (2 * 4 // view.tp) == 2 * 4
        assert view.dp_shard == 8 // view.tp
    assert (double.tp, double.micro_batch, rep.tp, rep.micro_batch) == (4, 4, 1, 1)


def test_tied_table_sync_follows_its_layout(tiny):
    """On two stages both copies of a tied table take one layout; each rank all-reduces its
    V x h / t' shard with the rank of the same position on the other stage (the pipeline
    link), and evaluate charges exactly that."""
    model = vlm(tied=True, hidden_embedding=512, hv=512)
    c = config(model, tiny, pp=2, dp=2)
    ctx = make_context(model, tiny, c)
    grad = ctx.options.state_bytes(ctx.config.zero_stage).grad_reduce_bytes
    for layout, t in ((Layout.MESH, 2), (Layout.REPLICATED, 1), (Layout.TP_DOUBLE, 4)):
        expected = comm.all_reduce_s(32000 * 512 / t * grad, 2, ctx.links.pp)
        assert embedding_sync_s(ctx, layout) == pytest.approx(expected)
        option = LayerOption(layout=layout)
        assert option_valid(ctx, model.layers[0], option)
        edge = {0: option, len(model.layers) - 1: option}
        stages = tuple(0 if i < 3 else 1 for i in range(len(model.layers)))
        options = tuple(edge.get(i, LayerOption()) for i in range(len(model.layers)))
        ev = evaluate(model, tiny, c, LayerPlacement(stages, options))
        assert ev.breakdown.embedding_sync_s == pytest.approx(expected)
    # the replicated table moves twice the mesh's bytes, the doubled degree half
    assert embedding_sync_s(ctx, Layout.REPLICATED) > embedding_sync_s(ctx, Layout.MESH) > \
        embedding_sync_s(ctx, Layout.TP_DOUBLE)


def test_reshard_is_an_all_gather_of_the_merged_batch(tiny):
    model = vlm()
    ctx = make_context(model, tiny, config(model, tiny))
    h = 512
    # tp 2 -> 4: pairs of TP groups merge; one all-gather over 2 ranks (stride 2) of the merged
    # group's activation: 4 sequences x 256 tokens x h x 2 bytes
    expected = comm.all_gather_s(4 * 256 * h * ACT_BYTES, 2, group_link(tiny, 2, 2))
    assert reshard_s(ctx, h, Layout.MESH, Layout.TP_DOUBLE) == pytest.approx(expected)
    assert reshard_s(ctx, h, Layout.TP_DOUBLE, Layout.MESH) == pytest.approx(expected)
    assert reshard_s(ctx, h, Layout.MESH, Layout.MESH) == 0.0
    # tp 1 -> 2 (replicated -> mesh): merge over 2 ranks of stride 1, 2 sequences gathered
    one = comm.all_gather_s(2 * 256 * h * ACT_BYTES, 2, group_link(tiny, 2, 1))
    assert reshard_s(ctx, h, Layout.REPLICATED, Layout.MESH) == pytest.approx(one)


def test_layout_changes_terms_as_the_factoring_says(tiny):
    model = vlm()
    ctx = make_context(model, tiny, config(model, tiny, zero_stage=1))
    block = model.layers[3]
    mesh = layer_terms(ctx, block, LayerOption())
    rep = layer_terms(ctx, block, LayerOption(layout=Layout.REPLICATED))
    # replicated: the whole weight on every GPU (states sharded over all 8 ranks by ZeRO-1)
    assert rep.dense_params == block.params and mesh.dense_params < block.params
    assert rep.comm_s == 0.0 and mesh.comm_s > 0.0  # no tensor-parallel all-reduce
    # the embedding and head take layouts too (a vocab-parallel or a replicated table), never
    # recomputed, and only where the vocabulary divides the tensor degree
    assert option_valid(ctx, model.layers[0], LayerOption(layout=Layout.REPLICATED))
    assert not option_valid(ctx, model.layers[0], LayerOption(Recompute.FULL, Layout.REPLICATED))
    odd = vlm(vocab=32001)
    assert not option_valid(make_context(odd, tiny, config(odd, tiny)), odd.layers[-1],
                            LayerOption(layout=Layout.TP_DOUBLE))


def test_evaluate_charges_resharding_between_classes(tiny):
    model = vlm()
    c = config(model, tiny)
    ctx = make_context(model, tiny, c)
    rep = LayerOption(layout=Layout.REPLICATED)
    options = (LayerOption(), rep, rep, LayerOption(), LayerOption(), LayerOption())
    ev = evaluate(model, tiny, c, LayerPlacement((0,) * 6, options))
    base = evaluate(model, tiny, c, LayerPlacement((0,) * 6, (LayerOption(),) * 6))
    per_mb = (sum(layer_terms(ctx, layer, o).time_s for layer, o in zip(model.layers, options))
              - sum(layer_terms(ctx, layer, LayerOption()).time_s for layer in model.layers))
    edges = reshard_s(ctx, 256, Layout.MESH, Layout.REPLICATED) + \
        reshard_s(ctx, 512, Layout.REPLICATED, Layout.MESH)
    assert ev.stages[0].time_s - base.stages[0].time_s == pytest.approx(per_mb + edges)


PER_LAYER = Pins(layouts="per-layer")


@pytest.mark.parametrize("pins", [
    Pins(layouts="per-layer", tp=2, pp=1, micro_batch=2),
    Pins(layouts="per-layer", tp=2, pp=2, micro_batch=2, zero=1),
    Pins(layouts="per-layer", tp=4, pp=2, micro_batch=4, recompute=Recompute.NONE),
    Pins(layouts="per-layer", tp=1, pp=1, micro_batch=1, recompute=Recompute.NONE),
])
@pytest.mark.parametrize("tied", [False, True])
def test_solver_matches_brute_force_with_layouts(tiny, pins, tied):
    """Block classes, the embedding and the head each pick a layout (a tied table: the
    embedding and head the same one); the solver's optimum is the oracle's."""
    model = vlm(tied=True, hidden_embedding=512) if tied else vlm()
    oracle = brute_force(model, tiny, 16, 256, pins=pins, budget=2_000_000)
    found = search(model, tiny, 16, 256, pins=pins, options=SearchOptions(time_limit_s=60))
    assert found.record.status == "OPTIMAL"
    assert found.best.step_time_s == pytest.approx(oracle.best.step_time_s, rel=1e-6)


def test_per_layer_beats_uniform_on_a_non_uniform_model(tiny):
    """tp=4 over 2 nodes of 4: the 32k-vocabulary head keeps the mesh's vocab-parallel layout
    while the embedding and the narrow blocks run data-parallel (no per-block all-reduces): better than every
    uniform plan of the same pins."""
    model = vlm()
    pins = dict(tp=4, pp=2, micro_batch=4, recompute=Recompute.NONE)
    uniform = search(model, tiny, 16, 256, pins=Pins(**pins))
    layered = search(model, tiny, 16, 256, pins=Pins(layouts="per-layer", **pins))
    assert layered.best.step_time_s < uniform.best.step_time_s * 0.99
    options = layered.best.placement.options
    # the head stays vocab-parallel (its 32k-row GEMM and logits split 4 ways); the embedding
    # (a lookup: replicated, it needs no all-reduce of its output) and the blocks do not
    assert options[-1].layout is Layout.MESH
    assert {o.layout for o in options[:-1]} == {Layout.REPLICATED}


def test_cli_plan_with_per_layer_layouts_checks_back(tmp_path, capsys):
    """The plan file records each layer's layout and `shardplan check` re-derives the same
    step time from it."""
    import json

    from cli.main import main

    model = tmp_path / "vlm.json"
    model.write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": 4, "hidden_size": 256,
        "num_attention_heads": 4, "intermediate_size": 1024, "vocab_size": 32000,
        "max_position_embeddings": 256}))
    plan = tmp_path / "plan.json"
    argv = ["plan", "--model", str(model), "--cluster", "tiny", "--global-batch", "16",
            "--pin", "layouts=per-layer", "--pin", "tp=4", "--pin", "pp=2",
            "--pin", "micro_batch=4", "--time-limit", "30", "-o", str(plan), "--json"]
    with pytest.raises(SystemExit) as done:
        main(argv)
    out, err = capsys.readouterr()
    assert done.value.code == 0, err
    doc = json.loads(plan.read_text())
    assert doc == json.loads(out)
    layouts = [layer["layout"] for layer in _layers(doc)]
    assert set(layouts) - {"mesh"}  # some layers (the embedding too) leave the mesh layout
    assert doc["pins"]["layouts"] == "per-layer"
    with pytest.raises(SystemExit) as done:
        main(["check", str(plan)])
    _, err = capsys.readouterr()
    assert done.value.code == 0, err
    # runtimes take one tensor-parallel degree: the export says so, and --strict fails on it
    with pytest.raises(SystemExit) as done:
        main(["export", str(plan), "-f", "megatron", "--strict"])
    _, err = capsys.readouterr()
    assert done.value.code == 1 and "layouts:" in err and "one tensor-parallel degree" in err


def _layers(doc):
    """The plan's per-layer list, wherever the plan file keeps it."""
    stack = [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("layers"), list) and node["layers"] and \
                    isinstance(node["layers"][0], dict) and "layout" in node["layers"][0]:
                return node["layers"]
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    raise AssertionError("no per-layer list in the plan")
