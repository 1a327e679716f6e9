"""Rich rendering for people, on stderr. Reads the same dicts the ``--json`` mode prints.

Every string here is literal text (the console of :mod:`cli.console` has markup off); style is
the program's own, added with :func:`cli.console.line` / :func:`cli.console.styled`.
"""
from __future__ import annotations

from typing import Any, Iterable

from rich.table import Table

from cli import signals
from cli.console import console, line, print_error, print_warning, styled

__all__ = ["console", "print_error", "print_rows", "print_model", "print_evaluation",
           "print_plan", "print_warnings", "print_plan_file", "print_check", "search_progress",
           "memory_table"]


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int) and abs(value) >= 10**6:
        return f"{value / 1e9:,.3f} B" if abs(value) >= 10**9 else f"{value / 1e6:,.2f} M"
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def print_rows(title: str, rows: list[dict[str, Any]], columns: Iterable[str]) -> None:
    signals.act_on_unacted()  # an interrupted command prints none of its result
    columns = list(columns)
    table = Table(title=title)
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(_fmt(row.get(c, "")) for c in columns))
    console.print(table)


def print_model(summary: dict[str, Any]) -> None:
    signals.act_on_unacted()  # an interrupted command prints none of its result
    console.print(line((summary['name'], "bold"),
                       f" ({summary['family']}): {summary['params']:,} parameters, "
                       f"{summary['active_params']:,} active, {summary['num_layers']} blocks, "
                       f"hidden {summary['hidden']}, vocab {summary['vocab']}"))
    table = Table(title="Layer classes")
    for column in ("layers", "count", "kind", "params each", "attention", "mlp"):
        table.add_column(column)
    for cls in summary["layer_classes"]:
        att = cls.get("attention")
        mlp = cls.get("mlp")
        table.add_row(
            cls["first"] if cls["count"] == 1 else f"{cls['first']} .. {cls['last']}",
            str(cls["count"]), cls["kind"], f"{cls['params_each']:,}",
            f"{att['num_heads']}h/{att['num_kv_heads']}kv x {att['head_dim']}" if att else "",
            (f"{mlp['num_experts']}x{mlp['ffn_hidden']} top-{mlp['top_k']}" if mlp and
             mlp["num_experts"] > 1 else f"{mlp['ffn_hidden']}{' gated' if mlp['gated'] else ''}")
            if mlp else "")
    console.print(table)


def memory_table(stages: list[dict[str, Any]], capacity_gib: float, title: str) -> Table:
    pools = any("pool" in stage for stage in stages)  # a plan across pools (schema_version 2)
    caption = ("GiB per GPU; use = share of the stage's pool's GPU memory" if pools else
               f"GiB per GPU; use = share of {capacity_gib:g} GiB")
    table = Table(title=title, caption=caption + "; s/mb = seconds per micro-batch")
    for column in ("stage",) + (("pool", "ranks") if pools else ()) + (
            "layers", "params", "grads", "optim", "activ", "other", "total", "use", "s/mb"):
        table.add_column(column, justify="right", no_wrap=True)
    for stage in stages:
        mem = stage["memory_gib"]
        share = mem["total"] / stage.get("capacity_gib", capacity_gib)
        colour = "green" if share <= 1 else "red"
        where = ()
        if pools:
            first, size = stage["first_rank"], stage.get("num_gpus")
            where = (stage["pool"], str(first) if size is None else f"{first}-{first + size - 1}")
        table.add_row(str(stage["index"]), *where, str(stage["num_layers"]),
                      *(f"{mem[k]:.1f}" for k in ("params", "grads", "optimizer", "activations",
                                                  "other", "total")),
                      styled(f"{share:.0%}", colour), f"{stage['time_s']:.3f}")
    return table


def _chunks(p: dict[str, Any]) -> str:
    """The model chunks per pipeline rank, where the schedule has several (the runtimes'
    --num-virtual-stages-per-pipeline-rank / the number of model parts per rank) and an
    explicit pipeline layout (evaluate --pipeline-layout)."""
    v = p.get("virtual_stages", 1)
    layout = f" (layout {p['pipeline_layout']})" if p.get("pipeline_layout") else ""
    return (f" with {v} chunks per rank" if v > 1 else "") + layout


def _sharding(p: dict[str, Any]) -> str:
    """Hybrid sharding (HSDP) and ZeRO++ hpZ, where the plan has them."""
    parts = []
    if p.get("dp_shard"):
        parts.append(f"sharded over {p['dp_shard']} of dp {p['dp']}")
    if p.get("hpz"):
        parts.append(f"hpZ {p['hpz']}")
    return f" ({', '.join(parts)})" if parts else ""


