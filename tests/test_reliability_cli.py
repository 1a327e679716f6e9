"""Reliability at the command line: every bad input gets a clear answer, every plan is
reproducible, nothing is lost.

The bad-input catalogue lives in ``tests/reliability_cases.py`` (bench/reliability_table.py writes the table in
docs/reliability.md); each case is checked here twice, for people (stderr, no traceback, stdout
empty) and for scripts (``--json``: exactly one JSON document with an ``error`` object). The
loaders' own error tests (tests/test_models_*.py, tests/test_clusters_*.py) cover the library;
these cover what reaches the user through ``cli.main.main``, the one place exit codes are set.
"""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reliability_cases import CASES, Case  # noqa: E402
from reliability_fixtures import inputs, no_debug_env, run, workdir  # noqa: F401 (fixtures)
from timeouts import Hang, deadline  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
ERROR_KEYS = {"kind", "message", "hints", "exit_code"}
SMALL_PLAN = ("plan", "-m", "tiny", "-c", "small-cluster.yaml", "--global-batch", "8")




def flat(text: str) -> str:
    """Lower-cased, whitespace runs collapsed."""
    return " ".join(text.split()).lower()


def assert_names_problem(text: str, needles: tuple[str, ...], argv) -> None:
    for needle in needles:
        assert flat(needle) in flat(text), f"{needle!r} missing from the answer to {argv}:\n{text}"


def check_case(capsys, case: Case) -> None:
    code, out, err = run(capsys, *case.argv)
    assert "Traceback" not in out + err
    assert code == case.code, f"{case.argv}: exit {code}, expected {case.code}\n{err}"
    if case.code != 0:
        assert out == "", "errors go to stderr; stdout is for data"
        assert_names_problem(err, case.needles, case.argv)
        lines = err.splitlines()
        assert lines[0].startswith("error: "), err  # one `error:` line, found by grep
        assert all(x.startswith("  ") for x in lines[1:]), f"a wrapped or stray line:\n{err}"
    if case.argv[0] == "export":  # no --json: its stdout is the exported file
        return

    code, out, err = run(capsys, *case.argv, "--json")
    assert "Traceback" not in out + err
    assert code == case.code
    document = json.loads(out)  # exactly one document: trailing data would not parse
    if case.code != 0:
        error = document["error"]
        assert ERROR_KEYS <= set(error)
        assert error["exit_code"] == case.code
        assert isinstance(error["hints"], list) and isinstance(error["message"], str)
        assert_names_problem(error["message"] + "\n" + "\n".join(error["hints"]), case.needles,
                             case.argv)


def _param(case: Case):
    marks = [pytest.mark.xfail(strict=True, reason=case.known_bug)] if case.known_bug else []
    return pytest.param(case, id=case.id, marks=marks)


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_bad_input_gets_a_clear_answer(capsys, workdir, case):
    check_case(capsys, case)


def test_catalogue_covers_every_class():
    groups = {c.group for c in CASES}
    assert groups == {"model file", "cluster file", "numbers on the command line",
                      "unknown names", "output file", "usage", "does not fit",
                      "text that is not the program's", "plan file"}
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))
    for stem in ("empty", "binary", "truncated", "huge", "directory", "missing", "anchors",
                 "alias-bomb", "tabs", "duplicate-key", "unknown-key", "negative", "zero",
                 "fractional", "nan", "inf", "huge-number"):
        for kind in ("model", "cluster"):
            assert any(i.startswith(f"{kind}-{stem}") for i in ids), f"{kind}-{stem}"


def test_traceback_only_with_debug_and_the_same_exit_code(capsys, workdir, monkeypatch):
    code, out, err = run(capsys, "inspect", "-m", "model-empty.yaml")
    assert code == 2 and "Traceback" not in err
    code, out, err = run(capsys, "--debug", "inspect", "-m", "model-empty.yaml")
    assert code == 2 and "Traceback" in err and "error: model file model-empty.yaml is empty" in err
    for value in ("1", "true", "2", "yes"):  # any value switches it on; none is a usage error
        monkeypatch.setenv("SHARDPLAN_DEBUG", value)
        code, out, err = run(capsys, "inspect", "-m", "model-empty.yaml")
        assert code == 2 and "Traceback" in err, value
        code, out, err = run(capsys, "models", "--json")
        assert code == 0 and json.loads(out)["models"], value
    for value in ("0", "", "false", "no"):
        monkeypatch.setenv("SHARDPLAN_DEBUG", value)
        code, out, err = run(capsys, "inspect", "-m", "model-empty.yaml")
        assert code == 2 and "Traceback" not in err, value


