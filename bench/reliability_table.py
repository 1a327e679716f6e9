"""Run the bad-input catalogue (``tests/reliability_cases.py``) and the process cases below
(signals, pipes, full and closed stdout, debug switches; each in a child process) and write their
real answers into ``docs/reliability.md``::

    python bench/reliability_table.py               # print the tables
    python bench/reliability_table.py --write-doc   # also rewrite the sections in the doc
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from reliability_cases import CASES, make_inputs, run_cli  # noqa: E402

import signal  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

DOC = ROOT / "docs" / "reliability.md"
BEGIN, END = "<!-- BEGIN bad-input table (bench/reliability_table.py) -->", \
    "<!-- END bad-input table -->"
PBEGIN, PEND = "<!-- BEGIN process table (bench/reliability_table.py) -->", \
    "<!-- END process table -->"
SMALL_PLAN = ["plan", "-m", "tiny", "-c", "small-cluster.yaml", "--global-batch", "8"]
LONG_PLAN = ["plan", "-m", "gpt3-175b", "-c", "dgx-a100-80g", "--nodes", "128",
             "--global-batch", "1536"]
TRIP = """
import os, signal, sys
import cli.entry
class Trip:
    def find_spec(self, name, path=None, target=None):
        if name == "rich.console":
            os.kill(os.getpid(), signal.SIGINT)
