"""Run the bad-input catalogue (``tests/reliability_cases.py``) and the process cases
(``tests/reliability_process.py``: signals, pipes, full disks, output paths) and write their real
answers into ``docs/reliability.md``::

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

DOC = ROOT / "docs" / "reliability.md"
BEGIN, END = "<!-- BEGIN bad-input table (bench/reliability_table.py) -->", \
    "<!-- END bad-input table -->"


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
        body = table(make_inputs(Path(scratch)))
    print(body)
    if args.write_doc:
        write_section(BEGIN, END, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
