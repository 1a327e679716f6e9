"""Documented reference of the serving runtimes' options that the serving exporters write, used by
``tests/test_serve_exports.py`` to parse exported command lines back (the runtimes themselves do
not install on a CPU-only CI machine: vLLM, SGLang and TensorRT-LLM pull CUDA builds of torch).

Each entry: option name -> (type, choices or None). Read from the runtimes' own documentation and
argument definitions (names checked by hand against the sources below; no code copied):

* vLLM: docs.vllm.ai "Engine Arguments" / ``vllm/engine/arg_utils.py`` (``vllm serve``):
  parallel sizes, ``--max-num-seqs``, ``--max-num-batched-tokens``, ``--max-model-len``,
  ``--gpu-memory-utilization``, ``--kv-cache-dtype {auto,fp8,fp8_e5m2,fp8_e4m3}``,
  ``--block-size``, ``--quantization``, ``--kv-transfer-config`` (JSON), ``--speculative-config``
  (JSON; docs.vllm.ai "MTP (Multi-Token Prediction)").
* SGLang: docs.sglang.io "Server Arguments" / ``sglang/srt/server_args.py``
  (``python -m sglang.launch_server``): ``--tp-size``, ``--pp-size``, ``--dp-size``,
  ``--ep-size``, ``--enable-dp-attention``, ``--max-running-requests``,
  ``--chunked-prefill-size``, ``--context-length``, ``--mem-fraction-static``,
  ``--kv-cache-dtype {auto,fp8_e5m2,fp8_e4m3}``, ``--quantization``,
  ``--disaggregation-mode {null,prefill,decode}``, ``--speculative-algorithm``,
  ``--speculative-num-steps``, ``--speculative-eagle-topk``, ``--speculative-num-draft-tokens``
  (docs.sglang.io "Speculative Decoding"), ``--pp-max-micro-batch-size`` (``ServerArgs``).
* TensorRT-LLM: nvidia.github.io/TensorRT-LLM "trtllm-serve" (``--tp_size``, ``--pp_size``,
  ``--ep_size``, ``--max_batch_size``, ``--max_num_tokens``, ``--max_seq_len``,
  ``--kv_cache_free_gpu_memory_fraction``, ``--extra_llm_api_options``, ``--backend``) and the
  LLM API fields of the options YAML (``enable_attention_dp``, ``enable_chunked_prefill``,
  ``kv_cache_config.{dtype,free_gpu_memory_fraction}``, ``cuda_graph_config.{max_batch_size,
  enable_padding}``, ``speculative_config.{decoding_type,num_nextn_predict_layers}``) as in
  TensorRT-LLM's ``examples/serve`` configs and ``MTPDecodingConfig``;
  ``torch_compile_config.{enable_piecewise_cuda_graph,capture_num_tokens}`` (nvidia.github.io/
  TensorRT-LLM "Torch Compile & Piecewise CUDA Graph", ``TorchCompileConfig``: a bool and a
  list of positive token counts).
"""
from __future__ import annotations

import argparse
import json

FLAG = "flag"

