"""A plan made with ``--calibration PROFILE`` records the profile (``inputs.calibration``: the
path, a content hash, the constants and the error bands), and ``check`` uses it: in CI on
another machine, without the file, it reproduces the plan's runtime options and memory band;
with ``--calibration`` it takes that file only if it is the recorded one. Before, the plan
recorded nothing and ``check`` gated with the shipped bands (``check --runtime`` recalibrated
with the shipped constants).
"""
from __future__ import annotations

import json
from dataclasses import replace
from types import MappingProxyType

import pytest

from conftest import run_cli

PLAN = ["plan", "-m", "gpt3-1.3b", "-c", "dgx-a100-80g", "--global-batch", "64", "--json"]


def _profile(path):
    """The shipped profile for megatron, with another allocator overhead and memory / step bands
    twice as wide: a profile whose predictions differ from the shipped ones."""
    from planner.calibration.bands import BandTable
    from planner.calibration.store import dump, shipped

    base = shipped()
    values = dict(base.constants.values, **{"allocator_overhead.megatron": 0.35})

    def wide(s):
        return replace(s, sigma=2 * s.sigma)

    bands = BandTable({q: wide(s) for q, s in base.bands.pooled.items()},
                      {q: {k: wide(s) for k, s in v.items()}
                       for q, v in base.bands.labels.items()})
    path.write_text(dump(replace(base, runtime="megatron", description="a user's profile",
                                 constants=replace(base.constants,
                                                   values=MappingProxyType(values)),
                                 bands=bands)))
    return path


@pytest.fixture
def made(tmp_path, capsys):
    profile = _profile(tmp_path / "profile.yaml")
    code, out, _ = run_cli(PLAN + ["--calibration", profile], capsys)
    assert code == 0
    plan = tmp_path / "plan.json"
    plan.write_text(out)
    return plan, profile, json.loads(out)


def test_the_plan_records_the_profile(made):
    from planner.calibration.store import load, profile_hash

    _, profile, doc = made
    record = doc["inputs"]["calibration"]
    given = load(profile)
    assert record["spec"] == str(profile)
    assert record["sha256"] == profile_hash(given)
    assert record["runtime"] == "megatron"
    assert record["constants"]["allocator_overhead.megatron"] == 0.35
    assert record["bands"]["memory"]["pooled"]["sigma"] == given.bands.pooled["memory"].sigma
    assert doc["runtime"]["allocator_overhead"] == 0.35


def test_check_reproduces_the_plan_without_the_profile_file(made, capsys):
    from planner.check import memory_verdict
    from planner.check_runtime import runtime_options
    from planner.calibration.store import load
    from planner.plan_types import Plan

    plan_path, profile, doc = made
    plan = Plan.load(plan_path)
    gate_90 = memory_verdict(plan.evaluate(), 0.9, load(profile))[2]
    profile.unlink()  # CI on another machine: only the plan file
    predicted = doc["predicted"]
    for extra in ([], ["--runtime", "megatron"]):
        code, out, _ = run_cli(["check", plan_path, "--json"] + extra, capsys)
        assert code == 0, out
        report = json.loads(out)
        assert report["peak_gib"] == pytest.approx(predicted["peak_memory_gib"], rel=1e-5)
        assert report["memory_interval_gib"] == pytest.approx(
            predicted["peak_memory_gib_interval"], rel=1e-5)
    code, out, _ = run_cli(["check", plan_path, "--json", "--memory-confidence", "0.9"], capsys)
    assert json.loads(out)["memory_gate_gib"] == pytest.approx(gate_90, rel=1e-12)
    # check --runtime recalibrates with the recorded constants, not the shipped ones
    _, options = runtime_options(plan, "megatron", plan.recorded_calibration())
    assert options == plan.runtime
    # the shipped bands give another interval: the record is what made the difference
    unrecorded = dict(doc, inputs={k: v for k, v in doc["inputs"].items()
                                   if k != "calibration"})
    plan_path.write_text(json.dumps(unrecorded))
    code, out, _ = run_cli(["check", plan_path, "--json"], capsys)
    assert json.loads(out)["memory_interval_gib"] != pytest.approx(
        predicted["peak_memory_gib_interval"], rel=1e-3)


