"""The single-process reference run: the same model on the same data, whole global batch, no
micro-batches; its losses are what the distributed run must reproduce.
"""
from __future__ import annotations


import torch

from planner.config import ParallelConfig
from planner.ir import ModelGraph
from planner.runtime.model import build_decoder, lm_loss, synthetic_batch


def reference_losses(graph: ModelGraph, config: ParallelConfig, steps: int, seed: int,
                     lr: float) -> list[float]:
    """The same model, data and optimizer in this process: the whole global batch per step."""
    return reference_run(graph, config, steps, seed, lr)[0]


def reference_run(graph: ModelGraph, config: ParallelConfig, steps: int, seed: int,
                  lr: float) -> tuple[list[float], float]:
    """:func:`reference_losses` and the sum of squares of the routed experts' gradients at the
    first step (float64; 0 without experts). Adam normalises a gradient's scale away, so a
    gradient averaged over the wrong group would move the losses by ~1e-7 only: the
    distributed run's first expert gradients are compared with this instead."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # like each worker; intra-op threads only lose on a busy machine
    try:
        model = build_decoder(graph, seed)
        optimizer = torch.optim.Adam(model.parameters(), lr=lr, foreach=False)
        losses = []
        expert_grad_sq = 0.0
        for step in range(steps):
            inputs, labels = synthetic_batch(seed, step, config.global_batch, config.seq_len,
                                             graph.vocab)
            optimizer.zero_grad(set_to_none=True)
            loss = lm_loss(model(inputs), labels)
            loss.backward()
            if step == 0:
                expert_grad_sq = float(sum(
                    p.grad.double().pow(2).sum() for n, p in model.named_parameters()
                    if ".mlp.experts." in n and p.grad is not None))
            optimizer.step()
            losses.append(float(loss.detach()))
    finally:
        torch.set_num_threads(threads)
    return losses, expert_grad_sq
