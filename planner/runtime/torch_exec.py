"""Execute a plan with PyTorch distributed on CPU processes and check it against the planner.

:func:`verify_plan` takes a plan file (or its document), starts ``world_size`` CPU processes
(``torch.multiprocessing`` with the forkserver start method, gloo, ``MASTER_ADDR=127.0.0.1`` and
a free port), and in each one:

1. builds the DeviceMesh the plan describes, dims ``("pp", "dp", "cp", "tp")`` (Megatron order,
   TP innermost, so global rank ``((pp*dp + dp_rank)*cp + cp_rank)*tp + tp_rank`` as in
   :mod:`planner.cost.model`) with ``init_device_mesh("cpu", ...)``;
2. builds the whole model (:func:`planner.runtime.model.build_decoder`, same seed everywhere)
   and keeps the layers of its pipeline stage(s), as the plan assigns them layer by layer;
3. applies the plan with PyTorch's own APIs: tensor parallelism with DTensor
   ``parallelize_module`` (torchtitan's per-module plan: ColwiseParallel q/k/v/gate/up,
   RowwiseParallel o/down, embedding Rowwise, LM head Colwise, SequenceParallel norms and
   PrepareModuleInput when the plan's sp is on), activation checkpointing per layer
   (``torch.utils.checkpoint``: "full" the whole block, "selective" the attention core), data
   parallelism by ZeRO stage (see :data:`ZERO_IMPLEMENTATION`), and pipeline stages with
   ``torch.distributed.pipelining`` (``PipelineStage`` + ``Schedule1F1B``, or
   ``ScheduleInterleaved1F1B`` when the plan has virtual stages);
4. trains ``steps`` Adam steps on deterministic synthetic tokens (global batch and
   micro-batches as the plan says) and records its losses, the bytes of parameters, gradients
   and optimizer states it holds, and the peak of activations saved for backward.

The parent process trains the same model on the same data in one process (whole global batch,
no micro-batches) and compares the loss curves, and compares each rank's held bytes with the
cost model's prediction, recomputed exactly with :func:`planner.cost.model.evaluate` under
``RuntimeOptions(runtime="torch-fp32")`` on the plan's own config and placement.

Limits: context parallelism (cp > 1) and expert parallelism are not executed (the model
builder makes dense llama-style decoders only); tied embeddings only without TP and PP.
"""
from __future__ import annotations

import json
import math
import multiprocessing
import os
import socket
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
try:
    from torch.distributed.fsdp import fully_shard
except ImportError:  # pragma: no cover - PyTorch < 2.6
    from torch.distributed._composable.fsdp import fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                         ScheduleInterleaved1F1B)
try:
    from torch.distributed.tensor import DTensor, Replicate, Shard
except ImportError:  # pragma: no cover - PyTorch 2.4
    from torch.distributed._tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                               RowwiseParallel, SequenceParallel,
                                               parallelize_module)

from planner.config import ParallelConfig, RuntimeOptions
from planner.strategy import LayerPlacement
from planner.mesh import DIMS, Mesh
from planner.plan_types import Plan
from planner.errors import ErrorKind, PlannerError, invalid
from planner.ir import LayerKind, ModelGraph
from planner.runtime.measure import SavedTensorTracker, held_state_bytes, local, unique_params
from planner.runtime.model import (MEASURE, Block, Decoder, EmbeddingLayer, Head, build_decoder,
                                   decoder_shape, lm_loss, synthetic_batch)

DEFAULT_STEPS = 3
DEFAULT_SEED = 0
DEFAULT_LR = 3e-3
# fp32 everywhere; the distributed run sums the same products in another order (TP partial sums,
# DP/FSDP gradient averaging, micro-batch accumulation), which moves each loss by a few fp32
# ulps (~1e-7 relative); Adam's first steps normalise gradients, so differences stay at that
# level for a few steps (docs/verification.md: at most 1.1e-7 over nine plan shapes). 1e-4
# leaves three orders of magnitude of margin while a real fault moves the loss by 1e-3 or more
# (stale gradients under TP + ZeRO-1 moved the third loss by 2.3e-3).
LOSS_RTOL = 1e-4
MAX_PROCESSES = 16
DEFAULT_TIMEOUT_S = 600.0
MESH_DIMS = DIMS  # the rank layout is planner.mesh.Mesh's (TP innermost, PP outermost)

