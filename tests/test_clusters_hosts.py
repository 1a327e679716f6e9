"""GPUs per host (``gpus_per_host``): a node of the cost model (an NVLink domain) may hold several
hosts, each running its own launcher. A GB200 / GB300 NVL72 rack is one 72-GPU node of 18
compute trays of 4 GPUs: the exports' launch lines start 4 processes on each of 18 x racks
hosts, while every prediction stays that of the 72-GPU NVLink domain."""
from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from clusters import load_cluster
from models import load_model
from planner.config import ParallelConfig
from planner.cost.model import evaluate
from planner.errors import ErrorKind, PlannerError
from planner.export import export_plan
from planner.plan import content_hash
from planner.plan_types import Plan
from planner.report import evaluation_dict
from planner.serialize import cluster_from_dict, cluster_to_dict
from planner.strategy import uniform
from conftest import build_plan, run_cli, write

PRESETS = Path(__file__).resolve().parents[1] / "clusters" / "presets"
LAUNCH = re.compile(r"torchrun --nproc-per-node (\d+) --nnodes (\d+) ")


def _launch(doc: dict, fmt: str) -> tuple[int, int]:
    text = export_plan(Plan.from_dict(doc), fmt).text
    (match,) = LAUNCH.findall(text)
    return int(match[0]), int(match[1])


@pytest.mark.parametrize("preset", ["dgx-gb200-nvl72", "dgx-gb300-nvl72"])
@pytest.mark.parametrize("fmt", ["megatron", "torchtitan"])
def test_nvl72_launch_starts_one_launcher_per_compute_tray(preset, fmt):
    doc = build_plan("gpt3-1.3b", preset, nodes=2, global_batch=144)
    assert doc["cluster"]["gpus_per_node"] == 72 and doc["cluster"]["gpus_per_host"] == 4
    # 2 racks x 18 compute trays, 4 GPUs each (was --nproc-per-node 72 --nnodes 2)
    assert _launch(doc, fmt) == (4, 36)
    assert "36 hosts of 4" in export_plan(Plan.from_dict(doc), fmt).text.splitlines()[0]


@pytest.mark.parametrize("fmt", ["megatron", "torchtitan"])
def test_one_host_per_node_launch_is_unchanged(fmt):
    doc = build_plan("gpt3-1.3b", "dgx-h100", nodes=2, global_batch=16)
    assert "gpus_per_host" not in doc["cluster"]
    assert "gpus_per_host" not in doc["inputs"]["cluster"]["ir"]
    assert _launch(doc, fmt) == (8, 2)


def test_hosts_do_not_move_any_prediction():
    """The cost model reads the NVLink domain (the node), never the host."""
    graph = load_model("gpt3-1.3b")
    rack = load_cluster("dgx-gb200-nvl72", nodes=2)
    one_host = replace(rack, gpus_per_host=0)
    config = ParallelConfig(tp=8, pp=2, dp=9, global_batch=144,
                            seq_len=graph.default_seq_len, sp=True)
    placement = uniform(graph, config, "selective")
    a = evaluation_dict(evaluate(graph, rack, config, placement))
    b = evaluation_dict(evaluate(graph, one_host, config, placement))
    assert a["cluster"].pop("gpus_per_host") == 4
    assert a == b


def _cluster_file(tmp_path: Path, preset: str, line: str | None, name: str = "c.yaml") -> Path:
    text = (PRESETS / f"{preset}.yaml").read_text()
    text = re.sub(r"^gpus_per_host: .*\n", "", text, flags=re.M)
    if line is not None:
        text = text.replace("num_nodes: 1\n", f"num_nodes: 1\n{line}\n")
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("value, message", [
    ("5", "gpus_per_host: 5 GPUs per host do not divide the 72 GPUs of a node"),
    ("0", "gpus_per_host: must be >= 1, got 0"),
    ("-4", "gpus_per_host: must be >= 1"),
    ("4.0", "gpus_per_host: expected an integer"),
    ("true", "gpus_per_host: expected an integer"),
    ("145", "gpus_per_host: 145 is implausibly large"),
])
def test_bad_gpus_per_host_is_refused(tmp_path, value, message):
    path = _cluster_file(tmp_path, "dgx-gb200-nvl72", f"gpus_per_host: {value}")
    with pytest.raises(PlannerError) as info:
        load_cluster(str(path))
    assert info.value.kind is ErrorKind.INVALID_INPUT
    assert message in str(info.value)


