"""One quoting layer per export format: every string an exporter writes goes through here.

A plan's text fields (model, cluster and GPU names, runtime labels) come from users' files and
may hold anything: newlines, quotes, ``$(...)``, brackets, control characters. Each format
gets one function per place a string can appear, and each either quotes the string so the
format's own parser reads back exactly that string, or refuses it:

* shell (Megatron / torchtitan argument arrays, vLLM arguments): :func:`shell_word` for a word
  (``shlex.quote``: single quotes, which bash never expands), :func:`comment` for text after
  ``#`` (a comment ends at the line break, so line breaks and every other control character
  are written as visible ``\\uXXXX`` escapes).
* TOML (torchtitan <= 0.2.2): :func:`toml_string` (a basic string with TOML's escapes; TOML
  has no surrogates, so a non-BMP character is written as ``\\UXXXXXXXX``), :func:`toml_key`
  (a bare key, refused otherwise), :func:`comment`.
* JSON (DeepSpeed, the plan itself): :func:`json_text` (``json.dumps``: ASCII-only, so no
  raw control or separator character reaches the file).

Strings that are no text at all (lone surrogates, which no UTF-8 file can hold) are refused
with :func:`planner.errors.invalid` (exit code 2), naming the field.
"""
from __future__ import annotations

import json
import re
import shlex
import unicodedata
from typing import Any

from planner.errors import invalid

# characters that end or bend a line in some reader: C0/C1 controls, DEL, U+2028/2029, and the
# other format/separator categories (bidi overrides make a comment display as something else)
_UNSAFE_CATEGORIES = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}


def _check_text(value: str, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what}: expected a string, got {type(value).__name__}")
    for ch in value:
        if 0xD800 <= ord(ch) <= 0xDFFF:
            raise invalid(f"{what} holds a lone surrogate (U+{ord(ch):04X}), which no file "
                          f"can store as text; not exporting it")
    return value


def _escape_unsafe(value: str) -> str:
    out = []
    for ch in value:
        if unicodedata.category(ch) in _UNSAFE_CATEGORIES and ch != " ":
            code = ord(ch)
            out.append(f"\\u{code:04X}" if code <= 0xFFFF else f"\\U{code:08X}")
        else:
            out.append(ch)
    return "".join(out)


def comment(value: str, what: str = "text") -> str:
    """``value`` made safe to follow ``#`` on one line of a shell or TOML file: every
    character that could end the line (or is invisible) becomes a visible escape."""
    return _escape_unsafe(_check_text(value, what))


def shell_word(value: Any, what: str = "argument") -> str:
    """One shell word that bash (and :func:`shlex.split`) reads back as exactly ``value``."""
    if isinstance(value, bool):
        value = "true" if value else "false"
    elif not isinstance(value, str):
        value = str(value)
    _check_text(value, what)
    if "\x00" in value:
        raise invalid(f"{what} holds a NUL character, which no shell argument can carry")
    return shlex.quote(value)


def toml_string(value: str, what: str = "string") -> str:
    """A TOML basic string that ``tomllib`` reads back as exactly ``value``."""
    _check_text(value, what)
    out = ['"']
    for ch in value:
        code = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch in "\b\t\n\f\r":
            out.append({"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}[ch])
        elif code < 0x20 or code == 0x7F or unicodedata.category(ch) in _UNSAFE_CATEGORIES:
            out.append(f"\\u{code:04X}" if code <= 0xFFFF else f"\\U{code:08X}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def toml_key(value: str) -> str:
    """A TOML bare key; exporters write only their own key names, so anything else is a bug."""
    if not _BARE_KEY.match(value):
        raise ValueError(f"not a TOML bare key: {value!r}")
    return value


def toml_value(value: Any, what: str = "value") -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise invalid(f"{what} is not a finite number: {value!r}")
        return repr(value)
    if isinstance(value, str):
        return toml_string(value, what)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v, what) for v in value) + "]"
    raise TypeError(f"no TOML form for {type(value).__name__}")


def check_strings(item: Any, where: str = "$") -> None:
    """Refuse (exit 2) any string in a JSON-like value that no file can hold as text."""
    if isinstance(item, str):
        _check_text(item, where)
    elif isinstance(item, dict):
        for key, sub in item.items():
            check_strings(key, where)
            check_strings(sub, f"{where}.{key}")
    elif isinstance(item, (list, tuple)):
        for sub in item:
            check_strings(sub, where)


def json_text(value: Any, *, indent: int | None = 2) -> str:
    """JSON text (sorted keys, ASCII only, finite numbers) that ``json.loads`` reads back."""
    check_strings(value)
    try:
        return json.dumps(value, indent=indent, sort_keys=True, allow_nan=False,
                          ensure_ascii=True)
    except ValueError as error:  # NaN / inf
        raise invalid(f"a number in the export is not finite: {error}") from None


def bash_array_file(comments: list[str], name: str, rows: list[tuple[Any, ...]]) -> str:
    """A bash file defining array ``name``: ``comments`` as ``#`` lines (made safe with
    :func:`comment`), then one row of shell-quoted words per line."""
    if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
        raise ValueError(f"not a shell variable name: {name!r}")
    lines = ["# " + comment(line) if line else "#" for line in comments]
    lines.append(f"{name}=(")
    for row in rows:
        lines.append("  " + " ".join(shell_word(word) for word in row))
    lines.append(")")
    return "\n".join(lines) + "\n"


def parse_bash_array_file(text: str, name: str) -> list[str]:
    """The words of an array file written by :func:`bash_array_file` (shlex, comments
    dropped): what ``source FILE; "${NAME[@]}"`` expands to."""
    tokens = shlex.split(text, comments=True)
    if not tokens or tokens[0] != f"{name}=(" or tokens[-1] != ")":
        raise ValueError(f"not a {name} file")
    return tokens[1:-1]
