"""The accuracy report's targets, as a regression guard on the calibrated defaults.

bench/accuracy.py re-evaluates every usable run of the three calibration files per regime
(docs/accuracy.md). Targets (issue 10): step time median |error| <= 7 %, no regime with a
median signed bias beyond +-5 %, memory median <= 7 %, every fit verdict right, 80 % bands
covering 70-90 %. Where docs/accuracy.md reports a miss, the guard pins today's level so it
cannot silently get worse.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.accuracy import (by_label, load_all, rank_agreement, run, stats,  # noqa: E402
                            zero_rows)
from planner.calibration.runs import eq3_flops, megatron_model_flops  # noqa: E402


@pytest.fixture(scope="module")
def rows():
    return run()[0]


def test_every_calibration_file_contributes(rows):
    files = {r.file for r in rows}
    assert files == {"published_runs.yaml", "modern_runs.yaml", "newer_gpu_runs.yaml"}
    assert stats(rows)["time_n"] >= 150
    runtimes = {r.run.regime.runtime for r in rows}
    assert runtimes == {"megatron", "torchtitan", "deepspeed", "fsdp"}


def test_overall_targets(rows):
    s = stats(rows)
    assert s["time_median"] <= 0.07  # target met (docs/accuracy.md)
    assert s["memory_median"] <= 0.07
    assert 0.70 <= s["time_coverage"] <= 0.90
    # memory bands: 92 % today (conservative; target 70-90 %)
    assert 0.70 <= s["memory_coverage"] <= 0.95
    assert s["fit_ok"] >= s["fit_n"] - 3  # three known misses (docs/accuracy.md)


def test_no_regime_is_biased_beyond_five_percent_except_torchtitan(rows):
    for key in (lambda r: r.run.regime.parallelism, lambda r: r.run.regime.generation,
                lambda r: r.run.regime.runtime):
        for label, st in by_label(rows, key).items():
            if label == "torchtitan":
                # the one known miss: 500 W power-capped H100s (docs/accuracy.md)
                assert -0.20 <= st["time_bias"] < 0
                continue
            if label == "tp":  # 4 runs: median of few
                assert abs(st["time_bias"]) <= 0.06
                continue
            assert abs(st["time_bias"]) <= 0.05, (label, st["time_bias"])


def test_runs_that_ran_are_predicted_to_fit(rows):
    wrong = [r.id for r in rows if r.fit_ok is False and not r.run.measured.oom]
    assert len(wrong) <= 1, wrong


def test_published_2022_runs_stay_accurate(rows):
    s = stats([r for r in rows if r.file == "published_runs.yaml"])
    assert s["time_median"] <= 0.06 and s["memory_median"] <= 0.05


def test_rank_agreement_is_measured_on_several_sources(rows):
    groups = rank_agreement(rows)
    assert len(groups) >= 5
    pairs = sum(g["pairs"] for g in groups)
    assert pairs >= 300
    assert sum(g["agree"] for g in groups) / pairs >= 0.62


def test_regimes_cover_the_search_space(rows):
    regimes = by_label(rows, lambda r: r.run.regime.parallelism)
    assert {"fsdp", "dp", "tp", "pp", "deep-pp", "cp"} <= set(regimes)


def test_flops_conventions_reproduce_published_numbers():
    # NeMo 24.07 LLAMA3-70B: 738 TFLOP/s per GPU at 1533 tokens/s/GPU (modern_runs.yaml)
    llama70 = {"layers": 80, "hidden": 8192, "heads": 64, "kv_heads": 8, "ffn_hidden": 28672,
               "vocab": 128256, "seq_len": 8192, "name": "LLAMA3-70B"}
    per_token = megatron_model_flops(llama70, 1, gated=True, causal_halved=False) / 8192
    assert per_token * 1533 / 1e12 == pytest.approx(738, rel=0.005)
    # Megatron-Bridge halves causal attention: 1861 TFLOP/s at 4143 tokens/s/GPU
    per_token = megatron_model_flops(llama70, 1, gated=True, causal_halved=True) / 8192
    assert per_token * 4143 / 1e12 == pytest.approx(1861, rel=0.005)
    # BLOOM-176B: Eq. 3 reproduces 149.77 TFLOP/s at 104.7 s per step on 384 GPUs
    bloom = {"layers": 70, "hidden": 14336, "vocab": 250880, "seq_len": 2048}
    assert eq3_flops(bloom, 2048) / (384 * 104.7) / 1e12 == pytest.approx(149.77, rel=0.005)


def test_zero_paper_worked_example():
    import yaml
    from bench.accuracy import DATA
    entries = yaml.safe_load((DATA / "published_runs.yaml").read_text())["entries"]
    for _, published, predicted in zero_rows(entries):
        assert abs(predicted / published - 1) < 0.005


def test_unusable_entries_say_why():
    _, skipped = load_all()
    reasons = {why for _, _, why in skipped}
    assert all(reasons)
    assert any("FP4" in why for why in reasons)
