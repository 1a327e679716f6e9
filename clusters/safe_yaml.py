"""Read a cluster YAML file into plain Python data, safely (rules in planner.safe_input)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from planner.errors import invalid
from planner.safe_input import MAX_FILE_BYTES, parse_yaml, read_text

__all__ = ["MAX_FILE_BYTES", "read_yaml_file", "parse_yaml"]


def read_yaml_file(path: Path, what: str = "cluster file") -> Any:
    """Parse the YAML document in ``path``; ``what`` names the file's role in messages."""
    text = read_text(path, what, missing_hint="Check the path, or pass a preset name "
                                              "(listed in docs/clusters.md).")
    data = parse_yaml(text, str(path)) if text.strip() else None
    if data is None:
        raise invalid(f"{what} {path} is empty (no YAML document, or only comments)",
                      "Start from a preset: see docs/clusters.md for the schema.", file=str(path))
    return data
