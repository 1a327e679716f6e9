"""MoE with tensor parallelism and expert parallelism under FSDP2 on CPU processes (gloo), plans
made by ``shardplan plan -m tiny-moe`` with pinned degrees. Checked as the tp-1 MoE runs
(tests/test_verify_moe.py): losses against the single-process run, every rank's states and the
routed experts' states against the cost model, the bytes of the token exchange (EP all-to-all
and, at etp > 1, the ETP gather / scatter) against the cost model's dispatch term exactly, and
the first step's expert gradients (sum of squares over ranks) against the reference's.
"""
from __future__ import annotations

import json

import pytest

from cli.main import main

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install "
                                            "'shardplan[torch]'): plans cannot be executed")

from planner.runtime.torch_exec import verify_plan  # noqa: E402

STEPS = 3
HIDDEN, TOP_K, FP32, SEQ = 256, 2, 4, 64  # models/presets/tiny-moe.yaml; fp32 runtime
MOE_BLOCKS = 3  # tiny-moe: block.0 dense, block.1-3 MoE


def make_plan(tmp_path, name: str, *pins: str) -> dict:
    path = tmp_path / f"{name}.json"
    args = ["plan", "--model", "tiny-moe", "--cluster", "tiny", "--nodes", "1",
            "--global-batch", "8", "--seq-len", str(SEQ)]
    if not any(pin.startswith("pp=") for pin in pins):
        args += ["--pin", "pp=1"]
    for pin in pins:
        args += ["--pin", pin]
    with pytest.raises(SystemExit) as done:
        main([*args, "--runtime", "torch-fp32", "-o", str(path), "--force", "--json"])
    assert done.value.code == 0
    return {"path": str(path), "doc": json.loads(path.read_text())}


def dispatch_bytes(tp: int, micro_batch: int) -> int:
    """Bytes of one dispatch buffer on one GPU: its sequence shard's token copies, fp32."""
    return micro_batch * SEQ // tp * TOP_K * HIDDEN * FP32


def assert_verified(report, copies: int) -> None:
    assert report.error is None, f"{report.error}\n{report.error_traceback}"
    assert report.losses_ok, report.to_dict()["loss"]
    assert report.distributed_losses[-1] < report.distributed_losses[0]
    assert report.states_ok, [(r.rank, s) for r in report.ranks for s in r.states if not s.ok]
    for row in report.a2a:
        assert row["ok"] and row["moved_bytes_per_step"] == \
            [row["predicted_bytes_per_step"]] * STEPS, row
    assert report.expert_states_ok, report.expert_states
    grads = report.expert_grads
    assert grads["ok"] and grads["copies"] == copies, grads
    assert grads["rel_diff"] < 1e-5
    assert report.ok


def test_moe_with_tp2_and_ep_over_the_tp_ranks(tmp_path):
    """tp 2 x dp 2, sp on, ep 2, etp 1: the EP group is the TP group (expert rank order
    tp-ep-dp), each TP rank routes its 32 of the 64 positions; ZeRO-1 (experts over edp 2)."""
    plan = make_plan(tmp_path, "tp2-ep2", "tp=2", "ep=2", "etp=1", "sp=on", "zero=1")
    par = plan["doc"]["parallelism"]
    assert (par["tp"], par["dp"], par["ep"], par["etp"], par["edp"], par["sp"]) == \
        (2, 2, 2, 1, 2, True)
    report = verify_plan(plan["path"], steps=STEPS)
    assert_verified(report, copies=2)
    # 3 blocks x (dispatch + combine) x (forward + backward) x 1/2 of 4 x 32 x 2 copies
    mb = par["micro_batch"]
    assert report.a2a[0]["predicted_bytes_per_step"] == \
        MOE_BLOCKS * 2 * 2 * dispatch_bytes(2, mb) // 2 == 1_572_864
    assert "etp_predicted_bytes_per_step" not in report.a2a[0]
    assert "each TP rank routes its seq / 2 positions" in report.implementation["ep"]
    # 4 of 8 whole experts per rank: 3 blocks x 4 x 3 x 256 x 256 fp32 weights
    assert report.expert_states[0]["params"]["held_bytes"] == MOE_BLOCKS * 4 * 3 * 256 * 256 * 4


def test_moe_with_expert_tensor_parallelism(tmp_path):
    """tp 2 x dp 2, etp 2 x ep 2 (EP across dp, ETP = the TP group): every expert's width is
    split over the TP pair, the received copies all-gathered over it and the partial outputs
    reduce-scattered; those bytes are the cost model's ETP term exactly."""
    plan = make_plan(tmp_path, "tp2-etp2", "tp=2", "ep=2", "etp=2", "sp=on", "zero=1")
    par = plan["doc"]["parallelism"]
    assert (par["tp"], par["dp"], par["ep"], par["etp"], par["edp"]) == (2, 2, 2, 2, 1)
    report = verify_plan(plan["path"], steps=STEPS)
    assert_verified(report, copies=1)
    one = dispatch_bytes(2, par["micro_batch"])
    # all-gather and reduce-scatter of etp x one buffer: each rank receives (etp - 1)/etp of it
    etp_part = MOE_BLOCKS * 2 * (one + one)
    a2a_part = MOE_BLOCKS * 2 * 2 * one // 2
    for row in report.a2a:
        assert row["etp_predicted_bytes_per_step"] == etp_part == 3_145_728
        assert row["predicted_bytes_per_step"] == etp_part + a2a_part == 4_718_592
        assert [f + b for f, b in zip(row["etp_forward_bytes_per_step"],
                                      row["etp_backward_bytes_per_step"])] == [etp_part] * STEPS
    # 4 experts per rank, half of each one's width
    assert report.expert_states[0]["params"]["held_bytes"] == MOE_BLOCKS * 4 * 3 * 256 * 128 * 4