sys.meta_path.insert(0, Trip())
sys.argv = ["shardplan", "models"]
cli.entry.main()
"""


def _env(**extra: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), **extra)
    if "SHARDPLAN_DEBUG" not in extra:
        env.pop("SHARDPLAN_DEBUG", None)
    return env


def _shardplan(argv, **kwargs) -> list[str]:
    return [sys.executable, "-m", "cli.entry", *argv]


def _files(folder: Path) -> str:
    names = sorted(p.name for p in folder.iterdir())
    if names != ["plan.json"]:
        return "files: " + ", ".join(names)
    text = (folder / "plan.json").read_text()
    return "old plan.json intact" if text == "old\n" else "plan.json is a new plan"


def _signal_case(folder: Path, signum: int, after_s: float) -> tuple[int, str, str]:
    out = folder / f"signal-{signum}-{after_s}"
    out.mkdir()
    (out / "plan.json").write_text("old\n")
    proc = subprocess.Popen(_shardplan([*LONG_PLAN, "-o", str(out / "plan.json"), "--force"]),
                            cwd=folder, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    time.sleep(after_s)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err, _files(out)


def _run(folder: Path, argv, *, env=None, stdout=None, shell_pipe=False,
         preexec=None) -> tuple[int, str, str]:
    if shell_pipe:  # `... 2>&1 | head -1`
        proc = subprocess.Popen(_shardplan(argv), cwd=folder, env=env or _env(),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        first = proc.stdout.readline().decode(errors="replace").strip()
        proc.stdout.close()
        return proc.wait(timeout=120), "", f"head -1 saw: {first[:60]}"
    done = subprocess.run(_shardplan(argv), cwd=folder, env=env or _env(), stdout=stdout,
                          stderr=subprocess.PIPE, text=True, timeout=120, preexec_fn=preexec)
    return done.returncode, done.stderr, ""


def process_cases(folder: Path):
    """(class, what, command as a user types it, runner) for the process table."""
    full = open(os.devnull if not os.path.exists("/dev/full") else "/dev/full", "w")
    yield ("signals", "Ctrl-C during the search (over an existing -o file)",
           "shardplan plan ... -o plan.json --force; Ctrl-C after 4 s",
           lambda: _signal_case(folder, signal.SIGINT, 4.0))
    yield ("signals", "SIGTERM during the search", "kill -TERM after 4 s",
           lambda: _signal_case(folder, signal.SIGTERM, 4.0))
    yield ("signals", "SIGTERM at start-up", "kill -TERM after 0.3 s",
           lambda: _signal_case(folder, signal.SIGTERM, 0.3))
    yield ("signals", "Ctrl-C while the imports run (inside the guarded main)",
           "Ctrl-C while rich is being imported",
           lambda: (lambda d: (d.returncode, d.stderr, ""))(subprocess.run(
               [sys.executable, "-c", TRIP], cwd=folder, env=_env(), capture_output=True,
               text=True, timeout=120)))
    yield ("stdout", "full stdout", "shardplan plan ... --json > /dev/full",
           lambda: _run(folder, [*SMALL_PLAN, "--json"], stdout=full))
    yield ("stdout", "full stdout", "shardplan schema > /dev/full",
           lambda: _run(folder, ["schema"], stdout=full))
    yield ("stdout", "full stdout", "shardplan export plan-small.json -f megatron > /dev/full",
           lambda: _run(folder, ["export", "plan-small.json", "-f", "megatron"], stdout=full))
    yield ("stdout", "closed stdout", "shardplan schema >&-",
           lambda: _run(folder, ["schema"], stdout=subprocess.PIPE,
                        preexec=lambda: os.close(1)))
    yield ("stdout", "a reader that leaves early (success)", "shardplan plan ... 2>&1 | head -1",
           lambda: _run(folder, SMALL_PLAN, shell_pipe=True))
    yield ("stdout", "a reader that leaves early (invalid input)",
           "shardplan inspect -m nope 2>&1 | head -1",
           lambda: _run(folder, ["inspect", "-m", "nope"], shell_pipe=True))
    yield ("debug", "`--debug` adds the traceback only",
           "shardplan --debug inspect -m model-empty.yaml",
           lambda: _run(folder, ["--debug", "inspect", "-m", "model-empty.yaml"],
                        stdout=subprocess.DEVNULL))
    yield ("debug", "`SHARDPLAN_DEBUG=2` is on, not a usage error",
           "SHARDPLAN_DEBUG=2 shardplan models --json",
           lambda: _run(folder, ["models", "--json"], env=_env(SHARDPLAN_DEBUG="2"),
                        stdout=subprocess.DEVNULL))


def process_table(folder: Path) -> str:
    rows = ["| class | case | command | exit | stderr (last line) | files / note |",
            "|---|---|---|---|---|---|"]
    for group, what, command, runner in process_cases(folder):
        code, err, note = runner()
        lines = [x for x in err.strip().splitlines() if x.strip()]
        shown = next((x for x in lines if x.startswith("error:")), lines[-1] if lines else "")
        if "Traceback" in err:
            shown = (f"(the traceback, then) {shown}" if shown.startswith("error:")
                     else f"TRACEBACK: {shown}")
        cell = shown.replace(str(folder), "SCRATCH").replace("|", "\\|")  # no machine paths
        command = command.replace("|", "\\|")
        rows.append(f"| {group} | {what} | `{command}` | {code} | "
                    f"{f'<code>{cell}</code>' if cell else '(nothing)'} | {note} |")
    return "\n".join(rows) + "\n"


def _cell(text: str) -> str:
    """stderr as one table cell: rich's soft wraps undone, click's usage banner left out."""
    lines: list[str] = []
    for line in text.strip().splitlines():
        if not line.strip() or line.startswith(("Usage:", "Try '")):
            continue
        if lines and not line.lstrip().startswith(("error:", "hint:", "Error:", "warning:")):
            lines[-1] += " " + line.strip()  # a continuation of a wrapped line
        else:
            lines.append(line.strip())
    body = "<br>".join(lines).replace("|", "\\|")
    return f"<code>{body}</code>" if body else "(plan printed)"


def table(folder: Path) -> str:
    """Run every case in ``folder`` (its working directory) and render the Markdown table."""
    rows = ["| class | input | command | exit | what the user sees (stderr) |",
            "|---|---|---|---|---|"]
    previous = os.getcwd()
    os.chdir(folder)
    try:
        for case in CASES:
            code, out, err = run_cli(case.argv)
            if case.code == 0:
                message = "accepted"
            else:
                message = _cell(err)
            mark = f" (expected {case.code}; known bug)" if code != case.code else ""
            command = "shardplan " + " ".join(case.argv)
            if len(command) > 90:
                command = command[:87] + "..."
            rows.append(f"| {case.group} | {case.what} | `{command}` | {code}{mark} | "
                        f"{message} |")
    finally:
        os.chdir(previous)
    return "\n".join(rows) + "\n"


def replace_section(text: str, begin: str, end: str, body: str) -> str:
    """``text`` with the part between the ``begin`` and ``end`` markers replaced by ``body``."""
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        return f"{head}{begin}\n{body}{end}{tail}"
    return f"{text.rstrip()}\n\n{begin}\n{body}{end}\n"


def write_section(begin: str, end: str, body: str) -> None:
    """Rewrite the marked section of docs/reliability.md (the file is created if missing)."""
    text = DOC.read_text(encoding="utf-8") if DOC.exists() else ""
    DOC.write_text(replace_section(text, begin, end, body), encoding="utf-8")
    print(f"wrote {DOC.relative_to(ROOT)}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write-doc", action="store_true",
                        help=f"rewrite the bad-input section of {DOC.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="shardplan-reliability-") as scratch:
        folder = make_inputs(Path(scratch))
        body = table(folder)
        processes = process_table(folder)
    print(body)
    print(processes)
    if args.write_doc:
        write_section(BEGIN, END, body)
        write_section(PBEGIN, PEND, processes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
