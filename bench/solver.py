"""Solver benchmark: solve time, optimality and gain over the best uniform plan on real models.

Runs ``planner.solve.search.search`` (default options: one worker, seed 0, 60 s limit) over a
matrix of GPT-3 and Llama-3.1 models on 8 to 16,384 GPUs and writes ``docs/solver.md``: per
instance the solve time, status and gap, the candidates (outer configurations) in the space,
pruned by the memory bound and solved by CP-SAT, the best plan (degrees, micro-batch, virtual
stages, ZeRO, recomputation mix, blocks per stage) with its predicted step time and MFU, and
the best UNIFORM plan (Megatron's even split, one recomputation for every block) found by
brute force over every configuration of the same space with
``planner.solve.search.uniform_placement``, and by how much the plan beats it. Run::

    python bench/solver.py            # whole matrix, writes docs/solver.md (minutes)
    python bench/solver.py --quick    # only the two targets, prints, writes nothing
    python bench/solver.py --check    # exit 1 when a target is missed

Targets: GPT-3 175B on 1,024 A100-80G (global batch 1,536) solved OPTIMAL in <= 10 s;
Llama-3.1 405B on 16,384 H100 (global batch 2,048, sequence 8,192) in <= 30 s. The document
holds no date, so reruns differ only in the timing columns.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import ortools  # noqa: E402

from clusters import load_cluster  # noqa: E402
from models import load_model  # noqa: E402
from planner.strategy import Recompute  # noqa: E402
from planner.cost.model import Evaluation  # noqa: E402
from planner.ir import LayerKind  # noqa: E402
from planner.hardware import GIB  # noqa: E402
from planner.solve.headroom import DEFAULT_HEADROOM, NO_HEADROOM  # noqa: E402
from planner.solve.search import (SearchOptions, SolverRecord, search,  # noqa: E402
                                  uniform_placement)
from planner.profiles import profile as runtime_profile  # noqa: E402
from planner.solve.space import Pins, enumerate_configs  # noqa: E402

DOC = ROOT / "docs" / "solver.md"


@dataclass(frozen=True)
class Case:
    model: str
    cluster: str
    nodes: int
    global_batch: int
    target_s: float | None = None  # solve-time target (OPTIMAL required)

    @property
    def name(self) -> str:
        return f"{self.model} on {self.nodes:,} {self.cluster} nodes (gbs {self.global_batch:,})"


# Global batches: GPT-3 paper Table 2.1 (0.5M tokens for 1.3B, 2M for 6.7B/13B, 3.2M for
# 175B at 2048 tokens); Llama-3.1 at its 8,192-token pre-training context (4M tokens for the
# smaller models, 16M for 405B as in the Llama 3 paper's final stage).
CASES = [
    Case("gpt3-1.3b", "dgx-a100-80g", 1, 256),
    Case("gpt3-6.7b", "dgx-a100-80g", 4, 1024),
    Case("gpt3-13b", "dgx-a100-80g", 8, 1024),
    Case("gpt3-175b", "dgx-a100-80g", 128, 1536, target_s=10.0),
    Case("llama-3.1-8b", "dgx-h100", 8, 512),
    Case("llama-3.1-70b", "dgx-h100", 64, 512),
    Case("llama-3.1-70b", "dgx-h100", 128, 512),
    Case("llama-3.1-405b", "dgx-h100", 2048, 2048, target_s=30.0),
]


@dataclass
class Row:
    case: Case
    gpus: int
    record: SolverRecord
    best: Evaluation
    uniform: Evaluation | None
    uniform_s: float  # wall time of the uniform brute force
    uniform_configs: int
    no_headroom: Evaluation | None = None  # the same search filling the GPU to the last byte

    @property
    def target_met(self) -> bool | None:
        if self.case.target_s is None:
            return None
        return self.record.solve_time_s <= self.case.target_s and self.record.status == "OPTIMAL"

    @property
    def gain(self) -> float | None:
        """How much faster the plan is than the best uniform plan (uniform / plan - 1)."""
        if self.uniform is None:
            return None
        return self.uniform.step_time_s / self.best.step_time_s - 1


def best_uniform(model, cluster, global_batch, seq_len, runtime,
                 limit_bytes: float) -> tuple[Evaluation | None, int]:
    best, n = None, 0
    prof = runtime_profile(runtime.profile)  # the space the search has: what the runtime runs
    for config in enumerate_configs(model, cluster, global_batch, seq_len, "bf16", Pins(), prof):
        n += 1
        ev = uniform_placement(model, cluster, config, runtime, Pins().block_options(config, prof),
                               memory_limit_bytes=limit_bytes)
        if ev is not None and (best is None or ev.step_time_s < best.step_time_s):
            best = ev
    return best, n


def run_case(case: Case, with_uniform: bool) -> Row:
    model = load_model(case.model)
    cluster = load_cluster(case.cluster, nodes=case.nodes)
    options = SearchOptions()
    result = search(model, cluster, case.global_batch, model.default_seq_len, "bf16",
                    options=options)
    uniform, uniform_s, n = None, 0.0, 0
    full = None
    if case.target_s is not None:  # what the default headroom costs on the target instances
        full = search(model, cluster, case.global_batch, model.default_seq_len, "bf16",
                      options=replace(options, memory_headroom=NO_HEADROOM)).best
    if with_uniform:
        start = time.monotonic()
        uniform, n = best_uniform(model, cluster, case.global_batch, model.default_seq_len,
                                  options.runtime,
                                  options.memory_headroom.limit_bytes(
                                      cluster.memory_bytes_per_gpu))
        uniform_s = time.monotonic() - start
    return Row(case, cluster.num_gpus, result.record, result.best, uniform, uniform_s, n, full)


def describe(ev: Evaluation) -> str:
    c = ev.config
    text = f"tp{c.tp} pp{c.pp} dp{c.dp}"
    if c.cp > 1:
        text += f" cp{c.cp}"
    text += f" mbs{c.micro_batch}"
    if c.virtual_stages > 1:
        text += f" v{c.virtual_stages}"
    text += f" z{c.zero_stage}" + (" sp" if c.sp else "")
    if c.dp_shard:
        text += f" hsdp{c.dp_shard}"  # hybrid sharding: shard group of dp_shard dp ranks
    return text


def recompute_mix(ev: Evaluation) -> str:
    counts = Counter(r for r, layer in zip(ev.placement.recompute, ev.model.layers)
                     if layer.kind is LayerKind.BLOCK)
    return " ".join(f"{r.value} {counts[r]}" for r in Recompute if counts[r])


def uniform_recompute(ev: Evaluation) -> str:
    """The one recomputation policy every block of a uniform plan has."""
    return next(o.recompute.value for o, layer in zip(ev.placement.options, ev.model.layers)
                if layer.kind is LayerKind.BLOCK)


def stage_sizes(ev: Evaluation) -> str:
    sizes = [sum(1 for i in s.layers if ev.model.layers[i].kind is LayerKind.BLOCK)
             for s in ev.stages]
    if len(set(sizes)) == 1:
        return f"{sizes[0]} x {len(sizes)}"
    return "/".join(str(s) for s in sizes)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}, "
            f"OR-Tools {ortools.__version__}; {load_average()}")


def load_average() -> str:
    """The machine's load when the document is written (1, 5 and 15 minutes): wall-clock
    seconds on a shared machine are a multiple of CPU seconds under load."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "load average unknown"
    return f"load average {one:.1f} / {five:.1f} / {fifteen:.1f} (1 / 5 / 15 min) when written"


