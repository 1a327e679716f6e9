"""SGLang ``python -m sglang.launch_server`` arguments for a serving plan.

Argument names: SGLang server arguments (``sglang/srt/server_args.py``; docs.sglang.io "Server
Arguments"), listed and checked in ``tests/serve_runtime_options.py``: ``--model-path``,
``--tp-size``, ``--pp-size``, ``--dp-size``, ``--ep-size``, ``--enable-dp-attention``,
``--max-running-requests``, ``--chunked-prefill-size``, ``--context-length``,
``--mem-fraction-static``, ``--kv-cache-dtype``, ``--quantization``, for disaggregated
serving ``--disaggregation-mode prefill|decode``, and MTP speculative decoding (docs.sglang.io
"Speculative Decoding", multi-token prediction: the EAGLE algorithm over the model's own MTP
module, one chain of N drafts) ``--speculative-algorithm EAGLE --speculative-num-steps N
--speculative-eagle-topk 1 --speculative-num-draft-tokens N+1``.

With ``--enable-dp-attention`` SGLang's ``--tp-size`` counts all ranks of the worker and
``--dp-size`` the attention replicas among them (attention tp = tp-size / dp-size), and it
divides ``--chunked-prefill-size`` by ``--dp-size`` (``server_args.py``
``_handle_data_parallelism``: "DP attention is enabled. The chunked prefill size is adjusted
to ..."): the plan's token budget is each attention-DP rank's (``planner.serve.evaluate``
``prefill_pass`` and ``prompt_tokens``), so the export passes it times ``--dp-size``. Each
attention-DP rank's scheduler likewise admits ``--max-running-requests // --dp-size`` requests
(``sglang/srt/managers/tp_worker.py`` ``TpModelWorker``: ``max_running_requests //
(dp_size if enable_dp_attention else 1)``), so the export passes the plan's per-rank cap
(``WorkerSpec.rank_batch``) times ``--dp-size``: a worker total would leave each rank
``1/dp`` of its planned sequences, and a prefill worker's one prompt per rank would leave 0
(SGLang refuses to start: "max_running_request is zero").

With pipeline parallelism (``--pp-size``) SGLang's scheduler loops over ``pp`` micro-batches,
each with its own running batch (``scheduler_pp_mixin.py`` ``event_loop_pp``: ``running_mbs``),
and admits into one at most ``--pp-max-micro-batch-size`` requests (``scheduler.py``
``get_num_allocatable_reqs``; by default ``max(max_running_requests // pp_size, 1)`` of the
rank's ``max_running_requests``, whose request pool also bounds all micro-batches together).
The export writes the rank's whole batch as above (``pp`` micro-batches of
``WorkerSpec.micro_batch``, as the serving model runs it) and, with ``pp > 1``, the micro-batch
cap explicitly: ``rank_batch // pp`` = the default.
"""
from __future__ import annotations

from typing import Any

from planner.export.base import ExportResult
from planner.export.quoting import comment, shell_word
from planner.export.serving import (capture_warnings, context_warning, header, model_warning,
                                    worker_specs)

QUANTIZATION = {"fp8": "fp8", "fp4": "modelopt_fp4"}
KV = {"bf16": "auto", "fp8": "fp8_e4m3"}


def worker_args(spec) -> list[str]:
    ranks = spec.tp * spec.attention_dp
    args = ["python", "-m", "sglang.launch_server", "--model-path", spec.model,
            "--tp-size", str(ranks), "--pp-size", str(spec.pp)]
    if spec.attention_dp > 1:
        args += ["--dp-size", str(spec.attention_dp), "--enable-dp-attention"]
    if spec.ep > 1:
        args += ["--ep-size", str(spec.ep)]
    # SGLang divides both by --dp-size under DP attention (module docstring): per rank x dp
    args += ["--max-running-requests", str(spec.rank_batch * spec.attention_dp),
             "--chunked-prefill-size", str(spec.max_num_tokens * spec.attention_dp),
             "--context-length", str(spec.max_model_len),
             "--mem-fraction-static", f"{spec.memory_fraction:g}",
             "--kv-cache-dtype", KV[spec.kv_dtype]]
    if spec.pp > 1:  # each of a rank's pp micro-batches (module docstring)
        args += ["--pp-max-micro-batch-size", str(spec.micro_batch)]
    if spec.dtype in QUANTIZATION:
        args += ["--quantization", QUANTIZATION[spec.dtype]]
    if spec.role in ("prefill", "decode"):
        args += ["--disaggregation-mode", spec.role]
    if spec.draft_tokens:
        args += ["--speculative-algorithm", "EAGLE",
                 "--speculative-num-steps", str(spec.draft_tokens),
                 "--speculative-eagle-topk", "1",
                 "--speculative-num-draft-tokens", str(spec.draft_tokens + 1)]
    return args


def export(doc: dict[str, Any]) -> ExportResult:
    specs = worker_specs(doc, "sglang")
    total = sum(s.count * s.gpus for s in specs)
    lines = []
    for spec in specs:
        words = " ".join(shell_word(a) for a in worker_args(spec))
        lines += [comment(header(spec, total)), words]
    return ExportResult("sglang", "\n".join(lines) + "\n",
                        (model_warning(specs[0]), *capture_warnings(specs, "sglang"),
                         *filter(None, [context_warning(doc, "sglang")])), ".sh")


def export_training(plan) -> ExportResult:
    """A training plan has no serving deployment to export."""
    from planner.export.serving import refuse_training

    refuse_training("sglang")
