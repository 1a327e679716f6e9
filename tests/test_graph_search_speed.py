"""The candidate enumeration's shortcuts (planner/solve/candidates.py) change nothing.

Configurations that differ only in their virtual stages share their layers' terms
(``terms_key``), and configurations whose layers see the same shard, links, GPU and runtime
options share their layers' compute, communication and activation terms whatever their
pipeline and data-parallel degrees or ZeRO stage (``planner.cost.terms.WorkView``): each
shared problem must hold exactly the terms a fresh ``stage_problem`` builds with that
configuration's own context and none of the shared work, on instances with a tied table over
pipeline stages, per-layer layouts, MoE blocks, ZeRO-3 and the V-placed schedules (whose head
terms depend on the chunks: they are never shared)."""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

import pytest

from planner.config import RuntimeOptions
from planner.cost import terms
from planner.cost.context import make_context
from planner.profiles import profile
from planner.solve.bounds import (fitting_time_lower_bound, free_memory_lower_bound,
                                  free_time_lower_bound)
from planner.solve.candidates import candidates, terms_key
from planner.solve.costs import stage_problem
from planner.solve.space import Pins
from planner.strategy import Layout
from tests.test_solver_bruteforce import cluster, native

MOE = {"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 256, "first_dense_layers": 1}
CASES = [  # (id, model, cluster, global batch, pins, runtime profile)
    ("tied-interleaved", native(8, tied_embeddings=True), cluster(8, 2, 2), 16,
     Pins(zero=1), "megatron"),
    ("per-layer", native(8, tied_embeddings=True), cluster(8, 1, 4), 16,
     Pins(layouts="per-layer", pp=2), "megatron"),
    ("moe-zero3-v-schedules", native(8, moe=MOE), cluster(8, 2, 2), 16, Pins(), "torchtitan"),
]


def _same_terms(a, b) -> bool:
    return (a.classes == b.classes and a.pre_costs == b.pre_costs
            and a.post_costs == b.post_costs and a.edge_options == b.edge_options
            and a.edge_costs == b.edge_costs and a.sync_choices() == b.sync_choices())


@pytest.mark.parametrize("model,hw,batch,pins,runtime", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_shared_terms_equal_fresh_terms(model, hw, batch, pins, runtime):
    options = RuntimeOptions(profile=runtime)
    cands = candidates(model, hw, batch, model.default_seq_len, "bf16", pins, options,
                       math.inf, hw.memory_bytes_per_gpu)
    shared = Counter(terms_key(c.config) for c in cands)
    assert max(shared.values()) > 1  # the case exercises the sharing
    # and the layer work is shared between configurations that do not share their terms
    works = {terms.work_view(c.problem.ctx, Layout.MESH) for c in cands}
    assert len(works) < len(shared)
    _check_against_fresh(cands, model, hw, pins, options)


def _check_against_fresh(cands, model, hw, pins, options):
    prof = profile(options.profile)
    for cand in cands:
        terms._layer_work.cache_clear()  # fresh: computed from this configuration alone
        ctx = make_context(model, hw, cand.config, options)
        assert cand.problem.ctx.config == cand.config
        fresh = stage_problem(ctx, pins.block_options(cand.config, prof),
                              hw.memory_bytes_per_gpu)
        assert _same_terms(cand.problem, fresh), cand.config
        # the bounds' sums shared between copies (StageProblem.with_context) are this
        # configuration's: each bound equals the fresh problem's
        for bound in (free_time_lower_bound, free_memory_lower_bound, fitting_time_lower_bound):
            assert bound(cand.problem) == bound(fresh), (bound.__name__, cand.config)


def test_hpz_configurations_keep_their_own_terms():
    """ZeRO-3 with and without ZeRO++ hpZ (DeepSpeed, one node's GPUs): configurations that
    differ only in hpz do not share their terms (its secondary partition is in the layers'
    states and gathers)."""
    model, hw, pins = native(8), cluster(4, 2, 2), Pins(zero=3)
    options = RuntimeOptions(profile="deepspeed")
    cands = candidates(model, hw, 16, model.default_seq_len, "bf16", pins, options, math.inf,
                       hw.memory_bytes_per_gpu)
    pairs = Counter(replace(c.config, hpz=0) for c in cands)
    assert any(c.config.hpz for c in cands) and max(pairs.values()) > 1
    _check_against_fresh(cands, model, hw, pins, options)
