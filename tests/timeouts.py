"""A SIGALRM deadline for tests that run CLI commands in-process: a hang fails the test
instead of hanging the suite."""
from __future__ import annotations

import contextlib
import signal


class Hang(BaseException):
    """Raised by the alarm in :func:`deadline`; not an Exception, so main() cannot swallow it."""


@contextlib.contextmanager
def deadline(seconds: float):
    """Fail a run that hangs instead of hanging the test suite (valid runs here take < 1 s)."""
    def ring(signum, frame):
        raise Hang(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
