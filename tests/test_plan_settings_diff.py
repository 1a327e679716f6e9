"""Every setting of a plan's ``parallelism`` is told where plans are compared: ``diff``'s
degrees, the runners-up of ``plan`` / ``show`` and the report's runners-up. Before, they
compared a fixed list of degrees that left out hybrid sharding (``dp_shard``), ZeRO++ hpZ, the
expert mesh's etp, an explicit pipeline layout and the stages' pools: ``diff`` of two plans that
differ only in ``dp_shard`` (5.6 GiB apart on llama-3.1-8b, 16 H100) said ``"degrees": {}``,
``plan``'s runners-up table printed two rows alike in every column (tp 2 dp 8 micro-batch 1,
one of them ``dp_shard`` 4), and the report called an alternative that differed in ``ep`` or
``dp_shard`` "same degrees, other placement".
"""
from __future__ import annotations

import copy
import json

import pytest

from conftest import build_plan, run_cli


def _write(doc, path):
    path.write_text(json.dumps(doc, indent=2, sort_keys=True))
    return path


def test_diff_tells_hybrid_sharding_and_hpz(tmp_path, capsys):
    a = build_plan(tp=1, pp=1, global_batch=16, zero=3)
    b = copy.deepcopy(a)
    b["parallelism"]["dp_shard"] = 4
    b["parallelism"]["hpz"] = 2
    code, out, _ = run_cli(["diff", _write(a, tmp_path / "a.json"),
                            _write(b, tmp_path / "b.json"), "--json"], capsys)
    assert code == 0
    degrees = json.loads(out)["degrees"]
    assert degrees["dp_shard"] == {"a": None, "b": 4}
    assert degrees["hpz"] == {"a": None, "b": 2}
    code, _, err = run_cli(["diff", tmp_path / "a.json", tmp_path / "b.json"], capsys)
    assert code == 0 and "dp_shard" in err and "None" not in err  # absent is printed '-'


def test_diff_of_dense_plans_leaves_out_the_expert_mesh(tmp_path, capsys):
    a = build_plan(tp=2, pp=1, global_batch=16)
    b = build_plan(tp=1, pp=1, global_batch=16)
    code, out, _ = run_cli(["diff", _write(a, tmp_path / "a.json"),
                            _write(b, tmp_path / "b.json"), "--json"], capsys)
    degrees = json.loads(out)["degrees"]
    assert code == 0 and "tp" in degrees
    assert "etp" not in degrees and "edp" not in degrees  # dense: they only follow tp and dp


def _plan_with_alike_runners_up(tmp_path) -> str:
    doc = build_plan(tp=1, pp=1, global_batch=16)
    alt = {"parallelism": copy.deepcopy(doc["parallelism"]), "peak_memory_gib": 1.0,
           "slower_than_best": 0.01, "stage_layers": [6],
           "step_time_s": doc["predicted"]["step_time_s"] * 1.01}
    sharded = copy.deepcopy(alt)
    sharded["parallelism"]["dp_shard"] = 4
    recomputed = copy.deepcopy(alt)
    recomputed["parallelism"]["recompute"] = "full"
    doc["alternatives"] = [sharded, recomputed]
    return _write(doc, tmp_path / "plan.json")


def test_runners_up_alike_in_every_column_are_told_apart(tmp_path, capsys):
    path = _plan_with_alike_runners_up(tmp_path)
    code, _, err = run_cli(["show", path], capsys)
    assert code == 0
    table = err[err.index("Runners-up"):]
    assert "other changes" in table
    assert "dp_shard -→4" in table and "recompute none→full" in table


def test_report_runners_up_alike_in_every_column_are_told_apart(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="report needs the 'report' extra")
    path = _plan_with_alike_runners_up(tmp_path)
    code, _, _ = run_cli(["report", path, "-o", tmp_path / "plan.html"], capsys)
    page = (tmp_path / "plan.html").read_text()
    runners = page[page.index("<h2>Runners-up</h2>"):page.index("<h2>Solver record</h2>")]
    assert code == 0
    assert "dp_shard -→4" in runners and "recompute none→full" in runners
    assert "same degrees" not in runners


def test_runners_up_table_has_no_empty_column_when_nothing_else_differs(tmp_path, capsys):
    doc = build_plan(tp=1, pp=1, global_batch=16)
    alt = {"parallelism": dict(doc["parallelism"], micro_batch=2), "peak_memory_gib": 1.0,
           "slower_than_best": 0.01, "stage_layers": [6],
           "step_time_s": doc["predicted"]["step_time_s"] * 1.01}
    alt["parallelism"]["num_micro_batches"] //= 2
    doc["alternatives"] = [alt]
    code, _, err = run_cli(["show", _write(doc, tmp_path / "plan.json")], capsys)
    assert code == 0 and "Runners-up" in err and "other changes" not in err


def test_an_input_of_the_same_name_but_other_content_shows_both_hashes(tmp_path, capsys):
    """A re-plan's cluster keeps its name, cut to the surviving nodes: diff printed 'input
    changed: cluster tiny -> tiny'; the content hashes tell the two apart."""
    a = build_plan(tp=1, pp=1, global_batch=16)
    b = copy.deepcopy(a)
    b["inputs"]["cluster"]["sha256"] = "sha256:" + "ab" * 32
    code, _, err = run_cli(["diff", _write(a, tmp_path / "a.json"),
                            _write(b, tmp_path / "b.json")], capsys)
    assert code == 0
    old = a["inputs"]["cluster"]["sha256"][7:19]
    assert f"cluster tiny ({old}) -> tiny (abababababab)" in err


def test_diff_names_a_changed_calibration_profile(tmp_path, capsys):
    """A plan made with --calibration records the profile (inputs.calibration); diff compared
    only the model and the cluster, so a plan re-made with another profile showed changed
    constants and predictions and no changed input."""
    from planner.calibration.store import profile_record, shipped

    a = build_plan(tp=1, pp=1, global_batch=16)
    b = copy.deepcopy(a)
    record = profile_record(shipped(), "mine.yaml")
    b["inputs"]["calibration"] = record
    paths = [_write(a, tmp_path / "a.json"), _write(b, tmp_path / "b.json")]
    code, out, err = run_cli(["diff", *paths, "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["inputs"]["calibration"] == {
        "a": "shipped", "b": "mine.yaml", "sha256": {"a": None, "b": record["sha256"]}}
    code, _, err = run_cli(["diff", *paths], capsys)
    assert code == 0 and "input changed: calibration shipped -> mine.yaml" in err
    code, out, _ = run_cli(["diff", paths[1], paths[1], "--json"], capsys)
    assert code == 0 and "calibration" not in json.loads(out)["inputs"]
