"""Where the search lands: the planner's own picks placed in the calibration data.

A cost model is judged on the configurations the search picks (it exploits every optimistic
error), not only on the ones it was calibrated on. For a few calibration runs (one per source,
runtime and GPU generation) the planner's search runs on that run's cluster, model, global
batch, sequence length, precision and runtime options, with the shipped constants (what
``shardplan plan --runtime R`` does on that hardware), and the plan it picks is placed in the
calibration data: its regime (runtime / GPU generation / parallelism), the calibration runs of
that regime (and those that used each of its blocks' recomputation policies on some block) with
their median |error|, signed bias and rank agreement, the plan's 80 % band with
its extrapolation notes, and the error of every calibration run of the same runtime on the same
GPU type at the searched degrees (any model: the searched plan itself was measured only where
the search picks the published configuration).

``python bench/accuracy.py`` writes this section into docs/accuracy.md.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from planner.calibration.apply import calibrate
from planner.calibration.bands import MIN_RUNS
from planner.calibration.regimes import recompute_kinds, regime_of
from planner.calibration.session import prediction_intervals
from planner.calibration.store import CalibrationProfile
from planner.cost.model import Evaluation
from planner.ir import LayerKind
from planner.solve.search import SearchOptions, search

# one run per source / runtime / GPU generation; each search takes about a CPU second
CASES = (
    "bloom176B-main-run",  # Megatron-DeepSpeed, 384 A100-80GB
    "nemo2407-GPT3-175B-512gpu",  # NeMo 24.07, 512 H100, fp8
    "mbridge-25.11-Llama3-70B-H100-64gpu-fp8-cs",  # Megatron-Bridge, 64 H100, fp8
    "mbridge-25.11-Llama3-8B-B200-8gpu-fp8-cs",  # Megatron-Bridge, 8 B200, fp8
    "torchtitan-h100-t3-8B-128gpu-FSDP-torchcompile",  # torchtitan, 128 H100
    "mpt-70b-seq2048-64xh100",  # llm-foundry FSDP1, 64 H100
)
TIME_LIMIT_S = 60.0


def degrees(c) -> str:
    return (f"tp{c.tp} pp{c.pp} dp{c.dp} cp{c.cp} mbs{c.micro_batch} v{c.virtual_stages} "
            f"z{c.zero_stage}")


def recompute_mix(ev: Evaluation) -> str:
    """The blocks' recomputation policies of a plan: ``full``, ``none``, ``selective``, or
    a mix (``full 36/80 + none``)."""
    blocks = [r for r, layer in zip(ev.placement.recompute, ev.model.layers)
              if layer.kind is LayerKind.BLOCK]
    kinds = sorted({r.value for r in blocks})
    if len(kinds) == 1:
        return kinds[0]
    counts = {k: sum(r.value == k for r in blocks) for k in kinds}
    return " + ".join(f"{k} {counts[k]}/{len(blocks)}" for k in kinds)


def _degree_key(c) -> tuple:
    return (c.tp, c.pp, c.dp, c.cp, c.micro_batch, c.virtual_stages, c.zero_stage)


def searched(row, calibration: CalibrationProfile | None) -> Evaluation:
    """The plan the search picks on ``row``'s hardware, model, batch and runtime options."""
    run = row.run
    constants = calibration.constants if calibration else None
    cluster, options = calibrate(run.cluster, run.options, constants, run.compiled)
    result = search(run.model, cluster, run.config.global_batch, run.config.seq_len,
                    run.config.dtype, options=SearchOptions(runtime=options,
                                                            time_limit_s=TIME_LIMIT_S))
    return result.best


def land(rows: Sequence, calibration: CalibrationProfile | None,
         cases: Sequence[str] = CASES) -> list[dict[str, Any]]:
    """One record per case: the published and the searched configuration, the searched
    plan's regime and band, and the source's measurement at the searched degrees if any."""
    by_id = {r.id: r for r in rows}
    out = []
    for case in cases:
        row = by_id[case]
        ev = searched(row, calibration)
        c = ev.config
        regime = regime_of(ev.options.profile, ev.cluster.gpu.name, c.tp, c.pp, c.cp,
                           c.zero_stage)
        same = [r for r in rows if r.run.profile.name == row.run.profile.name
                and r.run.cluster.gpu.name == row.run.cluster.gpu.name
                and _degree_key(r.run.config) == _degree_key(c) and r.time_error is not None]
        mix = recompute_mix(ev)
        kinds = set(recompute_kinds(ev.model, ev.placement))
        alike = [r for r in rows if r.run.regime.key == regime.key and r.time_error is not None
                 and kinds <= set(recompute_kinds(r.run.model, r.pred.evaluation.placement))]
        out.append({"case": case, "row": row, "plan": ev, "regime": regime,
                    "recompute": mix, "recompute_published": recompute_mix(row.pred.evaluation),
                    "same_recompute": len(alike),
                    "interval": prediction_intervals(ev, calibration),
                    "same_degrees": same})
    return out


def pairs_by_label(pairs: Sequence[dict], key: Callable) -> dict[str, tuple[int, int]]:
    """(ordered as measured, pairs) per label, counting the pairs with a member of that label
    (a pair across two labels counts for both)."""
    out: dict[str, list[int]] = {}
    for p in pairs:
        for label in {key(p["a"]), key(p["b"])}:
            c = out.setdefault(label, [0, 0])
            c[0] += p["agree"]
            c[1] += 1
    return {k: (a, n) for k, (a, n) in out.items()}


