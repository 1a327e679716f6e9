"""Plans made by `shardplan plan` executed on CPU processes (PyTorch, gloo) by `shardplan verify`:
the loss curve must match a single-process run and every rank's parameter, gradient and Adam
bytes must match the cost model's prediction.

Four plan shapes (issue: prove plans on a real runtime): TP only, DP with ZeRO 1/2/3, a
pipeline with an uneven split, and a 2 x 2 x 2 (tp x pp x dp) plan on 8 processes. Each plan is
produced by the planner on a tiny cluster, never written by hand. Small shapes (3 steps,
sequences of 32-64 tokens) keep the whole file to about two minutes on 2 cores.
"""
from __future__ import annotations

import json

import pytest

from cli.main import main

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install "
                                            "'shardplan[torch]'): plans cannot be executed")

from planner.runtime.torch_exec import VerifyReport, verify_plan  # noqa: E402

FIXTURES = "tests/fixtures"
STEPS = 3  # the 3rd loss is the first to depend on a second update (stale gradients)


def make_plan(tmp_path, name: str, *args: str) -> dict:
    """`shardplan plan ... --runtime torch-fp32 -o FILE`; the plan document."""
    path = tmp_path / f"{name}.json"
    with pytest.raises(SystemExit) as done:
        main(["plan", *args, "--runtime", "torch-fp32", "-o", str(path), "--force", "--json"])
    assert done.value.code == 0
    return {"path": str(path), "doc": json.loads(path.read_text())}


def blocks_per_stage(doc: dict) -> list[int]:
    counts = [0] * doc["parallelism"]["pp"]
    for layer in doc["layers"]:
        if layer["kind"] == "block":
            counts[layer["stage"]] += 1
    return counts


def assert_verified(report: VerifyReport, world: int) -> None:
    assert report.error is None, f"{report.error}\n{report.error_traceback}"
    loss = report.to_dict()["loss"]
    assert report.losses_ok, loss
    assert len(report.distributed_losses) == STEPS
    assert report.distributed_losses[-1] < report.distributed_losses[0]  # it trains
    mismatches = [(r.rank, s) for r in report.ranks for s in r.states if not s.ok]
    assert report.states_ok, mismatches
    assert len(report.ranks) == world == report.world_size
    assert report.ok
    for r in report.ranks:
        assert r.activations_measured > 0


def verdicts(report: VerifyReport) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for r in report.ranks:
        for s in r.states:
            out.setdefault(s.category, set()).add(s.verdict)
    return out


def test_tensor_parallel_only(tmp_path):
    plan = make_plan(tmp_path, "tp", "--model", "tiny", "--cluster", "tiny", "--nodes", "1",
                     "--global-batch", "8", "--seq-len", "32", "--pin", "tp=4", "--pin", "pp=1",
                     "--pin", "recompute=selective")
    par = plan["doc"]["parallelism"]
    assert (par["tp"], par["pp"], par["dp"]) == (4, 1, 1)
    report = verify_plan(plan["path"], steps=STEPS)
    assert_verified(report, 4)
    assert verdicts(report) == {c: {"exact"} for c in ("params", "grads", "optimizer")}
    assert "recompute" in report.implementation and "SequenceParallel" in report.implementation["tp"]


@pytest.mark.parametrize("zero", [1, 3])
def test_data_parallel_with_zero(tmp_path, zero):
    plan = make_plan(tmp_path, f"dp-zero{zero}", "--model", "tiny", "--cluster", "tiny",
                     "--nodes", "1", "--global-batch", "8", "--seq-len", "32",
                     "--pin", "tp=1", "--pin", "pp=1", "--pin", f"zero={zero}")
    par = plan["doc"]["parallelism"]
    assert (par["dp"], par["zero_stage"]) == (4, zero)
    report = verify_plan(plan["path"], steps=STEPS)
    assert_verified(report, 4)
    found = verdicts(report)
    assert found["params"] == found["grads"] == {"exact"}
    if zero == 3:  # FSDP2 shards every tensor evenly here (all dims 0 divisible by 4)
        assert found["optimizer"] == {"exact"}
    else:  # ZeroRedundancyOptimizer: whole parameters per rank; the dp group sums exactly
        assert found["optimizer"] <= {"exact", "group-sum exact"}


def test_zero2_partitions_gradients(tmp_path):
    plan = make_plan(tmp_path, "dp-zero2", "--model", "tiny", "--cluster",
                     f"{FIXTURES}/verify_cluster_2.yaml", "--global-batch", "8", "--seq-len",
                     "32", "--pin", "tp=1", "--pin", "pp=1", "--pin", "zero=2",
                     "--pin", "micro_batch=2")
    par = plan["doc"]["parallelism"]
    assert (par["dp"], par["zero_stage"], par["num_micro_batches"]) == (2, 2, 2)
    report = verify_plan(plan["path"], steps=STEPS)
    assert_verified(report, 2)
    assert verdicts(report)["params"] == {"exact"}
    held = sum(r.states[1].held for r in report.ranks)  # grads, summed over the dp group
    assert held == sum(r.states[1].predicted for r in report.ranks)


