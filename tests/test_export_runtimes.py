"""The 75 export cases (15 plans x 5 exports) fed to the runtimes' own parsers.

DeepSpeed (``DeepSpeedConfig`` on a fake process group) and torchtitan 0.3 (``ConfigManager``
+ ``ParallelDims.build_mesh`` on the fake backend) run for real when the ``runtimes`` extra is
installed, as ``.ci/run`` does; Megatron-LM (Python >= 3.12) and vLLM (its own torch) are
checked against :mod:`bench.runtime_reference`, and the torchtitan 0.2.2 TOML against tomllib
and the v0.2.2 job-config fields. Each case compares what the runtime derives (degrees,
data-parallel size, micro-batches, layers per chunk, recomputation) with the plan.
"""
from __future__ import annotations

import importlib.util
import json
import os

import pytest

from bench.export_runtimes import (TORCHTITAN_022_ENV, Case, compare, megatron_reference,
                                   run_cases, run_worker)
from bench.runtime_reference import Rejected
from export_corpus import CORPUS, EXPORTS, corpus_plan
from planner.export import export_plan
from planner.plan_types import Plan

HAVE = {name: importlib.util.find_spec(name) is not None for name in ("deepspeed", "torchtitan")}
REAL = {"deepspeed": ("deepspeed", None), "torchtitan": ("torchtitan", "0.3")}


@pytest.fixture(scope="module")
def cases() -> dict[tuple[str, str, str | None], Case]:
    found = run_cases({name: corpus_plan(name) for name in CORPUS})
    return {(c.plan, c.format, c.version): c for c in found}


@pytest.mark.parametrize("fmt,version", EXPORTS, ids=[f"{f}-{v}" if v else f for f, v in EXPORTS])
@pytest.mark.parametrize("plan", list(CORPUS))
def test_export_accepted_as_planned(cases, plan, fmt, version):
    runtime = next((r for r, fv in REAL.items() if fv == (fmt, version)), None)
    if runtime and not HAVE[runtime]:
        pytest.skip(f"{runtime} is not installed (pip install -e '.[runtimes]')")
    case = cases[(plan, fmt, version)]
    assert case.accepted, f"{case.parser} refused it: {case.message}"
    assert case.mismatches == [], case.mismatches
    if runtime:
        assert "(real)" in case.parser
    if (fmt, version) == ("torchtitan", "0.2.2") and os.environ.get(TORCHTITAN_022_ENV):
        assert "(real)" in case.parser  # .ci/run installs 0.2.2 beside 0.3


def test_every_case_is_counted(cases):
    assert len(CORPUS) == 15 and len(EXPORTS) == 5
    expected = 75 - sum(15 for runtime, have in HAVE.items() if not have)
    assert len(cases) == expected


# -- the checks fail on the defects issue 15 found ----------------------------------------

def _megatron_args(plan: str) -> tuple[dict, str]:
    doc = corpus_plan(plan)
    return doc, export_plan(Plan.from_dict(doc), "megatron").text


def test_megatron_reference_needs_cuda_device_max_connections():
    doc, text = _megatron_args("zero1-tp2-pp2")
    megatron_reference(doc, text)  # the Use line sets it
    with pytest.raises(Rejected, match="CUDA_DEVICE_MAX_CONNECTIONS"):
        megatron_reference(doc, text.replace("CUDA_DEVICE_MAX_CONNECTIONS=1 ", ""))


def test_megatron_reference_rejects_unknown_flags_and_bad_splits():
    doc, text = _megatron_args("pp4-first-last")
    with pytest.raises(Rejected, match="unrecognized"):
        megatron_reference(doc, text.replace("--sequence-parallel", "--sequence-parallelism"))
    with pytest.raises(Rejected, match="evenly"):
        megatron_reference(doc, text.replace("--decoder-first-pipeline-num-layers 5",
                                             "--decoder-first-pipeline-num-layers 4"))
    derived = megatron_reference(doc, text)
    assert derived["layers_per_chunk"] == [[5], [7], [7], [5]]


def test_compare_names_every_difference():
    doc = corpus_plan("interleaved-v4")
    derived = {"tp": 2, "pp": 2, "dp": 4, "layers_per_chunk": [[3, 3, 3, 3], [3, 3, 3, 3]]}
    assert compare(doc, derived, ("tp", "pp", "dp", "layers_per_chunk")) == [
        "dp: runtime 4, plan 2"]


@pytest.mark.skipif(not HAVE["deepspeed"], reason="deepspeed is not installed")
def test_deepspeed_refuses_the_old_batch_arithmetic():
    """Issue 15: batch over the whole world for tp/pp > 1 is refused by DeepSpeedConfig; the
    export's note (mpu / topology) is what makes it hold."""
    doc = corpus_plan("zero1-tp2-pp2")
    result = export_plan(Plan.from_dict(doc), "deepspeed")
    world = 8
    no_note = {"text": result.text, "notes": [], "world": world}
    with_note = {"text": result.text, "notes": list(result.notes), "world": world}
    refused, accepted, _ = run_worker("deepspeed", [no_note, with_note])
    assert not refused["accepted"] and "train_batch_size is not equal" in refused["message"]
    assert accepted["accepted"] and accepted["derived"]["dp"] == doc["parallelism"]["dp"]


