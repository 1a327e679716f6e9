"""Re-plans under the plan's memory gate (``plan --memory-confidence Q --fallbacks K``,
``replan``) and the "more GPUs" hint of a gated search that does not fit.

A plan searched at Q 0.9 records ``solver.memory_confidence``; ``check`` gates the plan and
its stored fallbacks there by default, so the fallbacks (and ``replan``'s new plan) must be
chosen at that gate, the search's own test (``MemoryGate.peak_limit_bytes``), not at the
prediction within the headroom's limit. Small instances on an A100-named GPU
(tests/test_solver_gate.py's ``ampere``: the band's quantile widens the peak) where the gate
changes the fallback, or leaves none."""
from __future__ import annotations

import pytest

from planner.check import check_plan, memory_verdict
from planner.errors import ErrorKind, PlannerError
from planner.hetero.fallbacks import compute_fallbacks, fallback_decisions
from planner.hetero.replan import replan
from planner.cost.model import evaluate
from planner.calibration.store import shipped
from planner.hardware import GIB
from planner.plan import make_plan
from planner.plan_types import Plan
from planner.solve.gate import plan_gate
from planner.solve.headroom import NO_HEADROOM
from planner.solve.search import SearchOptions, search
from planner.solve.space import Pins
from test_solver_gate import N3, N5, N6, ampere, gated


def gated_plan(model, cluster, global_batch=8, confidence=0.9):
    """The plan searched at ``confidence`` (default headroom), as a Plan with its record."""
    result = search(model, cluster, global_batch, model.default_seq_len, "bf16", Pins(),
                    SearchOptions(memory_gate=gated(model, cluster, confidence)))
    doc = make_plan(result.best, model_spec=model.name, cluster_spec=cluster.name,
                    solver=result.record.as_dict())
    return result, doc


def with_fallbacks(doc, result, gate):
    b = result.best
    doc = dict(doc)
    doc["fallbacks"] = compute_fallbacks(b.model, b.cluster, b.config, b.placement, b.options,
                                         1, memory_limit_gib=result.record.memory_limit_gib,
                                         memory_gate=gate)
    return Plan.from_dict(doc)


def quantile_gib(plan, entry, confidence=0.9):
    survivors, config, placement = fallback_decisions(plan, entry)
    ev = evaluate(plan.model, survivors, config, placement, plan.runtime)
    return memory_verdict(ev, confidence, shipped())[2], survivors.gpu.memory_gib


def test_a_gated_plans_fallback_passes_check_at_the_recorded_gate():
    """N5 on 4 x 0.3 GiB: the fastest re-plan within the headroom's limit (0.279 GiB) peaks
    over the GPU at the 90 % quantile; the gated fallback (0.255 GiB) fits it, and check at
    the plan's recorded gate passes."""
    cluster = ampere(0.3, 4, 1)
    result, doc = gated_plan(N5, cluster)
    assert doc["solver"]["memory_confidence"] == 0.9
    plan = Plan.from_dict(doc)
    gate = plan_gate(plan)
    assert gate is not None and gate.confidence == 0.9
    ungated = with_fallbacks(doc, result, None)  # before: the headroom's limit only
    entry = ungated.document["fallbacks"][0]
    assert entry["status"] == "ok"
    high, capacity = quantile_gib(ungated, entry)
    assert high > capacity  # the gate bites
    assert not check_plan(ungated).ok
    assert any(p.code == "fallback" and "90% quantile" in p.message
               for p in check_plan(ungated).problems)
    gated_one = with_fallbacks(doc, result, gate)
    entry = gated_one.document["fallbacks"][0]
    assert entry["status"] == "ok", entry
    high, capacity = quantile_gib(gated_one, entry)
    assert high <= capacity
    report = check_plan(gated_one)
    assert report.memory_confidence == 0.9
    assert report.ok, report.problems


def test_no_fallback_passes_the_gate_is_a_clear_refusal():
    """N3 on 2 x 0.5 GiB: the one re-plan (one GPU) fits at the prediction but not at the
    90 % quantile: the fallback is refused with the reason (status none), check passes; and
    ``replan`` of the plan says so (DOES_NOT_FIT, the quantile in its message)."""
    cluster = ampere(0.5, 2, 1)
    result, doc = gated_plan(N3, cluster)
    plan = Plan.from_dict(doc)
    refused = with_fallbacks(doc, result, plan_gate(plan))
    entry = refused.document["fallbacks"][0]
    assert entry["status"] == "none"
    assert "90% quantile" in entry["reason"] and "--memory-confidence" in entry["reason"]
    assert check_plan(refused).ok
    with pytest.raises(PlannerError) as info:
        replan(plan.model, plan.cluster, plan.config, plan.placement, plan.runtime,
               failed=[0], memory_limit_gib=doc["solver"]["memory_limit_gib"],
               memory_gate=plan_gate(plan))
    assert info.value.kind is ErrorKind.DOES_NOT_FIT
    assert info.value.details["memory_confidence"] == 0.9
    # the same plan without its gate re-plans (the prediction fits)
    assert replan(plan.model, plan.cluster, plan.config, plan.placement, plan.runtime,
                  failed=[0]).chosen.evaluation.fits


