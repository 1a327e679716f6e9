"""``shardplan replan``: the best plan on the GPUs that remain after failures (and around slow
ranks), under a churn budget, reported against the old plan. A thin shell over
:func:`planner.hetero.replan.replan` (docs/heterogeneous.md, "Failures and stragglers")."""
from __future__ import annotations

import copy

import click

from cli import signals
from cli.app import deliver_plan
from cli.params import PATH
from planner.errors import invalid

MAX_RANKS = 1 << 20


def parse_ranks(text: str) -> list[int]:
    """'3,17,200' -> [3, 17, 200]; INVALID_INPUT for anything else."""
    out = []
    for part in str(text).split(","):
        part = part.strip()
        if not part.isdigit() or len(part) > 9:
            raise invalid(f"--failed: {part!r} is not a rank (a comma list of global ranks, "
                          f"e.g. 3,17)")
        out.append(int(part))
    if len(out) > MAX_RANKS:
        raise invalid(f"--failed: {len(out)} ranks (limit {MAX_RANKS})")
    if len(set(out)) != len(out):
        raise invalid("--failed: a rank is listed twice")
    return out


def parse_slow(items) -> dict[int, float]:
    """('9:1.5', '40:2') -> {9: 1.5, 40: 2.0}."""
    import math

    out: dict[int, float] = {}
    for item in items:
        rank, sep, factor = str(item).partition(":")
        rank = rank.strip()
        if not sep or not rank.isdigit() or len(rank) > 9:
            raise invalid(f"--slow {item!r}: expected RANK:FACTOR, e.g. 9:1.5")
        try:
            value = float(factor)
        except ValueError:
            raise invalid(f"--slow {item!r}: {factor!r} is not a number") from None
        if not math.isfinite(value) or not 1.0 <= value <= 1000.0:
            raise invalid(f"--slow {item!r}: the factor must be in [1, 1000] (1.5: the rank "
                          f"takes 1.5x as long)")
        if int(rank) in out:
            raise invalid(f"--slow: rank {rank} is given twice")
        out[int(rank)] = value
    return out


def measured_slowdown(path) -> dict[int, float]:
    """--slow-from FILE: the slowdown factors of planner.hetero.replan.slowdown_from_step_times."""
    from planner.hetero.replan import slowdown_from_step_times
    from planner.plan_io import read_json_file

    doc = read_json_file(path, "step-time file", max_bytes=64 << 20)
    if not isinstance(doc, dict) or not all(isinstance(k, str) and k.isdigit() and len(k) <= 9
                                            for k in doc):
        raise invalid(f"--slow-from {path}: expected a JSON object of rank: seconds, e.g. "
                      f'{{"0": 1.02, "9": 1.55}}')
    return slowdown_from_step_times({int(k): v for k, v in doc.items()})


@click.command("replan")
@click.argument("plan_path", metavar="PLAN", type=PATH)
@click.option("--failed", "failed", default="", metavar="RANKS",
              help="Failed GPUs: a comma list of global ranks of the plan.")
@click.option("--slow", "slow", multiple=True, metavar="RANK:FACTOR",
              help="A straggler and its slowdown (1.5: takes 1.5x as long). Repeatable.")
@click.option("--slow-from", "slow_from", type=PATH, default=None, metavar="FILE",
              help="Measured per-rank step times, a JSON object {\"RANK\": seconds, ...}: each "
                   "rank's slowdown is its time over the median (ranks above it); --slow "
                   "overrides a rank given in both.")
@click.option("--max-moved-layers", type=click.IntRange(min=0), default=None,
              help="Churn budget: layers that may change pipeline stage (default: any).")
@click.option("--allow-batch-change", is_flag=True,
              help="Allow a smaller global batch (a multiple of the new data-parallel degree) "
                   "instead of dropping more replicas.")
@click.option("--time-limit", type=click.FloatRange(min=0.1, max=3600), default=5.0,
              show_default=True, help="Seconds for the re-plan.")
@click.option("-o", "--output", default=None, metavar="FILE",
              help="Write the new plan file here (- for standard output).")
