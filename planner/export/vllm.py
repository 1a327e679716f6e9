"""vLLM engine arguments for serving a model with a plan's tensor / pipeline / data degrees.

Consumes a validated plan document; produces one line of engine arguments for ``vllm serve
MODEL ...``. Names from vLLM's ``vllm/engine/arg_utils.py``:
``--tensor-parallel-size``, ``--pipeline-parallel-size``, ``--data-parallel-size``,
``--enable-expert-parallel``; plus vLLM's long-standing ``--max-model-len`` and ``--dtype``.

A training plan is not a serving plan: memory differs (KV cache instead of optimizer states and
activations), so the degrees are a starting point. Training-only settings are named in one
warning; what vLLM cannot express (context parallelism, interleaving, uneven stages, an expert
degree other than tp x dp) gets its own.
"""
from __future__ import annotations

from typing import Any

from planner.plan_types import Plan
from planner.export.base import ExportResult, blocks_per_rank
from planner.export.quoting import shell_word

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp8": "bfloat16"}


def export(plan: Plan) -> ExportResult:
    doc = plan.to_dict()
    p = doc["parallelism"]
    warnings: list[str] = []
    tp, pp, dp, cp, ep = p["tp"], p["pp"], p["dp"], p["cp"], p["ep"]
    args: list[str] = ["--tensor-parallel-size", str(tp), "--pipeline-parallel-size", str(pp),
                       "--data-parallel-size", str(dp)]
    if ep > 1:
        args.append("--enable-expert-parallel")
        if ep != tp * dp:
            warnings.append(f"expert parallelism: with --enable-expert-parallel vLLM spreads the "
                            f"experts over tp x dp = {tp * dp} GPUs; the plan's ep is {ep}")
    args += ["--max-model-len", str(p["seq_len"]), "--dtype", DTYPES[p["dtype"]]]
    if p["dtype"] == "fp8":
        warnings.append("dtype fp8: exported --dtype bfloat16; FP8 serving is a quantization "
                        "choice (--quantization), not part of the plan")
    if cp > 1:
        warnings.append(f"context parallelism {cp}: vLLM has no training-style (ring) context "
                        f"parallelism; its --decode-context-parallel-size shards the KV cache "
                        f"at decode and is not the same. Dropped: the {cp * tp * pp * dp} GPUs "
                        f"of the plan become {tp * pp * dp}")
    if p["virtual_stages"] > 1:
        warnings.append(f"interleaving: vLLM runs one pipeline stage per rank; the plan's "
                        f"{p['virtual_stages']} virtual stages per rank are dropped")
    split = blocks_per_rank(doc)
    if pp > 1 and len(set(split)) > 1 and p["virtual_stages"] == 1:
        warnings.append(f"pipeline split: vLLM spreads the layers evenly; the plan has "
                        f"{','.join(map(str, split))} blocks per stage (vLLM reads a custom "
                        f"split from the VLLM_PP_LAYER_PARTITION environment variable)")
    training = []
    if p["zero_stage"]:
        training.append(f"ZeRO-{p['zero_stage']}")
    if p["sp"]:
        training.append("sequence parallelism")
    if any(x["recompute"] != "none" for x in doc["layers"]):
        training.append("activation recomputation")
    training.append(f"micro-batch {p['micro_batch']} / global batch {p['global_batch']}")
    warnings.append(f"serving from a training plan: dropped the training-only "
                    f"{', '.join(training)}; serving memory (KV cache, no optimizer states) was "
                    f"not planned")
    return ExportResult("vllm", " ".join(shell_word(a) for a in args) + "\n", tuple(warnings),
                        ".args")
