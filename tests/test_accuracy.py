"""The accuracy report's targets, as a regression guard on the calibrated defaults.

bench/accuracy.py re-evaluates every usable run of the three calibration files per regime
(docs/accuracy.md). Targets (issue 10): step time median |error| <= 7 %, no regime with a
median signed bias beyond +-5 %, memory median <= 7 %, every fit verdict right, 80 % bands
covering 70-90 %, measured configurations ranked as measured. The guards sit just above what
docs/accuracy.md reports today (tight, so that a regression fails); where it reports a miss,
they pin today's level.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import landing  # noqa: E402
from cli.main import main as main_cli  # noqa: E402
from bench.accuracy import (by_label, landing_section, load_all,  # noqa: E402
                            misordered_by_cause, rank_agreement, read_entries, run,
                            source_noise, stats, zero_rows)
from planner.calibration.regimes import recompute_kinds, regime_of  # noqa: E402
from planner.calibration.store import shipped  # noqa: E402
from planner.calibration.runs import eq3_flops, megatron_model_flops  # noqa: E402


@pytest.fixture(scope="module")
def loaded():
    """Every calibration file read and translated once for the module (bench/accuracy.py)."""
    return load_all()


@pytest.fixture(scope="module")
def rows(loaded):
    """Every usable run evaluated once, with the shipped constants and bands."""
    return run(loaded=loaded)[0]


def test_every_calibration_file_contributes(rows):
    files = {r.file for r in rows}
    assert files == {"published_runs.yaml", "modern_runs.yaml", "newer_gpu_runs.yaml"}
    assert stats(rows)["time_n"] >= 150
    runtimes = {r.run.regime.runtime for r in rows}
    assert runtimes == {"megatron", "torchtitan", "deepspeed", "fsdp"}


def test_overall_targets(rows):
    s = stats(rows)
    assert s["time_median"] <= 0.035  # 3.0 % today (target 7 %)
    assert s["time_max"] <= 0.30  # 27.1 % today (Megatron-Core weak scaling 32B, tp 8)
    assert s["memory_median"] <= 0.035  # 2.9 % today (target 7 %)
    assert 0.70 <= s["time_coverage"] <= 0.90
    assert 0.70 <= s["memory_coverage"] <= 0.90
    assert s["fit_ok"] >= s["fit_n"] - 1  # the 206B BLOOM-prequel OOM run (docs/accuracy.md)


def test_no_regime_is_biased_beyond_five_percent(rows):
    for key in (lambda r: r.run.regime.parallelism, lambda r: r.run.regime.generation,
                lambda r: r.run.regime.runtime):
        for label, st in by_label(rows, key).items():
            assert abs(st["time_bias"]) <= 0.05, (label, st["time_bias"])


def test_runs_that_ran_are_predicted_to_fit(rows):
    wrong = [r.id for r in rows if r.fit_ok is False and not r.run.measured.oom]
    assert not wrong, wrong


def test_published_2022_runs_stay_accurate(rows):
    s = stats([r for r in rows if r.file == "published_runs.yaml"])
    assert s["time_median"] <= 0.04 and s["memory_median"] <= 0.035


def test_rank_agreement_is_measured_on_several_sources(rows):
    groups = rank_agreement(rows)
    assert len(groups) >= 5
    pairs = sum(g["pairs"] for g in groups)
    assert pairs >= 380
    assert sum(g["agree"] for g in groups) / pairs >= 0.87  # 342/388 (88 %) today


def test_rank_agreement_above_each_sources_noise(rows):
    groups = rank_agreement(rows, above_noise=True)
    pairs = sum(g["pairs"] for g in groups)
    assert pairs >= 300
    assert sum(g["agree"] for g in groups) / pairs >= 0.90  # 285/310 (92 %) today


def test_only_the_bloom_sweep_is_misordered(rows):
    # every misordered pair of the other sources was fixed in the terms (docs/accuracy.md)
    causes = misordered_by_cause(rows)
    assert causes and all(src.startswith("BigScience") for src, *_ in causes)


def test_source_noise_is_measured_from_repeats(rows):
    noise = source_noise(rows)
    bloom = [v for k, v in noise.items() if k.startswith("BigScience")]
    assert bloom and 0.05 < bloom[0] < 0.07  # 0221 vs 0225 rows of one configuration


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
    zero = zero_rows(read_entries("published_runs.yaml"))
    assert len(zero) == 4  # ZeRO paper Figure 1: stages 0-3
    for _, published, predicted in zero:
        assert abs(predicted / published - 1) < 0.005


def test_unusable_entries_say_why(loaded):
    _, skipped = loaded
    reasons = {why for _, _, why in skipped}
    assert all(reasons)
    assert any("FP4" in why for why in reasons)


# -- the terms behind the fixes (planner/cost/terms.py), checked by their arithmetic ---------

def _evaluate(runtime: str, **config):
    from dataclasses import replace as _replace

    from clusters import load_cluster
    from models import load_model
    from planner.calibration.session import runtime_setup
    from planner.config import ParallelConfig
    from planner.cost.model import evaluate
    model = load_model("gpt3-1.3b")
    setup = runtime_setup(load_cluster("dgx-h100", nodes=4), runtime, calibration=None)
    base = dict(tp=4, pp=4, dp=2, global_batch=64, seq_len=2048, micro_batch=1,
                sp=False, zero_stage=1)
    base.update(config)
    options = _replace(setup.options, **config.pop("options", {})) if "options" in config \
        else setup.options
    base.pop("options", None)
    return evaluate(model, setup.cluster, ParallelConfig(**base), options=options)


def test_deepspeed_splits_stage_boundaries_over_the_tensor_group():
    from planner.cost import comm
    from planner.cost.context import make_context
    from planner.cost.memory import ACT_BYTES
    from planner.cost.terms import config_terms
    ds, mg = _evaluate("deepspeed"), _evaluate("megatron")
    ctx = make_context(ds.model, ds.cluster, ds.config, ds.options)
    whole = ctx.shard.tokens * ds.model.hidden * ACT_BYTES
    # deepspeed: 1/tp over the pipeline link, then an all-gather over the tensor group
    want = 2 * (comm.p2p_s(whole / 4, ctx.links.pp) + comm.all_gather_s(whole, 4, ctx.links.tp))
    assert config_terms(ctx).boundary_s == pytest.approx(want)
    mctx = make_context(mg.model, mg.cluster, mg.config, mg.options)
    assert config_terms(mctx).boundary_s == pytest.approx(2 * comm.p2p_s(whole, mctx.links.pp))


def test_fsdp2_under_pp_keeps_weights_and_gradients_unsharded():
    from planner.cost.context import make_context
    from planner.cost.terms import UNSHARDED_GRAD_BYTES, config_terms, layer_terms
    pp = _evaluate("torchtitan", zero_stage=3, sp=True)
    flat = _evaluate("torchtitan", zero_stage=3, sp=True, pp=1, dp=8)
    ctx = make_context(pp.model, pp.cluster, pp.config, pp.options)
    assert not config_terms(ctx).per_micro_batch_sync  # one gather, one reduce per step
    assert config_terms(ctx).dp_gather_dense.slope_s_per_byte > 0
    block = next(i for i, l in enumerate(pp.model.layers) if l.kind.value == "block")
    t = layer_terms(ctx, pp.model.layers[block], pp.placement.options[block])
    sharded = pp.options.state_bytes(pp.config.zero_stage).weights * t.dense_params / pp.config.dp
    assert t.params_bytes == pytest.approx(sharded + pp.options.state_bytes(pp.config.zero_stage).weights
                                           * t.dense_params)
    assert t.grads_bytes >= UNSHARDED_GRAD_BYTES * t.dense_params
    assert t.gather_buffer_bytes == 0
    fctx = make_context(flat.model, flat.cluster, flat.config, flat.options)
    assert config_terms(fctx).per_micro_batch_sync  # without PP: FSDP gathers per micro-batch


def test_block_overhead_is_charged_per_block_and_pass():
    base = _evaluate("megatron", pp=1, dp=8, options={"block_overhead_s": 0.0})
    slow = _evaluate("megatron", pp=1, dp=8, options={"block_overhead_s": 0.001})
    m = base.config.num_micro_batches
    blocks = base.model.num_blocks
    # forward and backward of every block on the one stage, every micro-batch (no recompute)
    assert slow.breakdown.pipeline_s - base.breakdown.pipeline_s == pytest.approx(
        2 * 0.001 * blocks * m, rel=1e-6)


def _holdout():
    import json

    from bench.accuracy import DATA
    return json.loads((DATA / "holdout.json").read_text())


def test_held_out_estimate_is_current(rows):
    """bench/holdout.py's leave-one-source-out result (docs/accuracy.md) was made with today's
    constants (regenerate it after adding or removing one) and estimates the held-out target."""
    from planner.calibration.constants import PARAM_NAMES
    data = _holdout()
    sources = {r.run.source.split("(")[0].strip() for r in rows}
    assert len(data["folds"]) >= 8 and len(sources) >= len(data["folds"])
    for fold in data["folds"]:
        assert set(fold["constants"]) == set(PARAM_NAMES)
        assert fold["rows"] and fold["bands"]["step_time"]["pooled"]["n"] > 0
    summary = data["summary"]
    assert summary["time_n"] == stats(rows)["time_n"]
    assert summary["time_median"] <= 0.042  # 3.9 % (issue 10's held-out target: 10 %)
    assert summary["time_max"] <= 0.30  # 29.3 % (target 30 %: Megatron-Core weak scaling 32B)
    assert summary["agree"] / summary["pairs"] >= 0.87  # 341/388 (88 %; target 90 %)
    from bench.accuracy import held_out_rows
    noisy = rank_agreement(held_out_rows(rows, data), above_noise=True)
    pairs = sum(g["pairs"] for g in noisy)
    assert pairs >= 300 and sum(g["agree"] for g in noisy) / pairs >= 0.90  # 286/310 (92 %)
    # the shipped band construction's coverage of runs of a source it was built without
    # (nominal 80 %, target 70-90 %): 72 % step time (77 % before the eager core's GEMMs were
    # charged their score traffic: the between-source spread narrowed) since session 10 counts
    # band centres by sources (69 % counted by runs: one source with many runs set the centre
    # of every runtime sharing its label), 80 % memory
    nested = summary["nested_coverage"]["widened"]
    assert 0.70 <= nested["step_time"] <= 0.90 and 0.75 <= nested["memory"] <= 0.90
    assert summary["time_coverage"] >= 0.55  # 63 %: the fold's in-sample bands, not widened
    from bench.holdout import between_source_sigma, nested_coverage
    assert between_source_sigma(data["folds"]) == summary["between_source_sigma"]
    assert nested_coverage(data["folds"])["widened"] == summary["nested_coverage"]["widened"]


def test_between_source_spread_is_measured_about_the_band_centre():
    """bench/holdout.py ``between_source_sigma`` measures a held-out source's offset from the
    centre of the band its runs get (the label's in-sample median, shrunk toward the pooled
    one: planner/calibration/bands.py ``centre``), not from zero: runs that sit at their band's
    centre carry no offset, runs at zero under a band centred at -8 % carry 8 %."""
    import math

    from bench.holdout import between_source_sigma
    from planner.calibration.bands import (MAD_TO_SIGMA, MIN_SIGMA, NOMINAL_COVERAGE,
                                           PRIOR_RUNS, band, build_table, centre, z_of)
    labels = ["regime:x/y/deep-pp", "parallelism:deep-pp"]
    # the fold's in-sample residuals: 13 deep-pp runs at -0.08 and 20 others at 0
    samples = ([("step_time", -0.08 + 0.01 * (i % 3 - 1), labels, 8, 1e9) for i in range(13)]
               + [("step_time", 0.01 * (i % 3 - 1), ["regime:a/b/pp"], 8, 1e9)
                  for i in range(20)])
    table = build_table(samples)
    mu = centre(table, "step_time", labels)
    pooled = table.pooled["step_time"]
    assert mu == pytest.approx((13 * -0.08 + PRIOR_RUNS * pooled.mu) / (13 + PRIOR_RUNS))
    assert mu < -0.06
    b = band(table, "step_time", 1.0, labels, 8, 1e9)  # the band is centred there
    s = table.labels["step_time"][labels[0]]
    sigma = max(math.sqrt((s.n * s.sigma ** 2 + PRIOR_RUNS * max(pooled.sigma, MIN_SIGMA) ** 2)
                          / (s.n + PRIOR_RUNS)), MIN_SIGMA)
    assert math.log(b.low) == pytest.approx(mu - z_of(NOMINAL_COVERAGE) * sigma)
    plain = table.to_plain()

    def fold(offsets):
        return {"bands": plain, "rows": [{"time_log_ratio": x, "memory_log_ratio": None,
                                          "labels": labels} for x in offsets]}
    # each source's runs scatter by 0.001 about their median: less than the in-sample spread,
    # so no excess scatter, and tau is the offsets' spread alone
    assert pooled.sigma > MAD_TO_SIGMA * 0.001
    at_centre = [fold([mu + d for d in (-0.001, 0.0, 0.001)]) for _ in range(3)]
    at_zero = [fold([d for d in (-0.001, 0.0, 0.001)]) for _ in range(3)]
    assert between_source_sigma(at_centre)["step_time"] == pytest.approx(0.0, abs=1e-12)
    assert between_source_sigma(at_zero)["step_time"] == pytest.approx(MAD_TO_SIGMA * -mu)


def test_band_centre_is_counted_by_sources_not_runs():
    """A label's band centre is the median of its sources' median residuals, shrunk toward the
    pooled one (also a median of source medians) by its number of sources against
    ``PRIOR_SOURCES`` (planner/calibration/bands.py ``centre``): one source with many runs does
    not set the centre of every runtime sharing the label, and a label of one source lends
    another runtime only part of its offset. Counted by runs (the construction before session
    10), source A's 8 runs at +0.09 set the deep-pp centre at +0.09 for B's and C's runs too."""
    from planner.calibration.bands import (PRIOR_SOURCES, BandTable, build_table, centre,
                                           spread_of)
    deep, fsdp, solo = ["parallelism:deep-pp"], ["parallelism:fsdp"], ["parallelism:tp"]
    runs = ([(0.09, deep, "A")] * 8 + [(-0.01, deep, "B")] * 3 + [(0.0, deep, "C")] * 2
            + [(0.0, fsdp, s) for s in "DEF" for _ in range(3)] + [(0.06, solo, "G")] * 5)
    table = build_table([("step_time", x, labels, 8, 1e9, 0.0, (), src)
                         for x, labels, src in runs])
    s = table.labels["step_time"]["parallelism:deep-pp"]
    assert (s.n, s.sources, s.mu) == (13, 3, 0.0)
    pooled = table.pooled["step_time"]
    assert pooled.sources == 7 and pooled.mu == 0.0
    assert centre(table, "step_time", deep) == pytest.approx(0.0)
    one = table.labels["step_time"]["parallelism:tp"]
    assert one.sources == 1 and one.mu == pytest.approx(0.06)
    assert centre(table, "step_time", solo) == pytest.approx(0.06 / (1 + PRIOR_SOURCES))
    # the sources travel with the shipped table
    assert BandTable.from_plain(table.to_plain()).labels["step_time"]["parallelism:tp"] == one
    # the same runs counted by runs: A's runs set the centre
    by_runs = build_table([("step_time", x, labels, 8, 1e9) for x, labels, _ in runs])
    assert by_runs.labels["step_time"]["parallelism:deep-pp"].mu == pytest.approx(0.09)
    assert spread_of([x for x, _, _ in runs[:13]]).mu == pytest.approx(0.09)


