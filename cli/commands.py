"""The commands. Each one: parse -> one library call -> render (JSON on stdout, rich on stderr)."""
from __future__ import annotations

import click

from cli import signals
from cli.app import deliver_plan, emit_json
from cli.moe_options import (cross_entropy_from, fp8_attention_from, moe_option,
                             moe_options_from, recompute_modules_from, with_mtp_from)
from cli.params import FiniteFloat, pin_pairs
from planner.config import ParallelConfig, resolve_dp
from planner.cost.pipeline import SCHEDULES
from planner.hardware import MultiPoolCluster
from planner.placement import runtime_placement
from planner.strategy import LayerOption, Recompute


def _load(model: str, cluster: str | None, nodes: int | None, seq_len: int | None,
          multi_pool: bool = False):
    from clusters import load_cluster
    from models import load_model

    ctx = click.get_current_context(silent=True)
    importer = ctx.meta.get("shardplan.importer", "config") if ctx is not None else "config"
    graph = load_model(model, seq_len=seq_len, importer=importer)
    return graph, (load_cluster(cluster, nodes=nodes, multi_pool=multi_pool)
                   if cluster is not None else None)


def _store_importer(ctx: click.Context, param: click.Parameter, value: str) -> str:
    ctx.meta["shardplan.importer"] = value
    return value


_model = click.option("--model", "-m", "model", required=True, metavar="M",
                      help="Preset name, HF config.json, native model file, .onnx or .pt2.")
_importer = click.option("--importer", type=click.Choice(["config", "graph"]), default="config",
                         show_default=True, expose_value=False, callback=_store_importer,
                         help="HF configs: config arithmetic, or trace the model's operator "
                              "graph on the meta device (needs shardplan[graph]).")


def model_option(f):
    """--model and --importer (the importer reaches _load through the click context)."""
    return _model(_importer(f))
cluster_option = click.option("--cluster", "-c", "cluster", required=True, metavar="C",
                              help="Cluster preset name or cluster YAML file.")
nodes_option = click.option("--nodes", type=click.IntRange(min=1), default=None,
                            help="Number of nodes (scales the cluster preset).")
json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print one JSON document on stdout instead of tables.")
# Sequences per step. Real runs use thousands; the bound catches unit slips (tokens for
# sequences) and keeps the search's divisor enumeration (sqrt of the batch) instant.
MAX_GLOBAL_BATCH = 1 << 24
global_batch_type = click.IntRange(min=1, max=MAX_GLOBAL_BATCH)
global_batch_option = click.option("--global-batch", type=global_batch_type, required=True,
                                   help="Sequences per optimizer step.")
seq_len_option = click.option("--seq-len", type=click.IntRange(min=1), default=None,
                              help="Sequence length (default: the model's).")
dtype_option = click.option("--dtype", type=click.Choice(["bf16", "fp16", "fp8"]),
                            default="bf16", show_default=True)
attention_option = click.option("--attention", "attention_kernel",
                                type=click.Choice(["flash", "eager"]), default="flash",
                                show_default=True, help="Attention kernel of the runtime.")
dropout_option = click.option(
    "--dropout/--no-dropout", default=False, show_default=True,
    help="The run trains with attention and hidden dropout (GPT-3-era recipes; Megatron-LM's "
         "default 0.1): costs the 1-byte masks and their traffic, and the eager attention "
         "core's dropout on the scores. Recorded in the plan; the Megatron export then keeps "
         "Megatron's default rate.")
RUNTIME_CHOICES = ("megatron", "torchtitan", "deepspeed", "fsdp", "deepspeed-bf16", "torch-fp32",
                   "zero-paper")
runtime_option = click.option(
    "--runtime", type=click.Choice(RUNTIME_CHOICES), default="megatron", show_default=True,
    help="Target runtime profile (megatron, torchtitan, deepspeed, fsdp): what it can run, its "
         "memory layout and overlap. Legacy state-layout names are accepted.")
