"""Fit the serving cost model's calibrated constants (planner/serve/runtime.py CALIBRATED) to the
inference calibration file, by scipy least squares.

Residuals: log(predicted / measured) of the measured output throughput per GPU, TTFT and TPOT
of every entry (``bench/inference_data.py`` rules; no entry special-cased or weighted on its
own); a Cauchy loss so that the few entries no steady-state model can reproduce (speculative
decoding not stated, concurrency beyond what the GPUs can hold) do not dominate; TPOT rows
measured below the physical decode floor (planner/serve/floor.py) are left out. Bounds keep
every constant in its physical range. The per-runtime TTFT synchronisation fractions are then
chosen on a grid to minimise the median TTFT error. Prints the fitted values to paste into
CALIBRATED::

    python bench/fit_inference.py
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from inference import METRICS, evaluate_all, summary  # noqa: E402
from planner.serve.phases import Calibration  # noqa: E402
from planner.serve.runtime import CALIBRATED  # noqa: E402

RUNTIMES = ("sglang", "trtllm", "vllm")
# name: (lower, upper) -- physical ranges; "name.runtime" is one runtime's scheduler constant
BOUNDS = {
    "decode_hbm_efficiency": (0.55, 0.90),  # STREAM-like kernels reach 80-90 % of HBM peak
    "prefill_efficiency": (0.6, 1.3),  # x the training GEMM/attention efficiency (<= ~90 % peak)
    # scheduler + input preparation + sampling per iteration: 0-10 ms
    **{f"step_overhead_s.{r}": (0.0, 0.01) for r in RUNTIMES},
    **{f"prefill_queue_fraction.{r}": (0.0, 1.0) for r in RUNTIMES},
    **{f"prefill_interference.{r}": (0.0, 1.0) for r in RUNTIMES},
}
NAMES = list(BOUNDS)
MISSING_PENALTY = math.log(10.0)  # an entry predicted not to fit counts as a 10x miss


# Each constant is fitted on the measurements it governs: the iteration cost constants on
# throughput (offline runs) and TPOT (least squares); the prefill queueing fraction, which only
# moves TTFT, on TTFT alone, with the cost constants held (fit_queue_fractions).
STAGES = (
    (("decode_hbm_efficiency", "prefill_efficiency",
      *(f"step_overhead_s.{r}" for r in RUNTIMES),
      *(f"prefill_interference.{r}" for r in RUNTIMES)),
     ("output_tokens_per_s_per_gpu", "tpot_ms")),
    (tuple(f"prefill_queue_fraction.{r}" for r in RUNTIMES), ("ttft_ms",)),
)


def nested(flat: dict) -> dict:
    """{"a.vllm": x} -> {"a": {"vllm": x}} (the shape of CALIBRATED)."""
    out: dict = {}
    for key, value in flat.items():
        if "." in key:
            name, rt = key.split(".", 1)
            out.setdefault(name, {})[rt] = value
        else:
            out[key] = value
    return out


def flat_calibrated() -> dict:
    out = {}
    for key, value in CALIBRATED.items():
        if isinstance(value, dict):
            out.update({f"{key}.{rt}": v for rt, v in value.items()})
        else:
            out[key] = value
    return out


def residuals(values: dict, metrics) -> np.ndarray:
    calib = Calibration.from_mapping(nested(values))
    out = []
    for row in evaluate_all(calib):
        if row.evaluation is None:
            continue  # not modelled (degrees the runtimes refuse): not a residual
        for metric in metrics:
            measured = row.case.measured.get(metric)
            if not measured or (metric == "tpot_ms" and (
                    row.below_floor() or row.speculation_unknown())):
                continue  # a TPOT below the physical floor, or of a run that may have
                # drafted tokens, is not one of the stated model without speculation
            predicted = row.predicted(metric)
            out.append(MISSING_PENALTY if predicted is None or predicted <= 0 else
                       math.log(predicted / measured))
    return np.array(out)


GRID_STEP = 0.01  # resolution of the synchronisation fractions' search
SWEEPS = 3  # coordinate sweeps over the runtimes


def fit_queue_fractions(values: dict) -> tuple[dict, int]:
    """The per-runtime synchronisation fractions (``prefill_queue_fraction``), which move only
    TTFT, chosen to minimise the median absolute TTFT error (the judged metric): a grid of
    ``GRID_STEP`` over [0, 1] per runtime, coordinate sweeps (each runtime's TTFT rows depend
    on its own fraction only; the median couples them), ties to the smaller fraction."""
    names = [f"prefill_queue_fraction.{r}" for r in RUNTIMES]
    grid = [round(i * GRID_STEP, 6) for i in range(int(round(1 / GRID_STEP)) + 1)]
    errors: dict = {}  # (runtime, fraction) -> that runtime's TTFT errors
    evaluations = 0

    def runtime_errors(rt: str, q: float) -> list[float]:
        nonlocal evaluations
        if (rt, q) not in errors:
            evaluations += 1
            calib = Calibration.from_mapping(nested({**values, f"prefill_queue_fraction.{rt}": q}))
            errors[(rt, q)] = [abs(r.error("ttft_ms")) for r in evaluate_all(calib, runtime=rt)
                               if r.error("ttft_ms") is not None]
        return errors[(rt, q)]

    def overall(choice: dict) -> float:
        every = [e for rt in RUNTIMES for e in runtime_errors(rt, choice[rt])]
        return float(np.median(every)) if every else 0.0

    choice = {rt: values[f"prefill_queue_fraction.{rt}"] for rt in RUNTIMES}
    for _ in range(SWEEPS):
        for rt in RUNTIMES:
            choice[rt] = min(grid, key=lambda q: (overall({**choice, rt: q}), q))
    return {**values, **{n: choice[n.split(".", 1)[1]] for n in names}}, evaluations


def fit() -> tuple[dict, int]:
    values = {n: flat_calibrated()[n] for n in NAMES}
    evaluations = 0
    for names, metrics in STAGES[:1]:
        lo = np.array([BOUNDS[n][0] for n in names])
        hi = np.array([BOUNDS[n][1] for n in names])
        x0 = np.clip(np.array([values[n] for n in names]), lo + 1e-6, hi - 1e-6)

        def f(x, names=names, metrics=metrics):
            return residuals({**values, **dict(zip(names, x))}, metrics)

        result = least_squares(f, x0, bounds=(lo, hi), loss="cauchy", f_scale=0.1,
                               diff_step=0.05, max_nfev=100, xtol=1e-4, ftol=1e-5)
        evaluations += result.nfev
        values.update({n: float(f"{v:.3g}") for n, v in zip(names, result.x)})
    values, more = fit_queue_fractions(values)
    return values, evaluations + more


def main() -> int:
    start = time.perf_counter()
    values, evaluations = fit()
    s = summary(evaluate_all(Calibration.from_mapping(nested(values))))
    print(f"fitted in {time.perf_counter() - start:.0f} s ({evaluations} evaluations)")
    for name, value in nested(values).items():
        print(f"    {name!r}: {value!r},")
    for metric in METRICS:
        m = s[metric]
        print(f"{metric}: median |error| {m['median_abs']:.3f}, max {m['max_abs']:.3f} "
              f"(n={m['n']})")
    print(f"rank agreement {s['rank']['agree']}/{s['rank']['groups']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
