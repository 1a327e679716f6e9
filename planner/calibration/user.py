"""``shardplan calibrate``: fit one runtime profile's constants to a user's own measured runs.

Consumes a runs file in the calibration schema (``published_runs.yaml``: ``entries`` with
``model`` (shapes, or a preset name / config.json path), ``cluster``, ``training``, ``results``)
and a runtime; produces a :class:`~planner.calibration.store.CalibrationProfile` (the file
``--calibration`` reads) and a leave-one-out report: each run predicted by constants fitted
without it, before (the shipped defaults) and after.

Which constants move: only those the runs can inform (the efficiencies of the GPU generations
present, the FP8 efficiency when a run is FP8, the runtime's TP overlap when a run uses TP,
its element-wise fusion (eager or torch.compile) and per-block host overhead); the others keep
their starting values.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Sequence

from planner.calibration.bands import BandTable
from planner.calibration.constants import PARAM_NAMES, PARAMS, Constants
from planner.calibration.fit import fit, residual_bands
from planner.calibration.predict import predict
from planner.calibration.runs import CalibrationRun
from planner.calibration.store import CalibrationProfile
from planner.errors import invalid


@dataclass(frozen=True)
class RunReport:
    id: str
    measured_s: float
    before_s: float
    after_s: float  # leave-one-out prediction

    @property
    def error_before(self) -> float:
        return self.before_s / self.measured_s - 1

    @property
    def error_after(self) -> float:
        return self.after_s / self.measured_s - 1


@dataclass(frozen=True)
class CalibrationReport:
    profile: CalibrationProfile
    runs: tuple[RunReport, ...]
    skipped: tuple[tuple[str, str], ...]
    # the errors after are leave-one-out (each run predicted by a fit without it); False:
    # in-sample, as asked, or because one timed run leaves nothing to fit without it
    leave_one_out: bool = True

    @property
    def median_before(self) -> float:
        return statistics.median(abs(r.error_before) for r in self.runs)

    @property
    def median_after(self) -> float:
        return statistics.median(abs(r.error_after) for r in self.runs)


def informative(runs: Sequence[CalibrationRun]) -> list[str]:
    """The constants these runs can inform."""
    names = set()
    for run in runs:
        gen = run.regime.generation
        names.update({f"matmul_efficiency.{gen}", f"attention_efficiency.{gen}"})
        if run.config.dtype == "fp8":
            own = f"fp8_relative_efficiency.{run.profile.name}"
            names.add(own if own in PARAM_NAMES else "fp8_relative_efficiency")
        if run.config.tp > 1 and run.profile.tp_comm_overlap:
            names.add(f"tp_comm_overlap.{run.profile.name}")
        names.add("compiled_elementwise" if run.compiled
                  else f"unfused_elementwise.{run.profile.name}")
        names.add(f"block_overhead_s.{run.profile.name}")
        if run.measured.memory_gib:
            names.add(f"allocator_overhead.{run.profile.name}")
    return [p.name for p in PARAMS if p.name in names]


def calibrate_runs(runs: Sequence[CalibrationRun], runtime: str, start: Constants,
                   *, max_evaluations: int = 60, leave_one_out: bool = True,
                   skipped: Sequence[tuple[str, str]] = (),
                   start_bands: BandTable | None = None) -> CalibrationReport:
    """``start_bands``: the error bands that come with ``start`` (the shipped profile's); a
    quantity none of the runs measured (peak memory, where no run reports it) keeps its band
    from them, as it keeps the constants that predict it (the allocator overhead is fitted
    only to measured memory): without, its band had no residual and was zero wide."""
    timed = [r for r in runs if r.measured.step_time_s and not r.measured.oom]
    if not timed:
        raise invalid("no run with a measured step time (iteration_time_s or "
                      "tokens_per_sec_per_gpu) to calibrate on")
    names = informative(timed)
    result = fit(timed, start, names, max_evaluations=max_evaluations)
    reports = []
    leave_one_out = leave_one_out and len(timed) > 1
    for i, run in enumerate(timed):
        before = predict(run, start).step_time_s
        if leave_one_out:
            others = timed[:i] + timed[i + 1:]
            loo = fit(others, start, informative(others), max_evaluations=max_evaluations)
            after = predict(run, loo.constants).step_time_s
        else:
            after = predict(run, result.constants).step_time_s
        reports.append(RunReport(run.id, run.measured.step_time_s, before, after))
    bands = residual_bands(timed, result.constants)
    kept = sorted(set(start_bands.pooled) - set(bands.pooled)) if start_bands else []
    if kept:
        bands = BandTable({**bands.pooled, **{q: start_bands.pooled[q] for q in kept}},
                          {**bands.labels, **{q: start_bands.labels.get(q, {}) for q in kept}})
    how = "loo" if leave_one_out else "in_sample"
    prof = CalibrationProfile(
        constants=result.constants, bands=bands,
        runtime=runtime, description=f"Calibrated with shardplan calibrate on {len(timed)} runs",
        fit={"runs": len(timed), "fitted": list(names),
             f"{how}_median_abs_error_before": round(statistics.median(
                 abs(r.error_before) for r in reports), 4),
             f"{how}_median_abs_error_after": round(statistics.median(
                 abs(r.error_after) for r in reports), 4),
             **({"bands_kept_from_start": kept} if kept else {})})
    return CalibrationReport(prof, tuple(reports), tuple(skipped), leave_one_out)

