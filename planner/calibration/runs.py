"""Measured training runs (the calibration-file schema) as cost-model inputs.

Consumes one entry of a calibration file (``published_runs.yaml`` schema: ``entries`` with
``model``, ``cluster``, ``training``, ``results``) and its built model and cluster
(:mod:`clusters.calibration_runs` builds those, since planner/ imports no importer); produces
:class:`CalibrationRun` records
(model, cluster, configuration, runtime profile, what was measured and in which unit) and the
list of entries that cannot be evaluated, with the reason. Used by ``bench/accuracy.py``, the
fit of the shipped defaults (``bench/calibrate_defaults.py``) and ``shardplan calibrate``.

No entry is special-cased: every rule reads the entry's own fields, and each rule fills an
unpublished field with the runtime's documented default (listed in ``assumptions``):

* runtime profile: from ``training.framework`` (:func:`planner.profiles.profile_for_framework`);
* model: a native decoder from the shapes. Llama-family names: SwiGLU, RMSNorm, RoPE, no biases,
  untied embeddings. MPT: ALiBi, LayerNorm without biases, tied embeddings (llm-foundry
  mpt-*.yaml ``no_bias``). Otherwise GPT/BLOOM style: LayerNorm, biases, GeLU MLP, tied
  embeddings, learned positions unless the notes name ALiBi or rotary;
* cluster: the system's own file in ``bench/clusters/`` when the entry names its interconnect
  (Jean Zay's Omni-Path, GPT-NeoX's ConnectX-6, Grand Teton's 96 GB H100), else the preset of
  the GPU; GB200 runs within one NVL72 rack are one NVLink domain of ``num_gpus`` GPUs;
* activation offloading (``training.cpu_offloading_num_layers``, Megatron-Core's
  ``--cpu-offloading-num-layers``): the cost model has no host offload, so such a run is
  evaluated with its published recomputation (none when unpublished: the offload replaces it,
  its copies over NVLink-C2C / PCIe overlap the neighbouring layers' compute), and neither its
  memory nor its fit verdict is judged;
* unpublished micro-batch: 1; sequence parallelism: on with TP > 1 in Megatron and torchtitan
  (NeMo recipes set it, torchtitan implies it); ZeRO stage: 1 for Megatron (the distributed
  optimizer of NeMo / Megatron-Bridge recipes; ``--overlap-param-gather`` requires it), 0
  otherwise; recomputation: none; interleaving: off;
* precision: fp8 for FP8 / MXFP8 / Float8 runs, fp16 for fp16-only runs, else bf16; FP4 runs
  are not evaluated (no FP4 in the cost model);
* attention: eager for the 2022 stacks (Megatron-DeepSpeed, GPT-NeoX, metaseq), flash otherwise;
* dropout: off unless the entry states ``training.dropout: true`` (RuntimeOptions.dropout: the
  run trained with attention / hidden dropout, e.g. Megatron-LM's pre-2023 default 0.1);
* measured step time: ``iteration_time_s``; else global batch x sequence / (tokens per second
  per GPU x GPUs); else the published TFLOP/s under the source's convention:
  Narayanan Eq. 3 (full-recompute hardware FLOPs) for the Megatron-DeepSpeed era, Megatron's
  ``num_floating_point_operations`` (§2.4; SwiGLU x 3/2) for Megatron-Core / NeMo, with causal
  attention halved for Megatron-Bridge and AutoModel (checked: it reproduces their published
  tokens per second from their TFLOP/s, where the NeMo tables reproduce without halving);
* measured memory: ``memory_per_gpu_gb`` in GB (1e9 bytes, an nvidia-smi reading) unless
  ``results.memory_unit`` says GiB (torchtitan: the allocator's max reserved memory).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from planner.calibration.regimes import Regime, regime_of
from planner.config import ParallelConfig, RuntimeOptions
from planner.hardware import GB, GIB, Cluster
from planner.ir import ModelGraph
from planner.profiles import RuntimeProfile, framework_compiled, profile_for_framework
from planner.strategy import Recompute



@dataclass(frozen=True)
class Measured:
    step_time_s: float | None
    step_time_source: str
    memory_gib: float | None
    memory_reading: str  # "nvidia-smi" (whole device) or "allocator" (max reserved by PyTorch)
    oom: bool


@dataclass(frozen=True)
class CalibrationRun:
    id: str
    source: str  # the source's title: runs of one source on one GPU form a rank group
    profile: RuntimeProfile
    recompute_policy: str  # the runtime's own name of the recomputation
    model: ModelGraph
    cluster: Cluster
    config: ParallelConfig
    options: RuntimeOptions
    measured: Measured
    regime: Regime
    assumptions: tuple[str, ...]
    model_shape: tuple  # (layers, hidden, heads, ffn, vocab, seq): same model across runs
    recompute: Recompute = Recompute.NONE  # every block's policy (planner.strategy)
    recompute_published: bool = True  # False: inferred (the least recompute that fits)
    every_nth: int = 0  # full recompute of every N-th block (torchtitan selective_ac_option N)
    compiled: bool = False  # torch.compile (fused element-wise kernels) per the framework text
    offloaded_layers: int = 0  # blocks whose activations go to host memory (Megatron cpu_offloading)
    # DeepSpeed PipelineModule partition_method as published ("type:transformer|embedding");
    # "" = Megatron's split (planner.strategy.default_placement)
    pp_partition: str = ""

    @property
    def rank_group(self) -> tuple:
        """Runs of one source, on one GPU type, of one model: what the source compared."""
        return (self.source, self.cluster.gpu.name, self.config.dtype, self.model_shape)

    @property
    def tokens_per_step(self) -> int:
        return self.config.global_batch * self.config.seq_len


# An entry without ``training.micro_batch`` is evaluated at micro-batch 1 and says so; the
# accuracy report adds the error over the other plausible sizes (bench/unknown_fields.py).
ASSUMED_MICRO_BATCH = "micro-batch 1"


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def model_spec(entry: Mapping[str, Any]) -> str | None:
    """A model given by reference (a preset name or a config.json / native file path): the
    entry's ``model`` is that string, or a mapping with ``preset`` or ``config``."""
    m = entry.get("model")
    if isinstance(m, str):
        return m
    if isinstance(m, Mapping):
        ref = m.get("preset") or m.get("config")
        return str(ref) if ref else None
    return None


