"""Per-block activation offload (LayerOption.act_offload): saved activations in host memory,
copied over the host link behind the next block's compute; the solver weighs it against
recomputation (brute force agrees: tests/test_graph_offload.py), only runtimes that offer it
may pick it, the plan carries it."""
from __future__ import annotations

from dataclasses import replace

import pytest

from clusters import load_cluster
from planner.config import ParallelConfig
from planner.cost.context import make_context
from planner.cost.model import evaluate
from planner.cost.compute import hbm_bytes_per_s
from planner.cost.terms import _config_terms, layer_terms, option_valid
from planner.errors import PlannerError
from planner.profiles import profile
from planner.solve.search import search
from planner.solve.space import Pins
from planner.strategy import LayerOption, LayerPlacement, Recompute, block_options
from test_graph_offload import HOST, model


@pytest.fixture(scope="module")
def tiny():
    return replace(load_cluster("tiny"), cpu_memory=HOST)


def test_terms_move_activations_to_the_host_and_charge_the_exposed_copy(tiny):
    m = model()
    c = ParallelConfig(tp=1, pp=2, dp=4, micro_batch=1, global_batch=8, seq_len=256)
    ctx = make_context(m, tiny, c)
    block = m.layers[1]
    on, off = layer_terms(ctx, block, LayerOption()), layer_terms(ctx, block,
                                                                   LayerOption(act_offload=True))
    stored = on.act_stored_bytes
    assert stored > 0 and off.act_stored_bytes == 0
    assert off.host_bytes == pytest.approx(stored * max(_config_terms(ctx).in_flight))
    assert off.act_working_bytes == pytest.approx(on.act_working_bytes + 2 * stored)
    copy = stored / HOST.link_bytes_per_s
    exposed = (max(0.0, copy - on.fwd_s) + max(0.0, copy - on.bwd_s)
               + 2 * stored / hbm_bytes_per_s(tiny.gpu))
    assert off.comm_s - on.comm_s == pytest.approx(exposed)
    # a slow link exposes the copies
    slow = make_context(m, replace(tiny, cpu_memory=replace(HOST, link_gbytes_per_s=0.01)), c)
    assert layer_terms(slow, block, LayerOption(act_offload=True)).comm_s > on.bwd_s
    # blocks only, not with full recomputation, not without a host section
    assert not option_valid(ctx, m.layers[0], LayerOption(act_offload=True))
    assert not option_valid(ctx, block, LayerOption(Recompute.FULL, act_offload=True))
    assert not option_valid(make_context(m, load_cluster("tiny"), c), block,
                            LayerOption(act_offload=True))
    assert all(not o.act_offload or o.recompute in (Recompute.NONE, Recompute.SELECTIVE)
               for o in block_options(act_offload=(False, True)))


def test_activation_offload_beats_recomputation_when_memory_binds(tiny):
    """At 0.21 GiB per GPU the plain plan fully recomputes a block; with activation offload the
    block keeps its activations on the host instead (the copies hide behind the next block),
    faster, and within the host's capacity. With memory to spare nothing is offloaded."""
    m = model()
    cluster = replace(tiny, gpu=replace(tiny.gpu, memory_gib=0.21))
    pins = dict(tp=1, pp=1, micro_batch=1)
    plain = search(m, cluster, 64, 256, pins=Pins(**pins)).best
    found = search(m, cluster, 64, 256, pins=Pins(offload="activations", **pins)).best
    assert any(o.recompute is Recompute.FULL for o in plain.placement.options)
    assert found.step_time_s < plain.step_time_s
    assert any(o.act_offload for o in found.placement.options)
    assert all(s.host_bytes <= HOST.capacity_bytes for s in found.stages)
    roomy = replace(tiny, gpu=replace(tiny.gpu, memory_gib=1.0))
    assert not any(o.act_offload for o in search(m, roomy, 64, 256, pins=Pins(
        offload="activations", **pins)).best.placement.options)
    # the plan file carries the choice and evaluate reads it back
    from planner.plan import layers_list
    layers = layers_list(found)
    assert [bool(x.get("act_offload")) for x in layers] == \
        [o.act_offload for o in found.placement.options]
    again = evaluate(m, cluster, found.config, LayerPlacement(
        found.placement.stage, tuple(LayerOption(o.recompute, o.layout, o.offload,
                                                 bool(x.get("act_offload")))
                                     for o, x in zip(found.placement.options, layers))))
    assert again.step_time_s == found.step_time_s


def test_only_runtimes_that_offer_it_may_pick_it():
    Pins(offload="activations").check_runtime(profile("megatron"))
    with pytest.raises(PlannerError, match="activation offload"):
        Pins(offload="activations").check_runtime(profile("torchtitan"))
    with pytest.raises(PlannerError):
        Pins.parse({"offload": "activation"})
