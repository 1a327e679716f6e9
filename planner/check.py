"""``shardplan check``: does a saved plan still hold? (the CI gate)

Consumes a validated plan document (:func:`planner.plan_io.load_plan`) and optionally a model and
a cluster given anew; produces a :class:`CheckReport`. Steps:

1. Rebuild the model and the cluster: from the ones given (then compare their content hashes
   with ``inputs.*.sha256``: a difference makes the plan *stale*), else from the IR embedded in
   the plan (whose hash must match ``inputs.*.sha256``: a difference means it was edited).
2. Check the plan is well-formed: the degrees multiply to the GPU count, every layer is placed
   exactly once, pipeline stages are contiguous runs in order (round-robin chunks when
   interleaved) and none is empty, ``num_micro_batches = global_batch / (micro_batch x dp)``,
   the layers match the model's, the summary sections agree with the per-layer ones.
3. Rebuild ParallelConfig, LayerPlacement and RuntimeOptions from the plan and recompute memory
   per pipeline stage with the *current* cost model (:func:`planner.cost.model.evaluate`).
4. For stages over capacity, re-evaluate with single changes (full or selective recomputation
   of that stage, a higher ZeRO stage, recomputation everywhere, micro-batch 1) and report what
   each would save.

Pure: no printing, no exit; the CLI renders the report and maps ``ok`` to the exit code.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

from planner.config import (RUNTIME_STATE_BYTES, LayerPlacement, ParallelConfig, Recompute,
                            RuntimeOptions)
from planner.cost.model import Evaluation, MemoryBreakdown, evaluate
from planner.errors import ExitCode, PlannerError, invalid
from planner.hardware import GIB, Cluster
from planner.ir import LayerKind, ModelGraph
from planner.plan import content_hash

REPORT_KIND = "shardplan-check"


@dataclass(frozen=True)
class Problem:
    """One reason the check fails. ``code``: inputs, integrity, stale, degrees, placement,
    stages, micro_batches, layers, config, memory."""

    code: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


@dataclass(frozen=True)
class InputCheck:
    """Where the model (or cluster) came from and whether it is the one the plan was made for."""

    role: str  # "model" or "cluster"
    source: str  # "embedded" or the spec given on the command line
    name: str
    sha256: str
    plan_sha256: str

    @property
    def stale(self) -> bool:
        return self.sha256 != self.plan_sha256

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "name": self.name, "sha256": self.sha256,
                "plan_sha256": self.plan_sha256, "stale": self.stale}


@dataclass(frozen=True)
class StageCheck:
    index: int
    needed: MemoryBreakdown  # bytes per GPU, current cost model
    capacity_bytes: float
    planned_total_gib: float | None  # what the plan file recorded for this stage

    @property
    def fits(self) -> bool:
        return self.needed.total <= self.capacity_bytes

    @property
    def over_gib(self) -> float:
        return (self.needed.total - self.capacity_bytes) / GIB

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "needed_gib": self.needed.gib(),
                "capacity_gib": self.capacity_bytes / GIB, "fits": self.fits,
                "headroom_gib": -self.over_gib, "planned_total_gib": self.planned_total_gib}


@dataclass(frozen=True)
class Remedy:
    """A single change and what it does to the stages over capacity."""

    key: str  # machine-readable: "recompute=full@stage:2", "zero=3", "micro_batch=1", ...
    change: str  # for people
    saves_gib: tuple[tuple[int, float], ...]  # (stage, GiB saved) for each stage over capacity
    peak_gib: float  # peak per GPU after the change
    fits: bool  # every stage fits after the change

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "change": self.change,
                "saves_gib": [{"stage": s, "gib": g} for s, g in self.saves_gib],
                "peak_gib": self.peak_gib, "fits": self.fits}


@dataclass(frozen=True)
class CheckReport:
    plan_path: str | None
    inputs: tuple[InputCheck, ...]
    allow_stale: bool
    problems: tuple[Problem, ...]
    stages: tuple[StageCheck, ...]  # empty when the plan could not be evaluated
    remedies: tuple[Remedy, ...]
    capacity_gib: float
    parallelism: dict[str, Any] = field(default_factory=dict)

    @property
    def evaluated(self) -> bool:
        return bool(self.stages)

    @property
    def fits(self) -> bool | None:
        return all(s.fits for s in self.stages) if self.stages else None

    @property
    def stale(self) -> bool:
        return any(i.stale for i in self.inputs)

    @property
    def ok(self) -> bool:
        return not self.problems and self.fits is True

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.OK if self.ok else ExitCode.FAILED

    @property
    def peak_gib(self) -> float | None:
        return max(s.needed.total for s in self.stages) / GIB if self.stages else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": REPORT_KIND, "ok": self.ok, "fits": self.fits, "stale": self.stale,
            "allow_stale": self.allow_stale, "plan": self.plan_path,
            "exit_code": int(self.exit_code),
            "inputs": {i.role: i.to_dict() for i in self.inputs},
            "problems": [p.to_dict() for p in self.problems],
            "capacity_gib": self.capacity_gib, "peak_gib": self.peak_gib,
            "parallelism": self.parallelism,
            "stages": [s.to_dict() for s in self.stages],
            "remedies": [r.to_dict() for r in self.remedies],
        }


# -- rebuilding the plan's inputs and decisions ---------------------------------------------

def embedded_model(doc: dict[str, Any]) -> ModelGraph:
    from planner.serialize import model_from_dict

    return model_from_dict(doc["inputs"]["model"]["ir"], "$.inputs.model.ir")


def embedded_cluster(doc: dict[str, Any]) -> Cluster:
    from planner.serialize import cluster_from_dict

    return cluster_from_dict(doc["inputs"]["cluster"]["ir"], "$.inputs.cluster.ir")


def plan_config(doc: dict[str, Any]) -> ParallelConfig:
    """The ParallelConfig of the plan's ``parallelism`` section (not validated here)."""
    p = doc["parallelism"]
    block_recompute = {layer["recompute"] for layer in doc["layers"] if layer["kind"] == "block"}
    recompute = Recompute(block_recompute.pop()) if len(block_recompute) == 1 else Recompute.NONE
    return ParallelConfig(tp=p["tp"], pp=p["pp"], dp=p["dp"], cp=p["cp"], ep=p["ep"],
                          global_batch=p["global_batch"], seq_len=p["seq_len"], sp=p["sp"],
                          zero_stage=p["zero_stage"], micro_batch=p["micro_batch"],
                          virtual_stages=p["virtual_stages"], recompute=recompute,
                          dtype=p["dtype"])


