"""Memory headroom: how much of each GPU's memory the search leaves unplanned.

Consumes a ``--memory-headroom`` value (a fraction of HBM such as ``0.05`` or ``5%``, or an
absolute amount such as ``4GiB``); produces a :class:`MemoryHeadroom` whose :meth:`limit_bytes`
is the per-GPU memory the search may fill. ``evaluate`` and ``check`` still judge a plan
against the whole capacity: the headroom is a margin the search keeps, not a different GPU.

Why a margin at all: the memory model predicts the *mean* of what a runtime holds (states,
activations, and the caching allocator's average overhead, calibrated), but what the PyTorch
caching allocator has reserved varies from run to run and step to step: blocks freed in one
order and requested in another fragment its segments, NCCL allocates its channel buffers
lazily when a communicator is first used, cuBLAS/cuDNN workspaces grow with the shapes they
see. A plan that fills 99.9 % of HBM on paper has no room for any of this. The default, 5 %
of HBM, is sized by the calibrated error of the memory prediction: the pooled log-ratio spread
of the memory band in ``planner/calibration/defaults.yaml`` is 6.7 % (median error 3.3 %,
docs/accuracy.md; log-ratio mean -1.0 %), so a plan predicted at 95 % of HBM fits with a
probability of about Phi((0.051 + 0.010) / 0.067) = 0.82 under that band, where one predicted
at 99.9 % fits with about Phi(0.16) = 0.56. ``--memory-headroom 0`` restores the old
behaviour (fill to the last byte).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from planner.errors import invalid
from planner.hardware import GIB

DEFAULT_FRACTION = 0.05
MAX_FRACTION = 0.5  # leaving more than half the GPU unplanned is a typo, not a margin

_GIB = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*gib\s*$", re.IGNORECASE)
_PCT = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*%\s*$")


@dataclass(frozen=True)
class MemoryHeadroom:
    """A margin of ``fraction`` of each GPU's memory plus ``gib`` GiB (one of the two is 0)."""

    fraction: float = DEFAULT_FRACTION
    gib: float = 0.0

    def limit_bytes(self, capacity_bytes: float) -> float:
        """The bytes per GPU a plan may use when the GPU holds ``capacity_bytes``."""
        return max(capacity_bytes * (1.0 - self.fraction) - self.gib * GIB, 0.0)

    def describe(self) -> str:
        """The canonical spelling (what the plan records): '5%' or '4GiB'."""
        if self.gib:
            return f"{self.gib:g}GiB"
        return f"{self.fraction * 100:g}%"

    @staticmethod
    def parse(text: str | float) -> "MemoryHeadroom":
        """``0.05``, ``5%`` (a fraction of HBM) or ``4GiB`` (an amount); INVALID_INPUT else."""
        raw = str(text).strip()
        hint = ("give a fraction of the GPU memory (0.05 or 5%) or an amount in GiB (4GiB); "
                "0 leaves no headroom")
        match = _GIB.match(raw)
        if match:
            gib = float(match.group(1))
            if not math.isfinite(gib) or gib < 0:
                raise invalid(f"--memory-headroom {raw!r}: the amount must be >= 0 GiB", hint)
            return MemoryHeadroom(fraction=0.0, gib=gib)
        match = _PCT.match(raw)
        try:
            fraction = float(match.group(1)) / 100 if match else float(raw)
        except ValueError:
            raise invalid(f"--memory-headroom {raw!r} is not a fraction or an amount",
                          hint) from None
        if not math.isfinite(fraction) or not 0 <= fraction <= MAX_FRACTION:
            raise invalid(f"--memory-headroom {raw!r}: the fraction must be in "
                          f"[0, {MAX_FRACTION:g}] ({MAX_FRACTION:.0%} of the GPU memory)", hint)
        return MemoryHeadroom(fraction=fraction, gib=0.0)


DEFAULT_HEADROOM = MemoryHeadroom()
NO_HEADROOM = MemoryHeadroom(fraction=0.0)
