"""`shardplan verify` where PyTorch is missing: a clear error and exit code 2 (runs without
torch; the runs themselves are in test_verify_plans.py)."""
from __future__ import annotations

import json
import sys

import pytest

from cli.main import main


def run_cli(argv, capsys):
    with pytest.raises(SystemExit) as done:
        main(argv)
    out = capsys.readouterr()
    return done.value.code, out.out, out.err


def test_verify_without_torch_exits_2_with_a_clear_message(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    code, out, err = run_cli(["verify", str(plan)], capsys)
    assert code == 2
    assert "needs PyTorch" in err and "torch>=2.4" in err
    code, out, _ = run_cli(["verify", str(plan), "--json"], capsys)
    assert code == 2
    error = json.loads(out)["error"]
    assert error["kind"] == "unsupported" and "needs PyTorch" in error["message"]