def plan_placement(doc: dict[str, Any]) -> LayerPlacement:
    layers = sorted(doc["layers"], key=lambda layer: layer["index"])
    return LayerPlacement(tuple(layer["stage"] for layer in layers),
                          tuple(Recompute(layer["recompute"]) for layer in layers))


def plan_options(doc: dict[str, Any]) -> RuntimeOptions:
    r = doc["runtime"]
    if r["runtime"] not in RUNTIME_STATE_BYTES:
        raise invalid(f"$.runtime.runtime: unknown runtime {r['runtime']!r}; this shardplan "
                      f"knows {', '.join(sorted(RUNTIME_STATE_BYTES))}")
    return RuntimeOptions(**r)


def evaluate_plan(doc: dict[str, Any], *, model: ModelGraph | None = None,
                  cluster: Cluster | None = None, **config_changes: Any) -> Evaluation:
    """Evaluate the plan (embedded inputs unless given) with optional ParallelConfig changes
    (``zero_stage=1``); the exporters use it to say what a runtime's closest form costs."""
    model = model or embedded_model(doc)
    cluster = cluster or embedded_cluster(doc)
    options_changes = {k[len("runtime_"):]: config_changes.pop(k)
                       for k in list(config_changes) if k.startswith("runtime_")}
    config = replace(plan_config(doc), **config_changes)
    options = replace(plan_options(doc), **options_changes)
    return evaluate(model, cluster, config, plan_placement(doc), options)


