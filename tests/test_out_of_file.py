"""bench/out_of_file.py: the transcription of Narayanan et al. 2021 Table 1 (arXiv:2104.04473)
against the paper's own formulas, that the rows are held out (in no calibration file), and that
the script evaluates them as `shardplan evaluate` does."""
from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import pytest

from bench import out_of_file as oof
from bench.accuracy_runs import DATA
from cli.main import main
from planner.safe_input import parse_yaml, read_text


@pytest.fixture(scope="module")
def results():
    return oof.run_all()


def test_rows_reproduce_the_parameter_column():
    # Eq. 2, P = 12 l h^2 (1 + 13/12h + (V + s)/12lh), from the transcribed heads / hidden /
    # layers must give Table 1's own parameter column (one decimal, billions).
    for r in oof.ROWS:
        assert round(oof.eq2_params(r) / 1e9, 1) == pytest.approx(r.params_b, abs=0.051), r
        assert r.hidden % r.heads == 0


def test_throughput_columns_agree():
    # Per-GPU TFLOP/s (3 digits) = aggregate PFLOP/s / GPUs (4 digits) to the column's rounding,
    # and % of peak = TFLOP/s / 312.
    for r in oof.ROWS:
        assert abs(r.achieved_tflops - r.tflops_per_gpu) <= 0.55 + r.tflops_per_gpu * 0.0015, r
        assert round(100 * r.tflops_per_gpu / oof.PEAK_TFLOPS) == r.peak_pct, r


def test_step_time_is_eq3_at_the_achieved_throughput():
    # 1T row, by hand: F = 96 B s l h^2 (1 + s/6h + V/16lh), step = F / aggregate FLOP/s.
    B, s, l, h, V = 3072, 2048, 128, 25600, 51200
    F = 96 * B * s * l * h ** 2 * (1 + s / (6 * h) + V / (16 * l * h))
    one_t = oof.ROWS[-1]
    assert one_t.measured_step_time_s == pytest.approx(F / 502.0e15, rel=1e-12)
    assert one_t.measured_step_time_s == pytest.approx(102.37, abs=0.01)
    # and the per-GPU column at that step time, for every row (the TFLOP/s column is Eq. 3's)
    for r in oof.ROWS:
        tflops = oof.eq3_flops(r) / r.measured_step_time_s / r.gpus / 1e12
        assert round(tflops) == pytest.approx(r.tflops_per_gpu, abs=1), r
    # 145.6B: B 2304, l 80, h 12288 on 1536 GPUs at 227.1 PFLOP/s
    B, l, h = 2304, 80, 12288
    F = 96 * B * s * l * h ** 2 * (1 + s / (6 * h) + V / (16 * l * h))
    assert oof.ROWS[6].measured_step_time_s == pytest.approx(F / 227.1e15, rel=1e-12)


def test_configurations_are_whole():
    for r in oof.ROWS:
        assert r.gpus % (r.tp * r.pp) == 0 and r.gpus % 8 == 0
        assert r.global_batch % (r.dp * r.micro_batch) == 0
        assert r.layers % (r.pp * r.virtual_stages) == 0
        m = r.global_batch // (r.dp * r.micro_batch)
        if r.virtual_stages > 1:  # Megatron's interleaved schedule: micro-batches % pp == 0
            assert m % r.pp == 0
    assert [r.virtual_stages for r in oof.ROWS] == [1, 1, 1, 1, 1, 3, 2, 2, 3, 1]
    assert [r.ddp for r in oof.ROWS] == ["torch"] * 4 + ["local"] * 6


def _runs(node):
    """Every mapping with a model and a cluster, anywhere in a parsed data file."""
    if isinstance(node, dict):
        if isinstance(node.get("model"), dict) and isinstance(node.get("cluster"), dict):
            yield node
        for value in node.values():
            yield from _runs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _runs(value)


def test_rows_are_in_no_calibration_file():
    shapes = set()
    for path in sorted(DATA.glob("*.yaml")):
        for entry in _runs(parse_yaml(read_text(path, "runs file"), str(path))):
            model, cluster = entry["model"], entry["cluster"]
            shapes.add((model.get("hidden"), model.get("layers"), cluster.get("num_gpus")))
    assert len(shapes) > 10
    for r in oof.ROWS:
        assert (r.hidden, r.layers, r.gpus) not in shapes, r.name


