"""Reading plan files: the one way in for ``check``, ``export`` and ``show``.

Consumes a path; produces the plan document (a dict) after checking it against the JSON Schema
shipped in the package (``planner/plan_schema.json``, draft 2020-12, printed by ``shardplan
schema``). Every failure is a :class:`PlannerError` (INVALID_INPUT, exit code 2), never a
traceback: a missing file, a directory, a file over :data:`MAX_PLAN_BYTES`, bytes that are not
UTF-8, malformed JSON (with line and column), duplicate keys, NaN/Infinity, a document of another
``kind`` or ``schema_version``, and schema violations, each reported with its JSON path
(``$.stages[2].memory_gib.total: -1 is less than the minimum of 0``).

Validation is stricter than plain JSON Schema in one place: an ``integer`` must be a JSON
integer (``8``), not a float with a zero fraction (``8.0``), so that degrees and counts read back
as Python ints.
"""
from __future__ import annotations

import json
import os
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from planner.errors import invalid
from planner.safe_input import control_character, parse_json, read_text
from planner.plan import KIND, POOL_SCHEMA_VERSION, SCHEMA_VERSION

READABLE_VERSIONS = (SCHEMA_VERSION, POOL_SCHEMA_VERSION)

MAX_PLAN_BYTES = 64 * 2**20  # a 400-layer plan with runners-up is well under 1 MiB
MAX_REPORTED_ERRORS = 10


@lru_cache(maxsize=1)
def plan_schema() -> dict[str, Any]:
    """The plan JSON Schema (a fresh parse is cached; callers must not mutate it)."""
    text = resources.files("planner").joinpath("plan_schema.json").read_text(encoding="utf-8")
    return json.loads(text)


def schema_text() -> str:
    return json.dumps(plan_schema(), indent=2) + "\n"


def read_json_file(path: str | os.PathLike, what: str = "plan file",
                   max_bytes: int | None = None) -> Any:
    """Parse a JSON file strictly (planner.safe_input): size-capped (default
    :data:`MAX_PLAN_BYTES`), UTF-8, no duplicate keys, no NaN/Infinity."""
    target = Path(path)
    text = read_text(target, what, max_bytes=MAX_PLAN_BYTES if max_bytes is None else max_bytes)
    if not text.strip():
        raise invalid(f"{what} {target} is empty")
    return parse_json(text, f"{what} {target}")


def json_path(parts: Any) -> str:
    """``$.stages[2].memory_gib`` from a jsonschema path deque."""
    out = "$"
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and part.isidentifier():
            out += f".{part}"
        else:
            out += f"[{json.dumps(part)}]"
    return out


@lru_cache(maxsize=1)
def _validator():
    try:
        from jsonschema import Draft202012Validator, validators
    except ImportError:  # a declared dependency; only a broken install lacks it
        raise invalid("the jsonschema package is not installed; it is needed to validate "
                      "plan files", "pip install 'jsonschema>=4.18'") from None

    def is_integer(checker, value):  # 8 yes, 8.0 no, true no
        return isinstance(value, int) and not isinstance(value, bool)

    checker = Draft202012Validator.TYPE_CHECKER.redefine("integer", is_integer)
    strict = validators.extend(Draft202012Validator, type_checker=checker)
    return strict(plan_schema())


def schema_errors(doc: Any) -> list[str]:
    """Every schema violation of ``doc`` as ``$.path: message``, sorted by path."""
    errors = sorted(_validator().iter_errors(doc),
                    key=lambda e: ([(0, p, "") if isinstance(p, int) else (1, 0, str(p))
                                    for p in e.absolute_path], e.message))
    out = []
    for error in errors:
        # oneOf/anyOf failures carry the more useful message in their best-matching sub-error
        # oneOf [null, object] failures: report the deepest sub-error (inside the object)
        best = error
        while best.context:
            deepest = max(best.context, key=lambda e: len(e.absolute_path))
            if len(deepest.absolute_path) <= len(best.absolute_path):
                break
            best = deepest
        out.append(f"{json_path(best.absolute_path)}: {best.message}")
    return list(dict.fromkeys(out))


def control_character_errors(doc: Any) -> list[str]:
    """Strings of the plan holding control characters, as ``$.path: message``. Names and specs
    (keys ending in ``name`` or ``spec``) may hold none, other text no control characters but
    newlines and tabs: every string of a plan can reach an exported shell or TOML file."""
    errors: list[str] = []
    stack: list[tuple[list, Any, str]] = [([], doc, "")]
    while stack and len(errors) < MAX_REPORTED_ERRORS:
        path, value, key = stack.pop()
        if isinstance(value, dict):
            stack.extend((path + [k], v, k) for k, v in reversed(list(value.items())))
            for k in value:
                if control_character(k) is not None:
                    errors.append(f"{json_path(path)}: key {k!r} contains a control character")
        elif isinstance(value, list):
            stack.extend((path + [i], v, key) for i, v in reversed(list(enumerate(value))))
        elif isinstance(value, str):
            strict = key.endswith(("name", "spec"))
            bad = control_character(value, allow_newlines=not strict)
            if bad is not None:
                errors.append(f"{json_path(path)}: {value[:40]!r} contains the control "
                              f"character {bad}")
    return errors


def validate_plan(doc: Any, where: str = "plan") -> dict[str, Any]:
    """Check ``doc`` is a plan of this version and matches the schema; return it."""
    if not isinstance(doc, dict):
        raise invalid(f"{where}: expected a JSON object (a shardplan plan), got "
                      f"{type(doc).__name__}")
    kind = doc.get("kind")
    if kind != KIND:
        raise invalid(f"{where}: not a shardplan plan (kind is {kind!r}, expected {KIND!r})",
                      "plan files are written by `shardplan plan -o FILE`")
    version = doc.get("schema_version")
    if isinstance(version, bool) or version not in READABLE_VERSIONS:
        raise invalid(f"{where}: plan schema_version {version!r} is not supported; this "
                      f"shardplan reads schema_version {SCHEMA_VERSION} (one pool) and "
                      f"{POOL_SCHEMA_VERSION} (across pools)",
                      "re-create the plan with this shardplan (`shardplan plan ... -o FILE`), or "
                      "use the shardplan version that wrote it",
                      expected=SCHEMA_VERSION, found=version)
    errors = schema_errors(doc) or control_character_errors(doc)
    if errors:
        shown = errors[:MAX_REPORTED_ERRORS]
        more = len(errors) - len(shown)
        message = (f"{where} does not match the plan schema ({len(errors)} "
                   f"error{'s' if len(errors) != 1 else ''}):\n  " + "\n  ".join(shown)
                   + (f"\n  ... and {more} more" if more else ""))
        raise invalid(message, "`shardplan schema` prints the schema; docs/plan-file.md "
                               "explains it", errors=errors)
    return doc


def load_plan(path: str | os.PathLike) -> dict[str, Any]:
    """Read, parse and validate a plan file (see the module docstring for what is refused)."""
    doc = read_json_file(path, "plan file")
    return validate_plan(doc, where=f"plan file {Path(path)}")
