"""Stress the planner at the extremes: 1 GPU and 100,000 GPUs, models of 1 and 1,000 layers.

Each case runs ``shardplan evaluate`` or ``shardplan plan`` (``--json``, in-process, through
``cli.main.main``) in a fresh child process, so that the peak resident memory of each is its own;
the wall time excludes the interpreter start and the imports (ortools, networkx), which are the
same for every case. Run::

    python bench/stress.py                    # every case, then the table
    python bench/stress.py --write-doc        # and rewrite docs/reliability.md, "Scale"
    python bench/stress.py --only 100k-1000L-plan --profile   # one case under cProfile

Inputs: ``bench/clusters/single-gpu.yaml`` (one H100), ``dgx-h100 --nodes 1`` (8 GPUs) and
``dgx-h100 --nodes 12500`` (100,000 GPUs); native model files of 1 and 1,000 Llama-style blocks
(hidden 1024, 16 heads, SwiGLU 4096, vocab 32k, sequence 2048) generated in a scratch folder, and
the gpt3-175b preset. ``plan`` runs with ``--time-limit 60``.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.reliability_table import DOC, write_section  # noqa: E402

BEGIN, END = "<!-- BEGIN scale table (bench/stress.py) -->", "<!-- END scale table -->"
SINGLE_GPU = ROOT / "bench" / "clusters" / "single-gpu.yaml"
TIME_LIMIT_S = 60
CHILD_TIMEOUT_S = 600

MODEL = """\
shardplan_model: 1
name: {name}
description: stress-bench model of {layers} Llama-style blocks
num_layers: {layers}
hidden_size: 1024
num_heads: 16
ffn_hidden_size: 4096
vocab_size: 32000
seq_len: 2048
"""


@dataclass(frozen=True)
class Case:
    name: str
    gpus: str
    model: str
    argv: tuple[str, ...]  # {d}: the scratch folder with the generated models


def _evaluate(model: str, cluster: tuple[str, ...], batch: int, tp: int, pp: int) -> tuple:
    return ("evaluate", "-m", model, *cluster, "--global-batch", str(batch), "--tp", str(tp),
            "--pp", str(pp), "--json")


def _plan(model: str, cluster: tuple[str, ...], batch: int,
          time_limit_s: float = TIME_LIMIT_S) -> tuple:
    return ("plan", "-m", model, *cluster, "--global-batch", str(batch), "--time-limit",
            str(time_limit_s), "--json")


ONE = ("-c", str(SINGLE_GPU))
EIGHT = ("-c", "dgx-h100", "--nodes", "1")
HUNDRED_K = ("-c", "dgx-h100", "--nodes", "12500")  # 12,500 x 8 = 100,000 GPUs
ONE_M = ("-c", "dgx-h100", "--nodes", "131072")  # the schema's limit: 2**20 = 1,048,576 GPUs
L1, L1000 = "{d}/layers-1.yaml", "{d}/layers-1000.yaml"
# 100,000 = 2^5 x 5^5 GPUs: a global batch of 100,000 sequences is divisible by every dp the
# search can reach (100,000 / (tp x pp)), as is 160 per replica of gpt3-175b at tp 8 x pp 20.
CASES: tuple[Case, ...] = (
    Case("1gpu-1L-evaluate", "1", "1 layer", _evaluate(L1, ONE, 8, 1, 1)),
    Case("1gpu-1L-plan", "1", "1 layer", _plan(L1, ONE, 8)),
    Case("1gpu-1000L-evaluate", "1", "1,000 layers", _evaluate(L1000, ONE, 8, 1, 1)),
    Case("1gpu-1000L-plan", "1", "1,000 layers", _plan(L1000, ONE, 8)),
    Case("8gpu-1000L-evaluate", "8", "1,000 layers", _evaluate(L1000, EIGHT, 8, 1, 8)),
    Case("8gpu-1000L-plan", "8", "1,000 layers", _plan(L1000, EIGHT, 8)),
    Case("100k-1L-evaluate", "100,000", "1 layer", _evaluate(L1, HUNDRED_K, 100_000, 8, 1)),
    Case("100k-1L-plan", "100,000", "1 layer", _plan(L1, HUNDRED_K, 100_000)),
    Case("100k-1000L-evaluate", "100,000", "1,000 layers",
         _evaluate(L1000, HUNDRED_K, 100_000, 8, 50)),
    Case("100k-1000L-plan", "100,000", "1,000 layers", _plan(L1000, HUNDRED_K, 100_000)),
    Case("100k-gpt3-evaluate", "100,000", "gpt3-175b",
         _evaluate("gpt3-175b", HUNDRED_K, 100_000, 8, 20)),
    Case("100k-gpt3-plan", "100,000", "gpt3-175b", _plan("gpt3-175b", HUNDRED_K, 100_000)),
    # --time-limit bounds the whole command (plus max(1 s, 10%) of slack)
    Case("100k-gpt3-plan-2s", "100,000", "gpt3-175b",
         _plan("gpt3-175b", HUNDRED_K, 100_000, time_limit_s=2)),
    Case("100k-1000L-plan-2s", "100,000", "1,000 layers",
         _plan(L1000, HUNDRED_K, 100_000, time_limit_s=2)),
    # Beyond the brief: the largest cluster the schema accepts (MAX_GPUS = 2**20 GPUs).
    Case("1M-1L-evaluate", "1,048,576", "1 layer", _evaluate(L1, ONE_M, 2**20, 8, 1)),
    Case("1M-1L-plan", "1,048,576", "1 layer", _plan(L1, ONE_M, 2**20)),
)


def make_models(folder: Path) -> Path:
    for layers in (1, 1000):
        (folder / f"layers-{layers}.yaml").write_text(
            MODEL.format(name=f"layers-{layers}", layers=layers), encoding="utf-8")
    return folder


def _argv(case: Case, folder: Path) -> list[str]:
    return [a.replace("{d}", str(folder)) for a in case.argv]


def _max_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def child(case: Case, folder: Path, profile: bool) -> dict:
    """Run one case in this process; returns what the table reports."""
    # Import what every command imports, so the clock measures the planner and not the imports.
    import cli.commands  # noqa: F401
    import planner.solve.search  # noqa: F401
    from cli.main import main

    rss_imports = _max_rss_mib()
    out, err = io.StringIO(), io.StringIO()
    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    start = time.perf_counter()
    code = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(_argv(case, folder))
        except SystemExit as done:
            code = done.code
        except BaseException as error:  # noqa: BLE001 - report, never hide
            code = f"{type(error).__name__}: {error}"
    wall = time.perf_counter() - start
    if profiler is not None:
        import pstats

        profiler.disable()
        stats = io.StringIO()
        pstats.Stats(profiler, stream=stats).sort_stats("cumulative").print_stats(30)
        print(stats.getvalue(), file=sys.stderr)
    return {"name": case.name, "code": code, "wall_s": wall, "rss_mib": _max_rss_mib(),
            "rss_imports_mib": rss_imports, "outcome": outcome(out.getvalue(), err.getvalue())}


def outcome(stdout: str, stderr: str) -> str:
    try:
        doc = json.loads(stdout)
    except ValueError:
        tail = (stderr.strip().splitlines() or ["(no output)"])[-1]
        return f"no JSON: {tail[:160]}"
    if "error" in doc:
        e = doc["error"]
        return f"{e['kind']}: {e['message'][:160]}"
    p = doc["parallelism"]
    shape = (f"tp {p['tp']} pp {p['pp']} dp {p['dp']}"
             + (f" cp {p['cp']}" if p.get("cp", 1) > 1 else "")
             + f", mb {p['micro_batch']}, ZeRO-{p['zero_stage']}")
    pred = doc["predicted"]
    text = f"{shape}; step {pred['step_time_s']:.3g} s, peak {pred['peak_memory_gib']:.1f} GiB"
    if "solver" in doc:
        s = doc["solver"]
        text = (f"{s['status']} gap {s['gap']:.1%}, {s['candidates_evaluated']}/"
                f"{s['candidates_total']} configs solved; " + text)
    return text


def run_case(case: Case, folder: Path, timeout: float) -> dict:
    with tempfile.NamedTemporaryFile("r", suffix=".json") as result:
        command = [sys.executable, __file__, "--child", case.name, "--folder", str(folder),
                   "--result", result.name]
        start = time.perf_counter()
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"name": case.name, "code": "TIMEOUT", "wall_s": time.perf_counter() - start,
                    "rss_mib": float("nan"), "rss_imports_mib": float("nan"),
                    "outcome": f"killed after {timeout:.0f} s"}
        text = Path(result.name).read_text()
    if not text:
        tail = (done.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
        return {"name": case.name, "code": f"child exit {done.returncode}", "wall_s": float("nan"),
                "rss_mib": float("nan"), "rss_imports_mib": float("nan"), "outcome": tail[:200]}
    return json.loads(text)


def table(rows: list[dict]) -> str:
    by_name = {c.name: c for c in CASES}
    lines = ["| case | GPUs | model | command | exit | outcome | wall s | peak RSS MiB "
             "(imports) |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        case = by_name[row["name"]]
        command = " ".join(a.replace("{d}/", "") for a in case.argv[:-1])  # less --json
        command = command.replace(str(SINGLE_GPU), str(SINGLE_GPU.relative_to(ROOT)))
        lines.append(
            f"| {case.name} | {case.gpus} | {case.model} | `{command}` | {row['code']} | "
            f"{row['outcome'].replace('|', '/')} | {row['wall_s']:.2f} | "
            f"{row['rss_mib']:.0f} ({row['rss_imports_mib']:.0f}) |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", metavar="CASE",
                        help="run only this case (repeatable): " + ", ".join(c.name for c in CASES))
    parser.add_argument("--profile", action="store_true",
                        help="with --only: run in this process under cProfile, print the top 30")
    parser.add_argument("--timeout", type=float, default=CHILD_TIMEOUT_S,
                        help="seconds before a case is killed and reported as TIMEOUT")
    parser.add_argument("--write-doc", action="store_true",
                        help=f"rewrite the Scale section of {DOC.relative_to(ROOT)}")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    by_name = {c.name: c for c in CASES}

    if args.child:
        row = child(by_name[args.child], Path(args.folder), profile=False)
        Path(args.result).write_text(json.dumps(row))
        return 0

    names = args.only or [c.name for c in CASES]
    unknown = [n for n in names if n not in by_name]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}")
    with tempfile.TemporaryDirectory(prefix="shardplan-stress-") as scratch:
        folder = make_models(Path(scratch))
        if args.profile:
            for name in names:
                print(json.dumps(child(by_name[name], folder, profile=True), indent=2))
            return 0
        rows = []
        for name in names:
            row = run_case(by_name[name], folder, args.timeout)
            rows.append(row)
            print(f"{name}: exit {row['code']}, {row['wall_s']:.2f} s, {row['rss_mib']:.0f} MiB: "
                  f"{row['outcome']}", file=sys.stderr, flush=True)
    body = table(rows)
    print(body)
    if args.write_doc:
        write_section(BEGIN, END, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
