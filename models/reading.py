"""Read a model description file into a plain mapping, safely.

Consumes: a path to a JSON or YAML file (an HF ``config.json`` or a native model file).
Produces: the top-level mapping (``dict``), or a :class:`PlannerError` of kind INVALID_INPUT
naming the file and what is wrong with it. No raw parser or OS exception escapes.

Safety rules, because model files come from users and the internet:

* files over :data:`MAX_FILE_BYTES` are refused before they are read in full;
* YAML goes through a :class:`yaml.SafeLoader` subclass only (no Python object tags);
* duplicate mapping keys are an error in both JSON and YAML (the last one silently winning is
  how a typo'd override goes unnoticed);
* YAML anchors/aliases are allowed, but a document whose alias-expanded size exceeds
  :data:`MAX_YAML_NODES` (a "billion laughs" bomb) or that refers to itself is refused;
* deeply nested input that would exhaust the recursion limit is refused.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from planner.errors import invalid

MAX_FILE_BYTES = 16 * 1024 * 1024
MAX_YAML_NODES = 100_000

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
        data = parse_json(text, str(path))
    else:
        data = parse_yaml(text, str(path))
    if not isinstance(data, dict):
        raise invalid(f"model file {path} must hold a mapping (key: value pairs) at the top level, "
                      f"found {_kind(data)}")
    return data


def _read_text(path: Path) -> str:
    try:
        if not path.exists():
            raise invalid(f"model file not found: {path}",
                          "Check the path, or pass a preset name (`shardplan models` lists them).")
        if path.is_dir():
            hint = (f"Did you mean {path / 'config.json'}?" if (path / "config.json").is_file()
                    else "Pass the config.json file inside the model directory.")
            raise invalid(f"{path} is a directory, not a model file", hint)
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise invalid(f"model file {path} is {size:,} bytes; model files are limited to "
                          f"{MAX_FILE_BYTES // (1024 * 1024)} MiB", size=size, limit=MAX_FILE_BYTES)
        with path.open("rb") as handle:
            raw = handle.read(MAX_FILE_BYTES + 1)
    except (OSError, ValueError) as exc:  # ValueError: embedded NUL byte in the path
        raise invalid(f"cannot read model file {path}: {exc}") from None
    if len(raw) > MAX_FILE_BYTES:  # grew between stat and read, or a device file
        raise invalid(f"model file {path} is larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise invalid(f"model file {path} is not UTF-8 text (byte {exc.start}): is it a binary "
                      f"file such as a checkpoint?",
                      "Pass the model's config.json, not its weights.") from None


# -- JSON ------------------------------------------------------------------------------------

def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(key)
        result[key] = value
    return result


class _DuplicateKey(Exception):
    def __init__(self, key: Any) -> None:
        super().__init__(key)
        self.key = key


def parse_json(text: str, where: str) -> Any:
    """Parse JSON text, rejecting duplicate keys."""
    try:
        return json.loads(text, object_pairs_hook=_unique_pairs)
    except _DuplicateKey as exc:
        raise invalid(f"{where}: duplicate key {exc.key!r}; each key may appear once") from None
    except json.JSONDecodeError as exc:
        raise invalid(f"{where}: malformed JSON at line {exc.lineno}, column {exc.colno}: "
                      f"{exc.msg}") from None
    except RecursionError:
        raise invalid(f"{where}: JSON is nested too deeply") from None
    except ValueError as exc:  # e.g. an integer literal too long to convert
        raise invalid(f"{where}: malformed JSON: {exc}") from None


# -- YAML ------------------------------------------------------------------------------------

class StrictSafeLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that rejects duplicate keys and alias bombs."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *base` merges are meant to be overridden
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:  # unhashable key; the base class reports it
                break
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}; each key may appear once",
                    key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def construct_document(self, node: yaml.Node) -> Any:
        _check_expanded_size(node)
        return super().construct_document(node)


def _check_expanded_size(root: yaml.Node) -> None:
    """Refuse documents whose alias-expanded node count exceeds MAX_YAML_NODES, or cycles.

    Sizes are memoised per node, so this is linear in the number of *distinct* nodes even
    when aliases multiply the expanded size exponentially.
    """
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            on_path.discard(key)
            total = 1 + sum(sizes[id(child)] for child in _children(node))
            if total > MAX_YAML_NODES:
                raise _YamlTooLarge()
            sizes[key] = total
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise _YamlCycle()
        on_path.add(key)
        stack.append((node, True))
        for child in _children(node):
            if id(child) in on_path:
                raise _YamlCycle()
            if id(child) not in sizes:
                stack.append((child, False))


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


class _YamlTooLarge(Exception):
    pass


class _YamlCycle(Exception):
    pass


def parse_yaml(text: str, where: str) -> Any:
    """Parse one YAML document with :class:`StrictSafeLoader`."""
    try:
        return yaml.load(text, Loader=StrictSafeLoader)  # noqa: S506 - a SafeLoader subclass
    except _YamlTooLarge:
        raise invalid(f"{where}: YAML expands to more than {MAX_YAML_NODES:,} nodes through "
                      f"anchors and aliases; refusing it") from None
    except _YamlCycle:
        raise invalid(f"{where}: YAML refers to itself through an alias; refusing it") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        place = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = exc.problem or exc.context or "syntax error"
        lines = text.splitlines()
        bad_line = lines[mark.line] if mark and mark.line < len(lines) else ""
        hint = ("YAML does not allow tab characters for indentation; use spaces."
                if "\t" in bad_line or "tab" in str(what).lower() else None)
        raise invalid(f"{where}: malformed YAML{place}: {what}", *([hint] if hint else [])) \
            from None
    except yaml.YAMLError as exc:
        raise invalid(f"{where}: malformed YAML: {exc}") from None
    except RecursionError:
        raise invalid(f"{where}: YAML is nested too deeply") from None
    except ValueError as exc:  # e.g. an out-of-range timestamp
        raise invalid(f"{where}: malformed YAML value: {exc}") from None


def _kind(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, list):
        return "a list"
    return f"a {type(value).__name__} ({_short(value)})"


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
