"""Applying a plan to one rank's model chunk with PyTorch's own APIs: tensor and sequence
parallelism (DTensor ``parallelize_module``, torchtitan's per-module plan), FSDP2 (ZeRO-3), the
ZeRO-2 gradient partitioning hook, and the helpers that read the mesh groups.

Consumes a :class:`~planner.runtime.model.Decoder` part and the rank's DeviceMesh; changes the
part in place (PyTorch's parallelization APIs work that way; the part is this rank's own copy).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
try:
    from torch.distributed.fsdp import fully_shard
except ImportError:  # pragma: no cover - PyTorch < 2.6
    from torch.distributed._composable.fsdp import fully_shard
try:
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
except ImportError:  # pragma: no cover - PyTorch 2.4
    from torch.distributed._tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                               PrepareModuleInputOutput, RowwiseParallel,
                                               SequenceParallel, parallelize_module)

from planner.runtime.measure import local
from planner.runtime.model import Block, Decoder, EmbeddingLayer, Head, MoeMlp


def apply_tensor_parallel(part: Decoder, tp_mesh, sp: bool, layer_meshes=None) -> None:
    """torchtitan's llama plan, module by module (PyTorch torch.distributed.tensor.parallel).
    ``layer_meshes``: per layer index, the 1-D tensor mesh of that layer's layout (None: no
    tensor parallelism for it); absent, every layer runs on ``tp_mesh``."""
    seq = Shard(1)
    for key, layer in part.layers.items():
        if layer_meshes is not None:
            tp_mesh = layer_meshes[int(key)]
            if tp_mesh is None:
                continue
        if isinstance(layer, EmbeddingLayer):
            parallelize_module(layer, tp_mesh, {"tok_embeddings": RowwiseParallel(
                input_layouts=Replicate(), output_layouts=seq if sp else Replicate())})
        elif isinstance(layer, Block):
            plan: dict[str, Any] = {
                "attention.q_proj": ColwiseParallel(),
                "attention.k_proj": ColwiseParallel(),
                "attention.v_proj": ColwiseParallel(),
                "attention.o_proj": RowwiseParallel(output_layouts=seq if sp else Replicate()),
            }
            moe = isinstance(layer.mlp, MoeMlp)
            if moe:
                plan.update(_moe_plan(layer.mlp, tp_mesh, sp))
            else:
                plan.update({
                    "mlp.gate_proj": ColwiseParallel(),
                    "mlp.up_proj": ColwiseParallel(),
                    "mlp.down_proj": RowwiseParallel(output_layouts=seq if sp else Replicate()),
                })
            if sp:
                plan.update({
                    "attention_norm": SequenceParallel(),
                    "attention": PrepareModuleInput(input_layouts=(seq,),
                                                    desired_input_layouts=(Replicate(),)),
                    "ffn_norm": SequenceParallel(),
                })
                if not moe:
                    plan["mlp"] = PrepareModuleInput(input_layouts=(seq,),
                                                     desired_input_layouts=(Replicate(),))
            parallelize_module(layer, tp_mesh, plan)
        elif isinstance(layer, Head):
            plan = {"lm_head": ColwiseParallel(input_layouts=seq if sp else Replicate(),
                                               output_layouts=Replicate())}
            if sp:
                plan["norm"] = SequenceParallel()
            parallelize_module(layer, tp_mesh, plan)


def _moe_plan(mlp: MoeMlp, tp_mesh, sp: bool) -> dict[str, Any]:
    """A MoE MLP under TP, as Megatron-Core's ``MoELayer``: it takes this rank's sequence
    shard (with sp the norm's ``Shard(1)`` output as it is; without sp the replicated input
    split on the sequence, a local slice whose backward all-gathers, and the output
    all-gathered back: Megatron-Core refuses MoE with TP and without SP in training, so this
    is the SP layer between replicated activations). The router is replicated (its weight a
    ``Replicate`` DTensor: the gradient comes out as the TP group's partial sum and is summed
    like the SP norms'), the routed experts stay plain local modules (the expert mesh:
    :meth:`MoeMlp.shard_experts`), the shared experts are a Colwise / Rowwise SwiGLU on the
    shard (all-gather in, reduce-scatter out to ``Shard(1)``)."""
    seq = Shard(1)
    mlp.router.weight = torch.nn.Parameter(
        distribute_tensor(mlp.router.weight.detach(), tp_mesh, (Replicate(),)))
    plan: dict[str, Any] = {"mlp": PrepareModuleInputOutput(
        input_layouts=(seq if sp else Replicate(),), desired_input_layouts=(seq,),
        output_layouts=(seq,), desired_output_layouts=(seq if sp else Replicate(),),
        use_local_output=True)}
    if mlp.shared is not None:
        plan.update({
            "mlp.shared": PrepareModuleInput(input_layouts=(seq,),
                                             desired_input_layouts=(Replicate(),)),
            "mlp.shared.gate_proj": ColwiseParallel(),
            "mlp.shared.up_proj": ColwiseParallel(),
            "mlp.shared.down_proj": RowwiseParallel(output_layouts=seq),
        })
    return plan


def apply_fsdp(part: Decoder, dp_mesh, edp_mesh=None) -> list[torch.nn.Parameter]:
    """FSDP2 per layer and per stage root over dp; with expert parallelism first each routed
    expert over the expert data-parallel mesh (torchtitan's ``apply_fsdp``: the MoE experts
    ``fully_shard`` on the ``dp_mod_ep`` mesh, the block then over dp, which leaves the
    experts' parameters to their own group). FSDP2 averages an expert's gradient over edp;
    torchtitan sets its divide factor to the whole dp group (``set_gradient_divide_factor``,
    a PREMUL_SUM reduce-scatter that gloo refuses: "Cannot use ReduceOp.PREMUL_SUM with
    Gloo"), so the runtime rescales those gradients by edp / dp after backward
    (:func:`rescale_expert_grads`). Returns the experts' parameters."""
    experts = []
    for layer in part.layers.values():
        if edp_mesh is not None and isinstance(layer, Block) and isinstance(layer.mlp, MoeMlp):
            for expert in layer.mlp.experts.values():
                fully_shard(expert, mesh=edp_mesh)
                experts.extend(expert.parameters())
        fully_shard(layer, mesh=dp_mesh)
    fully_shard(part, mesh=dp_mesh)
    return experts


def rescale_expert_grads(experts: list[torch.nn.Parameter], edp: int, dp: int) -> None:
    """An expert's gradient holds its EP group's tokens: summed over edp it holds all dp
    ranks', so the mean divides by dp, where FSDP2 divided by edp."""
    for p in experts:
        if p.grad is not None:
            local(p.grad).mul_(edp / dp)


class LocalShards:
    """Plain parameters aliasing each parameter's local shard (the parameter itself when it is
    not a DTensor). ZeroRedundancyOptimizer broadcasts ``param.data`` with ``dist.broadcast``,
    which has no DTensor sharding rule ("Operator c10d.broadcast_.default does not have a
    sharding strategy registered"), so under TP it runs on these: Adam is elementwise, and each
    TP rank's dp group owns the same local shards, as in Megatron's distributed optimizer."""

    def __init__(self, params: list[torch.nn.Parameter]) -> None:
        self.params = params
        self.proxies = [torch.nn.Parameter(p._local_tensor) if isinstance(p, DTensor) else p
                        for p in params]

    def clear_grads(self) -> None:
        for q in self.proxies:
            q.grad = None

    def load_grads(self) -> None:
        for p, q in zip(self.params, self.proxies):
            if q is not p:
                q.grad = None if p.grad is None else local(p.grad)


class Zero2Gradients:
    """ZeRO-2 gradient partitioning on top of ZeroRedundancyOptimizer's parameter partition:
    after each micro-batch's backward accumulates a parameter's gradient, reduce it to the dp
    rank owning the parameter, which adds it to its partition; every rank then frees it."""

    def __init__(self, params: list[torch.nn.Parameter], owner: dict, group, my_rank: int,
                 group_ranks: list[int]) -> None:
        self.owner, self.group, self.me, self.ranks = owner, group, my_rank, group_ranks
        self.partition: dict[torch.nn.Parameter, torch.Tensor] = {}
        self.handles = [p.register_post_accumulate_grad_hook(self._hook) for p in params]

    def _hook(self, p: torch.nn.Parameter) -> None:
        grad = local(aligned_grad(p))
        dist.reduce(grad, dst=self.ranks[self.owner[p]], op=dist.ReduceOp.SUM, group=self.group)
        if self.ranks[self.owner[p]] == self.me:
            if p in self.partition:
                self.partition[p].add_(grad)
            else:
                self.partition[p] = grad.clone()
        p.grad = None

    def finish(self, divide_by: float) -> None:
        for p, grad in self.partition.items():
            grad.div_(divide_by)
            if isinstance(p, DTensor):
                p.grad = DTensor.from_local(grad, p.device_mesh, p.placements, run_check=False)
            else:
                p.grad = grad
        self.partition = {}


def aligned_grad(p: torch.nn.Parameter) -> torch.Tensor:
    """``p.grad`` in ``p``'s own placements. DTensor's backward of the Rowwise (vocab-sharded)
    embedding returns a Replicate gradient (the whole vocab x hidden on every TP rank); this
    re-shards it, a local slice without communication."""
    grad = p.grad
    if isinstance(p, DTensor) and isinstance(grad, DTensor) and grad.placements != p.placements:
        grad = grad.redistribute(p.device_mesh, p.placements)
    return grad


def align_grad_layouts(params: list[torch.nn.Parameter], names: dict) -> list[dict]:
    """Re-shard gradients whose placements differ from their parameter's; what was changed."""
    changed = []
    for p in params:
        grad = p.grad
        if isinstance(p, DTensor) and isinstance(grad, DTensor) and \
                grad.placements != p.placements:
            changed.append({"param": names.get(id(p), "?"),
                            "param_placements": str(tuple(p.placements)),
                            "grad_placements": str(tuple(grad.placements)),
                            "param_local_shape": list(local(p).shape),
                            "grad_local_shape": list(local(grad).shape)})
            p.grad = aligned_grad(p)
    return changed


def _mesh_group(mesh, name: str):
    return mesh[name].get_group()


def _group_ranks(mesh, name: str) -> list[int]:
    sub = mesh[name]
    return [int(r) for r in sub.mesh.flatten().tolist()]
