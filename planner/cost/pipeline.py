"""Pipeline schedules: which ranks hold which model chunks, how long the fill and drain take,
and how many micro-batches of activations each rank keeps.

Per-stage inputs, per micro-batch (the sums of :class:`~planner.cost.terms.LayerTerms` over a
pipeline rank's layers, every chunk of the rank together): ``t_i`` the stage time (forward,
backward, recompute, exposed communication), ``b_i`` its full backward (activation and weight
gradients plus recomputation), ``w_i`` its weight-gradient GEMMs (the part of ``b_i`` a
zero-bubble schedule defers). ``m`` micro-batches, ``v`` model chunks per rank, ``p`` ranks.

1F1B (PipeDream-Flush, Narayanan et al. 2021 §2.2): the slowest stage paces the steady state,
fill plus drain cost one pass through every other stage: ``m max t + (sum t - max t)``, i.e.
the bubble ``(p - 1)(F + B)`` of equal stages. Interleaved 1F1B (Narayanan et al. 2021 §2.2.2)
runs chunks of ``1/v`` of a stage: the bubble ``(p - 1)(F + B)/v``.

Zero-bubble schedules split the backward into B (input gradient) and W (weight gradient) and
use deferred W passes to fill the drain. With ``F``, ``B`` (full backward) and ``W`` per chunk,
the published bubbles (DeepSeek-V3 technical report, Table 2, and the DualPipe README, "based on
the same number of PP stages"; Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, §2.1
and §6):

* ZB-H1 / ZB1P: ``(p - 1)(F + B - 2W)`` (Qi et al.'s ``(p-1)(T_F + T_B - T_W)`` with their B the
  input gradient only), peak activations as 1F1B. PyTorch's ``ScheduleInterleavedZeroBubble``
  runs it over ``v`` looped chunks ("implementing the ZB1P schedule"): chunk times ``1/v``.
* ZB-V (``ScheduleZBVZeroBubble``): 2 chunks per rank in a V (rank r holds chunks r and
  2p-1-r), ``(p - 1)(F + B - 3W)`` per chunk: zero when ``F = B_input = W`` as the paper says,
  peak activations as 1F1B on every rank (``p`` micro-batches of the whole stage).
* DualPipeV (``ScheduleDualPipeV``, DualPipe "cut in half"): the same V placement,
  ``(P/2 - 1)(F&B + B - 3W)`` over ``P = 2p`` chunk stages with ``F&B`` one overlapped
  forward-and-backward pair; activations ``P + 1`` chunks, i.e. ``p + 1/2`` stages. The planner
  takes ``F&B = F + B``: the overlap of one micro-batch's expert all-to-all with the other's
  compute is not modelled (conservative for MoE, exact without communication to hide).
* DualPipe itself (two copies of every stage's weights, micro-batches from both ends) is not
  offered: no runtime profile runs it.

For unequal stages the planner writes each schedule as ``m max t + (sum t - max t)/v`` plus the
mean stage's correction ``(p - 1)/p x (b_extra sum b - w_credit sum w)/v``, floored so the bubble
is never negative: exact for equal stages (the published forms), linear in the stage sums (so
the CP-SAT model is exact too).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class PipelineSchedule:
    name: str  # the planner's name (plan files, --schedule, --pin schedule=)
    title: str
    placement: str  # "loop": chunk k on rank k mod p; "v": chunk k on rank k, then 2p-1-k
    min_chunks: int  # model chunks per rank it needs (v >= min_chunks)
    max_chunks: int  # 0: any
    w_credit: float  # W chunks each bubble unit hides (0 without a B/W split)
    b_extra: float  # extra full-backward chunks per bubble unit (DualPipeV's F&B + B)
    in_flight: str  # "1f1b" (Megatron's warm-up count), "v" (p stages), "v+1" (p + 1/2)
    min_micro_batches_per_rank: int = 0  # m >= this x p (1F1B runs any m)
    source: str = ""

    @property
    def splits_backward(self) -> bool:
        return self.w_credit > 0


SCHEDULES = {s.name: s for s in (
    PipelineSchedule("1f1b", "1F1B", "loop", 1, 1, 0.0, 0.0, "1f1b",
                     source="Narayanan et al. 2021 §2.2"),
    PipelineSchedule("interleaved-1f1b", "interleaved 1F1B", "loop", 2, 0, 0.0, 0.0, "1f1b",
                     source="Narayanan et al. 2021 §2.2.2"),
    PipelineSchedule("zb-h1", "zero-bubble ZB-H1 (ZB1P)", "loop", 1, 0, 2.0, 0.0, "1f1b",
                     source="Qi et al. ICLR 2024 §2.1; DeepSeek-V3 report Table 2"),
    # ZB-V fills its V with 2p micro-batches (Qi et al. §6, Fig. 8); fewer leave a bubble the
    # closed form does not describe, so the planner asks for them
    PipelineSchedule("zbv", "zero-bubble ZB-V", "v", 2, 2, 3.0, 0.0, "v",
                     min_micro_batches_per_rank=2, source="Qi et al. arXiv 2401.10241 §6"),
    # deepseek-ai/DualPipe dualpipev.py asserts num_chunks >= num_ranks * 2
    PipelineSchedule("dualpipev", "DualPipeV", "v", 2, 2, 3.0, 1.0, "v+1",
                     min_micro_batches_per_rank=2,
                     source="DeepSeek-V3 report Table 2; deepseek-ai/DualPipe README"),
)}


def default_schedule(virtual_stages: int) -> str:
    return "interleaved-1f1b" if virtual_stages > 1 else "1f1b"


def schedule_spec(name: str) -> PipelineSchedule:
    return SCHEDULES[name]


def chunk_rank(chunk: int, pp: int, placement: str = "loop") -> int:
    """The rank holding model chunk ``chunk`` (0 .. p v - 1)."""
    if placement == "v":
        return chunk if chunk < pp else 2 * pp - 1 - chunk
    return chunk % pp


def bubble_credit_s(pp: int, virtual_stages: int, w_credit: float, b_extra: float,
                    total_bwd_s: float, total_wgrad_s: float) -> float:
    """A schedule's change of the fill/drain against interleaved 1F1B (seconds; < 0 for ZB-H1
    and ZB-V): ``(p - 1)/p x (b_extra sum b - w_credit sum w) / v`` with ``w_credit`` and
    ``b_extra`` of its :class:`PipelineSchedule`."""
    if pp <= 1 or (not w_credit and not b_extra):
        return 0.0
    return (pp - 1) / pp * (b_extra * total_bwd_s - w_credit * total_wgrad_s) \
        / max(virtual_stages, 1)


def pipeline_time_s(stage_times_s: Sequence[float], num_micro_batches: int,
                    virtual_stages: int = 1, credit_s: float = 0.0) -> float:
    """``m max t + max(0, (sum t - max t)/v + credit)`` (``credit``: :func:`bubble_credit_s`)."""
    slowest = max(stage_times_s)
    total = sum(stage_times_s)
    fill = (total - slowest) / max(virtual_stages, 1)
    if credit_s:
        fill = max(0.0, fill + credit_s)
    return num_micro_batches * slowest + fill


def bubble_time_s(stage_times_s: Sequence[float], num_micro_batches: int,
                  virtual_stages: int = 1, credit_s: float = 0.0) -> float:
    """Pipeline time minus the time the slowest stage is busy (``m * max t``)."""
    return pipeline_time_s(stage_times_s, num_micro_batches, virtual_stages, credit_s) - \
        num_micro_batches * max(stage_times_s)


def in_flight_stages(spec: PipelineSchedule, stage: int, pp: int, num_micro_batches: int,
                     virtual_stages: int) -> float | None:
    """Micro-batches of the whole stage's activations rank ``stage`` holds at its peak under
    the V schedules (None: Megatron's 1F1B warm-up count applies, planner.cost.memory)."""
    if spec.in_flight == "v":  # ZB-V: p M_B on every rank (Qi et al. §6)
        return float(min(pp, num_micro_batches))
    if spec.in_flight == "v+1":  # DualPipeV: PP + 1 chunks of 1/2 stage
        return min(2 * pp + 1, 2 * num_micro_batches) / 2
    return None
