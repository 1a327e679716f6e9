"""``shardplan report`` and ``shardplan diff``: a plan drawn, and two plans compared.

Thin commands over :mod:`planner.plan_page` and :mod:`planner.plan_diff`: parse, one library
call, write (data through :mod:`planner.writer` or stdout, people on stderr).
"""
from __future__ import annotations

import click

from cli import signals
from cli.app import emit_json, emit_text
from cli.params import PATH

REPORT_FORMATS = ("html", "png", "svg")


@click.command()
@click.argument("plan_path", metavar="PLAN", type=PATH)
@click.option("-o", "--output", default=None, metavar="FILE",
              help="Write here (- or none: stdout, html and svg only).")
@click.option("--format", "-f", "fmt", default=None, type=click.Choice(REPORT_FORMATS),
              help="html (a self-contained page, the default), png or svg (one image); "
                   "default from the -o suffix.")
@click.option("--force", is_flag=True, help="Overwrite an existing output file.")
def report(plan_path, output, fmt, force):
    """Draw a saved plan: pipeline timeline, memory per stage, per-layer placement."""
    from planner.errors import invalid
    from planner.plan_page import render
    from planner.plan_types import Plan
    from planner.writer import check_target, write_file

    if output == "-":
        output = None
    suffix = str(output).rsplit(".", 1)[-1].lower() if output and "." in str(output) else ""
    suffix = "html" if suffix == "htm" else suffix
    if fmt is None:
        fmt = suffix if suffix in REPORT_FORMATS else "html"
    elif suffix in REPORT_FORMATS and suffix != fmt:  # PNG bytes in a .svg file, say
        raise invalid(f"--format {fmt} but the output file {output} names {suffix}",
                      f"give -o FILE.{fmt}, or drop --format (the -o suffix sets it)")
    if output is None and fmt == "png":
        raise invalid("a PNG report needs a file: give -o FILE.png")
    if output is not None:
        check_target(output, force=force)
    data = render(Plan.load(plan_path), fmt)
    if output is None:
        emit_text(data.decode("utf-8"))
        return
    from cli.console import say

    write_file(data, output, force=force, critical=signals.deferred, on_commit=signals.finish)
    say(f"{fmt} report written to {output}")


@click.command()
@click.argument("a_path", metavar="A", type=PATH)
@click.argument("b_path", metavar="B", type=PATH)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
@click.option("--exit-code", is_flag=True, help="Exit 1 when the plans differ (like git diff).")
def diff(a_path, b_path, as_json, exit_code):
    """What changed from plan A to plan B: degrees, layer moves, memory and time per stage."""
    from planner.plan_diff import diff as plan_diff
    from planner.plan_types import Plan

    document = plan_diff(Plan.load(a_path), Plan.load(b_path))
    if as_json:
        emit_json(document)
    else:
        from cli.render_diff import print_diff

        print_diff(document, a_path, b_path)
    if exit_code and not document["identical"]:
        click.get_current_context().exit(1)