def test_shipped_bands_are_centred_by_sources():
    """defaults.yaml's band centres are counted by publication (bench/calibrate_defaults.py
    passes bench/holdout.py ``family``): 9 sources of step time."""
    from planner.calibration.store import shipped
    bands = shipped().bands
    assert bands.pooled["step_time"].sources == 9
    assert all(s.sources >= 1 for s in bands.labels["step_time"].values())


def test_shipped_bands_carry_the_between_source_spread(rows):
    """defaults.yaml's step-time bands are the in-sample spread combined with the held-out
    between-source spread (bench/calibrate_defaults.py); memory has too few sources for one."""
    import math

    from planner.calibration.bands import spread_of
    from planner.calibration.store import shipped
    tau = _holdout()["summary"]["between_source_sigma"]
    assert set(tau) == {"step_time"} and 0.01 < tau["step_time"] < 0.10
    timed = [r for r in rows if r.time_error is not None]
    inside = spread_of([-math.log(1 + r.time_error) for r in timed]).sigma
    pooled = shipped().bands.pooled
    assert pooled["step_time"].sigma == pytest.approx(math.hypot(inside, tau["step_time"]),
                                                      abs=2e-4)
    memory = [r for r in rows if r.memory_error is not None]
    assert pooled["memory"].sigma == pytest.approx(
        spread_of([-math.log(1 + r.memory_error) for r in memory]).sigma, abs=2e-4)


