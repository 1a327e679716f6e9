"""docs/ci.md: the GitHub Actions job and the pre-commit hook run as written.

The examples are taken from the document (the YAML block after each ``<!-- ci-example: NAME
-->`` marker), their ``shardplan`` commands run with bash in a folder laid out as the examples
expect (plan.json, configs/model.json, configs/cluster.yaml) against a plan made there.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from planner.export.megatron import parse_args_file
from conftest import build_plan, write

ROOT = Path(__file__).resolve().parents[1]
SHARDPLAN = Path(sys.executable).parent / "shardplan"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or not SHARDPLAN.exists(),
                                reason="needs bash and the shardplan console script")


def example(name: str) -> dict:
    text = (ROOT / "docs" / "ci.md").read_text()
    match = re.search(rf"<!-- ci-example: {re.escape(name)} -->\s*```yaml\n(.*?)```", text, re.S)
    assert match, f"docs/ci.md has no '<!-- ci-example: {name} -->' YAML block"
    return yaml.safe_load(match.group(1))


def run(command: str, folder: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    full = {**os.environ, **env, "PATH": f"{SHARDPLAN.parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(["bash", "-c", command], cwd=folder, env=full, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A project folder: configs/ (the tiny model as JSON, the tiny cluster) and plan.json."""
    configs = tmp_path / "configs"
    configs.mkdir()
    model = yaml.safe_load((ROOT / "models" / "presets" / "tiny.yaml").read_text())
    (configs / "model.json").write_text(json.dumps(model, indent=2))
    shutil.copy(ROOT / "clusters" / "presets" / "tiny.yaml", configs / "cluster.yaml")
    monkeypatch.chdir(tmp_path)
    doc = build_plan(model="configs/model.json", cluster="configs/cluster.yaml", zero=1)
    write(doc, tmp_path / "plan.json")
    return tmp_path


def _shardplan_steps(job: dict) -> list[str]:
    return [step["run"] for step in job["steps"]
            if "run" in step and step["run"].lstrip().startswith("shardplan")]


def test_github_actions_job_runs(repo):
    job = example("github-actions")["jobs"]["check-plan"]
    env = {k: str(v) for k, v in job["env"].items()}
    steps = _shardplan_steps(job)
    assert any("shardplan check" in s for s in steps)
    assert any("shardplan export" in s for s in steps)
    for command in steps:
        done = run(command, repo, env)
        assert done.returncode == 0, (command, done.stdout, done.stderr)
    report = json.loads((repo / "check-report.json").read_text())
    assert report["ok"] and not report["stale"]
    args = parse_args_file((repo / "megatron-args.sh").read_text())
    assert "--tensor-model-parallel-size" in args


def test_github_actions_job_fails_when_the_cluster_shrinks(repo):
    job = example("github-actions")["jobs"]["check-plan"]
    env = {k: str(v) for k, v in job["env"].items()}
    cluster = repo / "configs" / "cluster.yaml"
    shrunk = "gpu: tiny-gpu\ngpu_overrides: {memory_gib: 0.05}"
    cluster.write_text(cluster.read_text().replace("gpu: tiny-gpu", shrunk))
    gate = next(s for s in _shardplan_steps(job) if "check" in s and "--json" not in s)
    done = run(gate, repo, env)
    assert done.returncode == 1, done.stderr
    said = " ".join(done.stderr.split())  # rich wraps at 80 columns off a terminal
    assert "cluster: tiny (configs/cluster.yaml): stale" in said
    assert "Stages over capacity" in said and "problem (memory)" in said
    done = run(gate + " --allow-stale --json", repo, env)
    report = json.loads(done.stdout)
    assert done.returncode == 1 and report["fits"] is False and report["remedies"] is not None


def test_pre_commit_hook_runs(repo):
    hooks = example("pre-commit")["repos"][0]["hooks"]
    hook = next(h for h in hooks if h["id"] == "shardplan-check")
    assert hook["entry"].startswith("shardplan check plan.json")
    assert re.match(hook["files"], "plan.json") and re.match(hook["files"], "configs/model.json")
    done = run(hook["entry"], repo, {})
    assert done.returncode == 0, done.stderr
    # a configuration change the plan was not made for fails the commit
    model = repo / "configs" / "model.json"
    data = json.loads(model.read_text())
    data["ffn_hidden_size"] *= 2
    model.write_text(json.dumps(data))
    done = run(hook["entry"], repo, {})
    assert done.returncode == 1 and "stale" in done.stderr