# the step time's parts (planner.cost.terms.StepBreakdown) in the order a step runs them: the
# step is pipeline + dp_exposed + optimizer + embedding_sync; the bubble is the idle part of
# the pipeline's time, so it is printed as part of it, not as one more addend
TIME_PARTS = ("pipeline", "bubble", "dp_exposed", "optimizer", "embedding_sync")
TIME_LABELS = {"bubble": "  of it bubble"}


def print_evaluation(result: dict[str, Any]) -> None:
    signals.act_on_unacted()  # an interrupted command prints none of its result
    m, c, p, pred = result["model"], result["cluster"], result["parallelism"], result["predicted"]
    console.print(line(
        (m['name'], "bold"), f" on {c['num_gpus']} x {c['gpu']} ({c['name']}): "
        f"dp {p['dp']} x tp {p['tp']} x pp {p['pp']} x cp {p['cp']}, ep {p['ep']}, "
        f"sp {_fmt(p['sp'])}, ZeRO-{p['zero_stage']}{_sharding(p)}, micro-batch "
        f"{p['micro_batch']} x {p['num_micro_batches']}, {p['schedule']}"
        f"{_chunks(p)}, recompute {p['recompute']}"))
    console.print(memory_table(result["stages"], c["gpu_memory_gib"], "Memory per GPU (GiB)"))
    time = Table(title="Step time")
    time.add_column("part")
    time.add_column("seconds", justify="right")
    parts = pred["time_breakdown_s"]  # a plan file's keys come back sorted: the step's order
    for key in (*(k for k in TIME_PARTS if k in parts), *sorted(set(parts) - set(TIME_PARTS))):
        time.add_row(TIME_LABELS.get(key, key), f"{parts[key]:.4f}")
    time.add_row(styled("step", "bold"), styled(f"{pred['step_time_s']:.4f}", "bold"))
    console.print(time)
    verdict = ("fits", "green") if pred["fits"] else ("does NOT fit", "red")
    of = (" of its pool's GPU" if "pools" in c else f" of {c['gpu_memory_gib']:g} GiB")
    console.print(line(
        f"{pred['tokens_per_s']:,.0f} tokens/s, {pred['model_tflops_per_gpu']:.1f} model "
        f"TFLOP/s per GPU (MFU {pred['mfu']:.1%}), peak {pred['peak_memory_gib']:.2f} GiB{of}: ",
        verdict))
    if "pools" in c:
        console.print(line("GPUs used: " + ", ".join(
            f"{x['name']} {x['gpus_used']} of {x['num_gpus']} {x['gpu']}" for x in c["pools"])))
    band_s, band_gib = pred.get("step_time_s_interval"), pred.get("peak_memory_gib_interval")
    if band_s and band_gib:
        coverage = pred.get('interval_coverage', 0.8)
        console.print(line(
            f"{coverage:.0%} band: step {band_s[0]:.4f}-{band_s[1]:.4f} s, "
            f"peak {band_gib[0]:.2f}-{band_gib[1]:.2f} GiB"))
        if "pools" not in c and pred["fits"] and band_gib[1] > c["gpu_memory_gib"]:
            # check's verdict 'fits only at the optimistic end'
            # (planner.calibration.verdict.memory_verdict)
            print_warning(f"memory: fits only at the optimistic end: the {coverage:.0%} band's "
                          f"high end {band_gib[1]:.2f} GiB is over the {c['gpu_memory_gib']:g} "
                          f"GiB (a {(1 - coverage) / 2:.0%} chance or more of running out); "
                          f"plan --memory-confidence 0.9 searches only plans whose 90 % "
                          f"quantile fits (or a larger --memory-headroom)")
    for note in pred.get("extrapolating", ()):
        print_warning(note)
    for problem in result.get("runtime_problems", ()):
        print_warning(f"runtime: {problem}")
    for note in result.get("warnings", ()):
        print_warning(note)