def render(rows: list[Row]) -> str:
    lines = [
        "# Solver benchmark",
        "",
        "Generated by `python bench/solver.py` (see its docstring); rerun it after changing the",
        "solver or the cost model. Only the timing columns change between reruns on one machine.",
        "",
        f"Machine: {machine()}.",
        "",
        "Solver: default `SearchOptions` (1 CP-SAT worker, seed 0, 60 s limit, 5 s deterministic",
        "time per configuration; a configuration not proven within it goes back in the queue by",
        "the bound it proved and is pruned by that bound or solved once more under the later,",
        "tighter cutoff; no configuration is solved before every candidate whose bound is within",
        "the best start plan so far has had its start plan evaluated, so each solve runs under a",
        "cutoff). Sequence length: the preset's (GPT-3 2,048, Llama-3.1 8,192).",
        "Precision bf16, Megatron runtime, flash attention. Memory: the default headroom",
        f"({DEFAULT_HEADROOM.describe()} of each GPU kept free, `--memory-headroom`); among plans "
        "of equal step time",
        "the search returns the one with the lower peak (a second CP-SAT solve holds the step",
        "time and minimises the peak; brute force ranks (step time, peak)). `plan",
        "--memory-confidence Q` holds the Q quantile of each plan's peak-memory band, not its",
        "prediction, to that limit (the limit over the band's factor, planner/solve/gate.py; a",
        "configuration mixing recomputation policies its regime's runs used with others is two",
        "candidates); its cost: `python bench/memory_gate.py`.",
        "",
        "## Targets",
        "",
    ]
    for row in rows:
        if row.case.target_s is not None:
            verdict = "met" if row.target_met else "MISSED"
            lines.append(f"- {row.case.name}: {row.record.solve_time_s:.1f} s, "
                         f"{row.record.status} (target <= {row.case.target_s:g} s, OPTIMAL): "
                         f"**{verdict}**")
    lines += [
        "",
        "## Solver",
        "",
        "Candidates: outer configurations in the space / pruned by the memory lower bound /",
        "solved with CP-SAT (the rest were cut by the step-time bound). Blocks per stage: per",
        "pipeline rank (with v virtual stages, v chunks of equal size).",
        "",
        "| model | GPUs | gbs | solve s | status | gap | candidates | plan | recompute "
        "(blocks) | blocks per stage | step s | MFU | peak GiB / limit |",
        "|---|---:|---:|---:|---|---:|---|---|---|---|---:|---:|---:|",
    ]
    for row in rows:
        r, b = row.record, row.best
        lines.append(
            f"| {row.case.model} | {row.gpus:,} | {row.case.global_batch:,} | "
            f"{r.solve_time_s:.2f} | {r.status} | {r.gap:.1%} | {r.candidates_total:,} / "
            f"{r.candidates_pruned_memory:,} / {r.candidates_evaluated:,} | {describe(b)} | "
            f"{recompute_mix(b)} | {stage_sizes(b)} | {b.step_time_s:.3f} | {b.mfu:.1%} | "
            f"{b.peak_memory_bytes / GIB:.1f} / {r.memory_limit_gib:.1f} |")
    headroom = [row for row in rows if row.no_headroom is not None]
    if headroom:
        lines += [
            "",
            "## What the headroom costs",
            "",
            "The target instances searched again with `--memory-headroom 0` (fill each GPU to",
            "the last byte, as before the headroom): step time and peak memory of both plans.",
            "",
            "| model | GPUs | headroom 0: plan | step s | peak GiB | default: plan | step s | "
            "peak GiB | slower by |",
            "|---|---:|---|---:|---:|---|---:|---:|---:|",
        ]
        for row in headroom:
            f, b = row.no_headroom, row.best
            lines.append(
                f"| {row.case.model} | {row.gpus:,} | {describe(f)} | {f.step_time_s:.3f} | "
                f"{f.peak_memory_bytes / GIB:.1f} | {describe(b)} | {b.step_time_s:.3f} | "
                f"{b.peak_memory_bytes / GIB:.1f} | "
                f"{b.step_time_s / f.step_time_s - 1:+.2%} |")
    if any(row.uniform is not None or row.uniform_configs for row in rows):
        lines += [
            "",
            "## Against the best uniform plan",
            "",
            "Uniform: Megatron-LM's even split and one recomputation option for every block, the",
            "best over every configuration of the same space (what the Megatron profile runs: tp,",
            "pp, dp, cp, micro-batch, virtual stages incl. unequal chunks, ZeRO 0/1 and their",
            "hybrid sharding, sequence parallelism, recomputation), within the same memory limit,",
            "by brute force. Gain: uniform step time / plan step time - 1.",
            "",
            "| model | GPUs | configurations | brute force s | best uniform | recompute | step s | "
            "MFU | plan step s | gain |",
            "|---|---:|---:|---:|---|---|---:|---:|---:|---:|",
        ]
        for row in rows:
            u = row.uniform
            if u is None:
                lines.append(f"| {row.case.model} | {row.gpus:,} | {row.uniform_configs:,} | "
                             f"{row.uniform_s:.1f} | none fits | | | | "
                             f"{row.best.step_time_s:.3f} | |")
                continue
            lines.append(
                f"| {row.case.model} | {row.gpus:,} | {row.uniform_configs:,} | "
                f"{row.uniform_s:.1f} | {describe(u)} | {uniform_recompute(u)} | "
                f"{u.step_time_s:.3f} | {u.mfu:.1%} | {row.best.step_time_s:.3f} | "
                f"{row.gain:+.2%} |")
    return "\n".join(lines) + "\n"


