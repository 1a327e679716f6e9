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

Zero-bubble schedules split the backward into I (input gradient) and W (weight gradient) and
use deferred W passes to fill the drain. Their fill/drain is the largest of a few linear
"pieces" in the chunk times F, I, W (``bubble`` of :class:`PipelineSchedule`), each the sum of
the op times along one critical path of the schedule's operation order. The pieces are read off
the operation-order simulator (:mod:`planner.cost.pipeline_sim`, the published orders): every
critical path of equal stages, found as the simulator's completion times in counts of F, I
and W, lies below them (a linear program per p 2-8 and m p-3 p, every F, I, W >= 0; ZB-V's
for W <= I, which a GEMM's weight gradient meets: it has its input gradient's flops), and
they match the simulator at p 12 and 16 (``tests/test_pipeline_sim.py``;
``bench/pipeline_sim.py`` prints the signed errors). With ``k = p - 1``, per chunk:

* ZB-H1 / ZB1P (PyTorch's ``ScheduleInterleavedZeroBubble``, any ``v``):
  ``k max(F + I - W, F, I)``. The published ``(p - 1)(F + B - 2W)`` (Qi et al., "Zero Bubble
  Pipeline Parallelism", ICLR 2024, §3.1; DeepSeek-V3 technical report, Table 2) is the first
  piece; it holds while ``W <= min(F, I)``: a W pass can fill neither the first forward's wait
  ``k F`` nor the last input gradient's chain ``k I``. Peak activations: ``p`` stage
  micro-batches on every rank, not 1F1B's ``p - r``: a deferred W keeps the saved inputs of its
  layers' GEMMs (Qi et al.'s ``M_W = 32 bsh`` of ``M_B = 34 bsh`` per layer), and rank r defers
  r of them (the simulator's count with activations freed by W; the paper's "as 1F1B" is the
  first rank's ``p M_B``).
* ZB-V (``ScheduleZBVZeroBubble``, Qi et al. §6): 2 chunks per rank in a V (rank r holds
  chunks r and 2p-1-r), ``max(k F, k I, 2k(I - W), k(F + I - 2W), 2k F - (2k+1) W,
  2k F - k I - W, (2k-1) F - (k-1) I, (2k-1) F + I - 2k W)``: at ``F = I = W`` it is ``k F``, not the zero of the
  ``(p - 1)(F + B - 3W)`` this planner used before (the first forward still reaches rank p-1
  only after ``k F``). Peak activations: ``p`` micro-batches of the whole stage on every rank.
* DualPipeV (``ScheduleDualPipeV``, deepseek-ai/DualPipe ``dualpipev.py``, DualPipe "cut in
  half"): the same V placement, ``max(2k F + k(I - W), 2k F, (k-1) F + k(2I - W),
  (k-1) F + k I)``; DeepSeek's ``(PP/2 - 1)(F&B + B - 3W)`` over ``PP = 2p`` chunk stages with
  ``F&B = F + B`` is ``k(F + 2I - W)``: one F above the third piece, and below the first where
  ``F > I``. The overlap of one micro-batch's expert all-to-all with the other's compute is not
  modelled (conservative for MoE, exact without communication to hide); activations
  ``P + 1`` chunks, i.e. ``p + 1/2`` stages.
* DualPipe itself (two copies of every stage's weights, micro-batches from both ends) is not
  offered: no runtime profile runs it.

For the planner's stages a piece ``c_F F + c_I I + c_W W`` is written in the stage sums: the
forward part from the non-slowest stages like 1F1B's fill, ``c_F / k x (sum t - max t) / v``,
and the rest from the means, ``((c_I - c_F) sum b + (c_W - c_I) sum w) / (p v)`` (``b`` the full
backward, ``w`` its weight-gradient part; a stage's communication and fixed costs count with
its forward). Exact for equal stages, linear in the stage sums (so the CP-SAT model is exact
too); its signed error on uneven stages is in ``docs/cost-model.md``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

Piece = tuple[tuple[int, int], tuple[int, int], tuple[int, int]]
K = (1, 0)  # p - 1


@dataclass(frozen=True)
class PipelineSchedule:
    name: str  # the planner's name (plan files, --schedule, --pin schedule=)
    title: str
    placement: str  # "loop": chunk k on rank k mod p; "v": chunk k on rank k, then 2p-1-k
    min_chunks: int  # model chunks per rank it needs (v >= min_chunks)
    max_chunks: int  # 0: any
    # the fill/drain pieces (c_F, c_I, c_W), each coefficient (a, b) meaning a (p - 1) + b;
    # () is 1F1B's (p - 1)(F + I + W)
    bubble: tuple[Piece, ...]
    in_flight: str  # "1f1b" (Megatron's warm-up count), "p" (p stages), "v+1" (p + 1/2)
    min_micro_batches_per_rank: int = 0  # m >= this x p (1F1B runs any m)
    source: str = ""

    @property
    def splits_backward(self) -> bool:
        return bool(self.bubble)


SCHEDULES = {s.name: s for s in (
    PipelineSchedule("1f1b", "1F1B", "loop", 1, 1, (), "1f1b",
                     source="Narayanan et al. 2021 §2.2"),
    PipelineSchedule("interleaved-1f1b", "interleaved 1F1B", "loop", 2, 0, (), "1f1b",
                     source="Narayanan et al. 2021 §2.2.2"),
    PipelineSchedule("zb-h1", "zero-bubble ZB-H1 (ZB1P)", "loop", 1, 0,
                     ((K, K, (-1, 0)), (K, (0, 0), (0, 0)), ((0, 0), K, (0, 0))), "p",
                     # with fewer micro-batches than ranks the deferred W passes find no
                     # drain to fill (up to -41% against the order at m = 1): m >= p
                     min_micro_batches_per_rank=1,
                     source="Qi et al. ICLR 2024 §3.1; PyTorch ScheduleInterleavedZeroBubble"),
    # ZB-V fills its V with 2p micro-batches (Qi et al. §6, Fig. 8); fewer leave a bubble the
    # closed form does not describe, so the planner asks for them
    PipelineSchedule("zbv", "zero-bubble ZB-V", "v", 2, 2,
                     ((K, (0, 0), (0, 0)), ((0, 0), K, (0, 0)), ((0, 0), (2, 0), (-2, 0)),
                      (K, K, (-2, 0)), ((2, 0), (0, 0), (-2, -1)), ((2, 0), (-1, 0), (0, -1)),
                      ((2, -1), (-1, 1), (0, 0)), ((2, -1), (0, 1), (-2, 0))), "p",
                     min_micro_batches_per_rank=2,
                     source="Qi et al. arXiv 2401.10241 §6; PyTorch ScheduleZBVZeroBubble"),
    # deepseek-ai/DualPipe dualpipev.py asserts num_chunks >= num_ranks * 2
    PipelineSchedule("dualpipev", "DualPipeV", "v", 2, 2,
                     (((2, 0), K, (-1, 0)), ((2, 0), (0, 0), (0, 0)), ((1, -1), (2, 0), (-1, 0)),
                      ((1, -1), K, (0, 0))), "v+1",
                     min_micro_batches_per_rank=2,
                     source="DeepSeek-V3 report Table 2; deepseek-ai/DualPipe dualpipev.py"),
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


def bubble_pieces(spec: PipelineSchedule, pp: int) -> tuple[tuple[float, float, float], ...]:
    """The schedule's fill/drain pieces at ``pp`` ranks as coefficients ``(x, y, z)`` of
    ``x (sum t - max t) + y sum b + z sum w`` (all over ``v``; module docstring); () for 1F1B
    and interleaved 1F1B, and for one rank."""
    if pp <= 1:
        return ()
    k = pp - 1
    out = []
    for piece in spec.bubble:
        c_f, c_i, c_w = (a * k + b for a, b in piece)
        out.append((c_f / k, (c_i - c_f) / pp, (c_w - c_i) / pp))
    return tuple(out)


def fill_s(stage_times_s: Sequence[float], virtual_stages: int,
           pieces: Sequence[tuple[float, float, float]] = (), total_bwd_s: float = 0.0,
           total_wgrad_s: float = 0.0) -> float:
    """The fill and drain: ``(sum t - max t)/v`` (1F1B, interleaved 1F1B), or the largest of
    a zero-bubble schedule's :func:`bubble_pieces`, floored at 0."""
    rest = sum(stage_times_s) - max(stage_times_s)
    v = max(virtual_stages, 1)
    if not pieces:
        return rest / v
    return max(0.0, max(x * rest + y * total_bwd_s + z * total_wgrad_s
                        for x, y, z in pieces) / v)


def pipeline_time_s(stage_times_s: Sequence[float], num_micro_batches: int,
                    virtual_stages: int = 1, pieces: Sequence[tuple[float, float, float]] = (),
                    total_bwd_s: float = 0.0, total_wgrad_s: float = 0.0) -> float:
    """``m max t`` plus :func:`fill_s`."""
    return num_micro_batches * max(stage_times_s) + fill_s(
        stage_times_s, virtual_stages, pieces, total_bwd_s, total_wgrad_s)


def bubble_time_s(stage_times_s: Sequence[float], num_micro_batches: int,
                  virtual_stages: int = 1) -> float:
    """1F1B's pipeline time minus the time the slowest stage is busy (``m * max t``)."""
    return fill_s(stage_times_s, virtual_stages)


def in_flight_stages(spec: PipelineSchedule, stage: int, pp: int, num_micro_batches: int,
                     virtual_stages: int) -> float | None:
    """Micro-batches of the whole stage's activations rank ``stage`` holds at its peak under
    the V schedules (None: Megatron's 1F1B warm-up count applies, planner.cost.memory)."""
    if spec.in_flight == "p":  # ZB-H1, ZB-V: p stage micro-batches on every rank
        return float(min(pp, num_micro_batches))
    if spec.in_flight == "v+1":  # DualPipeV: PP + 1 chunks of 1/2 stage
        return min(2 * pp + 1, 2 * num_micro_batches) / 2
    return None