# -- the does-not-fit answer says how much is missing and what would help ------------------------

def test_does_not_fit_quantifies_the_gap(capsys):
    code, out, _ = run(capsys, "plan", "-m", "llama-3.1-405b", "-c", "tiny", "--global-batch", "8",
                       "--json")
    assert code == 1
    error = json.loads(out)["error"]
    assert error["kind"] == "does_not_fit" and error["exit_code"] == 1
    details = error["details"]
    assert details["capacity_gib"] == pytest.approx(2.0)
    # the search keeps the default headroom (5 %) free: the gap is to what a plan may use
    assert details["smallest_peak_gib"] > details["memory_limit_gib"] == pytest.approx(1.9)
    missing = details["smallest_peak_gib"] - details["memory_limit_gib"]
    assert f"{missing:.1f} GiB more than" in error["message"]
    assert error["hints"], "what would help"
    assert any("GiB" in hint or "GPUs" in hint for hint in error["hints"])


# -- output files: nothing is lost --------------------------------------------------------------

def test_existing_output_is_kept_without_force_and_replaced_with_it(capsys, workdir):
    target = workdir / "kept.json"
    target.write_text("precious\n")
    code, out, err = run(capsys, *SMALL_PLAN, "-o", str(target))
    assert code == 2 and "--force" in err
    assert target.read_text() == "precious\n"

    code, out, err = run(capsys, *SMALL_PLAN, "-o", str(target), "--force")
    assert code == 0, err
    plan = json.loads(target.read_text())
    assert plan["kind"] == "shardplan-plan"
    assert sorted(p.name for p in workdir.glob(".kept.json*")) == []  # no temp file left


def test_plan_file_mode_follows_umask(capsys, workdir):
    target = workdir / "mode.json"
    target.unlink(missing_ok=True)
    old = os.umask(0o022)
    try:
        code, _, err = run(capsys, *SMALL_PLAN, "-o", str(target))
    finally:
        os.umask(old)
    assert code == 0, err
    assert target.stat().st_mode & 0o777 == 0o644


def test_failed_plan_leaves_existing_output_alone_even_with_force(capsys, workdir):
    target = workdir / "kept-on-failure.json"
    target.write_text("precious\n")
    code, _, _ = run(capsys, "plan", "-m", "tiny", "-c", "small-cluster.yaml", "--global-batch",
                     "8", "--pin", "tp=3", "-o", str(target), "--force")
    assert code == 1
    assert target.read_text() == "precious\n"


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_ctrl_c_during_search_exits_130_and_writes_nothing(capsys, workdir, tmp_path,
                                                          monkeypatch):
    import planner.solve.search as search

    real = search.solve_stages
    calls = []

    def interrupted(*args, **kwargs):
        calls.append(1)
        real(*args, **kwargs)  # the first solve runs, then the user presses Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(search, "solve_stages", interrupted)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    target = out_dir / "plan.json"
    code, out, err = run(capsys, *SMALL_PLAN, "-o", str(target))
    assert calls == [1]
    assert code == 130 and "interrupted" in err and "Traceback" not in err
    assert _leftovers(out_dir) == []

    code, out, _ = run(capsys, *SMALL_PLAN, "-o", str(target), "--json")
    assert code == 130
    assert json.loads(out)["error"] == {"kind": "interrupted", "message": "interrupted",
                                        "hints": [], "details": {}, "exit_code": 130}
    assert _leftovers(out_dir) == []


