"""Fit the cost model's constants to measured runs: scipy's least squares over all runs at once.

Residuals are log-ratios ``log(predicted / measured)`` of step time (and of peak memory, for the
memory constants), so a 10 % error weighs the same on a 1 s and a 100 s step. Each run is
weighted by ``1 / sqrt(runs of its source)``: a source that published 58 variants of one setup
does not outvote one that published 6 different setups. The loss is ``soft_l1`` with a 10 %
scale: a run the model cannot represent (a residual far outside the rest) pulls less than a
squared loss would let it. Every constant stays inside its physical bounds
(:data:`planner.calibration.constants.PARAMS`); constants no run depends on stay at their
starting value. No hand-written optimiser: :func:`scipy.optimize.least_squares` ("trf").

Priors. The start values are the priors (public specs and microbenchmarks for the shipped fit,
planner/calibration/constants.py; the shipped constants for ``shardplan calibrate``): every
constant has a weak prior row ``PRIOR_WEIGHT * (x - start) / half-range``, and constants that
are one physical quantity in several runtimes (:data:`TIES`: the PyTorch caching allocator's
overhead, eager PyTorch's per-block host time and element-wise traffic, the GEMM/collective
decomposition of TP overlap, FP8 GEMM efficiency) are shrunk toward their common mean
(``TIE_WEIGHT``): a per-runtime offset from a shared value. A constant that only one source
informs then moves little when that source is left out (bench/holdout.py) - it falls back to
the other runtimes' value, not to an arbitrary start. The Jacobian's finite differences
perturb together the constants that reach no common run (scipy's grouped differences,
``approx_derivative(sparsity=...)``; a run depends on a constant only if the constant changes
its options, planner/calibration/apply.py), and every constant is scaled by its plausible range.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Sequence

from planner.calibration.bands import BandTable, build_table
from planner.calibration.apply import calibrated_options
from planner.calibration.constants import PARAMS, Constants, Param
from planner.calibration.predict import Prediction, predict
from planner.calibration.regimes import band_labels, recompute_kinds
from planner.calibration.runs import CalibrationRun

LOSS_SCALE = 0.10
PRIOR_WEIGHT = 0.02  # a move of one half-range costs as much as a 2 % error on one source
TIE_WEIGHT = 0.05
# One physical quantity in several runtimes: each member is shrunk toward the group's mean.
TIES: tuple[tuple[str, ...], ...] = (
    ("allocator_overhead.megatron", "allocator_overhead.torchtitan",
     "allocator_overhead.deepspeed", "allocator_overhead.fsdp"),  # one caching allocator
    ("block_overhead_s.torchtitan", "block_overhead_s.deepspeed",
     "block_overhead_s.fsdp"),  # eager PyTorch blocks: launches, module hooks, checkpointing
    ("unfused_elementwise.torchtitan", "unfused_elementwise.fsdp"),  # eager element-wise ops
    ("tp_comm_overlap.megatron", "tp_comm_overlap.torchtitan"),  # chunked GEMM + collective
    ("fp8_relative_efficiency", "fp8_relative_efficiency.torchtitan"),  # one FP8 tensor core
)
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


def run_residuals(run: CalibrationRun, constants: Constants, w: float = 1.0) -> list[float]:
    """One run's rows: step time, memory, fit verdict (each where the run has it)."""
    p = predict(run, constants)
    m = run.measured
    out = []
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


def residuals(runs: Sequence[CalibrationRun], constants: Constants,
              weights: Sequence[float] | None = None) -> list[float]:
    weights = weights or _weights(runs)
    return [v for run, w in zip(runs, weights) for v in run_residuals(run, constants, w)]


def _half_range(p: Param) -> float:
    return (p.high - p.low) / 2


def prior_residuals(chosen: Sequence[Param], x: Sequence[float], prior: Constants) -> list[float]:
    """The prior rows: each chosen constant toward its prior, each tie's members toward the
    tie's mean (over its members, chosen or held at their prior value)."""
    value = {p.name: float(v) for p, v in zip(chosen, x)}
    out = [PRIOR_WEIGHT * (value[p.name] - prior.get(p.name)) / _half_range(p) for p in chosen]
    by_name = {p.name: p for p in PARAMS}
    for tie in TIES:
        if not any(n in value for n in tie):
            continue
        vals = [value.get(n, prior.get(n)) for n in tie]
        mean = sum(vals) / len(vals)
        out.extend(TIE_WEIGHT * (v - mean) / _half_range(by_name[n])
                   for n, v in zip(tie, vals) if n in value)
    return out


def depends(run: CalibrationRun, name: str, constants: Constants) -> bool:
    """Whether the run's prediction can change with constant ``name``: the constants reach the
    cost model only through calibrated_options (planner/calibration/apply.py)."""
    p = next(q for q in PARAMS if q.name == name)
    key = name.replace(".", "__")
    lo, hi = (calibrated_options(run.options, constants.with_values(**{key: v}),
                                 run.cluster.gpu.name, run.compiled) for v in (p.low, p.high))
    return lo != hi