def seq_len_of(entry: Mapping[str, Any]) -> int:
    m, t = entry.get("model"), entry.get("training") or {}
    seq = (m.get("seq_len") if isinstance(m, Mapping) else None) or t.get("seq_len")
    if not seq:
        raise ValueError("no sequence length (model.seq_len or training.seq_len)")
    return int(seq)


def dtype_of(precision: str) -> str | None:
    text = precision.lower()
    if "fp4" in text:
        return None
    if "fp8" in text or "float8" in text:
        return "fp8"
    if "fp16" in text and "bf16" not in text:
        return "fp16"
    return "bf16"


def recompute_of(text: str, prof: RuntimeProfile) -> tuple[Recompute, str, int]:
    """(cost-model policy, the runtime's own name, every-N) of a published recompute text.
    torchtitan's "selective" is its default ``selective_ac_option = "op"`` (per-op SAC) unless
    the text names a layer interval ("selective 2": every 2nd block fully recomputed)."""
    t = text.strip().lower()
    if t.startswith("full"):
        return Recompute.FULL, "full", 0
    if t.startswith("selective"):
        if prof.name == "torchtitan":
            digits = "".join(ch for ch in t if ch.isdigit())
            if digits and int(digits) > 1:
                return Recompute.NONE, f"selective:{int(digits)}", int(digits)
            return Recompute.OP, "selective:op", 0
        return Recompute.SELECTIVE, "selective", 0
    return Recompute.NONE, "none", 0


