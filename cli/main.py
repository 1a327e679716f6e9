"""The ``shardplan`` command line: a thin shell over the library.

Each command parses its options, makes one library call and renders: data on stdout (``--json``:
exactly one JSON document, errors included), people on stderr (rich tables, progress, warnings).
Exit codes come from :mod:`planner.errors` in one place (:func:`main`).
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any

import click

from planner.errors import ErrorKind, ExitCode, PlannerError

DEBUG_ENV = "SHARDPLAN_DEBUG"


def emit_json(document: Any) -> None:
    """Write one JSON document to stdout: sorted keys, stable formatting."""
    click.echo(json.dumps(document, sort_keys=True, indent=2, allow_nan=False))


class Context:
    def __init__(self, debug: bool) -> None:
        self.debug = debug
        self.json = False


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, envvar=DEBUG_ENV, help="Show tracebacks on errors.")
@click.version_option(package_name="shardplan")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """shardplan: automatic parallelization planner for training on GPU clusters."""
    ctx.obj = Context(debug)


def _wants_json(argv: list[str]) -> bool:
    return "--json" in argv


def _report(error: PlannerError, as_json: bool) -> None:
    if as_json:
        emit_json({"error": error.to_json()})
        return
    from cli.render import print_error

    print_error(error)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: run the group and map every outcome to an exit code."""
    from cli import commands  # noqa: F401  (registers the commands)
    from cli import verify_command  # noqa: F401  (registers `shardplan verify`)
    from cli import plan_commands  # noqa: F401  (schema, show, check, export)
    from cli import serve_commands

    serve_commands.install(cli)  # plan/evaluate --workload serve

    args = list(sys.argv[1:] if argv is None else argv)
    as_json = _wants_json(args)
    debug = "--debug" in args or os.environ.get(DEBUG_ENV, "").lower() in ("1", "true", "yes")
    try:
        # without standalone mode click returns ctx.exit(n)'s code instead of raising it
        result = cli.main(args=args, prog_name="shardplan", standalone_mode=False)
        code = result if isinstance(result, int) else ExitCode.OK
    except PlannerError as error:
        if debug:
            raise
        _report(error, as_json)
        code = error.exit_code
    except click.exceptions.Exit as done:
        code = done.exit_code
    except click.exceptions.Abort:
        _report(PlannerError(ErrorKind.INTERRUPTED, "interrupted"), as_json)
        code = ExitCode.INTERRUPTED
    except click.ClickException as error:
        if as_json:
            _report(PlannerError(ErrorKind.INVALID_INPUT, error.format_message()), True)
        else:
            error.show()
        code = ExitCode.INVALID_INPUT
    except KeyboardInterrupt:
        _report(PlannerError(ErrorKind.INTERRUPTED, "interrupted"), as_json)
        code = ExitCode.INTERRUPTED
    except BrokenPipeError:
        code = ExitCode.OK
    except Exception as error:  # a bug: say so plainly, keep the traceback for --debug
        if debug:
            raise
        _report(PlannerError(ErrorKind.INTERNAL, f"internal error: {type(error).__name__}: {error}",
                             ("re-run with --debug for the traceback and report it",)), as_json)
        code = ExitCode.INTERNAL
    sys.exit(int(code))
