"""Pipeline schedule time from per-stage, per-micro-batch times.

1F1B (PipeDream-Flush, Narayanan et al. 2021 §2.2): with stage times ``t_i`` per micro-batch
(forward + backward) and ``m`` micro-batches, the step takes ``(m - 1) * max_i t_i + sum_i t_i``:
the slowest stage paces the steady state, and fill plus drain cost one pass through every stage.
For equal stages this is ``(m + p - 1) t``, i.e. the bubble fraction ``(p - 1)/m`` of the paper.
Interleaved 1F1B with ``v`` model chunks per rank divides the fill/drain by ``v``:
``m * max_i t_i + (sum_i t_i - max_i t_i) / v`` (bubble ``(p - 1)/(v m)`` for equal stages).
"""
from __future__ import annotations

from typing import Sequence


def pipeline_time_s(stage_times_s: Sequence[float], num_micro_batches: int,
                    virtual_stages: int = 1) -> float:
    slowest = max(stage_times_s)
    total = sum(stage_times_s)
    return num_micro_batches * slowest + (total - slowest) / max(virtual_stages, 1)


def bubble_time_s(stage_times_s: Sequence[float], num_micro_batches: int,
                  virtual_stages: int = 1) -> float:
    """Pipeline time minus the time the slowest stage is busy (``m * max t``)."""
    return pipeline_time_s(stage_times_s, num_micro_batches, virtual_stages) - \
        num_micro_batches * max(stage_times_s)
