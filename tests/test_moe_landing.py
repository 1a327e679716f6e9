"""bench/moe_landing.py: where the planner's MoE picks land in the calibration data (the
placement logic, on one small situation; the searches themselves run in the bench, not here)."""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import moe_accuracy, moe_landing  # noqa: E402
from planner.cost.model import evaluate  # noqa: E402
from planner.strategy import Recompute, uniform  # noqa: E402

QWEN_B200 = "mbridge-26.04.01-Qwen3-30B-A3B-B200-8gpu-mxfp8"  # tp1 dp8 ep8 mbs4, no recompute


def _entry(id_: str) -> dict:
    return next(e for e in moe_accuracy.entries() if e["id"] == id_)


@pytest.fixture(scope="module")
def measured():
    """The measured run's evaluation, and a plan on the same hardware with tp 2, micro-batch 8
    and every block fully recomputed (none of which the run used)."""
    entry = _entry(QWEN_B200)
    ev = moe_accuracy.evaluation_for(entry)
    config = replace(ev.config, tp=2, dp=4, sp=True, micro_batch=8)
    other = evaluate(ev.model, ev.cluster, config, uniform(ev.model, config, Recompute.FULL),
                     ev.options)
    return ev, other


def test_a_measured_configuration_is_covered(measured):
    ev, _ = measured
    assert moe_landing.coverage(ev, [ev]) == []


def test_each_unmeasured_degree_is_named(measured):
    ev, other = measured
    assert moe_landing.coverage(other, [ev]) == [
        "tp 2 (measured: 1)", "mbs 8 (measured: 4)", "recompute full (measured: none)"]
    # a micro-batch inside the measured range is covered; the recomputation once measured too
    assert moe_landing.coverage(other, [ev, other]) == []
    low = evaluate(ev.model, ev.cluster, replace(ev.config, micro_batch=2), ev.placement,
                   ev.options)
    assert moe_landing.coverage(low, [ev, other]) == ["mbs 2 (measured: 4-8)"]
    assert moe_landing.coverage(ev, [low, other]) == []  # mbs 4: inside the measured 2-8


def test_best_of_takes_the_fastest_measured_run():
    """DeepSeek-V3 on 1,024 H100 (NeMo 25.09): two recipes measured in one situation; the
    faster is the one the pick is set against."""
    best, rows = moe_landing.best_of("mbridge-25.09-DeepSeek-V3-H100-1024gpu-fp8blk-alt",
                                     moe_accuracy.entries())
    assert len(rows) == 2 and best["id"] == "mbridge-25.09-DeepSeek-V3-H100-1024gpu-fp8"
    assert rows[best["id"]].time_published_s == min(r.time_published_s for r in rows.values())
    with pytest.raises(LookupError):
        moe_landing.best_of("no-such-run", moe_accuracy.entries())


def _landing(measured, claimed_pick, extrapolating):
    ev, _ = measured
    entry = _entry(QWEN_B200)
    return moe_landing.Landing(
        situation=QWEN_B200, best=entry, runs=1, measured_s=ev.step_time_s * 1.5,
        predicted_s=ev.step_time_s, measured_config="c", pick=claimed_pick, stopped_by="complete",
        pool=1, pool_bias=0.0, extrapolating=extrapolating)


def test_a_large_claim_outside_the_data_is_called_out(measured):
    ev, other = measured
    far = _landing(measured, ev, moe_landing.coverage(other, [ev]))
    assert far.claimed == pytest.approx(0.5)
    text = moe_landing.render([far])
    assert "Not to be believed as it stands" in text and "+50.0%" in text
    assert "tp 2 (measured: 1)" in text
    assert "1 of 1 picks extrapolate" in moe_landing.summary_line([far])
    near = _landing(measured, ev, [])  # the same claim where every degree was measured
    text = moe_landing.render([near])
    assert "Not to be believed" not in text and "Covered" in text
