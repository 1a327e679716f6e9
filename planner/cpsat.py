"""Run a CP-SAT solve under the process's signal policy, never under CP-SAT's own.

By default ``CpSolver.solve`` installs a C++ SIGINT handler for the duration of the solve that
turns Ctrl-C into "stop as if the time limit was reached", and on return puts back the default
action instead of Python's handler. So Ctrl-C during a solve wrote a plan with exit 0, and
Ctrl-C between two solves killed the process with no message and no cleanup.

Here the solver's handler is switched off (``catch_sigint_signal = False``) and the solve runs in
a worker thread (it releases the GIL) while the calling thread waits in short, interruptible
steps. Whatever the waiting thread receives (a ``KeyboardInterrupt`` from Ctrl-C or SIGTERM, the
command's deadline) stops the search (``StopSearch`` is thread-safe) and is re-raised once the
solver has returned, so the caller's ``finally`` blocks run and the exit code says what happened.
"""
from __future__ import annotations

import threading
from typing import Any

POLL_S = 0.05


def solve(solver: Any, model: Any) -> Any:
    """``solver.solve(model)``, interruptible by the calling thread's exceptions."""
    solver.parameters.catch_sigint_signal = False
    began, cancelled, done = threading.Event(), threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}

    def work() -> None:
        began.set()
        try:
            if not cancelled.is_set():  # set before began was seen: never start the solve
                outcome["status"] = solver.solve(model)
        except BaseException as error:  # noqa: BLE001 - handed to the waiting thread
            outcome["error"] = error
        finally:
            done.set()

    worker = threading.Thread(target=work, name="cp-sat", daemon=True)
    try:
        worker.start()
        while not done.wait(POLL_S):
            pass
    except BaseException:
        _stop_and_join(solver, began, cancelled, done)
        raise
    if "error" in outcome:
        raise outcome["error"]
    return outcome["status"]


def _stop_and_join(solver: Any, began: threading.Event, cancelled: threading.Event,
                   done: threading.Event) -> None:
    """Stop the search and return only once no solve can run: the worker either has not begun
    (``cancelled`` is set first, so when it runs it skips the solve; ``began`` is set before it
    looks) or has returned. A second signal or the deadline arriving meanwhile is absorbed (the
    first exception is the one re-raised). The process must not exit while the solver's C++
    code runs in the worker thread: the C++ runtime then aborts at shutdown ("terminate called
    without an active exception", exit -6 instead of 128 + signal), as a signal landing while
    ``Thread.start`` waited for the worker did (tests/test_reliability_process.py)."""
    while True:
        try:
            cancelled.set()
            if not began.is_set():
                return
            solver.stop_search()  # within the solver's next check (< 1 s)
            if done.wait(POLL_S):
                return
        except BaseException:  # noqa: BLE001 - a later signal; the first one is re-raised
            continue
