"""Is a plan document well-formed? Everything that makes it impossible to run, whatever the
memory: the degrees multiply to the GPU count, every layer is placed exactly once, pipeline
stages are contiguous runs in order (round-robin chunks when interleaved) and none is empty,
``num_micro_batches = global_batch / (micro_batch x dp)``, the layers match the model's, the
summary sections agree with the per-layer ones.

Consumes a :class:`~planner.plan_types.Plan` (its recorded document is what is checked) and the
model and cluster to check it against; produces a list of :class:`~planner.check_report.Problem`.
``check`` reports them; the exporters refuse a plan that has any.
"""
from __future__ import annotations

from typing import Any

from planner.check_report import Problem
from planner.cost.pipeline import SCHEDULES, chunk_rank
from planner.hardware import Cluster
from planner.ir import ModelGraph
from planner.plan_types import Plan


def plan_problems(plan: Plan, model: ModelGraph | None = None,
                  cluster: Cluster | None = None) -> list[Problem]:
    """The structural problems of ``plan`` against ``model`` / ``cluster`` (default: the
    embedded ones)."""
    return structure_problems(plan.document, model or plan.model, cluster or plan.cluster)


def stage_runs(stages: list[int]) -> list[tuple[int, int]]:
    """Runs of equal consecutive values: [(value, length), ...]."""
    runs: list[tuple[int, int]] = []
    for s in stages:
        if runs and runs[-1][0] == s:
            runs[-1] = (s, runs[-1][1] + 1)
        else:
            runs.append((s, 1))
    return runs


def structure_problems(doc: dict[str, Any], model: ModelGraph, cluster: Cluster) -> list[Problem]:
    """Everything that makes the plan impossible to run, whatever the memory."""
    out: list[Problem] = []
    p = doc["parallelism"]
    tp, pp, dp, cp = p["tp"], p["pp"], p["dp"], p["cp"]
    product = tp * pp * dp * cp
    if "stage_pools" in p:  # a plan across pools: idle GPUs allowed, each stage on one pool
        from planner.hetero.check import pool_structure_problems

        out += pool_structure_problems(doc, cluster)
    elif product != cluster.num_gpus:
        out.append(Problem("degrees", f"degrees multiply to {product} GPUs (tp {tp} x cp {cp} x "
                                      f"dp {dp} x pp {pp}) but the cluster has "
                                      f"{cluster.num_gpus} ({cluster.num_nodes} nodes x "
                                      f"{cluster.gpus_per_node})"))
    if "stage_pools" not in p and doc["cluster"]["num_gpus"] != product:
        out.append(Problem("degrees", f"cluster.num_gpus says {doc['cluster']['num_gpus']} but "
                                      f"the degrees multiply to {product}"))
    mb, gb = p["micro_batch"], p["global_batch"]
    if gb % (mb * dp):
        out.append(Problem("micro_batches", f"global batch {gb} is not divisible by micro-batch "
                                            f"x dp = {mb} x {dp} = {mb * dp}"))
    elif p["num_micro_batches"] != gb // (mb * dp):
        out.append(Problem("micro_batches", f"num_micro_batches is {p['num_micro_batches']} but "
                                            f"global_batch / (micro_batch x dp) = {gb} / "
                                            f"({mb} x {dp}) = {gb // (mb * dp)}"))
    shard = p.get("dp_shard") or 0
    if shard and (shard >= dp or dp % shard):  # HSDP: equal shard groups, replicated
        out.append(Problem("config", f"dp_shard {shard} is not a proper divisor of dp {dp}: "
                                     f"hybrid sharding needs dp / dp_shard equal shard groups"))
    inputs = doc["inputs"]
    for key, got, want in (("global_batch", inputs["global_batch"], gb),
                           ("dtype", inputs["dtype"], p["dtype"]),
                           ("model.seq_len", inputs["model"]["seq_len"], p["seq_len"])):
        if got != want:
            out.append(Problem("inputs", f"inputs.{key} is {got!r} but parallelism says {want!r}"))
    if "edp" in p:  # the expert mesh folds the stage's GPUs: etp x ep x edp = tp x cp x dp
        etp = p.get("etp", tp)
        if etp * p["ep"] * p["edp"] != tp * cp * dp:
            out.append(Problem("degrees", f"expert mesh etp x ep x edp = {etp} x {p['ep']} x "
                                          f"{p['edp']} = {etp * p['ep'] * p['edp']} but a stage "
                                          f"has tp x cp x dp = {tp * cp * dp} GPUs"))
    spec = SCHEDULES.get(p["schedule"])
    v = p["virtual_stages"]
    if spec is None or v < spec.min_chunks or (spec.max_chunks and v > spec.max_chunks):
        fits = [name for name, s in SCHEDULES.items()
                if v >= s.min_chunks and (not s.max_chunks or v <= s.max_chunks)]
        out.append(Problem("config", f"schedule {p['schedule']!r} does not match virtual_stages "
                                     f"{v} (expected one of {', '.join(fits)})"))
        spec = None
    # an explicit layout may give the embedding and the loss chunks of their own (its rules,
    # planner/pipeline_layout.py, keep every chunk non-empty): bounded by the layers then
    bound = len(model.layers) if p.get("pipeline_layout") else model.num_blocks
    if pp * p["virtual_stages"] > max(bound, 1):
        out.append(Problem("config", f"pp x virtual_stages = {pp} x {p['virtual_stages']} "
                                     f"exceeds the {model.num_blocks} blocks of {model.name}"))
        return out
    out += _layer_problems(doc, model, pp, v, spec.placement if spec else "loop")
    return out


