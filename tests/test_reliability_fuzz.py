"""Fuzz the command line: whatever argv holds, ``shardplan`` answers with exit 0, 1, 2 or 3 and
never with a traceback. Exit 4 (internal error) is a bug: the falsifying argv is the reproducer.
The same holds for saved plan files damaged at random (``show``, ``check``, ``export``).

Commands get their options with random values (small and huge integers, negatives, NaN and
infinities, junk strings), random omissions and random extra tokens, on small inputs (the tiny
model, 8-GPU clusters) so valid runs take a fraction of a second. Node counts between 10**4 and
10**6 are left out on purpose: they are valid and slow (seconds per evaluation; see the Scale
section of docs/reliability.md), which is bench/stress.py's business, not a fuzzer's.
"""
from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reliability_cases import make_inputs  # noqa: E402
from cli.main import main  # noqa: E402
from timeouts import Hang, deadline  # noqa: E402

FUZZ = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

JUNK = st.one_of(
    st.sampled_from(["", " ", "nan", "-nan", "inf", "-inf", "1e30", "1e-30", "2.5", "-0", "0x10",
                     "1_000", "٣", "８", "None", "true", "[]", "{}", "--", "-", "--json", "~",
                     "../../etc/passwd", "a" * 300, "\x00", "\n"]),
    st.text(max_size=12),
)
SMALL = st.integers(min_value=-3, max_value=64).map(str)
HUGE = st.one_of(st.integers(min_value=10**7, max_value=10**40),
                 st.integers(min_value=-10**40, max_value=-1)).map(str)
EDGE = st.one_of(SMALL, HUGE, JUNK)


def mostly(valid: list[str], edge=EDGE):
    """A valid value seven times in eight, else an edge case, so that runs reach the planner
    (``one_of`` would pick the edge branch about half of the time)."""
    return st.sampled_from(range(8)).flatmap(lambda i: st.sampled_from(valid) if i else edge)


NODES = mostly(["1", "2", "4"], st.one_of(st.integers(min_value=-2, max_value=16).map(str),
                                          HUGE, JUNK))
SECONDS = mostly(["0.1", "0.5", "5", "1e300"])

MODELS = mostly(["tiny", "tiny", "small-model.yaml", "model-anchors.yaml"],
                st.one_of(st.sampled_from(["model-empty.yaml", "model-heads-hidden.yaml",
                                           "a-folder", "llama-3.1-8", "missing-folder/m.yaml"]),
                          JUNK))
CLUSTERS = mostly(["small-cluster.yaml", "small-cluster.yaml", "tiny", "dgx-h100",
                   "v100-cluster.yaml", "cluster-anchors.yaml"],
                  st.one_of(st.sampled_from(["cluster-unknown-key.yaml", "cluster-memory-nan.yaml",
                                             "dgx-h10", "a-folder"]), JUNK))
OUTPUTS = mostly(["fuzz-plan.json"], st.sampled_from(["missing-folder/p.json", "a-folder",
                                                      "small-model.yaml/p.json", ""]))
PIN_KEYS = ["tp", "pp", "dp", "cp", "ep", "sp", "zero", "micro_batch", "virtual_stages",
            "recompute", "micro-batch", "zero_stage", "bogus", ""]
PINS = st.builds(lambda k, v, sep: f"{k}{sep}{v}", st.sampled_from(PIN_KEYS),
                 mostly(["1", "2", "4", "on", "off", "full", "selective", "none"]),
                 st.sampled_from(["=", "=", "=", ":", ""]))
DTYPES = mostly(["bf16", "bf16", "fp16", "fp8"])

COMMON = {"--model": MODELS, "--cluster": CLUSTERS, "--nodes": NODES,
          "--global-batch": mostly(["8", "8", "16", "32", "64", "12", "1024"]),
          "--seq-len": mostly(["64", "128", "256"])}
OPTIONS = {
    "evaluate": {**COMMON, "--tp": mostly(["1", "2", "4", "8"]), "--pp": mostly(["1", "2", "4"]),
                 "--dp": mostly(["1", "2", "4", "8"]), "--cp": mostly(["1", "1", "2"]),
                 "--ep": mostly(["1", "1", "2"]), "--micro-batch": mostly(["1", "2", "4"]),
                 "--virtual-stages": mostly(["1", "2"]), "--zero": mostly(["0", "1", "2", "3"]),
                 "--recompute": mostly(["none", "selective", "full"]), "--dtype": DTYPES,
                 "--attention": mostly(["flash", "eager"]),
                 "--runtime": mostly(["megatron", "deepspeed", "deepspeed-bf16"])},
    "plan": {**COMMON, "--dtype": DTYPES, "--time-limit": SECONDS,
             "--workers": mostly(["1", "1", "2"]), "--top-k": mostly(["1", "3"]), "--pin": PINS,
             "--attention": mostly(["flash", "eager"]), "-o": OUTPUTS},
    "inspect": {"--model": MODELS, "--seq-len": mostly(["64", "128"])},
    "models": {},
    "clusters": {},
}
REQUIRED = {"evaluate": ("--model", "--cluster", "--global-batch", "--tp", "--pp"),
            "plan": ("--model", "--cluster", "--global-batch"), "inspect": ("--model",),
            "models": (), "clusters": ()}
