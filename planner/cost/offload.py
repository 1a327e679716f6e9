"""Optimizer offload to host memory (ZeRO-Offload, Ren et al., USENIX ATC 2021): the time and
host bytes of a layer whose optimizer states and fp32 master weights live in the host's memory.

Consumes the parameter count one GPU updates, the runtime's state bytes and the cluster's
:class:`~planner.hardware.HostMemory` (per GPU: host memory, DRAM bandwidth, cores, GPU-host
link); produces seconds per step and bytes.

Per step, for the parameters this GPU updates (ZeRO-Offload §4: gradients go to the CPU, the CPU
runs Adam, the updated 16-bit weights come back):

* gradients GPU -> host: ``params x grad_bytes`` over the link, then the CPU Adam step, then the
  16-bit weights host -> GPU: ``params x weight_bytes`` over the link. Charged one after the
  other (the data dependence); ZeRO-Offload's overlap of the gradient copy with the backward pass
  and its one-step delayed parameter update are not modelled, so this is an upper bound.
* CPU Adam: a roofline over the host's share of DRAM bandwidth (read fp32 master, m, v and the
  gradient, write master, m, v and the 16-bit copy: the same bytes per parameter as the GPU's
  Adam) and its cores' FP32 rate (about 15 FLOPs per parameter: the moments, bias corrections,
  square root, division and decoupled weight decay of AdamW, Loshchilov & Hutter 2019). With
  ~0.5 FLOP per byte against a ridge point of ~20 FLOP per byte on server CPUs it is
  memory-bound (ZeRO-Offload's CPU-Adam is vectorised for that reason).
* host bytes: the optimizer states (``state.optimizer`` bytes per parameter: fp32 master
  weights, m and v) and the fp32 gradient copy Adam reads (4 bytes per parameter).
"""
from __future__ import annotations

from planner.hardware import HostMemory

ADAM_FLOPS_PER_PARAM = 15.0
HOST_GRAD_BYTES_PER_PARAM = 4.0  # the fp32 gradient the CPU step reads


def host_bytes(params_updated: float, optimizer_bytes: float) -> float:
    """Host memory of one GPU's offloaded states: the optimizer bytes moved off the GPU and the
    fp32 gradient buffer of the ``params_updated`` parameters it updates."""
    return optimizer_bytes + params_updated * HOST_GRAD_BYTES_PER_PARAM


def cpu_adam_s(params_updated: float, bytes_per_param: float, host: HostMemory) -> float:
    """Seconds of the host's Adam step over ``params_updated`` parameters (a roofline)."""
    memory = params_updated * bytes_per_param / host.memory_bytes_per_s
    compute = params_updated * ADAM_FLOPS_PER_PARAM / host.flops_per_s
    return max(memory, compute)


def offload_step_s(params_updated: float, grad_bytes: float, weight_bytes: float,
                   bytes_per_param: float, host: HostMemory) -> float:
    """Seconds per step of an offloaded optimizer step: gradients down, CPU Adam, weights up."""
    link = params_updated * (grad_bytes + weight_bytes) / host.link_bytes_per_s
    return link + cpu_adam_s(params_updated, bytes_per_param, host)


# -- activation offload ----------------------------------------------------------------------
# A block's saved activations go to host memory during its forward and come back before its
# backward (ZeRO-Offload's offload of the activation checkpoints, and ZeRO-Infinity §5, Rajbhandari
# et al. SC 2021; torch.autograd.graph.save_on_cpu; Megatron-Core's fine-grained activation
# offloading, --fine-grained-activation-offloading). The copy out runs on its own stream while
# the following block computes its forward, the copy in (prefetch) while the following block
# computes its backward; in a run of identical blocks the following block's compute is this
# block's, so each copy is exposed by what it exceeds that compute by. The GPU keeps two
# blocks' worth of one micro-batch in transit (the block whose backward runs and the prefetched
# one before it); the host keeps every in-flight micro-batch's copy.

def activation_copy_s(stored_bytes: float, host: HostMemory) -> float:
    """Seconds of one copy (out or in) of one micro-batch's saved activations over the link."""
    return stored_bytes / host.link_bytes_per_s


def activation_exposed_s(stored_bytes: float, fwd_s: float, bwd_s: float,
                         host: HostMemory, hbm_bytes_per_s: float) -> float:
    """Seconds per micro-batch the two copies add: the copy out beyond the forward it overlaps
    with, the copy in beyond the backward (recomputation included) it overlaps with, plus the
    HBM time of the copies' own reads and writes (the copy engine takes that bandwidth from
    the kernels it overlaps, so a hidden copy is not free)."""
    copy = activation_copy_s(stored_bytes, host)
    return (max(0.0, copy - fwd_s) + max(0.0, copy - bwd_s)
            + 2 * stored_bytes / hbm_bytes_per_s)
