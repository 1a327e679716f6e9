"""Read user files (model configs, cluster files, plan files) safely into plain data.

Consumes a path or text plus a label naming where it came from; produces parsed JSON / YAML
(``dict`` / ``list`` / scalars) or a :class:`~planner.errors.PlannerError` of kind INVALID_INPUT
naming the file and, for syntax errors, the line and column. No ``json`` / ``yaml`` /
``OSError`` / ``UnicodeDecodeError`` / ``RecursionError`` escapes. One reader for every input
the tool takes, so every input gets the same protections:

* files over a size cap (:data:`MAX_FILE_BYTES`, 16 MiB by default) are refused before being
  read in full; missing files, directories, empty and binary files (NUL bytes, not UTF-8) too;
* duplicate keys are an error in JSON and YAML (the last one silently winning is how a typo'd
  override goes unnoticed); JSON's non-standard NaN / Infinity are refused;
* YAML goes through a :class:`yaml.SafeLoader` subclass (no Python object tags, nothing is ever
  executed); documents with more than :data:`MAX_YAML_EVENTS` parser events are refused while
  streaming, alias-expanded sizes over :data:`MAX_YAML_NODES` ("billion laughs") and
  self-referencing documents before construction, and flow nesting deeper than
  :data:`MAX_FLOW_DEPTH` before parsing (PyYAML's scanner is quadratic in it).
"""
from __future__ import annotations

import codecs
import errno
import json
import math
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from planner.errors import PlannerError, invalid

MAX_FILE_BYTES = 16 * 1024 * 1024
MAX_YAML_NODES = 100_000
MAX_YAML_EVENTS = 20_000
MAX_FLOW_DEPTH = 64


def _stat(path: Path, what: str, missing_hint: str | None) -> os.stat_result:
    """``os.stat`` with every way of failing said as what it is."""
    hints = (missing_hint,) if missing_hint else ()
    try:
        return os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise invalid(f"{what} {path} is a symbolic link to a missing file "
                          f"({os.readlink(path)})", file=str(path)) from None
        raise invalid(f"{what} not found: {path}", *hints, file=str(path)) from None
    except NotADirectoryError:
        raise invalid(f"{what} not found: {path} (a part of the path is a file, not a folder)",
                      *hints, file=str(path)) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise invalid(f"{what} {path}: too many levels of symbolic links (a symlink loop)",
                          file=str(path)) from None
        raise invalid(f"cannot read {what} {path}: {exc.strerror or exc}",
                      file=str(path)) from None


# Byte-order marks of the encodings a Windows editor saves "Unicode" text in.
_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),
         (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))


def _decode(raw: bytes, path: Path, what: str, binary_hint: str | None) -> str:
    """UTF-8 (with or without BOM), or UTF-16/32 with a BOM; a clear message otherwise."""
    hints = (binary_hint,) if binary_hint else ()
    for bom, encoding in _BOMS:  # UTF-32-LE's BOM starts with UTF-16-LE's: longest first
        if raw.startswith(bom):
            try:
                return raw.decode(encoding)
            except UnicodeDecodeError as exc:
                raise invalid(f"{what} {path} is not UTF-8 text, nor valid {encoding.upper()} "
                              f"although it starts with a {encoding.upper()} byte-order mark "
                              f"(bad bytes at offset {exc.start})", file=str(path)) from None
    if b"\x00" in raw:
        sample = raw[:4096]
        odd, even = sample[1::2], sample[0::2]
        if sample and (odd.count(0) > 0.4 * len(odd) or even.count(0) > 0.4 * len(even)):
            raise invalid(f"{what} {path} looks like UTF-16 text without a byte-order mark",
                          "save it as UTF-8 (or as UTF-16 with a BOM)", file=str(path))
        raise invalid(f"{what} {path} is a binary file (it contains NUL bytes), not UTF-8 text",
                      *hints, file=str(path))
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise invalid(f"{what} {path} is not UTF-8 text (bad byte at offset {exc.start})",
                      *hints, file=str(path)) from None


def read_text(path: Path, what: str, *, max_bytes: int = MAX_FILE_BYTES,
              missing_hint: str | None = None, directory_hint: str | None = None,
              binary_hint: str | None = None) -> str:
    """The text of ``path`` (UTF-8, or UTF-16/32 with a BOM); ``what`` names the file's role."""
    path = Path(path)
    hints = lambda hint: (hint,) if hint else ()  # noqa: E731
    try:
        info = _stat(path, what, missing_hint)
        if stat.S_ISDIR(info.st_mode):
            raise invalid(f"{path} is a directory, not a {what}", *hints(directory_hint),
                          file=str(path))
        if not stat.S_ISREG(info.st_mode):  # a FIFO or device would block or never end
            raise invalid(f"{path} is not a regular file (a pipe or device?), not a {what}",
                          file=str(path))
        size = info.st_size
        if size > max_bytes:
            raise invalid(f"{what} {path} is {size:,} bytes; the limit is {max_bytes:,} bytes "
                          f"({max_bytes / 2**20:g} MiB)", file=str(path), size=size)
        with path.open("rb") as handle:
            raw = handle.read(max_bytes + 1)
    except (OSError, ValueError) as exc:  # ValueError: NUL byte in the path name
        raise invalid(f"cannot read {what} {path}: {exc}", file=str(path)) from None
    if len(raw) > max_bytes:  # grew after stat, or a character device
        raise invalid(f"{what} {path} is larger than the {max_bytes:,}-byte limit", file=str(path))
    return _decode(raw, path, what, binary_hint)


