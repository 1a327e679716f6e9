"""A frozen dataclass's hash, computed once per object.

The cost caches (``functools.lru_cache`` in ``planner.cost``) key on layers, GPUs and clusters,
and every lookup hashes its key: a generated dataclass ``__hash__`` re-hashes every field
(a :class:`~planner.ir.Layer` its attention and MLP) each time, a few microseconds that the
search pays hundreds of thousands of times. ``cached_hash`` returns the same value the
class's own hash would (``hash_fields``: the fields the generated hash reads, or the fields a
hand-written one lists), stored in the object on first use; ``state_without_hash`` is the
pickled state without it (string hashes differ between processes). Equality is unchanged.
"""
from __future__ import annotations

from dataclasses import fields
from typing import Any, Callable

_KEY = "_hash"


def dataclass_key(obj: Any) -> tuple:
    """What a generated dataclass ``__hash__`` hashes: the fields with ``hash`` (or, unset,
    ``compare``), in order."""
    return tuple(getattr(obj, f.name) for f in fields(obj)
                 if (f.compare if f.hash is None else f.hash))


def cached_hash(obj: Any, key: Callable[[Any], tuple] = dataclass_key) -> int:
    value = obj.__dict__.get(_KEY)
    if value is None:
        value = hash(key(obj))
        object.__setattr__(obj, _KEY, value)
    return value


def state_without_hash(obj: Any) -> dict:
    """``__getstate__``: the object's attributes without the cached hash."""
    state = dict(obj.__dict__)
    state.pop(_KEY, None)
    return state
