"""How often a plan searched for a runtime exports to it with no warning (no fallback).

For each setup below and each runtime with an exporter (megatron, torchtitan 0.3 and 0.2.2,
deepspeed) this runs ``shardplan plan --runtime R --work-limit 100`` and exports the plan to
R, and prints every warning. The search keeps each block's recomputation to what the runtime's
flags express (planner/recompute_rules.py: one AC setting for all blocks in torchtitan; the
first N blocks of every chunk, or selective everywhere, in Megatron; any block in DeepSpeed),
so an export of a plan made for its runtime has no fallback left to take.

    python -m bench.export_profiles [--json]

Exit code 0 when no export has a warning, 1 otherwise. About 4 minutes on 2 cores.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FORMATS = {"megatron": (("megatron", None),),
           "torchtitan": (("torchtitan", "0.3"), ("torchtitan", "0.2.2")),
           "deepspeed": (("deepspeed", None),)}
SETUPS = {
    "gpt3-1.3b a100x8": ["-m", "gpt3-1.3b", "-c", "dgx-a100-80g", "--global-batch", "64"],
    "gpt3-13b a100-40x16": ["-m", "gpt3-13b", "-c", "dgx-a100-40g", "--nodes", "2",
                            "--global-batch", "128"],
    "llama-8b a100x16": ["-m", "llama-3.1-8b", "-c", "dgx-a100-80g", "--nodes", "2",
                         "--global-batch", "256"],
    "llama-70b h100x64": ["-m", "llama-3.1-70b", "-c", "dgx-h100", "--nodes", "8",
                          "--global-batch", "512"],
    "mixtral-8x7b h100x32": ["-m", "mixtral-8x7b", "-c", "dgx-h100", "--nodes", "4",
                             "--global-batch", "256"],
    "gpt3-13b pp4 a100x16": ["-m", "gpt3-13b", "-c", "dgx-a100-80g", "--nodes", "2",
                             "--global-batch", "128", "--pin", "pp=4"],
    "gpt3-175b h100x128": ["-m", "gpt3-175b", "-c", "dgx-h100", "--nodes", "16",
                           "--global-batch", "1024"],
}


def run() -> list[dict]:
    from planner.export import export_plan
    from planner.plan_types import Plan

    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name, args in SETUPS.items():
            for runtime, formats in FORMATS.items():
                path = Path(folder) / "plan.json"
                done = subprocess.run([sys.executable, "-m", "cli.entry", "plan", *args,
                                       "--runtime", runtime, "--work-limit", "100", "-o",
                                       str(path), "--force"], cwd=ROOT, capture_output=True,
                                      text=True)
                if done.returncode:
                    rows.append({"setup": name, "runtime": runtime, "error":
                                 done.stderr.strip().splitlines()[-1]})
                    continue
                plan = Plan.load(path)
                recompute = "".join(option.recompute.value[0]
                                    for layer, option in zip(plan.model.layers,
                                                             plan.placement.options)
                                    if layer.kind.value == "block")
                for fmt, version in formats:
                    result = export_plan(plan, fmt, version)
                    rows.append({"setup": name, "runtime": runtime, "format": fmt,
                                 "version": version, "recompute": recompute,
                                 "warnings": list(result.warnings)})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = run()
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for r in rows:
            label = f"{r['setup']:22} {r['runtime']:10}"
            if "error" in r:
                print(f"{label} ERROR {r['error']}")
                continue
            label += f" {r['format']} {r['version'] or ''}"
            print(f"{label:48} {'ok' if not r['warnings'] else 'WARNING'} "
                  f"recompute {r['recompute']}")
            for w in r["warnings"]:
                print(f"    {w[:200]}")
        clean = sum(1 for r in rows if not r.get("error") and not r["warnings"])
        print(f"{clean} of {len(rows)} exports of plans made for their runtime have no warning")
    return 0 if all(not r.get("error") and not r["warnings"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
