"""The typed plan and the mesh: exact round trip of plan documents, one rank layout."""
from __future__ import annotations

import itertools

import pytest

from planner.errors import PlannerError
from planner.mesh import DIMS, Mesh
from planner.plan_types import Plan
from planner.strategy import Layout, Recompute
from conftest import MIXTRAL, build_plan, edited

DOCS = {
    "tiny": dict(),
    "pp-mixed": dict(pp=2, stage_blocks=[1, 3], block_recompute=["full", "none", "selective", "none"]),
    "interleaved": dict(model="gpt3-1.3b", cluster="dgx-a100-80g", nodes=1, global_batch=64,
                        tp=2, pp=2, virtual_stages=3, recompute="selective"),
    "moe": dict(model=MIXTRAL, cluster="dgx-h100", nodes=2, global_batch=64, tp=2, pp=2, ep=4,
                cp=2, seq_len=4096, recompute="full", zero=3),
}


@pytest.mark.parametrize("name", DOCS)
def test_round_trip_is_exact(name):
    doc = build_plan(**DOCS[name])
    plan = Plan.from_dict(doc)
    assert plan.to_dict() == doc
    assert Plan.from_dict(plan.to_dict()).to_dict() == doc
    # the decisions are typed
    assert plan.mesh.num_gpus == plan.cluster.num_gpus
    assert len(plan.placement.options) == len(plan.model.layers)
    assert [o.recompute.value for o in plan.placement.options] == \
        [x["recompute"] for x in plan.layers]


def test_evaluate_reproduces_the_recorded_prediction():
    doc = build_plan(**DOCS["pp-mixed"])
    ev = Plan.from_dict(doc).evaluate()
    assert ev.step_time_s == pytest.approx(doc["predicted"]["step_time_s"], rel=1e-5)


def test_changed_decisions_are_serialised():
    plan = Plan.from_dict(build_plan(**DOCS["tiny"]))
    changed = plan.with_changes(zero_stage=3, runtime_overlap_grad_reduce=False)
    doc = changed.to_dict()
    assert doc["parallelism"]["zero_stage"] == 3 and doc["runtime"]["overlap_grad_reduce"] is False
    assert plan.to_dict()["parallelism"]["zero_stage"] == 1  # the original is unchanged


def test_plans_written_before_layouts_read_as_mesh():
    doc = edited(build_plan(), lambda d: [x.pop("layout") for x in d["layers"]])
    plan = Plan.from_dict(doc)
    assert {o.layout for o in plan.placement.options} == {Layout.MESH}
    assert plan.to_dict() == doc  # still exact: no key appears that was not there


@pytest.mark.parametrize("edit", [
    lambda d: d["layers"][1].update(layout="diagonal"),
    lambda d: d["layers"][1].update(recompute="half"),
    lambda d: d["parallelism"].pop("tp"),
    lambda d: d["runtime"].update(runtime="nonesuch"),
])
def test_bad_documents_are_invalid_input(edit):
    with pytest.raises(PlannerError) as error:
        Plan.from_dict(edited(build_plan(), edit))
    assert error.value.kind.name == "INVALID_INPUT"


def test_schema_lists_every_layout():
    import json
    from pathlib import Path

    import planner

    schema = json.loads((Path(planner.__file__).parent / "plan_schema.json").read_text())
    assert schema["$defs"]["layer"]["properties"]["layout"]["enum"] == [x.value for x in Layout]
    assert schema["$defs"]["layer"]["properties"]["recompute"]["enum"] == [x.value for x in Recompute]


# -- mesh --------------------------------------------------------------------------------------

MESHES = [Mesh(pp=2, dp=2, cp=2, tp=2, ep=2), Mesh(pp=3, dp=4, cp=1, tp=2, ep=4),
          Mesh(pp=1, dp=8, cp=1, tp=1, ep=2)]


@pytest.mark.parametrize("mesh", MESHES)
def test_rank_order_is_megatron_tp_innermost(mesh):
    # rank = ((pp * dp + dp_rank) * cp + cp_rank) * tp + tp_rank  (Megatron-LM order)
    for pp, dp, cp, tp in itertools.product(*(range(d) for d in mesh.shape)):
        rank = ((pp * mesh.dp + dp) * mesh.cp + cp) * mesh.tp + tp
        assert mesh.rank(pp=pp, dp=dp, cp=cp, tp=tp) == rank
        assert mesh.coords(rank) == {"pp": pp, "dp": dp, "cp": cp, "tp": tp}
    assert sorted(mesh.rank(**dict(zip(DIMS, c))) for c in itertools.product(
        *(range(d) for d in mesh.shape))) == list(range(mesh.num_gpus))


@pytest.mark.parametrize("mesh", MESHES)
def test_groups_have_the_documented_strides(mesh):
    for dim in DIMS:
        for rank in range(mesh.num_gpus):
            group = mesh.group(dim, rank)
            assert rank in group and len(group) == getattr(mesh, dim)
            assert all(b - a == mesh.stride(dim) for a, b in zip(group, group[1:]))
    for rank in range(mesh.num_gpus):  # EP: ep members of the dp x cp ranks, stride tp
        group = mesh.group("ep", rank)
        assert rank in group and len(group) == mesh.ep
        assert all(mesh.coords(r)["pp"] == mesh.coords(rank)["pp"] for r in group)
    assert mesh.expert_shard_degree == max(mesh.dp * mesh.cp // mesh.ep, 1)
