"""Load calibration runs: the model and cluster of each entry of a runs file, then its
:class:`~planner.calibration.runs.CalibrationRun` (rules in planner/calibration/runs.py).

Lives with the cluster importers because it builds clusters and models from an entry's fields
(planner/ never imports the importers). Used by ``bench/accuracy.py``,
``bench/calibrate_defaults.py`` and ``shardplan calibrate``.
"""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

from clusters.loader import load_cluster
from clusters.schema import with_nodes
from models.native import build_native
from planner.calibration.runs import (CalibrationRun, _text, model_spec, run_of, seq_len_of,
                                      skip_reason)
from planner.calibration.constants import Constants
from planner.calibration.store import shipped
from planner.calibration.user import CalibrationReport, calibrate_runs
from planner.errors import PlannerError, invalid
from planner.profiles import profile
from planner.safe_input import parse_yaml, read_text
from planner.hardware import Cluster
from planner.ir import ModelGraph

BENCH_CLUSTERS = Path(__file__).resolve().parents[1] / "bench" / "clusters"


def build_model(entry: Mapping[str, Any], base: Path | None = None) -> ModelGraph:
    spec = model_spec(entry)
    if spec is not None:
        from models import load_model
        looks_like_path = "/" in spec or spec.endswith((".json", ".yaml", ".yml"))
        if base is not None and looks_like_path and not Path(spec).is_absolute():
            spec = str(base / spec)
        return load_model(spec, seq_len=seq_len_of(entry))
    m = entry["model"]
    name = _text(m.get("name"))
    notes = (_text(m.get("arch_notes")) + " " + _text(entry.get("notes"))).lower()
    lowered = name.lower()
    spec: dict[str, Any] = {
        "shardplan_model": 1, "name": name or entry["id"], "num_layers": m["layers"],
        "hidden_size": m["hidden"], "num_heads": m["heads"] or m["hidden"] // 128,
        "ffn_hidden_size": m.get("ffn_hidden") or 4 * m["hidden"], "vocab_size": m["vocab"],
        "seq_len": m["seq_len"], "max_seq_len": m["seq_len"],
    }
    if "llama" in lowered:
        spec.update(gated_mlp=True, norm="rmsnorm", bias=False, position_embedding="rope",
                    tied_embeddings=False)
    elif lowered.startswith("mpt"):
        spec.update(gated_mlp=False, norm="layernorm", bias=False, position_embedding="none",
                    tied_embeddings=True)
    else:
        position = "learned"
        if "alibi" in notes:
            position = "none"
        if "rotary" in notes or "rope" in notes:
            position = "rope"
        spec.update(gated_mlp=False, norm="layernorm", bias=True, position_embedding=position,
                    tied_embeddings="untied" not in notes)
    if m.get("kv_heads"):
        spec["num_kv_heads"] = m["kv_heads"]
    if m.get("head_dim"):
        spec["head_dim"] = m["head_dim"]
    return build_native(spec, where=entry["id"], source=f"calibration:{entry['id']}")