def _pct(v: float | None, signed: bool = False) -> str:
    if v is None:
        return ""
    return f"{v:+.1%}" if signed else f"{v:.1%}"


def section(landed: Sequence[dict], regime_stats: dict[str, dict], regime_pairs: dict,
            parallelism_stats: dict[str, dict], parallelism_pairs: dict) -> list[str]:
    lines = ["", "## Where the search lands", "",
             "`bench/landing.py`: the planner's search on the hardware, model, global batch and "
             "runtime options of one calibration run per source (shipped constants, "
             "`shardplan plan --runtime R`), and where its plan sits in the calibration data. "
             "Gain: the published configuration's predicted step time over the searched "
             "plan's, minus 1 (what the planner claims against the expert's choice). Regime "
             "statistics: the calibration runs of the searched plan's regime "
             "(runtime/generation/parallelism, then the parallelism regime alone); pairs: "
             "the ranked pairs with a member in that regime.", "",
             "| case | GPUs | published | measured s | predicted s | searched | predicted s "
             "| gain | 80 % band s |",
             "|---|---:|---|---:|---:|---|---:|---:|---|"]
    for x in landed:
        row, ev = x["row"], x["plan"]
        band = x["interval"].get("step_time_s_interval")
        lines.append(
            f"| {x['case']} | {row.run.cluster.num_gpus} | {degrees(row.run.config)}, "
            f"recompute {x['recompute_published']} "
            f"| {row.run.measured.step_time_s:.3g} | {row.pred.step_time_s:.3g} "
            f"| {degrees(ev.config)}, recompute {x['recompute']} | {ev.step_time_s:.3g} "
            f"| {_pct(row.pred.step_time_s / ev.step_time_s - 1, True)} "
            f"| {'' if not band else f'{band[0]:.3g}-{band[1]:.3g}'} |")
    lines += ["", "| case | searched regime | runs | using each of its recompute policies "
                  "| median abs "
                  "| signed bias | pairs ordered | parallelism regime: runs, bias, pairs "
                  "| measured at these degrees | extrapolating |",
              "|---|---|---:|---:|---:|---:|---:|---|---|---|"]
    for x in landed:
        key, par = x["regime"].key, x["regime"].parallelism
        s = regime_stats.get(key)
        ps = parallelism_stats.get(par)
        agree, n = regime_pairs.get(key, (0, 0))
        pa, pn = parallelism_pairs.get(par, (0, 0))
        same = "; ".join(f"{r.id} ({r.run.model.params / 1e9:.0f}B): {_pct(r.time_error, True)}"
                         for r in x["same_degrees"])
        notes = "; ".join(n.removeprefix("extrapolating: ")
                          for n in x["interval"].get("extrapolating", []))
        lines.append(
            f"| {x['case']} | {key} | {s['time_n'] if s else 0} | {x['same_recompute']} "
            f"| {_pct(s['time_median']) if s else ''} "
            f"| {_pct(s['time_bias'], True) if s else ''} | {agree}/{n} "
            f"| {ps['time_n'] if ps else 0}, {_pct(ps['time_bias'], True) if ps else ''}, "
            f"{pa}/{pn} | {same or 'not measured'} | {notes or 'no'} |")
    lines += [""] + summary(landed, regime_stats, regime_pairs)
    return lines + [""]


def summary(landed: Sequence[dict], regime_stats: dict[str, dict],
            regime_pairs: dict[str, tuple[int, int]]) -> list[str]:
    """What the tables say, counted: where the picks leave the calibration data."""
    kept = [x["case"] for x in landed
            if _degree_key(x["plan"].config) == _degree_key(x["row"].run.config)]
    covered = [x for x in landed
               if regime_stats.get(x["regime"].key, {}).get("time_n", 0) >= MIN_RUNS]
    unranked = [x["case"] for x in landed if not regime_pairs.get(x["regime"].key, (0, 0))[1]]
    uncovered = [x for x in landed if not x["same_recompute"]]
    return [
        f"- {len(kept)} of {len(landed)} searches pick the published degrees"
        + (f" ({', '.join(kept)})" if kept else "") + f"; {len(covered)} of {len(landed)} "
        f"searched plans land in a regime with at least {MIN_RUNS} timed calibration runs.",
        f"- {len(unranked)} of {len(landed)} land in a regime where no source ranked two "
        "measured configurations" + (f" ({', '.join(unranked)})" if unranked else "")
        + ": there the model's ordering of configurations, which is what the search uses, "
        "is not tested.",
        f"- {len(uncovered)} of {len(landed)} searched plans use a block recomputation policy "
        "that no timed calibration run of their regime used on any block"
        + (" (" + "; ".join(f"{x['case']}: {x['recompute']}" for x in uncovered) + ")"
           if uncovered else "")
        + ": the claimed gain there rests on the recomputation terms (planner/cost/compute.py, "
        "memory.py) more than on this regime's calibration. "
        + f"{sum(map(_band_flags_recompute, uncovered))} of their step-time bands say so and "
        "are widened (`extrapolating: step time: no calibration run of ... recomputation`, "
        "planner/calibration/bands.py)."]


def _band_flags_recompute(x: dict) -> bool:
    return any(n.startswith("extrapolating: step time:") and "recomputation" in n
               for n in x["interval"].get("extrapolating", []))
