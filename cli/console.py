"""The one place messages for people are rendered (stderr) and data is written (stdout).

Messages: rich renders on stderr with **markup, emoji codes and highlighting off** for every
string it is handed. File names, model names, YAML keys, preset names and the runtime's text are
not the program's, and ``[word]`` in them used to vanish and ``[/]`` to raise ``MarkupError``;
here a string is always literal text. Style is added only by the program, through
:func:`styled` (a ``rich.text.Text`` with a style). Control characters in text (an escape
sequence in a model name, a newline in a path) are shown escaped (``\\x1b``, ``\\n``), so no
input can move the cursor, recolour the terminal or forge a line. Error lines are never
wrapped: ``error: ...`` is one line however narrow the terminal, so ``grep error:`` finds it
(continuation lines the program writes start with two spaces).

Data: :func:`write_stdout` is the only writer of stdout. A full or otherwise failing stdout
(``> /dev/full``) is an output error (exit 2) that names stdout; a closed stdout (``>&-``) too,
instead of exit 0 with the data lost. A broken pipe (``| head -1``: the reader had what it
wanted) is not an error of the command: further output is dropped silently and the exit code
stays the command's own. A failing stderr is dropped the same way (there is nowhere left to
report it); the exit code still tells.
"""
from __future__ import annotations

import os
import re
import sys
from typing import Any

from rich.console import Console
from rich.text import Text

from cli import signals
from planner.errors import PlannerError, output_error

# C0 controls except tab and newline, DEL, C1 controls, and the Unicode line/paragraph
# separators and bidirectional overrides that reorder what a terminal shows.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
# A newline the program writes is followed by two spaces of indentation; any other is data.
_BARE_NEWLINE = re.compile(r"\n(?!  )")


def _escape(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def literal(text: Any) -> str:
    """``text`` as a str with control characters escaped (newlines and tabs kept)."""
    return _CONTROL.sub(_escape, str(text))


def one_line(text: Any) -> str:
    """``text`` with every control character escaped, newlines included."""
    return literal(text).replace("\n", "\\n").replace("\t", " ")


def message_text(text: Any) -> str:
    """A program message that may hold user text: newlines kept only where the program put
    them (followed by two spaces of indentation), every other one shown as ``\\n``."""
    return _BARE_NEWLINE.sub(r"\\n", literal(text))


class _Console(Console):
    """A Console for which every string is literal text, and whose failures are not fatal."""

    failed = False

    def render_str(self, text: str, **kwargs: Any) -> Text:  # every str a renderable holds
        kwargs.update(markup=False, emoji=False, highlight=False)
        return super().render_str(literal(text), **kwargs)

    def _check_buffer(self) -> None:
        try:
            super()._check_buffer()
        except OSError:  # stderr full or gone: nothing left to report to
            self._give_up()

    def on_broken_pipe(self) -> None:  # rich's default exits with status 1
        self._give_up()

    def _give_up(self) -> None:
        self.quiet = True
        self.failed = True
        del self._buffer[:]


console = _Console(stderr=True, markup=False, emoji=False, highlight=False)
if not console.is_terminal:  # piped or captured: do not squeeze tables into 80 columns
    console.width = 120


def styled(text: Any, style: str = "") -> Text:
    """Literal text with a style the program chose."""
    return Text(literal(text), style=style)


def line(*parts: Any) -> Text:
    """One line from literal strings and (text, style) pairs."""
    out = Text()
    for part in parts:
        if isinstance(part, tuple):
            out.append(literal(part[0]), style=part[1])
        elif isinstance(part, Text):
            out.append(part)
        else:
            out.append(literal(part))
    return out


def say(*parts: Any, wrap: bool = True) -> None:
    """Print one line for people (stderr); see :func:`line`."""
    console.print(line(*parts), soft_wrap=not wrap, highlight=False)


def print_error(error: PlannerError) -> None:
    """``error: message`` and ``  hint: ...`` lines, never wrapped."""
    console.print(line(("error", "bold red"), ": ", message_text(error.message)),
                  soft_wrap=True)
    for hint in error.hints:
        console.print(line("  ", ("hint", "yellow"), ": ", one_line(hint)), soft_wrap=True)


def print_warning(text: Any, prefix: str = "warning") -> None:
    console.print(line((prefix, "yellow"), ": ", message_text(text)), soft_wrap=True)


# -- stdout --------------------------------------------------------------------------------------

class _Stdout:
    closed_at_start = False  # fd 1 was closed when the process started (``>&-``)
    broken = False  # the reader went away (EPIPE): later output is dropped


def guard_standard_streams() -> None:
    """Give closed standard descriptors a /dev/null, so that no file the command opens lands on
    fd 0, 1 or 2, and remember that stdout was closed (every write to it is then an error)."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            if fd == 1:
                _Stdout.closed_at_start = True


def reset_stdout_state() -> None:
    _Stdout.broken = False
    console.quiet = False
    console.failed = False


def _silence_stdout() -> None:
    _Stdout.broken = True
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError, AttributeError):  # not a real file (captured in tests)
        pass


def write_stdout(text: str) -> None:
    """Write ``text`` to stdout and flush it (see the module docstring for failures)."""
    signals.act_on_unacted()  # a command interrupted before its output prints none of it
    if _Stdout.broken:
        return
    stream = sys.stdout
    if stream is None or _Stdout.closed_at_start:
        raise output_error("cannot write to stdout: it is closed",
                           "run the command with stdout open, or write to a file with -o FILE")
    try:
        stream.write(text)
        stream.flush()
    except BrokenPipeError:
        _silence_stdout()
    except OSError as error:
        _silence_stdout()  # a second attempt (the error document) would fail the same way
        raise output_error(f"cannot write to stdout: {error.strerror or error}",
                           "free space on the device stdout goes to, or write to a file with "
                           "-o FILE") from None
    except ValueError:  # "I/O operation on closed file"
        raise output_error("cannot write to stdout: it is closed") from None


def stdout_usable() -> bool:
    return not (_Stdout.broken or _Stdout.closed_at_start or sys.stdout is None)


def flush_stdout() -> None:
    """The final flush, before the exit code is set (a broken pipe is not an error)."""
    if _Stdout.broken or sys.stdout is None:
        return
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _silence_stdout()
    except (OSError, ValueError):
        _silence_stdout()
