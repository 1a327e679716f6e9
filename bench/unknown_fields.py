"""Runs that do not publish their micro-batch size: the error over every plausible one.

An entry with ``training.micro_batch: null`` is evaluated at micro-batch 1 and says so in its
assumptions (planner/calibration/runs.py ``run_of``). That stays the headline prediction: the
micro-batch that best fits the measurement is never picked, because a search scored against
it would be scored against a guess. This module reports, next to it, the error at every
micro-batch the run could have used (:func:`plausible_micro_batches`):

* it divides the data-parallel replica's share of the global batch (global batch =
  micro-batch x dp x micro-batches, Megatron-LM's ``--global-batch-size`` rule);
* the model predicts it to fit with the recomputation of the headline prediction (a larger
  micro-batch that needs more recomputation to fit is a different configuration from the one
  the source describes).

In-sample with the shipped constants, and held out with each source's fold constants
(``bench/data/holdout.json``, written by ``python bench/holdout.py``).
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from planner.calibration.constants import Constants
from planner.calibration.predict import predict
from planner.calibration.runs import ASSUMED_MICRO_BATCH, CalibrationRun

HOLDOUT = Path(__file__).resolve().parent / "data" / "holdout.json"


def micro_batch_assumed(run: CalibrationRun) -> bool:
    return ASSUMED_MICRO_BATCH in run.assumptions


def plausible_micro_batches(run: CalibrationRun, constants: Constants | None
                            ) -> dict[int, float]:
    """Step-time error (predicted / measured - 1) at each plausible micro-batch of ``run``."""
    per_replica = run.config.global_batch // run.config.dp
    headline = predict(run, constants)
    out: dict[int, float] = {}
    for b in range(1, per_replica + 1):
        if per_replica % b:
            continue
        p = headline if b == run.config.micro_batch else predict(
            replace(run, config=replace(run.config, micro_batch=b)), constants)
        if p.fits and p.recompute == headline.recompute:
            out[b] = p.step_time_s / run.measured.step_time_s - 1
    return out


def _fold_constants() -> dict[str, Constants]:
    if not HOLDOUT.exists():
        return {}
    data = json.loads(HOLDOUT.read_text())
    return {r["id"]: Constants(f["constants"], f"held out: {f['source']}")
            for f in data["folds"] for r in f.get("rows", [])}


def micro_batch_bands(rows, constants: Constants | None) -> list[dict[str, Any]]:
    """One record per timed row whose micro-batch is assumed: the errors in-sample and held
    out (the fold that left the row's source out) at every plausible micro-batch."""
    folds = _fold_constants()
    out = []
    for row in rows:
        run = row.run
        if not micro_batch_assumed(run) or row.time_error is None:
            continue
        rec = {"id": run.id, "assumed": run.config.micro_batch,
               "in_sample": plausible_micro_batches(run, constants)}
        if run.id in folds:
            rec["held_out"] = plausible_micro_batches(run, folds[run.id])
        out.append(rec)
    return out


def held_out_max_range(bands: list[dict[str, Any]], data: dict, target: float
                       ) -> dict[str, Any] | None:
    """The held-out step-time max when each run without a published micro-batch is judged over
    its plausible micro-batches instead of at the assumption: ``low`` the max if every such run
    used the size nearest its measurement (a bound, not a claim: that would be picking the
    best fit), ``high`` the max if every one used the farthest, ``at_assumption`` the max at
    micro-batch 1 (today's model with the fold constants, as the band's values are). Runs that
    publish their micro-batch keep their held-out error (``data``: bench/data/holdout.json).
    Each bound names the run that sets it; ``above``: per run, its plausible micro-batches whose
    held-out |error| exceeds ``target`` (and ``others``: the rest of its band); None when no
    band has held-out values."""
    held = {b["id"]: b["held_out"] for b in bands if b.get("held_out")}
    if not held:
        return None
    assumed = {b["id"]: b["assumed"] for b in bands}
    known = [(abs(r["time_error"]), r["id"]) for f in data["folds"] for r in f.get("rows", [])
             if r.get("time_error") is not None and r["id"] not in assumed]
    low = max(known + [(min(abs(e) for e in v.values()), i) for i, v in held.items()])
    high = max(known + [(max(abs(e) for e in v.values()), i) for i, v in held.items()])
    at = max(known + [(abs(v[assumed[i]]), i) for i, v in held.items() if assumed[i] in v])
    above = {i: ({b: e for b, e in v.items() if abs(e) > target},
                 {b: e for b, e in v.items() if abs(e) <= target})
             for i, v in held.items() if any(abs(e) > target for e in v.values())}
    return {"low": low[0], "low_id": low[1], "high": high[0], "high_id": high[1],
            "at_assumption": at[0], "at_assumption_id": at[1], "runs": len(held),
            "above": above}


def _span(errors: dict[int, float]) -> str:
    lo, hi = min(errors.values()), max(errors.values())
    return f"{lo:+.1%} .. {hi:+.1%}"


def errors_at(errors: dict[int, float]) -> str:
    return ", ".join(f"{b}: {e:+.1%}" for b, e in sorted(errors.items()))


# How run_of fills the other unpublished fields (the assumption's text -> the rule).
RULES = (
    ("sp on", "sequence parallelism: on when tp > 1 and the runtime has it"),
    ("zero 1", "ZeRO stage: 1 (distributed optimizer) for Megatron, 0 for the others"),
    ("no interleaving", "virtual pipeline stages: 1 (no interleaving)"),
    ("no recompute", "recomputation: none, or the least that fits when none does (the run ran); "
                     "such a run's fit verdict is not judged"),
)


def assumption_counts(rows) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in rows:
        for text in row.run.assumptions:
            key = text.split(" (")[0]
            counts[key] = counts.get(key, 0) + 1
    return counts


def section(bands: list[dict[str, Any]], counts: dict[str, int] | None = None) -> list[str]:
    """The docs/accuracy.md section: how an unknown micro-batch is treated, and the band;
    ``counts``: how many runs carry each assumption (:func:`assumption_counts`)."""
    counts = counts or {}
    if not bands:
        return []
    worst = max(bands, key=lambda b: abs(b["in_sample"][b["assumed"]]))
    held = [b for b in bands if "held_out" in b]
    lines = ["", "## Runs without a published micro-batch size", "",
             f"{len(bands)} timed runs do not publish their micro-batch size. Each is evaluated "
             f"at micro-batch {worst['assumed']} (stated in its assumptions) and that is the "
             "error every statistic above uses: the micro-batch that best fits the "
             "measurement is never picked. The band: the error at every micro-batch that "
             "divides the replica's share of the global batch and that the model predicts to "
             "fit with the same recomputation (bench/unknown_fields.py).", ""]
    worst_held = max(held, key=lambda b: abs(b["held_out"][b["assumed"]]), default=None)
    lines.append(f"- in-sample: the largest error at the assumption is {worst['id']} "
                 f"({worst['in_sample'][worst['assumed']]:+.1%}); over its plausible "
                 f"micro-batches ({errors_at(worst['in_sample'])}) it spans "
                 f"{_span(worst['in_sample'])}")
    if worst_held is not None:
        e = worst_held["held_out"]
        lines.append(f"- held out (its source's fold constants): {worst_held['id']} "
                     f"{e[worst_held['assumed']]:+.1%} at the assumption; over its plausible "
                     f"micro-batches ({errors_at(e)}) {_span(e)}")
    lines += ["", "The other fields an entry may leave out are set by fixed rules, each stated "
              "in the run's assumptions (planner/calibration/runs.py ``run_of``; counts over "
              "the evaluated runs):", ""]
    lines += [f"- {text}: {counts.get(key, 0)} runs" for key, text in RULES]
    lines += ["", "| entry | assumed | plausible micro-batches: error in-sample | span "
              "| held out | span |", "|---|---:|---|---|---|---|"]
    for b in bands:
        h = b.get("held_out")
        lines.append(f"| {b['id']} | {b['assumed']} | {errors_at(b['in_sample'])} "
                     f"| {_span(b['in_sample'])} | {errors_at(h) if h else ''} "
                     f"| {_span(h) if h else ''} |")
    return lines
