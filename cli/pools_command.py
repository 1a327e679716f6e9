"""``shardplan plan-pools``: the fastest plan across the pools of a multi-pool cluster (stages
on pools, blocks per stage by each pool's speed and memory), as a JSON report. A thin shell over
:func:`planner.hetero.search.hetero_search` (docs/heterogeneous.md)."""
from __future__ import annotations

import click

from cli import signals
from cli.app import emit_json
from cli.commands import (MAX_TIME_LIMIT_S, calibration_option, compile_option, dtype_option,
                          elementwise_option, global_batch_option, json_option, model_option,
                          runtime_option, seq_len_option, time_limit_slack_s)
from cli.params import pin_pairs


@click.command("plan-pools")
@model_option
@click.option("--cluster", "-c", "cluster", required=True, metavar="C",
              help="Multi-pool cluster preset or YAML file (pools: + inter_pool:).")
@global_batch_option
@seq_len_option
@dtype_option
@click.option("--time-limit", type=click.FloatRange(min=0.1, max=MAX_TIME_LIMIT_S), default=120.0,
              show_default=True, help="Seconds for the whole search.")
@click.option("--pin", "pins", multiple=True, metavar="KEY=VALUE",
              help="Fix a choice: tp, pp, dp, cp, sp, zero, micro_batch, recompute.")
@runtime_option
@compile_option
@elementwise_option
@calibration_option
@click.option("--timings", is_flag=True, help="Record the solve's wall-clock time.")
@json_option
def plan_pools(model, cluster, global_batch, seq_len, dtype, time_limit, pins, runtime,
               compiled, elementwise, calibration, timings, as_json):
    """Plan across the GPU pools of a cluster; print the stages, their pools and the step."""
    from clusters import load_cluster
    from models import load_model
    from planner.hetero.report import hetero_dict
    from planner.calibration.session import runtime_setup
    from planner.hardware import MultiPoolCluster
    from planner.hetero.plan_file import pool_options
    from planner.hetero.search import hetero_search
    from planner.solve.search import SearchOptions
    from planner.solve.space import Pins

    pinned = Pins.parse(pin_pairs(pins))
    with signals.deadline(time_limit, time_limit_slack_s(time_limit)):
        graph = load_model(model, seq_len=seq_len)
        hw = load_cluster(cluster, multi_pool=True)
        # the runtime options and calibrated per-pool efficiencies `plan` searches with
        # (cli/commands.py, planner/hetero/planning.py): same inputs, same plan
        pools = hw if isinstance(hw, MultiPoolCluster) else None
        setup = runtime_setup(hw if pools is None else hw.pools[0].as_cluster(), runtime, dtype,
                              calibration=calibration, compiled=compiled,
                              elementwise=elementwise)
        options = setup.options
        if pools is not None:
            options = pool_options(options, pools, setup.calibration.constants
                                   if setup.calibration else None)
        result = hetero_search(graph, hw, global_batch, graph.default_seq_len, dtype, pinned,
                               SearchOptions(time_limit_s=time_limit, runtime=options))
    solver = dict(result.record)
    if not timings:
        del solver["solve_time_s"]
    doc = hetero_dict(result.best, solver)
    if as_json:
        emit_json(doc)
        return
    from rich.table import Table

    from cli.console import console, line

    p, pred = doc["parallelism"], doc["predicted"]
    console.print(line((doc["model"]["name"], "bold"), f" on {doc['cluster']['name']}: "
                       f"tp {p['tp']} x dp {p['dp']} x pp {p['pp']}, ZeRO {p['zero_stage']}, "
                       f"micro-batch {p['micro_batch']}; GPUs used ",
                       ", ".join(f"{k} {v}" for k, v in doc["gpus_used"].items())))
    table = Table(title="Stages")
    for column in ("stage", "pool", "ranks", "blocks", "time ms", "memory GiB", "of GiB"):
        table.add_column(column, justify="right")
    for s in doc["stages"]:
        table.add_row(str(s["index"]), s["pool"],
                      f"{s['first_rank']}-{s['first_rank'] + s['num_gpus'] - 1}",
                      str(s["num_blocks"]), f"{s['time_s'] * 1e3:.1f}",
                      f"{s['memory_gib']['total']:.1f}", f"{s['capacity_gib']:g}")
    console.print(table)
    console.print(line(f"step {pred['step_time_s']:.3f} s, {pred['tokens_per_s']:,.0f} tokens/s; "
                       f"solver: ", (solver["status"], "bold"),
                       f", {solver['candidates_evaluated']} of {solver['candidates_total']} "
                       f"configurations solved"))