ZERO_IMPLEMENTATION = {
    0: "replicated parameters; gradients all-reduced (averaged) over dp after the last "
       "micro-batch (manual all_reduce on each local gradient shard)",
    1: "gradients all-reduced over dp, then torch.distributed.optim.ZeroRedundancyOptimizer "
       "(Adam): each dp rank keeps Adam states of the whole parameters assigned to it (greedy "
       "by size) and broadcasts them after its step",
    2: "ZeroRedundancyOptimizer (as ZeRO-1) plus gradient partitioning: a "
       "post-accumulate-grad hook reduces every parameter's gradient to the dp rank that owns "
       "it after each micro-batch's backward and frees it elsewhere (DeepSpeed ZeRO-2 "
       "semantics at whole-parameter granularity; FSDP2 with reshard_after_forward=False would "
       "also shard the resting weights, i.e. be ZeRO-3 memory)",
    3: "FSDP2 fully_shard per layer and per stage root over the dp mesh (weights, gradients "
       "and Adam states sharded on dim 0; weights all-gathered for forward and backward, "
       "gradients reduce-scattered per micro-batch)",
}


# ---------------------------------------------------------------------------------------------
# The plan: inputs, support checks, pipeline chunks
# ---------------------------------------------------------------------------------------------

def read_plan(plan: "str | os.PathLike | dict | Plan") -> tuple[Plan, str]:
    """The :class:`~planner.plan_types.Plan` (read and schema-validated by
    :mod:`planner.plan_io` when given a path) and its name."""
    from planner.plan_types import Plan

    if isinstance(plan, Plan):
        return plan, "<plan>"
    if isinstance(plan, dict):
        return Plan.from_dict(plan), "<plan document>"
    from planner.plan_io import load_plan, read_json_file

    try:
        doc = load_plan(plan)
    except PlannerError as error:
        if "jsonschema" not in error.message:
            raise
        # without jsonschema: strict JSON parsing only; Plan.from_dict checks what it reads
        doc = read_json_file(plan, "plan file")
    decoded = Plan.from_dict(doc)
    if len(decoded.placement.stage) != len(decoded.model.layers):
        raise invalid(f"plan has {len(decoded.placement.stage)} layer decisions for a model of "
                      f"{len(decoded.model.layers)} layers")
    return decoded, str(plan)


def pipeline_chunks(stages: Sequence[int], pp: int, virtual_stages: int) -> list[list[int]]:
    """Model chunks in pipeline order (runs of consecutive layers on one rank); chunk ``k``
    runs on pipeline rank ``k mod pp`` (PyTorch's and Megatron's interleaved layout)."""
    chunks: list[tuple[int, list[int]]] = []
    for index, stage in enumerate(stages):
        if chunks and chunks[-1][0] == stage:
            chunks[-1][1].append(index)
        else:
            chunks.append((stage, [index]))
    expected = pp * virtual_stages
    layout = [rank for rank, _ in chunks]
    if len(chunks) != expected or any(rank != k % pp for k, rank in enumerate(layout)):
        raise invalid(f"the plan's layer stages {list(stages)} do not form {expected} model "
                      f"chunks placed round-robin on {pp} pipeline ranks")
    return [layers for _, layers in chunks]


def unsupported(message: str) -> PlannerError:
    return PlannerError(ErrorKind.UNSUPPORTED, message)


def check_supported(inputs: Plan, max_processes: int = MAX_PROCESSES) -> None:
    c, model = inputs.config, inputs.model
    shape = decoder_shape(model)  # raises UNSUPPORTED for non-llama graphs
    if c.cp > 1:
        raise unsupported(
            f"context parallelism (cp {c.cp}) is not executed: PyTorch's context_parallel "
            "(ring attention) has no rule for the CPU attention kernel (\"NotImplementedError: "
            "Operator aten._scaled_dot_product_flash_attention_for_cpu.default does not have a "
            "sharding strategy registered.\", PyTorch 2.13)")
    if c.ep > 1:
        raise unsupported("expert parallelism is not executed (the runtime builds dense models)")
    if c.num_gpus > max_processes:
        raise unsupported(f"the plan needs {c.num_gpus} processes; the limit is "
                          f"{max_processes} (--max-processes)")
    if shape.num_kv_heads % c.tp:
        raise unsupported(f"tp {c.tp} does not divide the {shape.num_kv_heads} KV heads "
                          "(KV-head replication is not built)")
    if shape.tied and (c.tp > 1 or c.pp > 1):
        raise unsupported("tied embeddings are executed only without TP and PP")
    pipeline_chunks(inputs.placement.stage, c.pp, c.virtual_stages)


