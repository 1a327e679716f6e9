"""``shardplan plan`` on a multi-pool cluster: the search across pools, written as a plan file.

Consumes a model, a :class:`~planner.hardware.MultiPoolCluster`, the training inputs, pins,
:class:`~planner.solve.search.SearchOptions` (their ``runtime`` already the runtime profile's
options) and the calibration constants; produces the plan document of
:mod:`planner.hetero.plan_file` (schema_version 2). Each pool's stages are costed with that
pool's GPU generation's calibrated efficiencies (``RuntimeOptions.pool_efficiency``).
"""
from __future__ import annotations

from dataclasses import replace

from planner.errors import invalid
from planner.hardware import MultiPoolCluster
from planner.hetero.plan_file import make_pool_plan, pool_options
from planner.hetero.search import HeteroSearchResult, hetero_search
from planner.ir import ModelGraph
from planner.solve.search import SearchOptions
from planner.solve.space import Pins

# what the search across pools does not search (docs/heterogeneous.md)
_UNSUPPORTED_PINS = {"ep": "experts across pools", "etp": "experts across pools",
                     "layouts": "per-layer layouts across pools"}
NO_BANDS = ("extrapolating: no error bands for a plan across pools (every calibration run used "
            "one GPU type)")


def check_pool_pins(pins: Pins) -> None:
    for key, what in _UNSUPPORTED_PINS.items():
        value = getattr(pins, key)
        if value is not None and value not in (1, "mesh"):
            raise invalid(f"--pin {key}={value}: {what} are not planned yet",
                          "plan on one pool of the cluster, or drop the pin")
    if pins.virtual_stages not in (None, 1):
        raise invalid(f"--pin virtual_stages={pins.virtual_stages}: plans across pools use the "
                      f"1F1B schedule (interleaved chunks are equal, stages on different GPUs "
                      f"are not)", "drop the pin")


def plan_across_pools(model: ModelGraph, cluster: MultiPoolCluster, global_batch: int,
                      dtype: str, pins: Pins, options: SearchOptions, constants, *,
                      model_spec: str, cluster_spec: str, timings: bool = False
                      ) -> tuple[dict, HeteroSearchResult]:
    """The plan document and the search result."""
    check_pool_pins(pins)
    runtime = pool_options(options.runtime, cluster, constants)
    result = hetero_search(model, cluster, global_batch, model.default_seq_len, dtype, pins,
                           replace(options, runtime=runtime))
    solver = dict(result.record)
    if not timings:  # same inputs, same bytes
        del solver["solve_time_s"]
    doc = make_pool_plan(result.best, model_spec=model_spec, cluster_spec=cluster_spec,
                         solver=solver, alternatives=result.alternatives, pins=pins.as_dict())
    doc["predicted"]["extrapolating"] = [NO_BANDS]
    return doc, result
