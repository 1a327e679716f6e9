"""Offload benchmark: the full search with and without ``--pin offload=optimizer`` (or, with
``--activations``, ``--pin offload=activations``: per-block saved activations in host memory).

For each case the search runs on the GPUs alone and with every layer free to keep its optimizer
states in host memory (planner/cost/offload.py; the cluster presets' host sections). It reports
both step times (or "does not fit"), how many layers the solver offloaded, their host memory per
GPU and the solve times. Run::

    python bench/offload.py

Cases: Llama-3.1-70B on one DGX H100 (its states alone exceed the GPUs' memory at any
recomputation: offload is what makes it fit), GPT-3 175B on 16 DGX H100 (memory binds: offload
against recomputation and pipeline depth), Llama-3.1-8B on one DGX H100 (memory does not bind:
offload must not be chosen).

``--activations`` cases (Megatron-Core runtime, memory-bound at long-ish sequences): Llama-3.1-70B
on 4 DGX H100 (PCIe Gen5 host links), Llama-3.1-405B on one GB200 NVL72 (NVLink-C2C),
Llama-3.1-8B on one DGX H100 (memory does not bind: nothing offloaded), and Llama-3.1-70B on 64
GB200 with ``--pin zero=3`` (Megatron FSDP: the shape of Megatron-Bridge's GB200 recipe, which
sets ``cpu_offloading_num_layers``). The search keeps to Megatron-Core's rule
(planner/offload_rules.py: pp 1, no recomputation, the first N < L blocks); the last column
checks each plan against it (``placement_refusals``).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from clusters import load_cluster  # noqa: E402
from clusters.calibration_runs import cluster_for_gpus  # noqa: E402
from models import load_model  # noqa: E402
from planner.errors import PlannerError  # noqa: E402
from planner.hardware import GIB  # noqa: E402
from planner.offload_rules import placement_refusals  # noqa: E402
from planner.solve.search import SearchOptions, search  # noqa: E402
from planner.solve.space import Pins  # noqa: E402

CASES = [
    ("llama-3.1-70b", "dgx-h100", 1, 64, 4096),
    ("gpt3-175b", "dgx-h100", 16, 256, 2048),
    ("llama-3.1-8b", "dgx-h100", 1, 128, 8192),
]

# (model, cluster, nodes, batch, seq[, GPUs (a part of the nodes), pins])
ACT_CASES = [
    ("llama-3.1-70b", "dgx-h100", 4, 64, 8192),
    ("llama-3.1-405b", "dgx-gb200-nvl72", 1, 64, 8192),
    ("llama-3.1-8b", "dgx-h100", 1, 64, 8192),
    ("llama-3.1-70b", "dgx-gb200-nvl72", 1, 256, 8192, 64, {"zero": 3}),
]


def run(case, time_limit: float, kind: str = "optimizer") -> dict:
    name, cluster_name, nodes, batch, seq, gpus, pinned = (tuple(case) + (None, {}))[:7]
    model, cluster = load_model(name), load_cluster(cluster_name, nodes=nodes)
    where = f"{cluster_name} x{nodes}"
    if gpus is not None:
        cluster, where = cluster_for_gpus(cluster, gpus), f"{gpus} GPUs of {cluster_name}"
    if pinned:
        where += " (" + ", ".join(f"--pin {k}={v}" for k, v in pinned.items()) + ")"
    out = {"model": name, "cluster": where, "batch": batch, "seq": seq}
    for key, pins in (("gpu", Pins(**pinned)), ("offload", Pins(offload=kind, **pinned))):
        start = time.process_time()
        try:
            result = search(model, cluster, batch, seq, pins=pins,
                            options=SearchOptions(time_limit_s=time_limit))
        except PlannerError as error:
            out[key] = None
            out[f"{key}_note"] = str(error).split(":")[0]
            out[f"{key}_cpu_s"] = time.process_time() - start
            continue
        best = result.best
        out[key] = best.step_time_s
        out[f"{key}_cpu_s"] = time.process_time() - start
        out[f"{key}_status"] = result.record.status
        c = best.config
        out[f"{key}_mesh"] = f"tp{c.tp} pp{c.pp} dp{c.dp} mb{c.micro_batch} z{c.zero_stage}"
        out[f"{key}_offloaded"] = sum(o.act_offload if kind == "activations" else o.offload
                                      for o in best.placement.options)
        out[f"{key}_host_gib"] = max(s.host_bytes for s in best.stages) / GIB
        out[f"{key}_recomputed"] = sum(o.recompute.value != "none" for o in best.placement.options)
        out[f"{key}_megatron"] = "yes" if not placement_refusals(model, c.pp, best.placement) \
            else "no"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--activations", action="store_true",
                        help="per-block activation offload instead of optimizer offload")
    args = parser.parse_args(argv)
    kind = "activations" if args.activations else "optimizer"
    print("| model | cluster | batch x seq | GPU only s (mesh, recomputed layers) | with offload s "
          "(mesh, recomputed, offloaded layers, host GiB per GPU) | cpu s GPU / offload |"
          + (" Megatron runs it |" if args.activations else ""))
    print("|---|---|---|---|---|---|" + ("---|" if args.activations else ""))
    for case in ACT_CASES if args.activations else CASES:
        r = run(case, args.time_limit, kind)

        def cell(key: str) -> str:
            if r[key] is None:
                return f"does not fit ({r[f'{key}_note']})"
            extra = f", {r[f'{key}_offloaded']} offloaded, {r[f'{key}_host_gib']:.0f} GiB" \
                if key == "offload" else ""
            return (f"{r[key]:.3f} ({r[f'{key}_mesh']}, {r[f'{key}_recomputed']} recomputed"
                    f"{extra}) {r.get(f'{key}_status', '')}")

        print(f"| {r['model']} | {r['cluster']} | {r['batch']} x {r['seq']} | {cell('gpu')} | "
              f"{cell('offload')} | {r['gpu_cpu_s']:.1f} / {r['offload_cpu_s']:.1f} |"
              + (f" {r.get('offload_megatron', '')} |" if args.activations else ""), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
