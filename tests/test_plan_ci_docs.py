"""CI integration to copy: the reusable GitHub Actions workflow and the pre-commit hooks, run.

* GitHub Actions: docs/ci.md's caller (the YAML block after ``<!-- ci-example:
  github-actions -->``) gives the inputs; ``.github/workflows/plan-check.yml``'s ``run:``
  steps then run with bash, in order, as the runner would: in a git repository laid out as the
  example expects (plan.json, configs/) with the base branch's plan on ``origin/main``, the
  shardplan checkout in ``.shardplan-src`` (the repository's files), and the install step
  installing it for real into a fresh virtual environment whose ``shardplan`` the later steps
  use.
* pre-commit: ``.pre-commit-hooks.yaml`` and docs/ci.md's config validated by pre-commit's own
  schema, and the hook run by ``pre-commit run`` in a git repository, against this
  repository's committed hooks file.
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
WORKFLOW = ROOT / ".github" / "workflows" / "plan-check.yml"
HOOKS = ROOT / ".pre-commit-hooks.yaml"
GIT = shutil.which("git")
BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(GIT is None or BASH is None, reason="needs git and bash")


def example(name: str) -> dict:
    text = (ROOT / "docs" / "ci.md").read_text()
    match = re.search(rf"<!-- ci-example: {re.escape(name)} -->\s*```yaml\n(.*?)```", text, re.S)
    assert match, f"docs/ci.md has no '<!-- ci-example: {name} -->' YAML block"
    return yaml.safe_load(match.group(1))


def git(folder: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"}
    return subprocess.run([GIT, *args], cwd=folder, env=env, check=True, capture_output=True,
                          text=True).stdout.strip()


def _project(folder: Path, monkeypatch) -> Path:
    """A user's repository: configs/ (the tiny model as JSON, the tiny cluster), plan.json."""
    configs = folder / "configs"
    configs.mkdir(parents=True)
    model = yaml.safe_load((ROOT / "models" / "presets" / "tiny.yaml").read_text())
    (configs / "model.json").write_text(json.dumps(model, indent=2))
    shutil.copy(ROOT / "clusters" / "presets" / "tiny.yaml", configs / "cluster.yaml")
    monkeypatch.chdir(folder)
    write(build_plan(model="configs/model.json", cluster="configs/cluster.yaml", zero=1),
          folder / "plan.json")
    git(folder, "init", "-q", "-b", "main")
    git(folder, "add", ".")
    git(folder, "commit", "-q", "-m", "plan")
    return folder


# -- GitHub Actions ----------------------------------------------------------------------------

def _inputs() -> dict[str, str]:
    caller = example("github-actions")
    job = caller["jobs"]["plan"]
    assert job["uses"].split("@")[0].endswith("/.github/workflows/plan-check.yml")
    workflow = yaml.safe_load(WORKFLOW.read_text())
    declared = workflow[True]["workflow_call"]["inputs"]  # YAML 1.1 reads `on` as True
    values = {k: str(spec["default"]) for k, spec in declared.items() if "default" in spec}
    values.update({k: str(v) for k, v in job["with"].items()})
    missing = [k for k, spec in declared.items() if spec.get("required") and k not in values]
    assert not missing and set(job["with"]) <= set(declared)
    return values


