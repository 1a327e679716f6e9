"""A serving plan whose longest request (isl + osl) is longer than the model's positions
(max_position_embeddings) says so, when printed and in each export: vLLM and SGLang refuse such
a --max-model-len / --context-length at start-up unless an environment variable allows it.
Before, ``plan --workload serve -m llama-3.1-8b --isl 200000 --osl 1000`` (131,072 positions)
planned and exported ``--max-model-len 201000`` without a word.
"""
from __future__ import annotations

import pytest

from conftest import run_cli

SERVE = ["plan", "--workload", "serve", "-m", "tiny", "-c", "tiny", "--concurrency", "4"]


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    from cli.main import main

    folder = tmp_path_factory.mktemp("serve")
    made = {}
    for name, isl, osl in (("long", 100, 50), ("short", 64, 32)):  # tiny: 128 positions
        path = folder / f"{name}.json"
        with pytest.raises(SystemExit) as done:
            main(SERVE + ["--isl", str(isl), "--osl", str(osl), "-o", str(path)])
        assert done.value.code == 0
        made[name] = path
    return made


@pytest.mark.parametrize("fmt, override", [("vllm", "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"),
                                           ("sglang", "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1"),
                                           ("trtllm", None)])
def test_exports_warn_of_a_context_beyond_the_positions(plans, capsys, fmt, override):
    code, out, err = run_cli(["export", plans["long"], "--format", fmt], capsys)
    assert code == 0 and out
    assert "isl + osl = 150 tokens is longer than the 128 positions of tiny" in err
    if override:
        assert override in err
    code, _, err = run_cli(["export", plans["short"], "--format", fmt], capsys)
    assert code == 0 and "positions" not in err


def test_show_warns_of_a_context_beyond_the_positions(plans, capsys):
    code, _, err = run_cli(["show", plans["long"]], capsys)
    assert code == 0 and "longer than the 128 positions" in err
    code, _, err = run_cli(["show", plans["short"]], capsys)
    assert code == 0 and "positions" not in err
