"""``check --runtime R``: can runtime R run the plan as planned, and with R's memory layout?

Consumes a :class:`~planner.plan_types.Plan` and a runtime profile name; produces the
:class:`~planner.check_report.Problem` list of what the plan uses that the runtime cannot run
(its ZeRO / FSDP stage, TP / PP / CP / EP, sequence parallelism where the runtime has none or
always has it, the pipeline schedule, unequal interleaved chunks, recomputation policies
and the per-block mix of them its flags cannot express (:mod:`planner.recompute_rules`, the
rule the search keeps to), per-layer layouts, activation offload (:mod:`planner.offload_rules`),
HSDP's shard group, dropout, a MoE capacity factor) and the
:class:`~planner.config.RuntimeOptions` the memory check then uses: the runtime's state layout, overlap and calibrated constants
(:func:`planner.calibration.session.runtime_setup`), with the plan's attention kernel, dropout
and MoE options kept. Each capability is read from :mod:`planner.profiles`, the same
declarations that narrow the search, so a plan searched for R passes ``check --runtime R``.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import replace

from planner import recompute_rules as rules
from planner.check_report import Problem
from planner.config import RuntimeOptions
from planner.ir import LayerKind
from planner.offload_rules import offloaded_blocks, plan_refusals
from planner.plan_types import Plan
from planner.profiles import RuntimeProfile, profile
from planner.strategy import Layout


def runtime_problems(plan: Plan, prof: RuntimeProfile) -> list[Problem]:
    """What ``plan`` uses that runtime ``prof`` cannot run (empty: it can run all of it)."""
    c, out = plan.config, []

    def bad(message: str) -> None:
        out.append(Problem("runtime", f"{prof.name} cannot run {message}"))

    if not prof.allows_zero(c.zero_stage):
        names = ", ".join(f"{z} ({prof.sharding_names[z]})" for z in prof.zero_stages)
        bad(f"ZeRO-{c.zero_stage}: it shards data-parallel state as ZeRO {names}")
    elif not prof.allows_zero_with(c.zero_stage, c.pp):  # e.g. DeepSpeed's pipeline engine
        bad(f"ZeRO-{c.zero_stage} with pipeline parallelism (pp {c.pp}): with a pipeline it "
            f"runs ZeRO {', '.join(map(str, prof.pipeline_zero_stages or ()))} only")
    for name, degree, flag in (("tensor parallelism", c.tp, prof.tp),
                               ("pipeline parallelism", c.pp, prof.pp),
                               ("context parallelism", c.cp, prof.cp),
                               ("expert parallelism", c.ep, prof.ep)):
        if degree > 1 and not flag:
            bad(f"{name} (degree {degree}): it has none")
    if c.sp and prof.sp == "none":
        bad("sequence parallelism: it has none")
    if c.tp > 1 and not c.sp and prof.sp == "with-tp":
        bad("tensor parallelism without sequence parallelism: its TP always shards the "
            "sequence (the plan's activation memory assumes replicated activations)")
    schedule = c.schedule
    if c.pp > 1 and not prof.allows_schedule(schedule):
        bad(f"the {schedule} pipeline schedule: it offers {', '.join(prof.schedules)}")
    elif c.pp > 1 and not prof.allows_schedule_with(schedule, c.virtual_stages):
        bad(f"the {schedule} pipeline schedule with {c.virtual_stages} model chunk per rank: "
            f"it runs it with at least 2")
    if c.virtual_stages > 1 and not prof.uneven_chunks:
        sizes = _chunk_sizes(plan)
        if len(set(sizes)) > 1:
            bad(f"interleaved chunks of unequal size ({min(sizes)} to {max(sizes)} blocks): "
                "its interleaving needs equal chunks")
    if c.dp_shard:
        ranks = c.tp * c.cp * c.dp_shard
        if not prof.allows_hsdp(c.zero_stage, ranks, plan.cluster.gpus_per_node):
            how = (f"{prof.hsdp_name}, with ZeRO {', '.join(map(str, prof.hsdp_stages))}"
                   + (", one node per shard group" if prof.hsdp_shard == "node" else "")
                   if prof.hsdp else "none")
            bad(f"hybrid sharding of ZeRO-{c.zero_stage} over groups of {c.dp_shard} of the "
                f"{c.dp} data-parallel ranks ({ranks} GPUs): its hybrid sharding is {how}")
    if c.hpz and not prof.allows_hpz(c.zero_stage, c.hpz, plan.cluster.gpus_per_node):
        bad(f"ZeRO++ hpZ (a secondary weight partition over {c.hpz} ranks): "
            + (f"its {prof.hpz_name} needs ZeRO-3" if prof.hpz else "it has none"))
    planner_policies = {p.planner for p in prof.recompute}
    if "every-nth" in planner_policies:
        planner_policies |= {"none", "full"}
    blocks = [o for o, layer in zip(plan.placement.options, plan.model.layers)
              if layer.kind is LayerKind.BLOCK]
    used = Counter(o.recompute for o in blocks)
    known = True
    for policy, count in sorted(used.items(), key=lambda item: item[0].value):
        if policy.value not in planner_policies:
            known = False
            bad(f"{policy.value} recomputation ({count} blocks): its policies are "
                f"{', '.join(p.name for p in prof.recompute)}")
    settings = [o.recompute.value for o in blocks]
    runs, classes = rules.chunk_runs(_block_stages(plan)), _block_classes(plan)
    # the rule the search keeps to; torchtitan 0.2.2's every-N-th-block form also runs
    forms = [prof.recompute_rule] + (["every-nth"] if "every-nth" in
                                     {p.planner for p in prof.recompute} else [])
    if known and all(rules.equivalent(f, runs, classes, settings) is None for f in forms):
        bad(f"this per-block recomputation ({_mix(plan, settings)}): "
            f"{_RULE_TEXT[prof.recompute_rule]}"
            + (" (or full recomputation of every N-th block of each rank, an older "
               "version's form)" if len(forms) > 1 else ""))
    layouts = Counter(o.layout for o in blocks if o.layout is not Layout.MESH)
    if layouts:
        listed = ", ".join(f"{k.value} x{n}" for k, n in
                           sorted(layouts.items(), key=lambda item: item[0].value))
        bad(f"per-layer layouts ({listed}): its blocks all use the mesh's degrees")
    if plan.runtime.fp8_attention and not prof.fp8_attention:
        bad("FP8 attention: it has none (the attention core runs in 16 bits, slower than "
            "planned)")
    for option, why in prof.option_problems(plan.runtime.dropout,
                                            plan.runtime.moe.capacity_factor,
                                            plan.model.is_moe):
        bad(f"{option}: {why}")
    offloaded = offloaded_blocks(plan)
    if offloaded and not prof.activation_offload:
        bad(f"activation offload ({offloaded} blocks): it has none")
    elif offloaded:  # Megatron-Core's, the one profile with it (planner.offload_rules)
        for why in plan_refusals(plan):
            bad(f"this activation offload ({offloaded} blocks): {why}")
    return out


_RULE_TEXT = {
    "uniform": "it applies one recomputation setting to every block",
    "first-n": "it recomputes all blocks selectively, or fully the first N blocks of every "
               "model chunk (--recompute-method block --recompute-num-layers N) and none of "
               "the others, with one N for all chunks",
    "per-block": "",
}


def _block_stages(plan: Plan) -> list[int]:
    return [s for s, layer in zip(plan.placement.stage, plan.model.layers)
            if layer.kind is LayerKind.BLOCK]


def _block_classes(plan: Plan) -> list[int]:
    """The layer class of each block (the cost model's unit, planner.recompute_rules)."""
    out = []
    for ci, cls in enumerate(plan.model.layer_classes()):
        if cls.layer.kind is LayerKind.BLOCK:
            out += [ci] * cls.count
    return out


def _mix(plan: Plan, settings: list[str]) -> str:
    """Per pipeline rank, its blocks' settings other than none: 'rank 0: full 3; rank 1: -'."""
    per = [Counter() for _ in range(plan.config.pp)]
    for stage, value in zip(_block_stages(plan), settings):
        if value != "none":
            per[stage][value] += 1
    return "; ".join(f"rank {i}: " + (", ".join(f"{k} {n}" for k, n in sorted(c.items())) or "-")
                     for i, c in enumerate(per))


def _chunk_sizes(plan: Plan) -> list[int]:
    """Blocks per model chunk (runs of equal stage along the layers)."""
    stages = [s for s, layer in zip(plan.placement.stage, plan.model.layers)
              if layer.kind is LayerKind.BLOCK]
    sizes, previous = [], None
    for s in stages:
        if s != previous:
            sizes.append(0)
            previous = s
        sizes[-1] += 1
    return sizes


def runtime_options(plan: Plan, runtime: str, calibration=None
                    ) -> tuple[RuntimeProfile, RuntimeOptions]:
    """The profile ``runtime`` and the options the cost model uses for it: the runtime's
    state layout, overlap and calibrated constants; the plan's kernel, dropout, MoE options,
    recompute modules and loss (properties of the model and job, not of the runtime), the
    plan's torch.compile and element-wise choice where the runtime can mean them, and the
    plan's FP8 attention where the runtime has it. ``calibration``: a profile (file, or read:
    planner.calibration.session.runtime_setup); None: the shipped one."""
    from planner.calibration.session import carried_compile, runtime_setup

    prof = profile(runtime)
    pools = plan.cluster if plan.across_pools else None
    setup = runtime_setup(plan.cluster if pools is None else pools.pools[0].as_cluster(),
                          runtime, plan.config.dtype, plan.runtime.attention_kernel, calibration,
                          moe=plan.runtime.moe, **carried_compile(plan.runtime, prof))
    options: RuntimeOptions = replace(setup.options, dropout=plan.runtime.dropout,
                                      recompute_modules=plan.runtime.recompute_modules,
                                      cross_entropy=plan.runtime.cross_entropy,
                                      fp8_attention=plan.runtime.fp8_attention
                                      and bool(prof.fp8_attention))
    if pools is not None:  # each pool's generation's efficiencies (planner/hetero/plan_file.py)
        from planner.hetero.plan_file import pool_options

        options = pool_options(options, pools,
                               setup.calibration.constants if setup.calibration else None)
    return prof, options

