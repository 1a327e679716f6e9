"""``shardplan check``: exit codes 0 / 1 / 2, stale inputs, well-formedness, remedies."""
from __future__ import annotations

import json

import pytest

from planner.check import check_plan
from planner.plan_types import Plan
from planner.plan_io import validate_plan
from conftest import MIXTRAL, build_plan, edited, run_cli, write


def _cluster_yaml(tmp_path, memory_gib):
    path = tmp_path / "small.yaml"
    path.write_text("shardplan_cluster: 1\nname: dgx-a100-80g\ngpu: a100-sxm4-80gb\n"
                    f"gpu_overrides: {{memory_gib: {memory_gib}}}\ngpus_per_node: 8\n"
                    "num_nodes: 1\ntiers:\n"
                    "  - {name: nvlink, bandwidth_gbytes_per_s: 300, latency_us: 2.0}\n")
    return path


@pytest.fixture(scope="module")
def gpt_plan():
    return build_plan(model="gpt3-1.3b", cluster="dgx-a100-80g", global_batch=64, tp=2, pp=2,
                      micro_batch=2, zero=1)


def test_a_fitting_plan_exits_0(gpt_plan, tmp_path, capsys):
    path = write(gpt_plan, tmp_path / "plan.json")
    code, out, err = run_cli(["check", path], capsys)
    assert code == 0 and out == "" and "ok" in err
    code, out, err = run_cli(["check", path, "--json"], capsys)
    report = json.loads(out)
    assert code == 0 and report["ok"] and report["fits"] and not report["stale"]
    assert report["problems"] == [] and report["remedies"] == []
    assert [s["index"] for s in report["stages"]] == [0, 1]
    for stage, recorded in zip(report["stages"], gpt_plan["stages"]):
        # check agrees with the plan's own figures (same cost model, rounding only)
        assert stage["needed_gib"]["total"] == pytest.approx(recorded["memory_gib"]["total"],
                                                             rel=1e-5)
        assert stage["capacity_gib"] == 80.0 and stage["fits"]
        assert set(stage["needed_gib"]) == {"params", "grads", "optimizer", "activations",
                                            "other", "total"}


def test_same_inputs_given_again_are_not_stale(gpt_plan, tmp_path, capsys):
    path = write(gpt_plan, tmp_path / "plan.json")
    code, out, _ = run_cli(["check", path, "--model", "gpt3-1.3b", "--cluster", "dgx-a100-80g",
                            "--json"], capsys)
    report = json.loads(out)
    assert code == 0 and not report["stale"]
    assert report["inputs"]["model"]["source"] == "gpt3-1.3b"


def test_shrunk_memory_exits_1_with_remedies(gpt_plan, tmp_path, capsys):
    path = write(gpt_plan, tmp_path / "plan.json")
    peak = gpt_plan["predicted"]["peak_memory_gib"]
    small = _cluster_yaml(tmp_path, round(peak * 0.8, 1))
    # another cluster than the plan's: stale, and over capacity
    code, out, err = run_cli(["check", path, "--cluster", small, "--json"], capsys)
    report = json.loads(out)
    assert code == 1 and report["stale"] and not report["ok"] and report["fits"] is False
    assert {p["code"] for p in report["problems"]} == {"stale", "memory"}
    # allowed to be stale: fails on memory alone, says what would fit
    code, out, err = run_cli(["check", path, "--cluster", small, "--allow-stale", "--json"],
                             capsys)
    report = json.loads(out)
    assert code == 1 and report["stale"] and {p["code"] for p in report["problems"]} == {"memory"}
    over = [s for s in report["stages"] if not s["fits"]]
    assert over and all(s["needed_gib"]["total"] > s["capacity_gib"] for s in over)
    keys = {r["key"]: r for r in report["remedies"]}
    assert f"recompute=full@stage:{over[0]['index']}" in keys and "zero=3" in keys
    for remedy in report["remedies"]:
        assert all(x["gib"] >= 0 for x in remedy["saves_gib"])
    assert any(r["fits"] for r in report["remedies"])
    full = keys[f"recompute=full@stage:{over[0]['index']}"]
    assert full["saves_gib"][0]["gib"] > 1
    # people get the table and the remedies on stderr
    code, out, err = run_cli(["check", path, "--cluster", small, "--allow-stale"], capsys)
    assert code == 1 and out == ""
    assert "Stages over capacity" in err and "would save" not in err and "saves" in err
    assert "ZeRO-3" in err and "check failed" in err


def test_a_plan_that_cannot_fit_is_exit_1_even_with_embedded_inputs(tmp_path, capsys):
    # 6.7B parameters x 18 bytes of unsharded states are more than 80 GiB
    doc = build_plan(model="gpt3-6.7b", cluster="dgx-a100-80g", global_batch=8, zero=0)
    assert not doc["predicted"]["fits"]
    code, out, _ = run_cli(["check", write(doc, tmp_path / "p.json"), "--json"], capsys)
    report = json.loads(out)
    assert code == 1 and not report["stale"] and report["fits"] is False


