"""Calibration entries of ``bench/data/inference_runs.yaml`` (a copy of the shared inference
calibration file) turned into serving-planner inputs, by rules that read each entry's own fields
(no entry is special-cased):

* model: MoE / MLA entries by their preset (``deepseek-v3``, ``mixtral-8x7b``); dense decoders
  as a native Llama-style model from the entry's shapes (layers, hidden, heads, KV heads, head
  dim, FFN, vocab);
* cluster: the GPU's DGX-style preset (8 GPUs a node, NVLink + InfiniBand), enough nodes for
  the entry's GPUs; memory (vendor capacity, binary-sized as in ``gpus.yaml``) and dense peaks
  (bf16 / fp8 / fp4) as the entry states them;
* precision: the entry's weights precision (``not stated`` = bf16); KV cache fp8 when the
  weights are fp8/fp4 and the entry names no KV dtype (ModelOpt fp8/NVFP4 checkpoints and
  aiconfigurator's fp8 modes quantise the KV cache), else bf16;
* runtime by framework (TensorRT-LLM, vLLM, SGLang); degrees, workers and batches from
  ``serving``; the benchmark client from ``workload.client`` (:func:`client`); concurrency from ``workload`` ("unbounded" = offline, as many as fit; missing =
  the decode batch x decode workers);
* offline TensorRT-LLM rows are trtllm-bench ``throughput`` runs (the perf-overview method):
  unless the entry states them, the batch and token caps are what trtllm-bench derives
  (:func:`trtllm_bench_settings`).

Measured values: per-GPU output throughput where the source prints it (perf-overview rows),
TTFT / TPOT (silicon rows). ``derived.output_tokens_per_sec_per_gpu_est`` (a closed-loop
estimate from measured TTFT/TPOT) is compared separately and only used to rank configurations.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from clusters import load_cluster  # noqa: E402
from models import load_model  # noqa: E402
from models.native import build_native  # noqa: E402
from planner.hardware import Cluster  # noqa: E402
from planner.ir import ModelGraph  # noqa: E402
from planner.serve.client import BenchmarkClient  # noqa: E402
from planner.serve.workload import (ServingConfig, ServingWorkload, WorkerConfig,  # noqa: E402
                                    parse_speculative)

DATA = ROOT / "bench" / "data" / "inference_runs.yaml"
# published deployment facts of rows whose source leaves them out (InferenceX configs/recipes)
DEPLOYMENTS = ROOT / "bench" / "data" / "inferencex_deployments.yaml"
# GPU name in the entry -> (cluster preset, GPU preset it is closest to)
GPU_PRESETS = (("GB300", "dgx-b200"), ("GB200", "dgx-b200"), ("B300", "dgx-b200"),
               ("B200", "dgx-b200"), ("H200", "dgx-h200"), ("H100", "dgx-h100"))
RUNTIMES = {"TensorRT-LLM": "trtllm", "vLLM": "vllm", "SGLang": "sglang"}
PRESET_MODELS = (("DeepSeek-V3", "deepseek-v3"), ("Mixtral 8x7B", "mixtral-8x7b"))


@dataclass(frozen=True)
class Case:
    id: str
    model: ModelGraph
    cluster: Cluster
    workload: ServingWorkload
    config: ServingConfig
    runtime: str
    measured: dict  # output_tokens_per_s_per_gpu, ttft_ms, tpot_ms (None when not measured)
    derived_tokens_per_s_per_gpu: float | None
    group: tuple  # same model, GPU type, framework, precision, isl/osl
    regime: str  # offline | aggregated | disaggregated
    speculative: str | None = None  # serving.speculative_decoding as stated (None: not stated)


@lru_cache(maxsize=1)
@lru_cache(maxsize=1)
def _document() -> dict:
    return yaml.safe_load(DATA.read_text())


@lru_cache(maxsize=1)
def deployments() -> dict[str, dict]:
    """``bench/data/inferencex_deployments.yaml``: per entry id, the facts its published run
    states (speculative decoding, worker counts and layouts, decode batch cap), each with its
    source."""
    return dict(yaml.safe_load(DEPLOYMENTS.read_text())["rows"])


def published(entry: dict) -> dict:
    """The entry with the facts of its published run (:func:`deployments`) in place of the
    fields its calibration row left unknown or defaulted: ``serving.speculative_decoding``,
    ``serving.max_batch_size`` / ``max_num_tokens``, the piecewise CUDA graphs' captured token
    counts (``torch_compile_config`` -> ``serving.prefill_capture_num_tokens``), the prefill /
    decode workers and degrees, and the GPU count they imply. An entry without such facts is returned unchanged."""
    facts = deployments().get(entry["id"])
    if facts is None:
        return entry
    serving = dict(entry["serving"])
    for key in ("speculative_decoding", "max_batch_size", "max_num_tokens"):
        if key in facts:
            serving[key] = facts[key]
    compiled = facts.get("torch_compile_config") or {}
    if compiled.get("enable_piecewise_cuda_graph"):
        serving["prefill_capture_num_tokens"] = list(compiled["capture_num_tokens"])
    cluster = dict(entry["cluster"])
    if "decode" in facts:
        for role in ("prefill", "decode"):
            block = dict(serving[role])
            block.update({k: v for k, v in facts[role].items() if k != "max_batch_size"})
            serving[role] = block
        serving["max_batch_size"] = facts["decode"].get("max_batch_size")
        cluster["num_gpus"] = sum(serving[r]["workers"] * serving[r]["tp"] * (serving[r].get("pp") or 1)
                                  for r in ("prefill", "decode"))
    return {**entry, "serving": serving, "cluster": cluster}


def entries() -> list[dict]:
    return [published(e) for e in _document()["entries"]]


def clients() -> dict[str, dict]:
    """The benchmark clients of the file (``clients``, each with its source), by key."""
    return dict(_document()["clients"])


def _dtype(precision: str | None) -> str:
    text = (precision or "").lower()
    if "fp4" in text:
        return "fp4"
    if "fp8" in text:
        return "fp8"
    return "bf16"


def _model(entry: dict) -> ModelGraph:
    m = entry["model"]
    for name, preset in PRESET_MODELS:
        if m["name"].startswith(name):
            return load_model(preset)
    return _native(m["name"], m["layers"], m["hidden"], m["heads"], m["kv_heads"],
                   m["head_dim"], m["ffn_hidden"], m["vocab"])


@lru_cache(maxsize=None)
def _native(name, layers, hidden, heads, kv_heads, head_dim, ffn, vocab) -> ModelGraph:
    return build_native({"shardplan_model": 1, "name": name, "num_layers": layers,
                         "hidden_size": hidden, "num_heads": heads, "num_kv_heads": kv_heads,
                         "head_dim": head_dim, "ffn_hidden_size": ffn, "vocab_size": vocab,
                         "gated_mlp": True, "seq_len": 4096, "max_seq_len": 131072},
                        where=name, default_name=name)


def _cluster(entry: dict) -> Cluster:
    c = entry["cluster"]
    preset = next(p for key, p in GPU_PRESETS if key in c["gpu"])
    nodes = max(1, math.ceil(c["num_gpus"] / 8))
    cluster = load_cluster(preset, nodes=nodes)
    gpu = cluster.gpu
    peaks = dict(gpu.peak_tflops)
    for key, field in (("bf16", "peak_dense_tflops_bf16_fp16"), ("fp16", "peak_dense_tflops_bf16_fp16"),
                       ("fp8", "peak_dense_tflops_fp8"), ("fp4", "peak_dense_tflops_fp4")):
        if c.get(field):
            peaks[key] = float(c[field])
    # "80 GB" is the HBM capacity, binary-sized like the presets' memory_gib (gpus.yaml)
    gpu = replace(gpu, name=c["gpu"], memory_gib=float(c["gpu_memory_gb"])
                  if c.get("gpu_memory_gb") else gpu.memory_gib, peak_tflops=peaks)
    return replace(cluster, gpu=gpu)


# trtllm-bench's bytes per weight / KV element by quantisation (tensorrt_llm/bench/build/
# tuning.py BYTES_PER_ELEM: NVFP4 counted as 0.5, scales not counted)
BENCH_BYTES = {"bf16": 2.0, "fp8": 1.0, "fp4": 0.5}
BENCH_KV_FRACTION = 0.95  # calc_engine_setting's kv_cache_gpu_mem_fraction default


def trtllm_bench_settings(model: ModelGraph, memory_gib: float, dtype: str, kv_dtype: str,
                          tp: int, pp: int, isl: int, osl: int) -> tuple[int, int]:
    """(max_batch_size, max_num_tokens) trtllm-bench picks when none is given
    (TensorRT-LLM ``tensorrt_llm/bench/build/tuning.py``: ``calc_engine_setting`` and
    ``finetune_setting``): the requests of ``isl + osl`` tokens whose KV fits in 0.95 of the
    group's memory less the weights, per pipeline stage, rounded up to a multiple of 32 (at
    least 64) below 256, of 128 below 1024, else of 256; tokens = that batch x (1 + isl/osl)
    rounded up (at least 2048, at most 32768)."""
    attention = [layer.attention for layer in model.blocks() if layer.attention is not None]
    kv_heads = max(tp, attention[0].num_kv_heads) if attention else tp
    head = attention[0].head_dim if attention else 0
    gib_per_token = 2 * len(attention) * kv_heads * head * BENCH_BYTES[kv_dtype] / 1024 ** 3
    engine_gib = model.params * BENCH_BYTES[dtype] / 1024 ** 3
    cache_gib = (memory_gib * tp * pp - engine_gib) * BENCH_KV_FRACTION
    requests = cache_gib / (gib_per_token * (isl + osl)) if gib_per_token else 4096
    raw_bs = min(requests, 4096) / pp
    raw_tokens = min(raw_bs * (1 + isl / osl), 32768)
    if raw_bs < 256:
        batch = max(64, 32 * math.ceil(raw_bs / 32))
    elif raw_bs < 1024:
        batch = 128 * math.ceil(raw_bs / 128)
    else:
        batch = 256 * math.ceil(raw_bs / 256)
    if raw_tokens < 4096:
        tokens = max(2048, 256 * math.ceil(raw_tokens / 256))
    elif raw_tokens < 8192:
        tokens = 512 * math.ceil(raw_tokens / 512)
    else:
        tokens = 1024 * math.ceil(raw_tokens / 1024)
    return batch, tokens


def _adp(value: Any, tp: int) -> tuple[int, int]:
    """(tp, attention_dp) from the entry's attention_dp (bool or size)."""
    if value is True:
        return 1, tp
    if isinstance(value, int) and not isinstance(value, bool) and value > 1:
        return tp, value
    return tp, 1