def runtime_options(inputs: Plan) -> RuntimeOptions:
    """What the CPU runtime is: torch-fp32 states, the plan's attention kernel and dropout."""
    rt = inputs.runtime
    return RuntimeOptions(runtime="torch-fp32", attention_kernel=rt.attention_kernel,
                          dropout=rt.dropout)


# ---------------------------------------------------------------------------------------------
# Worker side
# ---------------------------------------------------------------------------------------------

def apply_tensor_parallel(part: Decoder, tp_mesh, sp: bool) -> None:
    """torchtitan's llama plan, module by module (ecosystem.md B5)."""
    seq = Shard(1)
    for layer in part.layers.values():
        if isinstance(layer, EmbeddingLayer):
            parallelize_module(layer, tp_mesh, {"tok_embeddings": RowwiseParallel(
                input_layouts=Replicate(), output_layouts=seq if sp else Replicate())})
        elif isinstance(layer, Block):
            plan: dict[str, Any] = {
                "attention.q_proj": ColwiseParallel(),
                "attention.k_proj": ColwiseParallel(),
                "attention.v_proj": ColwiseParallel(),
                "attention.o_proj": RowwiseParallel(output_layouts=seq if sp else Replicate()),
                "mlp.gate_proj": ColwiseParallel(),
                "mlp.up_proj": ColwiseParallel(),
                "mlp.down_proj": RowwiseParallel(output_layouts=seq if sp else Replicate()),
            }
            if sp:
                plan.update({
                    "attention_norm": SequenceParallel(),
                    "attention": PrepareModuleInput(input_layouts=(seq,),
                                                    desired_input_layouts=(Replicate(),)),
                    "ffn_norm": SequenceParallel(),
                    "mlp": PrepareModuleInput(input_layouts=(seq,),
                                              desired_input_layouts=(Replicate(),)),
                })
            parallelize_module(layer, tp_mesh, plan)
        elif isinstance(layer, Head):
            plan = {"lm_head": ColwiseParallel(input_layouts=seq if sp else Replicate(),
                                               output_layouts=Replicate())}
            if sp:
                plan["norm"] = SequenceParallel()
            parallelize_module(layer, tp_mesh, plan)


def apply_fsdp(part: Decoder, dp_mesh) -> None:
    for layer in part.layers.values():
        fully_shard(layer, mesh=dp_mesh)
    fully_shard(part, mesh=dp_mesh)


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


def _worker(rank: int, job: dict) -> None:
    """One process of the distributed run (started by :func:`run_distributed`)."""
    torch.set_num_threads(1)
    # The decoder never modifies a layer's output in place (residuals are out-of-place), which
    # is what this FSDP2 warning about the TP embedding's view output is about.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    if sys.platform.startswith("linux"):  # all ranks on this host: loopback, whatever the
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # hostname resolves to
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(job["port"])
    out = Path(job["outdir"])
    try:
        dist.init_process_group("gloo", rank=rank, world_size=job["world_size"],
                                timeout=timedelta(seconds=job["timeout_s"]))
        try:
            result = _run_rank(rank, job)
        finally:
            dist.destroy_process_group()
        (out / f"rank{rank}.json").write_text(json.dumps(result))
    except BaseException as error:
        (out / f"rank{rank}.error.json").write_text(json.dumps({
            "rank": rank, "error": f"{type(error).__name__}: {error}",
            "traceback": traceback.format_exc()}))
        raise


