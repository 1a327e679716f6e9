"""Evaluate one serving deployment: TTFT, TPOT, output tokens/s per GPU and per user, the KV
cache and the largest batch that fits.

Consumes a ModelGraph, a Cluster, a :class:`ServingWorkload` and a :class:`ServingConfig`;
produces a :class:`ServingEvaluation`. Steady state of continuous (in-flight) batching:

* **Aggregated**: a worker runs ``b = min(concurrency per replica, batch cap, KV capacity)``
  sequences (the caps each attention-DP rank's, :func:`worker_batch`). Each finishes after
  ``osl`` steps and is replaced by a request with ``isl`` prompt tokens, so the iterations
  carry on average ``b x isl / osl`` prefill tokens next to their ``b`` decode tokens, as
  whole prompts or chunks (:func:`mean_iteration`; the iteration token budget
  ``max_num_tokens`` caps it: at most ``max_num_tokens / (1 + isl/osl)`` sequences can
  be kept decoding). TPOT is the mean iteration's time, throughput ``b / TPOT`` per worker. TTFT is the request's own prefill
  (``ceil(isl / chunk)`` iterations), plus the marginal prefill time of the requests ahead of it
  (a calibrated fraction of the other concurrent requests: fixed-length closed-loop clients
  arrive in bursts; the benchmark client's start-up burst, :mod:`planner.serve.client`), plus waiting for a free slot when concurrency exceeds the batch.
  With data-parallel attention each rank carries its own requests' whole prompts and the
  iteration takes the busiest rank's time (:func:`prompt_tokens`, the prefill pass's rule);
  the prompts ahead run a pass of one on each rank at a time (:func:`prefill_burst`).
* **Disaggregated**: decode workers hold ``concurrency / decode_workers`` sequences each (TPOT
  = a pure decode iteration); prefill workers run passes of ``prefill_batch`` prompts on each
  attention-DP rank (:func:`prefill_prompts`); TTFT =
  prefill + KV transfer to the decode worker (KV bytes over the inter-worker link) + queueing
  (the same burst term, plus M/D/1 waiting at the prefill pool's utilisation). Request rate =
  ``concurrency / (TTFT + (osl - 1) x TPOT)`` (closed loop), capped by each pool's capacity.
  A request holds a decode slot from its admission (Dynamo's TensorRT-LLM disaggregated flow
  sends it to the decode worker first, which admits it before its remote prefill: ai-dynamo
  enhancements DEP "Prefill->Decode Disaggregated Workflow for TensorRT-LLM"), so with fewer
  slots than requests in flight (``decode_workers x batch cap``) the rest wait for one:
  ``(concurrency - slots) / request rate`` is added to TTFT (Little's law on the waiting line).
* Open loop (``request_rate``): the concurrency that rate implies (Little's law) is found by
  fixed-point iteration; a rate above the deployment's capacity does not fit.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from planner.topology import group_link
from planner.cost import comm
from functools import lru_cache

from planner.errors import PlannerError, invalid
from planner.hardware import Cluster
from planner.ir import LayerKind, ModelGraph
from planner.serve._cache import Ident
from planner.serve.client import prompts_ahead
from planner.serve.memory import ServingMemory, serving_memory
from planner.serve.phases import Calibration, IterationTime, iteration_time
from planner.serve.runtime import CALIBRATED, DEFAULT_RUNTIME, ServingRuntime, runtime
from planner.serve.workload import ServingConfig, ServingWorkload, WorkerConfig

MAX_FIXED_POINT_ITERATIONS = 60


@dataclass(frozen=True)
class PoolResult:
    """One kind of worker of a deployment (the only one when aggregated)."""

    role: str  # aggregated | prefill | decode
    worker: WorkerConfig
    workers: int
    memory: ServingMemory
    max_batch: int  # sequences (prompts for prefill) one worker can hold
    batch: int  # sequences one worker runs in the steady state
    iteration: IterationTime

    def as_dict(self) -> dict:
        return {"role": self.role, **self.worker.as_dict(), "workers": self.workers,
                "memory": self.memory.as_dict(), "max_batch": self.max_batch,
                "batch": self.batch, "iteration": self.iteration.as_dict()}


@dataclass(frozen=True)
class ServingEvaluation:
    model: ModelGraph
    cluster: Cluster
    workload: ServingWorkload
    config: ServingConfig
    runtime: str
    pools: tuple[PoolResult, ...]
    ttft_s: float
    tpot_s: float
    output_tokens_per_s: float  # whole deployment
    concurrency: float  # requests in flight in the steady state
    max_concurrency: int  # the most requests the deployment holds at once
    fits: bool
    problems: tuple[str, ...] = field(default=())
    kv_transfer_s: float = 0.0

    @property
    def num_gpus(self) -> int:
        return self.config.num_gpus

    @property
    def output_tokens_per_s_per_gpu(self) -> float:
        return self.output_tokens_per_s / self.num_gpus

    @property
    def output_tokens_per_s_per_user(self) -> float:
        return 1.0 / self.tpot_s if self.tpot_s > 0 else 0.0

    @property
    def kv_cache_gib(self) -> float:
        """KV-cache memory per GPU (of the decode pool when disaggregated)."""
        return self.pools[-1].memory.kv_cache_gib

    def meets_targets(self) -> bool:
        w = self.workload
        if not self.fits:
            return False
        if w.ttft_ms is not None and self.ttft_s * 1e3 > w.ttft_ms:
            return False
        return not (w.tpot_ms is not None and self.tpot_s * 1e3 > w.tpot_ms)

    def predicted(self) -> dict:
        """The ``predicted`` block of ``evaluate --json`` (names fixed by the CLI contract)."""
        def finite(x: float) -> float | None:
            return x if math.isfinite(x) else None

        return {"output_tokens_per_s_per_gpu": self.output_tokens_per_s_per_gpu,
                "output_tokens_per_s_per_user": self.output_tokens_per_s_per_user,
                "output_tokens_per_s": self.output_tokens_per_s,
                "ttft_ms": finite(self.ttft_s * 1e3), "tpot_ms": finite(self.tpot_s * 1e3),
                "max_concurrency": self.max_concurrency, "concurrency": finite(self.concurrency),
                "kv_cache_gib": self.kv_cache_gib, "kv_transfer_ms": self.kv_transfer_s * 1e3,
                "fits": self.fits, "meets_targets": self.meets_targets(),
                "num_gpus": self.num_gpus}


def validate_worker(model: ModelGraph, worker: WorkerConfig, what: str = "worker") -> None:
    """Degrees the runtimes accept: tp divides the heads, and the KV heads divide tp or tp
    divides them; ep divides the experts; pp at most the blocks."""
    error = _worker_error(Ident(model), worker)
    if error:
        raise invalid(f"{what}: {error}")


@lru_cache(maxsize=65536)
def _worker_error(model_key, worker: WorkerConfig) -> str | None:
    try:
        _validate_worker(model_key.obj, worker)
    except PlannerError as error:
        return error.message
    return None


def _validate_worker(model: ModelGraph, worker: WorkerConfig, what: str = "worker") -> None:
    blocks = [cls.layer for cls in model.layer_classes() if cls.layer.kind is LayerKind.BLOCK]
    num_blocks = model.num_blocks
    for layer in blocks:
        att = layer.attention
        if att is not None:
            if att.num_heads % worker.tp:
                raise invalid(f"tp={worker.tp} does not divide the {att.num_heads} "
                              f"attention heads")
            kv = att.num_kv_heads
            if not att.is_mla and kv % worker.tp and worker.tp % kv:
                raise invalid(f"tp={worker.tp} and the {kv} KV heads: one must divide "
                              f"the other")
        mlp = layer.mlp
        if mlp is not None and mlp.is_moe:
            if mlp.num_experts % worker.ep:
                raise invalid(f"ep={worker.ep} does not divide the {mlp.num_experts} "
                              f"experts")
            if mlp.ffn_hidden % worker.moe_tp:
                raise invalid(f"expert tensor parallelism {worker.moe_tp} does not "
                              f"divide the expert width {mlp.ffn_hidden}")
    if not model.is_moe and worker.ep > 1:
        raise invalid(f"ep={worker.ep} needs a mixture-of-experts model")
    if worker.pp > num_blocks:
        raise invalid(f"pp={worker.pp} is more than the {num_blocks} blocks")


def _pool_memory(model, cluster, workload, worker, rt, config, rank_batch, decode=True):
    """``rank_batch``: the sequences one attention-DP rank holds (its logits buffer)."""
    context = workload.isl + workload.osl / 2
    return serving_memory(model, cluster.gpu, worker, workload.dtype, workload.kv_cache_dtype, rt,
                          config.max_num_tokens, rank_batch, context,
                          draft_layers=_draft_layers(model, workload) if decode else 0)


def _draft_layers(model: ModelGraph, workload: ServingWorkload) -> int:
    """MTP blocks speculative decoding loads (the model's own; 0 when off)."""
    return mtp_layers(model) if workload.draft_tokens else 0


def mtp_layers(model: ModelGraph) -> int:
    """The model's multi-token-prediction blocks (Hugging Face ``num_nextn_predict_layers``)."""
    value = dict(model.metadata).get("mtp_layers", "0")
    return int(value) if str(value).isdigit() else 0


def _capacity(memory: ServingMemory, worker: WorkerConfig, tokens_per_seq: int,
              rt: ServingRuntime) -> int:
    return memory.max_sequences(tokens_per_seq, rt.kv_block_tokens) * worker.attention_dp


def worker_batch(worker: WorkerConfig, batch: int, *rank_caps: int) -> int:
    """The most sequences a worker holds at a batch cap of ``batch``: each attention-DP rank
    admits ``worker.rank_batch(batch)`` (the cap the exports write per rank) and at most each
    of ``rank_caps`` (one rank's KV capacity, the sequences its own token budget keeps fed);
    the worker, ``attention_dp`` times that. One attention-DP rank: ``min(batch, caps)``."""
    return worker.attention_dp * min(worker.rank_batch(batch), *rank_caps)


def evaluate_serving(model: ModelGraph, cluster: Cluster, workload: ServingWorkload,
                     config: ServingConfig, runtime_name: str = DEFAULT_RUNTIME,
                     calibration: Calibration | None = None) -> ServingEvaluation:
    calib = calibration or Calibration.from_mapping(CALIBRATED)
    rt = runtime(runtime_name)
    if workload.dtype not in cluster.gpu.peak_tflops and workload.dtype != "bf16":
        raise invalid(f"GPU {cluster.gpu.name} has no {workload.dtype} tensor cores",
                      "use --dtype bf16" + (" or fp8" if "fp8" in cluster.gpu.peak_tflops else ""))
    if workload.draft_tokens and not mtp_layers(model):
        raise invalid(f"--speculative mtp needs a model with a multi-token-prediction module; "
                      f"{model.name} has none (num_nextn_predict_layers = 0)")
    if config.num_gpus > cluster.num_gpus:
        raise invalid(f"the deployment needs {config.num_gpus} GPUs; the cluster has "
                      f"{cluster.num_gpus}", "pass --nodes or fewer replicas/workers")
    if config.mode == "aggregated":
        validate_worker(model, config.worker)
        return _aggregated(model, cluster, workload, config, rt, calib)
    validate_worker(model, config.prefill, "prefill worker")
    validate_worker(model, config.decode, "decode worker")
    return _disaggregated(model, cluster, workload, config, rt, calib)


def _aggregated(model, cluster, workload, config, rt, calib) -> ServingEvaluation:
    w, isl, osl = config.worker, workload.isl, workload.osl
    tps, width = workload.tokens_per_step, 1 + workload.draft_tokens
    steps = osl / tps  # decode iterations per request
    memory = _pool_memory(model, cluster, workload, w, rt, config, w.rank_batch(config.batch))
    held = isl + osl if rt.reserve_full_sequence else isl + math.ceil(osl / 2)
    capacity = _capacity(memory, w, held, rt)
    # the iteration token budget (each attention-DP rank's own) bounds how many sequences
    # prefill can keep fed on a rank
    budget = max(1, int(config.max_num_tokens / (width + isl / steps)))
    max_batch = worker_batch(w, config.batch, capacity // w.attention_dp, budget)
    problems = []
    if capacity < 1:
        problems.append("the weights leave no room for one sequence's KV cache"
                        if memory.kv_budget_bytes <= 0 else
                        f"the KV cache holds {memory.kv_cache_gib:.2f} GiB, less than one "
                        f"sequence of {held} tokens")
    if config.max_num_tokens < min(isl, 1) or problems:
        return _not_fitting(model, cluster, workload, config, rt, memory, capacity, problems)

    step = _stepper(model, cluster, workload, config, calib, rt.name)
    join = workload.client.join_iterations
    ranks = prefill_prompts(w)  # prompts of one pass: a whole prompt on each attention-DP rank

    def at(c: float) -> tuple[float, float, float, IterationTime]:
        b = min(c, max_batch)
        chunk = _chunk(config, b, width)
        it, tpot = _decode_terms(step, calib.interference(rt.name), b, isl, steps, tps, chunk,
                                 ranks)
        chunks = math.ceil(isl / chunk)
        own = chunks * step(b, min(isl, chunk), min(isl, chunk)).total_s  # on its own rank
        marginal = _pass_s(step, b, isl, ranks)
        waiting = max(c - b, 0.0)
        slot_wait = waiting * steps * it.total_s / b
        # steady state: arrivals at b / (steps x step) per second, a pass of `marginal`
        # prefilling `ranks` of them: M/D/1 waiting at that utilisation, plus the wait for the
        # running iteration to end before the scheduler admits it (the client's join_iterations)
        rho = min(b / (steps * it.total_s) * marginal / ranks, 0.95)
        steady = join * it.total_s + rho / (2 * (1 - rho)) * marginal
        # the prompts arriving with this one (planner.serve.client), `ranks` a pass
        burst = prefill_burst(calib, rt.name, workload.client, min(c, b), 1, ranks) * marginal
        ttft = own + steady + burst + slot_wait
        return b, ttft, tpot, it

    replicas = config.replicas
    if workload.concurrency is not None:
        c = workload.concurrency / replicas
    elif workload.request_rate_per_s is not None:
        c = _concurrency_for_rate(workload.request_rate_per_s / replicas, osl, at)
        if c is None:
            problems.append(f"a request rate of {workload.request_rate_per_s:g}/s exceeds the "
                            f"deployment's capacity")
            c = float(max_batch)
    else:
        c = float(max_batch)
    b, ttft, tpot, it = at(c)
    pool = PoolResult("aggregated", w, replicas, memory, max_batch, math.ceil(b), it)
    return ServingEvaluation(model, cluster, workload, config, rt.name, (pool,), ttft, tpot,
                             replicas * b * tps / it.total_s, c * replicas,
                             max_batch * replicas, not problems, tuple(problems))


def prompt_tokens(tokens: float, isl: int, chunk: int, ranks: int = 1) -> tuple[float, float]:
    """(the worker's, its busiest attention-DP rank's) prompt tokens of an iteration that
    carries prefill, when the iterations carry ``tokens`` prompt tokens on average over the
    worker's ``ranks`` attention-DP ranks (:func:`prefill_prompts` of one pass). The rule of
    the prefill pass: a request lives on one rank (its KV cache is there), which prefills its
    prompt whole, or in chunks of its own budget ``chunk`` when longer; the ranks step together
    and the iteration takes the busiest rank's time. A rank's prompt-carrying iteration carries
    ``max(tokens / ranks, min(isl, chunk))`` tokens; the worker's, at least that and at least
    the average (prompts on several ranks at once). One rank: ``max(tokens, min(isl, chunk))``
    both."""
    rank = max(tokens / ranks, min(isl, chunk))
    return max(tokens, rank), rank


def _pass_s(step, b: float, isl: int, ranks: int) -> float:
    """Seconds a pass of ``ranks`` whole prompts (one on each attention-DP rank) adds to an
    iteration of ``b`` decoding sequences: what each pass of prompts queued ahead costs."""
    return max(step(b, ranks * isl, isl).total_s - step(b, 0.0).total_s, 0.0)


def _mixed(step, b: float, prompt: tuple[float, float], f: float) -> IterationTime:
    """``f x step(b, *prompt) + (1 - f) x step(b, 0)``, term by term (``prompt``: the worker's
    and its busiest rank's prompt tokens)."""
    if f <= 0 or prompt[0] <= 0:
        return step(b, 0.0)
    mixed = step(b, *prompt)
    if f >= 1.0:
        return mixed
    pure = step(b, 0.0)
    fields = ("gemm_s", "attention_s", "comm_s", "overhead_s", "host_s")
    return IterationTime(*(f * getattr(mixed, k) + (1.0 - f) * getattr(pure, k)
                           for k in fields))


def mean_iteration(step, b: float, isl: int, steps: float, chunk: int,
                   ranks: int = 1) -> IterationTime:
    """The mean steady-state iteration of an aggregated worker running ``b`` sequences on
    ``ranks`` attention-DP ranks (``step(b, worker's prompt tokens, busiest rank's)``).

    Prompts arrive at ``lam = b / steps`` per iteration (each finished sequence is replaced)
    and are scheduled whole, or in chunks of ``chunk`` tokens when longer (chunked prefill),
    each on its request's rank (:func:`prompt_tokens`): an iteration that carries prefill
    carries ``P = max(lam x isl, P_rank)`` prompt tokens, ``P_rank = max(lam x isl / ranks,
    min(isl, chunk))`` of them on the busiest rank, and a fraction ``f = lam x isl / P`` of
    the iterations carry them (the others are pure decode): the mean is ``f x step(b, P,
    P_rank) + (1 - f) x step(b, 0)``. With a prompt or more per iteration on each rank every
    iteration carries ``lam x isl`` tokens. Not the average tokens spread over every
    iteration: a GEMM of ``b + P`` rows is tiled as such (``planner.cost.compute``), and ``b +
    lam x isl`` rows never run when ``lam < 1``; nor a prompt split over the ranks."""
    tokens = b * isl / steps
    prompt = prompt_tokens(tokens, isl, chunk, ranks)
    return _mixed(step, b, prompt, tokens / prompt[0] if prompt[0] > 0 else 0.0)


def mean_iteration_bounds(step, lo: float, hi: float, isl: int, steps: float, chunk_lo: int,
                          chunk_hi: int, ranks: int = 1) -> tuple[IterationTime, IterationTime]:
    """(lower, upper) bounds on :func:`mean_iteration` at every batch ``lo .. hi`` (chunks
    ``chunk_lo >= chunk_hi`` at the ends), equal to it when ``lo == hi``: a step does not
    fall with its decode sequences or prompt tokens (the worker's or its busiest rank's), the
    prompt tokens do not fall with the average nor the chunk, and the mean is the blend of
    two steps that grows with the share ``f`` of the larger one."""
    t_lo, t_hi = lo * isl / steps, hi * isl / steps
    p_min = prompt_tokens(t_lo, isl, chunk_hi, ranks)
    p_max = prompt_tokens(t_hi, isl, chunk_lo, ranks)
    lower = _mixed(step, lo, p_min, min(1.0, t_lo / p_max[0]) if p_max[0] > 0 else 0.0)
    upper = _mixed(step, hi, p_max, min(1.0, t_hi / p_min[0]) if p_min[0] > 0 else 0.0)
    return lower, upper


def _decode_terms(step, interference: float, b: float, isl: int, steps: float,
                  tps: float, chunk: int, ranks: int = 1) -> tuple[IterationTime, float]:
    """(the mean steady-state iteration, TPOT) of an aggregated worker running ``b``
    sequences (:func:`mean_iteration`); TPOT is the pure decode step plus the runtime's
    interference share of the prefill work the iterations carry."""
    it = mean_iteration(step, b, isl, steps, chunk, ranks)
    pure = step(b, 0.0).total_s
    return it, (pure + interference * (it.total_s - pure)) / tps


def aggregated_rates(model: ModelGraph, cluster: Cluster, workload: ServingWorkload,
                     config: ServingConfig, b: int, runtime_name: str = DEFAULT_RUNTIME,
                     calibration: Calibration | None = None) -> tuple[float, float]:
    """(output tokens/s per user, per GPU) of an aggregated deployment whose workers each run
    ``b`` sequences: the values :func:`evaluate_serving` gives at a concurrency of ``b x
    replicas`` when ``b`` is at most its largest batch (the same terms, bit for bit), without
    its memory and TTFT terms; what the Pareto search prunes on."""
    calib = calibration or Calibration.from_mapping(CALIBRATED)
    rt = runtime(runtime_name)
    tps = workload.tokens_per_step
    steps = workload.osl / tps

    step = _stepper(model, cluster, workload, config, calib, rt.name)
    c = float(b * config.replicas) / config.replicas  # as _aggregated derives it
    it, tpot = _decode_terms(step, calib.interference(rt.name), c, workload.isl, steps, tps,
                             _chunk(config, c, 1 + workload.draft_tokens),
                             prefill_prompts(config.worker))
    user = 1.0 / tpot if tpot > 0 else 0.0
    return user, config.replicas * c * tps / it.total_s / config.num_gpus


def _step(model, cluster, workload, w, calib, runtime_name, b, prefill,
          capture: tuple[int, ...] = (), rank: float | None = None) -> IterationTime:
    """One aggregated iteration: ``b`` decoding sequences and ``prefill`` prompt tokens,
    ``rank`` of them on the busiest attention-DP rank (None: spread evenly; ``capture``: the
    deployment's piecewise-captured token counts)."""
    isl = workload.isl
    return iteration_time(model, cluster, w, workload.dtype, workload.kv_cache_dtype, calib,
                          decode_seqs=b, context=isl + workload.osl / 2, prefill_tokens=prefill,
                          prefill_isl=isl, prefill_requests=prefill / isl,
                          runtime=runtime_name, draft_tokens=workload.draft_tokens,
                          capture_num_tokens=capture, prefill_rank_tokens=rank)


def _stepper(model, cluster, workload, config: ServingConfig, calib,
             runtime_name: str) -> Callable[..., IterationTime]:
    """``step(b, prefill, rank=None)``: :func:`_step` of ``config``'s aggregated worker with
    the deployment's piecewise-captured token counts (the one place that reads them)."""
    w, capture = config.worker, config.prefill_capture_num_tokens

    def step(b: float, prefill: float, rank: float | None = None) -> IterationTime:
        return _step(model, cluster, workload, w, calib, runtime_name, b, prefill, capture,
                     rank)

    return step


def _chunk(config: ServingConfig, b: float, width: int) -> int:
    """Prompt tokens one iteration takes on an attention-DP rank next to its share of ``b``
    decoding sequences (chunked prefill; each rank schedules its own requests under its own
    budget, as in :func:`prefill_pass`)."""
    ranks = config.worker.attention_dp
    return max(config.max_num_tokens - math.ceil(b / ranks * width), 1)


def aggregated_ttft_bound_s(model: ModelGraph, cluster: Cluster, workload: ServingWorkload,
                            config: ServingConfig, lo: int, hi: int,
                            runtime_name: str = DEFAULT_RUNTIME,
                            calibration: Calibration | None = None) -> float:
    """A lower bound on the aggregated TTFT at every batch ``lo .. hi`` when the concurrency
    per worker equals the batch (what the search tries), from the terms of ``_aggregated`` at
    the interval's ends: each term is non-decreasing in the iteration times, and an iteration
    time does not decrease with its decode sequences or prompt tokens (checked in
    ``tests/test_serve_search.py``). Own prefill >= ceil(isl / chunk(lo)) iterations of at
    least step(lo, min(isl, chunk(hi))); joining the batch >= the client's join_iterations x
    the mean iteration's lower bound (:func:`mean_iteration_bounds`); the marginal prefill
    time >= step(lo, isl) - step(hi, 0); the request rate >= lo / (steps x the mean
    iteration's upper bound)."""
    calib = calibration or Calibration.from_mapping(CALIBRATED)
    rt = runtime(runtime_name)
    isl = workload.isl
    tps, width = workload.tokens_per_step, 1 + workload.draft_tokens
    steps = workload.osl / tps
    it_step = _stepper(model, cluster, workload, config, calib, rt.name)
    ranks = prefill_prompts(config.worker)

    def step(b: float, prefill: float, rank: float | None = None) -> float:
        return it_step(b, prefill, rank).total_s

    lower, upper = mean_iteration_bounds(it_step, lo, hi, isl, steps, _chunk(config, lo, width),
                                         _chunk(config, hi, width), ranks)
    it_lo, it_hi = lower.total_s, upper.total_s
    first = min(isl, _chunk(config, hi, width))
    own = math.ceil(isl / _chunk(config, lo, width)) * step(lo, first, first)
    marginal = max(step(lo, ranks * isl, isl) - step(hi, 0.0), 0.0)
    rho = min(lo / (steps * it_hi) * marginal / ranks, 0.95)
    steady = workload.client.join_iterations * it_lo + rho / (2 * (1 - rho)) * marginal
    burst = prefill_burst(calib, rt.name, workload.client, lo, 1, ranks) * marginal
    return own + steady + burst


def _concurrency_for_rate(rate: float, osl: int, at) -> float | None:
    """Little's law: concurrency = rate x (TTFT + (osl - 1) TPOT), by fixed-point iteration."""
    c = 1.0
    for _ in range(MAX_FIXED_POINT_ITERATIONS):
        b, ttft, tpot, _ = at(c)
        if rate * osl * tpot / max(b, 1e-9) >= 1.0 and c >= b:  # slots cannot keep up
            return None
        new = rate * (ttft + (osl - 1) * tpot)
        if abs(new - c) <= 1e-3 * max(c, 1.0):
            return max(new, 1e-9)
        c = max(new, 1e-9)
    return c


def _not_fitting(model, cluster, workload, config, rt, memory, capacity, problems):
    zero = IterationTime(0.0, 0.0, 0.0, 0.0)
    worker = config.worker or config.decode
    pool = PoolResult("aggregated" if config.mode == "aggregated" else "decode", worker,
                      config.replicas if config.mode == "aggregated" else config.decode_workers,
                      memory, max(capacity, 0), 0, zero)
    return ServingEvaluation(model, cluster, workload, config, rt.name, (pool,), math.inf,
                             math.inf, 0.0, 0.0, 0, False, tuple(problems))


def kv_transfer_s(model, cluster, workload, prefill: WorkerConfig, prompts: int,
                  deployment_gpus: int) -> float:
    """Seconds to move ``prompts`` prompts' KV cache from a prefill worker to a decode worker:
    each prefill GPU sends its share over the link between the pools (NVLink when both pools
    fit in one node, else the network tier, as a two-rank group crossing nodes)."""
    from planner.serve.memory import kv_bytes_per_token

    per_gpu = kv_bytes_per_token(model, prefill, workload.kv_cache_dtype) * workload.isl * prompts
    gpn = cluster.gpus_per_node
    if deployment_gpus <= gpn or cluster.num_nodes == 1:
        link = group_link(cluster, 2, 1)
    else:
        link = group_link(cluster, 2, gpn)
    return comm.p2p_s(per_gpu, link)


def prefill_prompts(worker: WorkerConfig, prefill_batch: int = 1) -> int:
    """Prompts one prefill pass of ``worker`` runs: ``prefill_batch`` on each of its attention
    groups. With data-parallel attention a request is routed to one attention-DP rank, which
    holds its KV cache and prefills its prompt whole (Dynamo, "DP Rank Routing (Attention Data
    Parallelism)": each rank with its own KV cache, a request assigned to one rank; LMSYS,
    "SGLang v0.4", data-parallelism attention: each DP worker runs its own batches); the ranks
    step together (the MoE layers' all-to-all), so one pass prefills a prompt on every rank at
    once: where the host issues the iteration (the eager MoE floor), in about the time of
    one prompt."""
    return prefill_batch * worker.attention_dp


def prefill_pass(model, cluster, workload: ServingWorkload, worker: WorkerConfig,
                 runtime_name: str, calib: Calibration, max_num_tokens: int,
                 prompts: int = 1, capture: tuple[int, ...] = ()) -> tuple[float, IterationTime]:
    """(seconds, one iteration) of a prefill-only worker running ``prompts`` prompts on each
    attention group (:func:`prefill_prompts` in all) in iterations of at most
    ``max_num_tokens`` tokens per group (each attention-DP rank schedules its own requests
    under its own budget; ``capture``: the piecewise-captured token counts)."""
    chunks = math.ceil(prompts * workload.isl / max_num_tokens)
    total = prefill_prompts(worker, prompts)
    it = iteration_time(model, cluster, worker, workload.dtype, workload.kv_cache_dtype, calib,
                        decode_seqs=0, context=0, prefill_tokens=total * workload.isl / chunks,
                        prefill_isl=workload.isl, prefill_requests=total / chunks,
                        runtime=runtime_name, capture_num_tokens=capture)
    return chunks * it.total_s, it


def decode_iteration(model, cluster, workload: ServingWorkload, worker: WorkerConfig,
                     runtime_name: str, calib: Calibration, seqs: float) -> IterationTime:
    """One step of a decode-only worker running ``seqs`` sequences at the average context
    (``isl + osl / 2``); TPOT = its time / tokens per step."""
    return iteration_time(model, cluster, worker, workload.dtype, workload.kv_cache_dtype, calib,
                          decode_seqs=seqs, context=workload.isl + workload.osl / 2,
                          runtime=runtime_name, draft_tokens=workload.draft_tokens)


def pool_capacities(model, cluster, workload: ServingWorkload, worker: WorkerConfig,
                    runtime_name: str, max_num_tokens: int, batch: int) -> tuple[int, int]:
    """(prompts a prefill worker of ``worker`` holds, sequences a decode worker holds)."""
    rt = runtime(runtime_name)
    config = ServingConfig("aggregated", worker=worker, batch=batch,
                           max_num_tokens=max_num_tokens)
    isl, osl = workload.isl, workload.osl
    prefill = _capacity(_pool_memory(model, cluster, workload, worker, rt, config, 1,
                                     decode=False), worker, isl, rt)
    decode = _capacity(_pool_memory(model, cluster, workload, worker, rt, config,
                                    worker.rank_batch(batch)),
                       worker, isl + osl if rt.reserve_full_sequence else
                       isl + math.ceil(osl / 2), rt)
    return prefill, decode


def prefill_burst(calib: Calibration, runtime_name: str, client, requests: float,
                  prefill_workers: int, prompts: int) -> float:
    """Prefill passes a new request waits for behind the prompts that arrive with it, in units
    of one pass of ``prompts``: :func:`planner.serve.client.prompts_ahead` of the ``requests``
    in flight per prefill worker beyond one pass. Never rises with more workers, never falls
    with more requests. TTFT >= (1 + this) x the prefill pass."""
    per_worker = requests / prefill_workers
    return prompts_ahead(client, per_worker, per_worker - prompts,
                         calib.queue_fraction(runtime_name)) / prompts


def _disaggregated(model, cluster, workload, config, rt, calib) -> ServingEvaluation:
    isl, osl = workload.isl, workload.osl
    P, D = config.prefill, config.decode
    n_p, n_d, k = config.prefill_workers, config.decode_workers, config.prefill_batch
    tps = workload.tokens_per_step
    mem_p = _pool_memory(model, cluster, workload, P, rt, config, k, decode=False)
    mem_d = _pool_memory(model, cluster, workload, D, rt, config, D.rank_batch(config.batch))
    cap_p = _capacity(mem_p, P, isl, rt)
    cap_d = _capacity(mem_d, D, isl + osl if rt.reserve_full_sequence else
                      isl + math.ceil(osl / 2), rt)
    prompts = prefill_prompts(P, k)  # one pass: k on each attention-DP rank
    problems = []
    if cap_p < prompts:
        problems.append(f"a prefill worker holds the KV of {cap_p} prompts, fewer than the "
                        f"{prompts} of one prefill pass")
    if cap_d < 1:
        problems.append("a decode worker has no room for one sequence's KV cache")
    if problems:
        return _not_fitting(model, cluster, workload, config, rt, mem_d, cap_d, problems)
    max_batch = worker_batch(D, config.batch, cap_d // D.attention_dp)
    t_prefill, it_p = prefill_pass(model, cluster, workload, P, rt.name, calib,
                                   config.max_num_tokens, k, config.prefill_capture_num_tokens)
    t_kv = kv_transfer_s(model, cluster, workload, P, k, config.num_gpus)
    prefill_rate_cap = n_p * prompts / t_prefill  # requests/s

    def decode_at(c_total: float):
        b = min(c_total / n_d, max_batch)
        return b, decode_iteration(model, cluster, workload, D, rt.name, calib, b)

    if workload.concurrency is not None:
        c = float(workload.concurrency)
    elif workload.request_rate_per_s is not None:
        c = None
    else:
        c = float(max_batch * n_d)
    # fixed point on the request rate (closed loop) or the concurrency (open loop)
    rate = workload.request_rate_per_s or 0.0
    ttft = t_prefill + t_kv
    b, it_d = decode_at(c if c is not None else 1.0)
    for _ in range(MAX_FIXED_POINT_ITERATIONS):
        if c is None:  # open loop: concurrency from Little's law
            c_new = rate * (ttft + (osl - 1) * it_d.total_s / tps)
            b, it_d = decode_at(max(c_new, 1e-9))
            conc = c_new
        else:
            conc = c
        tpot = it_d.total_s / tps
        decode_rate_cap = n_d * b / (osl * tpot)
        if c is not None:
            rate = min(conc / (ttft + (osl - 1) * tpot), prefill_rate_cap, decode_rate_cap)
        rho = min(rate / prefill_rate_cap, 0.999)
        burst = prefill_burst(calib, rt.name, workload.client, min(conc, n_d * max_batch), n_p,
                              prompts)
        new_ttft = t_prefill * (1 + burst + rho / (2 * (1 - rho))) + t_kv
        if abs(new_ttft - ttft) <= 1e-6 * ttft:
            ttft = new_ttft
            break
        ttft = new_ttft
    tpot = it_d.total_s / tps
    if c is None and (rate > prefill_rate_cap or rate > n_d * max_batch / (osl * tpot)):
        problems.append(f"a request rate of {rate:g}/s exceeds the deployment's capacity")
    conc = c if c is not None else rate * (ttft + (osl - 1) * tpot)
    if conc > n_d * max_batch:
        ttft += (conc - n_d * max_batch) / rate if rate > 0 else math.inf
    pools = (PoolResult("prefill", P, n_p, mem_p, cap_p, k, it_p),
             PoolResult("decode", D, n_d, mem_d, max_batch, math.ceil(b), it_d))
    return ServingEvaluation(model, cluster, workload, config, rt.name, pools, ttft,
                             tpot, rate * osl, conc, max_batch * n_d, not problems,
                             tuple(problems), t_kv)
