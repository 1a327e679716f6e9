"""Serving cost model against the measured inference runs (bench/inference.py): the issue's
targets where met, regression guards where not (docs/inference.md explains the misses)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import inference  # noqa: E402


@pytest.fixture(scope="module")
def rows():
    return inference.evaluate_all(readings=True)


@pytest.fixture(scope="module")
def summary(rows):
    return inference.summary(rows)


def test_throughput_per_gpu_meets_target(summary):
    m = summary["output_tokens_per_s_per_gpu"]
    assert m["n"] >= 34  # every measured throughput but the one predicted not to fit
    assert m["median_abs"] <= inference.TARGETS["output_tokens_per_s_per_gpu"]
    assert abs(m["bias"]["offline"]) <= 0.05
    # trtllm-bench's own caps on the offline rows: no memory-bound tp1 row off by a third
    assert m["max_abs"] <= 0.25


def test_latency_errors_do_not_regress(summary):
    # TPOT meets its 15 % target over every row since the InferenceX rows carry their published
    # deployments (bench/data/inferencex_deployments.yaml); TTFT its 20 % since a prefill pass
    # runs a prompt on each attention-DP rank and a closed-loop request waits out the running
    # iteration (session 10, docs/inference.md).
    assert summary["tpot_ms"]["n"] >= 40 and summary["ttft_ms"]["n"] >= 40
    assert summary["tpot_ms"]["median_abs"] <= inference.TARGETS["tpot_ms"]
    assert summary["ttft_ms"]["median_abs"] <= inference.TARGETS["ttft_ms"]
    # aggregated TPOT (where the runs' configuration is fully known) is unbiased
    assert abs(summary["tpot_ms"]["bias"]["aggregated"]) <= 0.10
    # aggregated TTFT is nearly unbiased (-8 %; the two piecewise-captured TensorRT-LLM MTP
    # rows are under-predicted, their eager attention's host time is not modelled,
    # docs/inference.md), and so are the rows whose decoding is known; the disaggregated rows
    # are over-predicted (+11 %, +29 % before the attention-DP prefill pass: TensorRT-LLM's
    # DeepSeek rows, docs/inference.md)
    assert abs(summary["ttft_ms"]["bias"]["aggregated"]) <= 0.10
    assert 0.0 < summary["ttft_ms"]["bias"]["disaggregated"] <= 0.15
    assert abs(summary[inference.KNOWN]["ttft_ms"]["bias"]) <= 0.10


def test_tpot_of_rows_whose_decoding_is_known_meets_target(summary):
    m = summary[inference.KNOWN]["tpot_ms"]
    assert m["n"] >= 30
    assert m["median_abs"] <= inference.TARGETS["tpot_ms"] and abs(m["bias"]) <= 0.05


def test_unstated_mtp_rows_read_better_as_one_draft(summary, rows):
    """The DeepSeek rows (a model with an MTP module) that do not state their speculation:
    read as one MTP draft their TPOT is unbiased, read as none over-predicted by far more
    than the rows whose decoding is known: they are reported apart, not fitted."""
    from planner.serve.evaluate import mtp_layers
    flagged = [r for r in rows if r.speculation_unknown()]
    assert flagged and all(mtp_layers(r.case.model) and r.case.speculative is None
                           for r in flagged)
    m = summary[inference.UNKNOWN]
    assert m["n"] >= 10 and m["draft_n"] == m["n"]
    assert m["draft_median_abs"] < m["median_abs"] and abs(m["draft_bias"]) <= 0.10
    assert m["bias"] > 0.3


def test_floor_flags_only_measurements_under_the_bytes_bound(rows):
    flagged = [r for r in rows if r.below_floor()]
    assert flagged and all(r.case.measured["tpot_ms"] < r.floor_ms() for r in flagged)
    # every flagged row is one the cost model over-predicts (it cannot go below the floor)
    assert all(r.error("tpot_ms") > 0 for r in flagged)


def test_best_configuration_ranking(summary):
    rank = summary["rank"]
    assert rank["groups"] >= 4
    assert rank["agree"] / rank["groups"] >= inference.RANK_TARGET


def test_calibrated_constants_within_physical_bounds():
    from planner.serve.runtime import CALIBRATED
    bounds = {"decode_hbm_efficiency": (0.55, 0.90), "prefill_efficiency": (0.6, 1.3)}
    for name, (lo, hi) in bounds.items():
        assert lo <= CALIBRATED[name] <= hi
    per_runtime = {"step_overhead_s": (0.0, 0.01), "prefill_queue_fraction": (0.0, 1.0),
                   "prefill_interference": (0.0, 1.0)}
    for name, (lo, hi) in per_runtime.items():
        assert set(CALIBRATED[name]) == {"vllm", "sglang", "trtllm"}
        assert all(lo <= v <= hi for v in CALIBRATED[name].values())


def test_every_entry_goes_through_the_same_rules():
    from inference_data import cases, entries
    assert len(cases()) == len(entries()) == 84


def test_published_deployments_replace_the_rows_defaults(rows):
    """The InferenceX rows' published facts (bench/data/inferencex_deployments.yaml, each with
    its source) are what the model evaluates: worker counts, degrees, the decode batch cap and
    the speculation; a row whose matching configs disagree on speculation stays unknown."""
    from inference_data import deployments
    facts = deployments()
    by_id = {r.case.id: r for r in rows}
    assert len(facts) >= 15 and all(f.get("source") for f in facts.values())
    for entry_id, f in facts.items():
        c = by_id[entry_id].case
        assert (c.speculative is None) == ("speculative_decoding" not in f)
        if f.get("speculative_decoding", "none") != "none":
            assert c.workload.draft_tokens == int(f["speculative_decoding"].split(":")[1])
        if "decode" in f:
            assert c.config.decode_workers == f["decode"]["workers"]
            assert c.config.prefill_workers == f["prefill"]["workers"]
            assert c.config.num_gpus == sum(f[r]["workers"] * f[r]["tp"]
                                            for r in ("prefill", "decode"))
            if "max_batch_size" in f["decode"]:
                assert c.config.batch == f["decode"]["max_batch_size"]


def test_a_decode_pool_short_of_slots_makes_requests_wait(rows):
    """Dynamo's TensorRT-LLM disaggregated flow admits a request to a decode slot first; with
    fewer slots (workers x batch cap) than the client's concurrency the rest wait for one. The
    GB200 row (3 decode workers of batch 8 at concurrency 36, MTP 3) measured 3,012 ms; the
    model without the published cap predicted 917 ms (-70 %), with it +6 %, and -13 % since
    its attention-DP prefill worker runs 8 prompts a pass (a faster closed loop, a shorter
    wait for a slot)."""
    row = next(r for r in rows if r.case.id.startswith(
        "aic-silicon-2026_03_25_deepseek_r1_gb200_trtllm_fp8_disagg"))
    ev = row.evaluation
    assert ev.max_concurrency == 24 < ev.concurrency == 36
    assert abs(row.error("ttft_ms")) <= 0.15
