"""``shardplan verify PLAN --steps K``: execute a plan with PyTorch distributed on CPU processes.

Thin: parse, one call to :func:`planner.runtime.torch_exec.verify_plan`, render (tables on
stderr, ``--json`` document on stdout). Exit 0 when the losses agree with a single-process run
and every rank's parameter, gradient and optimizer bytes match the plan's prediction, 1
otherwise, 2 when the plan cannot be run here (no PyTorch, an unsupported model or degree).
"""
from __future__ import annotations

from typing import Any

import click

from cli.app import emit_json
from cli.params import FiniteFloat, PATH
from planner.errors import ErrorKind, PlannerError

TORCH_HINT = 'install the "torch" extra of shardplan, or PyTorch itself: pip install "torch>=2.4"'

# What a run needs at least, before activations: fp32 weights, gradients and Adam's two moments
# (4 x 4 bytes per parameter), held once by the single-process reference run and at least once
# across the distributed ranks (which run after it), plus each worker process's own PyTorch.
STATE_BYTES_PER_PARAM = 16
PROCESS_BYTES = 150 * 2**20


def available_memory_bytes() -> int | None:
    """Memory this process may still use: MemAvailable, capped by a cgroup v2 limit."""
    found = []
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for row in handle:
                if row.startswith("MemAvailable:"):
                    found.append(int(row.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open("/sys/fs/cgroup/memory.max", encoding="ascii") as handle:
            limit = handle.read().strip()
        with open("/sys/fs/cgroup/memory.current", encoding="ascii") as handle:
            used = int(handle.read().strip())
        if limit != "max":
            found.append(max(0, int(limit) - used))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def check_memory(plan_file: str, available: int | None = None) -> None:
    """Refuse up front a plan whose run cannot fit this machine's memory (the run would
    otherwise allocate until the machine runs out)."""
    from planner.plan_io import load_plan

    try:
        doc = load_plan(plan_file)
    except PlannerError:
        return  # verify_plan reports what is wrong with the file
    if "parallelism" not in doc:  # a serving plan: the decoder names it (Plan.from_dict)
        from planner.plan_types import Plan

        Plan.from_dict(doc)
    params = int(doc["model"]["params"])
    par = doc["parallelism"]
    world = int(par["tp"]) * int(par["pp"]) * int(par["dp"]) * int(par.get("cp", 1))
    needed = params * STATE_BYTES_PER_PARAM + world * PROCESS_BYTES
    available = available_memory_bytes() if available is None else available
    if available is not None and needed > available:
        raise PlannerError(
            ErrorKind.UNSUPPORTED,
            f"verify of {plan_file} needs at least {needed / 2**30:,.1f} GiB of memory "
            f"({params:,} parameters x {STATE_BYTES_PER_PARAM} bytes of fp32 weights, gradients "
            f"and Adam moments, plus {world} worker processes), but {available / 2**30:,.1f} GiB "
            f"is available", ("verify a smaller model (a plan for `-m tiny`, or a native model "
                              "file with fewer layers) with the same degrees",),
            {"needed_bytes": needed, "available_bytes": available})


def _require_torch() -> None:
    try:
        import torch  # noqa: F401
    except ImportError as error:
        if error.name not in (None, "torch") and not str(error.name).startswith("torch."):
            raise
        raise PlannerError(ErrorKind.UNSUPPORTED,
                           "shardplan verify needs PyTorch, which is not installed "
                           f"({error})", (TORCH_HINT,)) from None


@click.command()
@click.argument("plan_file", metavar="PLAN", type=PATH)
@click.option("--steps", type=click.IntRange(min=1, max=1000), default=3, show_default=True,
              help="Training steps to run and compare.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Seed of the weights and of the synthetic token data.")
@click.option("--lr", type=FiniteFloat(0, 10, min_open=True), default=3e-3,
              show_default=True, help="Adam learning rate.")
@click.option("--rtol", type=FiniteFloat(0, 1), default=1e-4, show_default=True,
              help="Largest relative loss difference from the single-process run.")
@click.option("--timeout", "timeout_s", type=FiniteFloat(1, 86_400, unit="seconds"),
              default=600.0,
              show_default=True, help="Seconds before the distributed run is stopped.")
@click.option("--max-processes", type=click.IntRange(min=1, max=256), default=16,
              show_default=True, help="Refuse plans needing more CPU processes than this.")
@click.option("--slow", "slow", multiple=True, metavar="RANK:FACTOR",
              help="Inject a straggler: RANK's compute takes FACTOR times as long (it sleeps); "
                   "losses and held bytes must not change. Repeatable.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON document on stdout instead of tables.")
def verify(plan_file, steps, seed, lr, rtol, timeout_s, max_processes, slow, as_json):
    """Run a plan on CPU processes (PyTorch, gloo) and check it against the planner.

    Starts one process per GPU of the plan, applies its tensor, pipeline and data parallelism
    and ZeRO stage with PyTorch's own APIs, trains STEPS Adam steps on synthetic tokens, and
    compares the loss curve with a single-process run and each rank's held parameter,
    gradient and optimizer bytes with the plan's prediction.
    """
    _require_torch()
    check_memory(plan_file)
    from planner.runtime.torch_exec import verify_plan

    from cli.replan_command import parse_slow

    report = verify_plan(plan_file, steps=steps, seed=seed, lr=lr, rtol=rtol,
                         timeout_s=timeout_s, max_processes=max_processes,
                         slow=parse_slow(slow))
    document = report.to_dict()
    if as_json:
        emit_json(document)
    else:
        print_verify(document)
    raise click.exceptions.Exit(0 if report.ok else 1)


def _mib(value: float) -> str:
    return f"{value / 2**20:,.3f}"


def print_verify(doc: dict[str, Any]) -> None:
    from rich.table import Table

    from cli.console import console, line, styled

    par = doc["parallelism"]
    console.print(line((doc['plan'], "bold"), f": tp {par.get('tp')} pp {par.get('pp')} "
                  f"dp {par.get('dp')} cp {par.get('cp')} sp {par.get('sp')} zero "
                  f"{par.get('zero_stage')} micro-batch {par.get('micro_batch')} x "
                  f"{par.get('num_micro_batches')} ({doc['world_size']} processes)"))
    for key, text in doc["implementation"].items():
        console.print(line("  ", (key, "dim"), f": {text}"))
    if doc.get("error"):
        console.print(line(("distributed run failed", "bold red"), f": {doc['error']}"),
                      soft_wrap=True)
    loss = doc["loss"]
    table = Table(title=f"Loss: single process vs distributed (rtol {loss['rtol']:g})")
    for column in ("step", "single process", "distributed", "rel. difference"):
        table.add_column(column, justify="right")
    for i, ref in enumerate(loss["reference"]):
        dist = loss["distributed"][i] if i < len(loss["distributed"]) else None
        rel = loss["rel_diff"][i] if i < len(loss["rel_diff"]) else None
        table.add_row(str(i), f"{ref:.7f}", "-" if dist is None else f"{dist:.7f}",
                      "-" if rel is None else f"{rel:.2e}")
    console.print(table)
    if doc["ranks"]:
        table = Table(title="Bytes per rank (MiB): predicted / held")
        for column in ("rank", "pp", "dp", "tp", "params", "grads", "optimizer", "states",
                       "activations pred. (stored) / measured"):
            table.add_column(column, justify="right")
        for r in doc["ranks"]:
            cells = []
            for category in ("params", "grads", "optimizer"):
                s = r["states"][category]
                cells.append(f"{_mib(s['predicted_bytes'])} / {_mib(s['held_bytes'])}")
            verdicts = {s["verdict"] for s in r["states"].values()}
            verdict = (styled("mismatch", "red") if "mismatch" in verdicts
                       else "group-sum" if "group-sum exact" in verdicts
                       else styled("exact", "green"))
            c = r["coords"]
            table.add_row(str(r["rank"]), str(c["pp"]), str(c["dp"]), str(c["tp"]), *cells,
                          verdict,
                          f"{_mib(r['activations_predicted'])} "
                          f"({_mib(r['activations_predicted_stored'])}) / "
                          f"{_mib(r['activations_measured'])}")
        console.print(table)
        notes = sorted({s["note"] for r in doc["ranks"] for s in r["states"].values()
                        if s["note"]})
        for note in notes:
            console.print(line("  ", ("note", "yellow"), f": {note}"))
    for row in doc.get("a2a", []):
        moved = sorted(set(row["moved_bytes_per_step"]))
        etp = ""
        if "etp_predicted_bytes_per_step" in row:
            etp_moved = sorted({f + b for f, b in zip(row["etp_forward_bytes_per_step"],
                                                      row["etp_backward_bytes_per_step"])})
            etp = (f"; of which ETP gather / scatter {row['etp_predicted_bytes_per_step']:,.0f} "
                   f"predicted, {', '.join(f'{m:,}' for m in etp_moved)} moved")
        console.print(line("  ", ("expert all-to-all", "dim"),
                           f": rank {row['rank']}: {row['predicted_bytes_per_step']:,.0f} B per "
                           f"step predicted, {', '.join(f'{m:,}' for m in moved)} moved "
                           f"({'exact' if row['ok'] else 'MISMATCH'}){etp}"))
    for row in doc.get("expert_states", []):
        console.print(line("  ", ("expert states", "dim"), f": rank {row['rank']}: " + ", ".join(
            f"{k} {row[k]['predicted_bytes']:,.0f} / {row[k]['held_bytes']:,} B"
            for k in ("params", "grads", "optimizer"))
            + " predicted / held (" + ", ".join(sorted({row[k]["verdict"] for k in (
                "params", "grads", "optimizer")})) + ")"))
    grads = doc.get("expert_grads") or {}
    if grads:
        console.print(line("  ", ("expert gradients", "dim"),
                           f": first step, sum of squares {grads['distributed_sum_sq']:.8g} "
                           f"(over ranks / {grads['copies']}) vs single process "
                           f"{grads['reference_sum_sq']:.8g}, rel. difference "
                           f"{grads['rel_diff']:.2e} ({'ok' if grads['ok'] else 'MISMATCH'})"))
    for note in doc["notes"]:
        console.print(line("  ", ("note", "dim"), f": {note}"))
    status = ("OK", "bold green") if doc["ok"] else ("FAILED", "bold red")
    max_rel = loss["max_rel_diff"]
    experts_ok = (doc.get("a2a_ok", True) and doc.get("expert_states_ok", True)
                  and doc.get("expert_grads_ok", True))
    console.print(line(status, f": losses {'agree' if loss['ok'] else 'DIFFER'} (max rel. "
                       f"difference {'-' if max_rel is None else f'{max_rel:.2e}'}), states "
                       f"{'match' if doc['states_ok'] else 'DO NOT MATCH'}"
                       + (f", expert all-to-all bytes, states and gradients "
                          f"{'match' if experts_ok else 'DO NOT MATCH'}"
                          if doc.get("a2a") or doc.get("expert_states") else "")))
