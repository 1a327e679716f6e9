"""Cost-model accuracy against published, measured training runs.

Re-evaluates every usable entry of ``bench/data/published_runs.yaml`` (a copy of
the published-runs calibration set) through the library with the library's defaults and
writes ``docs/accuracy.md``: per entry, predicted vs published step time and memory, and the
median and max absolute errors. Run::

    python bench/accuracy.py            # writes docs/accuracy.md, prints the summary
    python bench/accuracy.py --check    # also exits 1 when a target is missed

How an entry becomes inputs (no entry is special-cased; every rule reads the entry's own fields):

* model: a native-format decoder from the entry's shapes (GPT/BLOOM style: LayerNorm, biases,
  4h GeLU MLP, tied embeddings; learned positions unless the notes name ALiBi or rotary);
* cluster: the named system's cluster file in ``bench/clusters/`` when the entry describes its
  interconnect (Jean Zay's 4 Omni-Path links per node, GPT-NeoX's 4 ConnectX-6 HCAs), else the
  preset of its GPU;
* runtime: Megatron-DeepSpeed of 2022 ran eager (non-flash) attention, reduced gradients after
  the pipeline flush (no overlap), and in fp16 used DeepSpeed's ZeRO-1 optimizer layout
  (fp16 grads + sharded fp32 grads); bf16 runs used the BF16 optimizer (fp32 grad accumulation
  unsharded, as Megatron does);
* step time: ``iteration_time_s`` when published, else derived from the published TFLOP/s with
  Narayanan Eq. 3 (the convention those sources use, Narayanan et al. 2021 §5.1);
* memory: published GB (1e9 bytes, an nvidia-smi snapshot including CUDA context and allocator
  cache) against the predicted peak in the same unit.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from clusters import load_cluster  # noqa: E402
from models.native import build_native  # noqa: E402
from planner.config import ParallelConfig, RuntimeOptions  # noqa: E402
from planner.strategy import Recompute  # noqa: E402
from planner.strategy import LayerOption, default_placement  # noqa: E402
from planner.cost.model import Evaluation, evaluate  # noqa: E402
from planner.cost.memory import zero_state_bytes  # noqa: E402
from planner.config import RUNTIME_STATE_BYTES  # noqa: E402

DATA = ROOT / "bench" / "data" / "published_runs.yaml"
CLUSTERS = ROOT / "bench" / "clusters"
DOC = ROOT / "docs" / "accuracy.md"

MISSES_NOTE = """\
Both are BLOOM-prequel runs that the chronicle reports as out of memory while neighbouring
configurations ran. For the 184B dp16/tp4/pp6/mbs1 run the prediction is within a few GB of
capacity (the same shape with mbs 2 is predicted OOM, correctly). The 206B l82 run is
predicted at about 65 GB, yet the 203B l94 run with the same tp/pp/dp ran at 67 GB: the
published snapshots alone do not explain the difference (memory is an nvidia-smi snapshot at
iteration 2, and the first/last node hold the 250k-token embedding); we do not tune for it.
Step-time errors are largest for the Feb-17 rows (before the chronicle's TFLOP/s-formula and
PCIe/NUMA fixes, which changed throughput by up to 5 %) and for tp 8 with micro-batch 1,
where per-micro-batch framework overheads of the 2022 Megatron-DeepSpeed stack that the model
does not represent weigh most."""

TIME_TARGET = 0.10
MEMORY_TARGET = 0.10


@dataclass
class Row:
    id: str
    config: str
    time_published_s: float | None
    time_predicted_s: float | None
    time_source: str
    memory_published_gb: float | None
    memory_predicted_gb: float | None
    oom_published: bool
    fits_predicted: bool | None
    note: str = ""

    @property
    def time_error(self) -> float | None:
        if self.time_published_s is None or self.time_predicted_s is None:
            return None
        return self.time_predicted_s / self.time_published_s - 1

    @property
    def memory_error(self) -> float | None:
        if self.memory_published_gb is None or self.memory_predicted_gb is None:
            return None
        return self.memory_predicted_gb / self.memory_published_gb - 1

    @property
    def fit_ok(self) -> bool | None:
        if self.fits_predicted is None:
            return None
        return self.fits_predicted != self.oom_published


def eq3_flops(model: dict, global_batch: int) -> float:
    """Narayanan et al. 2021 Eq. 3: hardware FLOPs per step with full recomputation."""
    l, h, s, v = model["layers"], model["hidden"], model["seq_len"], model["vocab"]
    return 96 * global_batch * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))


def build_model(entry: dict):
    m = entry["model"]
    notes = (m.get("arch_notes") or "") + " " + (entry.get("notes") or "")
    position = "learned"
    if "ALiBi" in notes:
        position = "none"
    if "rotary" in notes.lower():
        position = "rope"
    tied = "untied" not in notes.lower()
    spec = {
        "shardplan_model": 1, "name": m["name"], "num_layers": m["layers"],
        "hidden_size": m["hidden"], "num_heads": m["heads"] or m["hidden"] // 128,
        "ffn_hidden_size": m.get("ffn_hidden") or 4 * m["hidden"], "gated_mlp": False,
        "vocab_size": m["vocab"], "seq_len": m["seq_len"], "max_seq_len": m["seq_len"],
        "position_embedding": position, "norm": "layernorm", "bias": True,
        "tied_embeddings": tied,
    }
    if m.get("kv_heads"):
        spec["num_kv_heads"] = m["kv_heads"]
    return build_native(spec, where=entry["id"], source=f"published_runs:{entry['id']}")


def build_cluster(entry: dict):
    c = entry["cluster"]
    nodes = c["num_nodes"] or max(1, c["num_gpus"] // (c["gpus_per_node"] or 8))
    inter = c.get("inter_node_interconnect") or ""
    if "Omni-Path" in inter:
        return load_cluster(str(CLUSTERS / "jean-zay-a100-80g.yaml"), nodes=nodes)
    if "ConnectX-6 HCAs" in inter and "40GB" in (c.get("gpu") or ""):
        return load_cluster(str(CLUSTERS / "neox-hgx-a100-40g.yaml"), nodes=nodes)
    gpu = c.get("gpu") or ""
    if "A100" in gpu and "80" in gpu:
        return load_cluster("dgx-a100-80g", nodes=nodes)
    if "A100" in gpu:
        return load_cluster("dgx-a100-40g", nodes=nodes)
    raise ValueError(f"{entry['id']}: no cluster description for GPU {gpu!r}")


def runtime_for(entry: dict) -> RuntimeOptions:
    t = entry["training"]
    framework = (t.get("framework") or "").lower()
    precision = (t.get("precision") or "").lower()
    deepspeed = "deepspeed" in framework
    fp16_zero = deepspeed and "fp16" in precision and "bf16" not in precision
    return RuntimeOptions(
        runtime=("deepspeed" if fp16_zero else "deepspeed-bf16") if deepspeed else "megatron",
        attention_kernel="eager",  # all runs in the set predate flash attention in their stacks
        overlap_grad_reduce=not deepspeed,
        overlap_param_gather=not deepspeed,
    )


def recompute_of(entry: dict) -> Recompute:
    text = (entry["training"].get("recompute") or "none").lower()
    if text.startswith("full"):
        return Recompute.FULL
    if text.startswith("selective"):
        return Recompute.SELECTIVE
    return Recompute.NONE


def evaluate_entry(entry: dict) -> tuple[Evaluation, str]:
    t = entry["training"]
    model = build_model(entry)
    cluster = build_cluster(entry)
    dtype = "fp16" if "fp16" in (t.get("precision") or "") else "bf16"
    config = ParallelConfig(
        tp=t["tp"], pp=t["pp"], dp=t["dp"], cp=t.get("cp") or 1, global_batch=t["global_batch"],
        seq_len=entry["model"]["seq_len"], sp=bool(t.get("sp")), zero_stage=t["zero_stage"] or 0,
        micro_batch=t["micro_batch"], virtual_stages=t.get("virtual_stages_per_pp_rank") or 1,
        dtype=dtype)
    desc = (f"tp{config.tp} pp{config.pp} dp{config.dp} mbs{config.micro_batch} "
            f"gbs{config.global_batch} z{config.zero_stage}")
    config.validate(model, cluster)
    placement = default_placement(model, config, LayerOption(recompute_of(entry)))
    return evaluate(model, cluster, config, placement, options=runtime_for(entry)), desc


def usable(entry: dict) -> str | None:
    """None when the entry can be evaluated, else why not."""
    if entry["kind"] != "measured":
        return "analytic reference (checked in the model-state section)"
    t = entry["training"]
    if t.get("micro_batch") is None:
        return "micro-batch size not published"
    return None


def row_for(entry: dict) -> Row:
    r = entry["results"]
    oom = bool(r.get("oom"))
    ev, desc = evaluate_entry(entry)
    published_time, source = r.get("iteration_time_s"), "published"
    if published_time is None and r.get("tflops_per_gpu"):
        published_time = eq3_flops(entry["model"], entry["training"]["global_batch"]) / (
            entry["cluster"]["num_gpus"] * r["tflops_per_gpu"] * 1e12)
        source = "from TFLOP/s (Eq. 3)"
    mem = r.get("memory_per_gpu_gb")
    return Row(entry["id"], desc, published_time, None if oom else ev.step_time_s,
               source if published_time else "-", mem, ev.peak_memory_bytes / 1e9, oom, ev.fits)


def zero_rows(entries: list[dict]) -> list[tuple[str, float, float]]:
    rows = []
    for entry in entries:
        r = entry["results"]
        if "model_state_memory_gb" in r:
            nd = entry["training"]["dp"]
            for stage, key in enumerate(("baseline_dp", "zero1_pos", "zero2_pos_g", "zero3_pos_g_p")):
                got = zero_state_bytes(7.5e9, nd, stage, RUNTIME_STATE_BYTES["zero-paper"]).total
                rows.append((f"{entry['id']} stage {stage}", r["model_state_memory_gb"][key], got / 1e9))
    return rows


def run() -> tuple[list[Row], list[tuple[str, str]], list[tuple[str, float, float]]]:
    entries = yaml.safe_load(DATA.read_text())["entries"]
    rows, skipped = [], []
    for entry in entries:
        reason = usable(entry)
        if reason:
            skipped.append((entry["id"], reason))
            continue
        rows.append(row_for(entry))
    return rows, skipped, zero_rows(entries)


def summary(rows: list[Row]) -> dict[str, Any]:
    time_errors = [abs(r.time_error) for r in rows if r.time_error is not None]
    mem_errors = [abs(r.memory_error) for r in rows if r.memory_error is not None]
    fit = [r for r in rows if r.fit_ok is not None]
    return {
        "time_n": len(time_errors), "time_median": statistics.median(time_errors),
        "time_max": max(time_errors),
        "time_within_target": sum(e <= TIME_TARGET for e in time_errors),
        "memory_n": len(mem_errors), "memory_median": statistics.median(mem_errors),
        "memory_max": max(mem_errors),
        "memory_within_target": sum(e <= MEMORY_TARGET for e in mem_errors),
        "fit_n": len(fit), "fit_ok": sum(bool(r.fit_ok) for r in fit),
        "oom_n": sum(r.oom_published for r in rows),
        "oom_ok": sum(r.oom_published and r.fits_predicted is False for r in rows),
    }


def _pct(value: float | None) -> str:
    return "" if value is None else f"{value:+.1%}"


def _num(value: float | None, digits: int = 1) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def render(rows: list[Row], skipped, zero) -> str:
    s = summary(rows)
    lines = [
        "# Cost-model accuracy on published runs",
        "",
        "Generated by `python bench/accuracy.py` from `bench/data/published_runs.yaml` with the",
        "library's default constants (no per-entry tuning). Time: seconds per optimizer step.",
        "Memory: GB (1e9 bytes) as nvidia-smi reports it (predicted peak includes the runtime",
        "reserve and allocator overhead). See the module docstring for how entries become inputs.",
        "",
        "## Summary",
        "",
        f"- step time: median |error| **{s['time_median']:.1%}**, max {s['time_max']:.1%} over "
        f"{s['time_n']} runs; {s['time_within_target']}/{s['time_n']} within "
        f"{TIME_TARGET:.0%} (target: median <= 10%)",
        f"- memory: median |error| **{s['memory_median']:.1%}**, max {s['memory_max']:.1%} over "
        f"{s['memory_n']} runs; {s['memory_within_target']}/{s['memory_n']} within "
        f"{MEMORY_TARGET:.0%}",
        f"- fit verdicts: {s['fit_ok']}/{s['fit_n']} correct; out-of-memory runs predicted not "
        f"to fit: {s['oom_ok']}/{s['oom_n']}",
        "",
        "## Runs",
        "",
        "| entry | config | time published s | time predicted s | error | memory published GB "
        "| memory predicted GB | error | published | predicted |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.id} | {r.config} | {_num(r.time_published_s)} | {_num(r.time_predicted_s)} "
            f"| {_pct(r.time_error)} | {_num(r.memory_published_gb, 0)} "
            f"| {_num(r.memory_predicted_gb)} | {_pct(r.memory_error)} "
            f"| {'OOM' if r.oom_published else 'ran'} | {'fits' if r.fits_predicted else 'OOM'} |")
    lines += ["", "## Model-state memory (ZeRO worked example)", "",
              "| case | published GB | predicted GB |", "|---|---:|---:|"]
    lines += [f"| {name} | {pub:g} | {got:.3f} |" for name, pub, got in zero]
    wrong = [r for r in rows if r.fit_ok is False]
    if wrong:
        lines += ["", "## Known misses", "",
                  "Fit verdicts the model gets wrong, with the predicted peak against the 80 GiB",
                  "(85.9 GB) of an A100-80GB:", ""]
        lines += [f"- {r.id}: published {'OOM' if r.oom_published else 'ran'}, predicted "
                  f"{r.memory_predicted_gb:.1f} GB" for r in wrong]
        lines += ["", MISSES_NOTE]
    lines += ["", "## Entries not evaluated", ""]
    lines += [f"- {id_}: {reason}" for id_, reason in skipped]
    return "\n".join(lines) + "\n"


def targets_met(rows: list[Row]) -> list[str]:
    s = summary(rows)
    missed = []
    if s["time_median"] > TIME_TARGET:
        missed.append(f"median step-time error {s['time_median']:.1%} > {TIME_TARGET:.0%}")
    if s["memory_median"] > MEMORY_TARGET:
        missed.append(f"median memory error {s['memory_median']:.1%} > {MEMORY_TARGET:.0%}")
    if s["fit_ok"] != s["fit_n"]:
        wrong = [r.id for r in rows if r.fit_ok is False]
        missed.append(f"wrong fit verdicts: {', '.join(wrong)}")
    return missed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--no-write", action="store_true", help="do not write docs/accuracy.md")
    args = parser.parse_args()
    rows, skipped, zero = run()
    if not args.no_write:
        DOC.write_text(render(rows, skipped, zero))
    s = summary(rows)
    print(f"time: median {s['time_median']:.1%} max {s['time_max']:.1%} (n={s['time_n']}); "
          f"memory: median {s['memory_median']:.1%} max {s['memory_max']:.1%} "
          f"(n={s['memory_n']}); fits {s['fit_ok']}/{s['fit_n']}, OOM {s['oom_ok']}/{s['oom_n']}")
    missed = targets_met(rows)
    for line in missed:
        print("MISSED:", line)
    return 1 if (args.check and missed) else 0


if __name__ == "__main__":
    sys.exit(main())