def _run_rank(rank: int, job: dict) -> dict:
    from planner.serialize import model_from_dict

    t0 = time.perf_counter()
    c = job["config"]
    graph = model_from_dict(job["model"])
    layout = Mesh(pp=c["pp"], dp=c["dp"], cp=c["cp"], tp=c["tp"])
    pp, dp, tp = layout.pp, layout.dp, layout.tp
    mesh = init_device_mesh("cpu", layout.shape, mesh_dim_names=MESH_DIMS)
    coords = dict(zip(MESH_DIMS, mesh.get_coordinate()))
    m = c["global_batch"] // (c["micro_batch"] * dp)
    chunks = job["chunks"]
    mine = [k for k in range(len(chunks)) if k % pp == coords["pp"]]

    full = build_decoder(graph, job["seed"])
    parts = [Decoder({i: full.layers[str(i)] for i in chunks[k]}) for k in mine]
    del full
    for part in parts:
        for key, layer in part.layers.items():
            if isinstance(layer, Block):
                layer.set_recompute(job["recompute"][int(key)])
    if tp > 1:
        for part in parts:
            apply_tensor_parallel(part, mesh["tp"], c["sp"])
    zero = c["zero_stage"]
    if zero == 3:
        for part in parts:
            apply_fsdp(part, mesh["dp"])
    params = unique_params(parts)
    dp_group = _mesh_group(mesh, "dp")
    dp_ranks = _group_ranks(mesh, "dp")
    lr = job["lr"]
    shards = None
    if zero in (1, 2):
        shards = LocalShards(params)
        optimizer = ZeroRedundancyOptimizer(shards.proxies, optimizer_class=torch.optim.Adam,
                                            process_group=dp_group, lr=lr, foreach=False)
        optimizer_state = optimizer.optim.state
    else:
        optimizer = torch.optim.Adam(params, lr=lr, foreach=False)
        optimizer_state = optimizer.state
    zero2 = None
    if zero == 2:
        owner = {p: optimizer._param_to_rank[q] for p, q in zip(params, shards.proxies)}
        zero2 = Zero2Gradients(params, owner, dp_group, rank, dp_ranks)

    schedule = None
    first_pp, last_pp = coords["pp"] == 0, coords["pp"] == pp - 1
    mb, seq, hidden = c["micro_batch"], c["seq_len"], graph.hidden
    if pp > 1:
        seq_local = seq // tp if (tp > 1 and c["sp"]) else seq
        stages = []
        for k, part in zip(mine, parts):
            if k == 0:
                example_in = torch.zeros(mb, seq, dtype=torch.long)
            else:
                example_in = torch.empty(mb, seq_local, hidden, requires_grad=True)
            if k == len(chunks) - 1:
                example_out = torch.empty(mb, seq, graph.vocab, requires_grad=True)
            else:
                example_out = torch.empty(mb, seq_local, hidden, requires_grad=True)
            stages.append(PipelineStage(part, k, len(chunks), torch.device("cpu"),
                                        input_args=example_in, output_args=example_out,
                                        group=_mesh_group(mesh, "pp")))
        if c["virtual_stages"] > 1:
            schedule = ScheduleInterleaved1F1B(stages, n_microbatches=m, loss_fn=lm_loss)
        elif m < pp:  # see schedule_name()
            schedule = ScheduleGPipe(stages[0], n_microbatches=m, loss_fn=lm_loss)
        else:
            schedule = Schedule1F1B(stages[0], n_microbatches=m, loss_fn=lm_loss)

    names = {id(p): n for part in parts for n, p in part.named_parameters()}
    grad_layouts: list[dict] = []
    tracker = SavedTensorTracker(lambda: unique_params(parts))
    MEASURE.measure = True
    losses: list[float] = []
    step_seconds: list[float] = []
    rows = c["global_batch"] // dp
    setup_s = time.perf_counter() - t0
    for step in range(job["steps"]):
        t_step = time.perf_counter()
        inputs, labels = synthetic_batch(job["seed"], step, c["global_batch"], seq, graph.vocab)
        lo = coords["dp"] * rows
        inputs, labels = inputs[lo:lo + rows], labels[lo:lo + rows]
        # on the real parameters: under TP, ZeroRedundancyOptimizer.zero_grad would only
        # reach the local-shard proxies and leave the DTensor gradients to accumulate
        for p in params:
            p.grad = None
        if shards is not None:
            shards.clear_grads()
        micro_losses: list[torch.Tensor] = []
        with tracker.hooks():
            if schedule is not None:
                kwargs: dict[str, Any] = {}
                if last_pp:
                    kwargs.update(target=labels, losses=micro_losses)
                if first_pp:
                    schedule.step(inputs, **kwargs)
                else:
                    schedule.step(**kwargs)
            else:
                part = parts[0]
                for i in range(m):
                    sl = slice(i * mb, (i + 1) * mb)
                    loss = lm_loss(part(inputs[sl]), labels[sl])
                    (loss / m).backward()
                    micro_losses.append(loss.detach())
        fixed = align_grad_layouts(params, names)
        if step == 0:
            grad_layouts = fixed
        if zero2 is not None:
            zero2.finish(dp * (m if schedule is not None else 1))
        elif zero in (0, 1) and dp > 1:
            for p in params:
                if p.grad is not None:
                    dist.all_reduce(local(p.grad), group=dp_group)
                    local(p.grad).div_(dp)
        if shards is not None:
            shards.load_grads()
        optimizer.step()
        if last_pp:
            mean = torch.stack([x.float() for x in micro_losses]).mean()
            if dp > 1:
                dist.all_reduce(mean, group=dp_group)
                mean /= dp
            losses.append(float(mean.detach()))
        step_seconds.append(time.perf_counter() - t_step)
    MEASURE.measure = False
    held = held_state_bytes(params, optimizer_state)
    return {"rank": rank, "coords": coords, "stage": coords["pp"],
            "chunks": [chunks[k] for k in mine],
            "losses": losses if last_pp else None,
            "held": held, "activation_peak_bytes": tracker.peak,
            "num_param_tensors": len(params), "grad_layout_differences": grad_layouts,
            "optimizer_param_tensors": len(optimizer_state),
            "setup_s": setup_s, "step_s": step_seconds}


