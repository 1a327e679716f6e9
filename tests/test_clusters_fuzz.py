"""Fuzz: load_cluster returns a Cluster or raises PlannerError, never anything else."""
from __future__ import annotations

import math
import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusters import load_cluster
from planner.topology import group_link
from planner.errors import PlannerError
from planner.hardware import Cluster

KEYS = ["shardplan_cluster", "name", "gpu", "gpu_overrides", "gpus_per_node", "num_nodes",
        "nics_per_node", "scalable_unit_nodes", "spine_oversubscription", "spine_latency_us",
        "intra_node_topology", "tiers", "description", "source", "bandwidth_gbytes_per_s",
        "latency_us", "efficiency", "memory_gib", "peak_tflops", "bf16", "num_sms"]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-10**30, max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20),
    st.sampled_from(["h100-sxm", "tiny-gpu", "nvlink", "switch", "full_mesh", "1", ".nan"]))
documents = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=8)), children,
                        max_size=6)),
    max_leaves=30)

BASE = {
    "shardplan_cluster": 1, "name": "f", "gpu": "tiny-gpu", "gpus_per_node": 4, "num_nodes": 2,
    "tiers": [{"name": "a", "bandwidth_gbytes_per_s": 50, "latency_us": 1.0},
              {"name": "b", "bandwidth_gbytes_per_s": 5, "latency_us": 5.0}],
}


def check(content: bytes) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "fuzz.yaml"
        path.write_bytes(content)
        try:
            result = load_cluster(str(path))
        except PlannerError as error:
            assert error.message
            return
        assert isinstance(result, Cluster)


FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(st.binary(max_size=300))
def test_random_bytes(content):
    check(content)


@FAST
@given(documents)
def test_random_documents(document):
    check(yaml.safe_dump(document).encode())


@FAST
@given(st.sampled_from(sorted(BASE)), st.one_of(documents, scalars))
def test_mutated_valid_document(key, value):
    check(yaml.safe_dump({**BASE, key: value}).encode())


@FAST
@given(st.sampled_from(["bandwidth_gbytes_per_s", "latency_us", "efficiency", "name", "extra"]),
       scalars, st.integers(0, 1))
def test_mutated_tier(field, value, index):
    tiers = [dict(t) for t in BASE["tiers"]]
    tiers[index][field] = value
    check(yaml.safe_dump({**BASE, "tiers": tiers}).encode())


@FAST
@given(st.text(max_size=200))
def test_random_text(text):
    check(text.encode("utf-8", "surrogatepass"))


@FAST
@given(gpn=st.integers(1, 8), nodes=st.integers(1, 12), nics=st.integers(0, 8),
       su=st.integers(1, 6), mesh=st.booleans(), size=st.integers(1, 40), stride=st.integers(1, 40))
def test_group_link_on_random_clusters(gpn, nodes, nics, su, mesh, size, stride):
    document = {**BASE, "gpus_per_node": gpn, "num_nodes": nodes, "nics_per_node": min(nics, gpn),
                "scalable_unit_nodes": su,
                "intra_node_topology": "full_mesh" if mesh and gpn > 1 else "switch"}
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "c.yaml"
        path.write_text(yaml.safe_dump(document))
        cluster = load_cluster(str(path))
    try:
        link = group_link(cluster, size, stride)
    except PlannerError:
        assert (size - 1) * stride >= cluster.num_gpus
        return
    assert link.bandwidth_bytes_per_s > 0 and link.latency_s >= 0
    if size > 1:
        assert math.isfinite(link.bandwidth_bytes_per_s)
        assert 0 < link.all_to_all_bandwidth_bytes_per_s < math.inf
