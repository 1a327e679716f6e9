"""The plan file: a versioned JSON document a runtime (or ``shardplan check``) consumes.

Consumes a :class:`~planner.solve.search.SearchResult` (or a single Evaluation) and the inputs
that produced it; produces a plain dict with sorted keys and units in key names, and writes it
atomically. The body is the ``evaluate`` document (model, cluster, parallelism, stages,
predicted) plus per-layer decisions, the solver record, runners-up and the inputs with a
content hash of each (so a later ``check`` can tell a stale plan) and the model IR and cluster
themselves (``inputs.model.ir``, ``inputs.cluster.ir``, see :mod:`planner.serialize`), so that
``check`` and the exporters need nothing but the plan file. The JSON Schema is
``planner/plan_schema.json``; :mod:`planner.plan_io` reads and validates plan files.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import is_dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from planner.cost.model import Evaluation
from planner.hardware import Cluster
from planner.ir import ModelGraph
from planner.report import evaluation_dict, rounded
from planner.serialize import plain_fields

SCHEMA_VERSION = 1
POOL_SCHEMA_VERSION = 2  # a plan across pools (planner/hetero/plan_file.py)
KIND = "shardplan-plan"


def _plain(value: Any) -> Any:
    if is_dataclass(value):  # not asdict(): it deep-copies, and mappingproxy cannot be copied
        return {f.name: _plain(getattr(value, f.name)) for f in plain_fields(value)}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "items"):  # mappingproxy
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def canonical_json(value: Any) -> str:
    return json.dumps(_plain(value), sort_keys=True, separators=(",", ":"), allow_nan=False)


# Labels that say where a description was read from, not what it describes: a model config
# read through another path (an HF config's name is its file's stem, its source the path), or a
# preset versus a copy of its file, must not make a plan stale.
_LABELS = {ModelGraph: ("name", "source"), Cluster: ("name", "source", "description")}


def content_hash(value: Any) -> str:
    """sha256 of the canonical JSON of a model or cluster description: independent of the
    format and path it was read from (the labels in ``_LABELS`` are left out)."""
    plain = _plain(value)
    for cls, labels in _LABELS.items():
        if isinstance(value, cls):
            plain = {k: v for k, v in plain.items() if k not in labels}
    return "sha256:" + hashlib.sha256(canonical_json(plain).encode()).hexdigest()


def layers_list(ev: Evaluation) -> list[dict[str, Any]]:
    out = [{"index": i, "name": layer.name, "kind": layer.kind.value,
            "stage": ev.placement.stage[i], "recompute": ev.placement.options[i].recompute.value,
            "layout": ev.placement.options[i].layout.value, "params": layer.params}
           for i, layer in enumerate(ev.model.layers)]
    for entry, option in zip(out, ev.placement.options):
        if option.offload:  # only then: plans without offload keep their bytes
            entry["offload"] = True
        if option.act_offload:
            entry["act_offload"] = True
    return out


def alternative_dict(ev: Evaluation, best: Evaluation) -> dict[str, Any]:
    doc = evaluation_dict(ev)
    return {"parallelism": doc["parallelism"],
            "step_time_s": ev.step_time_s,
            "slower_than_best": ev.step_time_s / best.step_time_s - 1,
            "peak_memory_gib": ev.peak_memory_bytes / 2**30,
            "stage_layers": [len(s.layers) for s in ev.stages]}


def inputs_dict(ev: Evaluation, model_spec: str, cluster_spec: str, nodes: int | None) -> dict:
    return {
        "model": {"spec": model_spec, "name": ev.model.name, "seq_len": ev.config.seq_len,
                  "sha256": content_hash(ev.model)},
        "cluster": {"spec": cluster_spec, "name": ev.cluster.name,
                    "num_nodes": ev.cluster.num_nodes, "sha256": content_hash(ev.cluster)},
        "global_batch": ev.config.global_batch,
        "dtype": ev.config.dtype,
    }


def make_plan(best: Evaluation, *, model_spec: str, cluster_spec: str, nodes: int | None = None,
              solver: dict | None = None, alternatives: list[Evaluation] = (),
              pins: dict | None = None) -> dict[str, Any]:
    return plan_document(evaluation_dict(best), best, SCHEMA_VERSION,
                         inputs_dict(best, model_spec, cluster_spec, nodes), solver,
                         [alternative_dict(a, best) for a in alternatives], pins)


def plan_document(body: dict[str, Any], best, version: int, inputs: dict[str, Any],
                  solver: dict | None, alternatives: list[dict], pins: dict | None
                  ) -> dict[str, Any]:
    """The plan file around an evaluation's ``body`` (one pool: planner.report; across pools:
    planner/hetero/plan_file.py): envelope, inputs, layers, solver, runners-up, pins, IRs."""
    doc = dict(body)
    doc.update({
        "schema_version": version,
        "kind": KIND,
        "inputs": inputs,
        "layers": layers_list(best),
        "solver": solver or {"status": "EVALUATED"},
        "alternatives": alternatives,
        "pins": pins or {},
    })
    doc = rounded(doc)
    # Embedded after rounding: the IR must round-trip exactly (its hash is inputs.*.sha256).
    from planner.serialize import cluster_to_dict, model_to_dict

    doc["inputs"]["model"]["ir"] = model_to_dict(best.model)
    doc["inputs"]["cluster"]["ir"] = cluster_to_dict(best.cluster)
    return doc


def dumps(doc: dict) -> str:
    return json.dumps(doc, sort_keys=True, indent=2, allow_nan=False) + "\n"


def write_plan(doc: dict, path: str | os.PathLike, *, force: bool = False, **commit) -> Path:
    """Write a plan document atomically (see :func:`write_text`)."""
    return write_text(dumps(doc), path, force=force, **commit)


def write_text(text: str, path: str | os.PathLike, *, force: bool = False, **commit) -> Path:
    """Write atomically and exclusively: :func:`planner.writer.write_file`."""
    from planner.writer import write_file

    return write_file(text, path, force=force, **commit)