def test_an_unknown_micro_batch_keeps_its_assumption_and_reports_the_plausible_ones(rows):
    """mcore-h100-weak-32B publishes no micro-batch size: the headline error is the one at the
    stated assumption (1), never the best-fitting size; the band lists every size that divides
    the replica's batch and fits with the same recomputation (bench/unknown_fields.py)."""
    from bench.unknown_fields import micro_batch_assumed, plausible_micro_batches
    from planner.calibration.store import shipped
    constants = shipped().constants
    row = next(r for r in rows if r.id == "mcore-h100-weak-32B")
    assert micro_batch_assumed(row.run) and row.run.config.micro_batch == 1
    band = plausible_micro_batches(row.run, constants)
    assert sorted(band) == [1, 2, 4]  # global batch 192 / dp 48 = 4 sequences per replica
    assert band[1] == pytest.approx(row.time_error)
    assert min(band.values()) < 0 < max(band.values())  # -19 % .. +27 % today
    # a size that fits only with more recomputation is another configuration: 70B at 4 and 8
    big = next(r for r in rows if r.id == "mcore-h100-weak-70B")
    assert sorted(plausible_micro_batches(big.run, constants)) == [1, 2]
    assert not any(micro_batch_assumed(r.run) for r in rows if r.file == "published_runs.yaml")