# ---------------------------------------------------------------------------------------------
# Parent side
# ---------------------------------------------------------------------------------------------

class RunFailed(Exception):
    def __init__(self, message: str, traceback_text: str = "") -> None:
        super().__init__(message)
        self.traceback_text = traceback_text


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_PRELOAD = ["planner.runtime.torch_exec"]


def _start_method() -> str:
    """forkserver where available: workers fork from a server that imported torch once
    (importing it in each of 8 processes costs more than the training steps); spawn else."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        multiprocessing.set_forkserver_preload(_PRELOAD)
        return "forkserver"
    return "spawn"


def _stop(processes) -> None:
    """Terminate our worker processes (only these, by handle), then kill what remains."""
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(timeout=5)
        if process.is_alive():
            process.kill()
            process.join(timeout=5)


def run_distributed(job: dict, world_size: int, timeout_s: float = DEFAULT_TIMEOUT_S
                    ) -> list[dict]:
    """Run ``_worker`` on ``world_size`` processes; the per-rank result dicts, by rank."""
    import torch.multiprocessing as tmp

    method = _start_method()
    for attempt in range(3):
        with tempfile.TemporaryDirectory(prefix="shardplan-verify-") as outdir:
            run = {**job, "outdir": outdir, "port": free_port(), "world_size": world_size,
                   "timeout_s": max(30.0, timeout_s)}
            context = tmp.start_processes(_worker, args=(run,), nprocs=world_size, join=False,
                                          start_method=method)
            deadline = time.monotonic() + timeout_s
            failure: Exception | None = None
            try:
                while not context.join(timeout=0.5):
                    if time.monotonic() > deadline:
                        _stop(context.processes)
                        raise RunFailed(f"the distributed run did not finish in {timeout_s:g} s")
            except (tmp.ProcessRaisedException, tmp.ProcessExitedException) as error:
                failure = error
            errors = sorted(Path(outdir).glob("rank*.error.json"))
            if failure is not None or errors:
                if errors:
                    first = json.loads(errors[0].read_text())
                    message, text = first["error"], first["traceback"]
                else:
                    message, text = str(failure).strip().splitlines()[-1], str(failure)
                if "address already in use" in message.lower() and attempt < 2:
                    continue
                raise RunFailed(message, text)
            return [json.loads((Path(outdir) / f"rank{r}.json").read_text())
                    for r in range(world_size)]
    raise RunFailed("could not start the process group")  # pragma: no cover


def reference_losses(graph: ModelGraph, config: ParallelConfig, steps: int, seed: int,
                     lr: float) -> list[float]:
    """The same model, data and optimizer in this process: the whole global batch per step."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # like each worker; intra-op threads only lose on a busy machine
    try:
        model = build_decoder(graph, seed)
        optimizer = torch.optim.Adam(model.parameters(), lr=lr, foreach=False)
        losses = []
        for step in range(steps):
            inputs, labels = synthetic_batch(seed, step, config.global_batch, config.seq_len,
                                             graph.vocab)
            optimizer.zero_grad(set_to_none=True)
            loss = lm_loss(model(inputs), labels)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
    finally:
        torch.set_num_threads(threads)
    return losses


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------

STATE_CATEGORIES = ("params", "grads", "optimizer")


@dataclass(frozen=True)
class StateCheck:
    """One model-state category on one rank: predicted vs held bytes."""

    category: str
    predicted: float
    held: int
    verdict: str  # "exact", "group-sum exact" or "mismatch"
    note: str = ""

    @property
    def difference(self) -> float:
        return self.held - self.predicted

    @property
    def ok(self) -> bool:
        return self.verdict != "mismatch"


@dataclass(frozen=True)
class RankReport:
    rank: int
    coords: dict
    stage: int
    layers: list
    states: tuple[StateCheck, ...]
    optimizer_step_counters: int
    activations_predicted: float  # the stage's activation memory (stored + working)
    activations_predicted_stored: float  # micro-batches in flight x stored bytes (no working)
    activations_measured: int
    setup_s: float
    step_s: list
    grad_layout_differences: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.states)


