"""``shardplan report`` without its optional extra (matplotlib): a clear error naming the extra
and exit 2, never an internal error. Before, the page's ``rc_context`` imported matplotlib
ahead of the guarded import and the command exited 4 with "internal error:
ModuleNotFoundError" on a plain ``pip install -e .``."""
from __future__ import annotations

import json
import sys

from conftest import build_plan, run_cli


def test_report_without_matplotlib_names_the_extra(tmp_path, capsys, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(build_plan(tp=1, pp=1, global_batch=16)))
    for fmt in ("html", "svg"):
        code, out, err = run_cli(["report", str(path), "-o", tmp_path / f"plan.{fmt}"], capsys)
        assert code == 2, err
        assert "matplotlib, which is not installed" in err and "shardplan[report]" in err
        assert "internal error" not in err and not (tmp_path / f"plan.{fmt}").exists()