def megatron_model_flops(model: Mapping[str, Any], global_batch: int, *, gated: bool,
                         causal_halved: bool) -> float:
    """Megatron-LM ``num_floating_point_operations`` (``megatron/training/training.py``, 2024-03 form; SwiGLU x 3/2 as in newer versions), per global batch."""
    L, h, s, V = model["layers"], model["hidden"], model["seq_len"], model["vocab"]
    a = model["heads"] or h // 128
    g = model.get("kv_heads") or a
    ffn = model.get("ffn_hidden") or 4 * h
    head_dim = model.get("head_dim") or h // a
    q_ratio = a * head_dim / h
    attention = (1 + g / a + (s / h) * (0.5 if causal_halved else 1.0)) * q_ratio
    mlp = (ffn / h) * (1.5 if gated else 1.0)
    return 12 * global_batch * s * L * h * h * (attention + mlp + V / (2 * L * h))


def eq3_flops(model: Mapping[str, Any], global_batch: int) -> float:
    """Narayanan et al. 2021 Eq. 3: hardware FLOPs per step with full recomputation."""
    L, h, s, V = model["layers"], model["hidden"], model["seq_len"], model["vocab"]
    return 96 * global_batch * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))


def measured_of(entry: Mapping[str, Any], framework: str) -> Measured:
    r, t, m = entry.get("results") or {}, entry["training"], entry["model"]
    n = entry["cluster"]["num_gpus"]
    time_s, source = None, "-"
    if r.get("iteration_time_s"):
        time_s, source = float(r["iteration_time_s"]), "iteration time"
    elif r.get("tokens_per_sec_per_gpu"):
        time_s = t["global_batch"] * seq_len_of(entry) / (r["tokens_per_sec_per_gpu"] * n)
        source = "tokens/s"
    elif r.get("tflops_per_gpu"):
        fw = framework.lower()
        if any(k in fw for k in ("nemo", "megatron-core", "megatron-bridge", "automodel")):
            halved = "megatron-bridge" in fw or "automodel" in fw
            flops = megatron_model_flops(m, t["global_batch"], gated="llama" in
                                         _text(m.get("name")).lower(), causal_halved=halved)
            source = "TFLOP/s (Megatron model FLOPs)"
        else:
            flops, source = eq3_flops(m, t["global_batch"]), "TFLOP/s (Eq. 3)"
        time_s = flops / (n * r["tflops_per_gpu"] * 1e12)
    memory = r.get("memory_per_gpu_gb")
    unit = _text(r.get("memory_unit"))
    reading = "allocator" if "gib" in unit.lower() else "nvidia-smi"
    memory_gib = None
    if memory is not None:
        memory_gib = float(memory) if reading == "allocator" else float(memory) * GB / GIB
    return Measured(time_s, source, memory_gib, reading, bool(r.get("oom")))


def skip_reason(entry: Mapping[str, Any]) -> str | None:
    """None when the entry can be evaluated, else why not."""
    kind = entry.get("kind", "measured")  # a user's own runs file need not say it
    if kind == "analytic_reference":
        return "analytic reference (checked in the model-state section)"
    if kind != "measured":
        return f"kind {kind!r} is neither measured nor analytic_reference"
    if not isinstance(entry.get("training"), Mapping) or not isinstance(entry.get("cluster"),
                                                                           Mapping):
        return "no training or cluster section"
    t = entry["training"]
    m = entry.get("model") if isinstance(entry.get("model"), Mapping) else {}
    if model_spec(entry) is None and not all(m.get(k) for k in ("layers", "hidden", "vocab",
                                                                 "seq_len")):
        return "model shape not published in the entry"
    if model_spec(entry) is not None:
        r = entry.get("results") or {}
        if not (r.get("iteration_time_s") or r.get("tokens_per_sec_per_gpu")
                or r.get("memory_per_gpu_gb") or r.get("oom")):
            return "a model given by reference needs iteration_time_s or tokens_per_sec_per_gpu"
    if (t.get("ep") or 1) > 1 or (m.get("moe") or {}):
        return "mixture-of-experts run (bench/moe_accuracy.py)"
    if dtype_of(_text(t.get("precision"))) is None:
        return "FP4 precision (not in the cost model)"
    if t.get("micro_batch") is None and "deepspeed" in _text(t.get("framework")).lower():
        return "micro-batch size not published"
    if t.get("micro_batch") is None and "metaseq" in _text(t.get("framework")).lower():
        return "micro-batch size not published"
    r = entry.get("results") or {}
    if not (r.get("oom") or r.get("iteration_time_s") or r.get("tokens_per_sec_per_gpu")
            or r.get("tflops_per_gpu") or r.get("memory_per_gpu_gb")):
        return "nothing measured to compare"
    return None


