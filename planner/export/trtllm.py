"""TensorRT-LLM ``trtllm-serve`` command lines plus the ``extra_llm_api_options`` YAML of each
worker, for a serving plan.

Names: ``trtllm-serve`` options (TensorRT-LLM docs "trtllm-serve": ``--tp_size``, ``--pp_size``,
``--ep_size``, ``--max_batch_size``, ``--max_num_tokens``, ``--max_seq_len``,
``--kv_cache_free_gpu_memory_fraction``, ``--extra_llm_api_options``) and LLM-API fields in the
YAML (``enable_attention_dp``, ``enable_chunked_prefill``, ``kv_cache_config.dtype``,
``kv_cache_config.free_gpu_memory_fraction``, ``cuda_graph_config.max_batch_size``, and for
MTP speculative decoding ``speculative_config: {decoding_type: MTP, num_nextn_predict_layers:
N}`` as in TensorRT-LLM's DeepSeek-R1 guides and ``MTPDecodingConfig``, and for a plan whose
deployment states piecewise CUDA graphs of its prompt-carrying iterations
(``prefill_capture_num_tokens``) ``torch_compile_config: {enable_piecewise_cuda_graph: true,
capture_num_tokens: [...]}`` on the workers that prefill, TensorRT-LLM "Torch Compile &
Piecewise CUDA Graph" and ``TorchCompileConfig``), listed and
checked in ``tests/serve_runtime_options.py``. With attention DP, ``--tp_size`` counts every
rank of the worker (TensorRT-LLM replicates attention over them), and ``max_batch_size`` and
``max_num_tokens`` cap each rank: the PyTorch executor's request queue admits up to ``tp_size
x max_num_active_requests`` and balances them over the ranks, each at most
``max_num_active_requests`` (``tensorrt_llm/_torch/pyexecutor/py_executor.py`` /
``executor_request_queue.py``: ``total_max_num_active_requests = tp_size x
max_num_active_requests`` under ``enable_attention_dp``, that from the model engine's
``get_max_num_sequences()``, ``max_batch_size``), and each rank schedules its own batch
under ``max_num_tokens``; the CUDA graphs (``cuda_graph_config.max_batch_size``) run each
rank's batch. So all three are the plan's per-rank values, not the worker's totals. With
pipeline parallelism ``max_batch_size`` caps one micro-batch: the executor keeps ``pp_size``
micro-batches in flight, each scheduled under ``max_batch_size`` (``_util.py``
``create_py_executor_instance``: the micro-batch scheduler gets ``max_batch_size``, the
capacity scheduler ``get_max_num_sequences()`` = ``pp_size x max_batch_size``,
``model_engine.py``), so the export writes the plan's micro-batch
(``WorkerSpec.micro_batch``: a rank's ``rank_batch`` is ``pp`` of them, as the serving model
runs it) for ``max_batch_size`` and the CUDA graphs (each replays one micro-batch), and the
rank's token budget for ``max_num_tokens``; the whole batch there would let ``pp x`` the
plan's sequences run. The document is one YAML
stream: per worker a mapping with its ``command`` (the shell line, shlex-quoted) and its
``extra_llm_api_options`` (the file the command names).
"""
from __future__ import annotations

from typing import Any

import yaml

from planner.export.base import ExportResult
from planner.export.quoting import shell_word
from planner.export.serving import context_warning, model_warning, worker_specs

KV = {"bf16": "auto", "fp8": "fp8"}


def options(spec) -> dict:
    doc = {"enable_attention_dp": spec.attention_dp > 1,
           "enable_chunked_prefill": True,
           "kv_cache_config": {"dtype": KV[spec.kv_dtype],
                               "free_gpu_memory_fraction": spec.memory_fraction},
           "cuda_graph_config": {"max_batch_size": spec.micro_batch, "enable_padding": True}}
    if spec.draft_tokens:
        doc["speculative_config"] = {"decoding_type": "MTP",
                                     "num_nextn_predict_layers": spec.draft_tokens}
    if spec.capture_num_tokens:
        doc["torch_compile_config"] = {"enable_piecewise_cuda_graph": True,
                                       "capture_num_tokens": list(spec.capture_num_tokens)}
    return doc


def command(spec, options_file: str) -> list[str]:
    ranks = spec.tp * spec.attention_dp
    args = ["trtllm-serve", spec.model, "--backend", "pytorch", "--tp_size", str(ranks),
            "--pp_size", str(spec.pp)]
    if spec.ep > 1:
        args += ["--ep_size", str(spec.ep)]
    # per attention-DP rank and micro-batch (module docstring)
    args += ["--max_batch_size", str(spec.micro_batch), "--max_num_tokens",
             str(spec.max_num_tokens), "--max_seq_len", str(spec.max_model_len),
             "--kv_cache_free_gpu_memory_fraction", f"{spec.memory_fraction:g}",
             "--extra_llm_api_options", options_file]
    return args


def export(doc: dict[str, Any]) -> ExportResult:
    specs = worker_specs(doc, "trtllm")
    warnings = [model_warning(specs[0]), *filter(None, [context_warning(doc, "trtllm")])]
    workers = []
    for spec in specs:
        name = f"{spec.role}.yaml"
        if spec.dtype in ("fp8", "fp4"):
            warnings.append(f"{spec.role}: {spec.dtype} weights: TensorRT-LLM reads the "
                            f"precision from the checkpoint; serve a ModelOpt {spec.dtype.upper()} "
                            f"checkpoint of {spec.model}")
        workers.append({"role": spec.role, "count": spec.count, "gpus_per_worker": spec.gpus,
                        "command": " ".join(shell_word(a) for a in command(spec, name)),
                        "options_file": name, "extra_llm_api_options": options(spec)})
    text = yaml.safe_dump({"trtllm_workers": workers}, sort_keys=True)
    return ExportResult("trtllm", text, tuple(warnings), ".yaml")


def export_training(plan) -> ExportResult:
    """A training plan has no serving deployment to export."""
    from planner.export.serving import refuse_training

    refuse_training("trtllm")
