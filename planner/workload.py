"""What the cluster is asked to run: the workload a plan is made for.

:class:`TrainingWorkload` (global batch, sequence length, dtype) is what the training planner
consumes today. ``Workload`` is the union the stages accept; a serving workload (input and output
lengths, latency targets: ``planner/serve``) joins the union without touching the mesh or the
per-layer options. A :class:`~planner.config.ParallelConfig` carries its training workload
(``config.workload``) next to its mesh (``config.mesh``) and its schedule choices.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union


@dataclass(frozen=True)
class TrainingWorkload:
    global_batch: int  # sequences per optimizer step
    seq_len: int  # tokens per sequence
    dtype: str = "bf16"  # compute dtype of the GEMMs

    kind = "training"

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    def num_micro_batches(self, dp: int, micro_batch: int) -> int:
        """Micro-batches per step on each data-parallel rank."""
        return self.global_batch // (micro_batch * dp)


from planner.serve.workload import ServingWorkload  # noqa: E402  (issue 13: planner/serve)

Workload = Union[TrainingWorkload, ServingWorkload]