def stage_runs(stages: list[int]) -> list[tuple[int, int]]:
    """Runs of equal consecutive values: [(value, length), ...]."""
    runs: list[tuple[int, int]] = []
    for s in stages:
        if runs and runs[-1][0] == s:
            runs[-1] = (s, runs[-1][1] + 1)
        else:
            runs.append((s, 1))
    return runs


# -- well-formedness ------------------------------------------------------------------------

def structure_problems(doc: dict[str, Any], model: ModelGraph, cluster: Cluster) -> list[Problem]:
    """Everything that makes the plan impossible to run, whatever the memory."""
    out: list[Problem] = []
    p = doc["parallelism"]
    tp, pp, dp, cp = p["tp"], p["pp"], p["dp"], p["cp"]
    product = tp * pp * dp * cp
    if product != cluster.num_gpus:
        out.append(Problem("degrees", f"degrees multiply to {product} GPUs (tp {tp} x cp {cp} x "
                                      f"dp {dp} x pp {pp}) but the cluster has "
                                      f"{cluster.num_gpus} ({cluster.num_nodes} nodes x "
                                      f"{cluster.gpus_per_node})"))
    if doc["cluster"]["num_gpus"] != product:
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
    inputs = doc["inputs"]
    for key, got, want in (("global_batch", inputs["global_batch"], gb),
                           ("dtype", inputs["dtype"], p["dtype"]),
                           ("model.seq_len", inputs["model"]["seq_len"], p["seq_len"])):
        if got != want:
            out.append(Problem("inputs", f"inputs.{key} is {got!r} but parallelism says {want!r}"))
    expected_schedule = "interleaved-1f1b" if p["virtual_stages"] > 1 else "1f1b"
    if p["schedule"] != expected_schedule:
        out.append(Problem("config", f"schedule {p['schedule']!r} does not match virtual_stages "
                                     f"{p['virtual_stages']} (expected {expected_schedule!r})"))
    if pp * p["virtual_stages"] > max(model.num_blocks, 1):
        out.append(Problem("config", f"pp x virtual_stages = {pp} x {p['virtual_stages']} "
                                     f"exceeds the {model.num_blocks} blocks of {model.name}"))
        return out
    out += _layer_problems(doc, model, pp, p["virtual_stages"])
    return out


def _layer_problems(doc: dict[str, Any], model: ModelGraph, pp: int, v: int) -> list[Problem]:
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
    expected = list(range(pp)) * v
    if runs != expected:
        empty = sorted(set(range(pp)) - set(stages))
        if empty:
            message = f"stage {_ranges(empty)} holds no layer (every pipeline stage needs one)"
        elif v == 1:
            message = (f"pipeline stages must be contiguous runs of layers in order 0..{pp - 1}; "
                       f"the plan's layers visit stages {_runs_text(stages)}")
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


# -- memory and remedies --------------------------------------------------------------------

def _stage_totals(ev: Evaluation) -> list[float]:
    return [s.memory.total for s in ev.stages]


def _try(model, cluster, config, placement, options) -> Evaluation | None:
    try:
        return evaluate(model, cluster, config, placement, options)
    except PlannerError:
        return None