def summary_line(row: Row) -> str:
    r, b = row.record, row.best
    text = (f"{row.case.name}: {r.solve_time_s:.2f} s {r.status} gap {r.gap:.1%}, "
            f"{r.candidates_evaluated}/{r.candidates_total} solved; {describe(b)} "
            f"[{recompute_mix(b)}] stages {stage_sizes(b)}: {b.step_time_s:.3f} s, "
            f"MFU {b.mfu:.1%}")
    if row.uniform is not None:
        u = row.uniform
        text += f"; uniform {describe(u)} {u.step_time_s:.3f} s ({row.gain:+.2%})"
    if row.target_met is not None:
        text += f"  TARGET <= {row.case.target_s:g} s: {'met' if row.target_met else 'MISSED'}"
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="only the two target instances, no uniform brute force, no doc")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--no-uniform", action="store_true",
                        help="skip the (slow) uniform brute force")
    parser.add_argument("--output", type=Path, default=DOC,
                        help=f"where to write the document (default {DOC.relative_to(ROOT)})")
    args = parser.parse_args(argv)
    cases = [c for c in CASES if c.target_s is not None] if args.quick else CASES
    rows = []
    for case in cases:
        row = run_case(case, with_uniform=not (args.quick or args.no_uniform))
        print(summary_line(row), flush=True)
        rows.append(row)
    if not args.quick:
        text = render(rows)
        old = args.output.read_text() if args.output.exists() else ""
        marker = "<!-- moe-solver:begin"  # bench/moe_solver.py's section: kept as it is
        if marker in old:
            text = text.rstrip("\n") + "\n\n## Mixture-of-experts models\n\n" + \
                old[old.index(marker):].rstrip("\n") + "\n"
        args.output.write_text(text)
        print(f"wrote {args.output}")
    missed = [row for row in rows if row.target_met is False]
    for row in missed:
        print(f"MISSED: {row.case.name}: {row.record.solve_time_s:.2f} s {row.record.status}")
    return 1 if (args.check and missed) else 0


if __name__ == "__main__":
    sys.exit(main())