def test_held_out_max_is_also_judged_over_the_plausible_micro_batches(rows):
    """The held-out max stays judged at the assumed micro-batch, and is judged over the band
    too: the upper bound is the 32B run at 1, the lower bound is set by a run that publishes its
    micro-batch (MPT-70B on 64 A100-40GB). Since session 10's refresh both are under 30 %, so
    no held-out max miss is listed; a stricter target names the 32B run's sizes above it."""
    import json
    from bench.accuracy_holdout import HELD_OUT_MAX_TARGET, held_out_targets_missed
    from bench.unknown_fields import HOLDOUT, held_out_max_range, micro_batch_bands
    from planner.calibration.store import shipped
    data = json.loads(HOLDOUT.read_text())
    bands = micro_batch_bands([r for r in rows if r.id == "mcore-h100-weak-32B"],
                              shipped().constants)
    span = held_out_max_range(bands, data, HELD_OUT_MAX_TARGET)
    assert span["high_id"] == "mcore-h100-weak-32B"
    assert span["high"] == pytest.approx(abs(bands[0]["held_out"][1]))  # 28.7 % at 1
    assert span["low_id"] == "mpt-70b-seq2048-64xa100_40"  # 23.3 %: published micro-batch
    assert span["low"] < span["high"] <= HELD_OUT_MAX_TARGET and not span["above"]
    assert data["summary"]["time_max"] <= HELD_OUT_MAX_TARGET  # 29.3 % at the assumption
    assert not [m for m in held_out_targets_missed(rows, bands)
                if m.startswith("held out: step-time max")]
    strict = held_out_max_range(bands, data, 0.25)
    bad, ok = strict["above"]["mcore-h100-weak-32B"]
    assert sorted(bad) == [1] and sorted(ok) == [2, 4]