compile_option = click.option(
    "--compile/--no-compile", "compiled", default=False, show_default=True,
    help="The runtime runs under torch.compile (torchtitan --compile.enable, llm-foundry "
         "compile_config): its element-wise ops fused, and torchtitan's async TP. Recorded in "
         "the plan; the torchtitan export then enables compile.")
elementwise_option = click.option(
    "--elementwise", type=click.Choice(["fused", "eager"]), default=None,
    help="The runtime's element-wise ops (norms, RoPE, activations): fused kernels (torch."
         "compile, or Transformer Engine's fused modules without it, as NeMo AutoModel's TE "
         "backend) or eager PyTorch (default: fused with --compile or where the runtime's "
         "kernels are fused, megatron and deepspeed; eager for torchtitan and fsdp).")
calibration_option = click.option(
    "--calibration", "calibration", default=None, metavar="PROFILE.yaml",
    type=click.Path(dir_okay=False),
    help="Calibration profile from `shardplan calibrate` (default: the shipped constants).")


dp_shard_option = click.option(
    "--dp-shard", type=click.IntRange(min=1), default=None, metavar="N",
    help="Hybrid sharding (HSDP): shard ZeRO / FSDP states over groups of N data-parallel "
         "ranks, replicated over dp / N groups (default: over all of dp; `plan` searches "
         "node-aligned groups where the runtime runs HSDP).")


hpz_option = click.option(
    "--hpz", type=click.IntRange(min=0), default=0, show_default=True, metavar="N",
    help="ZeRO++ hpZ (DeepSpeed zero_hpz_partition_size): ZeRO-3 keeps a secondary weight "
         "partition over groups of N ranks (one node), gathered over them in every pass but "
         "the step's first forward; 0 = off (`plan` searches it with --runtime deepspeed).")


# --time-limit: a day is beyond any plan search; the bound keeps deadlines finite.
MAX_TIME_LIMIT_S = 86_400.0


def time_limit_slack_s(limit_s: float) -> float:
    """How far past ``--time-limit`` a command may run (documented in docs/reliability.md):
    stopping a solve in progress, the does-not-fit explanation and writing the answer."""
    return max(1.0, 0.1 * limit_s)


@click.command()
@model_option
@cluster_option
@nodes_option
@global_batch_option
@seq_len_option
@click.option("--tp", type=click.IntRange(min=1), required=True, help="Tensor-parallel degree.")
@click.option("--pp", type=click.IntRange(min=1), required=True, help="Pipeline-parallel degree.")
@click.option("--dp", type=click.IntRange(min=1), default=None,
              help="Data-parallel degree (default: what the GPU count leaves).")
@click.option("--cp", type=click.IntRange(min=1), default=1, show_default=True,
              help="Context-parallel degree.")
@click.option("--ep", type=click.IntRange(min=1), default=1, show_default=True,
              help="Expert-parallel degree (MoE models).")
@click.option("--etp", type=click.IntRange(min=1), default=None,
              help="Expert tensor-parallel degree (default: tp); expert data parallelism is "
                   "what the GPUs of a stage leave: tp x cp x dp / (etp x ep).")
@click.option("--micro-batch", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--zero", "zero_stage", type=click.Choice(["0", "1", "2", "3"]), default="1",
              show_default=True, help="ZeRO stage (1 = distributed optimizer).")
@click.option("--recompute", type=click.Choice([r.value for r in Recompute]), default="none",
              show_default=True, help="Activation recomputation of every block.")
@click.option("--sp/--no-sp", default=None,
              help="Sequence parallelism (default: on when tp > 1).")
@click.option("--virtual-stages", type=click.IntRange(min=1), default=None,
              help="Interleaved 1F1B model chunks per pipeline rank (default: 1, or what "
                   "--pipeline-layout's chunk count gives).")
@click.option("--schedule", type=click.Choice(list(SCHEDULES)), default=None,
              help="Pipeline schedule (default: 1f1b, or interleaved-1f1b with "
                   "--virtual-stages > 1; zbv and dualpipev take --virtual-stages 2).")
@click.option("--pp-partition", default=None,
              help="DeepSpeed's PipelineModule partition_method 'type:REGEX' for the stage "
                   "split (--runtime deepspeed; default Megatron-DeepSpeed's type:transformer).")
