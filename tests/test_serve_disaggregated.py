"""The disaggregated serving search is exact: on small instances it returns the optimum of
evaluating every prefill layout, decode layout, pool sizes and decode batch
(planner/serve/disaggregated.py; the brute force is bench/serve_search.py's), under a latency
target, a given concurrency or a given request rate."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from models import load_model
from planner.serve.search import search_serving
from planner.serve.workload import ServingWorkload

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import serve_search  # noqa: E402


@pytest.mark.parametrize("name,gpus,memory,isl,osl,ttft,tpot,load,rt", serve_search.SMALL)
def test_disaggregated_search_equals_brute_force(name, gpus, memory, isl, osl, ttft, tpot,
                                                 load, rt):
    model, cluster = load_model(name), serve_search.small_cluster(gpus, memory)
    wl = ServingWorkload(isl=isl, osl=osl, ttft_ms=ttft, tpot_ms=tpot, mode="disaggregated",
                         dtype="fp8", kv_dtype="fp8", **load)
    result = search_serving(model, cluster, wl, rt)
    brute, count = serve_search.brute_force_disaggregated(model, cluster, wl, rt)
    assert brute is not None, "the instance must have a feasible deployment"
    found = result.best
    assert found is not None and found.meets_targets()
    assert found.output_tokens_per_s_per_gpu == pytest.approx(
        brute.output_tokens_per_s_per_gpu, rel=1e-12)
    assert result.pruned > 0 and result.evaluated < count  # the bounds did cut the space