def _sparsity(runs, rows_per_run, chosen, constants):
    import numpy as np
    sparsity = np.zeros((sum(rows_per_run), len(chosen)), dtype=int)
    row = 0
    for run, k in zip(runs, rows_per_run):
        for j, p in enumerate(chosen):
            if depends(run, p.name, constants):
                sparsity[row:row + k, j] = 1
        row += k
    return sparsity


def fit(runs: Sequence[CalibrationRun], start: Constants,
        names: Sequence[str] | None = None, max_evaluations: int = 200,
        progress: Callable[[str], None] | None = None) -> FitResult:
    """Least-squares fit of the constants ``names`` (default: all of PARAMS) to ``runs``,
    regularised toward ``start`` (the priors) and within each tie."""
    import numpy as np
    from scipy.optimize import least_squares  # a core dependency; imported where used
    from scipy.optimize._numdiff import approx_derivative, group_columns

    chosen = [p for p in PARAMS if names is None or p.name in names]
    weights = _weights(runs)
    bounds = (np.array([p.low for p in chosen]), np.array([p.high for p in chosen]))
    x0 = np.clip([start.get(p.name) for p in chosen], bounds[0], bounds[1])
    calls = 0
    cache: dict[tuple, np.ndarray] = {}

    def constants_at(x) -> Constants:
        return start.with_values(**{p.name.replace(".", "__"): float(v)
                                    for p, v in zip(chosen, x)})

    def model_rows(x) -> np.ndarray:
        nonlocal calls
        key = tuple(float(v) for v in x)
        if key not in cache:
            calls += 1
            cache.clear()
            cache[key] = np.array(residuals(runs, constants_at(x), weights))
        return cache[key]

    def prior_rows(x) -> np.ndarray:
        return np.array(prior_residuals(chosen, x, start))

    def f(x):
        r = np.concatenate([model_rows(x), prior_rows(x)])
        if progress and calls % 10 == 0:
            progress(f"evaluation {calls}: cost {0.5 * float(r @ r):.4f}")
        return r

    sparsity = _sparsity(runs, [len(run_residuals(run, constants_at(x0))) for run in runs],
                         chosen, constants_at(x0))
    groups = group_columns(sparsity)

    def jac(x):
        # finite differences of the model rows, one evaluation per group of constants that
        # reach no common run (scipy's grouped differences), and of the cheap prior rows
        model = approx_derivative(model_rows, x, method="2-point", rel_step=1e-2,
                                  f0=model_rows(x), bounds=bounds,
                                  sparsity=(sparsity, groups)).toarray()
        prior = approx_derivative(prior_rows, x, method="2-point", rel_step=1e-2,
                                  bounds=bounds)
        return np.vstack([model, np.atleast_2d(prior)])

    r0 = f(x0)
    # max_nfev counts the iterations' evaluations, not the Jacobian's: bound the model
    # evaluations (one per iteration plus one per group of constants)
    iterations = max(2, max_evaluations // (int(groups.max()) + 2))
    # each constant in units of its plausible range (a GEMM efficiency and a host overhead in
    # seconds differ by 10^3 in scale)
    scale = (bounds[1] - bounds[0]) / 2
    result = least_squares(f, x0, jac=jac, bounds=bounds, loss="soft_l1", f_scale=LOSS_SCALE,
                           max_nfev=iterations, method="trf", ftol=1e-4, xtol=1e-4,
                           x_scale=scale)
    constants = constants_at(result.x)
    bands = residual_bands(runs, constants)
    return FitResult(constants, bands, 0.5 * float(r0 @ r0),
                     0.5 * float(result.fun @ result.fun), calls, str(result.message))


def source_key(source: str) -> str:
    """The publication a run's source title names: the title up to its parenthesis (the
    revision or table of one publication)."""
    return source.split("(")[0].strip()


def residual_bands(runs: Sequence[CalibrationRun], constants: Constants,
                   source_of: Callable[[str], str] | None = None) -> BandTable:
    """Band table from the unweighted residuals log(measured / predicted) of each run;
    ``source_of``: the publication of a run's source title, by which the band centres are
    counted (planner/calibration/bands.py; default: the run's source title up to its
    parenthesis)."""
    source_of = source_of or source_key
    samples = []
    for run in runs:
        p: Prediction = predict(run, constants)
        labels = band_labels(run.regime)
        kinds = recompute_kinds(run.model, p.evaluation.placement)
        m = run.measured
        params = run.model.params
        if m.step_time_s and not m.oom:
            ev = p.evaluation
            mfu = ev.model_flops / (m.step_time_s * run.cluster.num_gpus
                                    * run.cluster.gpu.peak_tflops[run.config.dtype] * 1e12)
            samples.append(("step_time", math.log(m.step_time_s / p.step_time_s), labels,
                            run.cluster.num_gpus, params, mfu, kinds, source_of(run.source)))
        if m.memory_gib:
            samples.append(("memory", math.log(m.memory_gib / p.memory_gib), labels,
                            run.cluster.num_gpus, params, 0.0, kinds, source_of(run.source)))
    return build_table(samples)
