"""What one process actually holds: bytes of parameters, gradients and optimizer states, and the
peak of activations saved for backward.

* States: the sum of local shard ``numel x element_size`` (a DTensor counts its ``to_local()``
  shard; a tensor shared by two modules, e.g. a tied weight, once). Adam's per-tensor ``step``
  counters (one 4-byte scalar per parameter tensor) are reported apart from ``exp_avg`` and
  ``exp_avg_sq``, which are the 8 bytes per parameter the cost model counts.
* Activations: :class:`SavedTensorTracker` is a ``torch.autograd.graph.saved_tensors_hooks``
  pair. Every tensor autograd saves for backward is counted once per storage (views of one
  storage share it) while it is alive, parameters excluded (their storage belongs to the
  states, also when FSDP2 has gathered them), and released when autograd frees the saved
  tensor (after its node's backward). Tensors a checkpointed region keeps for recomputation
  are made visible by :func:`planner.runtime.model.keep_for_measure`. Not counted: the
  recomputation working set during backward, transient forward temporaries and pipeline
  send/receive buffers.
"""
from __future__ import annotations

from typing import Callable, Iterable

import torch

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover - PyTorch 2.4 kept it private
    from torch.distributed._tensor import DTensor


def local(t: torch.Tensor) -> torch.Tensor:
    """The tensor this process stores for ``t`` (a DTensor's local shard)."""
    return t._local_tensor if isinstance(t, DTensor) else t  # to_local() without autograd


def _plain(t: torch.Tensor) -> torch.Tensor:
    """The innermost plain tensor of a wrapper subclass (DTensor, AsyncCollectiveTensor)."""
    for _ in range(8):
        if isinstance(t, DTensor):
            t = t._local_tensor
        elif type(t) is not torch.Tensor and type(t) is not torch.nn.Parameter and \
                hasattr(t, "__tensor_flatten__"):
            names, _ = t.__tensor_flatten__()
            t = getattr(t, names[0])
        else:
            break
    return t


def tensor_bytes(t: torch.Tensor) -> int:
    x = local(t)
    return x.numel() * x.element_size()


def unique_params(modules: Iterable[torch.nn.Module]) -> list[torch.nn.Parameter]:
    seen: set[int] = set()
    out = []
    for module in modules:
        for p in module.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


def held_state_bytes(params: list[torch.nn.Parameter], optimizer_state: dict) -> dict[str, int]:
    """{params, grads, optimizer, optimizer_step_counters} bytes this process holds."""
    out = {"params": sum(tensor_bytes(p) for p in params),
           "grads": sum(tensor_bytes(p.grad) for p in params if p.grad is not None),
           "optimizer": 0, "optimizer_step_counters": 0}
    for state in optimizer_state.values():
        for key, value in state.items():
            if torch.is_tensor(value):
                out["optimizer_step_counters" if key == "step" else "optimizer"] += \
                    tensor_bytes(value)
    return out


class _Saved:
    __slots__ = ("tracker", "key", "tensor")

    def __init__(self, tracker: "SavedTensorTracker", key: int, nbytes: int,
                 tensor: torch.Tensor) -> None:
        self.tracker, self.key, self.tensor = tracker, key, tensor
        tracker._add(key, nbytes)

    def __del__(self) -> None:
        self.tracker._release(self.key)


class SavedTensorTracker:
    """Live and peak bytes of tensors saved for backward (see the module docstring)."""

    def __init__(self, params_fn: Callable[[], Iterable[torch.Tensor]]) -> None:
        self.params_fn = params_fn
        self.live: dict[int, list[int]] = {}  # storage address -> [references, bytes]
        self.current = 0
        self.peak = 0

    def _add(self, key: int, nbytes: int) -> None:
        entry = self.live.get(key)
        if entry is None:
            self.live[key] = [1, nbytes]
            self.current += nbytes
            self.peak = max(self.peak, self.current)
        else:
            entry[0] += 1

    def _release(self, key: int) -> None:
        entry = self.live.get(key)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            self.current -= entry[1]
            del self.live[key]

    def _param_storages(self) -> set[int]:
        keys = set()
        for p in self.params_fn():
            try:
                keys.add(_plain(p).untyped_storage().data_ptr())
            except (RuntimeError, NotImplementedError):
                pass
        return keys

    def pack(self, t: torch.Tensor):
        try:
            storage = _plain(t).untyped_storage()
            key, nbytes = storage.data_ptr(), storage.nbytes()
        except (RuntimeError, NotImplementedError):
            return t
        if nbytes == 0 or key in self._param_storages():
            return t
        return _Saved(self, key, nbytes, t)

    @staticmethod
    def unpack(obj):
        return obj.tensor if isinstance(obj, _Saved) else obj

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    def reset_peak(self) -> None:
        self.peak = self.current
