"""Fit the cost model's constants to measured runs: scipy's least squares over all runs at once.

Residuals are log-ratios ``log(predicted / measured)`` of step time (and of peak memory, for the
memory constants), so a 10 % error weighs the same on a 1 s and a 100 s step. Each run is
weighted by ``1 / sqrt(runs of its source)``: a source that published 58 variants of one setup
does not outvote one that published 6 different setups. The loss is ``soft_l1`` with a 10 %
scale: a run the model cannot represent (a residual far outside the rest) pulls less than a
squared loss would let it. Every constant stays inside its physical bounds
(:data:`planner.calibration.constants.PARAMS`); constants no run depends on stay at their
starting value. No hand-written optimiser: :func:`scipy.optimize.least_squares` ("trf").
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Sequence

from planner.calibration.bands import BandTable, build_table
from planner.calibration.constants import PARAMS, Constants
from planner.calibration.predict import Prediction, predict
from planner.calibration.regimes import band_labels
from planner.calibration.runs import CalibrationRun

LOSS_SCALE = 0.10
VERDICT_WEIGHT = 3.0
VERDICT_MARGIN = 0.02  # log-ratio: about the median memory error (docs/accuracy.md)
MEMORY_PARAMS_PREFIXES = ("allocator", "reserve")


@dataclass(frozen=True)
class FitResult:
    constants: Constants
    bands: BandTable
    cost_before: float
    cost_after: float
    evaluations: int
    message: str


def _weights(runs: Sequence[CalibrationRun]) -> list[float]:
    per_source = Counter(r.source for r in runs)
    return [1.0 / math.sqrt(per_source[r.source]) for r in runs]


def residuals(runs: Sequence[CalibrationRun], constants: Constants,
              weights: Sequence[float] | None = None) -> list[float]:
    weights = weights or _weights(runs)
    out = []
    for run, w in zip(runs, weights):
        p = predict(run, constants)
        m = run.measured
        if m.step_time_s and not m.oom:
            out.append(w * math.log(p.step_time_s / m.step_time_s))
        if m.memory_gib:
            out.append(w * math.log(p.memory_gib / m.memory_gib))
        if p.fit_judged:
            # fit verdicts: a run that ran must fit, an OOM run must not (hinge on capacity,
            # with a margin of the memory model's own spread so that an edge run is not left
            # a fraction of a percent on the wrong side)
            r = math.log(p.evaluation.peak_memory_bytes / run.cluster.memory_bytes_per_gpu)
            out.append(VERDICT_WEIGHT * w * (max(0.0, r + VERDICT_MARGIN) if not m.oom
                                             else max(0.0, VERDICT_MARGIN - r)))
    return out


def fit(runs: Sequence[CalibrationRun], start: Constants,
        names: Sequence[str] | None = None, max_evaluations: int = 200,
        progress: Callable[[str], None] | None = None) -> FitResult:
    """Least-squares fit of the constants ``names`` (default: all of PARAMS) to ``runs``."""
    from scipy.optimize import least_squares  # a core dependency; imported where used

    chosen = [p for p in PARAMS if names is None or p.name in names]
    weights = _weights(runs)
    x0 = [min(max(start.get(p.name), p.low), p.high) for p in chosen]
    calls = 0

    def constants_at(x) -> Constants:
        return start.with_values(**{p.name.replace(".", "__"): float(v)
                                    for p, v in zip(chosen, x)})

    def f(x):
        nonlocal calls
        calls += 1
        r = residuals(runs, constants_at(x), weights)
        if progress and calls % 10 == 0:
            progress(f"evaluation {calls}: cost {0.5 * sum(v * v for v in r):.4f}")
        return r

    r0 = f(x0)
    # max_nfev counts iterations' function evaluations, not the Jacobian's finite differences
    # (one evaluation per constant each): bound the model evaluations, not the iterations
    iterations = max(2, max_evaluations // (len(chosen) + 1))
    result = least_squares(f, x0, bounds=([p.low for p in chosen], [p.high for p in chosen]),
                           loss="soft_l1", f_scale=LOSS_SCALE, diff_step=1e-2,
                           max_nfev=iterations, method="trf", ftol=1e-4, xtol=1e-4)
    constants = constants_at(result.x)
    bands = residual_bands(runs, constants)
    return FitResult(constants, bands, 0.5 * sum(v * v for v in r0),
                     0.5 * sum(v * v for v in result.fun), calls, str(result.message))


def residual_bands(runs: Sequence[CalibrationRun], constants: Constants) -> BandTable:
    """Band table from the unweighted residuals log(measured / predicted) of each run."""
    samples = []
    for run in runs:
        p: Prediction = predict(run, constants)
        labels = band_labels(run.regime)
        m = run.measured
        params = run.model.params
        if m.step_time_s and not m.oom:
            ev = p.evaluation
            mfu = ev.model_flops / (m.step_time_s * run.cluster.num_gpus
                                    * run.cluster.gpu.peak_tflops[run.config.dtype] * 1e12)
            samples.append(("step_time", math.log(m.step_time_s / p.step_time_s), labels,
                            run.cluster.num_gpus, params, mfu))
        if m.memory_gib:
            samples.append(("memory", math.log(m.memory_gib / p.memory_gib), labels,
                            run.cluster.num_gpus, params))
    return build_table(samples)
