"""Serving cost-model accuracy on measured inference runs, and search times.

Re-evaluates every entry of ``bench/data/inference_runs.yaml`` (rules in
``bench/inference_data.py``; none special-cased) with the library's defaults and writes
``docs/inference.md``'s generated sections: per entry predicted vs measured throughput per GPU,
TTFT and TPOT; median / max absolute error and signed bias per regime; rank agreement inside
groups (same model, GPU type, framework, precision and ISL/OSL, several configurations); search
time per instance. Run::

    python bench/inference.py           # writes docs/inference.md, prints the summary
    python bench/inference.py --check   # also exits 1 when a target is missed
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from inference_data import Case, cases  # noqa: E402
from planner.errors import PlannerError  # noqa: E402
from planner.serve.evaluate import ServingEvaluation, evaluate_serving  # noqa: E402

DOC = ROOT / "docs" / "inference.md"
METRICS = ("output_tokens_per_s_per_gpu", "ttft_ms", "tpot_ms")
TARGETS = {"output_tokens_per_s_per_gpu": 0.15, "tpot_ms": 0.15, "ttft_ms": 0.20}
RANK_TARGET = 0.80
ABOVE_FLOOR = "tpot_ms_above_floor"  # TPOT over the rows not below the physical decode floor
KNOWN = "tpot_ms_speculation_known"  # TPOT over the rows whose decoding is known
UNKNOWN = "tpot_ms_speculation_unknown"  # TPOT of the MTP-capable rows that do not say
BEGIN, END = "<!-- BEGIN GENERATED: {} -->", "<!-- END GENERATED: {} -->"


@dataclass
class Row:
    case: Case
    evaluation: ServingEvaluation | None
    skipped: str = ""
    one_draft: ServingEvaluation | None = None  # the reading with one MTP draft (see below)

    def predicted(self, metric: str) -> float | None:
        if self.evaluation is None or not self.evaluation.fits:
            return None
        return self.evaluation.predicted()[metric]

    def error(self, metric: str) -> float | None:
        measured, predicted = self.case.measured.get(metric), self.predicted(metric)
        if not measured or predicted is None:
            return None
        return predicted / measured - 1.0

    def floor_ms(self) -> float | None:
        """The physical floor of the decode step at the modelled batch (planner/serve/floor.py)."""
        if self.evaluation is None or not self.evaluation.fits:
            return None
        from planner.serve.floor import decode_floor_s
        c, pool = self.case, self.evaluation.pools[-1]
        return 1e3 * decode_floor_s(c.model, c.cluster.gpu, pool.worker, c.workload.dtype,
                                    c.workload.kv_cache_dtype, pool.batch,
                                    c.workload.isl + c.workload.osl / 2)

    def below_floor(self) -> bool:
        """Measured TPOT under the decode floor: more than one token per step of the stated
        model (speculative decoding not stated) or another configuration than stated."""
        measured, floor = self.case.measured.get("tpot_ms"), self.floor_ms()
        return bool(measured and floor and measured < floor)

    def speculation_unknown(self) -> bool:
        """The model ships a multi-token-prediction module (Hugging Face
        ``num_nextn_predict_layers``: DeepSeek-V3/R1) and the entry does not say whether the
        run drafted with it (``serving.speculative_decoding`` null): a decode step then yields
        one token or, with one MTP draft at DeepSeek-V3's 0.85 acceptance, 1.85 (aiconfigurator,
        the source of the silicon rows, models DeepSeek-V3-architecture models with one draft
        token by default). Its TPOT is not a measurement of the stated model without
        speculation: left out of the fit, reported apart under both readings."""
        from planner.serve.evaluate import mtp_layers
        c = self.case
        return c.speculative is None and not c.workload.draft_tokens and mtp_layers(c.model) > 0

    def ranked_value(self) -> float | None:
        return self.case.measured["output_tokens_per_s_per_gpu"] or \
            self.case.derived_tokens_per_s_per_gpu


def evaluate_all(calibration=None, runtime: str | None = None,
                 readings: bool = False) -> list[Row]:
    """Every entry (or those of one ``runtime``) with the library's defaults or
    ``calibration``; ``readings``: also the one-MTP-draft reading of the entries whose
    speculative setting is unknown (:meth:`Row.speculation_unknown`)."""
    rows = []
    for c in cases():
        if runtime is not None and c.runtime != runtime:
            continue
        try:
            ev = evaluate_serving(c.model, c.cluster, c.workload, c.config, c.runtime,
                                  calibration)
        except PlannerError as error:  # degrees the runtimes do not accept, for instance
            rows.append(Row(c, None, error.message))
            continue
        row = Row(c, ev, "" if ev.fits else "predicted not to fit: " + "; ".join(ev.problems))
        if readings and ev.fits and row.speculation_unknown():
            row.one_draft = evaluate_serving(c.model, c.cluster, replace(
                c.workload, draft_tokens=1), c.config, c.runtime, calibration)
        rows.append(row)
    return rows


def _one_draft_error(row: Row) -> float | None:
    measured, ev = row.case.measured.get("tpot_ms"), row.one_draft
    if not measured or ev is None or not ev.fits:
        return None
    return ev.tpot_s * 1e3 / measured - 1.0


def summary(rows: list[Row]) -> dict:
    out = {}
    for metric in METRICS:
        errors = [r.error(metric) for r in rows if r.error(metric) is not None]
        measured = [r for r in rows if r.case.measured.get(metric)]
        out[metric] = {"n": len(errors), "measured": len(measured),
                       "median_abs": statistics.median(abs(e) for e in errors) if errors else None,
                       "max_abs": max(abs(e) for e in errors) if errors else None,
                       "bias": {regime: statistics.median(v) for regime, v in _by_regime(
                           rows, metric).items()}}
    kept = [r.error("tpot_ms") for r in rows
            if r.error("tpot_ms") is not None and not r.below_floor()]
    out[ABOVE_FLOOR] = {"n": len(kept), "below": sum(r.below_floor() for r in rows),
                        "median_abs": statistics.median(abs(e) for e in kept) if kept else None,
                        "max_abs": max(abs(e) for e in kept) if kept else None}
    out[KNOWN] = {}
    for metric in ("ttft_ms", "tpot_ms"):
        known = [r.error(metric) for r in rows
                 if r.error(metric) is not None and not r.speculation_unknown()]
        out[KNOWN][metric] = {
            "n": len(known), "median_abs": statistics.median(abs(e) for e in known)
            if known else None, "max_abs": max(abs(e) for e in known) if known else None,
            "bias": statistics.median(known) if known else None}
    unknown = [(r.error("tpot_ms"), _one_draft_error(r)) for r in rows
               if r.error("tpot_ms") is not None and r.speculation_unknown()]
    drafted = [d for _, d in unknown if d is not None]
    out[UNKNOWN] = {"n": len(unknown),
                    "median_abs": statistics.median(abs(e) for e, _ in unknown)
                    if unknown else None,
                    "bias": statistics.median(e for e, _ in unknown) if unknown else None,
                    "draft_n": len(drafted),
                    "draft_median_abs": statistics.median(abs(d) for d in drafted)
                    if drafted else None,
                    "draft_bias": statistics.median(drafted) if drafted else None}
    out["rank"] = rank_agreement(rows)
    return out


def _by_regime(rows, metric):
    groups = defaultdict(list)
    for r in rows:
        e = r.error(metric)
        if e is not None:
            groups[r.case.regime].append(e)
    return dict(sorted(groups.items()))


def residual_groups(rows: list[Row]) -> dict[tuple, dict[str, list[float]]]:
    """Signed errors by (runtime, model, regime, concurrency band)."""
    groups: dict = defaultdict(lambda: defaultdict(list))
    for r in rows:
        c = r.case
        conc = c.workload.concurrency
        band = "offline" if conc is None else ("<= 64" if conc <= 64 else "> 64")
        for metric in METRICS:
            e = r.error(metric)
            if e is not None:
                groups[(c.runtime, c.model.name, c.regime, band)][metric].append(e)
    return dict(sorted(groups.items()))


def residual_table(rows: list[Row]) -> str:
    lines = ["| runtime | model | regime | concurrency | entries | tok/s/GPU median | TTFT "
             "median | TPOT median |", "|---|---|---|---|---|---|---|---|"]
    for (rt, fam, regime, band), errors in residual_groups(rows).items():
        n = max(len(v) for v in errors.values())
        cells = [_pct(statistics.median(errors[m])) if errors.get(m) else "-" for m in METRICS]
        lines.append(f"| {rt} | {fam} | {regime} | {band} | {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def rank_groups(rows: list[Row]) -> dict[tuple, list[Row]]:
    groups = defaultdict(list)
    for r in rows:
        if r.ranked_value():
            groups[r.case.group].append(r)
    return {k: v for k, v in groups.items() if len(v) >= 2}


def rank_agreement(rows: list[Row]) -> dict:
    """Groups whose every member the model evaluates: is the predicted best the measured
    best? (A member predicted not to fit ranks last; groups with a member the runtimes'
    rules refuse, e.g. tp not dividing the heads, are listed but not scored.)"""
    agree, scored_groups, details = 0, 0, []
    for key, members in sorted(rank_groups(rows).items()):
        best_measured = max(members, key=lambda r: r.ranked_value())
        if any(r.evaluation is None for r in members):
            details.append((key, len(members), best_measured.case.id, "not scored: " +
                            next(r.skipped for r in members if r.evaluation is None), None))
            continue
        best_predicted = max(members, key=lambda r: (
            r.predicted("output_tokens_per_s_per_gpu") or 0.0))
        ok = best_predicted is best_measured
        agree += ok
        scored_groups += 1
        details.append((key, len(members), best_measured.case.id, best_predicted.case.id, ok))
    return {"groups": scored_groups, "agree": agree,
            "fraction": agree / scored_groups if scored_groups else None, "details": details}


def search_times(rows: list[Row]) -> list[tuple[str, float, str]]:
    """Search each entry's model on its cluster under the entry's measured latencies (as the
    targets) and mode, plus the issue's two instances."""
    from clusters import load_cluster
    from models import load_model
    from planner.serve.search import search_serving
    from planner.serve.workload import ServingWorkload

    out = []
    seen = set()
    for r in rows:
        c = r.case
        key = (c.model.name, c.cluster.gpu.name, c.cluster.num_gpus, c.workload.mode,
               c.workload.isl, c.workload.osl, c.workload.dtype)
        if key in seen or r.evaluation is None:
            continue
        seen.add(key)
        wl = replace(c.workload, concurrency=None,
                     ttft_ms=c.measured.get("ttft_ms"), tpot_ms=c.measured.get("tpot_ms"))
        start = time.perf_counter()
        result = search_serving(c.model, c.cluster, wl, c.runtime)
        out.append((f"{c.model.name} / {c.cluster.num_gpus} x {c.cluster.gpu.name} / "
                    f"{c.workload.mode} {c.workload.isl}/{c.workload.osl} {c.workload.dtype}",
                    time.perf_counter() - start, _best_label(result)))
    for label, model, cluster, nodes, wl in (
            ("Llama-3.1-70B, 8 x H100, TTFT <= 500 ms, TPOT <= 30 ms (target <= 5 s)",
             "llama-3.1-70b", "dgx-h100", 1,
             ServingWorkload(isl=1024, osl=1024, ttft_ms=500, tpot_ms=30, dtype="fp8",
                             kv_dtype="fp8")),
            ("DeepSeek-V3 disaggregated, 96 x H100 (target <= 60 s)", "deepseek-v3",
             "dgx-h100", 12,
             ServingWorkload(isl=1024, osl=1024, ttft_ms=1000, tpot_ms=50,
                             mode="disaggregated", dtype="fp8", kv_dtype="fp8"))):
        m, cl = load_model(model), load_cluster(cluster, nodes=nodes)
        start = time.perf_counter()
        result = search_serving(m, cl, wl, "trtllm" if "DeepSeek" in label else "vllm")
        out.append((label, time.perf_counter() - start, _best_label(result)))
    return out


