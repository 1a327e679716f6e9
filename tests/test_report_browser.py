"""The report page in a real headless browser (Debian's chromium, installed by ``.ci/run``):
it loads with no console message at all (no error, no failed resource), and the screenshot
has the window's size and shows the figures (not a blank page)."""
from __future__ import annotations

import io
import shutil
import subprocess

import pytest

from planner.plan_types import Plan
from conftest import build_plan

pytest.importorskip("matplotlib", reason="report needs the 'report' extra")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (.ci/run "
                                                         "installs Debian's chromium package)")
WIDTH, HEIGHT = 1200, 2200


def _shoot(page_path, shot_path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--no-first-run", "--disable-extensions", f"--user-data-dir={shot_path.parent / 'ud'}",
         f"--window-size={WIDTH},{HEIGHT}", "--enable-logging=stderr", "--v=0",
         f"--screenshot={shot_path}", page_path.as_uri()],
        capture_output=True, text=True, timeout=120)


def test_page_loads_cleanly_in_chromium(tmp_path):
    from PIL import Image

    from planner.plan_figures import COLOURS
    from planner.plan_page import page

    plan = Plan.from_dict(build_plan(tp=2, pp=2, global_batch=16,
                                     block_recompute=["full", "none", "selective", "none"]))
    html = tmp_path / "plan.html"
    html.write_text(page(plan), encoding="utf-8")
    shot = tmp_path / "shot.png"
    done = _shoot(html, shot)
    assert shot.exists(), done.stderr[-2000:]
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    assert console == []
    image = Image.open(io.BytesIO(shot.read_bytes())).convert("RGB")
    assert image.size == (WIDTH, HEIGHT)
    colours = {tuple(int(COLOURS[k][i:i + 2], 16) for i in (1, 3, 5)) for k in
               ("forward", "backward")}
    pixels = image.resize((WIDTH // 4, HEIGHT // 4)).tobytes()
    seen = sum(1 for i in range(0, len(pixels), 3) if tuple(pixels[i:i + 3]) in colours)
    assert seen > 100  # the timeline was drawn


def test_console_errors_are_caught(tmp_path):
    """The check above can fail: a page with a script error is reported."""
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><script>undefined_function();</script></body></html>")
    done = _shoot(bad, tmp_path / "bad.png")
    assert any(":CONSOLE" in line and "undefined_function" in line
               for line in done.stderr.splitlines())
