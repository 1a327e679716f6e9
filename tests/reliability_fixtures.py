"""Fixtures and the in-process runner shared by the reliability test modules (test_reliability_*).

Imported by name into each module (``from reliability_fixtures import ...``), so every module keeps
its own module-scoped inputs folder.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from cli.main import main
from reliability_cases import make_inputs


@pytest.fixture(autouse=True)
def no_debug_env(monkeypatch):
    monkeypatch.delenv("SHARDPLAN_DEBUG", raising=False)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    return make_inputs(tmp_path_factory.mktemp("inputs"))


@pytest.fixture
def workdir(inputs, monkeypatch) -> Path:
    """Commands run inside the inputs folder, so messages name short relative paths."""
    monkeypatch.chdir(inputs)
    return inputs


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """Run one command in-process; its exit code, stdout and stderr."""
    with pytest.raises(SystemExit) as done:
        main(list(argv))
    out, err = capsys.readouterr()
    return done.value.code, out, err
