"""Read a model description file into a plain mapping, safely.

Consumes: a path to a JSON or YAML file (an HF ``config.json`` or a native model file).
Produces: the top-level mapping (``dict``), or a :class:`PlannerError` of kind INVALID_INPUT
naming the file and what is wrong with it. No raw parser or OS exception escapes.

The safety rules (size cap, duplicate keys, safe YAML, alias bombs) live in
:mod:`planner.safe_input`, shared with the cluster and plan readers.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from planner.errors import invalid
from planner.safe_input import MAX_FILE_BYTES, parse_json, parse_yaml, read_text

__all__ = ["MAX_FILE_BYTES", "read_mapping", "parse_json", "parse_yaml"]

YAML_SUFFIXES = (".yaml", ".yml")
JSON_SUFFIXES = (".json",)


def read_mapping(path: Path) -> dict[str, Any]:
    """Parse ``path`` (JSON or YAML by suffix; by content otherwise) into a mapping."""
    text = _read_text(path)
    if not text.strip():
        raise invalid(f"model file {path} is empty", "Pass a Hugging Face config.json or a "
                      "native model file (see docs/models.md).")
    suffix = path.suffix.lower()
    if suffix in YAML_SUFFIXES:
        data = parse_yaml(text, str(path))
    elif suffix in JSON_SUFFIXES or text.lstrip().startswith("{"):
        data = parse_json(text, str(path), allow_nan=True)  # fields.py names a NaN field
    else:
        data = parse_yaml(text, str(path))
    if not isinstance(data, dict):
        raise invalid(f"model file {path} must hold a mapping (key: value pairs) at the top level, "
                      f"found {_kind(data)}")
    return data


def _read_text(path: Path) -> str:
    directory_hint = (f"Did you mean {path / 'config.json'}?" if (path / "config.json").is_file()
                      else "Pass the config.json file inside the model directory.")
    return read_text(path, "model file",
                     missing_hint="Check the path, or pass a preset name (`shardplan models` "
                                  "lists them).",
                     directory_hint=directory_hint,
                     binary_hint="Pass the model's config.json, not its weights.")


def _kind(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, list):
        return "a list"
    return f"a {type(value).__name__} ({_short(value)})"


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