def test_held_out_misses_are_listed_with_the_in_sample_ones(rows):
    """docs/accuracy.md's "Targets missed" also lists the targets on runs not in the files
    (held out), the band coverage of a new source among them: a wrong verdict counts there
    only for a run that ran (the target is "no run that ran predicted not to fit"), not for
    the out-of-memory runs."""
    from bench.accuracy import held_out_targets_missed
    missed = held_out_targets_missed(rows)
    assert not any(m.startswith("held out: step-time max") for m in missed)  # 29.3 % <= 30 %
    # the held-out band coverage (72 % step time, 80 % memory) meets its 70-90 % target
    assert not any("band coverage" in m for m in missed)
    ran = next(m for m in missed if "ran predicted not to fit" in m)
    assert "mpt-7b-seq2048-8xh100" in ran and "bloom" not in ran


def test_check_flags_the_edge_runs_in_both_directions(rows):
    """``check``'s band-aware verdict: of the runs that went out of memory only the 206B l82
    run is a plain "fits" (docs/accuracy.md, why the misses); the 184B mbs 1 run does not fit
    at any quantile (BF16_Optimizer's bf16 reduction copy), and the MPT runs at 99-100 % of
    HBM are "fits only at the optimistic end"."""
    from bench.accuracy import check_verdicts
    v = check_verdicts(rows)
    assert v[(True, "fits")] == ["bloom-prequel-0228-206B-l82-h14336-a128-dp8-tp4-pp12-mbs2"]
    assert "bloom-prequel-0228-184B-l100-h12288-a64-dp16-tp4-pp6-mbs1" in \
        v[(True, "does not fit")]
    assert "mpt-7b-seq2048-8xh100" in v[(False, "fits only at the optimistic end")]
    assert not v.get((False, "does not fit"))


