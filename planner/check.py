"""``shardplan check``: does a saved plan still hold? (the CI gate)

Consumes a :class:`~planner.plan_types.Plan` and optionally a model and a cluster given anew;
produces a :class:`~planner.check_report.CheckReport`. Steps:

1. Compare the model and cluster (given anew, else the plan's embedded IR) with the plan's
   ``inputs.*.sha256``: a given one that differs makes the plan *stale*, an embedded one that
   differs means the plan was edited.
2. Check the plan is well-formed (:mod:`planner.plan_validate`).
3. With ``runtime`` (``check --runtime R``): what the plan uses that runtime R cannot run
   (:mod:`planner.check_runtime`), and R's memory layout and calibrated options for step 4.
4. Recompute memory per pipeline stage with the *current* cost model
   (:func:`planner.cost.model.evaluate` on the plan's config, placement and runtime options).
5. For stages over capacity, try single changes and report what each would save
   (:mod:`planner.remedies`).

Pure: no printing, no exit, no loading of model or cluster specs (the CLI loads them); the CLI
renders the report and maps ``ok`` to the exit code.
"""
from __future__ import annotations

import os

from planner.calibration.verdict import memory_verdict  # noqa: F401 (check's memory gate)
from planner.check_runtime import runtime_options, runtime_problems
from planner.check_report import (REPORT_KIND, CheckReport, InputCheck, Problem,  # noqa: F401
                                  Remedy, StageCheck)
from planner.cost.model import evaluate
from planner.errors import PlannerError, invalid
from planner.hardware import GIB, Cluster
from planner.ir import ModelGraph
from planner.plan import content_hash
from planner.plan_types import Plan
from planner.plan_validate import plan_problems
from planner.remedies import remedies as find_remedies


def check_plan(plan: Plan, *, model: ModelGraph | None = None,
               cluster: Cluster | None = None, model_source: str | None = None,
               cluster_source: str | None = None, allow_stale: bool = False,
               plan_path: str | os.PathLike | None = None,
               memory_confidence: float | None = None,
               calibration: str | None = None, runtime: str | None = None) -> CheckReport:
    """Check a plan; ``model`` / ``cluster`` (loaded anew by the caller) replace the embedded
    ones. ``runtime``: check it against that runtime profile's capabilities and memory layout
    (default: the plan's recorded runtime options, no capability check). ``memory_confidence``:
    the quantile of the predicted peak's error band the memory gate uses (0.5: the prediction
    itself; 0.9: it must fit with 90 % confidence; None: the one the plan was searched with,
    ``solver.memory_confidence``, else 0.5). ``calibration``: a profile file for the
    bands and ``runtime``'s constants; by default the one the plan records
    (:func:`check_calibration`)."""
    if memory_confidence is None:  # the gate the plan was searched under (planner/solve/gate.py)
        memory_confidence = (plan.document.get("solver") or {}).get("memory_confidence", 0.5)
    if isinstance(memory_confidence, bool) or not isinstance(memory_confidence, (int, float)) \
            or not 0 < memory_confidence < 1:
        raise invalid(f"--memory-confidence must be in (0, 1), got {memory_confidence!r}")
    problems: list[Problem] = []
    cal = check_calibration(plan, calibration, problems)
    if cal is not None and runtime is None:  # with --runtime, runtime_setup checks it
        fitted = cal.runtime
        if fitted is not None and fitted != plan.runtime.profile:  # plan / evaluate's rule
            raise invalid(f"calibration profile {cal.constants.source} was fitted for runtime "
                          f"{fitted}, not {plan.runtime.profile} (the plan's runtime)",
                          f"check with --runtime {fitted}, or calibrate "
                          f"{plan.runtime.profile} runs")
    doc = plan.document
    inputs = doc["inputs"]
    embedded_m = model is None
    embedded_c = cluster is None
    model = model if model is not None else plan.model
    cluster = cluster if cluster is not None else plan.cluster
    checks = (
        InputCheck("model", "embedded" if embedded_m else (model_source or "given"), model.name,
                   content_hash(model), inputs["model"]["sha256"]),
        InputCheck("cluster", "embedded" if embedded_c else (cluster_source or "given"),
                   cluster.name, content_hash(cluster), inputs["cluster"]["sha256"]),
    )
    for item, embedded in zip(checks, (embedded_m, embedded_c)):
        if not item.stale:
            continue
        if embedded:
            problems.append(Problem("integrity", f"the {item.role} embedded in the plan does not "
                                                 f"match inputs.{item.role}.sha256: the plan was "
                                                 f"edited after it was written"))
        elif not allow_stale:
            problems.append(Problem("stale", f"the {item.role} {item.source} ({item.name}) is not "
                                             f"the one the plan was made for (content hash "
                                             f"differs): re-plan, or pass --allow-stale to check "
                                             f"the old plan against it"))
    problems += plan_problems(plan, model, cluster)
    options = plan.runtime
    if runtime is not None:
        prof, options = runtime_options(plan, runtime, cal)
        problems += runtime_problems(plan, prof)
    if plan.document.get("fallbacks"):  # planner/hetero/fallbacks.py
        from planner.hetero.fallbacks import fallback_problems

        problems += [Problem("fallback", f"the fallback for a {kind} failure no longer holds: "
                                         f"{message}")
                     for kind, message in fallback_problems(plan, cluster, memory_confidence,
                                                            cal)]
    if plan.across_pools:  # each stage against its pool's GPU (planner/hetero/check.py)
        return _check_across_pools(plan, model, cluster, checks, problems, allow_stale,
                                   plan_path, memory_confidence, options)
    capacity = cluster.memory_bytes_per_gpu
    stages: tuple[StageCheck, ...] = ()
    remedies: tuple[Remedy, ...] = ()
    if not any(p.code in ("placement", "layers", "stages") for p in problems):
        config, placement = plan.config, plan.placement
        try:
            ev = evaluate(model, cluster, config, placement, options)
        except PlannerError as error:
            if not any(p.code in ("degrees", "micro_batches") for p in problems):
                problems.append(Problem("config", error.message))
        except (ArithmeticError, ValueError, KeyError) as error:
            if not any(p.code == "integrity" for p in problems):
                raise  # a plan as written by shardplan: a bug, let the CLI report it
            # a hand-edited IR can hold shapes no importer would make
            problems.append(Problem("config", f"the cost model cannot evaluate the edited "
                                              f"plan: {type(error).__name__}: {error}"))
        else:
            recorded = {s["index"]: s["memory_gib"]["total"] for s in doc["stages"]}
            stages = tuple(StageCheck(s.index, s.memory, capacity, recorded.get(s.index))
                           for s in ev.stages)
            over = [s for s in stages if not s.fits]
            for s in over:
                problems.append(Problem("memory", f"stage {s.index} needs "
                                                  f"{s.needed.total / GIB:.2f} GiB per GPU, "
                                                  f"{s.over_gib:.2f} GiB more than the "
                                                  f"{capacity / GIB:g} GiB of each "
                                                  f"{cluster.gpu.name}"))
            if over:
                remedies = tuple(find_remedies(model, cluster, config, placement, options, ev))
            verdict = memory_verdict(ev, memory_confidence, cal)
            if verdict is not None:
                text, interval, gate = verdict
                if gate > capacity / GIB and not over:
                    problems.append(Problem("memory", f"at the {memory_confidence:.0%} quantile "
                                                      f"of its error band the peak is "
                                                      f"{gate:.2f} GiB per GPU, "
                                                      f"{gate - capacity / GIB:.2f} GiB over "
                                                      f"capacity ({text})"))
                return CheckReport(None if plan_path is None else os.fspath(plan_path), checks,
                                   allow_stale, tuple(problems), stages, remedies,
                                   capacity / GIB, dict(doc["parallelism"]), text, interval,
                                   memory_confidence, gate, runtime=options.profile)
    return CheckReport(None if plan_path is None else os.fspath(plan_path), checks, allow_stale,
                       tuple(problems), stages, remedies, capacity / GIB,
                       dict(doc["parallelism"]), memory_confidence=memory_confidence,
                       runtime=options.profile)


