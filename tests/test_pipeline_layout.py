"""Explicit pipeline layouts (planner/pipeline_layout.py): Megatron-Core's
``--pipeline-model-parallel-layout`` syntax read by one parser, ``evaluate --pipeline-layout``
placing each chunk's layers as written (Meta's Llama 3.1 405B layout: one layer fewer in the
first and the last chunk, Llama 3 paper §3.3.2), and the Megatron export writing it back."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from bench.runtime_reference import Rejected, megatron
from clusters import load_cluster
from conftest import run_cli
from models import load_model
from models.mtp import with_mtp
from planner.config import ParallelConfig, RuntimeOptions
from planner.cost.model import evaluate
from planner.cost.terms import chunk_weights
from planner.errors import PlannerError
from planner.export import export_plan
from planner.ir import LayerKind
from planner.pipeline_layout import MAX_LAYOUT_SYMBOLS, parse_layout
from planner.plan import make_plan
from planner.plan_io import validate_plan
from planner.plan_types import Plan
from planner.strategy import uniform

META_405B = "Et|(tt|)*62tL"  # 126 layers, pp 16 x 4 chunks, the first and the last 1 layer
EVEN_405B = "Ett|(tt|)*61t|tL"  # Megatron's default split written out: 62 chunks of 2, then 1, 1
ARGS = ["evaluate", "-m", "llama-3.1-405b", "-c", "dgx-h100", "--nodes", "16",
        "--global-batch", "64", "--tp", "8", "--pp", "16", "--recompute", "full", "--json"]


# -- the grammar (Megatron-Core PipelineParallelLayerLayout.parse_str_to_list) --------------

def test_megatron_docstring_example():
    """parse_str_to_list's own example: "Ettt|(tt|)*29,m|L" is
    [E,t,t,t] + [t,t] x 29 + [m], [L] (the comma is cosmetic)."""
    layout = parse_layout("Ettt|(tt|)*29,m|L")
    assert layout.chunks == ("Ettt",) + ("tt",) * 29 + ("m", "L")
    assert parse_layout("Et*3|(tt|)*29,m|L") == layout  # x*N repeats one symbol


@pytest.mark.parametrize("text, chunks", [
    ("Et(tt|t)*2,L", ("Ettt", "ttt", "tL")),  # the group repeats inside a chunk
    ("E(|tt)*2,tL", ("E", "tt", "tttL")),  # (|ab)*2,cd -> |ab|abcd
    ("Et|(t|)*0tL", ("Et", "tL")),  # *0 drops the group
    ("Et*2|t*2L", ("Ett", "ttL")),
    ("Et|*2tL", ("Et", "", "tL")),  # x*N of the separator: an empty chunk (checked later)
])
def test_repetition(text, chunks):
    assert parse_layout(text).chunks == chunks


def test_meta_405b_layout():
    layout = parse_layout(META_405B)
    assert layout.num_chunks == 64 and layout.virtual_stages(16) == 4
    assert layout.blocks == (1,) + (2,) * 62 + (1,)
    assert layout.rank_blocks(16)[0] == [1, 2, 2, 2] and layout.rank_blocks(16)[15] == [2, 2, 2, 1]
    assert str(layout) == "Et|" + "tt|" * 62 + "tL"


@pytest.mark.parametrize("text, message", [
    ("", "empty"),
    ("Et|xL", "unknown character 'x'"),
    ("Et| tL", "unknown character ' '"),
    ("E((t)*2)*3L", "outside Megatron's repetitions"),  # no nesting, as in Megatron
    ("E(tt)L", "outside Megatron's repetitions"),  # a group without *N
    ("Et*|tL", "outside Megatron's repetitions"),
    ("E(t)*99999999L", f"more than {MAX_LAYOUT_SYMBOLS}"),
])
def test_grammar_errors(text, message):
    with pytest.raises(PlannerError, match=message.replace("(", r"\(").replace("*", r"\*")):
        parse_layout(text)


@pytest.mark.parametrize("text, pp, v, blocks, mtp, message", [
    ("Et|tt|tL", 2, None, 4, 0, "3 chunks, not a multiple of pp 2"),
    ("Et|tL", 2, 2, 2, 0, "2 chunks = pp 2 x 1 virtual stages, but --virtual-stages is 2"),
    ("tE|tL", 2, None, 2, 0, "the embedding \\(E\\) must be the first layer"),
    ("Et|tLL", 2, None, 2, 0, "the loss \\(L\\) must be the last layer, once; the layout has 2"),
    ("Et|Lt", 2, None, 2, 0, "its last layer is 't'"),
    ("Et|ttL", 2, None, 2, 0, "holds 3 decoder layers \\(t\\) but the model has 2 blocks"),
    ("Et|tmL", 2, None, 2, 0, "1 MTP layers \\(m\\) but the model has 0"),
    ("Et|mtL", 2, None, 2, 1, "decoder layers \\(t\\) must come before the MTP"),
    ("Et|tm|L|", 2, None, 2, 1, "chunk 3 is empty"),
    ("Et|tm|tL|L", 2, None, 3, 1, "the loss \\(L\\) must be the last layer, once"),
    ("Ett|m|t|L", 2, None, 3, 1, "decoder layers \\(t\\) must come before the MTP"),
    ("Et|tt|m|L", 2, None, 3, 1, "must share the last chunk with the loss"),
])
def test_validation_errors(text, pp, v, blocks, mtp, message):
    with pytest.raises(PlannerError, match=message):
        parse_layout(text).validate(pp, v, blocks, mtp)


# -- evaluate --pipeline-layout ------------------------------------------------------------

def _doc(capsys, *extra: str) -> tuple[int, dict]:
    code, out, _ = run_cli(ARGS + list(extra), capsys)
    return code, json.loads(out)


def test_meta_405b_layout_evaluates_as_written(capsys):
    """Meta's layout on 128 H100 (tp 8 x pp 16, dgx-h100 x 16): virtual stages come from the
    64 chunks; chunk k's blocks run on rank k mod 16, so ranks 0 and 15 hold 7 blocks (with the
    embedding, the head) and the others 8; the cost model's stages hold exactly those."""
    code, doc = _doc(capsys, "--pipeline-layout", META_405B)
    assert code == 0
    p = doc["parallelism"]
    assert (p["virtual_stages"], p["schedule"], p["pipeline_layout"]) == \
        (4, "interleaved-1f1b", META_405B)
    model = load_model("llama-3.1-405b")
    kinds = {layer.name: layer.kind for layer in model.layers}
    blocks = [sum(kinds[name] is LayerKind.BLOCK for name in s["layers"]) for s in doc["stages"]]
    assert blocks == [7] + [8] * 14 + [7]
    assert kinds[doc["stages"][0]["layers"][0]] is LayerKind.EMBEDDING
    assert kinds[doc["stages"][15]["layers"][-1]] is LayerKind.HEAD
    # chunk by chunk: the blocks' ranks along the model, runs of 1, 2 x 62, 1 on k mod 16
    config = ParallelConfig(tp=8, pp=16, dp=1, global_batch=64, seq_len=model.default_seq_len,
                            sp=True, zero_stage=1, virtual_stages=4, pipeline_layout=META_405B)
    ev = evaluate(model, load_cluster("dgx-h100", nodes=16), config,
                  uniform(model, config, "full"))
    ranks = [s for s, layer in zip(ev.placement.stage, model.layers)
             if layer.kind is LayerKind.BLOCK]
    runs = [(ranks[0], 1)]
    for r in ranks[1:]:
        runs[-1:] = [(r, runs[-1][1] + 1)] if r == runs[-1][0] else [runs[-1], (r, 1)]
    assert runs == [(k % 16, n) for k, n in enumerate((1,) + (2,) * 62 + (1,))]
    assert [list(s.layers) for s in ev.stages] == \
        [ev.placement.layers_of_stage(s) for s in range(16)]
    # the schedule sees the written chunks: chunk 0 holds one block (the default split two)
    assert chunk_weights(model, 64, META_405B)[:2] == (1.0, 2.0)
    assert chunk_weights(model, 64)[:2] == (2.0, 2.0)


