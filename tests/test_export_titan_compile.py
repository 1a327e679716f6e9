"""A compiled plan's torchtitan export compiles the model, whatever the registry entry says.

torchtitan's ``deepseek_v3_16b`` / ``deepseek_v3_671b`` registry entries compile the loss
alone (``CompileConfig(enable=True, components=["loss"])``). The export wrote
``--compile.enable --compile.enable_async_tensor_parallel`` over them, and torchtitan 0.3
refused the file ("Async TP requires 'model' in --compile.components"); a compiled plan without
async TP ran its model eager (the plan's fused element-wise cost, silently not what ran). The
export now names the components (``--compile.components model,loss``; 0.2.2:
``components = ["model", "loss"]``).
"""
from __future__ import annotations

import importlib.util
import os

import pytest

from conftest import build_plan
from planner.config import RuntimeOptions
from planner.export import export_plan
from planner.plan_types import Plan

TORCHTITAN_022_ENV = "SHARDPLAN_TORCHTITAN_022_PATH"


@pytest.fixture(scope="module")
def plans() -> dict[str, Plan]:
    """DeepSeek-V3 on 256 H100, pp 16: tp 4 ep 4 with TP overlap (async TP, compiled), and
    tp 1 ep 16 compiled (no async TP)."""
    base = dict(model="deepseek-v3", cluster="dgx-h100", nodes=32, global_batch=1024,
                seq_len=4096, pp=16)
    async_tp = build_plan(**base, tp=4, ep=4, runtime=RuntimeOptions(
        runtime="zero-paper", profile="torchtitan", tp_comm_overlap=0.9, compiled=True))
    compiled = build_plan(**base, tp=1, ep=16, runtime=RuntimeOptions(
        runtime="zero-paper", profile="torchtitan", compiled=True))
    return {"async-tp": Plan.from_dict(async_tp), "compiled": Plan.from_dict(compiled)}


@pytest.mark.parametrize("name", ["async-tp", "compiled"])
def test_the_model_is_a_compiled_component(plans, name):
    cli = export_plan(plans[name], "torchtitan").text
    assert "  --compile.components model,loss\n  --compile.enable\n" in cli
    assert ("--compile.enable_async_tensor_parallel" in cli) == (name == "async-tp")
    assert "[compile]\nenable = true\ncomponents = [\"model\", \"loss\"]\n" in \
        export_plan(plans[name], "torchtitan", "0.2.2").text


@pytest.mark.skipif(importlib.util.find_spec("torchtitan") is None,
                    reason="torchtitan is not installed (pip install -e '.[runtimes]')")
def test_torchtitan_accepts_it_with_the_model_compiled(plans):
    from bench.export_runtimes import run_worker

    texts = [export_plan(plans[name], "torchtitan").text for name in ("async-tp", "compiled")]
    results = run_worker("torchtitan", [{"text": t, "notes": [], "world": 256, "arch": 9}
                                        for t in texts])
    for result in results[:2]:
        assert result["accepted"], result
        assert result["derived"]["compile"] is True  # enable and "model" in components
    assert results[0]["derived"]["tp"] == 4 and results[1]["derived"]["ep"] == 16


@pytest.mark.skipif(not os.environ.get(TORCHTITAN_022_ENV),
                    reason=f"{TORCHTITAN_022_ENV} names no torchtitan 0.2.2 folder")
def test_torchtitan_022_compiles_the_model(plans):
    from bench.export_runtimes import run_worker

    text = export_plan(plans["compiled"], "torchtitan", "0.2.2").text
    results = run_worker("torchtitan-0.2.2", [{"text": text, "world": 256}],
                         path_first=os.environ[TORCHTITAN_022_ENV])
    assert results[0]["accepted"], results[0]
    assert results[0]["derived"]["compile"] is True


def test_an_fp8_deepseek_plan_takes_the_float8_registry_entry(plans):
    """torchtitan 0.3 sets Float8 training only in a registry entry's model converters; it
    ships deepseek_v3_671b_float8 (Float8 Linears but lm_head and router.gate, Float8 grouped
    experts). An fp8 DeepSeek-V3 plan was exported with deepseek_v3_671b and a warning to
    enable Float8 'yourself'; a model without such an entry keeps the warning."""
    fp8 = Plan.from_dict(build_plan(model="deepseek-v3", cluster="dgx-h100", nodes=32,
                                    global_batch=1024, seq_len=4096, pp=16, tp=1, ep=16,
                                    dtype="fp8"))
    result = export_plan(fp8, "torchtitan")
    assert "  --module deepseek_v3 --config deepseek_v3_671b_float8\n" in result.text
    assert not any(w.startswith("dtype fp8") for w in result.warnings), result.warnings
    assert any(w.startswith("dtype fp8") for w in export_plan(fp8, "torchtitan", "0.2.2").warnings)
    bf16 = export_plan(plans["compiled"], "torchtitan").text
    assert "--config deepseek_v3_671b\n" in bf16
    llama = Plan.from_dict(build_plan(model="llama-3.1-8b", cluster="dgx-h100", tp=2,
                                      global_batch=64, dtype="fp8"))
    warned = export_plan(llama, "torchtitan")
    assert "--config llama3_8b\n" in warned.text
    assert any(w.startswith("dtype fp8") for w in warned.warnings)
    if importlib.util.find_spec("torchtitan") is None:
        pytest.skip("torchtitan is not installed (pip install -e '.[runtimes]')")
    from bench.export_runtimes import run_worker

    done = run_worker("torchtitan", [{"text": t, "notes": [], "world": 256, "arch": 9}
                                     for t in (result.text, bf16)])
    assert [r["accepted"] for r in done[:2]] == [True, True], done
    assert [r["derived"]["float8"] for r in done[:2]] == [True, False]
