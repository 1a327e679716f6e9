"""The PyTorch verification runtime without processes: the decoder built from a ModelGraph has
exactly the graph's parameters; the plan helpers."""
from __future__ import annotations

import pytest

from models import load_model
from planner.errors import ErrorKind, PlannerError


torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install "
                                            "'shardplan[torch]'): verification runtime untested")

from planner.runtime.model import (build_decoder, check_parameter_counts,  # noqa: E402
                                   decoder_shape, lm_loss, synthetic_batch)
from planner.runtime.support import pipeline_chunks, schedule_name  # noqa: E402

FIXTURES = "tests/fixtures"


@pytest.fixture(autouse=True)
def one_thread():
    """Intra-op threads only slow these tiny models down on a busy 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("spec", ["tiny", f"{FIXTURES}/verify_wide_vocab.yaml", "tiny-moe"])
def test_decoder_has_exactly_the_graphs_parameters(spec):
    graph = load_model(spec)
    model = build_decoder(graph, seed=0)
    check_parameter_counts(graph, model)  # per layer and in total
    assert sum(p.numel() for p in model.parameters()) == graph.params
    for index, layer in enumerate(graph.layers):
        module = model.layers[str(index)]
        assert sum(p.numel() for p in module.parameters()) == layer.params


@pytest.mark.parametrize("preset", ["llama-3.1-8b", "llama-2-70b", "llama-3.1-405b",
                                    "mixtral-8x7b"])
def test_llama_presets_build_with_exact_counts_on_meta(preset):
    graph = load_model(preset)
    with torch.device("meta"):
        model = build_decoder(graph)
    check_parameter_counts(graph, model)


def test_tied_embeddings_count_once():
    from models.native import build_native

    graph = build_native({"shardplan_model": 1, "name": "tied", "num_layers": 2,
                          "hidden_size": 64, "num_heads": 4, "ffn_hidden_size": 128,
                          "vocab_size": 256, "seq_len": 32, "tied_embeddings": True})
    model = build_decoder(graph)
    check_parameter_counts(graph, model)
    assert model.layers["3"].lm_head.weight is model.layers["0"].tok_embeddings.weight


@pytest.mark.parametrize("preset, why", [("gpt3-1.3b", "learned position"),
                                         # a MoE model with QK norms (extra weights)
                                         ("qwen3-30b-a3b", "extra weights"),
                                         ("deepseek-v3", "MLA"),
                                         ("qwen2.5-72b", "biases")])
def test_graphs_the_runtime_cannot_build_are_refused(preset, why):
    with pytest.raises(PlannerError) as error:
        decoder_shape(load_model(preset))
    assert error.value.kind is ErrorKind.UNSUPPORTED
    assert why in error.value.message


def test_same_seed_same_weights_and_data():
    graph = load_model("tiny", seq_len=32)
    a, b = build_decoder(graph, seed=3), build_decoder(graph, seed=3)
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(p, q), name
    x1, y1 = synthetic_batch(3, 1, 4, 32, graph.vocab)
    x2, y2 = synthetic_batch(3, 1, 4, 32, graph.vocab)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert x1.shape == (4, 32) and torch.equal(x1[:, 1:], y1[:, :-1])
    assert not torch.equal(synthetic_batch(3, 2, 4, 32, graph.vocab)[0], x1)
    loss = lm_loss(a(x1), y1)
    assert 5.0 < float(loss.detach()) < 9.0  # about ln(1024) at initialisation


def test_recompute_modes_give_the_same_gradients():
    graph = load_model("tiny", seq_len=32)
    x, y = synthetic_batch(0, 0, 2, 32, graph.vocab)
    grads = {}
    for mode in ("none", "selective", "full"):
        model = build_decoder(graph, seed=0)
        for key, layer in model.layers.items():
            if hasattr(layer, "set_recompute"):
                layer.set_recompute(mode)
        lm_loss(model(x), y).backward()
        grads[mode] = [p.grad.clone() for p in model.parameters()]
    for mode in ("selective", "full"):
        for g, h in zip(grads["none"], grads[mode]):
            torch.testing.assert_close(g, h, rtol=1e-5, atol=1e-7)


def test_pipeline_chunks_follow_the_plans_stages():
    assert pipeline_chunks([0, 0, 0, 0, 1, 1], 2, 1) == [[0, 1, 2, 3], [4, 5]]
    assert pipeline_chunks([0, 0, 1, 0, 1, 1], 2, 2) == [[0, 1], [2], [3], [4, 5]]
    assert pipeline_chunks([0] * 6, 1, 1) == [list(range(6))]
    with pytest.raises(PlannerError):
        pipeline_chunks([0, 1, 0, 1, 0, 1], 2, 1)  # 6 runs, not 2


def test_gpipe_runs_plans_with_fewer_micro_batches_than_stages():
    from planner.config import ParallelConfig

    few = ParallelConfig(tp=1, pp=2, dp=1, global_batch=4, seq_len=32, micro_batch=4)
    assert few.num_micro_batches == 1 and schedule_name(few) == "ScheduleGPipe"
    many = ParallelConfig(tp=1, pp=2, dp=1, global_batch=4, seq_len=32, micro_batch=1)
    assert schedule_name(many) == "Schedule1F1B"
    inter = ParallelConfig(tp=1, pp=2, dp=1, global_batch=4, seq_len=32, micro_batch=1,
                           virtual_stages=2)
    assert schedule_name(inter) == "ScheduleInterleaved1F1B"


def _result(rank, pp, dp, held):
    return {"rank": rank, "stage": pp, "coords": {"pp": pp, "dp": dp, "cp": 0, "tp": 0},
            "held": held}


def test_state_checks_exact_group_sum_and_mismatch():
    from planner.config import ParallelConfig
    from planner.cost.model import MemoryBreakdown
    from planner.runtime.verify_report import state_checks

    config = ParallelConfig(tp=1, pp=1, dp=2, global_batch=4, seq_len=32, zero_stage=1)
    memory = [MemoryBreakdown(params=400.0, grads=400.0, optimizer=400.0)]
    results = [_result(0, 0, 0, {"params": 400, "grads": 400, "optimizer": 440}),
               _result(1, 0, 1, {"params": 400, "grads": 396, "optimizer": 360})]
    checks = state_checks(config, memory, results)
    by = {rank: {s.category: s for s in rows} for rank, rows in checks.items()}
    assert by[0]["params"].verdict == "exact" and by[0]["grads"].verdict == "exact"
    # ZeRO-1 shards the optimizer per whole parameter: 440 + 360 = 2 x 400
    assert by[0]["optimizer"].verdict == by[1]["optimizer"].verdict == "group-sum exact"
    assert by[0]["optimizer"].difference == 40 and "ZeroRedundancyOptimizer" in by[0]["optimizer"].note
    # gradients are not sharded under ZeRO-1: any difference is a mismatch
    assert by[1]["grads"].verdict == "mismatch" and not by[1]["grads"].ok


def test_cli_exits_1_when_losses_differ(monkeypatch, capsys, tmp_path):
    import json

    import planner.runtime.torch_exec as torch_exec
    from cli.main import main

    def fake(plan, **kwargs):
        return torch_exec.VerifyReport(
            plan=str(plan), parallelism={"tp": 1}, world_size=1, steps=2, seed=0, lr=1e-3,
            loss_rtol=1e-4, reference_losses=[7.0, 6.0], distributed_losses=[7.0, 6.5],
            ranks=[], implementation={})

    monkeypatch.setattr(torch_exec, "verify_plan", fake)
    with pytest.raises(SystemExit) as done:
        main(["verify", str(tmp_path / "p.json"), "--json"])
    assert done.value.code == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and doc["loss"]["ok"] is False
    assert doc["loss"]["max_rel_diff"] == pytest.approx(0.5 / 6.0)
    with pytest.raises(SystemExit) as done:
        main(["verify", str(tmp_path / "p.json")])
    assert done.value.code == 1
    assert "FAILED" in capsys.readouterr().err


def test_a_graph_imported_model_is_refused_for_what_it_is():
    """A model read from an operator graph (ONNX, torch.export) records positions 'graph' (the
    importer does not name the encoding); verify says so and what to verify instead. It said
    'graph position embeddings are not built'."""
    from dataclasses import replace

    graph = load_model("tiny")
    imported = replace(graph, metadata=(("positions", "graph"), ("importer", "onnx")))
    with pytest.raises(PlannerError) as error:
        decoder_shape(imported)
    assert error.value.kind is ErrorKind.UNSUPPORTED
    assert "imported from an operator graph" in error.value.message
    assert "config.json or a preset" in error.value.message


def test_moe_routing_is_balanced_and_the_router_trains():
    """Force-balanced routing (planner.runtime.experts): every expert gets the same number of
    token copies of any batch of whole sequences, a token's top_k experts are distinct, and the
    router's logits are the gate weights, so it receives gradients."""
    from planner.runtime.experts import balanced_experts
    from planner.runtime.model import MoeMlp

    graph = load_model("tiny-moe", seq_len=64)
    shape = decoder_shape(graph)
    assert shape.moe is not None and shape.moe_layers == {2, 3, 4}  # block.0 is dense
    chosen = balanced_experts(64, shape.moe.top_k, shape.moe.num_experts)
    assert torch.bincount(chosen.flatten(), minlength=8).tolist() == [16] * 8
    assert all(len(set(row.tolist())) == shape.moe.top_k for row in chosen)
    model = build_decoder(graph, seed=0)
    moe = model.layers["2"].mlp
    assert isinstance(moe, MoeMlp) and len(moe.experts) == 8 and moe.shared is not None
    x, y = synthetic_batch(0, 0, 2, 64, graph.vocab)
    lm_loss(model(x), y).backward()
    assert float(moe.router.weight.grad.abs().sum()) > 0
    assert all(float(e.down_proj.weight.grad.abs().sum()) > 0 for e in moe.experts.values())
