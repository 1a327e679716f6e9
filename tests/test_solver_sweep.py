"""The search hints before it solves: every candidate whose bound is within the cutoff is
bounded and its start plan evaluated before the first CP-SAT solve, so no configuration is
solved without a cutoff (DeepSeek-V3's per-layer search on 2,048 H800 spent 4 of its 56 CPU
seconds on its first, cutoff-free solve). Which candidates must be solved does not change: the
optimum is brute force's, on a per-layer MoE instance where several configurations mimic one
another (a tp 4 mesh with every layer at tp/2 is a tp 2 plan)."""
from __future__ import annotations

import math

import pytest

from clusters import load_cluster
from models import load_model
from planner.solve.bruteforce import brute_force
from planner.solve.search import SearchOptions, search
from planner.solve.space import Pins
from planner.strategy import Recompute

PINS = Pins(layouts="per-layer", pp=1, etp=1, zero=1, micro_batch=2, recompute=Recompute.NONE)


def test_every_solve_runs_under_the_best_start_plan(monkeypatch):
    import planner.solve.search as search_module

    model, cluster = load_model("tiny-moe"), load_cluster("tiny")
    hinted, cutoffs = [], []
    real_hint, real_solve = search_module._hint, search_module.solve_stages

    def hint(*args):
        ev = real_hint(*args)
        hinted.append(math.inf if ev is None or not ev.fits else ev.step_time_s)
        return ev

    def solve(problem, **kwargs):
        cutoffs.append((len(hinted), kwargs["cutoff_s"]))
        return real_solve(problem, **kwargs)

    monkeypatch.setattr(search_module, "_hint", hint)
    monkeypatch.setattr(search_module, "solve_stages", solve)
    found = search(model, cluster, 16, 128, pins=PINS, options=SearchOptions(time_limit_s=60))
    oracle = brute_force(model, cluster, 16, 128, pins=PINS, budget=2_000_000)
    assert found.record.status == "OPTIMAL"
    assert found.best.step_time_s == pytest.approx(oracle.best.step_time_s, rel=1e-6)
    assert len(cutoffs) >= 2  # several configurations were solved
    # the sweep ran first: every start plan was evaluated before the first solve, and that
    # solve's cutoff is the best of them (the solver's margin of 1e-6 on top)
    first_hints, first_cutoff = cutoffs[0]
    assert first_hints == len(hinted) > 1
    assert first_cutoff == pytest.approx(min(hinted) * (1 + 1e-6), rel=1e-9)
    assert all(c is not None and c <= first_cutoff for _, c in cutoffs)
