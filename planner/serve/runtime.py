"""Serving runtimes: the properties of vLLM, SGLang and TensorRT-LLM that the serving cost model
reads, and the calibrated constants of that model.

Every number is a physical quantity with its source. The calibrated ones
(:data:`CALIBRATED`) are fitted by ``bench/fit_inference.py`` (scipy least squares over the
whole calibration file ``bench/data/inference_runs.yaml``, no entry special-cased) and checked
by ``tests/test_serve_accuracy.py``; ``docs/inference.md`` shows the fit.
"""
from __future__ import annotations

from dataclasses import dataclass

# Fitted by bench/fit_inference.py (see docs/inference.md); each within its physical range.
CALIBRATED = {
    # fraction of HBM bandwidth that decode reaches streaming weights and KV cache (paged
    # attention and small-M GEMMs reach 60-90 % of STREAM bandwidth)
    "decode_hbm_efficiency": 0.9,
    # prefill GEMM and attention efficiency relative to the training cost model's
    "prefill_efficiency": 0.912,
    # per runtime: fixed time per engine iteration beyond the kernels (scheduler, input
    # preparation, sampling, host synchronisation, CUDA-graph launch); fitted on the rows
    # whose decoding is known (not on DeepSeek rows that may have drafted tokens with MTP; the
    # InferenceX rows' published speculation, bench/data/inferencex_deployments.yaml, counts)
    "step_overhead_s": {"sglang": 0.0, "trtllm": 0.000634, "vllm": 0.00343},
    # per runtime (its scheduler): fraction of the other concurrent requests whose prefill a
    # new request of a synchronised client waits for (0: arrivals spread evenly; 1: every
    # request of a fixed-length closed loop arrives with it); a measured start-up burst is the
    # client's own term (planner.serve.client)
    "prefill_queue_fraction": {"sglang": 0.04, "trtllm": 0.14, "vllm": 0.05},
    # per runtime: share of the other requests' prefill work that lands between a request's
    # output tokens (1: every iteration carries its average share, chunked prefill mixed into
    # decode; lower: prefills batched apart or deferred)
    "prefill_interference": {"sglang": 0.878, "trtllm": 1.0, "vllm": 0.119},
}


@dataclass(frozen=True)
class ServingRuntime:
    """What one runtime does by default.

    ``memory_fraction`` and ``kv_rule``: what the fraction covers.
    ``"all"``: vLLM ``--gpu-memory-utilization`` (0.9) bounds everything the engine allocates,
    so KV = fraction x memory - weights - activations - reserve; ``"static"``: SGLang
    ``--mem-fraction-static`` (0.9) bounds weights + KV pool (activations, CUDA graphs and the
    CUDA context live in the rest), KV = fraction x memory - weights; ``"free"``: TensorRT-LLM
    ``kv_cache_config.free_gpu_memory_fraction`` (0.9) is a share of what weights and buffers
    leave free, KV = fraction x (memory - weights - activations - reserve).
    ``kv_block_tokens``: tokens per paged-KV block (vLLM ``--block-size`` 16, SGLang
    ``--page-size`` 1, TensorRT-LLM ``tokens_per_block`` 32).
    ``cuda_graph_gib``: memory captured CUDA graphs and their pools hold.
    ``reserve_full_sequence``: the scheduler reserves KV blocks for isl + osl at admission
    (TensorRT-LLM's GUARANTEED_NO_EVICT capacity scheduler) instead of growing them.
    ``max_batch`` / ``max_num_tokens``: default caps on sequences and tokens per iteration
    (the GPU-dependent defaults: :meth:`default_max_num_tokens`).
    """

    name: str
    memory_fraction: float
    kv_block_tokens: int
    cuda_graph_gib: float
    reserve_full_sequence: bool
    max_batch: int
    max_num_tokens: int
    kv_rule: str = "all"

    def default_max_num_tokens(self, gpu) -> int:
        """The runtime's default token budget of one iteration (its chunked-prefill size) on
        ``gpu`` (a :class:`planner.hardware.Gpu`; its name and memory decide):

        * vLLM (``EngineArgs.get_batch_defaults``, OpenAI server): ``max_num_batched_tokens``
          8192 on GPUs of at least 70 GiB other than A100, else 2048;
        * SGLang (``ServerArgs``): ``chunked_prefill_size`` 2048 under 35 GiB, 8192 under
          160 GiB (H100, H200, A100), else 16384 (B200, GB200, B300);
        * TensorRT-LLM (LLM API ``max_num_tokens``): 8192 on every GPU.
        """
        memory_gib = gpu.memory_gib
        if self.name == "vllm":
            big = memory_gib >= 70 and "a100" not in gpu.name.lower()
            return 8192 if big else 2048
        if self.name == "sglang":
            return 2048 if memory_gib < 35 else 8192 if memory_gib < 160 else 16384
        return self.max_num_tokens


RUNTIMES = {
    "vllm": ServingRuntime("vllm", 0.90, 16, 1.0, False, 1024, 8192, "all"),
    "sglang": ServingRuntime("sglang", 0.90, 1, 1.0, False, 1024, 8192, "static"),
    "trtllm": ServingRuntime("trtllm", 0.90, 32, 1.0, True, 2048, 8192, "free"),
}
DEFAULT_RUNTIME = "vllm"


def runtime(name: str) -> ServingRuntime:
    from planner.errors import invalid

    key = name.strip().lower().replace("tensorrt-llm", "trtllm")
    if key not in RUNTIMES:
        raise invalid(f"unknown serving runtime {name!r}; one of {', '.join(RUNTIMES)}")
    return RUNTIMES[key]
