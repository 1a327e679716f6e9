"""Rows and statistics of the accuracy report: every usable calibration run evaluated with
a set of constants and bands (:func:`run`), the error statistics per label, the rank
agreement of measured configurations, check verdicts and the targets missed.
bench/accuracy.py renders them into docs/accuracy.md."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import itertools
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from planner.calibration.bands import Band, BandTable, band  # noqa: E402
from planner.calibration.constants import Constants  # noqa: E402
from planner.calibration.predict import Prediction, predict  # noqa: E402
from planner.calibration.regimes import band_labels  # noqa: E402
from clusters.calibration_runs import load_runs  # noqa: E402
from planner.calibration.runs import CalibrationRun  # noqa: E402
from planner.calibration.store import shipped  # noqa: E402
from planner.config import RUNTIME_STATE_BYTES  # noqa: E402
from planner.safe_input import parse_yaml, read_text  # noqa: E402
from planner.cost.memory import zero_state_bytes  # noqa: E402

DATA = ROOT / "bench" / "data"
FILES = ("published_runs.yaml", "modern_runs.yaml", "newer_gpu_runs.yaml")
DOC = ROOT / "docs" / "accuracy.md"

# Targets (issue 10).
TIME_MEDIAN_TARGET = 0.07
BIAS_TARGET = 0.05
MEMORY_MEDIAN_TARGET = 0.07
COVERAGE_RANGE = (0.70, 0.90)
RANK_TIE = 0.03  # measured throughputs closer than this are a tie (measurement noise)
RANK_TARGET = 0.90


@dataclass
class Row:
    file: str
    run: CalibrationRun
    pred: Prediction
    time_band: Band | None = None
    memory_band: Band | None = None

    @property
    def id(self) -> str:
        return self.run.id

    @property
    def time_error(self) -> float | None:
        t = self.run.measured.step_time_s
        if t is None or self.run.measured.oom:
            return None
        return self.pred.step_time_s / t - 1

    @property
    def memory_error(self) -> float | None:
        m = self.run.measured.memory_gib
        return None if m is None else self.pred.memory_gib / m - 1

    @property
    def fit_ok(self) -> bool | None:
        if not self.pred.fit_judged:
            return None
        return self.pred.fits != self.run.measured.oom

    @property
    def time_covered(self) -> bool | None:
        t = self.run.measured.step_time_s
        if self.time_band is None or t is None or self.run.measured.oom:
            return None
        return self.time_band.low <= t <= self.time_band.high

    @property
    def memory_covered(self) -> bool | None:
        m = self.run.measured.memory_gib
        if self.memory_band is None or m is None:
            return None
        return self.memory_band.low <= m <= self.memory_band.high


def labels_of(run: CalibrationRun) -> list[str]:
    return band_labels(run.regime)


def read_entries(name: str) -> list[dict]:
    """The entries of calibration file ``name`` (bench/data), parsed by the library's YAML
    reader (libyaml's C parser where PyYAML has it: the pure-Python one takes seconds here)."""
    path = DATA / name
    return parse_yaml(read_text(path, "runs file"), str(path))["entries"]


def load_all() -> tuple[list[tuple[str, CalibrationRun]], list[tuple[str, str, str]]]:
    runs, skipped = [], []
    for name in FILES:
        got, skip = load_runs(read_entries(name))
        runs += [(name, r) for r in got]
        skipped += [(name, i, why) for i, why in skip]
    return runs, skipped


def evaluate_rows(runs: Iterable[tuple[str, CalibrationRun]], constants: Constants | None,
                  bands: BandTable | None) -> list[Row]:
    rows = []
    for name, run in runs:
        pred = predict(run, constants)
        row = Row(name, run, pred)
        if bands is not None:
            params = run.model.params
            row.time_band = band(bands, "step_time", pred.step_time_s, labels_of(run),
                                 run.cluster.num_gpus, params)
            row.memory_band = band(bands, "memory", pred.memory_gib, labels_of(run),
                                   run.cluster.num_gpus, params)
        rows.append(row)
    return rows


def run(baseline: bool = False, loaded=None) -> tuple[list[Row], list[tuple[str, str, str]]]:
    """Every usable run evaluated with the shipped constants and bands (``baseline``: the raw
    preset values); ``loaded``: what :func:`load_all` returned, to reuse one load."""
    profile = None if baseline else shipped()
    runs, skipped = loaded or load_all()
    constants = profile.constants if profile else None
    bands = profile.bands if profile else None
    return evaluate_rows(runs, constants, bands), skipped


# ----------------------------------------------------------------------------- statistics

def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def stats(rows: list[Row]) -> dict[str, Any]:
    t = [r.time_error for r in rows if r.time_error is not None]
    m = [r.memory_error for r in rows if r.memory_error is not None]
    fits = [r.fit_ok for r in rows if r.fit_ok is not None]
    tc = [r.time_covered for r in rows if r.time_covered is not None]
    mc = [r.memory_covered for r in rows if r.memory_covered is not None]
    return {
        "n": len(rows), "time_n": len(t),
        "time_median": _median([abs(x) for x in t]), "time_max": max(map(abs, t), default=None),
        "time_bias": _median(t),
        "memory_n": len(m), "memory_median": _median([abs(x) for x in m]),
        "memory_max": max(map(abs, m), default=None), "memory_bias": _median(m),
        "fit_n": len(fits), "fit_ok": sum(fits),
        "time_coverage": (sum(tc) / len(tc)) if tc else None, "time_coverage_n": len(tc),
        "memory_coverage": (sum(mc) / len(mc)) if mc else None, "memory_coverage_n": len(mc),
    }


def by_label(rows: list[Row], key: Callable[[Row], str]) -> dict[str, dict[str, Any]]:
    groups: dict[str, list[Row]] = {}
    for r in rows:
        groups.setdefault(key(r), []).append(r)
    return {k: stats(v) for k, v in sorted(groups.items())}


def _config_key(row: Row) -> tuple:
    c = row.run.config
    return (c.tp, c.pp, c.dp, c.cp, c.micro_batch, c.virtual_stages, c.zero_stage, c.sp,
            row.run.recompute, c.global_batch, row.run.cluster.num_gpus, row.run.compiled)


def _throughput(row: Row, predicted: bool) -> float:
    """Tokens per second per GPU, measured or predicted."""
    t = row.pred.step_time_s if predicted else row.run.measured.step_time_s
    return row.run.tokens_per_step / t / row.run.cluster.num_gpus


def rank_groups(rows: list[Row]) -> dict[tuple, list[Row]]:
    groups: dict[tuple, list[Row]] = {}
    for r in rows:
        if r.time_error is not None:
            groups.setdefault(r.run.rank_group, []).append(r)
    return groups


def source_noise(rows: list[Row]) -> dict[str, float]:
    """Per source: its own run-to-run noise, the largest relative throughput gap between two of
    its runs of the same configuration (repeats, other software versions), at least RANK_TIE."""
    noise: dict[str, float] = {}
    for members in rank_groups(rows).values():
        for a, b in itertools.combinations(members, 2):
            src = a.run.source
            noise.setdefault(src, RANK_TIE)
            if _config_key(a) == _config_key(b):
                gap = abs(_throughput(a, False) / _throughput(b, False) - 1)
                noise[src] = max(noise[src], gap)
    return noise


def _differs(a: Row, b: Row) -> str:
    ca, cb = a.run.config, b.run.config
    names = {"tp": "tp", "pp": "pp", "dp": "dp", "cp": "cp", "micro_batch": "mbs",
             "global_batch": "gbs", "zero_stage": "zero", "virtual_stages": "vp"}
    out = [short for f, short in names.items() if getattr(ca, f) != getattr(cb, f)]
    if a.pred.recompute != b.pred.recompute:
        out.append("recompute")
    if a.run.cluster.num_gpus != b.run.cluster.num_gpus:
        out.append("gpus")
    return "+".join(out) or "-"


def ranked_pairs(rows: list[Row]) -> list[dict[str, Any]]:
    """Every pair of different configurations one source measured on one GPU type (same
    model) whose measured throughputs differ by RANK_TIE or more: measured and predicted."""
    out = []
    for key, members in sorted(rank_groups(rows).items(), key=lambda kv: str(kv[0])):
        for a, b in itertools.combinations(members, 2):
            if _config_key(a) == _config_key(b):
                continue  # the same configuration (another software version): not a ranking
            ma, mb = _throughput(a, False), _throughput(b, False)
            if abs(ma / mb - 1) < RANK_TIE:
                continue
            pa, pb = _throughput(a, True), _throughput(b, True)
            out.append({"group": key, "a": a, "b": b, "gap": abs(ma / mb - 1),
                        "agree": (ma > mb) == (pa > pb), "differs": _differs(a, b)})
    return out


def rank_agreement(rows: list[Row], above_noise: bool = False) -> list[dict[str, Any]]:
    """Per source / GPU / model group: pairs of configurations ordered as measured. With
    ``above_noise`` only the pairs whose measured gap exceeds the source's own noise."""
    noise = source_noise(rows) if above_noise else {}
    counts: dict[tuple, list[int]] = {}
    members = rank_groups(rows)
    for p in ranked_pairs(rows):
        if above_noise and p["gap"] <= noise.get(p["a"].run.source, RANK_TIE):
            continue
        c = counts.setdefault(p["group"], [0, 0])
        c[0] += p["agree"]
        c[1] += 1
    out = []
    for key, (agree, total) in counts.items():
        source, gpu, dtype, shape = key
        out.append({"source": source, "gpu": gpu, "dtype": dtype,
                    "model": f"L{shape[0]} h{shape[1]} s{shape[5]}", "runs": len(members[key]),
                    "pairs": total, "agree": agree,
                    "noise": noise.get(source, RANK_TIE) if above_noise else RANK_TIE})
    return out


def misordered_by_cause(rows: list[Row]) -> list[tuple[str, str, int, int]]:
    """(source, what differs between the two configurations, misordered, pairs), most
    misordered first: where the ordering errors come from."""
    tally: dict[tuple[str, str], list[int]] = {}
    for p in ranked_pairs(rows):
        t = tally.setdefault((p["a"].run.source, p["differs"]), [0, 0])
        t[0] += not p["agree"]
        t[1] += 1
    return sorted(((s, d, bad, n) for (s, d), (bad, n) in tally.items() if bad),
                  key=lambda x: (-x[2], x[0], x[1]))


def misordered_by_run(rows: list[Row]) -> list[tuple[str, int, int]]:
    """(run, misordered pairs it is in, ranked pairs it is in), most misordered first."""
    tally: dict[str, list[int]] = {}
    for p in ranked_pairs(rows):
        for r in (p["a"], p["b"]):
            c = tally.setdefault(r.id, [0, 0])
            c[0] += not p["agree"]
            c[1] += 1
    return sorted(((k, bad, n) for k, (bad, n) in tally.items() if bad),
                  key=lambda x: (-x[1], x[0]))


def check_verdicts(rows: list[Row]) -> dict[tuple[bool, str], list[str]]:
    """``check``'s band-aware memory verdict (planner/calibration/verdict.py
    ``memory_verdict``: "fits", "fits only at the optimistic end", "does not fit") of every
    judged run, by (went out of memory, verdict): a run at the edge of HBM is flagged in both
    directions."""
    from planner.calibration.verdict import memory_verdict
    out: dict[tuple[bool, str], list[str]] = {}
    for r in rows:
        if r.fit_ok is None:
            continue
        verdict = memory_verdict(r.pred.evaluation, 0.5)
        if verdict is not None:
            out.setdefault((r.run.measured.oom, verdict[0]), []).append(r.id)
    return out


def _check_verdict_line(rows: list[Row]) -> str:
    v = check_verdicts(rows)
    if not v:
        return ""
    def tally(oom: bool) -> str:
        return ", ".join(f'{len(v[(oom, t)])} "{t}"' for t in
                         ("fits", "fits only at the optimistic end", "does not fit")
                         if v.get((oom, t)))
    n_oom = sum(len(ids) for (oom, _), ids in v.items() if oom)
    n_ran = sum(len(ids) for (oom, _), ids in v.items() if not oom)
    return (f"- with the memory bands (`check`'s verdict; not a target): of the {n_oom} runs "
            f"that went out of memory {tally(True)}; of the {n_ran} that ran {tally(False)}")


def targets_missed(rows: list[Row]) -> list[str]:
    s = stats(rows)
    missed = []
    if s["time_median"] is not None and s["time_median"] > TIME_MEDIAN_TARGET:
        missed.append(f"step-time median |error| {s['time_median']:.1%} > "
                      f"{TIME_MEDIAN_TARGET:.0%}")
    if s["memory_median"] is not None and s["memory_median"] > MEMORY_MEDIAN_TARGET:
        missed.append(f"memory median |error| {s['memory_median']:.1%} > "
                      f"{MEMORY_MEDIAN_TARGET:.0%}")
    for kind, key in (("runtime", lambda r: r.run.regime.runtime),
                      ("generation", lambda r: r.run.regime.generation),
                      ("parallelism", lambda r: r.run.regime.parallelism)):
        for label, st in by_label(rows, key).items():
            if st["time_bias"] is not None and abs(st["time_bias"]) > BIAS_TARGET:
                missed.append(f"{kind} {label}: step-time bias {st['time_bias']:+.1%}")
    ranks = rank_agreement(rows)
    pairs = sum(g["pairs"] for g in ranks)
    agree = sum(g["agree"] for g in ranks)
    if pairs and agree / pairs < RANK_TARGET:
        missed.append(f"rank agreement {agree}/{pairs} ({agree / pairs:.0%}) < "
                      f"{RANK_TARGET:.0%}")
    wrong = [r.id for r in rows if r.fit_ok is False]
    if wrong:
        missed.append(f"wrong fit verdicts: {', '.join(wrong)}")
    for q in ("time", "memory"):
        c = s[f"{q}_coverage"]
        if c is not None and not COVERAGE_RANGE[0] <= c <= COVERAGE_RANGE[1]:
            missed.append(f"{q} band coverage {c:.0%} outside {COVERAGE_RANGE[0]:.0%}-"
                          f"{COVERAGE_RANGE[1]:.0%}")
    return missed


def zero_rows(entries: list[dict]) -> list[tuple[str, float, float]]:
    rows = []
    for entry in entries:
        r = entry["results"]
        if "model_state_memory_gb" in r:
            nd = entry["training"]["dp"]
            for stage, key in enumerate(("baseline_dp", "zero1_pos", "zero2_pos_g",
                                         "zero3_pos_g_p")):
                got = zero_state_bytes(7.5e9, nd, stage, RUNTIME_STATE_BYTES["zero-paper"]).total
                rows.append((f"{entry['id']} stage {stage}", r["model_state_memory_gb"][key],
                             got / 1e9))
    return rows


# ----------------------------------------------------------------------------- formatting

def _pct(v: float | None, signed: bool = False) -> str:
    if v is None:
        return ""
    return f"{v:+.1%}" if signed else f"{v:.1%}"


def _pct0(v: float | None) -> str:
    return "-" if v is None else f"{v:.0%}"


def _cov(v: float | None, n: int) -> str:
    return "" if v is None else f"{v:.0%} ({n})"