ONE_LAYER_405B = "E|(t|)*126L"  # Llama 3 §3.3.2 read with one-layer chunks: pp 16 x 8


def test_embedding_and_loss_chunks_of_their_own(capsys):
    """128 chunks for 126 blocks (the first only the embedding, the last only the loss): more
    chunks than blocks, refused before ("pp x virtual stages = 16 x 8 exceeds the 126
    blocks"); the layout's own rules bound it. Rank 0 holds the embedding and 7 blocks, rank 15
    7 blocks and the head, the others 8; the plan file made of it passes the plan checks."""
    code, doc = _doc(capsys, "--pipeline-layout", ONE_LAYER_405B, "--global-batch", "16")
    assert code == 0
    assert doc["parallelism"]["virtual_stages"] == 8
    model = load_model("llama-3.1-405b")
    kinds = {layer.name: layer.kind for layer in model.layers}
    blocks = [sum(kinds[name] is LayerKind.BLOCK for name in s["layers"]) for s in doc["stages"]]
    assert blocks == [7] + [8] * 14 + [7]
    assert kinds[doc["stages"][0]["layers"][0]] is LayerKind.EMBEDDING
    assert kinds[doc["stages"][15]["layers"][-1]] is LayerKind.HEAD
    plan = _plan(model, ONE_LAYER_405B, 16, 16, 8)
    from planner.plan_validate import plan_problems
    assert plan_problems(plan, model) == []
    # without a layout the even split still needs a block per chunk
    code, out, _ = run_cli(ARGS + ["--virtual-stages", "8", "--global-batch", "16"], capsys)
    assert code == 2 and "exceeds the 126 blocks" in json.loads(out)["error"]["message"]