def test_ctrl_c_while_writing_keeps_the_old_file_and_no_temp_file(capsys, workdir, tmp_path,
                                                                  monkeypatch):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    target = out_dir / "plan.json"
    target.write_text("old plan\n")

    def interrupted(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    code, _, err = run(capsys, *SMALL_PLAN, "-o", str(target), "--force")
    assert code == 130 and "Traceback" not in err
    assert target.read_text() == "old plan\n"
    assert _leftovers(out_dir) == ["plan.json"]


@pytest.mark.parametrize("field,value,command", [
    pytest.param("virtual_stages", 2**63, ["check"], id="check-v"),
    pytest.param("pp", 2**63, ["check"], id="check-pp"),
    pytest.param("virtual_stages", 2**63, ["export", "-f", "megatron"], id="export-v"),
    pytest.param("pp", 10**30, ["export", "-f", "deepspeed"], id="export-pp"),
    pytest.param("pp", 10**30, ["show"], id="show-pp"),
])
def test_plan_file_commands_refuse_absurd_degrees(capsys, workdir, field, value, command):
    target = workdir / "absurd.json"
    code, _, err = run(capsys, *SMALL_PLAN, "-o", str(target), "--force")
    assert code == 0, err
    doc = json.loads(target.read_text())
    doc["parallelism"][field] = value
    target.write_text(json.dumps(doc))
    try:
        with deadline(3):  # show takes ~0.1 s on this plan
            code, out, err = run(capsys, command[0], str(target), *command[1:])
    except Hang as hang:
        raise AssertionError(f"shardplan {command[0]} hangs on {field} = {value}") from hang
    assert code in (1, 2) and "Traceback" not in out + err, err


# -- time limits are honest -----------------------------------------------------------------------

def test_time_limit_gives_feasible_with_gap_or_exit_3(capsys):
    code, out, err = run(capsys, "plan", "-m", "gpt3-175b", "-c", "dgx-a100-80g", "--nodes", "128",
                         "--global-batch", "1536", "--time-limit", "0.1", "--json")
    assert "Traceback" not in err
    document = json.loads(out)
    if code == 0:
        solver = document["solver"]
        assert solver["status"] == "FEASIBLE", "a 0.1 s search of 3,000 configurations " \
                                               "cannot have proven optimality"
        assert solver["time_limit_s"] == pytest.approx(0.1)
        assert math.isfinite(solver["gap"]) and solver["gap"] >= 0
        assert solver["best_bound_s"] <= solver["objective_s"]
        assert solver["stopped_by"] == "time_limit"  # the carve-out: may differ run to run
    else:
        assert code == 3, f"exit {code}: {out}"
        error = document["error"]
        assert error["kind"] == "solver_limit" and error["exit_code"] == 3
        assert "time limit" in error["message"] and error["hints"]


# -- reproducible: two processes, same bytes ------------------------------------------------

def _shardplan(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("PYTHONHASHSEED", None)  # each process gets its own hash seed, as users' do
    return subprocess.run([sys.executable, "-c", "from cli.main import main; main()", *argv],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def _side_by_side(*argvs: tuple[str, ...], cwd: Path) -> list[subprocess.CompletedProcess]:
    """The commands in separate processes at the same time (each its own hash seed)."""
    with ThreadPoolExecutor(max_workers=len(argvs)) as pool:
        return list(pool.map(lambda argv: _shardplan(*argv, cwd=cwd), argvs))


@pytest.fixture(scope="module")
def two_plans(inputs) -> tuple[bytes, bytes]:
    names = ("plan-a.json", "plan-b.json")
    for name in names:
        (inputs / name).unlink(missing_ok=True)
    for done in _side_by_side(*((*SMALL_PLAN, "-o", name) for name in names), cwd=inputs):
        assert done.returncode == 0, done.stderr
    return tuple((inputs / name).read_bytes() for name in names)


def test_plan_file_bytes_are_identical(two_plans):
    assert two_plans[0] == two_plans[1]
    assert json.loads(two_plans[0])["solver"]["stopped_by"] == "complete"


def test_a_work_limited_search_is_byte_identical(inputs):
    """--work-limit is the deterministic budget: the same plan in separate processes."""
    argv = (*SMALL_PLAN, "--work-limit", "2", "--json")  # 3 configurations when complete
    first, second = _side_by_side(argv, argv, cwd=inputs)
    assert first.returncode == second.returncode == 0, first.stderr
    assert first.stdout == second.stdout
    solver = json.loads(first.stdout)["solver"]
    assert solver["stopped_by"] == "work_limit" and solver["candidates_evaluated"] == 2
    assert solver["status"] == "FEASIBLE"


def test_plan_holds_no_timestamps(two_plans):
    text = two_plans[0].decode()
    assert not re.search(r"\b(19|20)\d\d-[01]\d-[0-3]\d", text), "a date in the plan"
    now = time.time()

    def walk(value, path="plan"):
        if isinstance(value, dict):
            for key, item in value.items():
                words = set(key.lower().split("_"))
                assert not words & {"date", "datetime", "timestamp", "created", "host",
                                    "hostname", "user"}, f"{path}.{key}"
                walk(item, f"{path}.{key}")
        elif isinstance(value, list):
            for index, item in enumerate(value):
                walk(item, f"{path}[{index}]")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            assert abs(value - now) > 3.2e7, f"{path} = {value} looks like an epoch time"

    walk(json.loads(text))


def test_evaluate_json_is_byte_identical_across_processes(inputs):
    argv = ("evaluate", "-m", "tiny", "-c", "small-cluster.yaml", "--global-batch", "8", "--tp",
            "2", "--pp", "2", "--json")
    first, second = _side_by_side(argv, argv, cwd=inputs)
    assert first.returncode == second.returncode == 0, first.stderr
    assert first.stdout == second.stdout
    json.loads(first.stdout)
