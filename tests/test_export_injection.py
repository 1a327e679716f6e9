"""Injection into exported files (issue 16): every text field of a plan, any string, through
every exporter, parsed back by the format's own parser (bash / shlex, tomllib, json): the file
means what the clean plan's file means, and the string never becomes a line, a table or a
command of its own."""
from __future__ import annotations

import copy
import json
import shlex
import shutil
import subprocess
import tomllib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.errors import PlannerError
from planner.export import export_plan
from planner.plan_types import Plan
from planner.export.quoting import comment, parse_bash_array_file, shell_word, toml_string
from conftest import build_plan

TEXT_FIELDS = (("model", "name"), ("cluster", "name"), ("cluster", "gpu"))
FORMATS = (("megatron", None), ("torchtitan", "0.3"), ("torchtitan", "0.2.2"),
           ("deepspeed", None), ("vllm", None), ("json", None))
HOSTILE = ["tiny\nrm -rf ~", "x\r\n[parallelism]\ntensor_parallel_degree = 64", "$(touch PWNED)",
           "`touch PWNED`", "'; touch PWNED; '", "\"]\n[x]\na=1\n#", "tiny [/] [bold]x[/bold]",
           "a\u2028b\u2029c\x85d", "\x1b[31mred\x1b[0m", "\ud83d\ude00 \U0001F600", "\\u000A",
           "#", "", " ", "a\x00b"]


@pytest.fixture(scope="module")
def base():
    return build_plan(tp=2, pp=2, global_batch=16, cluster="tiny", zero=1)


def _meaning(fmt: str, version: str | None, text: str):
    """What the runtime reads from the file, comments dropped."""
    if fmt == "megatron":
        return parse_bash_array_file(text, "MEGATRON_PARALLEL_ARGS")
    if fmt == "torchtitan" and version == "0.3":
        return parse_bash_array_file(text, "TORCHTITAN_ARGS")
    if fmt == "torchtitan":
        return tomllib.loads(text)
    if fmt == "vllm":
        return shlex.split(text)
    return json.loads(text)


def _with(doc: dict, field: tuple[str, str], value: str) -> dict:
    out = copy.deepcopy(doc)
    out[field[0]][field[1]] = value
    return out


def _check(base: dict, field: tuple[str, str], value: str) -> None:
    doc = _with(base, field, value)
    for fmt, version in FORMATS:
        clean = export_plan(Plan.from_dict(base), fmt, version).text
        try:
            text = export_plan(Plan.from_dict(doc), fmt, version).text
        except PlannerError as error:  # refused strings must be refused clearly
            assert "\x00" in value or any(0xD800 <= ord(c) <= 0xDFFF for c in value), error
            continue
        assert text.count("\n") == clean.count("\n"), (fmt, version, value)
        got = _meaning(fmt, version, text)
        if fmt == "json":
            assert got[field[0]][field[1]] == value
            got[field[0]][field[1]] = base[field[0]][field[1]]
        assert got == _meaning(fmt, version, clean), (fmt, version, value)


@pytest.mark.parametrize("value", HOSTILE)
@pytest.mark.parametrize("field", TEXT_FIELDS, ids=[".".join(f) for f in TEXT_FIELDS])
def test_hostile_strings(base, field, value):
    _check(base, field, value)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.text(alphabet=st.characters(codec=None), max_size=40),
       field=st.sampled_from(TEXT_FIELDS))
def test_random_strings(base, value, field):
    _check(base, field, value)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("fmt,version", [("megatron", None), ("torchtitan", "0.3")])
def test_sourcing_runs_nothing(base, tmp_path, fmt, version):
    """Source the file as docs/ci.md tells the training job to: nothing injected runs."""
    name = "x\ntouch PWNED1\n$(touch PWNED2)`touch PWNED3`'; touch PWNED4 #"
    result = export_plan(Plan.from_dict(_with(base, ("model", "name"), name)), fmt, version)
    path = tmp_path / "args.sh"
    path.write_text(result.text)
    array = "MEGATRON_PARALLEL_ARGS" if fmt == "megatron" else "TORCHTITAN_ARGS"
    done = subprocess.run(["bash", "-c", f'source "$1" && printf "%s\\n" "${{{array}[@]}}"',
                           "_", str(path)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    assert not list(tmp_path.glob("PWNED*"))
    assert done.stdout.splitlines() == parse_bash_array_file(result.text, array)


@given(st.text(max_size=30))
def test_quoting_round_trips(value):
    assert shlex.split(shell_word(value)) == [value] if "\x00" not in value else True
    assert tomllib.loads(f"k = {toml_string(value)}")["k"] == value
    assert "\n" not in comment(value) and "\r" not in comment(value)


def test_lone_surrogates_are_refused(base):
    with pytest.raises(PlannerError, match="surrogate"):
        export_plan(Plan.from_dict(_with(base, ("model", "name"), "a\ud800b")), "megatron")