def _best_label(result) -> str:
    best = result.best
    if best is None:
        return "no deployment meets the targets"
    from cli.serve_commands import _label
    d = best.config.as_dict()
    return (f"{_label(d)}, batch {best.pools[-1].batch}: "
            f"{best.output_tokens_per_s_per_gpu:.0f} tok/s/GPU, TTFT {best.ttft_s * 1e3:.0f} ms, "
            f"TPOT {best.tpot_s * 1e3:.1f} ms ({result.evaluated} evaluations)")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def _num(x) -> str:
    if x is None:
        return "-"
    return f"{x:,.1f}" if x < 1000 else f"{x:,.0f}"


def entries_table(rows: list[Row]) -> str:
    lines = ["| entry | regime | deployment | tok/s/GPU pred / meas | err | TTFT ms pred / meas "
             "| err | TPOT ms pred / meas | err |", "|" + "---|" * 10]
    from cli.serve_commands import _label
    for r in rows:
        c = r.case
        d = _label(c.config.as_dict())
        if r.evaluation is None or not r.evaluation.fits:
            lines.append(f"| {c.id} | {c.regime} | {d} | not evaluated: {r.skipped} |||||||")
            continue
        meas_thr = c.measured["output_tokens_per_s_per_gpu"]
        thr = (f"{_num(r.predicted('output_tokens_per_s_per_gpu'))} / "
               f"{_num(meas_thr) if meas_thr else '(est. ' + _num(c.derived_tokens_per_s_per_gpu) + ')'}")
        cells = [thr, _pct(r.error("output_tokens_per_s_per_gpu"))]
        for metric in ("ttft_ms", "tpot_ms"):
            meas = c.measured.get(metric)
            mark = ""
            if metric == "tpot_ms" and r.below_floor():
                mark += " (below floor)"
            if metric == "tpot_ms" and r.one_draft is not None and r.one_draft.fits:
                mark += f" (MTP not stated; one draft: {_num(r.one_draft.tpot_s * 1e3)})"
            cells += [f"{_num(r.predicted(metric))} / {_num(meas)}{mark}" if meas else "-",
                      _pct(r.error(metric))]
        lines.append(f"| {c.id} | {c.regime} | {d} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary_table(s: dict) -> str:
    names = {"output_tokens_per_s_per_gpu": "output tokens/s per GPU", "ttft_ms": "TTFT",
             "tpot_ms": "TPOT"}
    lines = ["| metric | entries | median abs error | max abs error | target | met | signed "
             "bias (median) per regime |", "|---|---|---|---|---|---|---|"]
    for metric in METRICS:
        m = s[metric]
        met = m["median_abs"] is not None and m["median_abs"] <= TARGETS[metric]
        bias = ", ".join(f"{k} {_pct(v)}" for k, v in m["bias"].items())
        lines.append(f"| {names[metric]} | {m['n']} of {m['measured']} measured | "
                     f"{_pct(m['median_abs'])[1:]} | {_pct(m['max_abs'])[1:]} | "
                     f"<= {100 * TARGETS[metric]:.0f}% | {'yes' if met else 'no'} | {bias} |")
    m = s[ABOVE_FLOOR]
    met = m["median_abs"] is not None and m["median_abs"] <= TARGETS["tpot_ms"]
    lines.append(f"| TPOT without the {m['below']} rows measured below the physical decode floor "
                 f"| {m['n']} | {_pct(m['median_abs'])[1:]} | {_pct(m['max_abs'])[1:]} | "
                 f"<= {100 * TARGETS['tpot_ms']:.0f}% | {'yes' if met else 'no'} | |")
    for metric in ("ttft_ms", "tpot_ms"):
        m = s[KNOWN][metric]
        met = m["median_abs"] is not None and m["median_abs"] <= TARGETS[metric]
        lines.append(f"| {names[metric]} of the rows whose decoding is known (the model has no "
                     f"MTP module or the entry states its speculation) | {m['n']} | "
                     f"{_pct(m['median_abs'])[1:]} | {_pct(m['max_abs'])[1:]} | "
                     f"<= {100 * TARGETS[metric]:.0f}% | {'yes' if met else 'no'} | "
                     f"{_pct(m['bias'])} |")
    m = s[UNKNOWN]
    lines.append(f"| TPOT of the rows of an MTP-capable model that do not state their "
                 f"speculation: read as no drafting / one MTP draft (0.85) | {m['n']} / "
                 f"{m['draft_n']} | {_pct(m['median_abs'])[1:]} / "
                 f"{_pct(m['draft_median_abs'])[1:]} | | | | {_pct(m['bias'])} / "
                 f"{_pct(m['draft_bias'])} |")
    rank = s["rank"]
    frac = rank["fraction"]
    lines.append(f"| best configuration = measured best | {rank['groups']} groups | "
                 f"{rank['agree']} agree ({_pct(frac)[1:] if frac is not None else '-'}) | | "
                 f">= {100 * RANK_TARGET:.0f}% | "
                 f"{'yes' if frac is not None and frac >= RANK_TARGET else 'no'} | |")
    return "\n".join(lines)


def rank_table(s: dict) -> str:
    lines = ["| group (model, GPU, framework, version, dtype, isl, osl) | configs | measured "
             "best | predicted best | agree |", "|---|---|---|---|---|"]
    for key, n, measured, predicted, ok in s["rank"]["details"]:
        verdict = "-" if ok is None else ("yes" if ok else "no")
        lines.append(f"| {', '.join(map(str, key))} | {n} | {measured} | {predicted} | "
                     f"{verdict} |")
    return "\n".join(lines)


def times_table(times) -> str:
    lines = ["| instance | search time (s) | best deployment |", "|---|---|---|"]
    for label, seconds, best in times:
        lines.append(f"| {label} | {seconds:.2f} | {best} |")
    return "\n".join(lines)


def write_section(text: str, name: str, body: str) -> str:
    begin, end = BEGIN.format(name), END.format(name)
    block = f"{begin}\n{body}\n{end}"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        return head + block + rest.split(end, 1)[1]
    return text.rstrip("\n") + "\n\n" + block + "\n"


def targets_met(s: dict) -> bool:
    ok = all(s[m]["median_abs"] is not None and s[m]["median_abs"] <= TARGETS[m]
             for m in METRICS)
    return ok and s["rank"]["fraction"] is not None and s["rank"]["fraction"] >= RANK_TARGET


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--no-search", action="store_true", help="skip the search timings")
    args = parser.parse_args(argv)
    rows = evaluate_all(readings=True)
    s = summary(rows)
    text = DOC.read_text() if DOC.exists() else "# Inference planning\n"
    text = write_section(text, "summary", summary_table(s))
    text = write_section(text, "entries", entries_table(rows))
    text = write_section(text, "residuals", residual_table(rows))
    text = write_section(text, "ranking", rank_table(s))
    if not args.no_search:
        text = write_section(text, "search", times_table(search_times(rows)))
    DOC.write_text(text)
    print(summary_table(s))
    if args.check and not targets_met(s):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
