"""Held-out accuracy: leave-one-source-out cross-validation of the shipped calibration.

The targets of issue 10 are judged on published runs that are not in the calibration files;
this estimates them from the files themselves. For every source S (a publication: the BLOOM
chronicles, the Megatron-Bridge tables, llm-foundry's MPT table, ...) the constants are fitted
on every run of the other sources, with the same model, bounds, loss and weights as
``bench/calibrate_defaults.py`` (planner/calibration/fit.py) from the same start (the
constants' preset values: nothing of S leaks in through the shipped fit), then S's runs are
predicted. Faster than the shipped fit only in its evaluation budget (``--max-evaluations``,
default 120 against 300). Reported: median / max |step-time error| and median signed error on
the held-out runs, per held-out source and pooled; fit verdicts; rank agreement inside each
held-out source; band coverage (the bands of the fold's own fit).

    python bench/holdout.py              # all folds (about 2-4 min each), writes bench/data/holdout.json
    python bench/holdout.py --jobs 2     # two folds at a time

``python bench/accuracy.py`` renders bench/data/holdout.json into docs/accuracy.md.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from multiprocessing import Pool
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.accuracy import (Row, evaluate_rows, load_all, rank_agreement,  # noqa: E402
                            stats)
from planner.calibration.constants import PARAMS, Constants  # noqa: E402
from planner.calibration.fit import fit  # noqa: E402

OUT = ROOT / "bench" / "data" / "holdout.json"


def family(source: str) -> str:
    """The publication a run comes from: the source title up to its parenthesis (the BLOOM
    main run and its prequel benchmarks are one publication, the BigScience chronicles)."""
    head = source.split("(")[0].strip()
    return "BigScience BLOOM chronicles" if head.startswith("BigScience") else head


def _fold(args: tuple[str, int]) -> dict:
    held, budget = args
    runs = load_all()[0]
    train = [r for _, r in runs if family(r.source) != held]
    test = [(f, r) for f, r in runs if family(r.source) == held]
    result = fit(train, Constants(), max_evaluations=budget)
    rows = evaluate_rows(test, result.constants, result.bands)
    return {"source": held, "runs": len(test), "rows": _row_data(rows),
            "constants": {p.name: round(result.constants.get(p.name), 4) for p in PARAMS},
            "ranks": [{k: g[k] for k in ("pairs", "agree")} for g in rank_agreement(rows)],
            "stats": {k: v for k, v in stats(rows).items()}}


def _row_data(rows: list[Row]) -> list[dict]:
    return [{"id": r.id, "time_error": r.time_error, "memory_error": r.memory_error,
             "fit_ok": r.fit_ok, "time_covered": r.time_covered} for r in rows]


def summarize(folds: list[dict]) -> dict:
    rows = [r for f in folds for r in f["rows"]]
    t = [r["time_error"] for r in rows if r["time_error"] is not None]
    m = [r["memory_error"] for r in rows if r["memory_error"] is not None]
    cover = [r["time_covered"] for r in rows if r["time_covered"] is not None]
    pairs = sum(g["pairs"] for f in folds for g in f["ranks"])
    agree = sum(g["agree"] for f in folds for g in f["ranks"])
    wrong = [r["id"] for r in rows if r["fit_ok"] is False]
    return {"time_n": len(t), "time_median": statistics.median(map(abs, t)),
            "time_max": max(map(abs, t)), "time_bias": statistics.median(t),
            "memory_n": len(m), "memory_median": statistics.median(map(abs, m)) if m else None,
            "pairs": pairs, "agree": agree, "wrong_verdicts": wrong,
            "verdicts": sum(r["fit_ok"] is not None for r in rows),
            "time_coverage": sum(cover) / len(cover) if cover else None,
            "sources_median": statistics.median(
                f["stats"]["time_median"] for f in folds if f["stats"]["time_median"] is not None)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-evaluations", type=int, default=120)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--only", help="one held-out source (its family name), for a quick look")
    args = parser.parse_args()
    sources = sorted({family(r.source) for _, r in load_all()[0]})
    if args.only:
        sources = [s for s in sources if args.only.lower() in s.lower()]
    work = [(s, args.max_evaluations) for s in sources]
    if args.jobs > 1:
        with Pool(args.jobs) as pool:
            folds = pool.map(_fold, work)
    else:
        folds = [_fold(w) for w in work]
    for f in folds:
        s = f["stats"]
        print(f"{f['source'][:60]:60} n={s['time_n']:3} median {s['time_median'] or 0:.1%} "
              f"max {s['time_max'] or 0:.1%} bias {s['time_bias'] or 0:+.1%}")
    summary = summarize(folds)
    print(json.dumps(summary, indent=1))
    if not args.only:
        OUT.write_text(json.dumps({"generated_by": "bench/holdout.py",
                                   "max_evaluations": args.max_evaluations,
                                   "summary": summary,
                                   "folds": [{k: f[k] for k in ("source", "runs", "stats",
                                                                "ranks", "constants")}
                                             for f in folds]},
                                  indent=1, sort_keys=True) + "\n")
        print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