BLOOM_LIKE = """shardplan_model: 1
name: bloom-like
description: BLOOM-176B's shape (70 blocks, hidden 14336, tied 250880 vocab)
num_layers: 70
hidden_size: 14336
num_heads: 112
ffn_hidden_size: 57344
gated_mlp: false
vocab_size: 250880
seq_len: 2048
max_seq_len: 2048
position_embedding: none
norm: layernorm
bias: true
tied_embeddings: true
"""


def _blocks_per_stage(stages, model, pp):
    from collections import Counter

    from planner.ir import LayerKind
    count = Counter(s for s, layer in zip(stages, model.layers) if layer.kind is LayerKind.BLOCK)
    return [count[s] for s in range(pp)]


def test_deepspeed_partition_balanced_matches_deepspeeds_own_cases():
    """planner/placement.py's port of DeepSpeed's ``partition_balanced`` (the least spread
    between parts, ties to the latest cut) on the cases of DeepSpeed's
    tests/unit/runtime/utils/test_partition.py and test_partition_balanced.py."""
    from planner.placement import partition_balanced
    assert partition_balanced((0, 1, 2, 3, 3, 3), 4) == (0, 3, 4, 5, 6)
    assert partition_balanced((0., 1.1, 30, 3.), 3) == (0, 2, 3, 4)
    assert partition_balanced((1, 1), 4) == (0, 1, 2, 2, 2)
    for weights, parts, spread in (((1, 2, 1), 4, 2), ((1, 1, 1, 1, 1), 4, 1),
                                   ((1, 1, 1, 1, 0, 1), 4, 1)):
        cuts = partition_balanced(weights, parts)
        sums = [sum(weights[a:b]) for a, b in zip(cuts, cuts[1:])]
        assert max(sums) - min(sums) == spread


