"""The held-out section of docs/accuracy.md: bench/holdout.py's leave-one-source-out
estimate (bench/data/holdout.json) rendered, its targets judged, and how far today's
model moved it."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import json

from bench import unknown_fields  # noqa: E402
from bench.accuracy_runs import (COVERAGE_RANGE, DATA, RANK_TARGET, Row, _pct,  # noqa: E402
                                 _pct0, rank_agreement)
from planner.calibration.constants import Constants  # noqa: E402
from planner.calibration.predict import predict  # noqa: E402


def _holdout_now() -> dict[str, str]:
    """The held-out rows of the "History" table (bench/data/holdout.json)."""
    path = DATA / "holdout.json"
    if not path.exists():
        return {}
    h = json.loads(path.read_text())["summary"]
    wide = h.get("nested_coverage", {}).get("widened", {})
    return {"held out: time median": _pct(h["time_median"]),
            "held out: time max": _pct(h["time_max"]),
            "held out: time bias": _pct(h["time_bias"], True),
            "held out: rank agreement": f"{h['agree']}/{h['pairs']} "
                                        f"({h['agree'] / h['pairs']:.0%})" if h["pairs"] else "",
            "held out: fit verdicts": f"{h['verdicts'] - len(h['wrong_verdicts'])}/"
                                      f"{h['verdicts']}",
            "held out: band coverage, time / memory": f"{_pct0(wide.get('step_time'))} / "
                                                      f"{_pct0(wide.get('memory'))}"}


def held_out_rows(rows: list[Row], data: dict) -> list[Row]:
    """``rows`` with each step-time prediction replaced by its held-out one (the fold that
    left the run's source out, bench/data/holdout.json), for the rank agreement above noise."""
    from dataclasses import replace
    error = {r["id"]: r["time_error"] for f in data["folds"] for r in f.get("rows", [])}
    out = []
    for row in rows:
        e = error.get(row.id)
        if e is None or row.time_error is None:
            continue
        pred = replace(row.pred, step_time_s=row.run.measured.step_time_s * (1 + e))
        out.append(Row(row.file, row.run, pred))
    return out


HELD_OUT_MEDIAN_TARGET = 0.10
HELD_OUT_MAX_TARGET = 0.30


def _max_range_text(r: dict) -> str:
    return (f"over the plausible micro-batches of the {r['runs']} runs that do not publish "
            f"theirs the held-out max lies in {r['low']:.1%} ({r['low_id']}) .. "
            f"{r['high']:.1%} ({r['high_id']}), {r['at_assumption']:.1%} at the assumed "
            f"micro-batch 1 (bench/unknown_fields.py)")


def held_out_targets_missed(rows: list[Row], bands: list[dict] | None = None) -> list[str]:
    """The targets on runs not in the files (issue 10), judged on the leave-one-source-out
    estimate (bench/data/holdout.json): median <= 10 %, max <= 30 %, rank agreement >= 90 %, no
    run that ran predicted not to fit, and the shipped band construction covering 70-90 % of the
    runs of a source it was built without (``nested_coverage``, ``widened``). The max stays
    judged at the assumed micro-batch (never the best-fitting size); with ``bands``
    (unknown_fields.micro_batch_bands) its line also says what the max is over the plausible
    micro-batches: a miss that only the unpublished micro-batch decides says so, and is still
    listed."""
    path = DATA / "holdout.json"
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    h = data["summary"]
    missed = []
    if h["time_median"] > HELD_OUT_MEDIAN_TARGET:
        missed.append(f"held out: step-time median {h['time_median']:.1%} > "
                      f"{HELD_OUT_MEDIAN_TARGET:.0%}")
    span = (unknown_fields.held_out_max_range(bands, data, HELD_OUT_MAX_TARGET)
            if bands else None)
    if h["time_max"] > HELD_OUT_MAX_TARGET or (span and span["high"] > HELD_OUT_MAX_TARGET):
        line = (f"held out: step-time max {h['time_max']:.1%} "
                f"{'>' if h['time_max'] > HELD_OUT_MAX_TARGET else '<='} "
                f"{HELD_OUT_MAX_TARGET:.0%} at the assumed micro-batch")
        if span:
            line += f"; {_max_range_text(span)}"
            if span["low"] > HELD_OUT_MAX_TARGET:
                line += ": missed at every plausible micro-batch"
            elif span["above"]:
                line += ": missed only if " + "; ".join(
                    f"{i} ran at micro-batch {unknown_fields.errors_at(bad)}, met at "
                    f"{unknown_fields.errors_at(ok) or 'none'}"
                    for i, (bad, ok) in sorted(span["above"].items()))
        missed.append(line)
    if h["pairs"] and h["agree"] / h["pairs"] < RANK_TARGET:
        missed.append(f"held out: rank agreement {h['agree']}/{h['pairs']} "
                      f"({h['agree'] / h['pairs']:.0%}) < {RANK_TARGET:.0%}")
    wide = h.get("nested_coverage", {}).get("widened", {})
    for quantity, name in (("step_time", "step time"), ("memory", "memory")):
        c = wide.get(quantity)
        if c is not None and not COVERAGE_RANGE[0] <= c <= COVERAGE_RANGE[1]:
            missed.append(f"held out: {name} band coverage of a source the bands were built "
                          f"without {c:.0%} outside {COVERAGE_RANGE[0]:.0%}-"
                          f"{COVERAGE_RANGE[1]:.0%}")
    oom = {r.id for r in rows if r.run.measured.oom}
    ran = [i for i in h["wrong_verdicts"] if i not in oom]
    if ran:
        missed.append(f"held out: runs that ran predicted not to fit: {', '.join(ran)}")
    return missed


def _held_out_max_published(rows: list[Row], data: dict) -> str:
    """The held-out max over the runs whose micro-batch size is published (an added line:
    the headline max above keeps the runs evaluated at an assumed micro-batch)."""
    assumed = {r.id for r in rows if unknown_fields.micro_batch_assumed(r.run)}
    errors = [(abs(r["time_error"]), r["id"]) for f in data["folds"] for r in f.get("rows", [])
              if r.get("time_error") is not None]
    known = [e for e in errors if e[1] not in assumed]
    if not known or len(known) == len(errors):
        return ""
    worst, which = max(known)
    return (f"- of which over the {len(known)} runs that publish their micro-batch size "
            f"(not a target; the {len(errors) - len(known)} others are evaluated at an assumed "
            f"micro-batch 1, see \"Runs without a published micro-batch size\"): max "
            f"{worst:.1%} ({which})")


def held_out_drift(rows: list[Row], data: dict) -> str:
    """How far today's model moved the held-out errors since bench/holdout.py ran: each
    fold's constants re-applied to today's cost model (no re-fit)."""
    runs = {r.id: r.run for r in rows}
    diffs = []
    for f in data["folds"]:
        constants = Constants(f["constants"])
        for rec in f.get("rows", []):
            run = runs.get(rec["id"])
            if rec.get("time_error") is None or run is None:
                continue
            now = predict(run, constants).step_time_s / run.measured.step_time_s - 1
            diffs.append((abs(now - rec["time_error"]), abs(now)))
    if not diffs:
        return ""
    return (f"- the fold constants re-applied to today's cost model (no re-fit: cost-term "
            f"changes since bench/holdout.py ran) move a held-out error by at most "
            f"{max(d for d, _ in diffs):.1%} (max |error| today {max(e for _, e in diffs):.1%})")


def holdout_section(rows: list[Row] | None = None,
                    bands: list[dict] | None = None) -> list[str]:
    """The leave-one-source-out estimate (bench/holdout.py writes bench/data/holdout.json)."""
    path = DATA / "holdout.json"
    if not path.exists():
        return ["", "## Held-out estimate", "", "Not measured: run `python bench/holdout.py`."]
    data = json.loads(path.read_text())
    h = data["summary"]
    noisy = rank_agreement(held_out_rows(rows, data), above_noise=True) if rows else []
    npairs, nagree = sum(g["pairs"] for g in noisy), sum(g["agree"] for g in noisy)
    span = unknown_fields.held_out_max_range(bands or [], data, HELD_OUT_MAX_TARGET)
    lines = ["", "## Held-out estimate (leave one source out)", "",
             f"`python bench/holdout.py`: for each source, the constants are fitted on the "
             f"other sources only (same model, bounds and loss as the shipped fit, "
             f"at most {data['max_evaluations']} evaluations, regularised toward the same "
             f"priors) and the source's runs are predicted. This estimates the targets on runs "
             f"not in these files.", "",
             f"- step time over {h['time_n']} held-out runs: median |error| "
             f"**{h['time_median']:.1%}**, max {h['time_max']:.1%}, median signed "
             f"{h['time_bias']:+.1%} (targets: median <= 10%, max <= 30%)",
             _held_out_max_published(rows, data) if rows else "",
             *([f"- judged over the band instead of at the assumption (the micro-batch is "
                f"unknown, and the best-fitting one is never picked): {_max_range_text(span)}"]
               if span else []),
             held_out_drift(rows, data) if rows else "",
             f"- median over sources of the per-source median |error|: "
             f"{h['sources_median']:.1%}",
             f"- rank agreement inside each held-out source: {h['agree']}/{h['pairs']} "
             f"({h['agree'] / h['pairs']:.0%}; target >= 90%)"
             + (f"; above the source's own noise {nagree}/{npairs} ({nagree / npairs:.0%})"
                if npairs else "") if h["pairs"] else "",
             f"- fit verdicts: {h['verdicts'] - len(h['wrong_verdicts'])}/{h['verdicts']} "
             f"right" + (f" (wrong: {', '.join(h['wrong_verdicts'])})"
                         if h["wrong_verdicts"] else ""),
             f"- band coverage of held-out runs (80 % nominal): with the fold's in-sample "
             f"bands {h['time_coverage']:.0%} (step time); with the shipped construction (the "
             f"fold's in-sample bands widened by the between-source spread of the other "
             f"sources, measured without the held-out source) "
             f"{_pct0(h.get('nested_coverage', {}).get('widened', {}).get('step_time'))} "
             f"step time, "
             f"{_pct0(h.get('nested_coverage', {}).get('widened', {}).get('memory'))} memory "
             f"(bench/holdout.py's bands, which do not record recomputation: the shipped bands "
             f"also widen for a policy no run of the regime used, so these are lower bounds)"
             if h["time_coverage"] is not None else "",
             f"- memory over {h['memory_n']} held-out readings: median |error| "
             f"{_pct(h['memory_median'])}" if h.get("memory_n") else "",
             f"- between-source spread of the step time (log ratio, robust): "
             f"{h['between_source_sigma']['step_time']:.3f}; the shipped step-time bands "
             f"combine it with each regime's in-sample spread (memory: fewer than 3 sources "
             f"publish it, its bands stay in-sample)"
             if h.get("between_source_sigma", {}).get("step_time") else "",
             "",
             "| held-out source | runs | median abs | max abs | median signed | pairs ordered |",
             "|---|---:|---:|---:|---:|---:|"]
    for f in data["folds"]:
        st = f["stats"]
        pairs = sum(g["pairs"] for g in f["ranks"])
        agree = sum(g["agree"] for g in f["ranks"])
        lines.append(f"| {f['source'][:70]} | {st['time_n']} | {_pct(st['time_median'])} "
                     f"| {_pct(st['time_max'])} | {_pct(st['time_bias'], True)} "
                     f"| {f'{agree}/{pairs}' if pairs else ''} |")
    return lines