def _check_across_pools(plan: Plan, model, cluster, checks, problems: list[Problem],
                        allow_stale: bool, plan_path, memory_confidence: float,
                        options) -> CheckReport:
    """No error band across pools (every calibration run used one GPU type): the prediction."""
    from planner.hetero.check import pool_stage_checks

    stages: tuple[StageCheck, ...] = ()
    if not any(p.code in ("placement", "layers", "stages", "degrees") for p in problems):
        try:
            _, stages, over = pool_stage_checks(plan, model, cluster, options)
            problems += over
        except PlannerError as error:
            problems.append(Problem("config", error.message))
    capacity = min(p.gpu.memory_gib for p in cluster.pools) if hasattr(cluster, "pools") \
        else cluster.gpu.memory_gib
    return CheckReport(None if plan_path is None else os.fspath(plan_path), checks, allow_stale,
                       tuple(problems), stages, (), capacity, dict(plan.document["parallelism"]),
                       memory_confidence=memory_confidence, runtime=options.profile)


def check_calibration(plan: Plan, calibration: str | None, problems: list[Problem]):
    """The calibration profile ``check`` uses: the one given (``--calibration``), which must
    be the one the plan records if it records one; else the one the plan records
    (``inputs.calibration``, written by ``plan --calibration``); else the shipped constants.
    A recorded profile whose content no longer matches its hash is an integrity problem."""
    from planner.calibration.store import load, profile_hash, shipped

    record = plan.document["inputs"].get("calibration")
    recorded = plan.recorded_calibration()
    if recorded is not None and profile_hash(recorded) != record["sha256"]:
        problems.append(Problem("integrity", "the calibration embedded in the plan does not "
                                             "match inputs.calibration.sha256: the plan was "
                                             "edited after it was written"))
    if calibration is None:
        return recorded if recorded is not None else shipped()
    given = load(calibration)
    if record is not None and profile_hash(given) != record["sha256"]:
        raise invalid(f"calibration profile {calibration} ({profile_hash(given)[:19]}...) is not "
                      f"the one the plan was made with ({record['spec']}, "
                      f"{record['sha256'][:19]}...)",
                      "drop --calibration: check uses the profile recorded in the plan; or "
                      f"re-plan with --calibration {calibration}")
    return given