@click.option("--pipeline-layout", default=None, metavar="LAYOUT",
              help="Place the layers as Megatron-Core's --pipeline-model-parallel-layout "
                   "writes them: E embedding, t decoder layer, m MTP layer, L loss, | between "
                   "the pp x v model chunks (chunk k on rank k mod pp), (...)*N and x*N "
                   "repeat; e.g. 'Et|(tt|)*62tL' (Llama 3.1 405B, pp 16 x 4). Needs a "
                   "runtime that runs uneven chunks (megatron, torchtitan).")
@dp_shard_option
@hpz_option
@dtype_option
@attention_option
@dropout_option
@runtime_option
@compile_option
@elementwise_option
@calibration_option
@moe_option
@json_option
def evaluate(model, cluster, nodes, global_batch, seq_len, tp, pp, dp, cp, ep, etp, micro_batch,
             zero_stage, recompute, sp, virtual_stages, schedule, pp_partition, pipeline_layout,
             dp_shard, hpz, dtype, attention_kernel, dropout, runtime, compiled, elementwise,
             calibration, as_json, **moe):
    """Predict step time and per-GPU memory of one given configuration."""
    from planner.calibration.session import prediction_intervals, runtime_setup
    from planner.cost.model import evaluate as run
    from planner.report import evaluation_dict

    graph, hw = _load(model, cluster, nodes, seq_len)
    graph = with_mtp_from(moe, graph)
    setup = runtime_setup(hw, runtime, dtype, attention_kernel, calibration,
                          moe=moe_options_from(moe),
                          recompute_modules=recompute_modules_from(moe),
                          cross_entropy=cross_entropy_from(moe),
                          fp8_attention=fp8_attention_from(moe), dropout=dropout,
                          compiled=compiled, elementwise=elementwise)
    hw = setup.cluster
    if dp is None:
        dp = resolve_dp(hw.num_gpus, tp, pp, cp)
    if pipeline_layout is not None:  # Megatron's syntax (planner/pipeline_layout.py)
        from planner.pipeline_layout import parse_layout

        layout = parse_layout(pipeline_layout)
        if virtual_stages is None:  # the layout's chunks per rank
            virtual_stages = layout.virtual_stages(pp)
    config = ParallelConfig(
        tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp or 0, global_batch=global_batch,
        seq_len=graph.default_seq_len, sp=(tp > 1) if sp is None else sp,
        zero_stage=int(zero_stage), micro_batch=micro_batch, virtual_stages=virtual_stages or 1,
        dtype=dtype, dp_shard=0 if dp_shard in (None, dp) else dp_shard,
        pipeline_schedule=schedule or "", hpz=hpz, pipeline_layout=pipeline_layout or "")
    options = setup.options
    config.validate(graph, hw)
    placement = runtime_placement(graph, config, setup.profile, LayerOption(Recompute(recompute)),
                                  pp_partition or "")
    ev = run(graph, hw, config, placement, options=options)
    result = evaluation_dict(ev)
    result["predicted"].update(prediction_intervals(ev, setup.calibration))
    # what the named runtime cannot run (check --runtime's rules): predicted all the same, a
    # what-if, but said, as `plan --runtime` would never propose it
    from planner.check_runtime import runtime_problems
    from planner.plan_types import Plan

    unrunnable = runtime_problems(Plan(graph, hw, config, placement, options, {}), setup.profile)
    result["runtime_problems"] = [problem.message for problem in unrunnable]
    from planner.cost.recompute_modules import module_notes

    notes = module_notes(graph, options.recompute_modules, recompute)
    if notes:  # written only then: evaluate documents keep their keys otherwise
        result["warnings"] = notes
    if as_json:
        emit_json(result)
    else:
        from cli.render import print_evaluation

        print_evaluation(result)
    if not ev.fits:  # the prediction is printed; the exit code says it does not fit
        click.get_current_context().exit(1)