VLLM = {
    "--tensor-parallel-size": (int, None), "--pipeline-parallel-size": (int, None),
    "--data-parallel-size": (int, None), "--enable-expert-parallel": (FLAG, None),
    "--max-num-seqs": (int, None), "--max-num-batched-tokens": (int, None),
    "--max-model-len": (int, None), "--gpu-memory-utilization": (float, None),
    "--kv-cache-dtype": (str, ("auto", "fp8", "fp8_e5m2", "fp8_e4m3")),
    "--enable-chunked-prefill": (FLAG, None), "--block-size": (int, (8, 16, 32)),
    "--quantization": (str, ("fp8", "modelopt", "modelopt_fp4", "awq", "gptq")),
    "--kv-transfer-config": (json.loads, None), "--speculative-config": (json.loads, None),
}
SGLANG = {
    "--model-path": (str, None), "--tp-size": (int, None), "--pp-size": (int, None),
    "--dp-size": (int, None), "--ep-size": (int, None), "--enable-dp-attention": (FLAG, None),
    "--max-running-requests": (int, None), "--chunked-prefill-size": (int, None),
    "--context-length": (int, None), "--mem-fraction-static": (float, None),
    "--kv-cache-dtype": (str, ("auto", "fp8_e5m2", "fp8_e4m3")),
    "--quantization": (str, ("fp8", "modelopt_fp4", "awq", "gptq")),
    "--disaggregation-mode": (str, ("null", "prefill", "decode")),
    "--speculative-algorithm": (str, ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")),
    "--speculative-num-steps": (int, None), "--speculative-eagle-topk": (int, None),
    "--speculative-num-draft-tokens": (int, None), "--pp-max-micro-batch-size": (int, None),
}
TRTLLM = {
    "--backend": (str, ("pytorch", "tensorrt", "_autodeploy")), "--tp_size": (int, None),
    "--pp_size": (int, None), "--ep_size": (int, None), "--max_batch_size": (int, None),
    "--max_num_tokens": (int, None), "--max_seq_len": (int, None),
    "--kv_cache_free_gpu_memory_fraction": (float, None), "--extra_llm_api_options": (str, None),
}
TRTLLM_YAML = {
    "enable_attention_dp": bool, "enable_chunked_prefill": bool,
    "kv_cache_config": {"dtype": ("auto", "fp8"), "free_gpu_memory_fraction": float},
    "cuda_graph_config": {"max_batch_size": int, "enable_padding": bool},
    "speculative_config": {"decoding_type": ("MTP",), "num_nextn_predict_layers": int},
    "torch_compile_config": {"enable_piecewise_cuda_graph": bool, "capture_num_tokens": list},
}


def parser(reference: dict, prog: str, positional: int) -> argparse.ArgumentParser:
    """An argparse parser accepting exactly the documented options (unknown ones fail)."""
    p = argparse.ArgumentParser(prog=prog, exit_on_error=False, allow_abbrev=False)
    for i in range(positional):
        p.add_argument(f"positional{i}")
    for name, (kind, choices) in reference.items():
        if kind == FLAG:
            p.add_argument(name, action="store_true")
        else:
            p.add_argument(name, type=kind, choices=choices)
    return p


def micro_caps(runtime: str, args: argparse.Namespace) -> tuple[int, int]:
    """(micro-batches in flight, sequences in each) of one attention-DP rank of a worker whose
    caps are full, by the runtime's own rule (read from the sources; no code copied). With
    pipeline parallelism every runtime keeps ``pp`` micro-batches in flight:

    * TensorRT-LLM (PyTorch backend): each micro-batch scheduled under ``max_batch_size``, the
      capacity scheduler at ``get_max_num_sequences()`` = ``pp_size x max_batch_size``
      (``tensorrt_llm/_torch/pyexecutor/_util.py`` ``create_py_executor_instance``,
      ``model_engine.py``).
    * SGLang: each of ``pp_size`` micro-batches (``scheduler_pp_mixin.py`` ``event_loop_pp``,
      ``pp_async_batch_depth`` 0) admits ``--pp-max-micro-batch-size`` requests, by default
      ``max(max_running_requests // pp_size, 1)`` of the rank's ``max_running_requests``
      (``scheduler.py`` ``get_num_allocatable_reqs``).
    * vLLM: ``pp`` scheduled batches in flight (``EngineCore.step_with_batch_queue``) share the
      scheduler's ``max_num_seqs`` running requests (a request in flight is not scheduled
      again until its batch returns), so a full rank runs ``max_num_seqs / pp`` a batch.
    """
    if runtime == "vllm":
        pp = args.pipeline_parallel_size or 1
        return pp, -(-args.max_num_seqs // pp)
    if runtime == "sglang":
        pp = args.pp_size or 1
        dp = args.dp_size if args.enable_dp_attention and args.dp_size else 1
        running = args.max_running_requests // dp
        return pp, args.pp_max_micro_batch_size or max(running // pp, 1)
    if runtime == "trtllm":
        return args.pp_size or 1, args.max_batch_size
    raise ValueError(runtime)


def rank_caps(runtime: str, args: argparse.Namespace) -> tuple[int, int]:
    """(sequences, tokens per iteration) each attention-DP rank of a worker admits, by the
    runtime's own rule applied to its parsed arguments (read from the sources; no code copied):

    * vLLM: one engine core with its own scheduler per data-parallel rank
      (``vllm/v1/engine/core.py`` ``DPEngineCoreProc``), capped by ``max_num_seqs`` and
      ``max_num_batched_tokens`` as given (``vllm/v1/core/sched/scheduler.py``), over all its
      in-flight pipeline micro-batches.
    * SGLang with ``--enable-dp-attention``: ``--max-running-requests // --dp-size``
      (``sglang/srt/managers/tp_worker.py``) and ``--chunked-prefill-size // --dp-size``
      (``sglang/srt/server_args.py`` ``_handle_data_parallelism``); with ``--pp-size``, at most
      ``pp`` micro-batches of :func:`micro_caps` of them.
    * TensorRT-LLM (PyTorch backend): ``max_batch_size`` (x ``pp_size`` in flight,
      ``get_max_num_sequences``) and ``max_num_tokens`` per rank under ``enable_attention_dp``
      (``tensorrt_llm/_torch/pyexecutor``: ``tp_size x max_num_active_requests`` in all).
    """
    if runtime == "vllm":
        return args.max_num_seqs, args.max_num_batched_tokens
    if runtime == "sglang":
        dp = args.dp_size if args.enable_dp_attention and args.dp_size else 1
        pp, micro = micro_caps(runtime, args)
        return (min(args.max_running_requests // dp, pp * micro),
                args.chunked_prefill_size // dp)
    if runtime == "trtllm":
        pp, micro = micro_caps(runtime, args)
        return pp * micro, args.max_num_tokens
    raise ValueError(runtime)