def test_even_layout_written_out_predicts_the_default_split_byte_for_byte(capsys):
    _, default = _doc(capsys, "--virtual-stages", "4")
    _, written = _doc(capsys, "--pipeline-layout", EVEN_405B)
    assert written["parallelism"].pop("pipeline_layout") == EVEN_405B
    assert json.dumps(written, sort_keys=True) == json.dumps(default, sort_keys=True)
    _, meta = _doc(capsys, "--pipeline-layout", META_405B)
    assert meta["predicted"] != default["predicted"]  # the layout reaches the cost model


@pytest.mark.parametrize("extra, message", [
    (["--pipeline-layout", "Et|(tt|)*62ttL"],
     "holds 127 decoder layers (t) but llama-3.1-405b has 126 blocks"),
    (["--pipeline-layout", "Et|(tt|)*61tL"], "63 chunks, not a multiple of pp 16"),
    (["--pipeline-layout", META_405B, "--virtual-stages", "2"],
     "64 chunks = pp 16 x 4 virtual stages, but --virtual-stages is 2"),
    (["--pipeline-layout", META_405B, "--runtime", "deepspeed"],
     "runtime deepspeed cannot run an explicit pipeline layout"),
    (["--pipeline-layout", "Et|(tt|)*62tmL"], "1 MTP layers (m) but llama-3.1-405b has 0"),
])
def test_bad_layouts_exit_2_naming_the_mismatch(capsys, extra, message):
    code, out, err = run_cli(ARGS + extra, capsys)
    assert code == 2 and "Traceback" not in err
    error = json.loads(out)["error"]  # --json: the error as a document
    assert error["exit_code"] == 2 and message in error["message"]


def test_v_schedule_places_the_written_chunks_in_a_v():
    """Under DualPipeV (and ZB-V) chunk k of 2 pp runs on rank k, then 2 pp - 1 - k: a 32-chunk
    DeepSeek-V3 layout puts the embedding's chunk and the MTP + loss chunk both on rank 0 (the
    shallowest and deepest layers on one rank, DeepSeek-V3 report §2.2 / §3.2.1)."""
    model = with_mtp(load_model("deepseek-v3"), 1)
    layout = "Et|(tt|)*30mL"
    config = ParallelConfig(tp=1, pp=16, dp=8, ep=8, etp=1, global_batch=256, seq_len=4096,
                            zero_stage=1, virtual_stages=2, pipeline_schedule="dualpipev",
                            pipeline_layout=layout)
    config.validate(model, load_cluster("hgx-h800", nodes=16))
    placement = uniform(model, config, "full")
    stage = dict(zip((layer.name for layer in model.layers), placement.stage))
    blocks = [s for s, layer in zip(placement.stage, model.layers)
              if layer.kind is LayerKind.BLOCK]
    assert blocks[0] == 0 and blocks[1:3] == [1, 1] and blocks[29:31] == [15, 15]
    assert blocks[31:33] == [15, 15] and blocks[-2:] == [1, 1]  # chunk 16 on 15, chunk 30 on 1
    assert all(s == 0 for name, s in stage.items() if name.startswith("mtp."))
    assert [blocks.count(r) for r in range(16)] == [1] + [4] * 15
    # the loop order of the same layout keeps the MTP module on the last rank
    looped = replace(config, pipeline_schedule="interleaved-1f1b")
    assert uniform(model, looped, "full").stage[-1] == 15


