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
    done = threading.Event()
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["status"] = solver.solve(model)
        except BaseException as error:  # noqa: BLE001 - handed to the waiting thread
            outcome["error"] = error
        finally:
            done.set()

    worker = threading.Thread(target=work, name="cp-sat", daemon=True)
    worker.start()
    try:
        while not done.wait(POLL_S):
            pass
    except BaseException:
        solver.stop_search()
        while not done.wait(POLL_S):  # the solver stops within its next check (< 1 s)
            solver.stop_search()
        raise
    if "error" in outcome:
        raise outcome["error"]
    return outcome["status"]