def test_pipeline_with_uneven_split_via_cli(tmp_path, capsys):
    plan = make_plan(tmp_path, "pp", "--model", f"{FIXTURES}/verify_wide_vocab.yaml",
                     "--cluster", f"{FIXTURES}/verify_cluster_2.yaml", "--global-batch", "16",
                     "--pin", "pp=2", "--pin", "virtual_stages=1", "--pin", "recompute=full",
                     "--pin", "micro_batch=4")
    doc = plan["doc"]
    assert blocks_per_stage(doc) == [3, 1], "the planner no longer splits this model unevenly"
    assert doc["parallelism"]["num_micro_batches"] == 4
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        main(["verify", plan["path"], "--steps", str(STEPS), "--json"])
    out = capsys.readouterr().out
    result = json.loads(out)
    assert done.value.code == 0, result
    assert result["ok"] and result["loss"]["ok"] and result["states_ok"]
    assert [r["layers"] for r in result["ranks"]] == [
        [["embedding", "block.0", "block.1", "block.2"]], [["block.3", "head"]]]
    assert "Schedule1F1B" in result["implementation"]["pp"]
    for r in result["ranks"]:
        assert {s["verdict"] for s in r["states"].values()} == {"exact"}


def test_three_dimensional_plan_on_8_processes(tmp_path):
    plan = make_plan(tmp_path, "3d", "--model", "tiny", "--cluster", "tiny",
                     "--global-batch", "16", "--seq-len", "32", "--pin", "tp=2", "--pin", "pp=2",
                     "--pin", "dp=2", "--pin", "micro_batch=4")
    par = plan["doc"]["parallelism"]
    assert (par["tp"], par["pp"], par["dp"]) == (2, 2, 2)
    report = verify_plan(plan["path"], steps=STEPS)
    assert_verified(report, 8)
    assert {(r.coords["pp"], r.coords["dp"], r.coords["tp"]) for r in report.ranks} == {
        (p, d, t) for p in range(2) for d in range(2) for t in range(2)}
    assert verdicts(report)["params"] == {"exact"}


def test_plan_the_runtime_cannot_execute_exits_2(tmp_path, capsys):
    plan = make_plan(tmp_path, "cp", "--model", "tiny", "--cluster", "tiny", "--nodes", "1",
                     "--global-batch", "8", "--seq-len", "64", "--pin", "cp=2",
                     "--pin", "tp=1", "--pin", "pp=1")
    assert plan["doc"]["parallelism"]["cp"] == 2
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        main(["verify", plan["path"], "--json"])
    assert done.value.code == 2
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["kind"] == "unsupported" and "context parallelism" in error["message"]


def test_layers_of_one_stage_on_different_tensor_degrees(tmp_path):
    """Per-layer layouts (issue 11 item 6): the planner's per-layer plan on 4 processes runs
    the embedding and the LM head on tensor degree 4 (tp*2) and the blocks on the mesh's 2;
    the activation is redistributed between them (DTensor, all-gather / slice). The losses
    match one process, every rank's held bytes match the cost model's per-layout sharding, and
    the bytes the layout changes moved match the resharding the plan charges, exactly."""
    plan = make_plan(tmp_path, "layouts", "--model", "tiny", "--cluster", "tiny", "--nodes", "1",
                     "--global-batch", "8", "--seq-len", "32", "--pin", "layouts=per-layer",
                     "--pin", "tp=2", "--pin", "pp=1", "--pin", "micro_batch=2", "--pin",
                     "sp=false", "--pin", "zero=0")
    layouts = {layer["name"]: layer.get("layout", "mesh") for layer in plan["doc"]["layers"]}
    assert layouts["embedding"] == layouts["head"] == "tp*2"
    assert {layouts[f"block.{i}"] for i in range(4)} == {"mesh"}
    report = verify_plan(plan["path"], steps=STEPS)
    assert_verified(report, 4)
    assert verdicts(report) == {c: {"exact"} for c in ("params", "grads", "optimizer")}
    assert len(report.reshard) == 4 and report.reshard_ok
    # 2 changes (4 -> 2 slices forward, all-gathers backward; 2 -> 4 all-gathers forward) x 2
    # micro-batches x (k - 1)/k of a merged group's 4 x 32 tokens x 256 hidden, fp32
    expected = 2 * 2 * (1 / 2) * 4 * 32 * 256 * 4
    for row in report.reshard:
        assert row["predicted_bytes_per_step"] == expected
        assert row["moved_bytes_per_step"] == [expected] * STEPS
    assert "redistribute" in report.implementation["layouts"]
    # what it does not execute is refused by name (exit code 2 from the CLI), not run wrongly
    from planner.errors import ErrorKind, PlannerError
    from planner.plan_types import Plan
    from planner.runtime.support import check_supported

    for key, value, words in (("sp", True, "sequence parallelism"), ("zero_stage", 1, "ZeRO-1")):
        doc = json.loads(json.dumps(plan["doc"]))
        doc["parallelism"][key] = value
        with pytest.raises(PlannerError) as refused:
            check_supported(Plan.from_dict(doc))
        assert refused.value.kind is ErrorKind.UNSUPPORTED and words in refused.value.message
