"""Pipeline-schedule benchmark: what the zero-bubble schedules (ZB-H1, ZB-V, DualPipeV;
planner/cost/pipeline.py) cost in solve time and give in step time.

For each instance the search runs twice on the torchtitan runtime (the one profile that runs
them): restricted to 1F1B and interleaved 1F1B (``--pin schedule=1f1b,interleaved-1f1b``, the
space before these schedules existed) and with every schedule torchtitan offers. It prints
per run the solve time, the CP-SAT status, the configurations solved, the best plan (degrees,
chunks, schedule), its step time, bubble and peak memory, and the step-time gain. The Megatron
and DeepSpeed spaces are unchanged (they run no zero-bubble schedule); ``bench/solver.py``
times them. Run::

    python bench/schedules.py            # all instances (a few minutes)
    python bench/schedules.py --quick    # the 405B instance only

Nothing is fitted; the numbers are the cost model's. The doc (docs/solver.md, "Pipeline
schedules") quotes one run of this script.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from clusters import load_cluster  # noqa: E402
from models import load_model  # noqa: E402
from planner.config import RuntimeOptions  # noqa: E402
from planner.hardware import GIB  # noqa: E402
from planner.solve.search import SearchOptions, search  # noqa: E402
from planner.solve.space import Pins  # noqa: E402

CLASSIC = "1f1b,interleaved-1f1b"
TORCHTITAN = RuntimeOptions(runtime="zero-paper", profile="torchtitan")


@dataclass(frozen=True)
class Case:
    model: str
    cluster: str
    nodes: int
    global_batch: int
    pins: tuple[tuple[str, str], ...] = ()

    @property
    def name(self) -> str:
        pinned = "".join(f", {k}={v}" for k, v in self.pins)
        return (f"{self.model} on {self.nodes:,} x {self.cluster} (gbs {self.global_batch:,}"
                f"{pinned})")


# Llama-3.1 405B at Meta's 16,384-H100 scale (gbs 2,048 x 8,192 tokens, as bench/solver.py);
# the same model at pp 16 (Meta's published depth: the pipeline bubble is where the schedules
# act); GPT-3 175B on 1,024 A100 (bench/solver.py's target instance) under torchtitan;
# Llama-3.1 70B on 64 H100 with a small batch (few micro-batches per rank: a large bubble).
CASES = [
    Case("llama-3.1-405b", "dgx-h100", 2048, 2048),
    Case("llama-3.1-405b", "dgx-h100", 2048, 2048, (("pp", "16"), ("tp", "8"))),
    Case("gpt3-175b", "dgx-a100-80g", 128, 1536),
    Case("llama-3.1-70b", "dgx-h100", 8, 64, (("pp", "8"),)),
]


def run(case: Case, schedules: str | None) -> dict:
    model = load_model(case.model)
    cluster = load_cluster(case.cluster, nodes=case.nodes)
    items = dict(case.pins)
    if schedules:
        items["schedule"] = schedules
    start = time.monotonic()
    result = search(model, cluster, case.global_batch, model.default_seq_len, "bf16",
                    Pins.parse(items), SearchOptions(runtime=TORCHTITAN))
    wall = time.monotonic() - start
    ev, c = result.best, result.best.config
    return {"wall_s": wall, "status": result.record.status,
            "solved": f"{result.record.candidates_evaluated}/{result.record.candidates_total}",
            "plan": (f"tp{c.tp} pp{c.pp} dp{c.dp} mbs{c.micro_batch} v{c.virtual_stages} "
                     f"{c.schedule}"),
            "step_s": ev.step_time_s, "bubble_s": ev.breakdown.bubble_s,
            "peak_gib": ev.peak_memory_bytes / GIB, "mfu": ev.mfu}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the first instance only")
    args = parser.parse_args()
    cases = CASES[:1] if args.quick else CASES
    print("| instance | schedules | solve s | status | solved / total | plan | step s | bubble s | "
          "peak GiB | MFU | gain |")
    print("|---|---|---:|---|---:|---|---:|---:|---:|---:|---:|")
    for case in cases:
        before = run(case, CLASSIC)
        after = run(case, None)
        for label, r in (("1F1B, interleaved", before), ("all torchtitan", after)):
            gain = before["step_s"] / r["step_s"] - 1
            print(f"| {case.name} | {label} | {r['wall_s']:.1f} | {r['status']} | "
                  f"{r['solved']} | {r['plan']} | {r['step_s']:.3f} | {r['bubble_s']:.3f} | "
                  f"{r['peak_gib']:.1f} | {r['mfu']:.1%} | {gain:+.1%} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