def _remedies(model: ModelGraph, cluster: Cluster, config: ParallelConfig,
              placement: LayerPlacement, options: RuntimeOptions,
              before: Evaluation) -> list[Remedy]:
    capacity = cluster.memory_bytes_per_gpu
    totals = _stage_totals(before)
    over = [s for s, t in enumerate(totals) if t > capacity]
    blocks = [i for i, layer in enumerate(model.layers) if layer.kind is LayerKind.BLOCK]

    def with_recompute(targets: list[int], value: Recompute, only_from: tuple[Recompute, ...]):
        recompute = list(placement.recompute)
        for i in targets:
            if recompute[i] in only_from:
                recompute[i] = value
        return LayerPlacement(placement.stage, tuple(recompute))

    candidates: list[tuple[str, str, ParallelConfig, LayerPlacement]] = []
    for s in over:
        on_stage = [i for i in blocks if placement.stage[i] == s]
        if any(placement.recompute[i] is not Recompute.FULL for i in on_stage):
            candidates.append((f"recompute=full@stage:{s}",
                               f"full recomputation of the {len(on_stage)} blocks on stage {s}",
                               config, with_recompute(on_stage, Recompute.FULL,
                                                      (Recompute.NONE, Recompute.SELECTIVE))))
        if any(placement.recompute[i] is Recompute.NONE for i in on_stage):
            candidates.append((f"recompute=selective@stage:{s}",
                               f"selective recomputation (attention core) on stage {s}",
                               config, with_recompute(on_stage, Recompute.SELECTIVE,
                                                      (Recompute.NONE,))))
    if config.dp * config.cp > 1:
        for z in range(config.zero_stage + 1, 4):
            candidates.append((f"zero={z}", f"ZeRO-{z} (shard {_ZERO_SHARDS[z]} over dp x cp = "
                                            f"{config.dp * config.cp})",
                               replace(config, zero_stage=z), placement))
    if config.pp > 1:  # with one stage this is the per-stage change above
        if any(placement.recompute[i] is not Recompute.FULL for i in blocks):
            candidates.append(("recompute=full", "full recomputation of every block", config,
                               with_recompute(blocks, Recompute.FULL,
                                              (Recompute.NONE, Recompute.SELECTIVE))))
    if config.micro_batch > 1:
        candidates.append(("micro_batch=1", f"micro-batch 1 instead of {config.micro_batch} "
                                            f"({config.global_batch // config.dp} micro-batches "
                                            f"per step)",
                           replace(config, micro_batch=1), placement))
    out: list[Remedy] = []
    for key, change, cfg, plc in candidates:
        ev = _try(model, cluster, cfg, plc, options)
        if ev is None:
            continue
        after = _stage_totals(ev)
        out.append(Remedy(key, change, tuple((s, (totals[s] - after[s]) / GIB) for s in over),
                          max(after) / GIB, max(after) <= capacity))
    if not any(r.fits for r in out):
        # everything at once: the most memory this pipeline split can save
        cfg = replace(config, zero_stage=3 if config.dp * config.cp > 1 else config.zero_stage,
                      micro_batch=1)
        plc = with_recompute(blocks, Recompute.FULL, (Recompute.NONE, Recompute.SELECTIVE))
        ev = _try(model, cluster, cfg, plc, options)
        if ev is not None and (cfg != config or plc != placement):
            after = _stage_totals(ev)
            out.append(Remedy("combined", "all of: " + ", ".join(
                part for part in ("ZeRO-3" if cfg.zero_stage != config.zero_stage else "",
                                  "full recomputation of every block" if plc != placement else "",
                                  "micro-batch 1" if cfg.micro_batch != config.micro_batch else "")
                if part), tuple((s, (totals[s] - after[s]) / GIB) for s in over),
                max(after) / GIB, max(after) <= capacity))
    return out


_ZERO_SHARDS = {1: "optimizer states", 2: "optimizer states and gradients",
                3: "optimizer states, gradients and parameters"}


# -- the check ------------------------------------------------------------------------------

