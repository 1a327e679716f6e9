"""What the runtimes' recompute rules cost the search: solve time, status and step time with the
rule on (the search keeps to what the runtime's flags express, planner/recompute_rules.py) and
off (any per-block mix, what the search did before the rule was a constraint).

For each case this runs ``planner.solve.search.search`` (one worker, seed 0, 60 s limit) twice
in this process, the rule on then off, and prints per run the wall seconds of the search, its
status and gap, the step time and the recomputation the plan carries (per pipeline rank: the
blocks recomputed fully / selectively / per-op); the rule off is obtained by giving every
profile the ``per-block`` rule for that run. The cases: the solver's two targets
(bench/solver.py: GPT-3 175B on 1,024 A100-80G, Llama-3.1 405B on 16,384 H100) with the
default runtime options, and plans made for Megatron and torchtitan with their calibrated
options (``plan --runtime X``) where the free search mixed settings the runtime cannot run.

    python -m bench.recompute_rule [--quick]   # --quick: the 175B target only

About 2 minutes on 2 cores (wall times on a shared machine vary: compare medians of reruns).
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, replace
from types import MappingProxyType

from clusters import load_cluster
from models import load_model
from planner import profiles
from planner.calibration.session import runtime_setup
from planner.config import RuntimeOptions
from planner.ir import LayerKind
from planner.solve.search import SearchOptions, search


@dataclass(frozen=True)
class Case:
    name: str
    model: str
    cluster: str
    nodes: int
    global_batch: int
    runtime: str | None  # None: the default RuntimeOptions (bench/solver.py's targets)


CASES = (
    Case("gpt3-175b a100x1024", "gpt3-175b", "dgx-a100-80g", 128, 1536, None),
    Case("llama-405b h100x16384", "llama-3.1-405b", "dgx-h100", 2048, 2048, None),
    Case("gpt3-175b h100x128 megatron", "gpt3-175b", "dgx-h100", 16, 1024, "megatron"),
    Case("llama-70b h100x64 megatron", "llama-3.1-70b", "dgx-h100", 8, 512, "megatron"),
    Case("llama-70b h100x64 torchtitan", "llama-3.1-70b", "dgx-h100", 8, 512, "torchtitan"),
)


@contextmanager
def free_recompute():
    """Every profile with the per-block rule (any mix), for the length of the block."""
    saved = profiles.PROFILES
    profiles.PROFILES = MappingProxyType({k: replace(p, recompute_rule="per-block")
                                          for k, p in saved.items()})
    try:
        yield
    finally:
        profiles.PROFILES = saved


def recompute_per_rank(ev) -> str:
    """'f12/s0 ...' per pipeline rank: blocks recomputed (first letter of the setting)."""
    counts: list[Counter] = [Counter() for _ in range(ev.config.pp)]
    for stage, option, layer in zip(ev.placement.stage, ev.placement.options, ev.model.layers):
        if layer.kind is LayerKind.BLOCK and option.recompute.value != "none":
            counts[stage][option.recompute.value[0]] += 1
    return " ".join("+".join(f"{k}{n}" for k, n in sorted(c.items())) or "-" for c in counts)


def run(case: Case) -> list[dict]:
    model = load_model(case.model)
    cluster = load_cluster(case.cluster, nodes=case.nodes)
    runtime = RuntimeOptions() if case.runtime is None else \
        runtime_setup(cluster, case.runtime, "bf16").options
    rows = []
    for label in ("on", "off"):
        start = time.monotonic()
        if label == "on":
            result = search(model, cluster, case.global_batch, model.default_seq_len, "bf16",
                            options=SearchOptions(runtime=runtime))
        else:
            with free_recompute():
                result = search(model, cluster, case.global_batch, model.default_seq_len,
                                "bf16", options=SearchOptions(runtime=runtime))
        wall = time.monotonic() - start
        c, r = result.best.config, result.record
        rows.append({"case": case.name, "rule": label, "wall_s": wall, "status": r.status,
                     "gap": r.gap, "step_time_s": result.best.step_time_s,
                     "config": f"tp{c.tp} pp{c.pp} v{c.virtual_stages} dp{c.dp} "
                               f"mbs{c.micro_batch} z{c.zero_stage}",
                     "solved": r.candidates_evaluated,
                     "recompute": recompute_per_rank(result.best)})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the 175B target only")
    args = parser.parse_args(argv)
    print(f"{'case':30} {'rule':4} {'wall s':>7} {'status':9} {'step s':>8} {'solved':>6}  "
          f"config / recomputed blocks per rank")
    for case in CASES[:1] if args.quick else CASES:
        rows = run(case)
        for row in rows:
            print(f"{row['case']:30} {row['rule']:4} {row['wall_s']:7.2f} {row['status']:9} "
                  f"{row['step_time_s']:8.4f} {row['solved']:6}  {row['config']} / "
                  f"{row['recompute']}")
        on, off = rows
        print(f"{'':30} rule costs {on['step_time_s'] / off['step_time_s'] - 1:+.2%} step time, "
              f"{on['wall_s'] / off['wall_s']:.2f}x solve time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
