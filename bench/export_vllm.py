"""vLLM's own ``vllm serve`` parser and engine config on the exports (a manual step).

vLLM pulls its own CUDA build of torch (about 9 GiB installed), so it does not go into the CI
venv. In a separate venv (docs/exports.md has the step) this script feeds

* the 15 training plans' vLLM exports (``tests/export_corpus.py``), and
* serving plans' ``vllm serve`` lines (planner/export/vllm_serve.py: aggregated, data-parallel
  attention with expert parallelism, disaggregated prefill / decode workers)

to vLLM's serve parser, ``AsyncEngineArgs.from_cli_args`` and ``create_engine_config`` on its
CPU platform (``bench/runtime_workers.py``: ``_worker_vllm``), with each plan's model
config.json, and compares what vLLM derives (tensor / pipeline / data-parallel sizes, the expert
group, the context length, the scheduler's batch limits, the KV-cache dtype and role) with the
plan.

    python -m bench.export_vllm --vllm-python /path/to/vllm-venv/bin/python [--json]

Exit code 0 when every export is accepted with the plan's values, 1 otherwise.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from bench.export_runtimes import (ROOT, Case, compare, corpus, plan_facts, report,
                                   run_worker)

ENV = {"VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
TRAINING_KEYS = ("tp", "pp", "dp", "seq_len")


def hf_config(doc: dict[str, Any]) -> dict[str, Any]:
    """The model's config.json: its HF config file where the plan's model came from one (a
    path, or a preset backed by models/hf_configs), else a Llama-style config of the plan's
    embedded shape (the native presets, e.g. gpt3-1.3b)."""
    import yaml

    spec = str(doc["inputs"]["model"]["spec"])
    path = Path(spec)
    if not (path.suffix == ".json" and path.is_file()):
        index = yaml.safe_load((ROOT / "models" / "presets" / "index.yaml").read_text())
        entry = next((p for p in index["presets"] if p["name"] == spec.lower()), None)
        path = ROOT / "models" / entry["file"] if entry else Path()
    if path.suffix == ".json" and path.is_file():
        config = json.loads(path.read_text())
        config.pop("quantization_config", None)
        config.pop("auto_map", None)
        return config
    ir = doc["inputs"]["model"]["ir"]
    block = next(x for x in ir["layers"] if x["kind"] == "block")
    att, mlp = block["attention"], block["mlp"]
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": ir["hidden"], "num_attention_heads": att["num_heads"],
            "num_key_value_heads": att["num_kv_heads"], "head_dim": att["head_dim"],
            "intermediate_size": mlp["ffn_hidden"],
            "num_hidden_layers": sum(1 for x in ir["layers"] if x["kind"] == "block"),
            "vocab_size": ir["vocab"], "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16",
            "max_position_embeddings": max(ir["max_seq_len"] or 0,
                                           doc["parallelism"]["seq_len"]),
            "tie_word_embeddings": bool(ir.get("tied_embeddings"))}


def serving_plans() -> dict[str, dict]:
    """Serving plans of the three shapes the vLLM serving export writes."""
    from clusters import load_cluster
    from models import load_model
    from planner.serve.evaluate import evaluate_serving
    from planner.serve.plan import make_serve_plan
    from planner.serve.workload import ServingConfig, ServingWorkload, WorkerConfig

    def plan(model, cluster, workload, config, nodes=None):
        ev = evaluate_serving(load_model(model), load_cluster(cluster, nodes=nodes), workload,
                              config, "vllm")
        return make_serve_plan(ev, model_spec=model, cluster_spec=cluster, nodes=nodes,
                               solver={"status": "EVALUATED"})

    bf16 = ServingWorkload(isl=2000, osl=500, concurrency=64)
    return {
        "llama70b-tp4-x2": plan("llama-3.1-70b", "dgx-h100", bf16, ServingConfig(
            "aggregated", worker=WorkerConfig(tp=4), replicas=2, batch=96,
            max_num_tokens=4096)),
        "llama70b-tp4-pp2": plan("llama-3.1-70b", "dgx-h100", bf16, ServingConfig(
            "aggregated", worker=WorkerConfig(tp=4, pp=2), replicas=1, batch=64,
            max_num_tokens=8192)),
        "qwen3moe-dp-attention": plan("qwen3-30b-a3b", "dgx-h100", bf16, ServingConfig(
            "aggregated", worker=WorkerConfig(tp=1, ep=8, attention_dp=8), replicas=1,
            batch=128, max_num_tokens=8192)),
        "deepseek-disaggregated": plan("deepseek-v3", "dgx-h200", ServingWorkload(
            isl=1024, osl=1024, concurrency=64, mode="disaggregated"), ServingConfig(
            "disaggregated", prefill=WorkerConfig(tp=8, ep=8),
            decode=WorkerConfig(tp=1, ep=16, attention_dp=16), prefill_workers=2,
            decode_workers=1, batch=64), nodes=4),
    }


def _serve_lines(text: str) -> list[list[str]]:
    """The words after ``vllm serve MODEL`` of each command line of a serving export."""
    return [shlex.split(line)[3:] for line in text.splitlines()
            if line.startswith("vllm serve ")]


def _serving_facts(spec) -> dict[str, Any]:
    """What vLLM must derive for one worker of a serving plan (planner.export.serving
    WorkerSpec): its sizes (vLLM's expert group is tp x dp), context, batch limits (each DP
    rank's: an engine core per rank, planner/export/vllm_serve.py), KV role."""
    return {"tp": spec.tp, "pp": spec.pp, "dp": spec.attention_dp, "ep": spec.ep,
            "seq_len": spec.max_model_len, "max_num_seqs": spec.rank_batch,
            "max_num_batched_tokens": spec.max_num_tokens,
            "kv_role": {"prefill": "kv_producer", "decode": "kv_consumer"}.get(spec.role)}


def run(python: str) -> list[Case]:
    from planner.export import export_plan
    from planner.plan_types import Plan

    cases, inputs, wants = [], [], []
    for name, doc in corpus().items():
        result = export_plan(Plan.from_dict(doc), "vllm")
        inputs.append({"args": shlex.split(result.text), "config": hf_config(doc)})
        cases.append(Case(name, "vllm", None))
        wants.append(("training", doc, result.warnings))
    from planner.export.serving import worker_specs

    for name, doc in serving_plans().items():
        result = export_plan(doc, "vllm")
        lines = _serve_lines(result.text)
        specs = worker_specs(doc, "vllm")
        assert len(lines) == len(specs), (name, result.text)
        for spec, words in zip(specs, lines):
            inputs.append({"args": words, "config": hf_config(doc)})
            cases.append(Case(f"{name} {spec.role}", "vllm-serve", None))
            wants.append(("serving", _serving_facts(spec), ()))
    results = run_worker("vllm", inputs, python=python, env=ENV, timeout_s=3000)
    label = f"vllm {results[-1]['version']} (real)"
    for case, r, (kind, want, warnings) in zip(cases, results[:-1], wants):  # want: the plan
        case.parser, case.accepted, case.message = label, r["accepted"], r.get("message", "")
        if not r["accepted"]:
            continue
        derived = r["derived"]
        if kind == "training":
            case.mismatches = compare(want, derived, TRAINING_KEYS, warnings)
            if derived["gpus"] > plan_facts(want)["world"]:
                case.mismatches.append(f"gpus: engine needs {derived['gpus']}")
        else:
            keys = dict(want)
            if derived["use_mla"] and not derived["chunked_prefill"]:
                # vllm/platforms/cpu.py: "MLA is enabled on a non-GPU platform; forcing
                # chunked prefill ... to be disabled" and max_num_batched_tokens to
                # max(max_model_len, 2048): the CPU platform's override, not the export's
                keys.pop("max_num_batched_tokens")
                case.message = ("CPU platform: MLA disables chunked prefill, so vLLM sets its "
                                "own max_num_batched_tokens here (not on GPUs)")
            case.mismatches = [f"{k}: runtime {derived[k]!r}, export {v!r}"
                               for k, v in keys.items() if derived.get(k) != v]
    return cases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", required=True, metavar="PYTHON",
                        help="a Python with vllm installed (its own venv)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    return report(run(args.vllm_python), args.json, "by vLLM with the plan's values")


if __name__ == "__main__":
    sys.exit(main())
