"""``vllm serve`` arguments for a serving plan (the serving part of the vLLM exporter).

Argument names: vLLM engine arguments (``vllm/engine/arg_utils.py``; docs.vllm.ai "Engine
Arguments"), listed in ``tests/serve_runtime_options.py`` and checked there:
``--tensor-parallel-size``, ``--pipeline-parallel-size``, ``--data-parallel-size``,
``--enable-expert-parallel``, ``--max-num-seqs``, ``--max-num-batched-tokens``,
``--max-model-len``, ``--gpu-memory-utilization``, ``--kv-cache-dtype``, ``--quantization``,
``--enable-chunked-prefill``, ``--block-size``; disaggregated workers get
``--kv-transfer-config`` (a JSON object, role ``kv_producer`` / ``kv_consumer``); MTP
speculative decoding ``--speculative-config '{"method": "mtp", "num_speculative_tokens": N}'``
(docs.vllm.ai "MTP (Multi-Token Prediction)").

Data-parallel attention is vLLM's data parallelism with expert parallelism: ``-dp`` attention
replicas whose MoE layers spread over ``tp x dp`` ranks. Independent replicas are separate
servers (one line per worker, repeated ``count`` times behind a load balancer).

Caps per data-parallel rank: vLLM runs each DP rank of an MoE model as its own engine core
(``vllm/v1/engine/core.py``: ``DPEngineCoreProc``, an ``EngineCore`` that builds its own
``Scheduler`` from the shared ``scheduler_config``; docs.vllm.ai "Data Parallel Deployment":
"each DP rank is deployed as a separate core engine process"), and the scheduler caps its own
requests at ``max_num_seqs`` and its own iteration at ``max_num_batched_tokens``
(``vllm/v1/core/sched/scheduler.py``: ``max_num_running_reqs``, ``max_num_scheduled_tokens``;
nothing divides them by the DP size). So ``--max-num-seqs`` is the plan's per-rank cap
(``WorkerSpec.rank_batch``) and ``--max-num-batched-tokens`` its per-rank token budget, not
the worker's totals.

With pipeline parallelism (``--pipeline-parallel-size``) the engine core keeps ``pp`` scheduled
batches in flight (its batch queue, ``max_concurrent_batches`` = the pipeline size,
``EngineCore.step_with_batch_queue``), and one scheduler fills them: a request in flight has no
new token to schedule until its batch returns (``scheduler.py``: "PP>1 and we have already
scheduled all prompt tokens but they are not finished yet"), so the micro-batches share the
running requests, at most ``max_num_seqs`` in all. ``--max-num-seqs`` is therefore the rank's
whole batch (``pp`` micro-batches of ``WorkerSpec.micro_batch``, as the serving model runs
it), not one micro-batch's.
"""
from __future__ import annotations

import json
from typing import Any

from planner.export.base import ExportResult
from planner.export.quoting import comment, shell_word
from planner.export.serving import (capture_warnings, context_warning, header, model_warning,
                                    worker_specs)

QUANTIZATION = {"fp8": "fp8", "fp4": "modelopt_fp4"}
KV = {"bf16": "auto", "fp8": "fp8"}
ROLE = {"prefill": "kv_producer", "decode": "kv_consumer"}


def worker_args(spec) -> list[str]:
    args = ["vllm", "serve", spec.model,
            "--tensor-parallel-size", str(spec.tp),
            "--pipeline-parallel-size", str(spec.pp)]
    warnings: list[str] = []
    if spec.attention_dp > 1:
        args += ["--data-parallel-size", str(spec.attention_dp)]
    if spec.ep > 1:
        args.append("--enable-expert-parallel")
    # per DP rank (each rank's engine core schedules under its own caps; module docstring)
    args += ["--max-num-seqs", str(spec.rank_batch),
             "--max-num-batched-tokens", str(spec.max_num_tokens),
             "--max-model-len", str(spec.max_model_len),
             "--gpu-memory-utilization", f"{spec.memory_fraction:g}",
             "--kv-cache-dtype", KV[spec.kv_dtype],
             "--enable-chunked-prefill", "--block-size", "16"]
    if spec.dtype in QUANTIZATION:
        args += ["--quantization", QUANTIZATION[spec.dtype]]
    if spec.draft_tokens:
        args += ["--speculative-config",
                 json.dumps({"method": "mtp", "num_speculative_tokens": spec.draft_tokens},
                            sort_keys=True, separators=(",", ":"))]
    if spec.role in ROLE:
        args += ["--kv-transfer-config",
                 json.dumps({"kv_connector": "NixlConnector", "kv_role": ROLE[spec.role]},
                            sort_keys=True, separators=(",", ":"))]
    return args, warnings


def export(doc: dict[str, Any]) -> ExportResult:
    specs = worker_specs(doc, "vllm")
    total = sum(s.count * s.gpus for s in specs)
    lines, warnings = [], [model_warning(specs[0]), *capture_warnings(specs, "vllm"),
                           *filter(None, [context_warning(doc, "vllm")])]
    for spec in specs:
        args, notes = worker_args(spec)
        warnings += notes
        if spec.ep > 1 and spec.ep != spec.tp * spec.attention_dp:
            warnings.append(f"expert parallelism: vLLM's --enable-expert-parallel spreads the "
                            f"experts over tp x dp = {spec.tp * spec.attention_dp} GPUs; the "
                            f"plan's ep is {spec.ep}")
        lines += [comment(header(spec, total)), " ".join(shell_word(a) for a in args)]
    return ExportResult("vllm", "\n".join(lines) + "\n", tuple(warnings), ".sh")