FLAGS = ["--json", "--json", "--json", "--force", "--timings", "--sp", "--no-sp", "--help",
         "--frobnicate"]


def chance(draw, k: int, n: int) -> bool:
    """True k times in n (sampled_from is uniform; floats and integers favour their bounds)."""
    return draw(st.sampled_from(range(n))) < k


def run(argv: list[str], seconds: float) -> int:
    try:
        with deadline(seconds), pytest.raises(SystemExit) as done:
            main(argv)
    except Hang:
        raise AssertionError(f"shardplan {argv!r} hangs (over {seconds} s)") from None
    return done.value.code


@st.composite
def argvs(draw) -> list[str]:
    command = draw(st.sampled_from(["evaluate", "evaluate", "plan", "plan", "plan", "inspect",
                                    "models", "clusters", "frobnicate"]))
    options = OPTIONS.get(command, {})
    argv = [command]
    for name, values in options.items():
        # required options are usually given (to get past click), optional ones sometimes
        wanted = chance(draw, 14 if name in REQUIRED[command] else 4, 15)
        if wanted:
            argv += [name, draw(values)]
    if command == "plan" and draw(st.booleans()):
        argv += ["--pin", draw(PINS)]
    if command == "plan" and chance(draw, 1, 2):
        argv.append("--force")
    if chance(draw, 3, 5):
        argv.append("--json")
    if chance(draw, 1, 5):
        argv += draw(st.lists(st.one_of(st.sampled_from(FLAGS), JUNK), min_size=1, max_size=2))
    if chance(draw, 1, 10):
        argv = draw(st.permutations(argv))  # tokens out of order
    return list(argv)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return make_inputs(tmp_path_factory.mktemp("fuzz"))


@FUZZ
@given(argv=argvs())
def test_cli_never_crashes(capsys, monkeypatch, workdir, argv):
    monkeypatch.chdir(workdir)
    monkeypatch.delenv("SHARDPLAN_DEBUG", raising=False)  # it would let errors raise
    code = run(argv, 20)
    out, err = capsys.readouterr()
    assert code != 4, f"internal error (a bug) for shardplan {argv!r}:\n{err}{out}"
    assert code in (0, 1, 2, 3), f"exit {code!r} for shardplan {argv!r}"
    assert "Traceback" not in out + err, f"traceback for shardplan {argv!r}"
    if "--json" in argv and code != 0:
        error = json.loads(out)["error"]  # exactly one document, with the error object
        assert error["exit_code"] == code and error["message"]


# -- damaged plan files ----------------------------------------------------------------------------

PLAN_COMMANDS = [["show"], ["show", "--json"], ["check"], ["check", "--json"],
                 ["check", "--allow-stale"], ["check", "-c", "small-cluster.yaml", "--nodes", "4"],
                 ["export", "-f", "megatron"], ["export", "-f", "torchtitan"],
                 ["export", "-f", "deepspeed"], ["export", "-f", "vllm"], ["export", "-f", "json"],
                 ["export", "-f", "megatron", "--strict"]]
DELETE = object()
PLAN_JUNK = [DELETE, None, -1, 0, 1, 10**30, -10**30, 1e308, 0.5, "x", "", [], {}, True, "nan",
             2**63, [1, 2], {"a": 1}]


def _paths(value, path=()):
    if path:
        yield path
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, path + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value[:3]):
            yield from _paths(item, path + (index,))


@pytest.fixture(scope="module")
def saved_plan(workdir) -> tuple[dict, list[tuple]]:
    target = workdir / "saved-plan.json"
    with pytest.raises(SystemExit) as done:
        main(["plan", "-m", "tiny", "-c", str(workdir / "small-cluster.yaml"), "--global-batch",
              "16", "-o", str(target), "--force", "--json"])
    assert done.value.code == 0
    doc = json.loads(target.read_text())
    return doc, list(_paths(doc))


@FUZZ
@given(edits=st.lists(st.tuples(st.integers(min_value=0), st.sampled_from(PLAN_JUNK)),
                      min_size=1, max_size=3),
       command=st.sampled_from(PLAN_COMMANDS))
def test_damaged_plan_files_get_a_clear_answer(capsys, monkeypatch, workdir, saved_plan, edits,
                                               command):
    monkeypatch.chdir(workdir)
    monkeypatch.delenv("SHARDPLAN_DEBUG", raising=False)
    original, paths = saved_plan
    doc = copy.deepcopy(original)
    for index, junk in edits:
        path = paths[index % len(paths)]
        parent = doc
        try:
            for key in path[:-1]:
                parent = parent[key]
            if junk is DELETE:
                del parent[path[-1]]
            else:
                parent[path[-1]] = copy.deepcopy(junk)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier edit removed or replaced this path
    (workdir / "damaged-plan.json").write_text(json.dumps(doc))
    argv = [command[0], "damaged-plan.json", *command[1:]]
    code = run(argv, 5)  # show, check and export take well under a second here
    out, err = capsys.readouterr()
    assert code != 4, f"internal error (a bug) for shardplan {argv!r} on {edits!r}:\n{err}{out}"
    assert code in (0, 1, 2, 3), f"exit {code!r} for shardplan {argv!r}"
    assert "Traceback" not in out + err
