"""The evaluate path end to end: FLOPs against published closed forms, the JSON contract, CLI."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from clusters import load_cluster
from cli.main import main
from models import load_model
from planner.config import ParallelConfig, RuntimeOptions
from planner.strategy import Recompute
from planner.cost.model import evaluate
from planner.strategy import uniform

FIXTURES = Path(__file__).parent / "fixtures"
HF = Path(__file__).parent.parent / "models" / "hf_configs"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as done:
        main(list(argv))
    out, err = capsys.readouterr()
    return done.value.code, out, err


@pytest.fixture(scope="module")
def gpt3():
    return load_model("gpt3-175b"), load_cluster("dgx-a100-80g", nodes=128)


def test_hardware_flops_match_narayanan_eq3(gpt3):
    # Narayanan et al. 2021 Eq. 3 counts full recomputation and non-causal attention, as eager
    # attention executes it: F = 96 B s l h^2 (1 + s/6h + V/16lh).
    model, cluster = gpt3
    B, s, l, h, V = 1536, 2048, 96, 12288, 51200
    config = ParallelConfig(tp=8, pp=16, dp=8, global_batch=B, seq_len=s, sp=True,
                            zero_stage=1)
    ev = evaluate(model, cluster, config, uniform(model, config, Recompute.FULL),
                  options=RuntimeOptions(attention_kernel="eager"))
    eq3 = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    assert ev.hw_flops == pytest.approx(eq3, rel=1e-9)


def test_model_flops_match_korthikanti_with_causal_attention_halved(gpt3):
    # Korthikanti et al. 2022 §6: F_model = 72 B s l h^2 (1 + s/6h + V/12lh) with non-causal
    # attention; we count the causal half (s/12h), as current Megatron-LM does.
    model, cluster = gpt3
    B, s, l, h, V = 1536, 2048, 96, 12288, 51200
    config = ParallelConfig(tp=8, pp=16, dp=8, global_batch=B, seq_len=s, sp=True, zero_stage=1)
    ev = evaluate(model, cluster, config)
    expected = 72 * B * s * l * h * h * (1 + s / (12 * h) + V / (12 * l * h))
    assert ev.model_flops == pytest.approx(expected, rel=1e-9)


def test_megatron_gpt3_175b_plausible(gpt3):
    # Narayanan et al. 2021 Table 1: 175B, 1024 A100, batch 1536, tp 8 pp 16 -> 140 TFLOP/s
    # (Eq. 3, with full recomputation): 31.5 s per step. Flash attention and sequence
    # parallelism make ours faster; the same configuration must land in the same regime.
    model, cluster = gpt3
    config = ParallelConfig(tp=8, pp=16, dp=8, global_batch=1536, seq_len=2048, sp=False,
                            zero_stage=1)
    ev = evaluate(model, cluster, config, uniform(model, config, Recompute.FULL),
                  options=RuntimeOptions(attention_kernel="eager"))
    published_s = 96 * 1536 * 2048 * 96 * 12288**2 * (1 + 2048 / (6 * 12288) + 51200 / (
        16 * 96 * 12288)) / (1024 * 140e12)
    assert ev.step_time_s == pytest.approx(published_s, rel=0.25)
    assert ev.fits
    assert all(s.memory.total < cluster.memory_bytes_per_gpu for s in ev.stages)
    assert 0.3 < ev.mfu < 0.6


def test_memory_grows_with_micro_batch_and_shrinks_with_recompute(gpt3):
    model, cluster = gpt3
    base = dict(tp=8, pp=16, dp=8, global_batch=1536, seq_len=2048, sp=True, zero_stage=1)
    peaks = [evaluate(model, cluster, ParallelConfig(**base, micro_batch=b)).peak_memory_bytes
             for b in (1, 2, 4)]
    assert peaks[0] < peaks[1] < peaks[2]
    config = ParallelConfig(**base)
    by_recompute = [evaluate(model, cluster, config, uniform(model, config, r)).peak_memory_bytes
                    for r in (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)]
    assert by_recompute[0] >= by_recompute[1] > by_recompute[2]


def test_zero_stages_shrink_state_memory(gpt3):
    model, cluster = gpt3
    base = dict(tp=8, pp=16, dp=8, global_batch=1536, seq_len=2048, sp=True)
    states = []
    for zero in (0, 1, 2, 3):
        ev = evaluate(model, cluster, ParallelConfig(**base, zero_stage=zero))
        m = ev.stages[1].memory
        states.append(m.params + m.grads + m.optimizer)
    assert states[0] > states[1] > states[2] > states[3]
    # Megatron layout: 18 B/param without ZeRO; distributed optimizer 6 + 12/8 B/param
    assert states[1] / states[0] == pytest.approx((6 + 12 / 8) / 18, rel=1e-9)


EVALUATE = ["evaluate", "--model", "gpt3-175b", "--cluster", "dgx-a100-80g", "--nodes", "128",
            "--global-batch", "1536", "--tp", "8", "--pp", "16", "--micro-batch", "1",
            "--recompute", "full"]


def test_evaluate_json_contract(capsys):
    code, out, err = run(capsys, *EVALUATE, "--json")
    assert code == 0
    doc = json.loads(out)
    assert set(doc["model"]) >= {"name", "params", "active_params", "num_layers"}
    assert set(doc["cluster"]) >= {"name", "gpu", "num_gpus", "gpus_per_node", "gpu_memory_gib"}
    assert set(doc["parallelism"]) >= {"dp", "tp", "pp", "cp", "ep", "sp", "zero_stage",
                                       "micro_batch", "global_batch", "num_micro_batches",
                                       "virtual_stages", "recompute"}
    assert set(doc["predicted"]) >= {"step_time_s", "tokens_per_s", "model_tflops_per_gpu",
                                      "mfu", "peak_memory_gib", "fits"}
    p = doc["parallelism"]
    assert p["dp"] * p["tp"] * p["pp"] * p["cp"] == doc["cluster"]["num_gpus"] == 1024
    assert p["num_micro_batches"] == 1536 // (p["micro_batch"] * p["dp"])
    assert len(doc["stages"]) == 16
    placed = [name for stage in doc["stages"] for name in stage["layers"]]
    assert len(placed) == len(set(placed)) == 98  # embedding + 96 blocks + head
    for stage in doc["stages"]:
        mem = stage["memory_gib"]
        assert set(mem) == {"params", "grads", "optimizer", "activations", "other", "total"}
        parts = mem["params"] + mem["grads"] + mem["optimizer"] + mem["activations"] + mem["other"]
        assert parts == pytest.approx(mem["total"], rel=1e-4)
    assert doc["predicted"]["peak_memory_gib"] == pytest.approx(
        max(s["memory_gib"]["total"] for s in doc["stages"]), rel=1e-4)
    assert "Traceback" not in err


def test_evaluate_tables_on_stderr(capsys):
    code, out, err = run(capsys, *EVALUATE)
    assert code == 0 and out == ""
    assert "Memory per GPU" in err and "Step time" in err


def test_a_configuration_that_does_not_fit_exits_1_with_its_prediction(capsys):
    """README / docs/reliability.md: exit 1 = does not fit, as `evaluate --workload serve` and
    `check` answer; the prediction is still printed (one JSON document). It exited 0."""
    base = ("evaluate", "-m", "llama-3.1-70b", "-c", "dgx-h100", "--global-batch", "8",
            "--tp", "8", "--json")
    code, out, _ = run(capsys, *base, "--pp", "1")
    doc = json.loads(out)
    assert code == 1 and doc["predicted"]["fits"] is False
    assert doc["predicted"]["peak_memory_gib"] > 80
    code, out, _ = run(capsys, *base, "--nodes", "2", "--pp", "2", "--recompute", "full")
    assert code == 0 and json.loads(out)["predicted"]["fits"] is True


def test_evaluate_names_what_its_runtime_cannot_run(capsys):
    """evaluate --runtime R predicts any configuration (a what-if) but says what R cannot run,
    with check --runtime R's rules: it said nothing (fsdp at tp 2, DeepSpeed ZeRO-2 under PP,
    Megatron with ZB-V were predicted silently)."""
    base = ("evaluate", "-m", "llama-3.1-8b", "-c", "dgx-h100", "--global-batch", "64")
    code, out, _ = run(capsys, *base, "--tp", "2", "--pp", "1", "--runtime", "fsdp", "--json")
    problems = json.loads(out)["runtime_problems"]
    assert code == 0 and "fsdp cannot run tensor parallelism (degree 2): it has none" in problems
    code, _, err = run(capsys, *base, "--tp", "1", "--pp", "2", "--zero", "2", "--runtime",
                       "deepspeed")
    assert "warning: runtime: deepspeed cannot run ZeRO-2 with pipeline parallelism" in \
        " ".join(err.split())
    code, out, _ = run(capsys, *base, "--tp", "1", "--pp", "2", "--zero", "1", "--runtime",
                       "deepspeed", "--json")
    assert json.loads(out)["runtime_problems"] == []


def test_headline_names_chunks_per_rank_and_hybrid_sharding(capsys):
    """The one line an engineer reads first says everything the runtime is configured with:
    the interleaved schedule's chunks per rank (Megatron --num-virtual-stages-per-pipeline-rank)
    and the HSDP shard group."""
    base = ("evaluate", "-m", "gpt3-1.3b", "-c", "dgx-a100-80g", "--nodes", "2",
            "--global-batch", "64")
    code, _, err = run(capsys, *base, "--tp", "1", "--pp", "4", "--virtual-stages", "3")
    assert code == 0
    assert "interleaved-1f1b with 3 chunks per rank" in " ".join(err.split())
    code, _, err = run(capsys, *base, "--tp", "1", "--pp", "1", "--zero", "3", "--dp-shard", "8",
                       "--runtime", "torchtitan")
    assert code == 0
    assert "ZeRO-3 (sharded over 8 of dp 16)" in " ".join(err.split())
    code, _, err = run(capsys, *base, "--tp", "1", "--pp", "4")
    assert code == 0 and "chunks per rank" not in err and "sharded over" not in err


@pytest.mark.parametrize("name,key", [
    ("gpt2.json", "total"), ("Llama-3.1-8B-Instruct.json", "total"),
    ("Llama-3.1-70B-Instruct.json", "total"), ("Mixtral-8x7B-v0.1.json", "total"),
    ("Qwen2.5-72B-Instruct.json", "total"), ("DeepSeek-V3.json", "total"),
    ("bert-base-uncased.json", "total_with_mlm_head"), ("t5-small.json", "total"),
])
def test_inspect_counts_every_fixture_exactly(capsys, name, key):
    expected = json.loads((FIXTURES / "expected_params.json").read_text())[name]
    code, out, _ = run(capsys, "inspect", "--model", str(HF / name), "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["params"] == expected[key]
    if "active" in expected:
        assert doc["active_params"] == expected["active"]


def test_models_and_clusters_list_presets(capsys):
    code, out, _ = run(capsys, "models", "--json")
    names = {m["name"] for m in json.loads(out)["models"]}
    assert code == 0
    assert {"gpt3-1.3b", "gpt3-2.7b", "gpt3-6.7b", "gpt3-13b", "gpt3-175b", "llama-2-7b",
            "llama-2-70b", "llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "mixtral-8x7b",
            "deepseek-v3", "qwen2.5-72b", "tiny"} <= names
    code, out, _ = run(capsys, "clusters", "--json")
    names = {c["name"] for c in json.loads(out)["clusters"]}
    assert {"dgx-a100-40g", "dgx-a100-80g", "dgx-h100", "dgx-h200", "dgx-b200", "mi300x",
            "tiny"} <= names


@pytest.mark.parametrize("argv,needle", [
    (["inspect", "--model", "/no/such/config.json"], "no/such/config.json"),
    (["inspect", "--model", "gpt-9"], "unknown"),
    (["evaluate", "--model", "tiny", "--cluster", "tiny", "--global-batch", "8", "--tp", "3",
      "--pp", "1"], "tp x pp x cp"),
    (["evaluate", "--model", "tiny", "--cluster", "tiny", "--global-batch", "7", "--tp", "1",
      "--pp", "1"], "not divisible"),
    (["evaluate", "--model", "tiny", "--cluster", "nope", "--global-batch", "8", "--tp", "1",
      "--pp", "1"], "nope"),
])
def test_bad_input_exit_code_2_without_traceback(capsys, argv, needle):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert needle.lower() in err.lower()
    assert "Traceback" not in err + out
    code, out, err = run(capsys, *argv, "--json")
    assert code == 2
    error = json.loads(out)["error"]
    assert error["exit_code"] == 2 and needle.lower() in error["message"].lower()


def test_malformed_config_file(capsys, tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "llama", "hidden_size": ')
    code, out, err = run(capsys, "inspect", "--model", str(bad))
    assert code == 2 and "Traceback" not in err


def test_clusters_lists_the_multi_pool_presets(capsys):
    """`plan-pools -c h100-a100` (README) names a preset that `clusters` did not list: it read
    the one-pool presets only."""
    from clusters import pool_preset_names

    assert "h100-a100" in pool_preset_names()
    code, out, _ = run(capsys, "clusters", "--json")
    pooled = {c["name"]: c for c in json.loads(out)["pool_clusters"]}
    assert code == 0 and set(pooled) == set(pool_preset_names())
    assert [(p["name"], p["gpu"], p["num_nodes"]) for p in pooled["h100-a100"]["pools"]] == \
        [("h100", "h100-sxm", 16), ("a100", "a100-sxm4-80gb", 32)]
    code, _, err = run(capsys, "clusters")
    assert code == 0 and "Multi-pool cluster presets" in err and "h100-a100" in err