@dataclass
class VerifyReport:
    plan: str
    parallelism: dict
    world_size: int
    steps: int
    seed: int
    lr: float
    loss_rtol: float
    reference_losses: list[float]
    distributed_losses: list[float]
    ranks: list[RankReport]
    implementation: dict[str, str]
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    error_traceback: str | None = None
    seconds: dict = field(default_factory=dict)

    @property
    def loss_rel_diffs(self) -> list[float]:
        return [abs(d - r) / max(abs(r), 1e-12)
                for r, d in zip(self.reference_losses, self.distributed_losses)]

    @property
    def max_loss_rel_diff(self) -> float | None:
        diffs = self.loss_rel_diffs
        return max(diffs) if diffs else None

    @property
    def losses_ok(self) -> bool:
        return (self.error is None and len(self.distributed_losses) == self.steps
                and len(self.reference_losses) == self.steps
                and all(math.isfinite(x) for x in self.distributed_losses)
                and all(d <= self.loss_rtol for d in self.loss_rel_diffs))

    @property
    def states_ok(self) -> bool:
        return self.error is None and bool(self.ranks) and all(r.ok for r in self.ranks)

    @property
    def ok(self) -> bool:
        return self.losses_ok and self.states_ok

    def to_dict(self) -> dict:
        ranks = []
        for r in self.ranks:
            row = asdict(r)
            row["states"] = {s.category: {"predicted_bytes": s.predicted, "held_bytes": s.held,
                                          "difference_bytes": s.difference,
                                          "verdict": s.verdict, "note": s.note}
                             for s in r.states}
            row["ok"] = r.ok
            ranks.append(row)
        return {"plan": self.plan, "parallelism": self.parallelism,
                "world_size": self.world_size, "steps": self.steps, "seed": self.seed,
                "lr": self.lr,
                "loss": {"reference": self.reference_losses,
                         "distributed": self.distributed_losses,
                         "rel_diff": self.loss_rel_diffs,
                         "max_rel_diff": self.max_loss_rel_diff, "rtol": self.loss_rtol,
                         "ok": self.losses_ok},
                "states_ok": self.states_ok, "ok": self.ok, "ranks": ranks,
                "implementation": self.implementation, "notes": self.notes,
                "error": self.error, "error_traceback": self.error_traceback,
                "seconds": self.seconds}


def _sharded_categories(zero: int) -> dict[str, str]:
    """Categories whose per-rank split is the runtime's (not the plan's even split), and why."""
    zro = ("ZeroRedundancyOptimizer assigns whole parameters to dp ranks (greedy by size), "
           "not an even split of every tensor")
    if zero == 1:
        return {"optimizer": zro}
    if zero == 2:
        return {"grads": zro, "optimizer": zro}
    if zero == 3:
        fsdp = ("FSDP2 shards dim 0 with torch.chunk: when dim 0 is not divisible by dp the "
                "last ranks hold fewer rows (padding is not counted)")
        return {c: fsdp for c in STATE_CATEGORIES}
    return {}


def state_checks(config: ParallelConfig, stage_memory: Sequence[Any], results: list[dict]
                 ) -> dict[int, tuple[StateCheck, ...]]:
    """Compare each rank's held bytes with its stage's predicted bytes (see VerifyReport)."""
    shard_degree = config.dp * config.cp
    explained = _sharded_categories(config.zero_stage) if shard_degree > 1 else {}
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        key = (r["coords"]["pp"], r["coords"]["tp"])
        groups.setdefault(key, []).append(r)
    out: dict[int, tuple[StateCheck, ...]] = {}
    for r in results:
        memory = stage_memory[r["stage"]]
        checks = []
        for category in STATE_CATEGORIES:
            predicted = float(getattr(memory, category))
            held = int(r["held"][category])
            if abs(held - predicted) < 0.5:
                checks.append(StateCheck(category, predicted, held, "exact"))
                continue
            if category in explained:
                group = groups[(r["coords"]["pp"], r["coords"]["tp"])]
                total = sum(int(g["held"][category]) for g in group)
                if abs(total - predicted * len(group)) < 0.5:
                    checks.append(StateCheck(
                        category, predicted, held, "group-sum exact",
                        f"{explained[category]}; the {len(group)} ranks of the shard group hold "
                        f"{total:,} B = {len(group)} x predicted"))
                    continue
            checks.append(StateCheck(category, predicted, held, "mismatch",
                                     f"held {held:,} B, predicted {predicted:,.1f} B"))
        out[r["rank"]] = tuple(checks)
    return out