@click.command()
@model_option
@seq_len_option
@json_option
def inspect(model, seq_len, as_json):
    """Show a model's parameters (total, active), layers and shapes."""
    from planner.inspect import model_summary

    graph, _ = _load(model, None, None, seq_len)
    summary = model_summary(graph)
    if as_json:
        emit_json(summary)
    else:
        from cli.render import print_model

        print_model(summary)


@click.command("models")
@json_option
def models_command(as_json):
    """List the built-in model presets."""
    from models import list_presets

    rows = [{"name": p.name, "params": p.params, "active_params": p.active_params,
             "num_layers": p.num_layers, "description": p.description, "source": p.source}
            for p in list_presets()]
    if as_json:
        emit_json({"models": rows})
    else:
        from cli.render import print_rows

        print_rows("Model presets", rows, ["name", "params", "active_params", "num_layers",
                                           "description"])


@click.command("clusters")
@json_option
def clusters_command(as_json):
    """List the built-in cluster presets."""
    from clusters import list_cluster_presets

    from clusters import list_pool_presets

    def one(c) -> dict:  # a one-pool preset, or one pool of a multi-pool preset
        return {"name": c.name, "gpu": c.gpu.name, "gpu_memory_gib": c.gpu.memory_gib,
                "gpus_per_node": c.gpus_per_node, "num_nodes": c.num_nodes,
                "interconnect": " / ".join(f"{t.name} {t.bandwidth_gbytes_per_s:g} GB/s"
                                           for t in c.tiers)}

    rows = [dict(one(c), description=c.description) for c in list_cluster_presets()]
    # the presets of GPU pools joined by one link (plan, plan-pools; docs/heterogeneous.md)
    pooled = [{"name": c.name, "description": c.description,
               "inter_pool": f"{c.inter_pool.bandwidth_gbytes_per_s:g} GB/s",
               "pools": [one(p) for p in c.pools]} for c in list_pool_presets()]
    if as_json:
        emit_json({"clusters": rows, "pool_clusters": pooled})
    else:
        from cli.render import print_rows

        columns = ["name", "gpu", "gpu_memory_gib", "gpus_per_node", "num_nodes", "interconnect"]
        print_rows("Cluster presets", rows, columns)
        print_rows("Multi-pool cluster presets (plan, plan-pools)",
                   [dict(p, name=c["name"], pool=p["name"], inter_pool=c["inter_pool"])
                    for c in pooled for p in c["pools"]],
                   ["name", "pool", *columns[1:], "inter_pool"])


@click.command()
@model_option
@cluster_option
@nodes_option
@global_batch_option
@seq_len_option
@dtype_option
@click.option("--time-limit", type=FiniteFloat(0.1, MAX_TIME_LIMIT_S, unit="seconds"),
              default=60.0, show_default=True,
              help="Seconds for the whole command (plus a slack of max(1 s, 10%)); on expiry "
                   "the best plan so far is returned marked FEASIBLE, or exit 3 if none.")
@click.option("--work-limit", type=click.IntRange(min=1, max=1_000_000), default=None,
              help="Solve at most this many configurations: a deterministic budget (the same "
                   "plan on any machine), unlike --time-limit.")
@click.option("--workers", type=click.IntRange(min=1, max=64), default=1, show_default=True,
              help="CP-SAT workers (1 = deterministic).")
@click.option("--top-k", type=click.IntRange(min=1, max=50), default=3, show_default=True,
              help="Also report this many runners-up.")
@click.option("--pin", "pins", multiple=True, metavar="KEY=VALUE",
              help="Fix a choice: tp, pp, dp, cp, ep, etp, sp, zero, micro_batch, "
                   "virtual_stages, schedule, recompute, layouts (mesh or per-layer), offload "
                   "(none, optimizer, activations or both: host memory, needs a cluster host: "
                   "section), pipeline_layout (Megatron-Core's --pipeline-model-parallel-layout, "
                   "e.g. 'Et|(tt|)*62tL': fixes pp x virtual stages and the block placement). "
                   "Repeatable.")
@dp_shard_option
@click.option("--memory-headroom", default="5%", show_default=True, metavar="H",
              help="GPU memory the search keeps free of the plan: a fraction (0.05 or 5%) or "
                   "an amount (4GiB); 0 plans to the last byte. Recorded in the plan.")