def test_evaluate_deepspeed_places_stages_as_deepspeed_does(loaded, tmp_path, capsys):
    """One rule for the calibration and the product: ``evaluate --runtime deepspeed`` places
    a BLOOM-like model's stages with DeepSpeed's ``partition_method``. BLOOM's published
    ``type:transformer|embedding`` counts the embedding and the tied head as one layer each:
    72 items on 12 stages, 6 each, so the first and the last stage hold 5 blocks, as the
    calibration costs the main run (Megatron's split puts 6 on the first ten stages). The
    profile's default, Megatron-DeepSpeed's ``type:transformer``, weighs the blocks only."""
    from planner.calibration.predict import placement_of
    from planner.strategy import default_placement
    main = next(r for _, r in loaded[0] if r.id == "bloom176B-main-run")
    assert main.pp_partition == "type:transformer|embedding"
    calibrated = placement_of(main, main.recompute).stage
    assert _blocks_per_stage(calibrated, main.model, 12) == [5] + [6] * 10 + [5]
    megatron = default_placement(main.model, main.config).stage
    assert _blocks_per_stage(megatron, main.model, 12) == [6] * 10 + [5] * 2

    spec = tmp_path / "bloom-like.yaml"
    spec.write_text(BLOOM_LIKE)
    argv = ["evaluate", "--model", str(spec), "--cluster", "dgx-a100-80g", "--nodes", "48",
            "--global-batch", "2048", "--tp", "4", "--pp", "12", "--zero", "1",
            "--recompute", "full", "--runtime", "deepspeed", "--json"]  # as BLOOM ran: it fits
    layers = {}
    for partition in ("type:transformer|embedding", None):
        with pytest.raises(SystemExit) as done:
            main_cli(argv + (["--pp-partition", partition] if partition else []))
        out = capsys.readouterr().out
        assert done.value.code == 0
        layers[partition] = [s["num_layers"] for s in json.loads(out)["stages"]]
    # the embedding on stage 0 and the tied head on stage 11 beside the blocks
    assert layers["type:transformer|embedding"] == [6] * 12
    assert layers[None] == [7] + [6] * 9 + [5, 6]
    with pytest.raises(SystemExit) as done:  # a partition method is DeepSpeed's only
        main_cli(argv[:-3] + ["--json", "--pp-partition", "type:transformer"])
    assert done.value.code == 2
    capsys.readouterr()


def test_the_search_is_judged_in_the_regime_it_lands_in(rows):
    """bench/landing.py (docs/accuracy.md "Where the search lands"): the planner's search on
    two calibration runs' hardware, model, batch and runtime. Its plan is never predicted slower
    than the published configuration (which the search space holds), the regime reported is
    the searched plan's own, and the section's statistics are that regime's calibration runs."""
    cases = ("mbridge-25.11-Llama3-8B-B200-8gpu-fp8-cs", "mpt-70b-seq2048-64xh100")
    landed = landing.land(rows, shipped(), cases)
    for x in landed:
        ev, c = x["plan"], x["plan"].config
        assert ev.step_time_s <= x["row"].pred.step_time_s * (1 + 1e-9), x["case"]
        assert x["regime"] == regime_of(ev.options.profile, ev.cluster.gpu.name, c.tp, c.pp,
                                        c.cp, c.zero_stage)
        assert x["interval"]["regime"] == x["regime"].key
    b200, mpt = landed
    # on 8 B200 the search keeps the published layout: the source measured it, at +6.7 %
    assert landing.degrees(b200["plan"].config) == landing.degrees(b200["row"].run.config)
    assert b200["row"] in b200["same_degrees"]
    # MPT-70B on 64 H100: FSDP at micro-batch 1 without recomputation, which only the 7B and
    # 13B H100 FSDP1 runs used; the band names the policy only where no run of the regime did
    assert mpt["recompute"] == "none" and mpt["regime"].key == "fsdp/hopper/fsdp"
    assert mpt["same_recompute"] == sum(
        1 for r in rows if r.run.regime.key == "fsdp/hopper/fsdp" and r.time_error is not None
        and "none" in recompute_kinds(r.run.model, r.pred.evaluation.placement)) == 3
    assert not any("recomputation" in n and n.startswith("extrapolating: step time")
                   for n in mpt["interval"]["extrapolating"])
    text = "\n".join(landing_section(rows, landed))
    n = by_label(rows, lambda r: r.run.regime.key)["fsdp/hopper/fsdp"]["time_n"]
    assert f"| mpt-70b-seq2048-64xh100 | fsdp/hopper/fsdp | {n} | {mpt['same_recompute']} |" in text
