"""Random text in every text field, through every command: the answer is well formed.

Text that is not the program's (names, keys, paths, preset names, pins) reaches messages,
tables and plan files. Whatever it holds (rich markup ``[/]``, emoji codes, terminal escapes,
newlines, bidirectional overrides, NUL), the command answers with an expected exit code, no
traceback, no ``MarkupError``, one ``error:`` line (never wrapped; continuation and hint lines
indented), no raw control character on stderr, and, when it succeeds, the text comes back
unchanged in ``--json``.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reliability_cases import MODEL
from reliability_fixtures import inputs, no_debug_env, run, workdir  # noqa: F401 (fixtures)

PROPERTY = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])
HOSTILE = ["[/]", "[bold]", "[/bold]", "[", "]", "[red]x[/red]", ":smile:", "\x1b[2J", "\n",
           "\r", "\t", "\u202e", "\u2028", "\x00", "%s", "{}", "\\", "'", '"', "$(id)", "`id`",
           "#", "=", " ", "tiny", "../", "é", "日本", "\U0001f600"]
TEXT = st.lists(st.one_of(st.sampled_from(HOSTILE), st.text(max_size=6)), min_size=1,
                max_size=5).map("".join)
RAW_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")
SMALL = ("-c", "small-cluster.yaml", "--global-batch", "8")




def well_formed(code: int, out: str, err: str, allowed: set[int], as_json: bool = False) -> None:
    assert code in allowed, f"exit {code}\n{err}"
    assert "Traceback" not in err and "MarkupError" not in err, err
    assert not RAW_CONTROL.search(err), f"a raw control character on stderr: {err!r}"
    if as_json:
        document = json.loads(out)  # one document
        assert code == 0 or document["error"]["exit_code"] == code
    elif code >= 2 or (code == 1 and "check failed" not in err):  # check's report is no error
        lines = err.splitlines()
        assert lines and lines[0].startswith("error: "), err
        assert all(x.startswith("  ") for x in lines[1:]), err


def model_file(folder: Path, name: str, key: str = "name") -> Path:
    text = MODEL.replace("name: small", f"{key}: {json.dumps(name)}" if key == "name"
                         else f"name: small\n{json.dumps(key)}: 1")
    path = folder / "random-model.yaml"
    path.write_text(text, encoding="utf-8")
    return path


@PROPERTY
@given(name=TEXT)
def test_model_names(capsys, workdir, name):
    path = model_file(workdir, name)
    for argv in (("inspect", "-m", path.name), ("evaluate", "-m", path.name, *SMALL, "--tp",
                                                 "1", "--pp", "1")):
        code, out, err = run(capsys, *argv)
        well_formed(code, out, err, {0, 2})
        code, out, err = run(capsys, *argv, "--json")
        well_formed(code, out, err, {0, 2}, as_json=True)
        document = json.loads(out)
        if code == 0 and name.strip():
            model = document.get("model", document)
            assert model["name"] == name.strip()


@PROPERTY
@given(key=TEXT)
def test_model_keys(capsys, workdir, key):
    path = model_file(workdir, "", key=key)
    code, out, err = run(capsys, "inspect", "-m", path.name)
    well_formed(code, out, err, {0, 2})


@PROPERTY
@given(name=TEXT)
def test_cluster_names(capsys, workdir, name):
    text = (workdir / "small-cluster.yaml").read_text(encoding="utf-8")
    path = workdir / "random-cluster.yaml"
    path.write_text(text.replace("name: small", f"name: {json.dumps(name)}"), encoding="utf-8")
    code, out, err = run(capsys, "evaluate", "-m", "tiny", "-c", path.name, "--global-batch", "8",
                         "--tp", "1", "--pp", "1")
    well_formed(code, out, err, {0, 2})


@PROPERTY
@given(spec=TEXT, command=st.sampled_from(["inspect", "evaluate", "plan", "show", "check"]))
def test_model_and_plan_arguments(capsys, workdir, spec, command):
    """A random preset name or path given to -m (or as the plan file)."""
    if spec.startswith("-"):
        spec = "x" + spec
    if command == "inspect":
        argv = ("inspect", "-m", spec)
    elif command == "evaluate":
        argv = ("evaluate", "-m", spec, *SMALL, "--tp", "1", "--pp", "1")
    elif command == "plan":
        argv = ("plan", "-m", spec, *SMALL)
    else:
        argv = (command, spec)
    code, out, err = run(capsys, *argv)
    well_formed(code, out, err, {0, 1, 2})


@PROPERTY
@given(pins=st.lists(st.tuples(TEXT, TEXT), min_size=1, max_size=3))
def test_pins(capsys, workdir, pins):
    argv = ["plan", "-m", "tiny", *SMALL, "--time-limit", "5"]
    for key, value in pins:
        argv += ["--pin", f"{key}={value}"]
    code, out, err = run(capsys, *argv)
    well_formed(code, out, err, {0, 1, 2, 3})


@PROPERTY
@given(name=TEXT, field=st.sampled_from(["model.name", "inputs.model.spec", "inputs.cluster.spec",
                                         "cluster.name", "layers.0.name"]))
def test_plan_file_text(capsys, workdir, name, field):
    doc = json.loads((workdir / "plan-small.json").read_text(encoding="utf-8"))
    holder = doc
    *path, last = field.split(".")
    for part in path:
        holder = holder[int(part)] if part.isdigit() else holder[part]
    holder[last] = name
    target = workdir / "random-plan.json"
    target.write_text(json.dumps(doc), encoding="utf-8")
    for argv in (("show", target.name), ("check", target.name, "--allow-stale")):
        code, out, err = run(capsys, *argv)
        well_formed(code, out, err, {0, 1, 2})