@click.option("--memory-confidence", type=click.FloatRange(0.5, 0.99), default=0.5,
              show_default=True, metavar="Q",
              help="Plans must fit (within the headroom) at this quantile of their peak-memory "
                   "error band, the gate of `check --memory-confidence` (0.9: with 90 % "
                   "confidence; 0.5: the prediction). Recorded in the plan; check gates at it.")
@attention_option
@dropout_option
@runtime_option
@compile_option
@elementwise_option
@calibration_option
@moe_option
@click.option("-o", "--output", default=None, metavar="FILE",
              help="Write the plan file here (- for standard output).")
@click.option("--force", is_flag=True, help="Overwrite an existing output file.")
@click.option("--timings", is_flag=True,
              help="Record the solve's wall-clock time in the plan (it then differs run to run).")
@click.option("--fallbacks", type=click.IntRange(min=0, max=3), default=0, show_default=True,
              help="Also store the re-plans for the K most likely failure classes (1: one GPU, "
                   "2: + one node, 3: + one leaf switch); `check` validates them.")
@click.option("--fallback-max-moved-layers", type=click.IntRange(min=0), default=None,
              help="Churn budget of the fallbacks: layers that may change stage (default any).")
@json_option
def plan(model, cluster, nodes, global_batch, seq_len, dtype, time_limit, work_limit, workers,
         top_k, pins, dp_shard, memory_headroom, memory_confidence, attention_kernel, dropout,
         runtime, compiled, elementwise, calibration, output, force, timings, fallbacks,
         fallback_max_moved_layers, as_json, **moe):
    """Search the fastest plan that fits memory and write it as a plan file."""
    from planner.plan import make_plan
    from planner.report import rounded
    from planner.solve.gate import DEFAULT_CONFIDENCE
    from planner.solve.headroom import MemoryHeadroom
    from planner.solve.search import SearchOptions, search
    from planner.solve.space import Pins
    from planner.writer import check_target

    pairs = pin_pairs(pins)
    if dp_shard is not None:  # --dp-shard N is --pin dp_shard=N
        if any(k.strip().replace("-", "_") == "dp_shard" for k in pairs):
            from planner.errors import invalid

            raise invalid("--dp-shard and --pin dp_shard= are the same choice; give it once")
        pairs["dp_shard"] = str(dp_shard)
    pinned = Pins.parse(pairs)
    headroom = MemoryHeadroom.parse(memory_headroom)
    plan_to_stdout = as_json or output == "-"
    if output == "-":
        output = None
    if output is not None:
        check_target(output, force=force)  # refused now, not after the search
    with signals.deadline(time_limit, time_limit_slack_s(time_limit)):
        from planner.calibration.session import prediction_intervals, runtime_setup

        graph, hw = _load(model, cluster, nodes, seq_len, multi_pool=True)
        graph = with_mtp_from(moe, graph)
        pools = hw if isinstance(hw, MultiPoolCluster) else None
        setup = runtime_setup(hw if pools is None else hw.pools[0].as_cluster(), runtime, dtype,
                              attention_kernel, calibration, moe=moe_options_from(moe),
                              recompute_modules=recompute_modules_from(moe),
                              cross_entropy=cross_entropy_from(moe),
                              fp8_attention=fp8_attention_from(moe), dropout=dropout,
                              compiled=compiled, elementwise=elementwise)
        hw = setup.cluster if pools is None else pools
        from planner.cost.recompute_modules import module_notes
        from cli.render import print_warnings

        print_warnings(module_notes(graph, setup.options.recompute_modules))
        gate = None
        if memory_confidence != DEFAULT_CONFIDENCE:
            gate = _memory_gate(memory_confidence, setup, graph, hw, pools)
        options = SearchOptions(time_limit_s=time_limit, workers=workers, top_k=top_k,
                                work_limit=work_limit, runtime=setup.options,
                                memory_headroom=headroom, memory_gate=gate)
        if pools is not None:  # a plan across pools (planner/hetero/planning.py)
            from planner.hetero.planning import plan_across_pools

            doc, pool_result = plan_across_pools(
                graph, pools, global_batch, dtype, pinned, options,
                setup.calibration.constants if setup.calibration else None,
                model_spec=model, cluster_spec=cluster, timings=timings)
            if fallbacks:  # re-plans for the likeliest failures (planner/hetero/fallbacks.py)
                from planner.hetero.fallbacks import compute_fallbacks

                b = pool_result.best
                doc["fallbacks"] = rounded(compute_fallbacks(
                    b.model, b.cluster, b.config, b.placement, b.options, fallbacks,
                    max_moved_layers=fallback_max_moved_layers,
                    stage_pools=b.stage_pools.pools))
            _record_calibration(doc, setup, calibration)
            _finish_plan(doc, output, force, plan_to_stdout, as_json,
                         pool_result.record["solve_time_s"])
            return
        from cli.render import search_progress

        with search_progress(enabled=True) as progress:
            result = search(graph, hw, global_batch, graph.default_seq_len, dtype, pinned,
                            options, progress)
    solver = result.record.as_dict()
    if not timings:  # same inputs, same bytes: wall-clock time only when asked for
        del solver["solve_time_s"]
    doc = make_plan(result.best, model_spec=model, cluster_spec=cluster, nodes=nodes,
                    solver=solver, alternatives=result.alternatives, pins=pinned.as_dict())
    doc["predicted"].update(prediction_intervals(result.best, setup.calibration))
    if fallbacks:  # re-plans for the likeliest failures (planner/hetero/fallbacks.py)
        from planner.hetero.fallbacks import compute_fallbacks

        b = result.best
        doc["fallbacks"] = rounded(compute_fallbacks(
            b.model, b.cluster, b.config, b.placement, b.options, fallbacks,
            max_moved_layers=fallback_max_moved_layers,
            memory_limit_gib=solver.get("memory_limit_gib"), memory_gate=gate))
    _record_calibration(doc, setup, calibration)
    _finish_plan(doc, output, force, plan_to_stdout, as_json, result.record.solve_time_s)