def test_the_script_is_what_the_cli_evaluates(capsys):
    row = oof.ROWS[5]  # interleaved, tp 8 pp 4
    with tempfile.TemporaryDirectory() as tmp:
        path = oof.model_file(row, Path(tmp))
        for _, runtime, attention in oof.READINGS:
            with pytest.raises(SystemExit) as done:
                main(oof.cli_args(row, path, runtime, attention))
            out, _ = capsys.readouterr()
            assert done.value.code == 0
            assert "--dropout" in oof.cli_args(row, path, runtime, attention)
            got = json.loads(out)["predicted"]["step_time_s"]
            want = oof.evaluate_row(row, path, runtime, attention).step_time_s
            assert got == pytest.approx(want, rel=1e-5)


def test_readings_and_report(results):
    assert list(results) == [label for label, _, _ in oof.READINGS]
    for label, rows in results.items():
        assert len(rows) == len(oof.ROWS)
        for x in rows:
            assert math.isfinite(x.error) and x.ev.fits, (label, x.row.name)
            b = oof.breakdown(x.ev)
            assert sum(b.values()) == pytest.approx(x.predicted_s, rel=1e-9)
            assert b["forward"] > 0 and b["recompute"] > 0  # full recomputation is charged
    # flash attention is faster than the 2021 eager kernels: the default reading is optimistic
    for flash, eager in zip(results["megatron"], results["megatron-eager"]):
        assert flash.predicted_s < eager.predicted_s
    agree, pairs = oof.rank_pairs(results["megatron-eager"])
    assert 0 < pairs <= 45 and 0 <= agree <= pairs
    # the runs are read with their scripts' dropout; dropping it, or hiding local DDP's
    # all-reduce again, only removes work
    diag = oof.diagnostics(results)
    for x, e_none, e_local in zip(results["megatron-eager"], diag[oof.NO_DROPOUT],
                                  diag[oof.DROPOUT_LOCAL]):
        assert x.ev.options.dropout
        assert e_none < x.error and e_local >= x.error - 1e-12
    # the eager core's GEMMs at the roofline's max (compute hiding traffic) only remove time
    for x, e_max in zip(results["megatron-eager"], diag[oof.MAX_ROOFLINE]):
        assert e_max < x.error
    text = "\n".join(oof.section(results))
    for r in oof.ROWS:
        assert f"| {r.name} |" in text
    assert "median |error|" in oof.text_report(results)


def test_counterfactual_leaves_the_cost_model_as_it_was(results):
    """The max-roofline diagnostic patches the GEMM roofline and empties the cost caches;
    afterwards every row evaluates to the shipped prediction again, byte for byte."""
    eager = results["megatron-eager"]
    before = [oof.with_options(x.ev) for x in eager]
    overlapped = oof.with_max_roofline(eager)
    assert [oof.with_options(x.ev) for x in eager] == before
    assert all(e < x.error for x, e in zip(eager, overlapped))
    # QK^T at head_dim 96 (gpt-1.7b): its s x s score traffic is in its roofline, and about
    # as long as its math: 384 GEMMs (16 x 24 heads) of 2048 x 2048 x 96, 2 B an element
    flops_s, bytes_s = oof.eager_gemm_times_s(eager[0])
    traffic = 2 * 384 * (2048 * 96 * 2 + 2048 * 2048)
    assert bytes_s == pytest.approx(traffic / (2039e9 * 0.80), rel=1e-3)
    assert 0.9 < flops_s / bytes_s < 1.1


# -- MoE: DeepSeek-V3's pre-training (bench/out_of_file_moe.py) --------------------------------

from bench import moe_accuracy  # noqa: E402
from bench import out_of_file_moe as oom  # noqa: E402


