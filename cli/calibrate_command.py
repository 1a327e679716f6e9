"""``shardplan calibrate RUNS.yaml -o profile.yaml``: fit a runtime profile to measured runs.

Thin: parse, one call to :func:`planner.calibration.user.calibrate_file`, write the profile,
render the leave-one-out report (a table on stderr, or ``--json`` on stdout).
"""
from __future__ import annotations

from pathlib import Path

import click

from cli.app import emit_json


@click.command()
@click.argument("runs_path", metavar="RUNS.yaml", type=click.Path(dir_okay=False))
@click.option("--output", "-o", "output", required=True, type=click.Path(dir_okay=False),
              help="Where to write the calibration profile (YAML; read by --calibration).")
@click.option("--runtime", default=None,
              help="Runtime profile to calibrate (megatron, torchtitan, deepspeed, fsdp); "
                   "default: the one all runs share.")
@click.option("--max-evaluations", type=click.IntRange(min=5, max=2000), default=60,
              show_default=True, help="Model evaluations per least-squares fit.")
@click.option("--no-leave-one-out", is_flag=True,
              help="Report in-sample errors instead of leave-one-out (one fit instead of n).")
@click.option("--force", is_flag=True, help="Overwrite an existing output file.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON document on stdout instead of tables.")
def calibrate(runs_path, output, runtime, max_evaluations, no_leave_one_out, force, as_json):
    """Fit efficiency / overlap constants of one runtime profile to your measured runs."""
    from planner.calibration.store import dump
    from clusters.calibration_runs import calibrate_file

    from cli import signals
    from planner.writer import check_target, write_file

    out = Path(output)
    check_target(out, force=force)  # refused now (exists, no such folder, ...), not after the fit
    report = calibrate_file(runs_path, runtime, max_evaluations=max_evaluations,
                            leave_one_out=not no_leave_one_out)
    write_file(dump(report.profile), out, force=force, critical=signals.deferred)
    doc = {"output": str(out), "runtime": report.profile.runtime,
           "constants": dict(report.profile.constants.values),
           "median_abs_error_before": report.median_before,
           "median_abs_error_after": report.median_after,
           "leave_one_out": report.leave_one_out,
           "runs": [{"id": r.id, "measured_step_time_s": r.measured_s,
                     "error_before": r.error_before, "error_after": r.error_after}
                    for r in report.runs],
           "skipped": [{"id": i, "reason": why} for i, why in report.skipped]}
    warnings = []
    if not no_leave_one_out and not report.leave_one_out:
        warnings.append(f"one run with a measured step time: no leave-one-out error (no run "
                        f"is left to fit without it); the errors after are in-sample, the "
                        f"{len(report.profile.fit.get('fitted', []))} fitted constants "
                        f"reproducing that run, which says nothing of other configurations")
    if report.leave_one_out and report.median_after > report.median_before:
        warnings.append(f"the fitted constants predict the held-out runs worse than the "
                        f"starting ones (median |error| {report.median_before:.1%} -> "
                        f"{report.median_after:.1%}): the runs do not pin them down; planning "
                        f"without --calibration keeps the shipped constants")
    doc["warnings"] = warnings
    kept = report.profile.fit.get("bands_kept_from_start", [])
    doc["bands_kept_from_start"] = list(kept)
    if as_json:
        emit_json(doc)
        return
    from rich.table import Table

    from cli.console import console
    table = Table(title=f"calibration of {report.profile.runtime} "
                        f"({'leave-one-out' if report.leave_one_out else 'in-sample'})")
    for col in ("run", "measured s", "error before", "error after"):
        table.add_column(col, justify="left" if col == "run" else "right")
    for r in report.runs:
        table.add_row(r.id, f"{r.measured_s:.3g}", f"{r.error_before:+.1%}",
                      f"{r.error_after:+.1%}")
    console.print(table)
    console.print(f"median |error| {report.median_before:.1%} -> {report.median_after:.1%}; "
                  f"wrote {out}")
    for i, why in report.skipped:
        console.print(f"skipped {i}: {why}")
    for quantity in kept:
        console.print(f"note: no run measured {quantity.replace('_', ' ')}: its constants and "
                      f"error band stay the shipped ones")
    for warning in warnings:
        console.print(f"warning: {warning}")