def test_a_plan_at_the_prediction_has_no_gate():
    result, doc = gated_plan(N5, ampere(0.3, 4, 1), confidence=0.5)
    assert "memory_confidence" not in doc["solver"]
    assert plan_gate(Plan.from_dict(doc)) is None


def test_the_more_gpus_hint_names_a_node_count_that_fits_the_gate():
    """No plan of N3 fits one 0.3 GiB A100-named GPU at the 99 % quantile with full
    recomputation; the hint's node count gives a plan that passes the same gate (the search
    on that many nodes finds one), where the headroom's limit alone named fewer nodes."""
    model, pins = N3, Pins()
    cluster = ampere(0.3, 1, 1)
    gate = gated(model, cluster, 0.99)
    with pytest.raises(PlannerError) as info:
        search(model, cluster, 4, model.default_seq_len, "bf16", pins,
               SearchOptions(memory_headroom=NO_HEADROOM, memory_gate=gate))
    assert info.value.kind is ErrorKind.DOES_NOT_FIT
    nodes = info.value.details.get("nodes_that_fit")
    assert nodes is not None, info.value.hints
    assert any(f"{nodes} nodes" in h for h in info.value.hints)
    bigger = ampere(0.3, nodes, 1)
    found = search(model, bigger, 4, model.default_seq_len, "bf16", pins,
                   SearchOptions(memory_headroom=NO_HEADROOM,
                                 memory_gate=gated(model, bigger, 0.99))).best
    assert memory_verdict(found, 0.99, shipped())[2] * GIB <= bigger.memory_bytes_per_gpu \
        * (1 + 1e-12)
    if nodes > 2:  # the smaller node counts the hint passed over do not fit at the gate
        smaller = ampere(0.3, nodes // 2, 1)
        with pytest.raises(PlannerError):
            search(model, smaller, 4, model.default_seq_len, "bf16", pins,
                   SearchOptions(memory_headroom=NO_HEADROOM,
                                 memory_gate=gated(model, smaller, 0.99)))


def test_a_pinned_layouts_fallbacks_keep_the_layout_and_pass_check(tmp_path, capsys):
    """``plan --pin pipeline_layout=... --fallbacks 1`` at Q 0.9 (A100s: the band applies):
    the fallback keeps the layout (recorded in its parallelism, its blocks on the layout's
    ranks, no rebalancing, said in its notes) and ``check`` at the recorded gate passes it.
    Before, the fallback's record dropped the layout and rebalancing was offered."""
    import json

    from conftest import run_cli

    layout = "Et*5|t*7|t*7|t*5L"
    path = tmp_path / "plan.json"
    code, _, err = run_cli(["plan", "-m", "gpt3-1.3b", "-c", "dgx-a100-80g", "--nodes", "8",
                            "--global-batch", "64", "--pin", f"pipeline_layout={layout}",
                            "--pin", "pp=4", "--time-limit", "60", "--fallbacks", "1",
                            "--memory-confidence", "0.9", "-o", str(path)], capsys)
    assert code == 0, err
    doc = json.loads(path.read_text())
    assert doc["solver"]["memory_confidence"] == 0.9
    (entry,) = doc["fallbacks"]
    assert entry["status"] == "ok", entry
    assert entry["parallelism"]["pipeline_layout"] == layout
    assert entry["stage"] == [s for s in Plan.from_dict(doc).placement.stage]
    assert entry["replan"]["moved_layers"] == 0
    assert any("pipeline layout" in n and "pinned" in n for n in entry["replan"]["notes"])
    code, out, err = run_cli(["check", str(path), "--json"], capsys)
    assert code == 0, out + err
    assert json.loads(out)["memory_confidence"] == 0.9
    # replan of the plan: the layout and the gate carry over, and check gates the new plan there
    new = tmp_path / "replanned.json"
    code, _, err = run_cli(["replan", str(path), "--failed", "0", "-o", str(new)], capsys)
    assert code == 0, err
    replanned = json.loads(new.read_text())
    assert replanned["solver"]["memory_confidence"] == 0.9
    assert replanned["parallelism"]["pipeline_layout"] == layout
    code, out, err = run_cli(["check", str(new), "--json"], capsys)
    assert code == 0, out + err
    assert json.loads(out)["memory_confidence"] == 0.9


def test_candidates_total_counts_each_configuration_once_under_the_gate():
    """A configuration the gate splits by recomputation policy is two candidates but one
    configuration: solver.candidates_total counts the configurations (before: 2 for it)."""
    from planner.solve.candidates import candidates

    cluster = ampere(0.4, 1, 2)
    gate = gated(N6, cluster)
    split = candidates(N6, cluster, 8, N6.default_seq_len, "bf16", Pins(),
                       SearchOptions().runtime, memory_limit_bytes=cluster.memory_bytes_per_gpu,
                       gate=gate)
    assert len(split) > len({c.config for c in split})  # the gate splits some
    under = search(N6, cluster, 8, N6.default_seq_len, "bf16", Pins(),
                   SearchOptions(memory_headroom=NO_HEADROOM, memory_gate=gate)).record
    assert under.candidates_total == len({c.config for c in split})
    assert under.candidates_pruned_memory <= under.candidates_total