def test_deepseek_measured_step_is_table_1():
    # Table 1: 2,664K H800 GPU hours for 14.8T tokens; §1: "180K H800 GPU hours" per trillion
    assert oom.GPU_HOURS / (oom.TOKENS / 1e12) == pytest.approx(180e3, rel=0.001)
    assert oom.tokens_per_s_per_gpu() == pytest.approx(1e12 / (180e3 * 3600), rel=0.001)
    assert oom.tokens_per_s_per_gpu() == pytest.approx(1543.2, abs=0.1)
    # 15,360 x 4,096 tokens on 2,048 GPUs at that rate
    assert oom.measured_step_time_s() == pytest.approx(15360 * 4096 / (1543.2 * 2048), rel=1e-4)
    assert oom.measured_step_time_s() == pytest.approx(19.91, abs=0.01)


def test_deepseek_run_is_in_no_calibration_file():
    """DeepSeek-V3's shape is calibrated (Megatron-Bridge and AutoModel runs on H100 / B200 /
    GB200 / GB300), but not this run: no entry of any data file on H800, none with 2,048 GPUs
    of DeepSeek-V3's shape."""
    systems, shapes = set(), set()
    for path in sorted(DATA.glob("*.yaml")):
        for entry in _runs(parse_yaml(read_text(path, "runs file"), str(path))):
            model, cluster = entry["model"], entry["cluster"]
            systems.add(str(cluster.get("system", "")) + str(cluster.get("gpu", "")))
            shapes.add((model.get("hidden"), model.get("layers"), cluster.get("num_gpus")))
    assert (7168, 61, 256) in shapes  # the model is in the calibration, the run is not
    assert (7168, 61, oom.GPUS) not in shapes
    assert not any("h800" in s.lower() for s in systems)


def test_deepseek_inputs_are_the_reports():
    args = oom.cli_args()
    value = {a: args[i + 1] for i, a in enumerate(args[:-1]) if a.startswith("--")}
    assert (value["--tp"], value["--pp"], value["--ep"], value["--etp"], value["--zero"]) == \
        ("1", "16", "64", "1", "1")  # §3.2
    assert int(value["--nodes"]) * 8 == 2048 and value["--dp"] == "128"  # §3.1
    assert (value["--global-batch"], value["--seq-len"]) == ("15360", "4096")  # §4.1-4.2
    assert value["--dtype"] == "fp8" and value["--mtp-layers"] == "1"  # §3.3, §2.2
    assert value["--recompute-modules"] == "layernorm,mla_up_proj,moe_act"  # §3.2.3, §3.3.3
    assert value["--moe-dispatcher"] == "deepep" and value["--schedule"] == "dualpipev"
    assert float(value["--moe-a2a-overlap"]) == oom.EP_COMM_OVERLAP  # §3.2.1
    # Megatron-Bridge's published 32-chunk layout, the one bench/moe_accuracy.py uses
    assert value["--pipeline-layout"] == moe_accuracy.DEEPSEEK_V3_LAYOUTS[32]


def test_deepseek_readings_and_section():
    readings = oom.run_all()
    assert [r.label for r in readings] == [label for label, _ in oom.READINGS]
    published = readings[0]
    assert all(r.fits and r.step_time_s > 0 for r in readings)
    # HAI-LLM is no profile: the megatron profile costs DualPipeV and says it cannot run it
    assert any("dualpipev" in w for w in published.warnings)
    by = {r.label: r for r in readings}
    # what the inputs are worth: DualPipeV on the layout beats 1F1B on the even split, hiding
    # more of the all-to-all is faster, full recomputation slower
    assert by["1F1B, even split"].step_time_s > published.step_time_s
    assert published.step_time_s < \
        by[f"all-to-all overlap {oom.DEFAULT_A2A_OVERLAP:g} (the default)"].step_time_s
    # the fully hidden reading only where the shipped EP overlap (fitted: 1.0) hides less
    assert ("all-to-all fully hidden (1.0)" in by) == (oom.EP_COMM_OVERLAP < 1)
    if oom.EP_COMM_OVERLAP < 1:
        assert by["all-to-all fully hidden (1.0)"].step_time_s < published.step_time_s
    assert by["full recomputation"].step_time_s > published.step_time_s
    text = "\n".join(oom.section(readings))
    assert "| as published |" in text and f"{oom.measured_step_time_s():.2f} s" in text
    # the section docs/moe.md carries is this one
    doc = (Path(__file__).resolve().parents[1] / "docs" / "moe.md").read_text()
    assert text in doc
