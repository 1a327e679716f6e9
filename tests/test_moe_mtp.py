"""Multi-token prediction (models/mtp.py): DeepSeek-V3's MTP module as one more block, eh_proj
and a loss head on the last pipeline stage, counted in FLOPs, memory and the solver."""
from __future__ import annotations

from dataclasses import replace

import pytest
import yaml

from clusters import load_cluster
from models import load_model
from models.mtp import with_mtp
from planner.config import ParallelConfig
from planner.cost.model import evaluate, model_flops_per_step
from planner.errors import PlannerError
from planner.ir import LayerKind
from planner.solve.bruteforce import brute_force
from planner.solve.search import SearchOptions, search
from planner.solve.space import Pins
from planner.strategy import uniform

DS = load_model("deepseek-v3")


def test_mtp_module_counts_one_block_eh_proj_and_norms():
    """DeepSeek-V3's published 685B counts its MTP module (671B + 14B) with its own embedding
    and head copies; shared, as training runs it, the module adds one MoE block, the 2h x h
    eh_proj and three norms."""
    mtp = with_mtp(DS, 1)
    h, v = DS.hidden, DS.vocab
    block = [layer for layer in DS.layers if layer.kind is LayerKind.BLOCK][-1]
    assert mtp.params - DS.params == block.params + 2 * h * h + 3 * h
    assert mtp.num_blocks == DS.num_blocks == 61 and mtp.num_mtp == 1
    # the checkpoint's count, with the module's own embedding and head: 685B
    assert (mtp.params + 2 * v * h) / 1e9 == pytest.approx(685, abs=1)
    assert with_mtp(DS, 0) is DS
    with pytest.raises(PlannerError):
        with_mtp(mtp, 1)
    with pytest.raises(PlannerError):
        with_mtp(DS, -1)


def test_mtp_runs_on_the_last_stage_and_costs_a_block_plus_a_head():
    config = ParallelConfig(tp=1, pp=16, dp=128, ep=64, etp=1, global_batch=15360, seq_len=4096,
                            zero_stage=1, dtype="fp8")
    mtp = with_mtp(DS, 1)
    placement = uniform(mtp, config, "full")
    kinds = [layer.kind for layer in mtp.layers]
    assert kinds[-2:] == [LayerKind.MTP, LayerKind.HEAD]
    assert placement.stage[-1] == placement.stage[-2] == 15
    cluster = load_cluster("hgx-h800", nodes=256)
    base = evaluate(DS, cluster, config, uniform(DS, config, "full"))
    more = evaluate(mtp, cluster, config, placement)
    assert more.stages[-1].time_s > base.stages[-1].time_s
    assert [s.time_s for s in more.stages[:-1]] == [s.time_s for s in base.stages[:-1]]
    assert more.stages[-1].memory.total > base.stages[-1].memory.total  # + block, embedding copy
    # model FLOPs: one MoE block, eh_proj and a second LM head per token
    extra = model_flops_per_step(mtp, config) / model_flops_per_step(DS, config) - 1
    assert 0.03 < extra < 0.045


def test_mtp_flops_match_megatron_bridge_model_tflops():
    """Megatron-Bridge's published model TFLOP/s of DeepSeek-V3 (recipe mtp_num_layers 1) equal
    the library's model FLOPs with one MTP module within 1 %, and 3.8 % more than without."""
    entries = yaml.safe_load(open("bench/data/moe_runs.yaml"))["entries"]
    entry = next(e for e in entries if e["id"] == "mbridge-26.06-DeepSeek-V3-GB200-256gpu-mxfp8")
    t, r, c = entry["training"], entry["results"], entry["cluster"]
    tokens = t["global_batch"] * entry["model"]["seq_len"]
    step_s = tokens / (r["tokens_per_sec_per_gpu"] * c["num_gpus"])
    published = r["tflops_per_gpu"] * 1e12 * c["num_gpus"] * step_s
    config = ParallelConfig(tp=1, pp=4, dp=64, ep=64, global_batch=t["global_batch"],
                            seq_len=4096)
    assert model_flops_per_step(with_mtp(DS, 1), config) == pytest.approx(published, rel=0.01)
    assert model_flops_per_step(DS, config) < 0.97 * published


def test_solver_places_mtp_and_matches_brute_force():
    tiny = with_mtp(load_model("tiny-moe"), 1)
    hw = load_cluster("tiny")
    hw = replace(hw, gpu=replace(hw.gpu, memory_gib=0.2))
    pins = Pins(zero=1, sp=True)
    got = search(tiny, hw, 16, 128, "bf16", pins, SearchOptions())
    want = brute_force(tiny, hw, 16, 128, "bf16", pins).best
    assert got.record.status == "OPTIMAL" and want is not None
    assert got.best.step_time_s == pytest.approx(want.step_time_s, rel=1e-6)
    assert got.best.placement.stage[-1] == got.best.config.pp - 1


def test_cli_plans_with_mtp_and_exports_mtp_num_layers(tmp_path, capsys):
    """``plan --mtp-layers 1`` writes a plan whose model holds the MTP module (on the last of
    two pipeline stages, pinned so the search stays short); ``check`` re-validates it and the
    Megatron export carries ``--mtp-num-layers 1``."""
    import json

    from conftest import run_cli
    out = tmp_path / "plan.json"
    code, _, err = run_cli(["plan", "-m", "tiny-moe", "-c", "tiny", "--global-batch", "16",
                            "--mtp-layers", "1", "--work-limit", "20", "--pin", "pp=2",
                            "--pin", "tp=1", "-o", out], capsys)
    assert code == 0, err
    doc = json.loads(out.read_text())
    assert [x["kind"] for x in doc["layers"]][-2:] == ["mtp", "head"]
    assert doc["parallelism"]["pp"] == 2 and doc["layers"][-2]["stage"] == 1
    code, _, err = run_cli(["check", out], capsys)
    assert code == 0, err
    code, text, err = run_cli(["export", out, "--format", "megatron"], capsys)
    assert code == 0, err
    assert "--mtp-num-layers 1" in text or "--mtp-num-layers=1" in text
    # torchtitan has no command line or job-file form of MTP: the export says it drops it
    # (it wrote the last stage's blocks, norm and output, and said nothing of the module)
    for version in ("0.3", "0.2.2"):
        code, text, err = run_cli(["export", out, "--format", "torchtitan",
                                   "--target-version", version], capsys)
        assert code == 0, err
        assert "warning: multi-token prediction (1 MTP module(s) on the last stage): not " \
               "exported" in err, err
    code, _, err = run_cli(["evaluate", "-m", "tiny-moe", "-c", "tiny", "--global-batch", "16",
                            "--tp", "1", "--pp", "2", "--mtp-layers", "9"], capsys)
    assert code == 2