def schedule_name(config: ParallelConfig) -> str:
    """The PyTorch schedule class for the plan's pipeline. PyTorch's Schedule1F1B refuses fewer
    micro-batches than stages ("Number of microbatches (1) must be greater than or equal to the
    number of stages (2)"), which the planner allows; with m <= pp micro-batches 1F1B has no
    steady phase and is exactly GPipe (all m forwards, then all m backwards; min(pp - i, m) = m
    in flight on every stage), so ScheduleGPipe runs it."""
    if config.virtual_stages > 1:
        return "ScheduleInterleaved1F1B"
    return "ScheduleGPipe" if config.num_micro_batches < config.pp else "Schedule1F1B"


def implementation_summary(config: ParallelConfig, placement: LayerPlacement,
                           model: ModelGraph) -> dict[str, str]:
    c = config
    out = {"mesh": f"init_device_mesh('cpu', ({c.pp}, {c.dp}, {c.cp}, {c.tp}), "
                   f"mesh_dim_names=('pp', 'dp', 'cp', 'tp')), gloo"}
    if c.tp > 1:
        out["tp"] = ("DTensor parallelize_module: ColwiseParallel q/k/v/gate/up, RowwiseParallel "
                     "o/down, embedding RowwiseParallel, lm_head ColwiseParallel (output "
                     "Replicate)" + ("; SequenceParallel norms, PrepareModuleInput(Shard(1) -> "
                                     "Replicate) before attention and MLP" if c.sp else ""))
    if c.dp > 1 or c.zero_stage:
        out["dp"] = f"ZeRO-{c.zero_stage}: {ZERO_IMPLEMENTATION[c.zero_stage]}"
    if c.pp > 1:
        name = schedule_name(c)
        if name == "ScheduleGPipe":
            name += (f" (the plan's 1F1B with {c.num_micro_batches} micro-batch(es) < pp "
                     f"{c.pp}: identical order and memory; Schedule1F1B refuses m < pp)")
        counts = [sum(1 for i in placement.layers_of_stage(s)
                      if model.layers[i].kind is LayerKind.BLOCK) for s in range(c.pp)]
        out["pp"] = (f"torch.distributed.pipelining PipelineStage x {c.pp * c.virtual_stages} + "
                     f"{name}, {c.num_micro_batches} micro-batches; blocks per rank {counts}")
    modes = sorted({placement.recompute[i].value for i, layer in enumerate(model.layers)
                    if layer.kind is LayerKind.BLOCK})
    if modes != ["none"]:
        out["recompute"] = ("torch.utils.checkpoint(use_reentrant=False) per block: full = the "
                            "whole block, selective = the attention core (SDPA); "
                            f"modes in this plan: {', '.join(modes)}")
    return out