class search_progress:
    """Context manager yielding a progress callback for the search (stderr, transient)."""

    def __init__(self, enabled: bool = True) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.enabled = enabled and console.is_terminal
        self.progress = Progress(TextColumn("searching"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("best {task.fields[best]}  bound {task.fields[bound]}"),
                                 TimeElapsedColumn(), console=console, transient=True)
        self.task = None

    def __enter__(self):
        if not self.enabled:
            return None
        self.progress.start()
        self.task = self.progress.add_task("search", total=None, best="-", bound="-")
        return self.update

    def update(self, done: int, total: int, best_s: float, bound_s: float) -> None:
        self.progress.update(self.task, completed=done, total=total,
                             best=f"{best_s:.3f}s" if best_s < float("inf") else "-",
                             bound=f"{bound_s:.3f}s" if bound_s < float("inf") else "-")

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self.progress.stop()


def print_plan(doc: dict[str, Any], written_to: str | None = None,
               solve_time_s: float | None = None) -> None:
    signals.act_on_unacted()  # an interrupted command prints none of its result
    print_evaluation(doc)
    s = doc["solver"]
    if solve_time_s is None:
        solve_time_s = s.get("solve_time_s")
    took = f" in {solve_time_s:.2f}s" if solve_time_s is not None else ""
    if all(k in s for k in ("gap", "candidates_evaluated", "candidates_total",
                            "candidates_pruned_memory", "ortools_version")):
        console.print(line(
            "solver: ", (s['status'], "bold"), f"{took}, gap {s['gap']:.2%}, "
            f"{s['candidates_evaluated']} of {s['candidates_total']} configurations solved "
            f"({s['candidates_pruned_memory']} pruned by memory bound), OR-Tools "
            f"{s['ortools_version']}"))
        if "memory_confidence" in s:  # plan --memory-confidence (planner/solve/gate.py)
            console.print(line(f"memory gate: the {s['memory_confidence']:.0%} quantile of the "
                               f"peak's band within {s.get('memory_limit_gib', 0):.2f} GiB per "
                               f"GPU (check gates at it)"))
    else:  # a plan made from one evaluated configuration, not a search
        console.print(line("solver: ", (s.get('status', '?'), "bold")))
    if doc.get("alternatives"):
        from planner.plan_diff import setting_changes

        shown = ("tp", "pp", "dp", "cp", "micro_batch", "virtual_stages", "zero_stage")
        # the settings the columns do not show (ep, recompute, dp_shard, schedule, ...), where
        # a runner-up's differ from the plan's: rows alike in every column are told apart
        others = [setting_changes(doc["parallelism"], alt["parallelism"], shown + ("sp",))
                  for alt in doc["alternatives"]]
        table = Table(title="Runners-up")
        for column in ("tp", "pp", "dp", "cp", "micro-batch", "v", "ZeRO", "sp", "step s",
                       "slower", *(["other changes"] if any(others) else [])):
            table.add_column(column, justify="left" if column == "other changes" else "right")
        for alt, other in zip(doc["alternatives"], others):
            p = alt["parallelism"]
            table.add_row(*(str(p[k]) for k in shown),
                          _fmt(p["sp"]), f"{alt['step_time_s']:.3f}",
                          f"+{alt['slower_than_best']:.1%}",
                          *(["; ".join(other)] if any(others) else []))
        console.print(table)
    print_fallbacks(doc.get("fallbacks") or [])
    if written_to:
        console.print(line("plan written to ", written_to), soft_wrap=True)


def print_fallbacks(fallbacks: list[dict[str, Any]]) -> None:
    """The re-plans ``plan --fallbacks K`` stored (planner/hetero/fallbacks.py), one row per
    failure class, then their notes."""
    if not fallbacks:
        return
    table = Table(title="Fallbacks (re-plans stored for the likeliest failures)")
    for column in ("failure", "failed GPUs", "re-plan", "GPUs", "tp", "pp", "dp",
                   "step s", "throughput", "peak GiB"):
        table.add_column(column, justify="left" if column in ("failure", "re-plan") else "right")
    notes = []
    for f in fallbacks:
        if f["status"] != "ok":
            table.add_row(f["failure"], str(len(f["failed_ranks"])), "none", *[""] * 7)
            notes.append(f"{f['failure']}: {f.get('reason', 'no re-plan')}")
            continue
        p, r, q = f["parallelism"], f["replan"], f["predicted"]
        table.add_row(f["failure"], str(len(f["failed_ranks"])), f["strategy"],
                      str(r["gpus_used"]), str(p["tp"]), str(p["pp"]), str(p["dp"]),
                      f"{q['step_time_s']:.3f}", f"-{r['throughput_loss_pct']:.1f}%",
                      f"{q['peak_memory_gib']:.2f}")
        notes += [f"{f['failure']}: {note}" for note in r.get("notes", ())]
    console.print(table)
    for note in notes:
        print_warning(note, "note")


# -- plan files: show, check, export (cli/plan_commands.py) ----------------------------------

def print_warnings(warnings: Iterable[str], prefix: str = "warning") -> None:
    for warning in warnings:
        print_warning(warning, prefix)


def _calibration(inputs: dict[str, Any]) -> str:
    """The calibration profile a plan was made with (plan --calibration), where it records one."""
    record = inputs.get("calibration")
    if not record:
        return ""
    return f", calibration {record['spec']!r} ({record['sha256'][7:19]})"


def print_plan_file(doc: dict[str, Any], path: str) -> None:
    """``shardplan show``: the plan as ``plan`` printed it, plus its inputs and layer split."""
    signals.act_on_unacted()  # an interrupted command prints none of its result
    inputs = doc["inputs"]
    console.print(line((path, "bold"),
                       f": plan schema_version {doc['schema_version']} for model "
                       f"{inputs['model']['spec']!r} ({inputs['model']['sha256'][7:19]}) on "
                       f"cluster {inputs['cluster']['spec']!r} "
                       f"({inputs['cluster']['sha256'][7:19]}), global batch "
                       f"{inputs['global_batch']}, {inputs['dtype']}" + _calibration(inputs)))
    print_plan(doc)
    pins = doc.get("pins") or {}
    if pins:
        console.print(line("pinned: " + ", ".join(f"{k}={v}" for k, v in sorted(pins.items()))))
    table = Table(title="Layers per stage")
    for column in ("stage", "layers", "blocks", "recompute none", "selective", "full"):
        table.add_column(column, justify="right")
    layers = sorted(doc["layers"], key=lambda x: x["index"])
    for stage in range(doc["parallelism"]["pp"]):
        runs: list[list[str]] = []  # contiguous runs (several per stage when interleaved)
        for i, x in enumerate(layers):
            if x["stage"] != stage:
                continue
            if runs and i > 0 and layers[i - 1]["stage"] == stage:
                runs[-1].append(x["name"])
            else:
                runs.append([x["name"]])
        text = ", ".join(r[0] if len(r) == 1 else f"{r[0]}..{r[-1]}" for r in runs[:2])
        if len(runs) > 2:
            text += f" +{len(runs) - 2} chunks"
        blocks = [x for x in layers if x["stage"] == stage and x["kind"] == "block"]
        table.add_row(str(stage), text or "-", str(len(blocks)),
                      *(str(sum(1 for x in blocks if x["recompute"] == r))
                        for r in ("none", "selective", "full")))
    console.print(table)


def print_check(report: dict[str, Any]) -> None:
    """``shardplan check``: verdict, problems, offending stages by category, remedies."""
    signals.act_on_unacted()  # an interrupted command prints none of its result
    plan = report.get("plan") or "plan"
    for role in ("model", "cluster"):
        item = report["inputs"][role]
        state = ("stale", "red") if item["stale"] else ("matches the plan", "green")
        console.print(line(f"{role}: {item['name']} ({item['source']}): ", state))
    if report.get("runtime"):
        console.print(line(f"runtime: {report['runtime']} (its memory layout and calibration)"))
    stages = report["stages"]
    if stages:
        over = [s for s in stages if not s["fits"]]
        table = Table(title=("Stages over capacity" if over else "Memory per GPU") + " (GiB)")
        for column in ("stage", "params", "grads", "optimizer", "activations", "other",
                       "needed", "available", "over by", "plan said"):
            table.add_column(column, justify="right")
        for s in over or stages:
            need = s["needed_gib"]
            colour = "green" if s["fits"] else "red"
            planned = s.get("planned_total_gib")
            table.add_row(str(s["index"]), *(f"{need[k]:.2f}" for k in
                                             ("params", "grads", "optimizer", "activations",
                                              "other")),
                          styled(f"{need['total']:.2f}", colour), f"{s['capacity_gib']:g}",
                          f"{max(0.0, -s['headroom_gib']):.2f}",
                          "-" if planned is None else f"{planned:.2f}")
        console.print(table)
    verdict = report.get("memory_verdict")
    if verdict:
        low, high = report["memory_interval_gib"]
        colour = {"fits": "green", "does not fit": "red"}.get(verdict, "yellow")
        console.print(line("memory: ", (verdict, colour),
                           f" (80 % band {low:.1f}-{high:.1f} GiB of {report['capacity_gib']:g}; "
                           f"gate at the {report['memory_confidence']:.0%} quantile: "
                           f"{report['memory_gate_gib']:.1f} GiB, margin "
                           f"{report['memory_margin_gib']:+.1f} GiB)"), soft_wrap=True)
    for problem in report["problems"]:
        console.print(line(("problem", "red"), f" ({problem['code']}): {problem['message']}"),
                      soft_wrap=True)
    if report["remedies"]:
        console.print("What would make it fit (each change alone, re-evaluated):")
        for n, remedy in enumerate(report["remedies"], 1):
            saved = ", ".join(f"{x['gib']:.2f} GiB on stage {x['stage']}"
                              for x in remedy["saves_gib"])
            verdict = ("then fits", "green") if remedy["fits"] else ("not enough", "yellow")
            console.print(line(f"  {n}. {remedy['change']}: saves {saved}; peak "
                               f"{remedy['peak_gib']:.2f} GiB: ", verdict))
    if report["ok"]:
        console.print(line(("ok", "green"), f": {plan} fits (peak {report['peak_gib']:.2f} of "
                           f"{report['capacity_gib']:g} GiB per GPU)"))
    else:
        console.print(line(("check failed", "bold red"), f": {plan}"), soft_wrap=True)