def test_moe_with_tp2_without_sequence_parallelism(tmp_path):
    """sp off, ep 4 over all tp x dp ranks, ZeRO-0: the replicated MoE input is split on the
    sequence (the cost model's tokens / tp per GPU) and the output all-gathered."""
    plan = make_plan(tmp_path, "tp2-nosp-ep4", "tp=2", "ep=4", "etp=1", "sp=off", "zero=0")
    par = plan["doc"]["parallelism"]
    assert (par["tp"], par["ep"], par["edp"], par["sp"], par["zero_stage"]) == \
        (2, 4, 1, False, 0)
    report = verify_plan(plan["path"], steps=STEPS)
    assert_verified(report, copies=1)
    assert report.a2a[0]["predicted_bytes_per_step"] == \
        MOE_BLOCKS * 2 * 2 * dispatch_bytes(2, par["micro_batch"]) * 3 // 4 == 2_359_296


def test_moe_with_tp_inside_pipeline_stages(tmp_path):
    """pp 2 x tp 2 (dp 1), ep 2 = the TP pair: the first stage holds the dense block and one
    MoE block, the second two MoE blocks; the pipeline carries each TP rank's sequence shard."""
    plan = make_plan(tmp_path, "pp2-tp2-ep2", "pp=2", "tp=2", "ep=2", "etp=1", "zero=1")
    doc = plan["doc"]
    par = doc["parallelism"]
    assert (par["pp"], par["tp"], par["dp"], par["ep"], par["sp"]) == (2, 2, 1, 2, True)
    report = verify_plan(plan["path"], steps=STEPS)
    assert_verified(report, copies=1)
    stages = [layer["stage"] for layer in doc["layers"]]
    moe_per_stage = [sum(1 for i in (2, 3, 4) if stages[i] == s) for s in range(2)]
    one = dispatch_bytes(2, par["micro_batch"]) * par["num_micro_batches"]
    assert [row["predicted_bytes_per_step"] for row in report.a2a] == \
        [moe_per_stage[r // 2] * 2 * 2 * one // 2 for r in range(4)]


def test_expert_parallelism_under_fsdp2(tmp_path):
    """dp 4, ep 2, ZeRO-3: dense parts fully_shard over dp, each expert over edp 2; every rank
    holds 1/4 of the dense and 1/2 of its 4 experts' states, as the cost model says."""
    plan = make_plan(tmp_path, "ep2-zero3", "tp=1", "ep=2", "zero=3")
    par = plan["doc"]["parallelism"]
    assert (par["dp"], par["ep"], par["edp"], par["zero_stage"]) == (4, 2, 2, 3)
    report = verify_plan(plan["path"], steps=STEPS)
    assert_verified(report, copies=1)
    for rank in report.ranks:
        assert {s.verdict for s in rank.states} == {"exact"}
    expert = MOE_BLOCKS * 4 * 3 * 256 * 256 * 4 // 2
    for row in report.expert_states:
        assert (row["params"]["held_bytes"], row["grads"]["held_bytes"],
                row["optimizer"]["held_bytes"]) == (expert, expert, 2 * expert)
    assert "fully_shard of each routed expert over the edp mesh" in report.implementation["ep"]


def test_moe_with_tp2_under_zero2(tmp_path):
    """tp 2 x dp 2, sp, ep 2 over the TP pair, ZeRO-2: expert gradients reduced to their owner
    over edp (the dp pair at stride 2), dense ones over dp."""
    plan = make_plan(tmp_path, "tp2-ep2-zero2", "tp=2", "ep=2", "etp=1", "sp=on", "zero=2")
    par = plan["doc"]["parallelism"]
    assert (par["tp"], par["ep"], par["edp"], par["zero_stage"]) == (2, 2, 2, 2)
    report = verify_plan(plan["path"], steps=STEPS)
    assert_verified(report, copies=1)
    assert "ZeRO-2: as ZeRO-1" in report.implementation["ep"]


def test_fsdp2_of_a_moe_plan_with_tp_exits_2(tmp_path, capsys):
    message = "FSDP2 (ZeRO-3) of a MoE plan with tensor parallelism"
    plan = make_plan(tmp_path, "refused", "tp=2", "ep=2", "etp=1", "zero=3")
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        main(["verify", plan["path"], "--json"])
    assert done.value.code == 2
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["kind"] == "unsupported" and message in error["message"]