def verify_plan(plan: str | os.PathLike | dict | Plan, *, steps: int = DEFAULT_STEPS,
                seed: int = DEFAULT_SEED, lr: float = DEFAULT_LR, rtol: float = LOSS_RTOL,
                timeout_s: float = DEFAULT_TIMEOUT_S,
                max_processes: int = MAX_PROCESSES) -> VerifyReport:
    """Run ``plan`` for ``steps`` training steps on CPU processes and compare it with a
    single-process run (losses) and with the cost model (held bytes). Raises PlannerError for
    plans this runtime cannot execute; a failure inside the distributed run is reported in
    ``VerifyReport.error`` (with the exact exception)."""
    from planner.cost.model import evaluate

    if steps < 1:
        raise invalid(f"--steps must be at least 1, got {steps}")
    t0 = time.perf_counter()
    inputs, name = read_plan(plan)
    doc = inputs.document
    check_supported(inputs, max_processes)
    c = inputs.config
    options = runtime_options(inputs)
    ev = evaluate(inputs.model, inputs.cluster, c, inputs.placement, options)
    notes = []
    plan_runtime = inputs.runtime.runtime
    if plan_runtime != "torch-fp32":
        notes.append(f"the plan was made for runtime {plan_runtime!r}; predictions here are "
                     "re-evaluated with the torch-fp32 state layout this runtime has")
    else:
        for stage, predicted in zip(doc.get("stages", []), ev.stages):
            for key in STATE_CATEGORIES:
                written = predicted.memory.gib()[key]
                in_plan = stage["memory_gib"][key]
                if abs(written - in_plan) > 1e-5 * max(abs(in_plan), 1e-9):
                    notes.append(f"stage {stage['index']} {key}: the plan says {in_plan} GiB, "
                                 f"evaluate gives {written:.6g} GiB")
    if options.dropout:
        notes.append("the plan assumes dropout; the runtime trains without it")
    notes.append("activations: measured = peak bytes of fp32 tensors saved for backward "
                 "(parameters excluded, checkpoint inputs included, recompute working set not "
                 "seen); the prediction assumes 16-bit activations (ACT_BYTES = 2), so 2x the "
                 "predicted stored bytes is the like-for-like figure; eager PyTorch also saves "
                 "what fused kernels avoid (RoPE inputs, RMSNorm's normalised input, both "
                 "SwiGLU branches and their product, fp32 log-softmax of the loss)")
    chunks = pipeline_chunks(inputs.placement.stage, c.pp, c.virtual_stages)
    t_ref = time.perf_counter()
    reference = reference_losses(inputs.model, c, steps, seed, lr)
    t_dist = time.perf_counter()
    job = {"model": _model_dict(inputs.model), "config": _config_dict(c), "chunks": chunks,
           "recompute": [r.value for r in inputs.placement.recompute], "steps": steps,
           "seed": seed, "lr": lr}
    report = VerifyReport(plan=name, parallelism=dict(doc.get("parallelism", {})),
                          world_size=c.num_gpus, steps=steps, seed=seed, lr=lr, loss_rtol=rtol,
                          reference_losses=reference, distributed_losses=[], ranks=[],
                          implementation=implementation_summary(c, inputs.placement,
                                                                inputs.model),
                          notes=notes)
    try:
        results = run_distributed(job, c.num_gpus, timeout_s)
    except RunFailed as failure:
        report.error = str(failure)
        report.error_traceback = failure.traceback_text
        report.seconds = {"reference": t_dist - t_ref, "distributed": time.perf_counter() - t_dist,
                          "total": time.perf_counter() - t0}
        return report
    t_end = time.perf_counter()
    memory = [s.memory for s in ev.stages]
    stored = predicted_stored_activations(inputs, options)
    checks = state_checks(c, memory, results)
    reporter = next(r for r in results if r["coords"]["pp"] == c.pp - 1
                    and r["coords"]["dp"] == 0 and r["coords"]["tp"] == 0
                    and r["coords"]["cp"] == 0)
    report.distributed_losses = list(reporter["losses"])
    names = [layer.name for layer in inputs.model.layers]
    for r in results:
        report.ranks.append(RankReport(
            rank=r["rank"], coords=r["coords"], stage=r["stage"],
            layers=[[names[i] for i in chunk] for chunk in r["chunks"]],
            states=checks[r["rank"]],
            optimizer_step_counters=int(r["held"]["optimizer_step_counters"]),
            activations_predicted=float(memory[r["stage"]].activations),
            activations_predicted_stored=stored[r["stage"]],
            activations_measured=int(r["activation_peak_bytes"]),
            setup_s=r["setup_s"], step_s=r["step_s"],
            grad_layout_differences=r.get("grad_layout_differences", [])))
    report.seconds = {"reference": t_dist - t_ref, "distributed": t_end - t_dist,
                      "total": time.perf_counter() - t0}
    return report


def predicted_stored_activations(inputs: Plan, options: RuntimeOptions) -> list[float]:
    """Per stage: micro-batches in flight x the bytes its layers store for backward (the
    cost model's activations without the transient working set of the layer in backward),
    which is what the saved-tensor measurement sees."""
    from planner.cost.memory import in_flight_micro_batches
    from planner.cost.context import make_context
    from planner.cost.terms import layer_terms

    c, model, placement = inputs.config, inputs.model, inputs.placement
    ctx = make_context(model, inputs.cluster, c, options)
    out = []
    for stage in range(c.pp):
        per_micro_batch = sum(layer_terms(ctx, model.layers[i], placement.options[i])
                              .act_stored_bytes for i in placement.layers_of_stage(stage))
        out.append(in_flight_micro_batches(stage, c.pp, c.num_micro_batches, c.virtual_stages)
                   * per_micro_batch)
    return out


def _model_dict(model: ModelGraph) -> dict:
    from planner.serialize import model_to_dict

    return model_to_dict(model)


def _config_dict(c: ParallelConfig) -> dict:
    return {"tp": c.tp, "pp": c.pp, "dp": c.dp, "cp": c.cp, "sp": c.sp,
            "zero_stage": c.zero_stage, "micro_batch": c.micro_batch,
            "global_batch": c.global_batch, "seq_len": c.seq_len,
            "virtual_stages": c.virtual_stages}