def test_bad_gpus_per_host_exits_2_naming_the_field(tmp_path, capsys):
    path = _cluster_file(tmp_path, "dgx-gb200-nvl72", "gpus_per_host: 5")
    code, _, err = run_cli(["plan", "-m", "gpt3-1.3b", "-c", path, "--global-batch", "72",
                            "-o", tmp_path / "p.json"], capsys)
    assert code == 2
    assert "gpus_per_host" in err and "do not divide" in err and "4" in err


def test_pools_refuse_gpus_per_host(tmp_path):
    path = tmp_path / "pools.yaml"
    path.write_text("shardplan_cluster: 1\nname: two\ngpus_per_host: 4\npools:\n"
                    "  - {preset: dgx-h100, num_nodes: 1}\n  - {preset: dgx-a100-80g, num_nodes: 1}\n"
                    "inter_pool: {bandwidth_gbytes_per_s: 100, latency_us: 10}\n")
    with pytest.raises(PlannerError, match="gpus_per_host"):
        load_cluster(str(path), multi_pool=True)


# The content hash of the dgx-h100 preset before gpus_per_host existed: a field at its default
# must not move the hash of any existing cluster (check would call every plan stale).
DGX_H100_SHA256 = "sha256:4735a0cf1be0c1465aca5214516ecb97b54e05a42d516523592fb2a779e69eba"


def test_one_host_per_node_keeps_its_content_hash(tmp_path):
    assert content_hash(load_cluster("dgx-h100")) == DGX_H100_SHA256
    plain = _cluster_file(tmp_path, "dgx-h100", None, "plain.yaml")
    explicit = _cluster_file(tmp_path, "dgx-h100", "gpus_per_host: 8", "explicit.yaml")
    assert content_hash(load_cluster(str(explicit))) == DGX_H100_SHA256
    assert content_hash(load_cluster(str(plain))) == DGX_H100_SHA256
    assert "gpus_per_host" not in cluster_to_dict(load_cluster(str(explicit)))
    trays = load_cluster(str(_cluster_file(tmp_path, "dgx-h100", "gpus_per_host: 4", "t.yaml")))
    assert content_hash(trays) != DGX_H100_SHA256
    assert cluster_from_dict(json.loads(json.dumps(cluster_to_dict(trays)))) == trays
    assert (trays.host_gpus, trays.num_hosts) == (4, 2)


def test_check_sees_a_changed_host_size_as_stale(tmp_path, capsys):
    """A plan made for NVL72 racks of 4-GPU trays is stale against racks described as one
    host: its launch line differs."""
    plan = write(build_plan("gpt3-1.3b", "dgx-gb200-nvl72", global_batch=72), tmp_path / "p.json")
    code, out, _ = run_cli(["check", plan, "-c", "dgx-gb200-nvl72"], capsys)
    assert code == 0, out
    rack_as_host = _cluster_file(tmp_path, "dgx-gb200-nvl72", None)
    code, out, err = run_cli(["check", plan, "-c", rack_as_host], capsys)
    assert code == 1 and "content hash differs" in out + err


def test_embedded_cluster_with_a_bad_host_size_is_refused():
    ir = cluster_to_dict(load_cluster("dgx-gb200-nvl72"))
    with pytest.raises(PlannerError, match=r"\$\.gpus_per_host: 5 must divide gpus_per_node 72"):
        cluster_from_dict({**ir, "gpus_per_host": 5})
