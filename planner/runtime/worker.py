"""One rank of a verification run: build the DeviceMesh the plan describes (dims and shape
from :class:`planner.mesh.Mesh`), keep this rank's pipeline chunks, apply the plan
(:mod:`planner.runtime.parallelize`), train the steps and write this rank's result file.

Runs inside the worker processes :mod:`planner.runtime.launch` starts; consumes the job dict
:func:`planner.runtime.torch_exec.verify_plan` builds.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                         ScheduleInterleaved1F1B)

from planner.mesh import DIMS, Mesh
from planner.runtime.experts import A2A, ETP
from planner.runtime.layouts import (MOVED, LayeredPart, Reshard, batch_rows, layout_meshes,
                                     merge_meshes)
from planner.runtime.measure import SavedTensorTracker, held_state_bytes, local, unique_params
from planner.runtime.model import (MEASURE, Block, Decoder, MoeMlp, build_decoder, lm_loss,
                                   synthetic_batch)
from planner.runtime.parallelize import (LocalShards, Zero2Gradients, _group_ranks, _mesh_group,
                                         align_grad_layouts, apply_fsdp, apply_tensor_parallel,
                                         rescale_expert_grads)


MESH_DIMS = DIMS  # the rank layout is planner.mesh.Mesh's (TP innermost, PP outermost)


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
    layout = Mesh(pp=c["pp"], dp=c["dp"], cp=c["cp"], tp=c["tp"], ep=c["ep"], etp=c["etp"])
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
    ep, etp = layout.ep, layout.expert_tp
    moe = any(isinstance(layer, Block) and isinstance(layer.mlp, MoeMlp)
              for part in parts for layer in part.layers.values())
    edp_group = edp_mesh = None
    # the routed experts keep their own mesh when it differs from the dense one: expert
    # parallelism, or tensor parallelism (the experts see each TP rank's sequence shard)
    expert_parallel = moe and (ep > 1 or tp > 1)
    if expert_parallel:  # the expert mesh folds the stage's ranks (Mesh.expert_coords)
        world = job["world_size"]
        expert_mesh = DeviceMesh("cpu", torch.arange(world).reshape(
            pp, layout.expert_dp, ep, etp), mesh_dim_names=("pp", "edp", "ep", "etp"))
        expert_coords = layout.expert_coords(rank)
        assert dict(zip(("pp", "edp", "ep", "etp"), expert_mesh.get_coordinate())) \
            == expert_coords, (expert_mesh.get_coordinate(), expert_coords)
        edp_mesh = expert_mesh["edp"]  # FSDP2 of the experts (size 1: whole experts)
        if layout.expert_dp > 1:
            edp_group = edp_mesh.get_group()
        for part in parts:
            for layer in part.layers.values():
                if isinstance(layer, Block) and isinstance(layer.mlp, MoeMlp):
                    layer.mlp.shard_experts(
                        expert_mesh.get_group("ep") if ep > 1 else None, expert_coords["ep"],
                        ep, expert_mesh.get_group("etp") if etp > 1 else None,
                        expert_coords["etp"], etp)
    degrees = job.get("degrees") or [tp] * len(graph.layers)
    mixed = any(t != tp for t in degrees)
    if mixed:  # per-layer layouts (planner.runtime.layouts)
        world = job["world_size"]
        meshes = layout_meshes(world, pp, degrees)
        pairs = [(min(a, b), max(a, b)) for a, b in zip(degrees, degrees[1:]) if a != b]
        merges = merge_meshes(world, pp, pairs)
        for part in parts:
            apply_tensor_parallel(part, None, c["sp"], {
                i: meshes[degrees[i]]["tensor"] if degrees[i] > 1 else None
                for i in part.indices()})
        parts = [LayeredPart(part, {
            i: Reshard(degrees[i - 1], degrees[i],
                       merges[(min(degrees[i - 1], degrees[i]), max(degrees[i - 1], degrees[i]))])
            for i in part.indices() if i > 0 and degrees[i] != degrees[i - 1]})
            for part in parts]
    elif tp > 1:
        for part in parts:
            apply_tensor_parallel(part, mesh["tp"], c["sp"])
    zero = c["zero_stage"]
    fsdp_experts: list = []
    if zero == 3:
        for part in parts:
            fsdp_experts += apply_fsdp(part, mesh["dp"], edp_mesh if expert_parallel else None)
    params = unique_params(parts)
    # routed experts split over ep: their gradients and ZeRO states go over the expert data
    # parallel group (edp), everything else over dp
    expert_ids = {id(p) for part in parts for n, p in part.named_parameters()
                  if expert_parallel and ".mlp.experts." in n}
    dp_group = _mesh_group(mesh, "dp")
    dp_ranks = _group_ranks(mesh, "dp")
    lr = job["lr"]
    shards = None
    if zero in (1, 2):
        shards = LocalShards(params)
        dense = [q for p, q in zip(params, shards.proxies) if id(p) not in expert_ids]
        routed = [q for p, q in zip(params, shards.proxies) if id(p) in expert_ids]
        optimizer = ZeroRedundancyOptimizer(dense, optimizer_class=torch.optim.Adam,
                                            process_group=dp_group, lr=lr, foreach=False)
        optimizers = [optimizer]
        if routed:
            optimizers.append(
                ZeroRedundancyOptimizer(routed, optimizer_class=torch.optim.Adam,
                                        process_group=edp_group, lr=lr, foreach=False)
                if edp_group is not None else torch.optim.Adam(routed, lr=lr, foreach=False))
        optimizer_states = [o.optim.state if isinstance(o, ZeroRedundancyOptimizer) else o.state
                            for o in optimizers]  # filled by the steps
    else:
        optimizer = torch.optim.Adam(params, lr=lr, foreach=False)
        optimizers = [optimizer]
        optimizer_states = [optimizer.state]
    zero2: list[Zero2Gradients] = []
    whole_expert_grads: list = []  # ZeRO-2 experts of edp 1: their gradients stay whole
    if zero == 2:
        owner = {p: optimizer._param_to_rank[q] for p, q in zip(params, shards.proxies)
                 if id(p) not in expert_ids}
        zero2.append(Zero2Gradients(list(owner), owner, dp_group, rank, dp_ranks))
        experts = [(p, q) for p, q in zip(params, shards.proxies) if id(p) in expert_ids]
        if experts and edp_group is not None:  # expert gradients partitioned over edp
            owner = {p: optimizers[1]._param_to_rank[q] for p, q in experts}
            zero2.append(Zero2Gradients(list(owner), owner, edp_group, rank,
                                        list(layout.group("edp", rank))))
        else:
            whole_expert_grads = [p for p, _ in experts]

    schedule = None
    first_pp, last_pp = coords["pp"] == 0, coords["pp"] == pp - 1
    mb, seq, hidden = c["micro_batch"], c["seq_len"], graph.hidden
    rows_of = [mb * t // tp for t in degrees]  # sequences per micro-batch, per layer's group
    if pp > 1:
        seq_local = seq // tp if (tp > 1 and c["sp"]) else seq
        stages = []
        for k, part in zip(mine, parts):
            first, last = chunks[k][0], chunks[k][-1]
            if k == 0:
                example_in = torch.zeros(rows_of[first], seq, dtype=torch.long)
            else:
                example_in = torch.empty(rows_of[first - 1], seq_local, hidden,
                                         requires_grad=True)
            if k == len(chunks) - 1:
                example_out = torch.empty(rows_of[last], seq, graph.vocab, requires_grad=True)
            else:
                example_out = torch.empty(rows_of[last], seq_local, hidden, requires_grad=True)
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
    delays: list[float] = []
    # this rank's tensor group (its index among the stage's groups) under a layer's degree
    stage_rank = coords["dp"] * tp + coords["tp"]
    group_of = [stage_rank // t for t in degrees]
    data_groups = {t: meshes[t]["data"].get_group() for t in meshes} if mixed else {}
    layer_of = {id(p): int(n.split(".")[1]) for part in parts
                for n, p in part.named_parameters()}
    head_groups = dp * tp // degrees[-1]  # the loss is averaged over the head's data groups
    reshard_bytes: list[list[int]] = []
    a2a_bytes: list[list[int]] = []
    expert_grad_sq = 0.0
    etp_bytes: list[list[int]] = []
    setup_s = time.perf_counter() - t0
    for step in range(job["steps"]):
        t_step = time.perf_counter()
        MOVED.reset()
        A2A.reset()
        ETP.reset()
        inputs, labels = synthetic_batch(job["seed"], step, c["global_batch"], seq, graph.vocab)
        inputs = batch_rows(inputs, m, mb * dp, group_of[0], rows_of[0])
        labels = batch_rows(labels, m, mb * dp, group_of[-1], rows_of[-1])
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
                n_in, n_out = rows_of[0], rows_of[-1]
                for i in range(m):
                    loss = lm_loss(part(inputs[i * n_in:(i + 1) * n_in]),
                                   labels[i * n_out:(i + 1) * n_out])
                    (loss / m).backward()
                    micro_losses.append(loss.detach())
        # a straggler (verify --slow): this rank's compute takes ``factor`` times as long;
        # its peers wait for it at the next collective (gradients, pipeline sends)
        factor = float(job.get("slow", {}).get(str(rank), 1.0))
        if factor > 1.0:
            delay = (factor - 1.0) * (time.perf_counter() - t_step)
            time.sleep(delay)
            delays.append(delay)
        rescale_expert_grads(fsdp_experts, layout.expert_dp, dp)
        fixed = align_grad_layouts(params, names)
        if step == 0:
            grad_layouts = fixed
        if mixed:  # each layer's gradient summed over its own data group (zero 0)
            for p in params:
                if p.grad is not None:
                    t = degrees[layer_of[id(p)]]
                    if dp * tp // t > 1:
                        dist.all_reduce(local(p.grad), group=data_groups[t])
                    local(p.grad).div_(head_groups)
        elif zero2:
            for partition in zero2:
                partition.finish(dp * (m if schedule is not None else 1))
            for p in whole_expert_grads:  # already all the EP group's tokens (edp 1)
                if p.grad is not None:
                    local(p.grad).div_(dp)
        elif zero in (0, 1) and dp > 1:
            for p in params:
                if p.grad is not None:
                    # an expert's gradient already holds its EP group's tokens (the combine's
                    # backward brought them); summed over edp it holds all dp ranks' tokens
                    group = edp_group if id(p) in expert_ids else dp_group
                    if group is not None:
                        dist.all_reduce(local(p.grad), group=group)
                    local(p.grad).div_(dp)
        if shards is not None:
            shards.load_grads()
        if step == 0:  # the routed experts' first gradients, as held (local shards)
            expert_grad_sq = float(sum(local(p.grad).double().pow(2).sum() for p in params
                                       if id(p) in expert_ids and p.grad is not None))
        for o in optimizers:
            o.step()
        if last_pp:
            mean = torch.stack([x.float() for x in micro_losses]).mean()
            if mixed and head_groups > 1:
                dist.all_reduce(mean, group=data_groups[degrees[-1]])
                mean /= head_groups
            elif not mixed and dp > 1:
                dist.all_reduce(mean, group=dp_group)
                mean /= dp
            losses.append(float(mean.detach()))
        reshard_bytes.append([MOVED.forward_bytes, MOVED.backward_bytes])
        a2a_bytes.append([A2A.forward_bytes, A2A.backward_bytes])
        etp_bytes.append([ETP.forward_bytes, ETP.backward_bytes])
        step_seconds.append(time.perf_counter() - t_step)
    MEASURE.measure = False
    all_states = {p: state for states in optimizer_states for p, state in states.items()}
    held = held_state_bytes(params, all_states)
    # the routed experts' share (under ZeRO-1 their proxies are the parameters: tp 1)
    experts = [p for part in parts for n, p in part.named_parameters() if ".mlp.experts." in n]
    held_experts = held_state_bytes(experts, {p: all_states[p] for p in experts
                                              if p in all_states})
    return {"rank": rank, "coords": coords, "stage": coords["pp"],
            "chunks": [chunks[k] for k in mine],
            "losses": losses if last_pp else None,
            "held": held, "held_experts": held_experts, "activation_peak_bytes": tracker.peak,
            "num_param_tensors": len(params), "grad_layout_differences": grad_layouts,
            "optimizer_param_tensors": sum(len(states) for states in optimizer_states),
            "setup_s": setup_s, "step_s": step_seconds,
            "reshard_bytes": reshard_bytes, "a2a_bytes": a2a_bytes, "etp_bytes": etp_bytes,
            "expert_grad_sq": expert_grad_sq if expert_ids else None, "degrees": degrees,
            "injected_delay_s": delays}
