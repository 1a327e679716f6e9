"""The typed plan: a plan file decoded once into the domain objects every consumer needs.

Consumes a plan document (a dict as :func:`planner.plan_io.load_plan` returns it, shaped by
``planner/plan_schema.json``, which stays the contract); produces a :class:`Plan` holding the
embedded model and cluster, the :class:`~planner.config.ParallelConfig` (so the
:class:`~planner.mesh.Mesh` and the workload), the :class:`~planner.strategy.LayerPlacement` and
the :class:`~planner.config.RuntimeOptions`, next to the document itself for the sections that
are records of a prediction (stages, predicted, solver, alternatives, inputs). ``check``, the
exporters and ``verify`` take a Plan; nothing else decodes a plan document.

Round trip: ``Plan.from_dict(doc).to_dict() == doc`` for every valid document; ``to_dict``
writes the decisions from the typed fields (so a Plan changed with :meth:`Plan.with_changes`
serialises its new decisions) and every other section as recorded.
"""
from __future__ import annotations

import copy
import os
from dataclasses import asdict, dataclass, replace
from types import MappingProxyType
from typing import Any, Mapping

from planner.config import RUNTIME_STATE_BYTES, ParallelConfig, RuntimeOptions
from planner.cost.context import make_context
from planner.cost.memory import CROSS_ENTROPY
from planner.cost.recompute_modules import DEFAULT_RECOMPUTE_MODULES, validate_modules
from planner.cost.terms import layer_tensor_degrees
from planner.errors import invalid
from planner.hardware import Cluster, MultiPoolCluster
from planner.ir import ModelGraph
from planner.mesh import Mesh
from planner.moe import MoeOptions
from planner.strategy import LayerOption, LayerPlacement, Layout, Recompute
from planner.workload import TrainingWorkload

# parallelism keys that are decisions (the others are derived: num_micro_batches, schedule,
# recompute summary)
_CONFIG_KEYS = ("tp", "pp", "dp", "cp", "ep", "sp", "zero_stage", "micro_batch",
                "global_batch", "seq_len", "virtual_stages", "dtype")
_RUNTIME_KEYS = ("runtime", "attention_kernel", "dropout", "overlap_grad_reduce",
                 "overlap_param_gather", "tp_comm_overlap",
                 # runtime profile and calibrated behaviour (planner/profiles.py, calibration)
                 "profile", "allocator_overhead", "comm_slowdown", "micro_batch_overhead_s",
                 "block_overhead_s", "elementwise_factor", "fp8_gemm_factor", "fp8_saved_inputs",
                 "matmul_efficiency", "attention_efficiency", "pool_efficiency",
                 "recompute_modules", "cross_entropy", "fp8_attention", "fp8_bf16_gemms",
                 "expert_gemm_per_expert", "compiled", "elementwise")