def test_torchtitan_takes_a_layout_too(capsys):
    code, doc = _doc(capsys, "--pipeline-layout", META_405B, "--runtime", "torchtitan",
                     "--zero", "3")
    assert code == 0 and doc["parallelism"]["pipeline_layout"] == META_405B


# -- the plan file and the Megatron export ----------------------------------------------------

def _plan(model, layout: str, pp: int, nodes: int, v: int) -> Plan:
    config = ParallelConfig(tp=8, pp=pp, dp=1, global_batch=64, seq_len=model.default_seq_len,
                            sp=True, zero_stage=1, virtual_stages=v, pipeline_layout=layout)
    cluster = load_cluster("dgx-h100", nodes=nodes)
    ev = evaluate(model, cluster, config, uniform(model, config, "full"),
                  RuntimeOptions(profile="megatron"))
    doc = json.loads(json.dumps(make_plan(ev, model_spec=model.name, cluster_spec="dgx-h100",
                                          nodes=nodes)))
    validate_plan(doc)  # planner/plan_schema.json takes parallelism.pipeline_layout
    return Plan.from_dict(doc)


def _flags(text: str) -> list[str]:
    from planner.export.megatron import parse_args_file
    return parse_args_file(text)


def test_megatron_export_writes_the_layout_back():
    """evaluate --pipeline-layout -> plan file -> export --format megatron: the same string,
    which Megatron's reading (bench/runtime_reference.py) splits as written."""
    model = load_model("llama-3.1-405b")
    plan = _plan(model, META_405B, 16, 16, 4)
    assert plan.config.pipeline_layout == META_405B
    args = _flags(export_plan(plan, "megatron").text)
    assert args[args.index("--pipeline-model-parallel-layout") + 1] == META_405B
    assert "--num-virtual-stages-per-pipeline-rank" not in args
    read = megatron(args, world_size=128, env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"},
                    device_arch=9)
    assert read["virtual_stages"] == 4
    assert read["layers_per_chunk"][0] == [1, 2, 2, 2]
    assert read["layers_per_chunk"][15] == [2, 2, 2, 1]
    # the even split written out stays a layout (it was given as one), spelled as given
    even = _plan(model, EVEN_405B, 16, 16, 4)
    args = _flags(export_plan(even, "megatron").text)
    assert args[args.index("--pipeline-model-parallel-layout") + 1] == EVEN_405B


def test_megatron_export_counts_mtp_layers():
    """A model with MTP modules: the layout names them (m), as Megatron's validate_layer_layout
    requires (the count of m equals --mtp-num-layers)."""
    model = with_mtp(load_model("llama-3.1-8b"), 1)
    plan = _plan(model, "Et*7|t*8|t*8|t*9mL", 4, 4, 1)
    args = _flags(export_plan(plan, "megatron").text)
    assert args[args.index("--pipeline-model-parallel-layout") + 1] == "Et*7|t*8|t*8|t*9mL"
    assert args[args.index("--mtp-num-layers") + 1] == "1"


def test_reference_reads_layouts_through_the_parser():
    with pytest.raises(Rejected, match="holds 3 decoder layers"):
        megatron(["--num-layers", "2", "--pipeline-model-parallel-size", "2",
                  "--pipeline-model-parallel-layout", "Et|ttL", "--micro-batch-size", "1"],
                 world_size=2, env={}, device_arch=9)