def test_changed_model_is_stale(tmp_path, capsys):
    path = write(build_plan(), tmp_path / "plan.json")
    model = tmp_path / "tiny2.yaml"
    model.write_text("shardplan_model: 1\nname: tiny\nnum_layers: 4\nhidden_size: 256\n"
                     "num_heads: 8\nnum_kv_heads: 4\nffn_hidden_size: 768\ngated_mlp: true\n"
                     "vocab_size: 1024\nseq_len: 128\nmax_seq_len: 128\n"
                     "position_embedding: rope\nnorm: rmsnorm\nbias: false\n"
                     "tied_embeddings: false\n")
    code, out, _ = run_cli(["check", path, "--model", model, "--json"], capsys)
    report = json.loads(out)
    assert code == 1 and report["stale"] and report["inputs"]["model"]["stale"]
    assert not report["inputs"]["cluster"]["stale"]
    assert report["problems"][0]["code"] == "stale"
    code, out, _ = run_cli(["check", path, "--model", model, "--allow-stale", "--json"], capsys)
    assert code == 0 and json.loads(out)["ok"]


def test_other_node_count_is_stale_and_breaks_the_degrees(tmp_path, capsys):
    path = write(build_plan(), tmp_path / "plan.json")  # tiny: 2 nodes x 4
    code, out, _ = run_cli(["check", path, "--nodes", "1", "--allow-stale", "--json"], capsys)
    report = json.loads(out)
    assert code == 1 and report["inputs"]["cluster"]["stale"]
    assert "degrees" in {p["code"] for p in report["problems"]}


@pytest.mark.parametrize("edit, code", [
    (lambda d: d["parallelism"].update(dp=2, num_micro_batches=8), "degrees"),
    (lambda d: d["parallelism"].update(num_micro_batches=3), "micro_batches"),
    (lambda d: d["parallelism"].update(micro_batch=3), "micro_batches"),
    (lambda d: d["layers"][2].update(index=1), "placement"),
    (lambda d: d["layers"][5].update(stage=7), "placement"),
    (lambda d: d["layers"][0].update(recompute="full"), "placement"),
    (lambda d: d["layers"].pop(), "layers"),
    (lambda d: (d["layers"][2].update(stage=1), d["layers"][3].update(stage=0)), "stages"),
    (lambda d: [x.update(stage=0) for x in d["layers"]], "stages"),
    (lambda d: d["layers"][3].update(name="block.x"), "layers"),
    (lambda d: d["model"].update(num_layers=5), "layers"),
    (lambda d: d["inputs"].update(global_batch=32), "inputs"),
    (lambda d: d["inputs"]["model"]["ir"]["layers"][1].update(params=1), "integrity"),
    (lambda d: d["parallelism"].update(schedule="interleaved-1f1b"), "config"),
    (lambda d: d["parallelism"].update(sp=True), "config"),
])
def test_malformed_plans_fail_with_a_named_problem(edit, code, tmp_path, capsys):
    doc = edited(build_plan(pp=2), edit)
    validate_plan(doc)  # still matches the schema: these are semantic problems
    path = write(doc, tmp_path / "plan.json")
    exit_code, out, _ = run_cli(["check", path, "--json"], capsys)
    report = json.loads(out)
    assert exit_code == 1 and not report["ok"]
    assert code in {p["code"] for p in report["problems"]}, report["problems"]


def test_layer_count_must_match_the_model(tmp_path, capsys):
    path = write(build_plan(), tmp_path / "plan.json")
    code, out, _ = run_cli(["check", path, "--model", "gpt3-1.3b", "--allow-stale", "--json"],
                           capsys)
    report = json.loads(out)
    assert code == 1 and report["stages"] == []
    assert any(p["code"] == "layers" and "26" in p["message"] for p in report["problems"])


@pytest.mark.parametrize("content", [
    "{not json", '{"schema_version": 1, "kind": "shardplan-plan"}', "[]",
])
def test_invalid_plan_files_exit_2(content, tmp_path, capsys):
    path = tmp_path / "plan.json"
    path.write_text(content)
    code, out, err = run_cli(["check", path], capsys)
    assert code == 2 and out == "" and "Traceback" not in err and "error" in err
    code, out, _ = run_cli(["check", path, "--json"], capsys)
    assert code == 2 and json.loads(out)["error"]["exit_code"] == 2


def test_wrong_version_missing_file_and_directory_exit_2(tmp_path, capsys):
    doc = edited(build_plan(), lambda d: d.update(schema_version=99))
    code, out, _ = run_cli(["check", write(doc, tmp_path / "v.json"), "--json"], capsys)
    assert code == 2 and "reads schema_version 1" in json.loads(out)["error"]["message"]
    for path in (tmp_path / "missing.json", tmp_path):
        code, out, _ = run_cli(["check", path, "--json"], capsys)
        assert code == 2 and json.loads(out)["error"]["kind"] == "invalid_input"
    code, _, err = run_cli(["check", write(build_plan(), tmp_path / "p.json"), "--model",
                            "no-such-model"], capsys)
    assert code == 2 and "Traceback" not in err


def test_interleaved_and_moe_plans_check_clean():
    for doc in (build_plan(model="gpt3-1.3b", cluster="dgx-a100-80g", global_batch=64, pp=4,
                           virtual_stages=2),
                build_plan(model=MIXTRAL, cluster="dgx-h100", nodes=2, global_batch=32, tp=2,
                           pp=2, ep=4, cp=2, seq_len=4096, recompute="full")):
        report = check_plan(Plan.from_dict(doc))
        assert not [p for p in report.problems if p.code != "memory"], report.problems
        assert report.evaluated and len(report.stages) == doc["parallelism"]["pp"]


def test_report_is_pure_data(gpt_plan):
    report = check_plan(Plan.from_dict(gpt_plan))
    assert report.ok and report.exit_code == 0
    assert json.loads(json.dumps(report.to_dict())) == report.to_dict()
