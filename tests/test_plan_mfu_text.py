"""The README plan's MFU reads the same in its headline and in its extrapolation note: both are
formatted from the MFU the plan file records (rounded to 6 digits, 0.6525). The note was
formatted from the unrounded value and printed 65.3 % under a 65.2 % headline."""
from __future__ import annotations

import json
import re

from conftest import run_cli


def test_headline_and_note_print_the_recorded_mfu(tmp_path, capsys):
    out = tmp_path / "plan.json"
    code, _, err = run_cli(["plan", "--model", "gpt3-175b", "--cluster", "dgx-a100-80g",
                            "--nodes", "128", "--global-batch", "1536", "-o", out], capsys)
    assert code == 0
    doc = json.loads(out.read_text())
    mfu = doc["predicted"]["mfu"]
    assert mfu == 0.6525  # the README plan; its unrounded MFU formats as 65.3 %
    text = f"{mfu:.1%}"
    notes = [n for n in doc["predicted"]["extrapolating"] if "predicted MFU" in n]
    assert len(notes) == 1 and f"predicted MFU {text} is above" in notes[0]
    printed = re.findall(r"MFU (\d+\.\d%)", err)
    assert printed and set(printed) == {text}, printed  # headline and warning alike
