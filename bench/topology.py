"""Topology benchmark: how long the cost model waits for a group's link.

``planner.topology.group_link`` routes every ring hop of a group over the cluster graph once per
(cluster, size, stride) and memoises the answer; the solver asks for a handful of groups per
outer configuration. This measures both sides, medians over repeats, on the largest preset
scale (16,384 H100s) and on a 512-GPU cluster::

    python bench/topology.py            # prints a table
    python bench/topology.py --check    # exit 1 when a target is missed

Targets (what tests must not assert, because a loaded CI machine makes them flaky): a memoised
lookup under 5 ms; the seven mesh groups of a 16,384-GPU cluster, uncached, under 2 s.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clusters import load_cluster  # noqa: E402
from planner.topology import clear_caches, group_link  # noqa: E402

GROUPS_16K = [(8, 1), (2048, 8), (256, 64), (16, 1), (4096, 4), (2, 8192), (16384, 1)]
CACHED_TARGET_S = 5e-3
UNCACHED_16K_TARGET_S = 2.0


def median_s(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    big = load_cluster("dgx-h100", nodes=2048)
    mid = load_cluster("dgx-h100", nodes=64)

    def uncached_16k():
        clear_caches()  # routers and window graphs too: a cold start
        for size, stride in GROUPS_16K:
            group_link(big, size, stride)

    group_link(mid, 64, 8)
    cached = median_s(lambda: group_link(mid, 64, 8), 100 * args.repeats)
    uncached = median_s(uncached_16k, args.repeats)
    rows = [("memoised group_link (512 GPUs, dp 64 stride 8)", cached, CACHED_TARGET_S),
            ("7 mesh groups, uncached (16,384 GPUs)", uncached, UNCACHED_16K_TARGET_S)]
    missed = 0
    print(f"{'case':<50} {'median':>10} {'target':>10}")
    for name, value, target in rows:
        ok = value <= target
        missed += not ok
        print(f"{name:<50} {value * 1e3:>8.2f}ms {target * 1e3:>8.0f}ms {'ok' if ok else 'MISSED'}")
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
