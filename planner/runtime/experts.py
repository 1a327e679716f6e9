"""The expert-parallel token exchange of a MoE block on the CPU runtime: a differentiable
``torch.distributed.all_to_all_single`` with split sizes (gloo runs it), the bytes it moves, and
the force-balanced expert assignment both the distributed and the reference runs use.

* Routing (:func:`balanced_experts`). Benchmarks force-balance routing (Megatron-Core
  ``--moe-router-force-load-balancing``: ``moe_utils.RandomSTE`` replaces the router's logits by
  random normal ones in forward and passes the gradient straight through; Megatron-Bridge's MoE
  tables: "we force-balance the token distribution among experts"), which is what the cost
  model predicts at ``--moe-imbalance 1``. Random logits are balanced only on average; to make
  the bytes exact and the reference reproducible, copy ``j`` of the token at sequence position
  ``s`` goes to expert ``(s x top_k + j) mod E``: a sequence's ``seq x top_k`` copies cover the
  experts round-robin, so with ``E | seq x top_k`` every expert (and every EP rank's block of
  ``E / ep`` experts) receives exactly ``rows x seq x top_k / E`` copies of any batch of whole
  sequences, whatever the micro-batch or data-parallel slicing, and the ``top_k`` experts of
  a token are distinct (``top_k <= E``). The router still runs: its logits at the assigned
  experts, softmaxed over the ``top_k`` (Megatron-Core's default post-softmax top-k), are the
  gate weights, so the router trains as in a real run; only the choice is fixed.
* Exchange (:class:`AllToAll`). Dispatch sends each routed copy to the EP rank owning its
  expert, combine sends the expert outputs back; each is ``all_to_all_single`` with the split
  sizes of the copies, and its backward is the transposed exchange (splits swapped). The
  counts are exchanged first (``all_to_all_single`` of the per-expert counts: dropless, no
  capacity). :data:`A2A` adds what this rank receives from the other ranks of its EP group
  (its own share stays local) in forward and backward.
* Expert tensor parallelism (:class:`GatherRows`, :class:`ScatterRows`). With ``etp > 1`` each
  expert's SwiGLU is split over the ETP group (gate / up by rows, down by columns), and, as
  Megatron-Core's ``MoEAlltoAllTokenDispatcher`` does (``dispatch_postprocess``:
  ``gather_from_sequence_parallel_region`` over the expert tensor group after the EP
  all-to-all; ``combine_preprocess``: ``reduce_scatter_to_sequence_parallel_region`` before the
  combine), the received copies are all-gathered over the ETP group before the experts and
  their partial outputs reduce-scattered back after them; backward the transposes
  (reduce-scatter, all-gather). :data:`ETP` adds what this rank receives from its ETP peers:
  ``(etp - 1)`` members' rows in an all-gather, ``(etp - 1) / etp`` of the summed buffer in a
  reduce-scatter (the other members' partial sums of its own rows).
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist


class _Counter:
    forward_bytes = 0
    backward_bytes = 0

    def reset(self) -> None:
        self.forward_bytes = self.backward_bytes = 0


A2A = _Counter()
ETP = _Counter()


def balanced_experts(seq_len: int, top_k: int, num_experts: int) -> torch.Tensor:
    """(seq_len, top_k) expert ids: copy ``j`` of position ``s`` -> ``(s*top_k + j) mod E``."""
    copies = torch.arange(seq_len * top_k, dtype=torch.long).view(seq_len, top_k)
    return copies % num_experts


def _row_bytes(x: torch.Tensor) -> int:
    return math.prod(x.shape[1:]) * x.element_size()


def _received_rows(splits: list[int], me: int) -> int:
    return sum(n for i, n in enumerate(splits) if i != me)


class AllToAll(torch.autograd.Function):
    """``all_to_all_single`` of rows with split sizes; backward exchanges the gradient back."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, out_splits: list[int], in_splits: list[int], group,
                me: int) -> torch.Tensor:
        ctx.splits, ctx.group, ctx.me = (out_splits, in_splits), group, me
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), output_split_sizes=out_splits,
                               input_split_sizes=in_splits, group=group)
        A2A.forward_bytes += _received_rows(out_splits, me) * _row_bytes(x)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits),) + tuple(grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), output_split_sizes=in_splits,
                               input_split_sizes=out_splits, group=ctx.group)
        A2A.backward_bytes += _received_rows(in_splits, ctx.me) * _row_bytes(grad)
        return back, None, None, None, None


def _equal_rows(x: torch.Tensor, n: int) -> None:
    if x.shape[0] % n:
        raise RuntimeError(f"{x.shape[0]} rows do not split evenly over the {n} ranks of the "
                           "expert tensor group (force-balanced routing gives every rank the same "
                           "count)")


# PyTorch 2.13 names the single-tensor collectives *_single (the *_tensor names warn)
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _all_gather_rows(x: torch.Tensor, group, n: int) -> torch.Tensor:
    out = x.new_empty((n * x.shape[0],) + tuple(x.shape[1:]))
    _ALL_GATHER(out, x.contiguous(), group=group)
    return out


def _reduce_scatter_rows(x: torch.Tensor, group, n: int) -> torch.Tensor:
    _equal_rows(x, n)
    out = x.new_empty((x.shape[0] // n,) + tuple(x.shape[1:]))
    _REDUCE_SCATTER(out, x.contiguous(), op=dist.ReduceOp.SUM, group=group)
    return out


class GatherRows(torch.autograd.Function):
    """All-gather of equal row blocks over the ETP group (member order); backward the
    reduce-scatter of the gradient (Megatron's ``gather_from_sequence_parallel_region``)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group, n: int) -> torch.Tensor:
        ctx.group, ctx.n = group, n
        ETP.forward_bytes += (n - 1) * x.shape[0] * _row_bytes(x)
        return _all_gather_rows(x, group, n)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ETP.backward_bytes += (ctx.n - 1) * grad.shape[0] // ctx.n * _row_bytes(grad)
        return _reduce_scatter_rows(grad, ctx.group, ctx.n), None, None


class ScatterRows(torch.autograd.Function):
    """Reduce-scatter (sum) of partial outputs over the ETP group, each member keeping its own
    row block; backward the all-gather of the gradient (Megatron's
    ``reduce_scatter_to_sequence_parallel_region``)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group, n: int) -> torch.Tensor:
        ctx.group, ctx.n = group, n
        ETP.forward_bytes += (n - 1) * x.shape[0] // n * _row_bytes(x)
        return _reduce_scatter_rows(x, group, n)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ETP.backward_bytes += (ctx.n - 1) * grad.shape[0] * _row_bytes(grad)
        return _all_gather_rows(grad, ctx.group, ctx.n), None, None


def exchange_counts(counts: torch.Tensor, group) -> torch.Tensor:
    """Per-expert counts (E,) sent in equal blocks of E / ep to the EP ranks; returns the
    (ep x E / ep) counts of this rank's experts from each source rank."""
    received = torch.empty_like(counts)
    dist.all_to_all_single(received, counts, group=group)
    return received


__all__ = ["A2A", "AllToAll", "ETP", "GatherRows", "ScatterRows", "balanced_experts",
           "exchange_counts"]