def check_plan(doc: dict[str, Any], *, model: ModelGraph | None = None,
               cluster: Cluster | None = None, model_source: str | None = None,
               cluster_source: str | None = None, allow_stale: bool = False,
               plan_path: str | None = None) -> CheckReport:
    """Check a validated plan document; ``model`` / ``cluster`` replace the embedded ones."""
    problems: list[Problem] = []
    inputs = doc["inputs"]
    embedded_m = model is None
    embedded_c = cluster is None
    model = model if model is not None else embedded_model(doc)
    cluster = cluster if cluster is not None else embedded_cluster(doc)
    checks = (
        InputCheck("model", "embedded" if embedded_m else (model_source or "given"), model.name,
                   content_hash(model), inputs["model"]["sha256"]),
        InputCheck("cluster", "embedded" if embedded_c else (cluster_source or "given"),
                   cluster.name, content_hash(cluster), inputs["cluster"]["sha256"]),
    )
    for item, embedded in zip(checks, (embedded_m, embedded_c)):
        if not item.stale:
            continue
        if embedded:
            problems.append(Problem("integrity", f"the {item.role} embedded in the plan does not "
                                                 f"match inputs.{item.role}.sha256: the plan was "
                                                 f"edited after it was written"))
        elif not allow_stale:
            problems.append(Problem("stale", f"the {item.role} {item.source} ({item.name}) is not "
                                             f"the one the plan was made for (content hash "
                                             f"differs): re-plan, or pass --allow-stale to check "
                                             f"the old plan against it"))
    capacity = cluster.memory_bytes_per_gpu
    problems += structure_problems(doc, model, cluster)
    stages: tuple[StageCheck, ...] = ()
    remedies: tuple[Remedy, ...] = ()
    if not any(p.code in ("placement", "layers", "stages") for p in problems):
        try:
            config = plan_config(doc)
            placement = plan_placement(doc)
            options = plan_options(doc)
            ev = evaluate(model, cluster, config, placement, options)
        except PlannerError as error:
            if not any(p.code in ("degrees", "micro_batches") for p in problems):
                problems.append(Problem("config", error.message))
        except (ArithmeticError, ValueError, KeyError) as error:
            if not any(p.code == "integrity" for p in problems):
                raise  # a plan as written by shardplan: a bug, let the CLI report it
            # a hand-edited IR can hold shapes no importer would make
            problems.append(Problem("config", f"the cost model cannot evaluate the edited "
                                              f"plan: {type(error).__name__}: {error}"))
        else:
            recorded = {s["index"]: s["memory_gib"]["total"] for s in doc["stages"]}
            stages = tuple(StageCheck(s.index, s.memory, capacity, recorded.get(s.index))
                           for s in ev.stages)
            over = [s for s in stages if not s.fits]
            for s in over:
                problems.append(Problem("memory", f"stage {s.index} needs "
                                                  f"{s.needed.total / GIB:.2f} GiB per GPU, "
                                                  f"{s.over_gib:.2f} GiB more than the "
                                                  f"{capacity / GIB:g} GiB of each "
                                                  f"{cluster.gpu.name}"))
            if over:
                remedies = tuple(_remedies(model, cluster, config, placement, options, ev))
    return CheckReport(plan_path, checks, allow_stale, tuple(problems), stages, remedies,
                       capacity / GIB, dict(doc["parallelism"]))


def check_file(path: str | os.PathLike, *, model_spec: str | None = None,
               cluster_spec: str | None = None, nodes: int | None = None,
               allow_stale: bool = False) -> CheckReport:
    """Load a plan file and check it; ``model_spec`` / ``cluster_spec`` / ``nodes`` load the
    inputs anew (as ``shardplan plan`` would) instead of using the embedded ones."""
    from planner.plan_io import load_plan

    doc = load_plan(path)
    model = cluster = None
    from planner.serve.plan import is_serve_plan

    serve = is_serve_plan(doc)
    if model_spec is not None and serve:
        from models import load_model

        model = load_model(model_spec)
    elif model_spec is not None:
        from models import load_model

        model = load_model(model_spec, seq_len=doc["parallelism"]["seq_len"])
    if cluster_spec is not None:
        from clusters import load_cluster

        cluster = load_cluster(cluster_spec, nodes=nodes)
    elif nodes is not None:
        from clusters.schema import with_nodes

        cluster = with_nodes(embedded_cluster(doc), nodes, "--nodes")
    cluster_source = cluster_spec if cluster_spec is not None else (
        f"embedded, --nodes {nodes}" if nodes is not None else None)
    if serve:  # an inference plan (planner/serve/plan.py)
        from planner.serve.plan import check_serve_plan

        return check_serve_plan(doc, model=model, cluster=cluster, model_source=model_spec,
                                cluster_source=cluster_source, allow_stale=allow_stale,
                                plan_path=os.fspath(path))
    return check_plan(doc, model=model, cluster=cluster, model_source=model_spec,
                      cluster_source=cluster_source, allow_stale=allow_stale,
                      plan_path=os.fspath(path))