def run_of(entry: Mapping[str, Any], model: ModelGraph, cluster: Cluster) -> CalibrationRun:
    """The run of ``entry`` on its built ``model`` and ``cluster`` (clusters/calibration_runs.py
    builds them from the entry)."""
    t = entry["training"]
    m = entry["model"] if isinstance(entry["model"], Mapping) and model_spec(entry) is None else {
        "layers": model.num_blocks, "hidden": model.hidden, "heads": None, "ffn_hidden": None,
        "vocab": model.vocab, "seq_len": seq_len_of(entry)}
    framework = _text(t.get("framework"))
    prof = profile_for_framework(framework)
    assumptions: list[str] = []
    tp, pp, cp = t.get("tp") or 1, t.get("pp") or 1, t.get("cp") or 1
    micro = t.get("micro_batch")
    if micro is None:
        micro = 1
        assumptions.append(ASSUMED_MICRO_BATCH)
    sp = t.get("sp")
    if sp is None:
        sp = tp > 1 and prof.sp != "none"
        if tp > 1:
            assumptions.append(f"sp {'on' if sp else 'off'}")
    zero = t.get("zero_stage")
    if zero is None:
        zero = 1 if prof.name == "megatron" else 0
        assumptions.append(f"zero {zero}")
    v = t.get("virtual_stages_per_pp_rank")
    if v is None:
        v = 1
        if pp > 1:
            assumptions.append("no interleaving")
    recompute_text = t.get("recompute")
    offloaded = int(t.get("cpu_offloading_num_layers") or 0)
    if recompute_text is None:
        assumptions.append(f"no recompute ({offloaded} blocks' activations offloaded to the host)"
                           if offloaded else "no recompute")
    recompute, policy, every_nth = recompute_of(_text(recompute_text) or "none", prof)
    dtype = dtype_of(_text(t.get("precision"))) or "bf16"
    dp = t.get("dp") or entry["cluster"]["num_gpus"] // (tp * pp * cp)
    config = ParallelConfig(tp=tp, pp=pp, dp=dp, cp=cp, global_batch=t["global_batch"],
                            seq_len=m["seq_len"], sp=bool(sp), zero_stage=zero, micro_batch=micro,
                            virtual_stages=v, dtype=dtype)
    eager = any(k in framework.lower() for k in ("megatron-deepspeed", "gpt-neox", "metaseq"))
    overlap = prof.name != "deepspeed"
    options = RuntimeOptions(runtime=prof.state_layout_for(dtype), profile=prof.name,
                             attention_kernel="eager" if eager else "flash",
                             overlap_grad_reduce=overlap, overlap_param_gather=overlap,
                             dropout=bool(t.get("dropout")))
    shape = (m["layers"], m["hidden"], m.get("heads"), m.get("ffn_hidden"), m["vocab"],
             m["seq_len"])
    source = _text((entry.get("source") or {}).get("title")) or entry["id"]
    return CalibrationRun(
        id=entry["id"], source=source, profile=prof, recompute_policy=policy,
        model=model, cluster=cluster, config=config, options=options,
        measured=measured_of(entry, framework),
        regime=regime_of(prof.name, cluster.gpu.name, tp, pp, cp, zero),
        assumptions=tuple(assumptions), model_shape=shape, recompute=recompute,
        recompute_published=recompute_text is not None, every_nth=every_nth,
        compiled=framework_compiled(framework), offloaded_layers=offloaded,
        pp_partition=(_text(t.get("pp_partition")).split() or [""])[0] if pp > 1 else "")


