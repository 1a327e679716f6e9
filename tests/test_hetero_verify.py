"""``verify`` of a re-planned plan (fewer ranks, a layer moved off a straggler's stage) with an
injected straggler: on CPU processes the losses equal the single-process run's and every rank
holds the bytes the new plan predicts; the straggler's delay is really injected."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import run_cli  # noqa: E402

pytest.importorskip("torch", reason="PyTorch is not installed (pip install 'shardplan[torch]')")

# 4 nodes x 2 tiny GPUs: a pipeline stage of dp 4 spans two nodes, so a failed node leaves
# half of the replicas
CLUSTER = Path(__file__).resolve().parents[1] / "clusters" / "presets" / "tiny.yaml"


def test_verify_a_replanned_plan_with_a_straggler(capsys, tmp_path):
    cluster = tmp_path / "tiny-4x2.yaml"
    cluster.write_text(CLUSTER.read_text().replace("gpus_per_node: 4", "gpus_per_node: 2")
                       .replace("num_nodes: 2", "num_nodes: 4")
                       .replace("nics_per_node: 4", "nics_per_node: 2")
                       .replace("name: tiny\n", "name: tiny-4x2\n"))
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    code, _, err = run_cli(["plan", "-m", "tiny", "-c", cluster, "--global-batch", "16",
                            "--pin", "pp=2", "--pin", "tp=1", "--pin", "dp=4",
                            "--pin", "virtual_stages=1", "-o", old, "--json"], capsys)
    assert code == 0, err
    # rank 7 fails (its node's replicas leave) and rank 0 is 2.5x slow: layers move off stage 0
    code, out, err = run_cli(["replan", old, "--failed", "7", "--slow", "0:2.5", "-o", new,
                              "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    r = doc["replan"]
    assert r["gpus_used"] == 4 and r["moved_layers"] >= 1
    # run the new plan with its straggler injected (new rank 0 is old rank 0)
    assert r["rank_map"][0] == 0
    code, out, err = run_cli(["verify", new, "--slow", "0:2.5", "--json"], capsys)
    report = json.loads(out)
    assert code == 0 and report["ok"], (report["loss"], err)
    assert report["world_size"] == 4 and report["slow_ranks"] == {"0": 2.5}
    slowed = {row["rank"]: row for row in report["ranks"]}
    assert all(d > 0 for d in slowed[0]["injected_delay_s"]) and slowed[0]["slowdown"] == 2.5
    assert all(not row["injected_delay_s"] for rank, row in slowed.items() if rank != 0)