def test_check_takes_only_the_recorded_profile(made, capsys):
    from planner.calibration.constants import DEFAULTS_FILE

    plan_path, profile, _ = made
    code, out, _ = run_cli(["check", plan_path, "--calibration", DEFAULTS_FILE, "--json"],
                           capsys)
    assert code == 2
    error = json.loads(out)["error"]
    assert "is not the one the plan was made with" in error["message"]
    assert str(profile) in error["message"]
    assert error["hints"][0].startswith("drop --calibration")
    # the same profile, written again with another description: same hash, accepted
    text = profile.read_text().replace("a user's profile", "the same constants")
    assert text != profile.read_text()
    profile.write_text(text)
    code, out, _ = run_cli(["check", plan_path, "--calibration", profile, "--json"], capsys)
    assert code == 0, out


def test_an_edited_recorded_profile_is_an_integrity_problem(made, capsys):
    plan_path, _, doc = made
    doc["inputs"]["calibration"]["constants"]["allocator_overhead.megatron"] = 0.30
    plan_path.write_text(json.dumps(doc))
    code, out, _ = run_cli(["check", plan_path, "--json"], capsys)
    assert code == 1
    problems = json.loads(out)["problems"]
    assert [p["code"] for p in problems] == ["integrity"]
    assert "inputs.calibration.sha256" in problems[0]["message"]


def test_a_replan_keeps_the_record(tmp_path, capsys):
    profile = _profile(tmp_path / "profile.yaml")
    code, out, _ = run_cli(PLAN + ["--nodes", "2", "--calibration", profile], capsys)
    assert code == 0
    old = tmp_path / "old.json"
    old.write_text(out)
    code, out, _ = run_cli(["replan", old, "--slow", "3:1.5", "--json"], capsys)
    assert code == 0
    assert json.loads(out)["inputs"]["calibration"] == json.loads(old.read_text())[
        "inputs"]["calibration"]


def test_the_shipped_constants_are_not_recorded_and_check_gives_the_plans_band(tmp_path,
                                                                                 capsys):
    """Without --calibration nothing is recorded (plans keep their bytes). check's memory band
    is the plan's: it is widened as the plan's is where no calibration run used the plan's
    block recomputation (here none; the ampere memory runs all recompute fully); check's was
    narrower (51.9-57.8 GiB against the plan's 49.1-61.1 GiB)."""
    code, out, _ = run_cli(PLAN, capsys)
    assert code == 0
    doc = json.loads(out)
    assert "calibration" not in doc["inputs"]
    assert any("none recomputation" in note for note in doc["predicted"]["extrapolating"])
    plan = tmp_path / "plan.json"
    plan.write_text(out)
    code, out, _ = run_cli(["check", plan, "--json"], capsys)
    assert json.loads(out)["memory_interval_gib"] == pytest.approx(
        doc["predicted"]["peak_memory_gib_interval"], rel=1e-5)


def test_the_hash_is_of_what_the_profile_predicts_with(tmp_path):
    from planner.calibration.store import load, profile_hash, profile_from_record, \
        profile_record

    profile = load(_profile(tmp_path / "p.yaml"))
    assert profile_hash(replace(profile, description="other", fit={"runs": 3})) == \
        profile_hash(profile)
    other = replace(profile, constants=profile.constants.with_values(
        **{"allocator_overhead__megatron": 0.34}))
    assert profile_hash(other) != profile_hash(profile)
    record = json.loads(json.dumps(profile_record(profile, "p.yaml")))  # through the file
    assert profile_hash(profile_from_record(record, "plan")) == record["sha256"]


def test_show_names_the_recorded_profile(made, capsys):
    """show's header names the model and cluster by spec and hash; it now names the recorded
    calibration profile too (before, nothing in show said the plan was not made with the
    shipped constants)."""
    plan, profile, doc = made
    code, _, err = run_cli(["show", plan], capsys)
    assert code == 0
    header = " ".join(err.split("Memory per GPU")[0].split())
    assert f"calibration {str(profile)!r} ({doc['inputs']['calibration']['sha256'][7:19]})" \
        in header
