"""Executing plans on a real runtime: PyTorch distributed on CPU processes (gloo).

* :mod:`planner.runtime.model` builds a small llama-style decoder ``nn.Module`` from a
  :class:`~planner.ir.ModelGraph` whose parameter count equals the graph's exactly.
* :mod:`planner.runtime.torch_exec` runs a plan file with PyTorch's own parallel APIs
  (DeviceMesh, DTensor tensor parallelism, FSDP2 / ZeroRedundancyOptimizer, pipelining,
  activation checkpointing) and compares losses and held bytes with a single-process run and
  with the cost model (``shardplan verify``).

Nothing here imports torch at module import time of this package; the submodules do, so
``import planner.runtime`` is safe without the ``torch`` extra.
"""
