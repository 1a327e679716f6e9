"""Cost-model accuracy on measured training runs, judged per regime (where the search lands).

Re-evaluates every usable entry of the calibration files in ``bench/data/``
(``published_runs.yaml``: 2022 Megatron-DeepSpeed on A100; ``modern_runs.yaml``: FSDP / FSDP2,
Megatron-Core and NeMo on H100 and A100; ``newer_gpu_runs.yaml``: NeMo / Megatron-Bridge on H100,
B200, GB200) with the library's shipped constants (``planner/calibration/defaults.yaml``) and
writes ``docs/accuracy.md``: per regime (runtime, GPU generation, parallelism regime) the median
and max |error|, the median **signed** error (bias: negative = the model is optimistic, i.e.
predicts a faster step than measured), the coverage of the 80 % error bands, fit verdicts, and
for every source that measured several configurations of one model on one GPU type, the share
of pairs the model orders as measured. How entries become inputs: planner/calibration/runs.py.

    python bench/accuracy.py              # writes docs/accuracy.md, prints the summary
    python bench/accuracy.py --baseline   # the library's raw preset values, no calibration
    python bench/accuracy.py --check      # exit 1 when a target is missed
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.calibration.regimes import REGIME_TITLES  # noqa: E402
from planner.calibration.store import shipped  # noqa: E402
from bench import landing, out_of_file, out_of_file_dense, unknown_fields  # noqa: E402
from bench.accuracy_notes import (CAUSES, HISTORY, HISTORY_COMMITS,  # noqa: E402
                                  MISSES)
from bench.accuracy_runs import (  # noqa: E402,F401  (also re-exported: tests, holdout, calibrate)
    BIAS_TARGET, DATA, DOC, FILES, MEMORY_MEDIAN_TARGET, RANK_TARGET, RANK_TIE, TIME_MEDIAN_TARGET,
    Row, _check_verdict_line, _cov, _pct, _throughput, by_label, check_verdicts, evaluate_rows,
    labels_of, load_all, misordered_by_cause, misordered_by_run, rank_agreement, ranked_pairs,
    read_entries, run, source_noise, stats, targets_missed, zero_rows)
from bench.accuracy_holdout import (_holdout_now, held_out_rows,  # noqa: E402,F401
                                    held_out_targets_missed, holdout_section)


def _not_judged(row: Row) -> str:
    if row.pred.fit_judged:
        return ""
    return " (host offload: not judged)" if row.run.offloaded_layers else \
        " (recompute inferred)"


def _agree(group: dict[str, Any] | None) -> str:
    return f"{group['agree']}/{group['pairs']}" if group else "0/0"


def _table(title: str, groups: dict[str, dict[str, Any]], names: dict[str, str] | None = None,
           pairs: dict[str, tuple[int, int]] | None = None):
    lines = [f"### {title}", "",
             "| regime | runs | time: median abs | max abs | median signed | band cover "
             "| memory: median abs | median signed | fit verdicts | pairs ordered |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for label, s in groups.items():
        name = (names or {}).get(label, label)
        fits = f"{s['fit_ok']}/{s['fit_n']}" if s["fit_n"] else ""
        agree, n = (pairs or {}).get(label, (0, 0))
        lines.append(f"| {name} | {s['time_n']} | {_pct(s['time_median'])} "
                     f"| {_pct(s['time_max'])} | {_pct(s['time_bias'], True)} "
                     f"| {_cov(s['time_coverage'], s['time_coverage_n'])} "
                     f"| {_pct(s['memory_median'])} | {_pct(s['memory_bias'], True)} | {fits} "
                     f"| {f'{agree}/{n}' if n else ''} |")
    return lines + [""]


def _regime_keys() -> dict[str, Callable[[Row], str]]:
    return {"parallelism": lambda r: r.run.regime.parallelism,
            "runtime": lambda r: r.run.regime.runtime,
            "generation": lambda r: r.run.regime.generation, "file": lambda r: r.file,
            "regime": lambda r: r.run.regime.key}


def landing_section(rows: list[Row], landed: list[dict[str, Any]]) -> list[str]:
    """docs/accuracy.md's "Where the search lands" (bench/landing.py) from today's rows."""
    keys, pairs = _regime_keys(), ranked_pairs(rows)
    return landing.section(landed, by_label(rows, keys["regime"]),
                           landing.pairs_by_label(pairs, keys["regime"]),
                           by_label(rows, keys["parallelism"]),
                           landing.pairs_by_label(pairs, keys["parallelism"]))


def _per_regime(rows: list[Row]) -> list[str]:
    """The "Per regime" section: accuracy and signed bias by parallelism regime, runtime, GPU
    generation and calibration file."""
    lines = ["", "## Per regime", "",
             "Pairs ordered: the ranked pairs (\"Rank agreement per source\") with a member in "
             "the regime, ordered as measured (a pair across two regimes counts in both).", ""]
    keys, pairs = _regime_keys(), ranked_pairs(rows)
    for title, key, names in (("By parallelism regime", "parallelism", REGIME_TITLES),
                              ("By runtime", "runtime", None),
                              ("By GPU generation", "generation", None),
                              ("By calibration file", "file", None)):
        lines += _table(title, by_label(rows, keys[key]), names,
                        landing.pairs_by_label(pairs, keys[key]))
    return lines


def render(rows: list[Row], skipped, zero, baseline_rows: list[Row] | None = None,
           micro_batch_bands: list[dict[str, Any]] | None = None,
           landed: list[dict[str, Any]] | None = None) -> str:
    s = stats(rows)
    lines = [
        "# Cost-model accuracy where the planner searches",
        "",
        "Generated by `python bench/accuracy.py` from the three calibration files in "
        "`bench/data/`",
        "with the library's shipped constants (`planner/calibration/defaults.yaml`, fitted by",
        "`bench/calibrate_defaults.py` over all runs together; no entry is special-cased). "
        "Error =",
        "predicted / measured - 1: a **negative** step-time error means the model is "
        "**optimistic**",
        "(predicts a faster step than was measured) - the error a search exploits. Memory in "
        "GiB,",
        "in the reading of the source (nvidia-smi, or the allocator's max reserved for "
        "torchtitan).",
        "Bands: 80 % nominal intervals from the fit residuals of the run's regime, for step "
        "time combined with the spread between sources of the held-out estimate "
        "(planner/calibration/bands.py, bench/calibrate_defaults.py).",
        "",
        "## Summary",
        "",
        f"- step time: median |error| **{_pct(s['time_median'])}**, max {_pct(s['time_max'])}, "
        f"median signed {_pct(s['time_bias'], True)} over {s['time_n']} runs "
        f"(target: median <= {TIME_MEDIAN_TARGET:.0%}, every regime's bias within "
        f"+-{BIAS_TARGET:.0%})",
        f"- memory: median |error| **{_pct(s['memory_median'])}**, max "
        f"{_pct(s['memory_max'])} over {s['memory_n']} runs (target <= "
        f"{MEMORY_MEDIAN_TARGET:.0%})",
        f"- fit verdicts: {s['fit_ok']}/{s['fit_n']} right (runs whose recomputation is not "
        f"published are not judged: it is inferred from fitting)",
        _check_verdict_line(rows),
        f"- band coverage (80 % nominal): step time {_cov(s['time_coverage'], s['time_coverage_n'])}"
        f", memory {_cov(s['memory_coverage'], s['memory_coverage_n'])} (target 70-90 %)",
    ]
    ranks = rank_agreement(rows)
    pairs = sum(g["pairs"] for g in ranks)
    agree = sum(g["agree"] for g in ranks)
    noisy = rank_agreement(rows, above_noise=True)
    npairs = sum(g["pairs"] for g in noisy)
    nagree = sum(g["agree"] for g in noisy)
    if pairs:
        lines.append(f"- rank agreement: **{agree}/{pairs} pairs ({agree / pairs:.0%})** of "
                     f"configurations measured by one source on one GPU type ordered as measured "
                     f"(target >= {RANK_TARGET:.0%}; pairs closer than {RANK_TIE:.0%} are ties)")
    if npairs:
        lines.append(f"- of which the pairs whose measured gap exceeds the source's own "
                     f"run-to-run noise (the largest gap between two of its runs of one "
                     f"configuration): {nagree}/{npairs} ({nagree / npairs:.0%})")
    if landed:
        lines.append(f"- where the search lands (not a target; \"Where the search lands\"): "
                     f"the planner's search on {len(landed)} calibration runs' hardware picks "
                     f"plans in the regimes " + ", ".join(sorted({x['regime'].key for x in landed}))
                     + "; " + str(sum(not x["same_recompute"] for x in landed))
                     + " of them with a recomputation no calibration run of its regime used")
    held_out_results = out_of_file.run_all()
    lines.append(out_of_file.summary_line(held_out_results))
    dense_results = out_of_file_dense.run_all()
    lines.append(out_of_file_dense.summary_line(dense_results))
    missed = targets_missed(rows)
    held = held_out_targets_missed(rows, micro_batch_bands)
    unfit = [f"{x.row.name} ({label})" for label, results in held_out_results.items()
             for x in results if not x.ev.fits] + out_of_file_dense.ran_not_fitting(dense_results)
    if unfit:  # the out-of-file target: no run that ran predicted not to fit
        held.append("out of file: runs that ran predicted not to fit: " + "; ".join(unfit))
    lines += ["", "Targets missed:" if missed or held else "All targets met.", ""]
    lines += [f"- {m}" for m in missed + held]
    history = ["", "## History", "",
              "The same script on earlier commits (how each number moved since: `git log`, "
              "the commit messages).", "",
              f"| measure | {HISTORY_COMMITS[0]} (before issue 10) | {HISTORY_COMMITS[1]} "
              "| now |", "|---|---:|---:|---:|"]
    bias = {k: st["time_bias"] for k, st in by_label(rows, lambda r: r.run.regime.runtime).items()}
    tp = by_label(rows, lambda r: r.run.regime.parallelism).get("tp", {}).get("time_bias")
    now = {"time median": _pct(s["time_median"]), "time max": _pct(s["time_max"]),
           "time bias": _pct(s["time_bias"], True),
           "torchtitan bias": _pct(bias.get("torchtitan"), True),
           "TP-heavy bias": _pct(tp, True), "memory median": _pct(s["memory_median"]),
           "fit verdicts": f"{s['fit_ok']}/{s['fit_n']}",
           "coverage time / memory": f"{s['time_coverage']:.0%} / {s['memory_coverage']:.0%}",
           "rank agreement": f"{agree}/{pairs} ({agree / pairs:.0%})" if pairs else ""}
    now.update(_holdout_now())
    history += [f"| {k} | {a} | {b} | {now.get(k, '')} |" for k, (a, b) in HISTORY.items()]
    rests_on = ["", "## What the calibration rests on", "", CAUSES]
    # The order a reader needs: the summary, each regime's accuracy, why the misses, the
    # estimates on runs the fit never saw; then the evidence, the history and every run.
    regimes = _per_regime(rows)
    lines += regimes  # ends with a blank line
    if missed:
        lines += ["## Why the misses", "", MISSES]
    lines += holdout_section(rows, micro_batch_bands)
    lines += unknown_fields.section(micro_batch_bands or [], unknown_fields.assumption_counts(rows))
    lines += out_of_file.section(held_out_results)  # published runs in no calibration file
    lines += out_of_file_dense.section(dense_results)  # Llama 3 405B, MT-NLG 530B
    if landed:
        lines += landing_section(rows, landed)
    if baseline_rows is not None:
        b = stats(baseline_rows)
        bl_ranks = rank_agreement(baseline_rows)
        bp = sum(g["pairs"] for g in bl_ranks)
        ba = sum(g["agree"] for g in bl_ranks)
        lines += ["", "## Without calibration (today's model, preset constants: `--baseline`)", "",
                  f"- step time: median |error| {_pct(b['time_median'])}, max "
                  f"{_pct(b['time_max'])}, median signed {_pct(b['time_bias'], True)}; memory "
                  f"median {_pct(b['memory_median'])}; fit verdicts {b['fit_ok']}/{b['fit_n']}; "
                  f"rank agreement {ba}/{bp}", ""]
        lines += _table("Before: by parallelism regime",
                        by_label(baseline_rows, lambda r: r.run.regime.parallelism), REGIME_TITLES)
    above = {(g["source"], g["gpu"], g["dtype"], g["model"]): g for g in noisy}
    lines += ["## Rank agreement per source", "",
              "Noise: the source's largest throughput gap between two runs of one "
              "configuration (repeats or other software versions), at least "
              f"{RANK_TIE:.0%}.", "",
              "| source | GPU | dtype | model | runs | pairs | ordered as measured "
              "| noise | above noise |",
              "|---|---|---|---|---:|---:|---:|---:|---:|"]
    for g in ranks:
        a = above.get((g["source"], g["gpu"], g["dtype"], g["model"]))
        noise = max((x["noise"] for x in noisy if x["source"] == g["source"]),
                    default=RANK_TIE)
        lines.append(f"| {g['source'][:70]} | {g['gpu']} | {g['dtype']} | {g['model']} "
                     f"| {g['runs']} | {g['pairs']} | {g['agree']}/{g['pairs']} "
                     f"| {noise:.1%} | {_agree(a)} |")
    lines += ["", "### Misordered pairs by what the two configurations differ in", "",
              "(`python bench/accuracy.py --pairs` lists every misordered pair.)", "",
              "| source | differs in | misordered | pairs |", "|---|---|---:|---:|"]
    lines += [f"| {src[:60]} | {d} | {bad} | {n} |" for src, d, bad, n in
              misordered_by_cause(rows)]
    worst = misordered_by_run(rows)
    lines += ["", "Runs in the most misordered pairs: " + ", ".join(
        f"{name} ({bad} of {n})" for name, bad, n in worst[:3]) + "."]
    lines += rests_on + history
    lines += ["", "## Runs", "",
              "| entry | regime | config | time measured s | predicted s | error | band | "
              "memory measured GiB | predicted | error | measured | predicted |",
              "|---|---|---|---:|---:|---:|---|---:|---:|---:|---|---|"]
    for r in rows:
        c = r.run.config
        cfg = (f"tp{c.tp} pp{c.pp} dp{c.dp} cp{c.cp} mbs{c.micro_batch} v{c.virtual_stages} "
               f"z{c.zero_stage} {r.pred.recompute} {c.dtype}")
        m = r.run.measured
        tb = (f"{r.time_band.low:.3g}-{r.time_band.high:.3g}" if r.time_band and
              r.time_error is not None else "")
        lines.append(
            f"| {r.id} | {r.run.regime.key} | {cfg} | {'' if m.step_time_s is None or m.oom else f'{m.step_time_s:.3g}'} "
            f"| {'' if m.oom else f'{r.pred.step_time_s:.3g}'} | {_pct(r.time_error, True)} | {tb} "
            f"| {'' if m.memory_gib is None else f'{m.memory_gib:.1f}'} "
            f"| {r.pred.memory_gib:.1f} | {_pct(r.memory_error, True)} "
            f"| {'OOM' if m.oom else 'ran'} | {'fits' if r.pred.fits else 'OOM'}"
            f"{_not_judged(r)} |")
    lines += ["", "## Model-state memory (ZeRO worked example)", "",
              "| case | published GB | predicted GB |", "|---|---:|---:|"]
    lines += [f"| {name} | {pub:g} | {got:.3f} |" for name, pub, got in zero]
    lines += ["", "## Entries not evaluated", ""]
    lines += [f"- {f}: {i}: {why}" for f, i, why in skipped]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--no-write", action="store_true", help="do not write docs/accuracy.md")
    parser.add_argument("--baseline", action="store_true",
                        help="the raw preset values (no calibration profile)")
    parser.add_argument("--pairs", action="store_true",
                        help="list every misordered pair (measured and predicted tokens/s/GPU)")
    args = parser.parse_args()
    loaded = load_all()
    rows, skipped = run(baseline=args.baseline, loaded=loaded)
    if args.pairs:
        for p in ranked_pairs(rows):
            if not p["agree"]:
                a, b = p["a"], p["b"]
                print(f"{a.run.source[:40]} | {p['differs']} | {a.id} vs {b.id}: measured "
                      f"{_throughput(a, False):.0f} vs {_throughput(b, False):.0f}, predicted "
                      f"{_throughput(a, True):.0f} vs {_throughput(b, True):.0f}")
    baseline_rows = None if args.baseline else run(baseline=True, loaded=loaded)[0]
    published = read_entries(FILES[0])
    if not args.no_write and not args.baseline:
        bands = unknown_fields.micro_batch_bands(rows, shipped().constants)
        landed = landing.land(rows, shipped())
        DOC.write_text(render(rows, skipped, zero_rows(published), baseline_rows, bands, landed))
    for title, key in (("parallelism", lambda r: r.run.regime.parallelism),
                       ("runtime", lambda r: r.run.regime.runtime),
                       ("generation", lambda r: r.run.regime.generation)):
        for label, st in by_label(rows, key).items():
            print(f"{title:11} {label:12} n={st['time_n']:3} median {_pct(st['time_median']):>6} "
                  f"max {_pct(st['time_max']):>6} bias {_pct(st['time_bias'], True):>7} "
                  f"mem {_pct(st['memory_median']):>6} (n={st['memory_n']}) "
                  f"cover {_cov(st['time_coverage'], st['time_coverage_n'])}")
    s = stats(rows)
    ranks = rank_agreement(rows)
    print(f"ALL: time median {_pct(s['time_median'])} max {_pct(s['time_max'])} bias "
          f"{_pct(s['time_bias'], True)} (n={s['time_n']}); memory median "
          f"{_pct(s['memory_median'])} (n={s['memory_n']}); fits {s['fit_ok']}/{s['fit_n']}; "
          f"rank {sum(g['agree'] for g in ranks)}/{sum(g['pairs'] for g in ranks)}; coverage "
          f"time {_cov(s['time_coverage'], s['time_coverage_n'])} memory "
          f"{_cov(s['memory_coverage'], s['memory_coverage_n'])}")
    missed = targets_missed(rows)
    for line in missed:
        print("MISSED:", line)
    return 1 if (args.check and missed) else 0


if __name__ == "__main__":
    sys.exit(main())
