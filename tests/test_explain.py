"""Why nothing fits, under the user's pins: the leanest plan and the node count that would fit
are searched in the pinned space, and the node count given really fits."""
from __future__ import annotations

import pytest

from clusters import load_cluster
from models import load_model
from planner.errors import ErrorKind, PlannerError
from planner.solve.search import SearchOptions, search
from planner.solve.space import Pins
from planner.strategy import Recompute

MODEL = load_model("llama-3.1-70b")
CLUSTER = load_cluster("dgx-a100-40g", nodes=1)


def explain(pins: Pins) -> PlannerError:
    with pytest.raises(PlannerError) as error:
        search(MODEL, CLUSTER, 8, MODEL.default_seq_len, "bf16", pins,
               SearchOptions(time_limit_s=60))
    assert error.value.kind is ErrorKind.DOES_NOT_FIT
    return error.value


@pytest.mark.parametrize("pins, recompute", [(Pins(), "full"),
                                             (Pins(recompute=Recompute.NONE), "none")])
def test_leanest_plan_and_node_count_honour_the_pins(pins, recompute):
    error = explain(pins)
    details = error.details
    assert details["smallest_peak_config"]["recompute"] == recompute
    assert f"{recompute} recomputation" in error.message
    nodes = details["nodes_that_fit"]
    # the node count is one at which a plan under the same pins fits
    bigger = load_cluster("dgx-a100-40g", nodes=nodes)
    result = search(MODEL, bigger, 8, MODEL.default_seq_len, "bf16", pins,
                    SearchOptions(time_limit_s=60))
    assert result.best.fits
    if recompute == "none":
        assert all(r is Recompute.NONE for r in result.best.placement.recompute)


def test_pinning_no_recomputation_needs_at_least_as_many_nodes():
    assert explain(Pins(recompute=Recompute.NONE)).details["nodes_that_fit"] >= \
        explain(Pins()).details["nodes_that_fit"]
