"""Serving search benchmark: the exact disaggregated search and the exact Pareto frontier
against evaluating every combination on small instances (the optimality check), and search
times on the issue's instances. Writes the ``serve-search`` section of ``docs/inference.md``::

    python bench/serve_search.py            # small-instance checks + timings, writes the doc
    python bench/serve_search.py --no-doc   # print only

``brute_force_disaggregated`` is also what ``tests/test_serve_disaggregated.py`` compares with.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from clusters import load_cluster  # noqa: E402
from models import load_model  # noqa: E402
from planner.serve.evaluate import evaluate_serving, pool_capacities  # noqa: E402
from planner.serve.runtime import runtime  # noqa: E402
from planner.serve.search import search_serving, worker_layouts  # noqa: E402
from planner.serve.workload import ServingConfig, ServingWorkload  # noqa: E402

DOC = ROOT / "docs" / "inference.md"


def small_cluster(gpus: int, memory_gib: float):
    """One node of ``gpus`` H100s with ``memory_gib`` each (small KV caches keep the brute
    force short)."""
    c = load_cluster("dgx-h100")
    return replace(c, gpus_per_node=gpus, gpu=replace(c.gpu, memory_gib=memory_gib))


def brute_force_disaggregated(model, cluster, wl: ServingWorkload, rt: str):
    """(best deployment meeting the targets, evaluations): every prefill layout, decode
    layout, pool sizes and decode batch ``1 .. cap`` (the KV cache's capacity at the runtime's
    default ``--max-num-seqs`` workspace), one prompt per prefill pass; no load given = the
    decode pool full (``batch x decode workers`` requests)."""
    n, caps = cluster.num_gpus, runtime(rt)
    budget = caps.default_max_num_tokens(cluster.gpu)
    layouts = worker_layouts(model, n, cluster.gpus_per_node)
    best, count = None, 0
    for d in layouts:
        cap = pool_capacities(model, cluster, wl, d, rt, budget, caps.max_batch)[1]
        for p in layouts:
            for n_d in range(1, n // d.gpus + 1):
                for n_p in range(1, (n - n_d * d.gpus) // p.gpus + 1):
                    for b in range(1, cap + 1):
                        cfg = ServingConfig("disaggregated", prefill=p, decode=d,
                                            prefill_workers=n_p, decode_workers=n_d, batch=b,
                                            max_num_tokens=budget)
                        load = wl if wl.concurrency is not None or \
                            wl.request_rate_per_s is not None else \
                            replace(wl, concurrency=b * n_d)
                        ev = evaluate_serving(model, cluster, load, cfg, rt)
                        count += 1
                        if ev.meets_targets() and (best is None or
                                                   ev.output_tokens_per_s_per_gpu >
                                                   best.output_tokens_per_s_per_gpu):
                            best = ev
    return best, count


# model, GPUs, GPU memory GiB, isl, osl, TTFT ms, TPOT ms, load, runtime
SMALL = (
    ("llama-3.1-8b", 4, 20.0, 4096, 256, 400.0, 12.0, {}, "vllm"),
    ("llama-3.1-8b", 3, 20.0, 2048, 512, 300.0, None, {"concurrency": 24}, "trtllm"),
    ("llama-3.1-8b", 4, 20.0, 2048, 256, None, 15.0, {"request_rate_per_s": 6.0}, "sglang"),
    ("tiny-moe", 4, 3.8, 8192, 128, 40.0, 0.4, {}, "sglang"),
)

LARGE = (
    ("Llama-3.1-70B disaggregated, 16 x H100, TTFT <= 500 ms, TPOT <= 30 ms", "llama-3.1-70b",
     2, "vllm", ServingWorkload(isl=1024, osl=1024, ttft_ms=500, tpot_ms=30,
                                mode="disaggregated", dtype="fp8", kv_dtype="fp8")),
    ("DeepSeek-V3 disaggregated, 32 x H100, TTFT <= 1 s, TPOT <= 50 ms", "deepseek-v3", 4,
     "trtllm", ServingWorkload(isl=1024, osl=1024, ttft_ms=1000, tpot_ms=50,
                               mode="disaggregated", dtype="fp8", kv_dtype="fp8")),
    ("DeepSeek-V3 disaggregated, 96 x H100, TTFT <= 1 s, TPOT <= 50 ms (target <= 60 s)",
     "deepseek-v3", 12, "trtllm",
     ServingWorkload(isl=1024, osl=1024, ttft_ms=1000, tpot_ms=50, mode="disaggregated",
                     dtype="fp8", kv_dtype="fp8")),
    ("Llama-3.1-70B aggregated frontier (no targets), 8 x H100", "llama-3.1-70b", 1, "vllm",
     ServingWorkload(isl=1024, osl=1024, dtype="fp8", kv_dtype="fp8")),
)


def small_checks() -> list[str]:
    rows = []
    for name, gpus, memory, isl, osl, ttft, tpot, load, rt in SMALL:
        model, cluster = load_model(name), small_cluster(gpus, memory)
        wl = ServingWorkload(isl=isl, osl=osl, ttft_ms=ttft, tpot_ms=tpot,
                             mode="disaggregated", dtype="fp8", kv_dtype="fp8", **load)
        start = time.perf_counter()
        result = search_serving(model, cluster, wl, rt)
        seconds = time.perf_counter() - start
        brute, count = brute_force_disaggregated(model, cluster, wl, rt)
        same = (result.best is None) == (brute is None) and (
            brute is None or abs(result.best.output_tokens_per_s_per_gpu /
                                 brute.output_tokens_per_s_per_gpu - 1) <= 1e-12)
        what = ", ".join(f"{k} {v:g}" for k, v in load.items()) or "no load"
        rows.append(f"| {name}, {gpus} GPUs, {isl}/{osl}, {what}, {rt} | "
                    f"{brute.output_tokens_per_s_per_gpu if brute else 0:.1f} | "
                    f"{result.best.output_tokens_per_s_per_gpu if result.best else 0:.1f} | "
                    f"{'yes' if same else 'NO'} | {result.evaluated} of {count} | "
                    f"{seconds:.2f} |")
    return rows


def large_timings() -> list[str]:
    from cli.serve_commands import _label
    rows = []
    for label, model_name, nodes, rt, wl in LARGE:
        model, cluster = load_model(model_name), load_cluster("dgx-h100", nodes=nodes)
        start, cpu = time.perf_counter(), time.process_time()
        result = search_serving(model, cluster, wl, rt)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        best = result.best
        text = "none" if best is None else (
            f"{_label(best.config.as_dict())}, batch {best.pools[-1].batch}: "
            f"{best.output_tokens_per_s_per_gpu:.0f} tok/s/GPU")
        if result.frontier:
            text += f"; frontier of {len(result.frontier)} points"
        rows.append(f"| {label} | {cpu:.1f} | {seconds:.1f} | {result.evaluated} | "
                    f"{result.pruned} | {text} |")
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-doc", action="store_true")
    args = parser.parse_args(argv)
    small = small_checks()
    body = ["| small instance (disaggregated) | brute force tok/s/GPU | search | same optimum "
            "| evaluations (search of brute force) | search s |", "|---|---|---|---|---|---|",
            *small, "", "| instance | search CPU s | wall s | evaluations | pruned | best |",
            "|---|---|---|---|---|---|", *large_timings()]
    text = "\n".join(body)
    print(text)
    if not args.no_doc:
        from inference import write_section
        DOC.write_text(write_section(DOC.read_text(), "serve-search", text))
    return 0 if all("| yes |" in row for row in small) else 1


if __name__ == "__main__":
    sys.exit(main())