def _worker(block: dict) -> WorkerConfig:
    tp, adp = _adp(block.get("attention_dp"), block.get("tp") or 1)
    return WorkerConfig(tp=tp, pp=block.get("pp") or 1, ep=block.get("ep") or 1,
                        attention_dp=adp)


def client(workload: dict) -> BenchmarkClient:
    """The entry's benchmark client (``workload.client``, a key of the file's ``clients``:
    arrival, length spread, rounds, start-up burst); an offline run has no rounds of its own
    (as many run as fit)."""
    c = clients()[workload["client"]]
    return BenchmarkClient(c["arrival"], c.get("length_stddev_tokens") or 0,
                           c.get("length_range_ratio", 1), c.get("rounds"),
                           bool(c.get("startup_burst")))


def case(entry: dict) -> Case:
    from planner.serve.runtime import runtime

    rt = runtime(RUNTIMES[entry["framework"]["name"]])
    s, w, r = entry["serving"], entry["workload"], entry["results"]
    dtype = _dtype(entry["model"].get("weights_precision"))
    kv = s.get("kv_cache_dtype") or ("fp8" if dtype in ("fp8", "fp4") else "bf16")
    kv = "fp8" if "fp8" in str(kv).lower() else "bf16"
    conc = w.get("concurrency")
    cluster = _cluster(entry)
    model = _model(entry)
    batch = s.get("max_batch_size") or rt.max_batch
    tokens = s.get("max_num_tokens") or rt.default_max_num_tokens(cluster.gpu)
    capture = tuple(s.get("prefill_capture_num_tokens") or ())
    if rt.name == "trtllm" and not isinstance(conc, int) and not s["mode"].startswith("disagg"):
        bench_batch, bench_tokens = trtllm_bench_settings(
            model, cluster.gpu.memory_gib, dtype, kv, s.get("tp") or 1, s.get("pp") or 1,
            w["isl"], w["osl"])
        batch = s.get("max_batch_size") or bench_batch
        tokens = s.get("max_num_tokens") or bench_tokens
    if s["mode"].startswith("disaggregated"):
        p, d = s["prefill"], s["decode"]
        # the decode batch caps a worker only when it sets the load (no concurrency given)
        decode_batch = batch if isinstance(conc, int) else (d.get("batch_size") or batch)
        config = ServingConfig("disaggregated", prefill=_worker(p), decode=_worker(d),
                               prefill_workers=p["workers"], decode_workers=d["workers"],
                               batch=decode_batch, max_num_tokens=tokens,
                               prefill_batch=p.get("batch_size") or 1,
                               prefill_capture_num_tokens=capture)
        if not isinstance(conc, int):
            conc = decode_batch * d["workers"]
        regime = "disaggregated"
    else:
        worker = _worker(s)
        replicas = s.get("dp_replicas") or max(1, entry["cluster"]["num_gpus"] // worker.gpus)
        if not isinstance(conc, int) and w.get("batch_size"):
            conc = w["batch_size"] * replicas
        config = ServingConfig("aggregated", worker=worker, replicas=replicas, batch=batch,
                               max_num_tokens=tokens, prefill_capture_num_tokens=capture)
        regime = "aggregated" if isinstance(conc, int) else "offline"
    bench = client(w)  # its mean lengths: what the deployment served
    drafts, acceptance = parse_speculative(s.get("speculative_decoding"))
    workload = ServingWorkload(isl=bench.mean_tokens(w["isl"]), osl=bench.mean_tokens(w["osl"]),
                               concurrency=conc if isinstance(conc, int) else None,
                               mode=config.mode, dtype=dtype, kv_dtype=kv, client=bench,
                               draft_tokens=drafts, acceptance=acceptance)
    measured = {"output_tokens_per_s_per_gpu": r.get("output_tokens_per_sec_per_gpu"),
                "ttft_ms": r.get("ttft_ms_mean"), "tpot_ms": r.get("tpot_ms_mean")}
    derived = (entry.get("derived") or {}).get("output_tokens_per_sec_per_gpu_est")
    group = (entry["model"]["name"], entry["cluster"]["gpu"], entry["framework"]["name"],
             str(entry["framework"].get("version")), dtype, w["isl"], w["osl"])
    return Case(entry["id"], model, cluster, workload, config, rt.name,
                measured, derived, group, regime, s.get("speculative_decoding"))


@lru_cache(maxsize=1)
def cases() -> tuple[Case, ...]:
    return tuple(case(e) for e in entries())
