"""``shardplan diff``: what changed between two plans, for reviewing a plan change.

Consumes two :class:`~planner.plan_types.Plan`; produces one JSON-ready dict: the changed
degrees and batch settings, runtime options and inputs (model, cluster and calibration profile
by content hash), the per-layer moves
(stage, recomputation, layout), memory per stage and category and time per micro-batch with
their deltas, and the headline predictions. Keys are sorted and numbers rounded as in the plan
files, so the same two plans give the same document.
"""
from __future__ import annotations

from typing import Any

# every setting of a plan's ``parallelism`` (docs/plan-file.md): the degrees, the expert mesh,
# hybrid sharding (dp_shard, absent = over all of dp), ZeRO++ hpZ (absent = off), an explicit
# pipeline layout and the stages' pools of a multi-pool plan
DEGREES = ("tp", "pp", "dp", "cp", "ep", "etp", "edp", "sp", "zero_stage", "dp_shard", "hpz",
           "micro_batch", "num_micro_batches", "virtual_stages", "global_batch", "seq_len",
           "dtype", "schedule", "pipeline_layout", "recompute", "stage_pools")
# what is derived from the others (edp from tp x cp x dp / (etp x ep), the number of
# micro-batches from the global batch over dp x micro-batch): left out where a change is
# described in a few words (the runners-up)
DERIVED = ("edp", "num_micro_batches")
EXPERT_MESH = ("etp", "edp")  # a dense model's (ep 1 in both plans) follow tp and dp: not told


def _settings(a: dict, b: dict) -> tuple[str, ...]:
    """The :data:`DEGREES` two parallelisms are compared on."""
    dense = a.get("ep", 1) == 1 and b.get("ep", 1) == 1
    return tuple(k for k in DEGREES if not (dense and k in EXPERT_MESH))
SHIPPED = "shipped"  # a plan made without --calibration: the shipped constants
PREDICTED = ("step_time_s", "tokens_per_s", "mfu", "peak_memory_gib", "fits")
MEMORY = ("params", "grads", "optimizer", "activations", "other", "total")


def _r(value: Any) -> Any:
    return round(value, 6) if isinstance(value, float) else value


def _pair(a: Any, b: Any) -> dict[str, Any]:
    out = {"a": _r(a), "b": _r(b)}
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and \
            not isinstance(a, bool) and not isinstance(b, bool):
        out["delta"] = _r(b - a)
    return out


def _changed(a: dict, b: dict, keys) -> dict[str, Any]:
    return {k: _pair(a.get(k), b.get(k)) for k in keys if a.get(k) != b.get(k)}


def setting_changes(best: dict, other: dict, skip: tuple[str, ...] = ()) -> list[str]:
    """How a runner-up's ``parallelism`` differs from the plan's, in words ("ep 8→4",
    "dp_shard -→4": '-' is a setting the parallelism leaves out), every setting of
    :data:`DEGREES` but the derived ones and ``skip``, in that order."""
    def text(value: Any) -> str:
        if value is None:
            return "-"
        if isinstance(value, bool):
            return "yes" if value else "no"
        if isinstance(value, list):
            return ",".join(map(str, value))
        return str(value)

    return [f"{k} {text(best.get(k))}→{text(other.get(k))}" for k in _settings(best, other)
            if k not in DERIVED and k not in skip and best.get(k) != other.get(k)]


def diff(a: Any, b: Any) -> dict[str, Any]:
    da, db = a.document, b.document
    out: dict[str, Any] = {
        "degrees": _changed(da["parallelism"], db["parallelism"],
                            _settings(da["parallelism"], db["parallelism"])),
        "runtime": _changed(da["runtime"], db["runtime"],
                            sorted(set(da["runtime"]) | set(db["runtime"]))),
        "predicted": {k: _pair(da["predicted"][k], db["predicted"][k]) for k in PREDICTED},
        "inputs": {},
    }
    for role in ("model", "cluster"):
        ia, ib = da["inputs"][role], db["inputs"][role]
        if ia["sha256"] != ib["sha256"]:
            out["inputs"][role] = {"a": ia["spec"], "b": ib["spec"],
                                   "sha256": _pair(ia["sha256"], ib["sha256"])}
    # the calibration profile (inputs.calibration, absent: the shipped constants)
    ca, cb = (d["inputs"].get("calibration") or {} for d in (da, db))
    if ca.get("sha256") != cb.get("sha256"):
        out["inputs"]["calibration"] = {"a": ca.get("spec", SHIPPED), "b": cb.get("spec", SHIPPED),
                                        "sha256": _pair(ca.get("sha256"), cb.get("sha256"))}
    la, lb = a.layers, b.layers
    if [x["name"] for x in la] == [x["name"] for x in lb]:
        moves = []
        for x, y in zip(la, lb):
            change = {k: _pair(x.get(k, "mesh" if k == "layout" else None),
                               y.get(k, "mesh" if k == "layout" else None))
                      for k in ("stage", "recompute", "layout")
                      if x.get(k, "mesh" if k == "layout" else None) !=
                      y.get(k, "mesh" if k == "layout" else None)}
            if change:
                moves.append({"index": x["index"], "name": x["name"], **change})
        out["layers"] = {"compared": True, "changed": moves}
    else:
        out["layers"] = {"compared": False, "reason": f"the models differ ({len(la)} and "
                                                      f"{len(lb)} layers)"}
    sa = {s["index"]: s for s in da["stages"]}
    sb = {s["index"]: s for s in db["stages"]}
    stages = []
    for index in sorted(set(sa) | set(sb)):
        x, y = sa.get(index), sb.get(index)
        entry: dict[str, Any] = {"index": index}
        if x is None or y is None:
            entry["only_in"] = "b" if x is None else "a"
            present = x or y
            entry["memory_gib"] = {k: _r(present["memory_gib"][k]) for k in MEMORY}
            entry["time_s"] = _r(present["time_s"])
        else:
            entry["memory_gib"] = {k: _pair(x["memory_gib"][k], y["memory_gib"][k])
                                   for k in MEMORY}
            entry["time_s"] = _pair(x["time_s"], y["time_s"])
            entry["num_layers"] = _pair(x["num_layers"], y["num_layers"])
        stages.append(entry)
    out["stages"] = stages
    out["identical"] = not (out["degrees"] or out["runtime"] or out["inputs"] or
                            (out["layers"]["compared"] and out["layers"]["changed"]) or
                            not out["layers"]["compared"] or
                            any("only_in" in s or s["memory_gib"]["total"].get("delta") or
                                s["time_s"].get("delta") for s in stages))
    return out
