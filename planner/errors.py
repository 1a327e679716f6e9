"""One error model for the whole tool.

Every failure a user can cause or meet is a :class:`PlannerError` with a :class:`ErrorKind`.
The CLI maps kinds to exit codes in exactly one place (:func:`exit_code_for`), so scripts and CI
jobs can rely on them:

    0 ok · 1 does not fit / no feasible plan / check failed · 2 invalid input or usage
    3 solver limit reached without any plan · 4 internal error (a bug: please report it)
    130 interrupted (SIGINT, Ctrl-C) · 143 terminated (SIGTERM) · 129 hang-up (SIGHUP)

Two conditions are not errors of the work but of the process, and are raised from signal
handlers at any moment: :class:`Interrupted` (a signal asked the process to stop) and
:class:`DeadlineExceeded` (the command's wall-clock budget ran out). Both derive from
``BaseException``, so no ``except Exception`` on the way up can swallow them, and ``finally``
blocks (temporary files) still run.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Any


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1  # does not fit, no feasible plan, check failed
    INVALID_INPUT = 2
    SOLVER_LIMIT = 3
    INTERNAL = 4
    HANGUP = 129
    INTERRUPTED = 130
    TERMINATED = 143


class ErrorKind(str, Enum):
    INVALID_INPUT = "invalid_input"
    OUTPUT = "output_error"  # an output file or stdout cannot be written (full disk, closed)
    UNKNOWN_PRESET = "unknown_preset"
    UNSUPPORTED = "unsupported"
    DOES_NOT_FIT = "does_not_fit"
    INFEASIBLE = "infeasible"
    CHECK_FAILED = "check_failed"
    SOLVER_LIMIT = "solver_limit"
    INTERRUPTED = "interrupted"
    TERMINATED = "terminated"
    HANGUP = "hangup"
    INTERNAL = "internal"


_EXIT_CODES = {
    ErrorKind.INVALID_INPUT: ExitCode.INVALID_INPUT,
    ErrorKind.OUTPUT: ExitCode.INVALID_INPUT,
    ErrorKind.UNKNOWN_PRESET: ExitCode.INVALID_INPUT,
    ErrorKind.UNSUPPORTED: ExitCode.INVALID_INPUT,
    ErrorKind.DOES_NOT_FIT: ExitCode.FAILED,
    ErrorKind.INFEASIBLE: ExitCode.FAILED,
    ErrorKind.CHECK_FAILED: ExitCode.FAILED,
    ErrorKind.SOLVER_LIMIT: ExitCode.SOLVER_LIMIT,
    ErrorKind.INTERRUPTED: ExitCode.INTERRUPTED,
    ErrorKind.TERMINATED: ExitCode.TERMINATED,
    ErrorKind.HANGUP: ExitCode.HANGUP,
    ErrorKind.INTERNAL: ExitCode.INTERNAL,
}


class Interrupted(KeyboardInterrupt):
    """A signal (SIGINT, SIGTERM, SIGHUP) asked the process to stop; exit 128 + signal number.

    A ``KeyboardInterrupt`` so that library code and third-party code treat it as Ctrl-C."""

    def __init__(self, signum: int = 2) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    @property
    def message(self) -> str:
        return {1: "hang-up", 15: "terminated"}.get(self.signum, "interrupted")


class DeadlineExceeded(BaseException):
    """The command's wall-clock budget (``--time-limit`` plus the stated slack) ran out."""

    def __init__(self, limit_s: float) -> None:
        super().__init__(limit_s)
        self.limit_s = limit_s


def exit_code_for(kind: ErrorKind) -> ExitCode:
    return _EXIT_CODES[kind]


@dataclass
class PlannerError(Exception):
    """A failure with a kind, a message that says what failed, and hints on what to try.

    ``details`` carries machine-readable numbers (emitted under ``error.details`` in ``--json``
    mode); ``hints`` are short sentences, each a concrete thing to try.
    """

    kind: ErrorKind
    message: str
    hints: tuple[str, ...] = ()
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message

    @property
    def exit_code(self) -> ExitCode:
        return exit_code_for(self.kind)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "message": self.message,
            "hints": list(self.hints),
            "details": self.details,
            "exit_code": int(self.exit_code),
        }


def invalid(message: str, *hints: str, **details: Any) -> PlannerError:
    return PlannerError(ErrorKind.INVALID_INPUT, message, tuple(hints), dict(details))


def output_error(message: str, *hints: str, **details: Any) -> PlannerError:
    """An output that cannot be written: exit 2 like bad input, kind ``output_error``."""
    return PlannerError(ErrorKind.OUTPUT, message, tuple(hints), dict(details))
