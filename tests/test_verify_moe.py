"""Expert parallelism on the CPU runtime (issue 12 item 6): plans the planner makes for the
tiny-moe preset with ``--pin ep=...`` run on CPU processes (gloo), experts sharded over the EP
ranks, tokens dispatched and combined with ``all_to_all_single``. Checked: losses against the
single-process run (same force-balanced routing), every rank's states against the cost model,
the routed experts' states per rank exactly, and the bytes each rank's all-to-alls moved against
the cost model's dispatch + combine volume, exactly. Two runs of 4 processes and one refusal.
"""
from __future__ import annotations

import json

import pytest

from cli.main import main

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install "
                                            "'shardplan[torch]'): plans cannot be executed")

from planner.runtime.torch_exec import verify_plan  # noqa: E402

STEPS = 3
HIDDEN, TOP_K, FP32 = 256, 2, 4  # models/presets/tiny-moe.yaml; the runtime trains in fp32
MOE_BLOCKS = 3  # tiny-moe: block.0 dense, block.1-3 MoE


def make_plan(tmp_path, name: str, *pins: str) -> dict:
    path = tmp_path / f"{name}.json"
    args = ["plan", "--model", "tiny-moe", "--cluster", "tiny", "--nodes", "1",
            "--global-batch", "8", "--seq-len", "64", "--pin", "tp=1"]
    for pin in pins:
        args += ["--pin", pin]
    with pytest.raises(SystemExit) as done:
        main([*args, "--runtime", "torch-fp32", "-o", str(path), "--force", "--json"])
    assert done.value.code == 0
    return {"path": str(path), "doc": json.loads(path.read_text())}


def a2a_bytes_per_step(ep: int, micro_batch: int, seq: int, micro_batches: int,
                       moe_blocks: int, passes: int) -> float:
    """Bytes one rank receives per step: each pass (forward, backward, recomputed forward)
    of a MoE block dispatches and combines its micro_batch x seq x top_k token copies and
    keeps 1/ep of them."""
    copies = micro_batch * seq * TOP_K
    return (moe_blocks * micro_batches * passes * 2 * (ep - 1) / ep * copies * HIDDEN * FP32)


def assert_moe_verified(report, world: int, predicted_a2a: list[float]) -> None:
    assert report.error is None, f"{report.error}\n{report.error_traceback}"
    assert report.losses_ok, report.to_dict()["loss"]
    assert report.distributed_losses[-1] < report.distributed_losses[0]
    assert report.states_ok, [(r.rank, s) for r in report.ranks for s in r.states if not s.ok]
    assert len(report.ranks) == world
    assert [row["predicted_bytes_per_step"] for row in report.a2a] == predicted_a2a
    for row in report.a2a:
        assert row["moved_bytes_per_step"] == [row["predicted_bytes_per_step"]] * STEPS, row
    assert report.expert_states and report.expert_states_ok, report.expert_states
    for row in report.expert_states:
        assert {row[k]["verdict"] for k in ("params", "grads", "optimizer")} == {"exact"}, row
    assert report.ok


def test_expert_parallel_zero1_on_4_processes(tmp_path):
    """dp 4, ep 2 (edp 2), ZeRO-1: dense states over dp, expert states over edp."""
    plan = make_plan(tmp_path, "ep2", "ep=2", "pp=1", "zero=1")
    par = plan["doc"]["parallelism"]
    assert (par["dp"], par["ep"], par["edp"], par["zero_stage"]) == (4, 2, 2, 1)
    report = verify_plan(plan["path"], steps=STEPS)
    mb, m = par["micro_batch"], par["num_micro_batches"]
    assert_moe_verified(report, 4, [a2a_bytes_per_step(2, mb, 64, m, MOE_BLOCKS, 2)] * 4)
    assert report.a2a[0]["predicted_bytes_per_step"] == 1_572_864  # 3 x 2 x 2 x 1/2 x 256 x 256 x 4
    # 4 of 8 experts per rank, 3 blocks, 3 x 256 x 256 weights each, fp32; Adam 8 B over edp 2
    expert = MOE_BLOCKS * 4 * 3 * HIDDEN * 256 * FP32
    row = report.expert_states[0]
    assert (row["params"]["held_bytes"], row["optimizer"]["held_bytes"]) == (expert, expert)
    assert "all_to_all_single" in report.implementation["ep"]


def test_expert_parallel_in_an_interleaved_pipeline_with_full_recompute(tmp_path):
    """pp 2 (interleaved), dp 2 = ep 2, ZeRO-0, full recomputation: the recomputed forward
    dispatches and combines again (3 passes), so forward bytes are twice the backward's."""
    plan = make_plan(tmp_path, "pp-ep2", "ep=2", "pp=2", "virtual_stages=2", "zero=0",
                     "recompute=full", "micro_batch=1")
    par = plan["doc"]["parallelism"]
    assert (par["pp"], par["virtual_stages"], par["dp"], par["ep"]) == (2, 2, 2, 2)
    stages = [layer["stage"] for layer in plan["doc"]["layers"]]
    moe_per_stage = [sum(1 for i in (2, 3, 4) if stages[i] == s) for s in range(2)]
    report = verify_plan(plan["path"], steps=STEPS)
    m = par["num_micro_batches"]
    predicted = [a2a_bytes_per_step(2, 1, 64, m, moe_per_stage[r // 2], 3) for r in range(4)]
    assert_moe_verified(report, 4, predicted)
    for row in report.a2a:
        assert row["forward_bytes_per_step"] == [2 * b for b in row["backward_bytes_per_step"]]


def test_expert_parallelism_with_zero2(tmp_path):
    """dp 4, ep 2 (edp 2), ZeRO-2: dense gradients reduced to their owner over dp, expert
    gradients to theirs over edp; the first expert gradients, summed over their owners, are
    the single process's."""
    plan = make_plan(tmp_path, "ep2-zero2", "ep=2", "pp=1", "zero=2")
    par = plan["doc"]["parallelism"]
    assert (par["dp"], par["ep"], par["edp"], par["zero_stage"]) == (4, 2, 2, 2)
    report = verify_plan(plan["path"], steps=STEPS)
    mb, m = par["micro_batch"], par["num_micro_batches"]
    assert_moe_verified(report, 4, [a2a_bytes_per_step(2, mb, 64, m, MOE_BLOCKS, 2)] * 4)
    assert report.expert_grads["ok"] and report.expert_grads["copies"] == 1
    # 4 experts per rank, gradients over edp 2
    expert = MOE_BLOCKS * 4 * 3 * HIDDEN * 256 * FP32
    row = report.expert_states[0]
    assert (row["params"]["held_bytes"], row["grads"]["held_bytes"]) == (expert, expert // 2)


def test_unbalanceable_sequence_length_is_refused(tmp_path):
    """Exact balance needs E | seq x top_k: 34 x 2 = 68 copies do not cover 8 experts evenly."""
    from planner.errors import PlannerError

    path = tmp_path / "seq34.json"
    with pytest.raises(SystemExit) as done:
        main(["plan", "--model", "tiny-moe", "--cluster", "tiny", "--nodes", "1",
              "--global-batch", "8", "--seq-len", "34", "--pin", "tp=1", "--pin", "pp=1",
              "--pin", "ep=2", "--runtime", "torch-fp32", "-o", str(path), "--force", "--json"])
    assert done.value.code == 0
    with pytest.raises(PlannerError) as error:
        verify_plan(str(path), steps=STEPS)
    assert "seq_len x top_k (34 x 2)" in error.value.message
