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