def _memory_gate(confidence: float, setup, graph, hw, pools):
    """The search's memory gate at ``confidence`` (planner/solve/gate.py), with the bands of
    the profile ``check`` will read for the plan; refused (exit 2) where ``check`` has no band
    to gate with: across GPU pools, or a profile without bands."""
    from planner.errors import invalid
    from planner.solve.gate import memory_gate

    if pools is not None:
        raise invalid(f"--memory-confidence {confidence:g}: a plan across GPU pools has no "
                      f"error band (every calibration run used one GPU type), so check gates "
                      f"it at the prediction",
                      "drop --memory-confidence, or keep more memory free with "
                      "--memory-headroom")
    gate = memory_gate(confidence, setup.calibration, graph, hw, setup.options.profile)
    if not gate.active:
        raise invalid(f"--memory-confidence {confidence:g}: the calibration profile has no "
                      f"peak-memory error bands to take a quantile of",
                      "use a profile with bands (shardplan calibrate writes them), or drop "
                      "--memory-confidence")
    return gate


def _record_calibration(doc: dict, setup, calibration: str | None) -> None:
    """``inputs.calibration``: the profile given with --calibration, its hash and what it
    predicts with (planner.calibration.store.profile_record), so that ``check`` reproduces
    the plan without the file; nothing with the shipped constants (same bytes as before)."""
    if calibration is not None and setup.calibration is not None:
        from planner.calibration.store import profile_record

        doc["inputs"]["calibration"] = profile_record(setup.calibration, calibration)


def _finish_plan(doc: dict, output, force: bool, plan_to_stdout: bool, as_json: bool,
                 solve_time_s: float) -> None:
    """Write the plan file, print it (JSON) or summarise it (people)."""
    deliver_plan(doc, output, force=force, to_stdout=plan_to_stdout)
    if not as_json:
        from cli.render import print_plan

        print_plan(doc, written_to=output, solve_time_s=solve_time_s)
