"""Number and key=value options, validated at the edge with bounds that keep every downstream
computation finite.

click's ``FloatRange`` lets ``nan`` through (every comparison with it is false) and ``inf`` and
``1e999`` (which float() reads as inf) through unless bounded; :class:`FiniteFloat` refuses
both and bounds from both sides. ``--pin`` values are refused before ``int()`` when they have
more digits than any degree can (Python refuses to convert integers of over 4,300 digits, an
error that used to surface as an internal one), and a key given twice is an error instead of
the last one silently winning.
"""
from __future__ import annotations

import math

import click

from planner.errors import invalid

MAX_PIN_DIGITS = 9  # degrees, micro-batches and stages are far below 10**9
PIN_ALIASES = {"zero_stage": "zero"}


class FiniteFloat(click.ParamType):
    """A finite float in [minimum, maximum] (``(minimum, maximum]`` with ``min_open``)."""

    name = "float"

    def __init__(self, minimum: float, maximum: float, *, min_open: bool = False,
                 unit: str = "") -> None:
        self.minimum, self.maximum, self.min_open, self.unit = minimum, maximum, min_open, unit

    def convert(self, value, param, ctx):
        if isinstance(value, float):
            number = value
        else:
            try:
                number = float(str(value).strip())
            except ValueError:
                self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number):
            what = f" of {self.unit}" if self.unit else ""
            self.fail(f"{value} is not a finite number{what}", param, ctx)
        low_ok = number > self.minimum if self.min_open else number >= self.minimum
        if not low_ok or number > self.maximum:
            low = "<" if self.min_open else "<="
            self.fail(f"{number:g} is not in the range {self.minimum:g}{low}x<={self.maximum:g}",
                      param, ctx)
        return number

    def __repr__(self) -> str:
        return f"FiniteFloat({self.minimum}, {self.maximum})"


# the longest --pin pipeline_layout= text: a layout written without repetitions, one symbol per
# layer and one | per chunk, for a few hundred layers and chunks (the largest presets have
# 126 blocks; 'E|(t|)*126L' is 128 chunks)
MAX_LAYOUT_PIN_CHARS = 4096


def pin_pairs(items: tuple[str, ...] | list[str]) -> dict[str, str]:
    """``--pin KEY=VALUE`` items as a dict; refuses a malformed item, a key given twice (under
    any spelling: ``zero`` and ``zero_stage``, ``micro-batch`` and ``micro_batch``) and a value
    too long to be a degree."""
    pairs: dict[str, str] = {}
    spelled: dict[str, str] = {}
    for item in items:
        if "=" not in item:
            raise invalid(f"--pin {item!r}: expected KEY=VALUE, e.g. --pin tp=8")
        key, value = item.split("=", 1)
        name = key.strip().replace("-", "_")
        name = PIN_ALIASES.get(name, name)
        if name in spelled:
            raise invalid(f"--pin {name} is given twice ({spelled[name]}={pairs[spelled[name]]!r} "
                          f"and {key}={value!r}); give each pin once")
        digits = value.strip()
        if len(digits) > MAX_PIN_DIGITS and digits.isdigit():
            raise invalid(f"pin {key}: a {len(digits)}-digit number is not a plausible value "
                          f"(limit {MAX_PIN_DIGITS} digits)")
        # a pipeline layout is written out chunk by chunk (Megatron's syntax,
        # planner/pipeline_layout.py): up to MAX_LAYOUT_PIN_CHARS, enough for hundreds of chunks
        limit = MAX_LAYOUT_PIN_CHARS if name == "pipeline_layout" else 64
        if len(value) > limit:
            raise invalid(f"pin {key}: the value is {len(value)} characters long (limit "
                          f"{limit}); expected a number, on/off, a recompute policy or a "
                          f"pipeline layout")
        spelled[name] = key
        pairs[key] = value
    return pairs


class PathText(click.ParamType):
    """A file path, as text. ``click.Path`` stats the path while parsing and raises a bare
    ValueError for a NUL byte (an internal error); the readers and the writer check paths
    themselves, with messages that say what is wrong, so here only NUL is refused."""

    name = "path"

    def convert(self, value, param, ctx):
        text = str(value)
        if "\x00" in text:
            self.fail("a path cannot contain a NUL character", param, ctx)
        return text


PATH = PathText()
