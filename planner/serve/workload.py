"""What a serving deployment must do (:class:`ServingWorkload`) and how one is laid out
(:class:`WorkerConfig`, :class:`ServingConfig`).

Plain data with validation; every impossible combination becomes a :class:`PlannerError`
(INVALID_INPUT, exit code 2). Consumed by :mod:`planner.serve.evaluate` and the search.

Vocabulary (as in TensorRT-LLM, SGLang and NVIDIA aiconfigurator):

* a **worker** is one model instance (one engine / one server process group) on
  ``tp * pp * attention_dp`` GPUs. Attention and dense layers are tensor-parallel over ``tp``
  ranks; with data-parallel attention (SGLang ``--enable-dp-attention``, TensorRT-LLM
  ``enable_attention_dp``) ``attention_dp`` groups of ``tp`` ranks each run attention on their
  own requests. MoE layers are spread over all ``tp * attention_dp`` ranks of a stage:
  ``ep``-way expert parallel times ``moe_tp = tp * attention_dp / ep`` tensor parallel.
* **aggregated** serving runs ``replicas`` identical workers, each doing prefill and decode;
  **disaggregated** serving runs ``prefill_workers`` prefill-only and ``decode_workers``
  decode-only workers and moves each request's KV cache from the first to the second.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from planner.errors import invalid
from planner.serve.client import DEFAULT_CLIENT, BenchmarkClient

SERVE_DTYPES = ("bf16", "fp8", "fp4")
KV_DTYPES = ("bf16", "fp8")
MODES = ("aggregated", "disaggregated")

# Bytes per weight element at serving precision. fp4 is NVFP4: 4-bit values plus one fp8 scale
# per 16 elements (NVIDIA Blackwell NVFP4 format) = 0.5 + 1/16 bytes.
WEIGHT_BYTES = {"bf16": 2.0, "fp8": 1.0, "fp4": 0.5 + 1.0 / 16}
KV_BYTES = {"bf16": 2.0, "fp8": 1.0}
MAX_TOKENS = 1 << 22  # bounds isl/osl: catches unit slips, keeps the arithmetic exact
# Multi-token-prediction speculative decoding: the probability that a drafted token is accepted.
# DeepSeek-V3 technical report §5.4.3: "the acceptance rate of the second token prediction
# ranges between 85% and 90%"; the lower end. Each further draft token is accepted only after
# all before it, at the same rate (an assumption: the report measures one draft token).
MTP_ACCEPTANCE = 0.85
MAX_DRAFT_TOKENS = 8


def parse_speculative(text: str | None) -> tuple[int, float]:
    """``mtp:N`` or ``mtp:N:ACCEPT`` -> (draft tokens, acceptance rate); None/"none" -> off."""
    if text is None or text.strip().lower() in ("", "none", "off"):
        return 0, MTP_ACCEPTANCE
    parts = text.strip().lower().split(":")
    if parts[0] != "mtp" or len(parts) not in (2, 3):
        raise invalid(f"--speculative must be mtp:N or mtp:N:ACCEPT, got {text!r}",
                      "e.g. --speculative mtp:1 (DeepSeek-V3's multi-token prediction)")
    try:
        n = int(parts[1])
        accept = float(parts[2]) if len(parts) == 3 else MTP_ACCEPTANCE
    except ValueError:
        raise invalid(f"--speculative must be mtp:N or mtp:N:ACCEPT with numbers, got "
                      f"{text!r}") from None
    if not 1 <= n <= MAX_DRAFT_TOKENS:
        raise invalid(f"--speculative mtp:N needs N from 1 to {MAX_DRAFT_TOKENS}, got {n}")
    if not 0.0 <= accept < 1.0:
        raise invalid(f"the draft acceptance rate must be in [0, 1), got {accept:g}")
    return n, accept


@dataclass(frozen=True)
class ServingWorkload:
    """Requests of ``isl`` prompt and ``osl`` generated tokens, at a fixed number of requests in
    flight (``concurrency``, closed loop), or arriving at ``request_rate_per_s`` (open loop), or
    neither (offline: as many in flight as fit). Latency targets in milliseconds (None: none)."""

    isl: int
    osl: int
    concurrency: int | None = None
    request_rate_per_s: float | None = None
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    mode: str = "aggregated"
    dtype: str = "bf16"
    kv_dtype: str | None = None  # None: bf16 (the runtimes' "auto" for a bf16 model)
    # speculative decoding with the model's MTP module: draft tokens per step (0: off) and
    # the acceptance rate of a drafted token
    draft_tokens: int = 0
    acceptance: float = MTP_ACCEPTANCE
    # the benchmark client that loads the deployment (planner.serve.client): how its arrivals
    # queue behind each other's prefill in TTFT
    client: BenchmarkClient = DEFAULT_CLIENT

    kind = "serving"

    def __post_init__(self) -> None:
        for name in ("isl", "osl"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_TOKENS:
                raise invalid(f"--{name} must be an integer from 1 to {MAX_TOKENS}, got {value!r}")
        if self.concurrency is not None and self.request_rate_per_s is not None:
            raise invalid("give --concurrency or --request-rate, not both")
        if self.concurrency is not None and (isinstance(self.concurrency, bool) or
                                             not isinstance(self.concurrency, int) or
                                             not 1 <= self.concurrency <= 1 << 24):
            raise invalid(f"--concurrency must be a positive integer, got {self.concurrency!r}")
        for name in ("request_rate_per_s", "ttft_ms", "tpot_ms"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and
                                          math.isfinite(value) and 0 < value < 1e12):
                raise invalid(f"{name} must be a positive finite number, got {value!r}")
        if self.mode not in MODES:
            raise invalid(f"--mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.dtype not in SERVE_DTYPES:
            raise invalid(f"--dtype must be one of {', '.join(SERVE_DTYPES)}, got {self.dtype!r}")
        if self.kv_dtype is not None and self.kv_dtype not in KV_DTYPES:
            raise invalid(f"--kv-dtype must be one of {', '.join(KV_DTYPES)}, "
                          f"got {self.kv_dtype!r}")

        if isinstance(self.draft_tokens, bool) or not isinstance(self.draft_tokens, int) or \
                not 0 <= self.draft_tokens <= MAX_DRAFT_TOKENS:
            raise invalid(f"--speculative mtp:N needs N from 1 to {MAX_DRAFT_TOKENS}, "
                          f"got {self.draft_tokens!r}")
        if not (isinstance(self.acceptance, (int, float)) and not isinstance(
                self.acceptance, bool) and 0.0 <= self.acceptance < 1.0):
            raise invalid(f"the draft acceptance rate must be in [0, 1), got "
                          f"{self.acceptance!r}")

    @property
    def tokens_per_step(self) -> float:
        """Expected tokens a sequence gains per decode step: the verified token plus each
        draft token accepted after all before it (1 without speculative decoding)."""
        return sum(self.acceptance ** k for k in range(self.draft_tokens + 1))

    @property
    def speculative(self) -> str | None:
        """The ``--speculative`` spelling (None when off)."""
        if not self.draft_tokens:
            return None
        return f"mtp:{self.draft_tokens}:{self.acceptance:g}"

    @property
    def kv_cache_dtype(self) -> str:
        return self.kv_dtype or "bf16"

    @property
    def max_seq_len(self) -> int:
        return self.isl + self.osl

    @property
    def has_targets(self) -> bool:
        return self.ttft_ms is not None or self.tpot_ms is not None


@dataclass(frozen=True, order=True)
class WorkerConfig:
    """Degrees of one worker (see the module docstring)."""

    tp: int = 1
    pp: int = 1
    ep: int = 1
    attention_dp: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "ep", "attention_dp"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1 << 16:
                raise invalid(f"{name} must be a positive integer, got {value!r}")
        if (self.tp * self.attention_dp) % self.ep:
            raise invalid(f"ep={self.ep} must divide tp x attention_dp = "
                          f"{self.tp * self.attention_dp} (MoE layers use the same ranks)")

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.attention_dp

    @property
    def moe_tp(self) -> int:
        return self.tp * self.attention_dp // self.ep

    def micro_batch(self, batch: int) -> int:
        """Sequences in each of an attention-DP rank's ``pp`` micro-batches when the worker
        runs at most ``batch``: ``ceil(ceil(batch / attention_dp) / pp)``, the cap the runtimes
        apply to one micro-batch. With pipeline parallelism every runtime keeps ``pp``
        micro-batches in flight (the serving model's too: :mod:`planner.serve.phases`, ``pp``
        micro-batches of ``seqs / pp``): TensorRT-LLM's PyTorch executor schedules each
        micro-batch under ``max_batch_size`` and admits ``pp x max_batch_size`` requests
        (``get_max_num_sequences``), SGLang each micro-batch under ``--pp-max-micro-batch-size``
        (by default ``--max-running-requests // pp``, per DP rank), vLLM runs ``pp`` scheduled
        batches at once (its engine core's batch queue) whose requests together stay under
        ``--max-num-seqs``."""
        return -(-(-(-batch // self.attention_dp)) // self.pp)

    def rank_batch(self, batch: int) -> int:
        """Sequences each attention-DP rank admits when the worker runs at most ``batch``:
        ``pp`` micro-batches of :meth:`micro_batch` (``ceil(batch / attention_dp)`` rounded up
        to a multiple of ``pp``), the one per-rank reading of a batch cap (the serving model's
        largest batch, :func:`planner.serve.evaluate.worker_batch`, and the exports' caps,
        :mod:`planner.export.serving`). Every runtime schedules each attention-DP rank's
        requests under its own cap: vLLM runs an engine core with its own scheduler per
        data-parallel rank, each capped by ``--max-num-seqs``; TensorRT-LLM with
        ``enable_attention_dp`` caps each rank at ``max_batch_size`` (a micro-batch); SGLang
        divides ``--max-running-requests`` by ``--dp-size``. One cap serves every rank, so the
        worker holds ``attention_dp x`` this (at least ``batch``)."""
        return self.pp * self.micro_batch(batch)

    @property
    def mesh(self):
        """The worker's :class:`planner.mesh.Mesh`: attention replicas are its dp dimension,
        the MoE layers fold the tp x dp ranks into etp (= moe_tp) x ep (Megatron-Core
        parallel folding)."""
        from planner.mesh import Mesh

        return Mesh(pp=self.pp, dp=self.attention_dp, tp=self.tp, ep=self.ep, etp=self.moe_tp)

    def label(self) -> str:
        parts = [f"tp{self.tp}"]
        if self.pp > 1:
            parts.append(f"pp{self.pp}")
        if self.ep > 1:
            parts.append(f"ep{self.ep}")
        if self.attention_dp > 1:
            parts.append(f"adp{self.attention_dp}")
        return "-".join(parts)

    def as_dict(self) -> dict:
        return {"tp": self.tp, "pp": self.pp, "ep": self.ep, "attention_dp": self.attention_dp,
                "moe_tp": self.moe_tp, "gpus": self.gpus}


@dataclass(frozen=True)
class ServingConfig:
    """One deployment: aggregated (``worker`` x ``replicas``) or disaggregated (``prefill``
    x ``prefill_workers`` and ``decode`` x ``decode_workers``). ``batch`` caps the sequences a
    (decode) worker runs at once (``--max-num-seqs``); ``max_num_tokens`` the tokens of one
    iteration (the chunked-prefill budget, ``--max-num-batched-tokens``); ``prefill_batch`` the
    requests a prefill worker batches on each of its attention-DP ranks (disaggregated).
    ``prefill_capture_num_tokens``: the iteration token counts the runtime captures piecewise CUDA graphs of for prompt-carrying
    iterations (TensorRT-LLM ``torch_compile_config: {enable_piecewise_cuda_graph: true,
    capture_num_tokens: [...]}``, ``prefill_capture_num_tokens`` in newer releases); empty (the
    runtimes' default): such iterations run eagerly (:mod:`planner.serve.phases`)."""

    mode: str
    worker: WorkerConfig | None = None
    replicas: int = 1
    prefill: WorkerConfig | None = None
    decode: WorkerConfig | None = None
    prefill_workers: int = 0
    decode_workers: int = 0
    batch: int = 256
    max_num_tokens: int = 8192
    prefill_batch: int = 1
    prefill_capture_num_tokens: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise invalid(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        for name in ("replicas", "batch", "max_num_tokens", "prefill_batch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1 << 24:
                raise invalid(f"{name} must be a positive integer, got {value!r}")
        capture = self.prefill_capture_num_tokens
        if (not isinstance(capture, tuple)
                or any(isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 1 << 24
                       for v in capture)
                or list(capture) != sorted(set(capture))):
            raise invalid("prefill_capture_num_tokens must be increasing positive integers, "
                          f"got {capture!r}")
        if self.mode == "aggregated":
            if self.worker is None:
                raise invalid("aggregated serving needs a worker configuration")
        else:
            if self.prefill is None or self.decode is None:
                raise invalid("disaggregated serving needs prefill and decode worker "
                              "configurations (--prefill-workers/--decode-workers)")
            for name in ("prefill_workers", "decode_workers"):
                value = getattr(self, name)
                if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1 << 16:
                    raise invalid(f"{name} must be a positive integer, got {value!r}")

    @property
    def num_gpus(self) -> int:
        if self.mode == "aggregated":
            return self.worker.gpus * self.replicas
        return self.prefill.gpus * self.prefill_workers + self.decode.gpus * self.decode_workers

    def as_dict(self) -> dict:
        doc: dict = {"mode": self.mode, "batch": self.batch,
                     "max_num_tokens": self.max_num_tokens, "num_gpus": self.num_gpus}
        if self.prefill_capture_num_tokens:
            doc["prefill_capture_num_tokens"] = list(self.prefill_capture_num_tokens)
        if self.mode == "aggregated":
            doc.update(worker=self.worker.as_dict(), replicas=self.replicas)
        else:
            doc.update(prefill=dict(self.prefill.as_dict(), workers=self.prefill_workers,
                                    batch=self.prefill_batch),
                       decode=dict(self.decode.as_dict(), workers=self.decode_workers,
                                   batch=self.batch))
        return doc
