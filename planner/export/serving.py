"""What the serving exporters share: the deployment of a serving plan (``workload: serve``,
:mod:`planner.serve.plan`) as per-worker settings, in each runtime's units.

Consumes a validated serving plan document; produces :class:`WorkerSpec` rows (one per kind of
worker: the aggregated worker, or the prefill and the decode worker) that ``vllm``, ``sglang``
and ``trtllm`` exporters turn into arguments. A training plan is refused (exit code 2): serving
exports need a plan made with ``shardplan plan --workload serve``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from planner.errors import invalid


@dataclass(frozen=True)
class WorkerSpec:
    role: str  # aggregated | prefill | decode
    count: int  # identical workers (replicas, or the pool's size)
    tp: int
    pp: int
    ep: int
    attention_dp: int
    # sequences each attention-DP rank admits (planner.serve.workload.WorkerConfig.rank_batch:
    # the serving model's reading of the plan's batch cap; a prefill worker's prompts per rank),
    # pp micro-batches of micro_batch
    rank_batch: int
    max_num_tokens: int  # tokens per iteration of each attention-DP rank
    max_model_len: int  # isl + osl
    memory_fraction: float
    dtype: str  # bf16 | fp8 | fp4 (weights)
    kv_dtype: str  # bf16 | fp8
    model: str  # the model spec the plan was made for
    draft_tokens: int = 0  # MTP speculative decoding (decode and aggregated workers; 0: off)
    # token counts of the piecewise CUDA graphs of prompt-carrying iterations (workers that
    # prefill: aggregated and prefill; empty: eager)
    capture_num_tokens: tuple[int, ...] = ()

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.attention_dp

    @property
    def micro_batch(self) -> int:
        """Sequences in each of a rank's ``pp`` micro-batches
        (:meth:`planner.serve.workload.WorkerConfig.micro_batch`; ``rank_batch`` is ``pp`` of
        them)."""
        assert self.rank_batch % self.pp == 0, (self.rank_batch, self.pp)
        return self.rank_batch // self.pp


def worker_specs(doc: dict[str, Any], fmt: str) -> list[WorkerSpec]:
    if doc.get("workload") != "serve":
        raise invalid(f"the {fmt} export needs a serving plan; this is a training plan",
                      "make one with `shardplan plan --workload serve ... -o PLAN`")
    from planner.serve.plan import config_from_dict
    from planner.serve.runtime import runtime

    inf = doc["inference"]
    wl, dep = inf["workload"], inf["deployment"]
    rt = runtime(fmt if fmt in ("vllm", "sglang", "trtllm") else inf["runtime"])
    common = dict(max_num_tokens=dep["max_num_tokens"], max_model_len=wl["isl"] + wl["osl"],
                  memory_fraction=rt.memory_fraction, dtype=wl["dtype"], kv_dtype=wl["kv_dtype"],
                  model=doc["inputs"]["model"]["spec"])

    draft = (wl.get("speculative") or {}).get("draft_tokens", 0)
    capture = tuple(dep.get("prefill_capture_num_tokens") or ())

    def spec(role: str, w: dict, count: int, rank_batch: int) -> WorkerSpec:
        return WorkerSpec(role, count, w["tp"], w["pp"], w["ep"], w["attention_dp"], rank_batch,
                          **common, draft_tokens=0 if role == "prefill" else draft,
                          capture_num_tokens=() if role == "decode" else capture)

    config = config_from_dict(dep)
    if config.mode == "aggregated":
        return [spec("aggregated", dep["worker"], config.replicas,
                     config.worker.rank_batch(config.batch))]
    prefill, decode = dep["prefill"], dep["decode"]
    # a prefill worker batches `prefill_batch` prompts on each of its attention-DP ranks (with
    # pp stages, pp micro-batches of ceil(prefill_batch / pp): the same rule)
    return [spec("prefill", prefill, config.prefill_workers,
                 config.prefill.rank_batch(config.prefill_batch * config.prefill.attention_dp)),
            spec("decode", decode, config.decode_workers,
                 config.decode.rank_batch(config.batch))]


def header(spec: WorkerSpec, total: int) -> str:
    what = {"aggregated": "worker", "prefill": "prefill worker", "decode": "decode worker"}
    return (f"# {what[spec.role]}: {spec.count} x {spec.gpus} GPU(s) "
            f"(tp {spec.tp}, pp {spec.pp}, ep {spec.ep}, attention dp {spec.attention_dp}); "
            f"{total} GPUs in all")


def model_warning(spec: WorkerSpec) -> str:
    return (f"the model argument is the plan's model spec {spec.model!r}: replace it with the "
            f"checkpoint you serve (Hugging Face id or path) at the planned precision "
            f"({spec.dtype} weights, {spec.kv_dtype} KV cache)")


def capture_warnings(specs: list[WorkerSpec], fmt: str) -> list[str]:
    """A warning when the plan states piecewise CUDA-graph token counts (TensorRT-LLM's
    ``torch_compile_config``) that the ``fmt`` export does not write."""
    captured = next((s.capture_num_tokens for s in specs if s.capture_num_tokens), ())
    if not captured:
        return []
    return [f"the plan's prefill iterations were predicted with piecewise CUDA graphs of "
            f"{list(captured)} tokens (TensorRT-LLM torch_compile_config); the {fmt} export "
            f"leaves its own CUDA-graph capture sizes at their defaults"]


# A context longer than the checkpoint's positions (max_position_embeddings): vLLM's ModelConfig
# (_get_and_verify_max_len) and SGLang's ModelConfig (context_length) refuse it at start-up
# unless this environment variable is set
LONG_CONTEXT_OVERRIDE = {"vllm": "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1",
                         "sglang": "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1"}


def context_warning(doc: dict[str, Any], fmt: str | None = None) -> str | None:
    """A warning when the plan's longest request (isl + osl) exceeds the model's positions
    (``inputs.model.ir.max_seq_len``); ``fmt``: the runtime the export is for (None: the plan
    as printed)."""
    wl = doc["inference"]["workload"]
    longest = wl["isl"] + wl["osl"]
    positions = (doc["inputs"]["model"].get("ir") or {}).get("max_seq_len")
    if not positions or longest <= positions:
        return None
    text = (f"isl + osl = {longest:,} tokens is longer than the {positions:,} positions of "
            f"{doc['model']['name']} (max_position_embeddings): tokens past them need a "
            f"checkpoint whose RoPE scaling covers them")
    if fmt in LONG_CONTEXT_OVERRIDE:
        text += f"; {fmt} refuses the length at start-up unless {LONG_CONTEXT_OVERRIDE[fmt]} " \
                f"is set in its environment"
    return text


def refuse_training(fmt: str):
    raise invalid(f"the {fmt} export needs a serving plan; this is a training plan",
                  "make one with `shardplan plan --workload serve ... -o PLAN`")
