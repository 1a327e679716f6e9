"""The plan file of a serving deployment (``"workload": "serve"``) and its ``check``.

Same envelope as a training plan (``schema_version``, ``kind``, ``inputs`` with the embedded
model / cluster IR and their content hashes, ``model``, ``cluster``, ``solver``, ``predicted``),
with an ``inference`` section instead of the training sections (``parallelism``, ``stages``,
``layers``): the workload, the runtime, the deployment (worker degrees, replicas or pools,
batch and token caps, memory fraction), each pool's memory and iteration time, the runners-up
and, without latency targets, the Pareto frontier. Schema: ``planner/plan_schema.json``
(``$defs/inference``). ``check`` re-evaluates the deployment from the embedded inputs: does
the planned batch and context fit with its KV cache, and does it still meet its targets.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from planner.errors import ExitCode, PlannerError
from planner.hardware import GIB, Cluster
from planner.ir import ModelGraph
from planner.serve.evaluate import ServingEvaluation, evaluate_serving
from planner.serve.workload import MTP_ACCEPTANCE, ServingConfig, ServingWorkload, WorkerConfig

WORKLOAD = "serve"


def _rounded(value):
    from planner.report import rounded

    return rounded(value)


def workload_dict(w: ServingWorkload) -> dict:
    return {"isl": w.isl, "osl": w.osl, "concurrency": w.concurrency,
            "request_rate_per_s": w.request_rate_per_s, "ttft_ms": w.ttft_ms,
            "tpot_ms": w.tpot_ms, "mode": w.mode, "dtype": w.dtype,
            "kv_dtype": w.kv_cache_dtype,
            **({"speculative": {"method": "mtp", "draft_tokens": w.draft_tokens,
                                "acceptance": w.acceptance}} if w.draft_tokens else {})}


def workload_from_dict(d: dict) -> ServingWorkload:
    spec = d.get("speculative") or {}
    return ServingWorkload(isl=d["isl"], osl=d["osl"], concurrency=d.get("concurrency"),
                           request_rate_per_s=d.get("request_rate_per_s"),
                           ttft_ms=d.get("ttft_ms"), tpot_ms=d.get("tpot_ms"), mode=d["mode"],
                           dtype=d["dtype"], kv_dtype=d.get("kv_dtype"),
                           draft_tokens=spec.get("draft_tokens", 0),
                           acceptance=spec.get("acceptance", MTP_ACCEPTANCE))


def _worker(d: dict) -> WorkerConfig:
    return WorkerConfig(tp=d["tp"], pp=d["pp"], ep=d["ep"], attention_dp=d["attention_dp"])


def config_from_dict(d: dict) -> ServingConfig:
    capture = tuple(d.get("prefill_capture_num_tokens") or ())
    if d["mode"] == "aggregated":
        return ServingConfig("aggregated", worker=_worker(d["worker"]), replicas=d["replicas"],
                             batch=d["batch"], max_num_tokens=d["max_num_tokens"],
                             prefill_capture_num_tokens=capture)
    return ServingConfig("disaggregated", prefill=_worker(d["prefill"]),
                         decode=_worker(d["decode"]), prefill_workers=d["prefill"]["workers"],
                         decode_workers=d["decode"]["workers"], batch=d["batch"],
                         max_num_tokens=d["max_num_tokens"],
                         prefill_batch=d["prefill"]["batch"],
                         prefill_capture_num_tokens=capture)


def point_dict(ev: ServingEvaluation) -> dict:
    """A runner-up or frontier point: the deployment and its predicted numbers."""
    return {"deployment": ev.config.as_dict(), "predicted": ev.predicted()}


def evaluation_doc(ev: ServingEvaluation) -> dict:
    """What ``evaluate --workload serve --json`` prints (and a plan's body)."""
    m, c = ev.model, ev.cluster
    return _rounded({
        "workload": WORKLOAD,
        "model": {"name": m.name, "family": m.family, "params": m.params,
                  "active_params": m.active_params, "num_layers": m.num_blocks,
                  "hidden": m.hidden, "vocab": m.vocab, "source": m.source},
        "cluster": {"name": c.name, "gpu": c.gpu.name, "num_gpus": c.num_gpus,
                    "num_nodes": c.num_nodes, "gpus_per_node": c.gpus_per_node,
                    "gpu_memory_gib": c.gpu.memory_gib},
        "inference": {"workload": workload_dict(ev.workload), "runtime": ev.runtime,
                      "deployment": ev.config.as_dict(),
                      "pools": [p.as_dict() for p in ev.pools],
                      "problems": list(ev.problems)},
        "predicted": ev.predicted(),
    })


def make_serve_plan(best: ServingEvaluation, *, model_spec: str, cluster_spec: str,
                    nodes: int | None, solver: dict, alternatives=(), frontier=()) -> dict:
    from planner.plan import KIND, SCHEMA_VERSION, content_hash
    from planner.serialize import cluster_to_dict, model_to_dict

    doc = evaluation_doc(best)
    doc["inference"]["alternatives"] = _rounded([point_dict(a) for a in alternatives])
    doc["inference"]["frontier"] = _rounded([point_dict(f) for f in frontier])
    doc.update({
        "schema_version": SCHEMA_VERSION, "kind": KIND,
        "solver": _rounded(solver),
        "inputs": {
            "model": {"spec": model_spec, "name": best.model.name,
                      "sha256": content_hash(best.model), "ir": model_to_dict(best.model)},
            "cluster": {"spec": cluster_spec, "name": best.cluster.name,
                        "num_nodes": best.cluster.num_nodes, "nodes": nodes,
                        "sha256": content_hash(best.cluster),
                        "ir": cluster_to_dict(best.cluster)},
        },
    })
    return doc


def is_serve_plan(doc: Any) -> bool:
    return isinstance(doc, dict) and doc.get("workload") == WORKLOAD


@dataclass(frozen=True)
class ServeCheckReport:
    """Shaped like :class:`planner.check.CheckReport`'s dict so ``check`` renders it alike."""

    plan_path: str | None
    inputs: dict
    problems: tuple[dict, ...]
    peak_gib: float | None
    capacity_gib: float
    evaluation: dict | None

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.OK if self.ok else ExitCode.FAILED

    def to_dict(self) -> dict:
        return _rounded({"plan": self.plan_path, "ok": self.ok, "workload": WORKLOAD,
                         "inputs": self.inputs, "problems": list(self.problems), "stages": [],
                         "remedies": [], "peak_gib": self.peak_gib,
                         "capacity_gib": self.capacity_gib, "evaluated": self.evaluation})


def check_serve_plan(doc: dict, *, model: ModelGraph | None = None,
                     cluster: Cluster | None = None, model_source: str | None = None,
                     cluster_source: str | None = None, allow_stale: bool = False,
                     plan_path: str | None = None) -> ServeCheckReport:
    from planner.plan import content_hash
    from planner.serialize import cluster_from_dict, model_from_dict

    embedded = {"model": model is None, "cluster": cluster is None}
    model = model if model is not None else model_from_dict(doc["inputs"]["model"]["ir"],
                                                            "$.inputs.model.ir")
    cluster = cluster if cluster is not None else cluster_from_dict(
        doc["inputs"]["cluster"]["ir"], "$.inputs.cluster.ir")
    problems: list[dict] = []
    inputs = {}
    for role, value, source in (("model", model, model_source),
                                ("cluster", cluster, cluster_source)):
        stale = content_hash(value) != doc["inputs"][role]["sha256"]
        inputs[role] = {"name": value.name, "stale": stale,
                        "source": "embedded" if embedded[role] else (source or "given")}
        if stale and embedded[role]:
            problems.append({"code": "integrity", "message": f"the {role} embedded in the plan "
                             f"does not match inputs.{role}.sha256: the plan was edited"})
        elif stale and not allow_stale:
            problems.append({"code": "stale", "message": f"the {role} is not the one the plan "
                             f"was made for: re-plan, or pass --allow-stale"})
    inference = doc["inference"]
    evaluation = None
    peak = None
    try:
        workload = workload_from_dict(inference["workload"])
        config = config_from_dict(inference["deployment"])
        ev = evaluate_serving(model, cluster, workload, config, inference["runtime"])
    except PlannerError as error:
        problems.append({"code": "config", "message": error.message})
    else:
        evaluation = ev.predicted()
        pool = ev.pools[-1]
        mem = pool.memory
        planned = inference["deployment"]["batch"]
        peak = (mem.weights_bytes + mem.activation_bytes + mem.reserve_bytes) / GIB
        if not ev.fits:
            for problem in ev.problems:
                problems.append({"code": "memory", "message": problem})
        else:
            held = mem.kv_bytes_for(workload.max_seq_len, pool.worker.rank_batch(
                min(planned, pool.batch or planned)), 1) / GIB
            peak += held
            if pool.max_batch < min(planned, math.ceil(ev.concurrency / max(pool.workers, 1))):
                problems.append({"code": "memory", "message": f"the KV cache holds "
                                 f"{pool.max_batch} sequences of {workload.max_seq_len} tokens "
                                 f"per worker, fewer than the planned {planned}"})
            if not ev.meets_targets():
                problems.append({"code": "targets", "message": f"predicted TTFT "
                                 f"{ev.ttft_s * 1e3:.1f} ms / TPOT {ev.tpot_s * 1e3:.2f} ms miss "
                                 f"the plan's targets"})
    capacity = cluster.gpu.memory_gib
    return ServeCheckReport(plan_path, inputs, tuple(problems), peak, capacity, evaluation)


def load_any_plan(path):
    """A plan file: a serving plan as its (validated) document, a training plan as a
    :class:`~planner.plan_types.Plan`."""
    from planner.plan_io import load_plan
    from planner.plan_types import Plan

    doc = load_plan(path)
    return doc if is_serve_plan(doc) else Plan.from_dict(doc)
