"""``plan --pin pipeline_layout=...``: a Megatron-Core ``--pipeline-model-parallel-layout``
(planner/pipeline_layout.py) fixes pp x virtual stages (its chunk count) and the block
placement; the search chooses the rest. The solver keeps the layout's blocks on their ranks
(StageProblem.block_ranks) and agrees with exhaustive enumeration; the plan records the
layout, ``check`` passes it and ``export --format megatron`` writes the same string back."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from clusters import load_cluster
from conftest import run_cli
from models.native import build_native
from planner.config import RuntimeOptions
from planner.cost.pipeline import chunk_rank
from planner.ir import LayerKind
from planner.pipeline_layout import layer_chunks, parse_layout
from planner.solve.bruteforce import brute_force
from planner.solve.headroom import NO_HEADROOM
from planner.solve.search import SearchOptions, search
from planner.solve.space import Pins, enumerate_configs

TINY = load_cluster("tiny")
N6 = build_native({"name": "n6", "num_layers": 6, "hidden_size": 256, "num_heads": 4,
                   "ffn_hidden_size": 1024, "vocab_size": 1024, "seq_len": 1024})
GPT = ["-m", "gpt3-1.3b", "-c", "dgx-a100-80g", "--global-batch", "64"]
# 24 blocks in 4 chunks of 5, 7, 7, 5: not the default split (6 each), pp 2 x v 2 or pp 4
LAYOUT = "Et*5|t*7|t*7|t*5L"


def _block_ranks(model, placement):
    return [s for s, layer in zip(placement.stage, model.layers) if layer.kind is LayerKind.BLOCK]


def test_the_pin_fixes_pp_times_v_and_keeps_the_text():
    pins = Pins.parse({"pipeline_layout": "Et|ttt|t|tL"})
    assert pins.pipeline_layout == "Et|ttt|t|tL"  # case kept: E and L
    hw = replace(TINY, num_nodes=1, gpus_per_node=4)
    shapes = {(c.pp, c.virtual_stages) for c in enumerate_configs(
        N6, hw, 16, N6.default_seq_len, "bf16", pins, None)}
    assert shapes == {(2, 2), (4, 1)}  # 4 chunks: pp 2 x 2 or pp 4 x 1, never pp 1
    assert all(c.pipeline_layout == "Et|ttt|t|tL" for c in enumerate_configs(
        N6, hw, 16, N6.default_seq_len, "bf16", pins, None))


@pytest.mark.parametrize("layout", ["Et|tttttL", "Et|ttt|t|tL"])  # pp 2: v 1, v 2
@pytest.mark.parametrize("runtime", ["megatron", "torchtitan"])
@pytest.mark.parametrize("memory_gib", [2.0, 0.3])
def test_solver_agrees_with_brute_force_on_a_pinned_layout(layout, runtime, memory_gib):
    hw = replace(TINY, num_nodes=1, gpus_per_node=2, gpu=replace(TINY.gpu, memory_gib=memory_gib))
    options = RuntimeOptions(profile=runtime)
    pins = Pins.parse({"pipeline_layout": layout, "micro_batch": "1"})
    got = search(N6, hw, 8, N6.default_seq_len, "bf16", pins,
                 SearchOptions(runtime=options, memory_headroom=NO_HEADROOM))
    want = brute_force(N6, hw, 8, N6.default_seq_len, "bf16", pins, options,
                       headroom=NO_HEADROOM).best
    assert got.record.status == "OPTIMAL"
    assert got.best.step_time_s == pytest.approx(want.step_time_s, rel=1e-6)
    assert got.best.peak_memory_bytes == pytest.approx(want.peak_memory_bytes, rel=1e-6)
    c = got.best.config
    assert c.pipeline_layout == layout
    assert c.pp * c.virtual_stages == parse_layout(layout).num_chunks
    chunks = layer_chunks(N6, parse_layout(layout))  # chunk k on rank k mod pp, or the V's
    want_ranks = [chunk_rank(k, c.pp, c.schedule_spec.placement)
                  for k, layer in zip(chunks, N6.layers) if layer.kind is LayerKind.BLOCK]
    assert _block_ranks(N6, got.best.placement) == want_ranks


@pytest.fixture(scope="module")
def layout_plan(tmp_path_factory):
    from cli.main import main

    path = tmp_path_factory.mktemp("layout") / "plan.json"
    with pytest.raises(SystemExit) as done:
        main(["plan", *GPT, "--pin", f"pipeline_layout={LAYOUT}", "--time-limit", "60",
              "-o", str(path)])
    assert done.value.code == 0
    return path


def test_plan_records_the_layout_check_passes_megatron_writes_it_back(layout_plan, capsys):
    doc = json.loads(layout_plan.read_text())
    p = doc["parallelism"]
    assert p["pipeline_layout"] == LAYOUT and p["pp"] * p["virtual_stages"] == 4
    assert doc["pins"] == {"pipeline_layout": LAYOUT}
    # layers per rank as the layout places them: pp 2 x v 2, E + 5 + 7 on rank 0 and
    # 7 + 5 + head on rank 1 (the default split: 6 blocks a chunk); pp 4, one chunk each
    want = {2: [13, 13], 4: [6, 7, 7, 6]}[p["pp"]]
    assert [s["num_layers"] for s in doc["stages"]] == want
    code, _, err = run_cli(["check", layout_plan], capsys)
    assert code == 0, err
    code, out, err = run_cli(["export", layout_plan, "--format", "megatron", "--strict"], capsys)
    assert code == 0, err
    assert f"--pipeline-model-parallel-layout '{LAYOUT}'" in out
    assert f"--pipeline-model-parallel-size {p['pp']}" in out


@pytest.mark.parametrize("args, words", [
    (["--pin", "pipeline_layout=Et*5|t*7|t*7|t*4L"], "holds 23 decoder layers (t)"),
    (["--pin", "pipeline_layout=EttL"], "has one chunk"),
    (["--pin", f"pipeline_layout={LAYOUT}", "--runtime", "deepspeed"],
     "runtime deepspeed cannot run the pinned pipeline_layout"),
    (["--pin", "pipeline_layout=Et*5|t*7|t*7|t*5Q"], "unknown character 'Q'"),
    (["--pin", f"pipeline_layout={LAYOUT}", "-c", "h100-a100"], "across GPU pools"),
])
def test_plan_refuses_a_layout_it_cannot_place(capsys, args, words):
    code, _, err = run_cli(["plan", *GPT, *args, "--time-limit", "20"], capsys)
    assert code == 2 and words in err and "Traceback" not in err, err
