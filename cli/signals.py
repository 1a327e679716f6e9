"""The process's one signal policy (the CLI owns the process; the library only cooperates).

* SIGINT (Ctrl-C), SIGTERM and SIGHUP raise :class:`planner.errors.Interrupted` in the main
  thread at any moment: during start-up (:mod:`cli.entry` installs this before importing the
  rest), during a CP-SAT solve (:mod:`planner.cpsat` switches CP-SAT's own handler off and stops
  the solver), between solves and while writing. :func:`cli.main.main` turns it into one line
  (``error: interrupted``) and exit 128 + signal (130, 143, 129). ``finally`` blocks run on the
  way up, so temporary files are removed and the previous output file is left as it was.
* :func:`deferred` holds signals back while an output file is committed (the link or rename and
  the removal of the temporary file): a signal arriving then is acted on right after. Once the
  output is committed (:func:`finish`), later signals are ignored: the command has done its work
  and only says so, so an interrupted run never leaves a new file behind an exit code of 130.
* :func:`deadline` bounds the wall time of a command (``plan --time-limit``): a watchdog thread
  sends SIGUSR1 to the main thread when the budget is spent, which raises
  :class:`planner.errors.DeadlineExceeded` (exit 3) wherever the command is, including inside
  code that does not check the time itself (loading, enumerating, the topology model).

Handlers are installed by :func:`policy` for the duration of one command and the previous ones
restored afterwards (tests call :func:`cli.main.main` in-process, many times).
"""
from __future__ import annotations

import contextlib
import signal
import threading
import time
from typing import Callable, Iterator

from planner.errors import DeadlineExceeded, Interrupted

STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP")
                     if hasattr(signal, name))
DEADLINE_SIGNAL = getattr(signal, "SIGUSR1", None)
STARTED = time.monotonic()  # process start-up, as near as this module is imported (cli.entry)


class _State:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.defer = 0
        self.pending: Callable[[], None] | None = None
        self.committed = False
        self.limit_s: float | None = None
        self.unacted: Callable[[], None] | None = None  # caught inside an import, re-sent soon
        self.stopping = False  # a stop was raised: later or re-sent signals change nothing


_state = _State()


def _raise_stop(signum: int) -> Callable[[], None]:
    def stop() -> None:
        raise Interrupted(signum)
    return stop


def _raise_deadline(limit_s: float) -> Callable[[], None]:
    def stop() -> None:
        raise DeadlineExceeded(limit_s)
    return stop


RETRY_S = 0.05


def _importing(frame) -> bool:
    """Whether the main thread is inside an import. An exception raised there can surface as
    another error (a C extension's "ImportError: initialization failed") or abort the process
    from C++ module initialisation, so the signal is acted on once the import is over."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _redeliver(signum: int) -> None:
    """Send ``signum`` to the main thread again shortly (after the import in progress)."""
    main_ident = threading.main_thread().ident
    timer = threading.Timer(RETRY_S, signal.pthread_kill, (main_ident, signum))
    timer.daemon = True
    timer.start()


def _run(action: Callable[[], None]) -> None:
    _state.unacted = None
    _state.stopping = True
    action()


def _act(action: Callable[[], None], signum: int, frame) -> None:
    if _state.committed or _state.stopping:
        return  # the output is complete, or the command is already stopping
    if _state.defer:
        if _state.pending is None:
            _state.pending = action
        return
    if _importing(frame):
        # remembered as well as re-sent: a command that ends before the re-sent signal
        # arrives must still stop (see act_on_unacted), not exit 0
        _state.unacted = action
        _redeliver(signum)
        return
    _run(action)


def act_on_unacted() -> None:
    """Act now on a signal that came during an import and has not been re-delivered yet."""
    if _state.unacted is not None and not (_state.committed or _state.stopping):
        _run(_state.unacted)


def _on_stop(signum, frame) -> None:
    _act(_raise_stop(signum), signum, frame)


def _on_deadline(signum, frame) -> None:
    if _state.limit_s is not None:
        _act(_raise_deadline(_state.limit_s), signum, frame)


def install() -> None:
    """Install the handlers (main thread only; elsewhere this is a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in STOP_SIGNALS:
        signal.signal(signum, _on_stop)
    if DEADLINE_SIGNAL is not None:
        signal.signal(DEADLINE_SIGNAL, _on_deadline)


@contextlib.contextmanager
def policy(final: bool = False) -> Iterator[None]:
    """The policy for one command; the previous handlers come back afterwards, unless
    ``final`` (the process exits next): then later signals are ignored, so that the exit code
    of a completed command is never replaced by a traceback."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    watched = STOP_SIGNALS + ((DEADLINE_SIGNAL,) if DEADLINE_SIGNAL is not None else ())
    previous = {signum: signal.getsignal(signum) for signum in watched}
    unacted = _state.unacted  # a signal caught in the imports before the command: kept
    _state.reset()
    _state.unacted = unacted
    install()
    try:
        yield
    finally:
        if final:
            finish()
        else:
            _state.reset()
            for signum, handler in previous.items():
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold signals back for a short critical step; act on one that came meanwhile after it."""
    act_on_unacted()  # before the step: an interrupted command commits nothing
    _state.defer += 1
    try:
        yield
    finally:
        _state.defer -= 1
        if not _state.defer and _state.pending is not None:
            action, _state.pending = _state.pending, None
            if not (_state.committed or _state.stopping):
                _run(action)


def finish() -> None:
    """The command's output is committed: from now on signals are ignored (see above)."""
    _state.committed = True
    _state.pending = None


@contextlib.contextmanager
def deadline(limit_s: float, slack_s: float) -> Iterator[None]:
    """Raise DeadlineExceeded(limit_s) in the main thread once ``limit_s + slack_s`` seconds
    have passed since :data:`STARTED`. Without SIGUSR1 (or off the main thread) it does
    nothing: the search's own deadline still applies."""
    if DEADLINE_SIGNAL is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    remaining = max(0.0, STARTED + limit_s + slack_s - time.monotonic())
    main_ident = threading.main_thread().ident
    cancelled = threading.Event()

    def watch() -> None:
        if not cancelled.wait(remaining):
            signal.pthread_kill(main_ident, DEADLINE_SIGNAL)

    _state.limit_s = limit_s
    watcher = threading.Thread(target=watch, name="deadline", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        cancelled.set()
        watcher.join()  # so that no SIGUSR1 can arrive after the handlers are restored
        _state.limit_s = None


def restart_clock() -> None:
    """Count the command's time from now (in-process callers run many commands)."""
    global STARTED
    STARTED = time.monotonic()
