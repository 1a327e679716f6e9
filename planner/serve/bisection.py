"""Bisection over a monotone predicate, shared by the aggregated and disaggregated searches."""

from __future__ import annotations


def largest_meeting(lo: int, hi: int, ok) -> int | None:
    """Largest n in [lo, hi] with ok(n), assuming ok is monotone (true then false)."""
    if hi < lo or not ok(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo
