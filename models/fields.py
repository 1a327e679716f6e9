"""Typed, validated access to the fields of one model description mapping.

Consumes: a mapping parsed from a config file, plus a label (usually the file path) for messages.
Produces: plain ``int`` / ``bool`` / ``str`` values, or a :class:`PlannerError` (INVALID_INPUT)
that names the file, the key, what was expected and what was found.

Sizes are integers: floats (even ``4096.0`` or ``1e30``), booleans, strings, NaN and infinities
are rejected, as are values above a per-quantity sanity bound (:data:`LIMITS`), so a typo cannot
turn into an absurd plan.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from planner.errors import invalid

MISSING: Any = object()

# Upper bounds for sizes, generous enough for any real model (largest known: hidden 25k,
# vocab 256k-1M, 1M-token contexts, 256-512 experts), tight enough to catch unit slips.
LIMITS = {
    "layers": 10_000,
    "hidden": 1 << 20,
    "heads": 1 << 16,
    "head_dim": 1 << 16,
    "ffn": 1 << 24,
    "vocab": 1 << 25,
    "positions": 1 << 30,
    "experts": 1 << 16,
    "small": 1 << 16,  # patch size, channels, type vocab, buckets, ...
}


def short(value: Any, limit: int = 60) -> str:
    """A bounded ``repr`` for error messages."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Fields:
    """Validated getters over ``data``; several ``keys`` are alternative spellings."""

    def __init__(self, data: Mapping[str, Any], where: str) -> None:
        self.data = data
        self.where = where

    def _lookup(self, keys: Sequence[str]) -> tuple[str, Any]:
        """The first key with a non-null value; else the first key present (null); else
        ``MISSING``."""
        present = [key for key in keys if key in self.data]
        for key in present:
            if self.data[key] is not None:
                return key, self.data[key]
        return (present[0], None) if present else (keys[0], MISSING)

    def integer(self, *keys: str, default: Any = MISSING, limit: str = "small",
                minimum: int = 1) -> int:
        """A required integer >= ``minimum`` (absent or null: ``default``, else an error)."""
        key, value = self._lookup(keys)
        if value is MISSING or value is None:
            if default is MISSING:
                self._required(key, keys, value)
            return default
        return self.check_int(key, value, limit=limit, minimum=minimum)

    def _required(self, key: str, keys: Sequence[str], value: Any) -> None:
        if value is None:
            raise invalid(f"{self.where}: {key!r} is null; it needs a value")
        alternatives = f" (or {', '.join(map(repr, keys[1:]))})" if len(keys) > 1 else ""
        raise invalid(f"{self.where}: missing required key {keys[0]!r}{alternatives}")

    def opt_integer(self, *keys: str, limit: str = "small", minimum: int = 1) -> int | None:
        """An optional integer; absent or null gives ``None``."""
        key, value = self._lookup(keys)
        if value is MISSING or value is None:
            return None
        return self.check_int(key, value, limit=limit, minimum=minimum)

    def check_int(self, key: str, value: Any, *, limit: str = "small", minimum: int = 1) -> int:
        bound = LIMITS[limit]
        if isinstance(value, bool) or not isinstance(value, int):
            raise invalid(f"{self.where}: {key!r} must be an integer, got {short(value)}"
                          + (" (a float; write it without a decimal point or exponent)"
                             if isinstance(value, float) else ""))
        if value < minimum:
            what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            raise invalid(f"{self.where}: {key!r} must be {what}, got {value}")
        if value > bound:
            raise invalid(f"{self.where}: {key!r} = {value:,} is implausibly large "
                          f"(limit {bound:,}); check the units and the number of digits")
        return value

    def flag(self, *keys: str, default: Any = MISSING) -> bool:
        key, value = self._lookup(keys)
        if value is MISSING or value is None:
            if default is MISSING:
                self._required(key, keys, value)
            return default
        if not isinstance(value, bool):
            raise invalid(f"{self.where}: {key!r} must be true or false, got {short(value)}")
        return value

    def text(self, *keys: str, default: Any = MISSING) -> str:
        key, value = self._lookup(keys)
        if value is MISSING or value is None:
            if default is MISSING:
                self._required(key, keys, value)
            return default
        if not isinstance(value, str):
            raise invalid(f"{self.where}: {key!r} must be a string, got {short(value)}")
        return value

    def choice(self, key: str, choices: Sequence[str], *, default: Any = MISSING) -> str:
        value = self.text(key, default=default)
        if value not in choices:
            raise invalid(f"{self.where}: {key!r} must be one of {', '.join(choices)}; "
                          f"got {short(value)}")
        return value

    def int_list(self, key: str, *, limit: str = "layers", minimum: int = 0) -> list[int]:
        """An optional list of integers (absent or null: empty)."""
        value = self.data.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise invalid(f"{self.where}: {key!r} must be a list of integers, got {short(value)}")
        return [self.check_int(f"{key}[{i}]", item, limit=limit, minimum=minimum)
                for i, item in enumerate(value)]

    def str_list(self, key: str) -> list[str] | None:
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise invalid(f"{self.where}: {key!r} must be a list of strings, got {short(value)}")
        return value



def head_dim_of(fields: Fields, hidden: int, heads: int, explicit: int | None,
                heads_key: str) -> int:
    """The per-head width: an explicit value, else hidden/heads, which must divide exactly."""
    if explicit is not None:
        return explicit
    if hidden % heads:
        raise invalid(f"{fields.where}: hidden size {hidden} is not divisible by {heads_key} "
                      f"= {heads}, and no head_dim is given",
                      "Give head_dim explicitly, or fix the head count.")
    return hidden // heads


def check_kv_heads(fields: Fields, heads: int, kv_heads: int) -> None:
    if kv_heads > heads or heads % kv_heads:
        raise invalid(f"{fields.where}: the number of key/value heads ({kv_heads}) must divide "
                      f"the number of attention heads ({heads})")
