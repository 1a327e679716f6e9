"""The ``shardplan`` command group and what every command shares to produce output.

This module defines the group and nothing registers itself here on import: the commands live
in their own modules (``cli/commands.py``, ``cli/plan_commands.py``, ...), which import this one,
and :mod:`cli.main` adds them to the group explicitly, so importing ``cli.main`` gives the whole
command group (``CliRunner().invoke(cli.main.cli, ["models"])`` works) with no import cycle.
"""
from __future__ import annotations

import json
from typing import Any

import click

from cli.console import write_stdout

DEBUG_ENV = "SHARDPLAN_DEBUG"


def emit_json(document: Any) -> None:
    """Write one JSON document to stdout: sorted keys, stable formatting."""
    write_stdout(json.dumps(document, sort_keys=True, indent=2, allow_nan=False) + "\n")


def emit_text(text: str) -> None:
    """Write data (a plan, an exported configuration, the schema) to stdout as it is."""
    write_stdout(text)


def deliver_plan(doc: dict, output, *, force: bool, to_stdout: bool) -> None:
    """Commit a plan document to ``output`` (signals held during the commit, ignored after it)
    and/or print it on stdout: what plan, replan and serve plans do with their result."""
    from cli import signals
    from planner.plan import dumps, write_plan

    if output is not None:
        write_plan(doc, output, force=force, critical=signals.deferred,
                   on_commit=signals.finish)
    if to_stdout:
        emit_text(dumps(doc))


class Context:
    def __init__(self, debug: bool) -> None:
        self.debug = debug
        self.json = False


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True,
              help=f"Also print the traceback of an error (or set {DEBUG_ENV}=1). Exit codes "
                   "stay the same.")
@click.version_option(package_name="shardplan")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """shardplan: automatic parallelization planner for training on GPU clusters."""
    ctx.obj = Context(debug)