def cluster_for_gpus(preset: Cluster, num_gpus: int, where: str = "run") -> Cluster:
    """``preset`` resized to exactly ``num_gpus``: whole nodes when they divide it; fewer GPUs
    than a node: one node of ``num_gpus`` (the job's share of one NVLink domain); otherwise the
    fewest nodes that hold them, equally filled (256 GB200 = 4 NVL72 racks of 64 GPUs)."""
    per_node = preset.gpus_per_node
    if num_gpus % per_node == 0:
        return with_nodes(preset, num_gpus // per_node, where)
    nodes = math.ceil(num_gpus / per_node)
    if num_gpus % nodes:
        raise ValueError(f"{where}: {num_gpus} GPUs do not fill {preset.name} nodes evenly")
    used = num_gpus // nodes
    nics = min(preset.nics_per_node or used, used)
    return with_nodes(replace(preset, gpus_per_node=used, nics_per_node=nics), nodes, where)


def build_cluster(entry: Mapping[str, Any]) -> Cluster:
    c = entry["cluster"]
    gpu = _text(c.get("gpu"))
    per_node = c.get("gpus_per_node") or 8
    nodes = c.get("num_nodes") or max(1, math.ceil(c["num_gpus"] / per_node))
    inter = _text(c.get("inter_node_interconnect"))
    intra = _text(c.get("intra_node_interconnect"))
    if "Omni-Path" in inter:
        return load_cluster(str(BENCH_CLUSTERS / "jean-zay-a100-80g.yaml"), nodes=nodes)
    if "ConnectX-6 HCAs" in inter and "40GB" in gpu:
        return load_cluster(str(BENCH_CLUSTERS / "neox-hgx-a100-40g.yaml"), nodes=nodes)
    if "H100" in gpu and "96GB" in gpu:
        return load_cluster(str(BENCH_CLUSTERS / "grand-teton-h100-96g.yaml"), nodes=nodes)
    if "GB200" in gpu or "NVL72" in intra:
        return cluster_for_gpus(load_cluster("dgx-gb200-nvl72"), c["num_gpus"], entry["id"])
    preset = None
    for needle, name in (("B300", "dgx-b300"), ("B200", "dgx-b200"), ("H200", "dgx-h200"),
                         ("H100", "dgx-h100"), ("MI300X", "mi300x")):
        if needle in gpu:
            preset = name
            break
    if preset is None and "A100" in gpu:
        preset = "dgx-a100-80g" if "80" in gpu else "dgx-a100-40g"
    if preset is None:
        raise ValueError(f"no cluster description for GPU {gpu!r}")
    return cluster_for_gpus(load_cluster(preset), c["num_gpus"], entry["id"])


def load_runs(entries: list[Mapping[str, Any]], base: Path | None = None
              ) -> tuple[list[CalibrationRun], list[tuple[str, str]]]:
    """Every evaluable entry as a run, and (id, reason) for the others; ``base`` resolves
    relative model paths (the runs file's directory)."""
    runs, skipped = [], []
    for entry in entries:
        reason = skip_reason(entry)
        if reason is None:
            try:
                model = build_model(entry, base)
            except (PlannerError, ValueError, KeyError) as exc:
                if model_spec(entry) is None:
                    raise
                # a model named by reference that does not load is the runs file's error
                # (a mistyped preset or path), not a run to skip in silence
                why = exc.message if isinstance(exc, PlannerError) else str(exc)
                raise invalid(f"run {entry['id']}: model {model_spec(entry)!r}: {why}",
                              "model is a preset name (shardplan models) or a config.json / "
                              "model file path, relative to the runs file") from None
            try:
                run = run_of(entry, model, build_cluster(entry))
                run.config.validate(run.model, run.cluster)
                runs.append(run)
                continue
            except (PlannerError, ValueError, KeyError) as exc:
                reason = f"inconsistent published configuration: {exc}"
        skipped.append((entry["id"], reason))
    return runs, skipped


def read_runs(path: str | Path) -> tuple[list[Mapping[str, Any]], Path]:
    path = Path(path)
    data = parse_yaml(read_text(path, "runs file"), str(path))
    if not isinstance(data, Mapping) or not isinstance(data.get("entries"), list):
        raise invalid(f"{path}: expected a mapping with an 'entries' list (the schema of "
                      "bench/data/published_runs.yaml)")
    for i, entry in enumerate(data["entries"]):
        if not isinstance(entry, Mapping) or not isinstance(entry.get("id"), str):
            raise invalid(f"{path}: entries[{i}]: expected a mapping with a string 'id'")
    return data["entries"], path.parent


def calibrate_file(path: str | Path, runtime: str | None = None, *,
                   max_evaluations: int = 60, leave_one_out: bool = True,
                   start: Constants | None = None) -> CalibrationReport:
    """Fit the runs of ``path`` (those of ``runtime`` when given; else all must share one)."""
    entries, base = read_runs(path)
    runs, skipped = load_runs(entries, base)
    if runtime is not None:
        name = profile(runtime).name
        other = [r for r in runs if r.profile.name != name]
        skipped = list(skipped) + [(r.id, f"runtime {r.profile.name}, not {name}") for r in other]
        runs = [r for r in runs if r.profile.name == name]
    else:
        names = sorted({r.profile.name for r in runs})
        if len(names) > 1:
            raise invalid(f"{path}: runs of several runtimes ({', '.join(names)})",
                          "pass --runtime to calibrate one of them")
        name = names[0] if names else "megatron"
    if not runs:
        raise invalid(f"{path}: no usable run" + (f" of runtime {name}" if runtime else ""),
                      *(["; ".join(f"{i}: {why}" for i, why in skipped[:5])] if skipped
                        else ["the file has no entries"]))
    start_bands = None
    if start is None:
        base_profile = shipped()
        start = base_profile.constants if base_profile else Constants()
        start_bands = base_profile.bands if base_profile else None
    return calibrate_runs(runs, name, start, max_evaluations=max_evaluations,
                          leave_one_out=leave_one_out, skipped=skipped,
                          start_bands=start_bands)


