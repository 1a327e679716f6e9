"""The process launcher of a verification run: ``world_size`` CPU processes (forkserver where
available, gloo on 127.0.0.1 and a free port), a deadline, and the per-rank results or the first
rank's exception. Only the processes it started are ever stopped, by handle.
"""
from __future__ import annotations

import json
import multiprocessing
import socket
import tempfile
import time
from pathlib import Path


from planner.runtime.worker import _worker


DEFAULT_TIMEOUT_S = 600.0


class RunFailed(Exception):
    def __init__(self, message: str, traceback_text: str = "") -> None:
        super().__init__(message)
        self.traceback_text = traceback_text


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_PRELOAD = ["planner.runtime.worker"]


def _start_method() -> str:
    """forkserver where available: workers fork from a server that imported torch once
    (importing it in each of 8 processes costs more than the training steps); spawn else."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        multiprocessing.set_forkserver_preload(_PRELOAD)
        return "forkserver"
    return "spawn"


def _stop(processes) -> None:
    """Terminate our worker processes (only these, by handle), then kill what remains."""
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(timeout=5)
        if process.is_alive():
            process.kill()
            process.join(timeout=5)


def run_distributed(job: dict, world_size: int, timeout_s: float = DEFAULT_TIMEOUT_S
                    ) -> list[dict]:
    """Run ``_worker`` on ``world_size`` processes; the per-rank result dicts, by rank."""
    import torch.multiprocessing as tmp

    method = _start_method()
    for attempt in range(3):
        with tempfile.TemporaryDirectory(prefix="shardplan-verify-") as outdir:
            run = {**job, "outdir": outdir, "port": free_port(), "world_size": world_size,
                   "timeout_s": max(30.0, timeout_s)}
            context = tmp.start_processes(_worker, args=(run,), nprocs=world_size, join=False,
                                          start_method=method)
            deadline = time.monotonic() + timeout_s
            failure: Exception | None = None
            try:
                while not context.join(timeout=0.5):
                    if time.monotonic() > deadline:
                        _stop(context.processes)
                        raise RunFailed(f"the distributed run did not finish in {timeout_s:g} s")
            except (tmp.ProcessRaisedException, tmp.ProcessExitedException) as error:
                failure = error
            errors = sorted(Path(outdir).glob("rank*.error.json"))
            if failure is not None or errors:
                if errors:
                    first = json.loads(errors[0].read_text())
                    message, text = first["error"], first["traceback"]
                else:
                    message, text = str(failure).strip().splitlines()[-1], str(failure)
                if "address already in use" in message.lower() and attempt < 2:
                    continue
                raise RunFailed(message, text)
            return [json.loads((Path(outdir) / f"rank{r}.json").read_text())
                    for r in range(world_size)]
    raise RunFailed("could not start the process group")  # pragma: no cover