@pytest.mark.skipif(not HAVE["torchtitan"], reason="torchtitan is not installed")
def test_torchtitan_refuses_the_old_overrides():
    """Issue 15: `--parallelism.enable_sequence_parallel true` and pp > 1 without
    `--training.disable_cuda_graphs` are refused by torchtitan 0.3's parser."""
    doc = corpus_plan("zero1-tp2-pp2")
    text = export_plan(Plan.from_dict(doc), "torchtitan").text
    old_bool = text.replace("  --parallelism.enable_sequence_parallel\n",
                            "  --parallelism.enable_sequence_parallel true\n")
    graphs = text.replace("  --training.disable_cuda_graphs\n", "")
    assert old_bool != text and graphs != text
    results = run_worker("torchtitan", [{"text": t, "notes": [], "world": 8, "arch": 8}
                                        for t in (old_bool, graphs, text)])
    assert [r["accepted"] for r in results[:3]] == [False, False, True]
    assert "CUDA graphs" in results[1]["message"]
    assert json.dumps(results[2]["derived"])  # plain data back from the worker


@pytest.mark.skipif(not os.environ.get(TORCHTITAN_022_ENV), reason=f"{TORCHTITAN_022_ENV} names "
                    "no torchtitan 0.2.2 folder (.ci/run installs one)")
def test_torchtitan_022_refuses_unknown_keys():
    doc = corpus_plan("zero1-tp2-pp2")
    text = export_plan(Plan.from_dict(doc), "torchtitan", "0.2.2").text
    bad = text.replace("[parallelism]\n", "[parallelism]\nenable_sequence_parallel = false\n")
    results = run_worker("torchtitan-0.2.2", [{"text": t, "world": 8} for t in (bad, text)],
                         path_first=os.environ[TORCHTITAN_022_ENV])
    assert [r["accepted"] for r in results[:2]] == [False, True]


# -- vLLM: its real serve parser and engine config, a manual step (bench/export_vllm.py) -----

VLLM_PYTHON = "SHARDPLAN_VLLM_PYTHON"  # a Python with vllm installed (docs/exports.md)


def test_vllm_check_uses_each_models_own_config():
    from bench.export_vllm import hf_config

    llama = hf_config(corpus_plan("interleaved-v5"))  # an HF config.json path
    assert llama["architectures"] == ["LlamaForCausalLM"] and llama["num_hidden_layers"] == 80
    mixtral = hf_config(corpus_plan("mixtral-ep"))
    assert mixtral["num_local_experts"] == 8
    # a native preset: a Llama-style config of the plan's own shape
    doc = corpus_plan("zero1-tp2-pp2")
    native = hf_config(doc)
    block = next(x for x in doc["inputs"]["model"]["ir"]["layers"] if x["kind"] == "block")
    assert native["num_attention_heads"] == block["attention"]["num_heads"] == 16
    assert native["num_hidden_layers"] == doc["model"]["num_layers"] == 24
    assert native["max_position_embeddings"] >= doc["parallelism"]["seq_len"]


def test_vllm_serving_facts_are_the_plans_workers():
    from bench.export_vllm import _serve_lines, _serving_facts, serving_plans
    from planner.export.serving import worker_specs

    doc = serving_plans()["deepseek-disaggregated"]
    specs = worker_specs(doc, "vllm")
    lines = _serve_lines(export_plan(doc, "vllm").text)
    assert len(lines) == len(specs) == 2
    prefill, decode = (_serving_facts(s) for s in specs)
    assert (prefill["tp"], prefill["ep"], prefill["kv_role"]) == (8, 8, "kv_producer")
    assert (decode["dp"], decode["ep"], decode["kv_role"]) == (16, 16, "kv_consumer")
    assert "--data-parallel-size" in lines[1] and "--enable-expert-parallel" in lines[1]
    # each of vLLM's 16 DP engine cores schedules under its own --max-num-seqs: the plan's
    # decode cap of 64 is 4 a rank (before: 64 each, 1024 in all)
    assert doc["inference"]["deployment"]["batch"] == 64
    assert decode["max_num_seqs"] == 4
    assert lines[1][lines[1].index("--max-num-seqs") + 1] == "4"


@pytest.mark.skipif(not os.environ.get(VLLM_PYTHON), reason=f"{VLLM_PYTHON} names no Python "
                    "with vllm (vLLM pulls its own CUDA torch; docs/exports.md's manual step)")
def test_vllm_accepts_every_export_as_planned():
    from bench.export_vllm import run

    found = run(os.environ[VLLM_PYTHON])
    assert len(found) == 15 + 5
    assert [c for c in found if not c.ok] == []
    assert all("(real)" in c.parser for c in found)


def test_offload_exports_pass_the_runtimes_rules():
    """Megatron-Core's layer-level CPU offload and hybrid device optimizer as exported pass
    its rules (and each rule bites); DeepSpeed's own ZeRO config reads the ZeRO-Offload."""
    from conftest import build_plan

    doc = build_plan(model="gpt3-1.3b", cluster="dgx-h100", global_batch=64, offload=True,
                     block_act_offload=[True] * 6 + [False] * 18)
    text = export_plan(Plan.from_dict(doc), "megatron").text
    megatron_reference(doc, text)
    with pytest.raises(Rejected, match="Pipeline parallelism"):
        megatron_reference(doc, text.replace("--pipeline-model-parallel-size 1",
                                             "--pipeline-model-parallel-size 2"))
    with pytest.raises(Rejected, match="recomputation"):
        megatron_reference(doc, text.replace("--cpu-offloading\n",
                                             "--cpu-offloading\n  --recompute-granularity "
                                             "selective\n"))
    with pytest.raises(Rejected, match="use-precision-aware-optimizer"):
        megatron_reference(doc, text.replace("--use-precision-aware-optimizer", ""))
    zero_config = pytest.importorskip("deepspeed.runtime.zero.config")
    config = json.loads(export_plan(Plan.from_dict(doc), "deepspeed").text)
    parsed = zero_config.DeepSpeedZeroConfig(**config["zero_optimization"])
    assert parsed.offload_optimizer is not None and parsed.offload_optimizer.device == "cpu"
