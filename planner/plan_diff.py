"""``shardplan diff``: what changed between two plans, for reviewing a plan change.

Consumes two :class:`~planner.plan_types.Plan`; produces one JSON-ready dict: the changed
degrees and batch settings, runtime options and inputs (content hashes), the per-layer moves
(stage, recomputation, layout), memory per stage and category and time per micro-batch with
their deltas, and the headline predictions. Keys are sorted and numbers rounded as in the plan
files, so the same two plans give the same document.
"""
from __future__ import annotations

from typing import Any

DEGREES = ("tp", "pp", "dp", "cp", "ep", "sp", "zero_stage", "micro_batch", "num_micro_batches",
           "virtual_stages", "global_batch", "seq_len", "dtype", "schedule", "recompute")
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


def diff(a: Any, b: Any) -> dict[str, Any]:
    da, db = a.document, b.document
    out: dict[str, Any] = {
        "degrees": _changed(da["parallelism"], db["parallelism"], DEGREES),
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
