"""The ``shardplan`` console script: the signal policy comes first, the imports after it.

Importing click, rich, OR-Tools (and through it pandas) takes a second or more; Ctrl-C or
SIGTERM then used to print a KeyboardInterrupt traceback (or die without a word). Here the
handlers are in place before anything heavy is imported, and the imports run inside the guard.
"""
import signal
import sys
import time

_STARTED = time.monotonic()


_EARLY: list[int] = []


def _early(signum, frame):  # noqa: ARG001 - until cli.signals is in place
    """Only remember the signal: raising inside the imports below can surface as another error
    (a half-built dataclass, a C extension's ImportError); it is acted on right after them."""
    _EARLY.append(signum)


for _name in ("SIGINT", "SIGTERM", "SIGHUP"):
    if hasattr(signal, _name):
        signal.signal(getattr(signal, _name), _early)


def main() -> None:
    try:
        from cli import signals

        signals.STARTED = _STARTED
        signals.install()
        if _EARLY:
            raise KeyboardInterrupt(_EARLY[0])
        from cli.console import guard_standard_streams

        guard_standard_streams()
        from cli.main import run

        code = run(started=_STARTED, final=True)
    except KeyboardInterrupt as stop:  # before run() had its own policy in place
        _quiet()
        signum = getattr(stop, "signum", None) or (stop.args[0] if stop.args and
                                                   isinstance(stop.args[0], int) else 2)
        code = 128 + signum
        word = {1: "hang-up", 15: "terminated"}.get(signum, "interrupted")
        try:
            sys.stderr.write(f"error: {word}\n")
            sys.stderr.flush()
        except (OSError, ValueError, AttributeError):
            pass
    _quiet()
    sys.exit(code)


def _quiet() -> None:
    """The outcome is decided: a late or re-delivered signal must not replace it."""
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)


if __name__ == "__main__":
    main()
