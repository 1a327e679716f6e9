"""Speculative decoding with the model's multi-token-prediction module (``--speculative mtp:N``):
expected tokens per step, the verification pass, the draft module's weights and KV, the plan file
and the CLI's errors."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
from test_serve_model import _invoke  # in-process shardplan (one helper)

from clusters import load_cluster
from models import load_model
from planner.errors import PlannerError
from planner.serve.evaluate import evaluate_serving, mtp_layers
from planner.serve.memory import kv_bytes_per_token, weight_bytes_per_gpu
from planner.serve.workload import (MTP_ACCEPTANCE, ServingConfig, ServingWorkload,
                                    WorkerConfig, parse_speculative)


@pytest.fixture(scope="module")
def ds():
    return load_model("deepseek-v3")


@pytest.fixture(scope="module")
def h200():
    return load_cluster("dgx-h200")


def _wl(draft=0, acceptance=MTP_ACCEPTANCE, **kw):
    return ServingWorkload(isl=1024, osl=1024, concurrency=32, dtype="fp8", kv_dtype="fp8",
                           draft_tokens=draft, acceptance=acceptance, **kw)


def test_tokens_per_step_is_the_accepted_prefix():
    # DeepSeek-V3 report §5.4.3: the second token is accepted 85-90 % of the time
    assert MTP_ACCEPTANCE == 0.85
    assert _wl().tokens_per_step == 1.0
    assert _wl(1).tokens_per_step == pytest.approx(1.85)
    assert _wl(2).tokens_per_step == pytest.approx(1 + 0.85 + 0.85 ** 2)
    assert _wl(3, 0.5).tokens_per_step == pytest.approx(1.875)
    assert parse_speculative("mtp:2") == (2, MTP_ACCEPTANCE)
    assert parse_speculative("MTP:1:0.9") == (1, 0.9)
    assert parse_speculative(None) == (0, MTP_ACCEPTANCE)
    for bad in ("eagle:1", "mtp", "mtp:0", "mtp:9", "mtp:x", "mtp:1:1.0", "mtp:1:-0.1"):
        with pytest.raises(PlannerError):
            parse_speculative(bad)


def test_mtp_needs_a_model_with_an_mtp_module(h200):
    llama = load_model("llama-3.1-70b")
    assert mtp_layers(llama) == 0
    with pytest.raises(PlannerError, match="multi-token-prediction"):
        evaluate_serving(llama, h200, _wl(1), ServingConfig("aggregated",
                                                            worker=WorkerConfig(tp=8)))


def test_draft_module_weights_and_kv_are_one_more_block(ds):
    assert mtp_layers(ds) == 1
    w = WorkerConfig(tp=8)
    last = [layer for layer in ds.layers if layer.kind.name == "BLOCK"][-1]
    extra = weight_bytes_per_gpu(ds, w, "fp8", 1) - weight_bytes_per_gpu(ds, w, "fp8")
    routed = last.expert_params / 8  # moe_tp = 8 shards every expert
    assert routed < extra < 1.2 * (last.params / 8)
    blocks = sum(1 for _ in ds.blocks())
    assert kv_bytes_per_token(ds, w, "fp8", draft_layers=1) == pytest.approx(
        kv_bytes_per_token(ds, w, "fp8") * (blocks + 1) / blocks)


def test_mtp_decode_step_and_tpot(ds, h200):
    cfg = ServingConfig("aggregated", worker=WorkerConfig(tp=8))
    off = evaluate_serving(ds, h200, _wl(), cfg, "sglang")
    on = evaluate_serving(ds, h200, _wl(1), cfg, "sglang")
    it_off, it_on = off.pools[0].iteration, on.pools[0].iteration
    # the verification pass sees 2 tokens per sequence and the draft module adds one block:
    # dearer than a plain step, but at batch 32 decode still streams weights, so far less
    # than twice
    assert it_off.total_s < it_on.total_s < 1.5 * it_off.total_s
    tps = on.workload.tokens_per_step
    # output rate: tokens per step x sequences / step time
    assert on.output_tokens_per_s == pytest.approx(on.pools[0].batch * tps / it_on.total_s,
                                                   rel=1e-9)
    assert on.tpot_s < off.tpot_s
    assert on.output_tokens_per_s_per_gpu > off.output_tokens_per_s_per_gpu
    # disaggregated decode: TPOT is the decode step over the tokens it yields
    dcfg = ServingConfig("disaggregated", prefill=WorkerConfig(tp=8), decode=WorkerConfig(tp=8),
                         prefill_workers=1, decode_workers=1, batch=32)
    cluster = load_cluster("dgx-h200", nodes=2)
    dis = evaluate_serving(ds, cluster, _wl(2, mode="disaggregated"), dcfg, "sglang")
    assert dis.tpot_s == pytest.approx(dis.pools[1].iteration.total_s / (1 + 0.85 + 0.85 ** 2))


def test_plan_file_keeps_the_speculative_setting(tmp_path, capsys):
    out = tmp_path / "serve.json"
    args = ["plan", "--workload", "serve", "--model", "deepseek-v3", "--cluster", "dgx-h200",
            "--isl", "1024", "--osl", "1024", "--concurrency", "32", "--dtype", "fp8",
            "--kv-dtype", "fp8", "--runtime", "sglang", "--speculative", "mtp:1"]
    result = _invoke(args + ["-o", str(out)], capsys)
    assert result.returncode == 0, result.stderr
    doc = json.loads(out.read_text())
    assert doc["inference"]["workload"]["speculative"] == {
        "method": "mtp", "draft_tokens": 1, "acceptance": 0.85}
    check = _invoke(["check", str(out)], capsys)
    assert check.returncode == 0, check.stderr
    assert _invoke(args[:-1] + ["eagle:3"], capsys).returncode == 2
    no_mtp = [a if a != "deepseek-v3" else "llama-3.1-8b" for a in args]
    assert _invoke(no_mtp, capsys).returncode == 2


def test_speculative_workload_validation():
    with pytest.raises(PlannerError):
        _wl(9)
    with pytest.raises(PlannerError):
        replace(_wl(1), acceptance=1.0)