@click.option("--force", is_flag=True, help="Overwrite an existing output file.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the new plan (with its replan section) as one JSON document.")
def replan_command(plan_path, failed, slow, slow_from, max_moved_layers, allow_batch_change,
                   time_limit, output, force, as_json):
    """Re-plan after failed GPUs or around slow ones; write the new plan with a replan section."""
    from planner.cost.model import Evaluation
    from planner.hetero.replan import replan
    from planner.plan import make_plan
    from planner.plan_types import Plan
    from planner.solve.gate import plan_gate
    from planner.writer import check_target

    failed_ranks = parse_ranks(failed) if str(failed).strip() else []
    slow_ranks = measured_slowdown(slow_from) if slow_from is not None else {}
    slow_ranks.update(parse_slow(slow))
    to_stdout = as_json or output == "-"
    if output == "-":
        output = None
    if output is not None:
        check_target(output, force=force)
    old = Plan.load(plan_path)
    gate = plan_gate(old)  # the memory gate the plan was searched under (check's default)
    with signals.deadline(time_limit, max(1.0, 0.1 * time_limit)):
        result = replan(old.model, old.cluster, old.config, old.placement, old.runtime,
                        failed=failed_ranks, slow=slow_ranks, max_moved_layers=max_moved_layers,
                        allow_batch_change=allow_batch_change, time_limit_s=time_limit,
                        stage_pools=old.stage_pools,
                        # the memory the plan was searched under (one pool: one limit)
                        memory_limit_gib=None if old.across_pools else
                        (old.document.get("solver") or {}).get("memory_limit_gib"),
                        memory_gate=gate)
    chosen = result.chosen
    ev = chosen.evaluation
    inputs = old.document["inputs"]
    solver = {"status": chosen.solver_status, "objective_s": ev.step_time_s}
    if gate is not None:  # check gates the new plan where the old one was searched
        solver["memory_confidence"] = gate.confidence
    if old.across_pools:  # the new plan across the pools' surviving nodes (schema version 2)
        from planner.hetero.plan_file import make_pool_plan

        doc = make_pool_plan(ev, model_spec=inputs["model"]["spec"],
                             cluster_spec=inputs["cluster"]["spec"], solver=solver)
    else:
        new = Evaluation(old.model, chosen.cluster, chosen.config, chosen.placement,
                         old.runtime, ev.stages, ev.breakdown, ev.model_flops, ev.hw_flops)
        doc = make_plan(new, model_spec=inputs["model"]["spec"],
                        cluster_spec=inputs["cluster"]["spec"], nodes=chosen.cluster.num_nodes,
                        solver=solver)
    if "calibration" in inputs:  # the old plan's profile made its runtime options
        doc["inputs"]["calibration"] = copy.deepcopy(inputs["calibration"])
    doc["replan"] = result.as_dict() | {"old_plan": str(plan_path)}
    deliver_plan(doc, output, force=force, to_stdout=to_stdout)
    if not as_json:
        print_replan(doc["replan"], written_to=output)


def print_replan(r: dict, written_to: str | None = None) -> None:
    """The re-plan against the old plan, for people (stderr)."""
    from rich.table import Table

    from cli.console import console, line

    what = []
    if r["failed_ranks"]:
        what.append(f"failed ranks {', '.join(map(str, r['failed_ranks']))}")
    if r["slow_ranks"]:
        what.append("slow " + ", ".join(f"{k}:{v:g}x" for k, v in r["slow_ranks"].items()))
    console.print(line(("replan", "bold"), f" after {'; '.join(what)}: ",
                       (r["strategy"], "bold"),
                       f" on {r['gpus_used']} GPUs, global batch {r['global_batch']}"))
    lost = (f"{r['lost_state_gib']:.2f} GiB lost (restore from the last checkpoint)"
            if r["lost_state_gib"] > 0 else "no state lost")
    console.print(line(f"step {r['old_step_time_s']:.3f} s -> {r['new_step_time_s']:.3f} s, "
                       f"throughput ", (f"{-r['throughput_loss_pct']:+.2f}%", "bold"),
                       f"; moved {r['moved_layers']} layers",
                       f" (budget {r['max_moved_layers']})" if r["max_moved_layers"] is not None
                       else "",
                       f", {r['moved_state_gib']:.1f} GiB of state (",
                       ", ".join(f"{k} {v:.1f}" for k, v in r["moved_state_gib_by_link"].items())
                       or "none", f"), {lost}, {r['reformed_tp_groups']} TP groups re-formed"))
    table = Table(title="Options considered")
    for column in ("strategy", "GPUs", "step s", "fits", "moved layers", "moved GiB"):
        table.add_column(column, justify="right")
    for o in r["considered"]:
        table.add_row(o["strategy"], str(o["gpus_used"]), f"{o['step_time_s']:.3f}",
                      "yes" if o["fits"] else "no", str(o["moved_layers"]),
                      f"{o['moved_state_gib']:.1f}")
    console.print(table)
    for note in r["notes"]:
        console.print(line("note: ", note))
    if written_to:
        console.print(line("plan written to ", written_to), soft_wrap=True)