def _expand(text: str, inputs: dict[str, str], base_ref: str) -> str:
    text = re.sub(r"\$\{\{\s*inputs\.([\w-]+)\s*\}\}", lambda m: inputs[m.group(1)], text)
    return re.sub(r"\$\{\{\s*github\.base_ref\s*\}\}", base_ref, text)


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    """The runner's Python: a fresh virtual environment the workflow's install step fills."""
    folder = tmp_path_factory.mktemp("runner")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder / "venv")],
                   check=True)
    # the runner's package cache: pip and shardplan's dependencies are the ones this environment
    # holds (a .pth puts them on the runner's path, after its own site-packages), so the install
    # step builds and installs the checkout for real but downloads no ortools, matplotlib, ...
    purelib = subprocess.run([str(folder / "venv" / "bin" / "python"), "-c",
                              "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             check=True, capture_output=True, text=True).stdout.strip()
    ours = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    (Path(purelib) / "shardplan-test-deps.pth").write_text("\n".join(ours) + "\n")
    return folder / "venv" / "bin"


INSTALL = "Install shardplan from its repository"


def _run_workflow(repo: Path, runner: Path, base_ref: str, *, stop_at: str | None = None,
                  installed: bool = False):
    """Run the job's ``run:`` steps in order; return [(name, CompletedProcess)].
    ``installed``: the runner already holds the install step's result (the first run's)."""
    workflow = yaml.safe_load(WORKFLOW.read_text())
    job = workflow["jobs"]["check-plan"]
    inputs = _inputs()
    env = {**os.environ, **{k: _expand(str(v), inputs, base_ref) for k, v in job["env"].items()},
           "PATH": f"{runner}{os.pathsep}{os.environ['PATH']}", "VIRTUAL_ENV": str(runner.parent)}
    env.pop("PYTHONPATH", None)
    results, failed = [], False
    for step in job["steps"]:
        if "run" not in step:
            continue
        if failed and "always()" not in str(step.get("if", "")):
            continue
        if stop_at and step.get("name") == stop_at:
            break
        if installed and step.get("name") == INSTALL:
            continue
        done = subprocess.run([BASH, "-e", "-c", _expand(step["run"], inputs, base_ref)],
                              cwd=repo, env=env, capture_output=True, text=True, timeout=900)
        results.append((step.get("name", ""), done))
        failed = failed or done.returncode != 0
    return results


@pytest.fixture(scope="module")
def actions_repo(tmp_path_factory, runner):
    import _pytest.monkeypatch

    patch = _pytest.monkeypatch.MonkeyPatch()
    repo = _project(tmp_path_factory.mktemp("actions"), patch)
    git(repo, "update-ref", "refs/remotes/origin/main", "HEAD")  # the pull request's base
    # the checkout of shardplan: this repository's files, as actions/checkout lays them out
    files = git(ROOT, "ls-files", "--cached", "--others", "--exclude-standard").splitlines()
    for name in files:
        source = ROOT / name
        if source.is_file():
            target = repo / ".shardplan-src" / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    (repo / ".git" / "info" / "exclude").write_text(".shardplan-src/\n")
    # the pull request changes the plan: a new one with another micro-batch
    write(build_plan(model="configs/model.json", cluster="configs/cluster.yaml", zero=1,
                     micro_batch=2), repo / "plan.json")
    install = next(s for s in yaml.safe_load(WORKFLOW.read_text())["jobs"]["check-plan"]["steps"]
                   if s.get("name", "").startswith("Install shardplan"))
    assert "./.shardplan-src" in install["run"] and "shardplan==" not in install["run"]
    yield repo
    patch.undo()


@pytest.fixture(scope="module")
def first_run(actions_repo, runner):
    """The whole workflow once, its install step included (the slow part: pip builds and
    installs the checkout into the runner's fresh venv)."""
    return _run_workflow(actions_repo, runner, base_ref="main")


def test_workflow_runs_as_written(actions_repo, runner, first_run):
    results = first_run
    assert INSTALL in [name for name, _ in results]
    for name, done in results:
        assert done.returncode == 0, (name, done.stdout[-2000:], done.stderr[-3000:])
    assert (runner / "shardplan").exists()  # installed from the checkout, not an index
    report = json.loads((actions_repo / "check-report.json").read_text())
    assert report["ok"] and not report["stale"]
    assert (actions_repo / "plan-report.html").read_text().startswith("<!DOCTYPE html>")
    diff = json.loads((actions_repo / "plan-diff.json").read_text())
    assert diff["degrees"]["micro_batch"] == {"a": 1, "b": 2, "delta": 1}
    args = parse_args_file((actions_repo / "megatron-args.sh").read_text())
    assert args[args.index("--micro-batch-size") + 1] == "2"


def test_workflow_fails_when_the_cluster_shrinks(actions_repo, runner, first_run):
    cluster = actions_repo / "configs" / "cluster.yaml"
    original = cluster.read_text()
    cluster.write_text(original.replace("gpu: tiny-gpu",
                                        "gpu: tiny-gpu\ngpu_overrides: {memory_gib: 0.05}"))
    try:
        # the same runner, shardplan installed by the first run: every other step again
        results = dict(_run_workflow(actions_repo, runner, base_ref="main", installed=True))
    finally:
        cluster.write_text(original)
    gate = results["Check the plan still fits"]
    assert gate.returncode == 1, gate.stderr
    said = " ".join(gate.stderr.split())
    assert "cluster: tiny (configs/cluster.yaml): stale" in said and "problem (memory)" in said
    assert "Export the Megatron-LM arguments the training job sources" not in results
    assert results["Keep the check report"].returncode == 0  # if: always()
    report = json.loads((actions_repo / "check-report.json").read_text())
    assert report["fits"] is False and report["stale"]


# -- pre-commit --------------------------------------------------------------------------------

def test_hook_manifest_and_docs_config_are_valid():
    clientlib = pytest.importorskip("pre_commit.clientlib")
    hooks = clientlib.load_manifest(str(HOOKS))
    assert {h["id"] for h in hooks} == {"shardplan-check", "shardplan-check-system"}
    for hook in hooks:
        assert hook["entry"] == "shardplan check" and hook["pass_filenames"] is False
    config_path = ROOT / "docs" / ".ci-example-pre-commit.yaml"
    try:
        config_path.write_text(yaml.safe_dump(example("pre-commit")))
        config = clientlib.load_config(str(config_path))
    finally:
        config_path.unlink(missing_ok=True)
    hook = config["repos"][0]["hooks"][0]
    assert hook["id"] in {h["id"] for h in hooks}
    assert re.search(hook["files"], "plan.json") and re.search(hook["files"], "configs/model.json")


def test_pre_commit_runs_the_hook(tmp_path, monkeypatch):
    pytest.importorskip("pre_commit")
    try:
        rev = git(ROOT, "rev-parse", "HEAD")
        git(ROOT, "cat-file", "-e", f"{rev}:.pre-commit-hooks.yaml")
    except subprocess.CalledProcessError:
        pytest.skip("this checkout's HEAD has no .pre-commit-hooks.yaml committed")
    repo = _project(tmp_path / "project", monkeypatch)
    docs_hook = example("pre-commit")["repos"][0]["hooks"][0]
    config = {"repos": [{"repo": str(ROOT), "rev": rev, "hooks": [
        {**docs_hook, "id": "shardplan-check-system"}]}]}
    (repo / ".pre-commit-config.yaml").write_text(yaml.safe_dump(config))
    git(repo, "add", ".pre-commit-config.yaml")
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "cache"),
           "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}

    def pre_commit() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pre_commit", "run", "--all-files"],
                              cwd=repo, env=env, capture_output=True, text=True, timeout=300)

    done = pre_commit()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "shardplan check (installed shardplan)" in done.stdout and "Passed" in done.stdout
    model = repo / "configs" / "model.json"
    data = json.loads(model.read_text())
    data["ffn_hidden_size"] *= 2  # a configuration change the plan was not made for
    model.write_text(json.dumps(data))
    done = pre_commit()
    assert done.returncode == 1 and "Failed" in done.stdout and "stale" in done.stdout
