"""Per-layer layouts on the CPU runtime: layers of one stage on different (data x tensor)
factorings of the stage's ``tp x dp`` ranks (:class:`planner.strategy.Layout`), and the
activation redistributed between them with DTensor.

* A layer of tensor degree ``t`` runs its tensor parallelism (``parallelize_module``) over
  ``t`` consecutive ranks of the stage and is data-parallel over the other ``tp x dp / t``
  (:func:`layout_meshes`: one DeviceMesh ``(pp, data, tensor)`` per degree of the plan).
* Between layers the activation is split along the batch over the tensor groups and replicated
  inside one. When the degree grows k-fold, k neighbouring groups merge: on the 1-D mesh of the
  k merging ranks (one from each group) the activation goes ``Shard(0) -> Replicate()``, an
  all-gather whose backward only slices; when it shrinks, ``Replicate() -> Shard(0)``, a local
  slice whose backward all-gathers the gradient (:class:`Reshard`). These are the collectives
  the cost model charges (:func:`planner.cost.terms.reshard_collective`).
* The data: micro-batch ``i`` of the stage is global rows ``[i·S, (i+1)·S)`` (``S`` =
  micro_batch x dp sequences); under degree ``t`` group ``g`` takes its ``g``-th contiguous
  share, so merged groups hold exactly the concatenation of the groups they merge
  (:func:`batch_rows`).

Bytes moved: each :class:`Reshard` adds what this rank receives in its collectives (forward
and backward, from the local shard sizes the collective moved) to :data:`MOVED`.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

try:
    from torch.distributed.tensor import DTensor, Replicate, Shard
except ImportError:  # pragma: no cover - PyTorch 2.4
    from torch.distributed._tensor import DTensor, Replicate, Shard


class _Counter:
    forward_bytes = 0
    backward_bytes = 0

    def reset(self) -> None:
        self.forward_bytes = self.backward_bytes = 0


MOVED = _Counter()


def layout_meshes(world: int, pp: int, degrees: list[int]) -> dict[int, DeviceMesh]:
    """Per tensor degree ``t``: the mesh ``(pp, data, tensor)`` whose tensor groups are ``t``
    consecutive ranks of a stage (cp = 1). Built on every rank in the same order."""
    stage = world // pp
    return {t: DeviceMesh("cpu", torch.arange(world).reshape(pp, stage // t, t),
                          mesh_dim_names=("pp", "data", "tensor"))
            for t in sorted(set(degrees))}


def merge_meshes(world: int, pp: int, pairs: list[tuple[int, int]]) -> dict[tuple, DeviceMesh]:
    """Per (small, big) degree pair: the mesh ``(pp, big groups, k, small)`` whose ``merge``
    dim is the k ranks, one from each of k neighbouring small groups, that a big group joins."""
    stage = world // pp
    out = {}
    for small, big in sorted(set(pairs)):
        k = big // small
        out[(small, big)] = DeviceMesh(
            "cpu", torch.arange(world).reshape(pp, stage // big, k, small),
            mesh_dim_names=("pp", "outer", "merge", "inner"))
    return out


def batch_rows(rows: torch.Tensor, num_micro: int, stage_batch: int, group: int,
               per_group: int) -> torch.Tensor:
    """This tensor group's rows of a stage's batch: for every micro-batch ``i``, rows
    ``i·stage_batch + group·per_group`` .. ``+ per_group`` (in micro-batch order)."""
    parts = [rows[i * stage_batch + group * per_group:i * stage_batch + (group + 1) * per_group]
             for i in range(num_micro)]
    return torch.cat(parts)


class Reshard(nn.Module):
    """The activation from a layer of tensor degree ``before`` to one of degree ``after`` (see
    the module docstring), as a DTensor ``redistribute`` on the merging ranks' 1-D mesh."""

    def __init__(self, before: int, after: int, merge_mesh: DeviceMesh) -> None:
        super().__init__()
        self.before, self.after = before, after
        self.mesh = merge_mesh["merge"]
        self.k = max(before, after) // min(before, after)
        grow = after > before
        self.source = (Shard(0),) if grow else (Replicate(),)
        self.target = (Replicate(),) if grow else (Shard(0),)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = DTensor.from_local(x, self.mesh, self.source, run_check=False)
        y = d.redistribute(self.mesh, self.target).to_local()
        if self.after > self.before:  # all-gather: this rank receives the k - 1 other shards
            MOVED.forward_bytes += (self.k - 1) * x.numel() * x.element_size()
        elif y.requires_grad:  # slice: backward all-gathers the gradient of the k shards
            y.register_hook(_count_backward(self.k))
        return y

    def extra_repr(self) -> str:
        return f"tp {self.before} -> {self.after}"


def _count_backward(k: int):
    def hook(grad: torch.Tensor) -> None:
        MOVED.backward_bytes += (k - 1) * grad.numel() * grad.element_size()
    return hook


class LayeredPart(nn.Module):
    """A pipeline chunk whose layers run on their own tensor degrees: ``Reshard`` modules
    between consecutive layers of different degrees (the first one also after the previous
    chunk's last layer). Parameter names stay the Decoder's (``layers.<index>....``)."""

    def __init__(self, part: nn.Module, reshards: dict[int, Reshard]) -> None:
        super().__init__()
        self.layers = part.layers
        self.reshards = nn.ModuleDict({str(i): r for i, r in sorted(reshards.items())})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for key, layer in self.layers.items():
            if key in self.reshards:
                x = self.reshards[key](x)
            x = layer(x)
        return x

    def indices(self) -> list[int]:
        return [int(k) for k in self.layers]
