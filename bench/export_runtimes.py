"""Feed every export of the 15-plan corpus to its runtime's own parser; compare what it derives.

    python -m bench.export_runtimes            # table of the 75 cases
    python -m bench.export_runtimes --json     # one JSON document

Real parsers where they are installed (the ``runtimes`` extra: DeepSpeed's ``DeepSpeedConfig``
on a fake process group of the plan's world size with the mpu the export's notes describe;
torchtitan 0.3's ``ConfigManager`` + ``ParallelDims.build_mesh`` on the fake backend + its
batch and pipeline-schedule checks; Megatron-LM's ``parse_args`` + ``validate_args`` and
vLLM's serve parser when a Python >= 3.12 environment has them, see docs/exports.md),
otherwise the documented references in :mod:`bench.runtime_reference` (and, for the
torchtitan 0.2.2 TOML, ``tomllib`` plus the v0.2.2 job-config field names). Each real parser
runs in its own worker process (one per runtime, every plan in turn), so a runtime's global
state (process groups, registries) stays out of the caller.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ENV_PREFIX = re.compile(r"Use:\s+source THIS_FILE;\s+((?:[A-Z_]+=\S+\s+)*)")

# torchtitan v0.2.2 torchtitan/config/job_config.py: the fields of the three tables we write
TOML_FIELDS_022 = {
    "training": {"local_batch_size", "global_batch_size", "seq_len", "max_norm", "steps",
                 "dataset", "dataset_path", "mixed_precision_param", "mixed_precision_reduce",
                 "enable_cpu_offload", "gc_freq", "gc_debug", "seed", "deterministic"},
    "parallelism": {"data_parallel_replicate_degree", "data_parallel_shard_degree",
                    "fsdp_reshard_after_forward", "tensor_parallel_degree",
                    "disable_loss_parallel", "enable_async_tensor_parallel",
                    "pipeline_parallel_degree", "pipeline_parallel_schedule",
                    "pipeline_parallel_schedule_csv", "pipeline_parallel_microbatch_size",
                    "pipeline_parallel_layers_per_stage",
                    "pipeline_parallel_first_stage_less_layers",
                    "pipeline_parallel_last_stage_less_layers", "module_fqns_per_model_part",
                    "context_parallel_degree", "context_parallel_rotate_method",
                    "expert_parallel_degree", "expert_tensor_parallel_degree"},
    "compile": {"enable", "components", "backend"},
    "activation_checkpoint": {"mode", "selective_ac_option", "memory_budget",
                              "per_op_sac_force_recompute_mm_shapes_by_fqns", "early_stop",
                              "preserve_rng_state"},
}
SCHEDULES = ("1F1B", "Interleaved1F1B", "GPipe", "LoopedBFS", "InterleavedZeroBubble",
             "ZBVZeroBubble", "DualPipeV")  # torch.distributed.pipelining get_schedule_class
LOOPED = {"Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"}


@dataclass
class Case:
    plan: str
    format: str
    version: str | None
    parser: str = ""
    accepted: bool = False
    message: str = ""
    mismatches: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.accepted and not self.mismatches

    @property
    def label(self) -> str:
        return self.format + (f" {self.version}" if self.version else "")


def plan_facts(doc: dict[str, Any]) -> dict[str, Any]:
    """What the runtime must derive for the export to be the plan."""
    from planner.export.base import chunks

    p = doc["parallelism"]
    pp, v = p["pp"], p["virtual_stages"]
    parts = chunks(doc)
    per_chunk = [[0] * v for _ in range(pp)]
    recomputed = [[0] * v for _ in range(pp)]
    for k, c in enumerate(parts):
        per_chunk[c.rank][k // pp if v > 1 else 0] = c.num_blocks
        recomputed[c.rank][k // pp if v > 1 else 0] = sum(1 for r in c.recompute if r == "full")
    values = {x["recompute"] for x in doc["layers"] if x["kind"] == "block"}
    return {"tp": p["tp"], "pp": pp, "dp": p["dp"], "cp": p["cp"], "ep": p["ep"],
            "micro_batch": p["micro_batch"], "global_batch": p["global_batch"],
            "num_micro_batches": p["num_micro_batches"], "virtual_stages": v,
            "layers_per_chunk": per_chunk, "full_recompute_per_chunk": recomputed,
            "recompute": values.pop() if len(values) == 1 else "per-layer",
            "sp": p["sp"], "seq_len": p["seq_len"],
            "world": p["tp"] * p["pp"] * p["dp"] * p["cp"]}


RECOMPUTE_KEYS = ("recompute", "full_recompute_per_chunk")


def compare(doc: dict[str, Any], derived: dict[str, Any], keys: tuple[str, ...],
            warnings: tuple[str, ...] = ()) -> list[str]:
    """Keys where the runtime's reading differs from the plan. Recomputation is compared
    only where the export claims it exact (no ``recompute`` warning naming the difference)."""
    want = plan_facts(doc)
    if any(w.startswith("recompute") for w in warnings):
        keys = tuple(k for k in keys if k not in RECOMPUTE_KEYS)
    return [f"{k}: runtime {derived[k]!r}, plan {want[k]!r}" for k in keys
            if k in derived and derived[k] != want[k]]


# -- references (no runtime installed) ------------------------------------------------------

def _env_of(text: str) -> dict[str, str]:
    match = ENV_PREFIX.search(text)
    pairs = match.group(1).split() if match else []
    return dict(pair.split("=", 1) for pair in pairs)


def _arch(doc: dict[str, Any]) -> int:
    gpu = doc["cluster"]["gpu"].lower()
    return 10 if gpu.startswith(("b200", "b300", "gb200", "gb300")) else \
        9 if gpu.startswith(("h100", "h200", "h800", "gh200")) else 8


def megatron_reference(doc: dict[str, Any], text: str) -> dict[str, Any]:
    from bench.runtime_reference import megatron
    from planner.export.megatron import parse_args_file

    return megatron(parse_args_file(text), world_size=plan_facts(doc)["world"],
                    env=_env_of(text), device_arch=_arch(doc))


def vllm_reference(doc: dict[str, Any], text: str) -> dict[str, Any]:
    import shlex

    from bench.runtime_reference import vllm

    return vllm(shlex.split(text), world_size=plan_facts(doc)["world"])


def toml_022_reference(doc: dict[str, Any], text: str) -> dict[str, Any]:
    import tomllib

    from bench.runtime_reference import Rejected

    config = tomllib.loads(text)
    for table, values in config.items():
        known = TOML_FIELDS_022.get(table)
        if known is None or set(values) - known:
            raise Rejected(f"[{table}]: unknown keys {sorted(set(values) - (known or set()))}")
    par, training = config["parallelism"], config["training"]
    world = plan_facts(doc)["world"]
    shard = par["data_parallel_shard_degree"]
    rest = par["data_parallel_replicate_degree"] * par["context_parallel_degree"] * \
        par["tensor_parallel_degree"] * par["pipeline_parallel_degree"]
    if shard < 0:
        shard = world // rest
    if shard * rest != world:  # ParallelDims._validate
        raise Rejected(f"Invalid parallel dims: product {shard * rest} != WORLD_SIZE({world})")
    etp = par.get("expert_tensor_parallel_degree", 1)
    if etp not in (1, par["tensor_parallel_degree"]):
        raise Rejected("expert_tensor_parallel_degree must be 1 or the tensor parallel degree")
    out = _titan_derived(doc, par, training, shard, config["activation_checkpoint"]["mode"])
    compile_ = config.get("compile", {})  # the model compiled: enable, "model" a component
    out["compile"] = bool(compile_.get("enable", False)
                          and "model" in compile_.get("components", ["model", "loss"]))
    return out


def _titan_derived(doc, par, training, shard, ac_mode) -> dict[str, Any]:
    from bench.runtime_reference import Rejected

    batch_degree = par["data_parallel_replicate_degree"] * shard
    local, global_ = training["local_batch_size"], training["global_batch_size"]
    if global_ < 0:
        global_ = local * batch_degree
    if global_ % (local * batch_degree):  # Trainer.__init__
        raise Rejected(f"global batch size must be multiple of local batch size times "
                       f"data-parallel degree ({global_} % ({local} * {batch_degree}) != 0)")
    accumulation = global_ // (local * batch_degree)
    pp = par["pipeline_parallel_degree"]
    out = {"tp": par["tensor_parallel_degree"], "pp": pp, "cp": par["context_parallel_degree"],
           "ep": par["expert_parallel_degree"], "dp": batch_degree,
           "global_batch": global_, "seq_len": training["seq_len"]}
    if pp > 1:
        micro = par["pipeline_parallel_microbatch_size"]
        if local % micro:
            raise Rejected(f"Batch size {local} must be divisible by microbatch_size {micro}")
        schedule = par.get("pipeline_parallel_schedule", "1F1B")
        if schedule.lower() not in {s.lower() for s in SCHEDULES}:
            raise Rejected(f"Unknown pipeline schedule: {schedule}")
        parts = par["module_fqns_per_model_part"]
        per_rank = len(parts) // pp
        if len(parts) % pp or (per_rank > 1) != (schedule in LOOPED):
            raise Rejected(f"{len(parts)} model parts do not fit schedule {schedule} on pp {pp}")
        counts = [[0] * per_rank for _ in range(pp)]
        for k, part in enumerate(parts):
            counts[k % pp][k // pp] = sum(1 for n in part if n.startswith("layers."))
        out.update(micro_batch=micro, num_micro_batches=(local // micro) * accumulation,
                   virtual_stages=per_rank, layers_per_chunk=counts)
    else:
        out.update(micro_batch=local, num_micro_batches=accumulation)
    out["recompute"] = {"none": "none", "full": "full"}.get(ac_mode, "selective")
    return out


# -- real parsers: bench/runtime_workers.py, each in a worker process ----------------------

TORCHTITAN_022_ENV = "SHARDPLAN_TORCHTITAN_022_PATH"  # a folder with torchtitan 0.2.2 in it


def run_worker(runtime: str, cases: list[dict], timeout_s: float = 600,
               python: str | None = None, path_first: str | None = None,
               env: dict[str, str] | None = None) -> list[dict]:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "cases.json"
        path.write_text(json.dumps(cases))
        paths = ([path_first] if path_first else []) + [str(ROOT), os.environ.get("PYTHONPATH",
                                                                                  "")]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p),
               "DS_BUILD_OPS": "0", **(env or {})}
        done = subprocess.run([python or sys.executable, "-m", "bench.export_runtimes", "--worker",
                               runtime, str(path)], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=timeout_s)
        result = Path(folder) / "result.json"
        if done.returncode or not result.exists():
            raise RuntimeError(f"{runtime} worker failed ({done.returncode}): "
                               f"{done.stderr[-3000:]}")
        return json.loads(result.read_text())


def installed(runtime: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(runtime) is not None


# -- the 75 cases -------------------------------------------------------------------------

REAL_KEYS = {"deepspeed": ("dp", "micro_batch", "global_batch", "num_micro_batches", "tp", "pp"),
             "torchtitan": ("tp", "pp", "cp", "ep", "dp", "micro_batch", "global_batch",
                            "num_micro_batches", "virtual_stages", "layers_per_chunk",
                            "recompute", "sp", "seq_len")}
REFERENCE_KEYS = {"megatron": ("tp", "pp", "cp", "ep", "dp", "micro_batch", "global_batch",
                               "num_micro_batches", "virtual_stages", "layers_per_chunk", "sp",
                               "full_recompute_per_chunk"),
                  "vllm": ("tp", "pp", "dp"),
                  "torchtitan 0.2.2": ("tp", "pp", "cp", "ep", "dp", "micro_batch",
                                       "global_batch", "num_micro_batches", "virtual_stages",
                                       "layers_per_chunk", "seq_len", "recompute")}


def run_cases(plans: dict[str, dict], megatron_python: str | None = None) -> list[Case]:
    """The 75 cases; ``megatron_python``: a Python >= 3.12 with megatron-core installed, whose
    real parser then replaces the Megatron reference."""
    from bench.runtime_reference import Rejected
    from planner.export import export_plan
    from planner.plan_types import Plan

    exports = {}
    for name, doc in plans.items():
        for fmt, version in (("megatron", None), ("torchtitan", "0.2.2"), ("torchtitan", "0.3"),
                             ("deepspeed", None), ("vllm", None)):
            exports[(name, fmt, version)] = export_plan(Plan.from_dict(doc), fmt, version)
    cases: list[Case] = []
    real = {"deepspeed": ("deepspeed", None), "torchtitan": ("torchtitan", "0.3")}
    for runtime, (fmt, version) in real.items():
        names = list(plans)
        if not installed(runtime):
            continue
        inputs = [{"text": exports[(n, fmt, version)].text,
                   "notes": list(exports[(n, fmt, version)].notes),
                   "world": plan_facts(plans[n])["world"], "arch": _arch(plans[n])}
                  for n in names]
        results = run_worker(runtime, inputs)
        label = f"{runtime} {results[-1]['version']} (real)"
        for n, r in zip(names, results[:-1]):
            case = Case(n, fmt, version, parser=label, accepted=r["accepted"],
                        message=r.get("message", ""))
            if r["accepted"]:
                keys = REAL_KEYS[runtime]
                if runtime == "deepspeed":  # the JSON holds no pp / cp / ep
                    keys = tuple(k for k in keys if k != "pp" or plans[n]["parallelism"]["pp"] > 1)
                case.mismatches = compare(plans[n], r["derived"], keys,
                                          exports[(n, fmt, version)].warnings)
            cases.append(case)
    if megatron_python:
        from bench import runtime_workers
        from planner.export.megatron import parse_args_file

        inputs = [{"args": parse_args_file(exports[(n, "megatron", None)].text),
                   "env": _env_of(exports[(n, "megatron", None)].text),
                   "model_args": runtime_workers.model_args(plans[n]),
                   "world": plan_facts(plans[n])["world"],
                   "arch": _arch(plans[n])} for n in plans]
        results = run_worker("megatron", inputs, python=megatron_python)
        label = f"megatron-core {results[-1]['version']} (real)"
        for n, r in zip(plans, results[:-1]):
            case = Case(n, "megatron", None, parser=label, accepted=r["accepted"],
                        message=r.get("message", ""))
            if r["accepted"]:
                case.mismatches = compare(plans[n], r["derived"], (
                    "tp", "pp", "cp", "ep", "dp", "micro_batch", "global_batch",
                    "num_micro_batches", "virtual_stages", "sp"))
            cases.append(case)
    tt022 = os.environ.get(TORCHTITAN_022_ENV)
    if tt022 and (Path(tt022) / "torchtitan" / "config" / "job_config.py").exists():
        names = list(plans)
        inputs = [{"text": exports[(n, "torchtitan", "0.2.2")].text,
                   "world": plan_facts(plans[n])["world"]} for n in names]
        results = run_worker("torchtitan-0.2.2", inputs, path_first=tt022)
        for n, r in zip(names, results[:-1]):
            case = Case(n, "torchtitan", "0.2.2",
                        parser=f"torchtitan {results[-1]['version']} (real)",
                        accepted=r["accepted"], message=r.get("message", ""))
            if r["accepted"]:
                case.mismatches = compare(plans[n], r["derived"],
                                          REFERENCE_KEYS["torchtitan 0.2.2"],
                                          exports[(n, "torchtitan", "0.2.2")].warnings)
            cases.append(case)
    else:
        tt022 = None
    refs = {("megatron", None): ("megatron", megatron_reference),
            ("torchtitan", "0.2.2"): ("torchtitan 0.2.2", toml_022_reference),
            ("vllm", None): ("vllm", vllm_reference)}
    for (fmt, version), (key, check) in refs.items():
        if (fmt == "megatron" and megatron_python) or (fmt == "torchtitan" and tt022):
            continue
        for n, doc in plans.items():
            case = Case(n, fmt, version, parser=f"{key} reference")
            try:
                derived = check(doc, exports[(n, fmt, version)].text)
                case.accepted = True
                case.mismatches = compare(doc, derived, REFERENCE_KEYS[key],
                                          exports[(n, fmt, version)].warnings)
                if fmt == "vllm" and doc["parallelism"]["ep"] > 1 and derived["ep"] != \
                        doc["parallelism"]["tp"] * doc["parallelism"]["dp"]:
                    case.mismatches.append("ep: not tp x dp")
            except Rejected as error:
                case.message = str(error)
            cases.append(case)
    order = {(f, v): i for i, (f, v) in enumerate((("megatron", None), ("torchtitan", "0.2.2"),
                                                   ("torchtitan", "0.3"), ("deepspeed", None),
                                                   ("vllm", None)))}
    return sorted(cases, key=lambda c: (order[(c.format, c.version)], list(plans).index(c.plan)))


def corpus() -> dict[str, dict]:
    sys.path.insert(0, str(ROOT / "tests"))
    from export_corpus import CORPUS, corpus_plan

    return {name: corpus_plan(name) for name in CORPUS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--megatron-python", metavar="PYTHON", default=None,
                        help="a Python >= 3.12 with megatron-core (and torch) installed: check "
                             "the Megatron exports with its real parse_args/validate_args")
    parser.add_argument("--worker", nargs=2, metavar=("RUNTIME", "CASES"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        runtime, path = args.worker
        from bench.runtime_workers import WORKERS

        results = WORKERS[runtime](json.loads(Path(path).read_text()))
        (Path(path).parent / "result.json").write_text(json.dumps(results))
        return 0
    cases = run_cases(corpus(), megatron_python=args.megatron_python)
    return report(cases, args.json, "with the plan's degrees and batch sizes")


def report(cases: list[Case], as_json: bool, what: str) -> int:
    """Print the cases (a table and a count, or JSON); exit code 0 when every one is ok."""
    if as_json:
        print(json.dumps([asdict(c) | {"ok": c.ok} for c in cases], indent=2))
    else:
        width = max(len(c.plan) for c in cases) if cases else 0
        for c in cases:
            status = ("ok" + (f" ({c.message})" if c.message else "")) if c.ok else (
                "MISMATCH " + "; ".join(c.mismatches) if c.accepted
                else "REJECTED " + c.message[:300])
            print(f"{c.label:18} {c.plan:{width}} {c.parser:32} {status}")
        good = sum(c.ok for c in cases)
        print(f"{good} of {len(cases)} exports accepted {what}")
    return 0 if all(c.ok for c in cases) else 1


if __name__ == "__main__":
    sys.exit(main())