@dataclass(frozen=True, eq=False)
class Plan:
    model: ModelGraph
    cluster: Cluster | MultiPoolCluster
    config: ParallelConfig
    placement: LayerPlacement
    runtime: RuntimeOptions
    document: Mapping[str, Any]  # the document as read (read-only); see to_dict
    # a plan across pools (schema_version 2, planner/hetero/plan_file.py): the pool of every
    # stage, and ``cluster`` is a MultiPoolCluster; None on one pool
    stage_pools: tuple[str, ...] | None = None

    @property
    def across_pools(self) -> bool:
        return self.stage_pools is not None

    # -- views -----------------------------------------------------------------------------
    @property
    def mesh(self) -> Mesh:
        return self.config.mesh

    @property
    def workload(self) -> TrainingWorkload:
        return self.config.workload

    @property
    def layers(self) -> list[dict[str, Any]]:
        """The plan's per-layer entries in layer order (a copy)."""
        return sorted(copy.deepcopy(list(self.document["layers"])), key=lambda x: x["index"])

    def layer_tensor_degrees(self) -> list[int | None]:
        """Each layer's tensor degree under its layout, as the cost model reads it
        (:func:`planner.cost.terms.layer_tensor_degrees`); None where a layout does not
        divide the plan's mesh."""
        ctx = None if self.across_pools else make_context(self.model, self.cluster,
                                                             self.config, self.runtime)
        return layer_tensor_degrees(ctx, self.config, self.placement.options)

    def recorded_calibration(self):
        """The calibration profile the plan was made with (``inputs.calibration``: ``plan
        --calibration``), decoded and validated; None where the plan records none (made with
        the shipped constants)."""
        record = self.document["inputs"].get("calibration")
        if record is None:
            return None
        from planner.calibration.store import profile_from_record

        return profile_from_record(record, f"{record.get('spec')} (recorded in the plan)")

    def section(self, name: str) -> Any:
        """A copy of a recorded section of the document (``stages``, ``predicted``, ...)."""
        return copy.deepcopy(self.document[name])

    # -- decoding --------------------------------------------------------------------------
    @staticmethod
    def from_dict(doc: Mapping[str, Any]) -> "Plan":
        """Decode a plan document (schema-validated, or at least with the keys read here);
        raises PlannerError (INVALID_INPUT) naming what is missing or wrong."""
        from planner.serialize import cluster_from_dict, model_from_dict, pool_cluster_from_dict

        if isinstance(doc, Mapping) and doc.get("workload") == "serve":
            raise invalid("this is a serving plan (workload serve); this command takes a "
                          "training plan",
                          "serving plans take `check`, `show` and "
                          "`export --format vllm|sglang|trtllm|json`")
        try:
            model = model_from_dict(doc["inputs"]["model"]["ir"], "$.inputs.model.ir")
            p = doc["parallelism"]
            pools = tuple(p["stage_pools"]) if "stage_pools" in p else None
            cluster = (cluster_from_dict if pools is None else pool_cluster_from_dict)(
                doc["inputs"]["cluster"]["ir"], "$.inputs.cluster.ir")
            config = ParallelConfig(**{k: p[k] for k in _CONFIG_KEYS},
                                    etp=0 if p.get("etp", p["tp"]) == p["tp"] else p["etp"],
                                    dp_shard=int(p.get("dp_shard", 0)),
                                    hpz=int(p.get("hpz", 0)),
                                    pipeline_schedule=str(p.get("schedule", "")),
                                    pipeline_layout=str(p.get("pipeline_layout", "")))
            layers = sorted(doc["layers"], key=lambda layer: layer["index"])
            placement = LayerPlacement(
                tuple(int(layer["stage"]) for layer in layers),
                tuple(LayerOption(Recompute(layer["recompute"]),
                                  Layout(layer.get("layout", Layout.MESH.value)),
                                  bool(layer.get("offload", False)),
                                  bool(layer.get("act_offload", False)))
                      for layer in layers))
            r = doc["runtime"]
            runtime = RuntimeOptions(**{k: r[k] for k in _RUNTIME_KEYS
                                        if k in r and k not in ("pool_efficiency",
                                                                "recompute_modules",
                                                                "fp8_bf16_gemms")},
                                     fp8_bf16_gemms=tuple(r.get("fp8_bf16_gemms", ())),
                                     recompute_modules=validate_modules(
                                         r.get("recompute_modules", DEFAULT_RECOMPUTE_MODULES)),
                                     pool_efficiency=tuple(tuple(x) for x in
                                                           r.get("pool_efficiency", ())),
                                     moe=MoeOptions(**r["moe"]) if "moe" in r else MoeOptions())
        except (KeyError, TypeError, ValueError) as error:
            raise invalid(f"plan document: missing or invalid {error} (inputs.model.ir, "
                          "inputs.cluster.ir, parallelism, layers and runtime are needed)",
                          "re-create the plan with `shardplan plan ... -o FILE`") from None
        if runtime.cross_entropy not in CROSS_ENTROPY:
            raise invalid(f"$.runtime.cross_entropy: unknown {runtime.cross_entropy!r}; one of "
                          f"{', '.join(CROSS_ENTROPY)}")
        if runtime.runtime not in RUNTIME_STATE_BYTES:
            raise invalid(f"$.runtime.runtime: unknown runtime {runtime.runtime!r}; this "
                          f"shardplan knows {', '.join(sorted(RUNTIME_STATE_BYTES))}")
        return Plan(model, cluster, config, placement, runtime,
                    MappingProxyType(copy.deepcopy(dict(doc))), pools)

    @staticmethod
    def load(path: str | os.PathLike) -> "Plan":
        """Read, schema-validate and decode a plan file."""
        from planner.plan_io import load_plan

        return Plan.from_dict(load_plan(path))

    # -- encoding --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The document: decisions from the typed fields, every other section as recorded."""
        from planner.serialize import cluster_to_dict, model_to_dict

        doc = copy.deepcopy(dict(self.document))
        doc["inputs"]["model"]["ir"] = model_to_dict(self.model)
        doc["inputs"]["cluster"]["ir"] = cluster_to_dict(self.cluster)
        for key in _CONFIG_KEYS:
            doc["parallelism"][key] = getattr(self.config, key)
        doc["parallelism"]["schedule"] = self.config.schedule
        if "dp_shard" in doc["parallelism"] or self.config.dp_shard:  # HSDP (planner.mesh)
            doc["parallelism"]["dp_shard"] = self.config.dp_shard or self.config.dp
        if "hpz" in doc["parallelism"] or self.config.hpz:  # ZeRO++ hpZ (planner.config)
            doc["parallelism"]["hpz"] = self.config.hpz
        if "etp" in doc["parallelism"] or self.config.etp:  # the expert mesh (planner.mesh)
            doc["parallelism"]["etp"] = self.mesh.expert_tp
            doc["parallelism"]["edp"] = self.mesh.expert_dp
        for key in _RUNTIME_KEYS:
            value = getattr(self.runtime, key)
            if key == "pool_efficiency":
                value = [list(row) for row in value]
                if value or key in doc["runtime"]:
                    doc["runtime"][key] = value
            elif key == "recompute_modules":
                if key in doc["runtime"] or value != DEFAULT_RECOMPUTE_MODULES:
                    doc["runtime"][key] = list(value)
            elif key == "fp8_bf16_gemms":
                if key in doc["runtime"] or value:
                    doc["runtime"][key] = list(value)
            elif key in doc["runtime"] or value != getattr(RuntimeOptions(), key):
                doc["runtime"][key] = value
        if self.stage_pools is not None:
            doc["parallelism"]["stage_pools"] = list(self.stage_pools)
        if "moe" in doc["runtime"] or self.runtime.moe != MoeOptions():
            doc["runtime"]["moe"] = asdict(self.runtime.moe)
        ordered = sorted(doc["layers"], key=lambda layer: layer["index"])
        for entry, stage, option in zip(ordered, self.placement.stage, self.placement.options):
            entry["stage"] = stage
            entry["recompute"] = option.recompute.value
            if "layout" in entry or option.layout is not Layout.MESH:
                entry["layout"] = option.layout.value
            if "offload" in entry or option.offload:
                entry["offload"] = option.offload
            if "act_offload" in entry or option.act_offload:
                entry["act_offload"] = option.act_offload
        return doc

    # -- the cost model on this plan -------------------------------------------------------
    def with_changes(self, **changes: Any) -> "Plan":
        """The plan with ParallelConfig fields changed (``zero_stage=1``), RuntimeOptions
        fields changed (``runtime_overlap_grad_reduce=False``) and every layer's option changed
        (``option_act_offload=False``: LayerOption fields)."""
        runtime = {k[len("runtime_"):]: v for k, v in changes.items() if k.startswith("runtime_")}
        option = {k[len("option_"):]: v for k, v in changes.items() if k.startswith("option_")}
        config = {k: v for k, v in changes.items()
                  if not k.startswith(("runtime_", "option_"))}
        placement = self.placement
        if option:
            placement = replace(placement, options=tuple(replace(o, **option)
                                                         for o in placement.options))
        return replace(self, config=replace(self.config, **config),
                       runtime=replace(self.runtime, **runtime), placement=placement)

    def evaluate(self, *, model: ModelGraph | None = None, cluster: Cluster | None = None,
                 options: RuntimeOptions | None = None):
        """The current cost model's :class:`~planner.cost.model.Evaluation` of this plan (the
        embedded model, cluster and runtime options unless others are given); across pools,
        the :class:`~planner.hetero.evaluate.HeteroEvaluation`."""
        from planner.cost.model import evaluate

        options = options or self.runtime
        if self.stage_pools is not None:
            from planner.hetero.evaluate import hetero_evaluate
            from planner.hetero.layout import StagePools

            return hetero_evaluate(model or self.model, cluster or self.cluster, self.config,
                                   StagePools(self.stage_pools), self.placement, options)
        return evaluate(model or self.model, cluster or self.cluster, self.config,
                        self.placement, options)

    def stage_contexts(self, options: RuntimeOptions | None = None) -> list:
        """The cost context of every pipeline stage (across pools: its pool's GPU and links)."""
        options = options or self.runtime
        if self.stage_pools is not None:
            from planner.hetero.terms import stage_contexts

            return stage_contexts(self.model, self.cluster, self.config, self.stage_pools,
                                  options)
        from planner.cost.context import make_context

        return [make_context(self.model, self.cluster, self.config, options)] * self.config.pp
