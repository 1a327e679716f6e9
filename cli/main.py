"""The ``shardplan`` command line: a thin shell over the library.

Each command parses its options, makes one library call and renders: data on stdout (``--json``:
exactly one JSON document, errors included), people on stderr (rich tables, progress, warnings).
Importing this module gives the complete command group :data:`cli` (the commands are added
below, explicitly). :func:`main` runs one command and maps every outcome to an exit code, in this
one place (codes from :mod:`planner.errors`):

* a :class:`~planner.errors.PlannerError`: its kind's code (1, 2, 3);
* click's usage errors: 2, rendered like every other error (``error: ...`` and a hint);
* a signal (:mod:`cli.signals`): 130 (SIGINT), 143 (SIGTERM), 129 (SIGHUP);
* the command's wall-clock budget spent (``plan --time-limit``): 3;
* anything else is a bug: 4.

``--debug`` (or ``SHARDPLAN_DEBUG`` set to anything but empty, ``0``, ``false``, ``no``, ``off``)
adds the traceback on stderr; it never changes the exit code.
"""
from __future__ import annotations

import errno
import os
import sys
import traceback

import click

from cli import console as out
from cli import signals
from cli.app import DEBUG_ENV, cli, emit_json
from cli.commands import clusters_command, evaluate, inspect, models_command, plan
from cli.plan_commands import check, export, schema, show
from cli import serve_commands
from cli.report_commands import diff, report
from cli.verify_command import verify
from cli.replan_command import replan_command
from cli.pools_command import plan_pools
from cli.calibrate_command import calibrate
from planner.errors import DeadlineExceeded, ErrorKind, ExitCode, Interrupted, PlannerError

for _command in (evaluate, inspect, models_command, clusters_command, plan, schema, show, check,
                 export, verify, replan_command, report, diff, plan_pools, calibrate):
    cli.add_command(_command)
serve_commands.install(cli)  # plan / evaluate --workload serve (cli/serve_commands.py)

__all__ = ["cli", "main", "run", "emit_json"]

_SIGNAL_KINDS = {1: ErrorKind.HANGUP, 15: ErrorKind.TERMINATED}


def debug_from_env(environ=os.environ) -> bool:
    return environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


def _report(error: PlannerError, as_json: bool) -> None:
    if as_json and out.stdout_usable():
        try:
            emit_json({"error": error.to_json()})
            return
        except PlannerError:  # stdout failed too: say it on stderr
            pass
    out.print_error(error)


def _usage_error(error: click.ClickException) -> PlannerError:
    hints: tuple[str, ...] = ()
    ctx = getattr(error, "ctx", None)
    if ctx is not None and ctx.command.get_help_option(ctx) is not None:
        hints = (f"'{ctx.command_path} -h' shows the options",)
    return PlannerError(ErrorKind.INVALID_INPUT, error.format_message(), hints)


def run(argv: list[str] | None = None, *, started: float | None = None,
        final: bool = False) -> int:
    """Run one command; return its exit code (``final``: leave the signal policy in place, the
    process is about to exit)."""
    args = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in args
    debug = "--debug" in args or debug_from_env()
    if started is None:
        signals.restart_clock()
    else:
        signals.STARTED = started
    out.reset_stdout_state()
    with signals.policy(final=final):
        code = _invoke(args, as_json, debug)
        out.flush_stdout()
    return int(code)


def _invoke(args: list[str], as_json: bool, debug: bool) -> int:
    def fail(error: PlannerError) -> int:
        if debug:
            traceback.print_exc(file=sys.stderr)
        _report(error, as_json)
        return int(error.exit_code)

    try:
        with cli.make_context("shardplan", args) as ctx:
            result = cli.invoke(ctx)
        signals.act_on_unacted()  # a signal caught in an import the command outran
        return result if isinstance(result, int) else ExitCode.OK
    except PlannerError as error:
        return fail(error)
    except click.exceptions.Exit as done:
        return done.exit_code
    except click.exceptions.Abort:
        return fail(PlannerError(ErrorKind.INTERRUPTED, "interrupted"))
    except click.ClickException as error:
        return fail(_usage_error(error)) if error.exit_code else ExitCode.OK
    except Interrupted as stop:
        out.console.show_cursor(True)  # a progress display may have hidden it
        return fail(PlannerError(_SIGNAL_KINDS.get(stop.signum, ErrorKind.INTERRUPTED),
                                 stop.message))
    except KeyboardInterrupt:
        out.console.show_cursor(True)
        return fail(PlannerError(ErrorKind.INTERRUPTED, "interrupted"))
    except DeadlineExceeded as late:
        out.console.show_cursor(True)
        return fail(_deadline_error(late))
    except BrokenPipeError:  # a write outside cli.console: the reader went away
        return ExitCode.OK
    except OSError as error:
        if error.errno in (errno.ENOSPC, errno.EDQUOT):  # a write outside cli.console
            return fail(PlannerError(ErrorKind.OUTPUT, f"cannot write output: {error.strerror}"))
        return _internal(error, fail)
    except Exception as error:  # a bug: say so plainly, keep the traceback for --debug
        return _internal(error, fail)


def _deadline_error(late: DeadlineExceeded) -> PlannerError:
    return PlannerError(
        ErrorKind.SOLVER_LIMIT,
        f"the time limit of {late.limit_s:g} s ran out before the command finished",
        ("raise --time-limit", "pin some degrees with --pin to shrink the search"),
        {"time_limit_s": late.limit_s})


def _cause(error: BaseException) -> BaseException | None:
    """An interrupt or deadline that another error wraps (a C extension turns an exception
    raised during its import into ImportError, chained to it)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, (KeyboardInterrupt, DeadlineExceeded)):
            return error
        error = error.__cause__ or error.__context__
    return None


def _internal(error: Exception, fail) -> int:
    cause = _cause(error)
    if isinstance(cause, Interrupted):
        return fail(PlannerError(_SIGNAL_KINDS.get(cause.signum, ErrorKind.INTERRUPTED),
                                 cause.message))
    if isinstance(cause, KeyboardInterrupt):
        return fail(PlannerError(ErrorKind.INTERRUPTED, "interrupted"))
    if isinstance(cause, DeadlineExceeded):
        return fail(_deadline_error(cause))
    return fail(PlannerError(ErrorKind.INTERNAL, f"internal error: {type(error).__name__}: {error}",
                             ("re-run with --debug for the traceback and report it",)))


def main(argv: list[str] | None = None, *, started: float | None = None,
         final: bool = False) -> None:
    """Run one command and exit with its code (the console script is :func:`cli.entry.main`)."""
    sys.exit(run(argv, started=started, final=final))