def _layer_problems(doc: dict[str, Any], model: ModelGraph, pp: int, v: int,
                    placement: str = "loop") -> list[Problem]:
    out: list[Problem] = []
    layers = doc["layers"]
    n = len(model.layers)
    indices = sorted(layer["index"] for layer in layers)
    if indices != list(range(len(layers))):
        seen: set[int] = set()
        dupes = sorted({i for i in indices if i in seen or seen.add(i)})
        missing = sorted(set(range(len(layers))) - set(indices))
        detail = "; ".join(part for part in (
            f"placed more than once: {_ranges(dupes)}" if dupes else "",
            f"missing: {_ranges(missing)}" if missing else "",
            f"out of range: {_ranges([i for i in indices if i >= len(layers)])}"
            if any(i >= len(layers) for i in indices) else "") if part)
        out.append(Problem("placement", f"every layer must be placed exactly once (indices "
                                        f"0..{len(layers) - 1}); {detail}"))
        return out
    if len(layers) != n:
        out.append(Problem("layers", f"the plan places {len(layers)} layers but {model.name} has "
                                     f"{n} ({model.num_blocks} blocks plus embedding and head)"))
        return out
    ordered = sorted(layers, key=lambda layer: layer["index"])
    for entry, layer in zip(ordered, model.layers):
        if entry["name"] != layer.name or entry["kind"] != layer.kind.value:
            out.append(Problem("layers", f"layer {entry['index']} is {entry['name']!r} "
                                         f"({entry['kind']}) in the plan but {layer.name!r} "
                                         f"({layer.kind.value}) in {model.name}"))
            return out
        if entry["kind"] != "block" and entry["recompute"] != "none":
            out.append(Problem("placement", f"layer {entry['name']!r} ({entry['kind']}) cannot be "
                                            f"recomputed (only blocks are)"))
    if doc["model"]["num_layers"] != model.num_blocks:
        out.append(Problem("layers", f"model.num_layers says {doc['model']['num_layers']} but "
                                     f"{model.name} has {model.num_blocks} blocks"))
    stages = [layer["stage"] for layer in ordered]
    bad = sorted({s for s in stages if s >= pp})
    if bad:
        out.append(Problem("placement", f"stage {_ranges(bad)} does not exist (pp is {pp}, "
                                        f"stages are 0..{pp - 1})"))
        return out
    runs = [s for s, _ in stage_runs(stages)]
    expected = [chunk_rank(k, pp, placement) for k in range(pp * v)]
    # a V keeps chunks pp - 1 and pp on the last rank: one run there
    expected = [s for k, s in enumerate(expected) if k == 0 or s != expected[k - 1]]
    if runs != expected:
        empty = sorted(set(range(pp)) - set(stages))
        if empty:
            message = f"stage {_ranges(empty)} holds no layer (every pipeline stage needs one)"
        elif v == 1:
            message = (f"pipeline stages must be contiguous runs of layers in order 0..{pp - 1}; "
                       f"the plan's layers visit stages {_runs_text(stages)}")
        elif placement == "v":
            message = (f"a V schedule needs the layers in {2 * pp} contiguous chunks on stages "
                       f"0..{pp - 1} and back ({pp - 1}..0); the plan's layers visit stages "
                       f"{_runs_text(stages)}")
        else:
            message = (f"interleaved 1F1B with {v} virtual stages needs the layers in {pp * v} "
                       f"contiguous chunks on stages 0..{pp - 1} in turn ({v} rounds); the plan's "
                       f"layers visit stages {_runs_text(stages)}")
        out.append(Problem("stages", message))
    names = [layer["name"] for layer in ordered]
    recorded = {s["index"]: s for s in doc["stages"]}
    if sorted(recorded) != list(range(pp)) or len(doc["stages"]) != pp:
        out.append(Problem("stages", f"the stages section lists stages "
                                     f"{sorted(s['index'] for s in doc['stages'])} but pp is {pp}"))
    else:
        for s in range(pp):
            want = [names[i] for i, st in enumerate(stages) if st == s]
            if recorded[s]["layers"] != want or recorded[s]["num_layers"] != len(want):
                out.append(Problem("stages", f"stages[{s}] lists layers that differ from the "
                                             f"layers section's placement on stage {s}"))
                break
    return out


def _ranges(values: list[int]) -> str:
    return ", ".join(str(v) for v in values[:8]) + (", ..." if len(values) > 8 else "")


def _runs_text(stages: list[int]) -> str:
    runs = stage_runs(stages)
    text = " -> ".join(f"{s} (x{n})" for s, n in runs[:12])
    return text + (" -> ..." if len(runs) > 12 else "")