# -- text fields -------------------------------------------------------------------------------

# C0 controls, DEL, C1 controls, and the Unicode line/paragraph separators and bidirectional
# overrides: none belongs in a name, and each changes what a shell, a TOML/YAML parser or a
# terminal makes of the text around it.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def control_character(text: str, *, allow_newlines: bool = False) -> str | None:
    """The first control character of ``text`` as ``U+XXXX`` (None if there is none);
    ``allow_newlines`` lets newlines and tabs through (descriptions)."""
    for match in _CONTROL.finditer(text):
        if allow_newlines and match.group() in "\n\t":
            continue
        return f"U+{ord(match.group()):04X}"
    return None


# -- JSON --------------------------------------------------------------------------------------

class _DuplicateKey(Exception):
    def __init__(self, key: Any) -> None:
        super().__init__(key)
        self.key = key


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(key)
        result[key] = value
    return result


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON (numbers must be finite)")


def _finite_float(text: str) -> float:
    """JSON numbers beyond the float range (``1e999``) read as inf in Python: refuse them."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is beyond the range of a float (about 1.8e308)")
    return value


def parse_json(text: str, where: str, *, allow_nan: bool = False) -> Any:
    """Parse JSON text, rejecting duplicate keys and (unless ``allow_nan``: the caller then
    validates every number and names the offending field) NaN / Infinity."""
    try:
        return json.loads(text, object_pairs_hook=_unique_pairs,
                          parse_constant=None if allow_nan else _no_constant,
                          parse_float=float if allow_nan else _finite_float)
    except _DuplicateKey as exc:
        raise invalid(f"{where}: duplicate key {exc.key!r}; each key may appear once") from None
    except json.JSONDecodeError as exc:
        raise invalid(f"{where}: malformed JSON at line {exc.lineno}, column {exc.colno}: "
                      f"{exc.msg}") from None
    except RecursionError:
        raise invalid(f"{where}: JSON is nested too deeply") from None
    except ValueError as exc:  # NaN, or an integer literal too long to convert
        raise invalid(f"{where}: malformed JSON: {exc}") from None


# -- YAML --------------------------------------------------------------------------------------

# libyaml's C parser when PyYAML was built with it: the pure-Python scanner manages well under
# 1 MB/s on token-dense input.
_BaseLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class StrictSafeLoader(_BaseLoader):  # type: ignore[misc, valid-type]
    """``yaml.SafeLoader`` that rejects duplicate keys, alias bombs and self-reference."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *base` entries are meant to be overridden
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:  # unhashable key: the base class reports it
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

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        """YAML 1.2 core-schema integers: decimal, ``0o`` octal, ``0x`` hex (see below)."""
        text = self.construct_scalar(node)
        sign, digits = (-1, text[1:]) if text[:1] == "-" else (1, text.lstrip("+"))
        if digits[:2] in ("0o", "0x"):
            return sign * int(digits[2:], 8 if digits[1] == "o" else 16)
        return sign * int(digits)


