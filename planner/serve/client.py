"""The benchmark client that loads a serving deployment, and what it does to TTFT.

A measured TTFT is a property of the deployment *and* of the client that loaded it. The clients
of the published serving runs (``bench/data/inference_runs.yaml`` records each entry's, with its
source, under ``workload.client``):

* ``closed-loop``: a fixed number of requests in flight, a new one sent as soon as one finishes
  (aiperf / genai-perf ``--concurrency``, vLLM and SGLang ``benchmark_serving``
  ``--max-concurrency`` at an infinite request rate);
* ``offline``: every request queued at once, as many running as fit (``trtllm-bench
  throughput``, "fed requests at an infinite rate"): in the steady state a closed loop at the
  batch cap;
* ``poisson``: open loop, requests arriving at ``--request-rate`` with exponential gaps.

With fixed prompt and output lengths (length standard deviation 0, ``ignore_eos``) a closed
loop synchronises: requests admitted together produce the same number of tokens, finish
together and are replaced together, so they arrive together again and a request waits for the
prefill of those that arrive with it. Which share of the other requests in flight does is the
runtime's calibrated synchronisation fraction (``prefill_queue_fraction``: jitter, decode
tokens taking the prefill budget and the scheduler's admission order break groups apart).
Reading the groups as the runtime's admission groups of the start-up burst (``prefill budget /
isl`` whole prompts) fits the measured TTFT worse (docs/inference.md). Arrivals with random
gaps or a length standard deviation do not synchronise: only the M/D/1 waiting of
``planner.serve.evaluate`` remains. A client's lengths drawn in ``[ratio, 1] x`` the nominal
ones serve their mean (:meth:`BenchmarkClient.mean_tokens`).

A measurement that starts with all ``c`` requests sent at once (aiperf's profiling phase opens
at full concurrency once its warm-up phase has finished) also holds that start-up burst: its
requests wait on average for ``(c - 1) / 2`` prompts ahead, in one of its ``rounds`` (measured
requests / concurrency: 20 in aiconfigurator's harness).
"""
from __future__ import annotations

from dataclasses import dataclass

from planner.errors import invalid
from planner.safe_input import number

ARRIVALS = ("closed-loop", "offline", "poisson")
WHERE = "benchmark client"
MAX_TOKENS = 1e7  # a length standard deviation beyond any context window
MAX_ROUNDS = 1e6  # measured requests / concurrency


@dataclass(frozen=True)
class BenchmarkClient:
    """How requests reach the deployment: ``arrival`` (one of :data:`ARRIVALS`),
    ``length_stddev_tokens`` (0: fixed lengths), ``length_range_ratio`` (lengths
    uniform in ``[ratio, 1] x`` isl / osl, vLLM ``benchmark_serving --random-range-ratio``; 1:
    fixed), ``rounds`` (measured requests / concurrency;
    None: a long run, the steady state) and ``startup_burst`` (the measurement starts with all
    ``concurrency`` requests sent at once)."""

    arrival: str = "closed-loop"
    length_stddev_tokens: float = 0.0
    length_range_ratio: float = 1.0
    rounds: float | None = None
    startup_burst: bool = False

    def __post_init__(self) -> None:
        if self.arrival not in ARRIVALS:
            raise invalid(f"client arrival must be one of {', '.join(ARRIVALS)}, "
                          f"got {self.arrival!r}")
        number(self.length_stddev_tokens, WHERE, "length_stddev_tokens", minimum=0,
               maximum=MAX_TOKENS, allow_min=True)
        number(self.length_range_ratio, WHERE, "length_range_ratio", minimum=0, maximum=1)
        if self.rounds is not None:
            number(self.rounds, WHERE, "rounds", minimum=1, maximum=MAX_ROUNDS, allow_min=True)

    @property
    def synchronised(self) -> bool:
        """Whether arrivals come together (a closed loop or offline run without a length
        standard deviation). A ``length_range_ratio`` of 0.8 does not count as desynchronising:
        read so, the measured TTFT fits worse (docs/inference.md)."""
        return self.arrival != "poisson" and self.length_stddev_tokens == 0

    @property
    def join_iterations(self) -> float:
        """Iterations of the running batch a new request waits, on average, before the scheduler
        admits it. The runtimes take new requests at the start of an iteration only (SGLang
        ``Scheduler.event_loop_normal``: ``recv_requests``, ``process_input_requests``, then
        ``get_next_batch_to_run`` / ``run_batch``; vLLM ``EngineCore.run_busy_loop``: the input
        queue, then one ``step``; TensorRT-LLM ``PyExecutor._executor_loop``: new requests
        fetched, then one forward). A closed loop sends a request when another's last token
        comes back, i.e. at the end of an iteration, just as the engine starts the next: it
        waits about that whole iteration (1; the client's turnaround of about a millisecond
        neglected). Random (Poisson) arrivals land at a uniform point of one (1/2). An offline
        run's requests are queued already when a slot frees (0)."""
        return {"closed-loop": 1.0, "poisson": 0.5, "offline": 0.0}[self.arrival]

    def mean_tokens(self, tokens: int) -> int:
        """The mean of the client's lengths drawn for a nominal ``tokens`` (isl or osl)."""
        return max(1, round(tokens * (1 + self.length_range_ratio) / 2))


DEFAULT_CLIENT = BenchmarkClient()  # a long closed loop with fixed lengths: the steady state


def prompts_ahead(client: BenchmarkClient, in_flight: float, others: float,
                  fraction: float) -> float:
    """Mean number of other prompts whose prefill a new request waits for: ``fraction x
    others`` for a synchronised client (``others``: the other requests in flight that can
    arrive with it; ``fraction``: the runtime's calibrated share of them that does), 0 for
    one that does not synchronise; plus, synchronised or not, when the measurement starts
    with a burst of the ``in_flight`` requests, that burst's ``(in_flight - 1) / 2`` prompts in one of its
    ``rounds``. Never falls as ``in_flight`` or ``others`` grow."""
    ahead = fraction * max(others, 0.0) if client.synchronised else 0.0
    if client.startup_burst and client.rounds is not None:
        ahead += max(in_flight - 1.0, 0.0) / 2.0 / client.rounds
    return ahead