# Numbers as YAML 1.2 reads them. PyYAML implements YAML 1.1, whose implicit integers include
# sexagesimal ``1:00`` (= 60: a time or a ratio silently becomes a number), leading-zero octal
# (``010`` = 8), ``0b`` binary and ``1_000``; YAML 1.2 reads ``1:00``, ``0b1`` and ``1_000`` as
# strings (which the schema then refuses as "not an integer") and ``010`` as 10. Floats keep the
# 1.1 rules (a dot or ``.inf``/``.nan``) minus the sexagesimal form (``1:30.5``).
_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
_INT_1_2 = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
_FLOAT_1_2 = re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?
    |\.[0-9_]+(?:[eE][-+][0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""", re.X)
StrictSafeLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_INT_TAG, _FLOAT_TAG)]
    for first, resolvers in _BaseLoader.yaml_implicit_resolvers.items()}
StrictSafeLoader.add_implicit_resolver(_INT_TAG, _INT_1_2, list("-+0123456789"))
StrictSafeLoader.add_implicit_resolver(_FLOAT_TAG, _FLOAT_1_2, list("-+0123456789."))
StrictSafeLoader.add_constructor(_INT_TAG, StrictSafeLoader.construct_yaml_int)


class _TooLarge(Exception):
    pass


class _TooManyEvents(Exception):
    pass


class _Cycle(Exception):
    pass


def _count_events(text: str) -> None:
    """Stream the parser's events and stop at MAX_YAML_EVENTS, before any node is built: a
    large document (many small items) otherwise costs seconds and gigabytes to compose."""
    loader = _BaseLoader(text)
    try:
        count = 0
        while loader.check_event():
            loader.get_event()
            count += 1
            if count > MAX_YAML_EVENTS:
                raise _TooManyEvents()
    finally:
        loader.dispose()


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _check_expanded_size(root: yaml.Node) -> None:
    """Refuse a node graph whose alias-expanded size exceeds MAX_YAML_NODES, or that has a cycle.

    Sizes are memoised per distinct node, so this runs in time linear in the document even when
    aliases make the expanded size exponential.
    """
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            total = 1 + sum(sizes[id(child)] for child in _children(node))
            if total > MAX_YAML_NODES:
                raise _TooLarge()
            sizes[key] = total
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise _Cycle()
        on_path.add(key)
        stack.append((node, True))
        for child in _children(node):
            if id(child) in on_path:
                raise _Cycle()
            if id(child) not in sizes:
                stack.append((child, False))


def _flow_depth_exceeds(text: str, limit: int) -> bool:
    """Whether ``[``/``{`` nest deeper than ``limit`` (quotes and comments roughly skipped).
    Over-counting (a bracket inside a plain scalar) only matters beyond ``limit``, far deeper
    than any input file nests."""
    if text.count("[") + text.count("{") <= limit:
        return False
    depth, quote, comment, previous = 0, "", False, "\n"
    for char in text:
        if comment:
            comment = char != "\n"
        elif quote:
            quote = "" if char == quote else quote
        elif char in "[{":
            depth += 1
            if depth > limit:
                return True
        elif char in "]}":
            depth = max(0, depth - 1)
        elif char in "'\"":
            quote = char
        elif char == "#" and previous in " \t\n":
            comment = True
        previous = char
    return False


def parse_yaml(text: str, where: str) -> Any:
    """Parse one YAML document from ``text``; ``where`` labels messages (a path, a preset)."""
    if _flow_depth_exceeds(text, MAX_FLOW_DEPTH):
        raise invalid(f"{where}: YAML is nested too deeply (more than {MAX_FLOW_DEPTH} levels of "
                      f"[ ] or {{ }})", file=where)
    try:
        _count_events(text)
        return yaml.load(text, Loader=StrictSafeLoader)  # noqa: S506 - a SafeLoader subclass
    except _TooManyEvents:
        raise invalid(f"{where}: YAML holds more than {MAX_YAML_EVENTS:,} elements; a model or "
                      f"cluster description needs far fewer", file=where) from None
    except _TooLarge:
        raise invalid(f"{where}: YAML expands to more than {MAX_YAML_NODES:,} nodes through "
                      f"anchors and aliases; refusing it", file=where) from None
    except _Cycle:
        raise invalid(f"{where}: YAML refers to itself through an alias; refusing it",
                      file=where) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        place = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = exc.problem or exc.context or "syntax error"
        lines = text.splitlines()
        bad_line = lines[mark.line] if mark and mark.line < len(lines) else ""
        hints = []
        if "\t" in bad_line or "tab" in str(what).lower():
            hints.append("YAML does not allow tab characters for indentation; use spaces.")
        raise invalid(f"{where}: malformed YAML{place}: {what}", *hints, file=where,
                      line=(mark.line + 1) if mark else None) from None
    except yaml.YAMLError as exc:
        raise invalid(f"{where}: malformed YAML: {exc}", file=where) from None
    except RecursionError:
        raise invalid(f"{where}: YAML is nested too deeply", file=where) from None
    except (ValueError, OverflowError) as exc:  # e.g. an out-of-range timestamp
        raise invalid(f"{where}: malformed YAML value: {exc}", file=where) from None


def field_error(where: str, path: str, problem: str, *hints: str) -> PlannerError:
    """An INVALID_INPUT error naming the input (``where``) and the field (``path``)."""
    return invalid(f"{where}: {path}: {problem}", *hints, file=where, field=path)


def show(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), f"a {type(value).__name__}")


def number(value: Any, where: str, path: str, *, minimum: float, maximum: float,
           allow_min: bool = False, integer: bool = False) -> float:
    """A finite number in (minimum, maximum] ([minimum, maximum] with ``allow_min``)."""
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise field_error(where, path, f"expected {kind}, got {type_name(value)} {show(value)}")
    if integer and not isinstance(value, int):
        raise field_error(where, path, f"expected an integer, got {show(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise field_error(where, path, f"must be a finite number, got {show(value)}")
    low_ok = value >= minimum if allow_min else value > minimum
    if not low_ok:
        if allow_min and minimum > 0 and value > 0:  # MIN_RATE: positive but absurdly small
            raise field_error(where, path, f"{show(value)} is implausibly small (limit {minimum:g}); "
                                     f"check the unit named in the key")
        if allow_min and minimum > 0:
            bound = "positive"
        elif allow_min:
            bound = f">= {minimum:g}"
        elif integer and minimum == 0:
            bound = ">= 1"
        else:
            bound = "positive" if minimum == 0 else f"> {minimum:g}"
        raise field_error(where, path, f"must be {bound}, got {show(value)}")
    if value > maximum:
        raise field_error(where, path, f"{show(value)} is implausibly large (limit {maximum:g}); "
                                 f"check the unit named in the key")
    return int(value) if integer else float(value)
