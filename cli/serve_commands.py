"""``shardplan plan --workload serve`` and ``shardplan evaluate --workload serve``.

Thin: parse -> one library call (:mod:`planner.serve`) -> render (JSON on stdout with ``--json``,
tables on stderr). :func:`install` wraps the training ``plan`` / ``evaluate`` commands of a
group so that ``--workload serve`` selects these commands and ``--workload train`` (the default)
the training ones.
"""
from __future__ import annotations

import click

from planner.serve.runtime import DEFAULT_RUNTIME, RUNTIMES
from planner.serve.workload import KV_DTYPES, MODES, SERVE_DTYPES

WORKLOADS = ("train", "serve")


def _emit_json(document) -> None:
    from cli.app import emit_json

    emit_json(document)


def _common(f):
    options = [
        click.option("--model", "-m", "model", required=True, metavar="M",
                     help="Preset name, HF config.json or native model file."),
        click.option("--cluster", "-c", "cluster", required=True, metavar="C",
                     help="Cluster preset name or cluster YAML file."),
        click.option("--nodes", type=click.IntRange(min=1, max=1 << 16), default=None,
                     help="Number of nodes (scales the cluster preset)."),
        click.option("--isl", type=click.IntRange(min=1, max=1 << 22), required=True,
                     help="Input (prompt) tokens per request."),
        click.option("--osl", type=click.IntRange(min=1, max=1 << 22), required=True,
                     help="Output (generated) tokens per request."),
        click.option("--concurrency", type=click.IntRange(min=1, max=1 << 24), default=None,
                     help="Requests in flight (closed loop)."),
        click.option("--request-rate", "request_rate", type=click.FloatRange(min=0, min_open=True,
                                                                              max=1e9),
                     default=None, help="Requests per second (open loop)."),
        click.option("--ttft-ms", type=click.FloatRange(min=0, min_open=True, max=1e9),
                     default=None, help="Time-to-first-token target (ms)."),
        click.option("--tpot-ms", type=click.FloatRange(min=0, min_open=True, max=1e9),
                     default=None, help="Time-per-output-token target (ms)."),
        click.option("--mode", type=click.Choice(MODES), default="aggregated", show_default=True,
                     help="Prefill and decode on the same workers, or on separate pools."),
        click.option("--dtype", type=click.Choice(SERVE_DTYPES), default="bf16",
                     show_default=True, help="Weight / GEMM precision."),
        click.option("--kv-dtype", type=click.Choice(KV_DTYPES), default=None,
                     help="KV-cache precision (default bf16)."),
        click.option("--speculative", default=None, metavar="mtp:N[:ACCEPT]",
                     help="Speculative decoding with the model's multi-token-prediction module: "
                          "N draft tokens per step, each accepted with probability ACCEPT "
                          "(default 0.85, DeepSeek-V3 report)."),
        click.option("--runtime", "runtime_name", type=click.Choice(sorted(RUNTIMES)),
                     default=DEFAULT_RUNTIME, show_default=True, help="Serving runtime."),
        click.option("--workload", type=click.Choice(WORKLOADS), default="serve", hidden=True),
        click.option("--json", "as_json", is_flag=True,
                     help="Print one JSON document on stdout instead of tables."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _inputs(model, cluster, nodes, isl, osl, concurrency, request_rate, ttft_ms, tpot_ms, mode,
            dtype, kv_dtype, speculative=None):
    from clusters import load_cluster
    from models import load_model
    from planner.serve.workload import ServingWorkload, parse_speculative

    draft, acceptance = parse_speculative(speculative)
    workload = ServingWorkload(isl=isl, osl=osl, concurrency=concurrency,
                               request_rate_per_s=request_rate, ttft_ms=ttft_ms, tpot_ms=tpot_ms,
                               mode=mode, dtype=dtype, kv_dtype=kv_dtype, draft_tokens=draft,
                               acceptance=acceptance)
    return load_model(model), load_cluster(cluster, nodes=nodes), workload


def _degree(name: str, default=None, help_text: str = ""):
    return click.option(name, type=click.IntRange(min=1, max=1 << 16), default=default,
                        help=help_text)


def _token_counts(text: str | None) -> tuple[int, ...]:
    """``--prefill-capture-num-tokens``: comma-separated positive integers (ServingConfig
    checks they increase)."""
    from planner.errors import invalid

    if text is None:
        return ()
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise invalid(f"--prefill-capture-num-tokens takes comma-separated token counts, "
                      f"got {text!r}") from None


@click.command("evaluate")
@_common
@_degree("--tp", help_text="Tensor-parallel degree of a worker (aggregated).")
@_degree("--pp", 1, "Pipeline-parallel degree of a worker.")
@_degree("--ep", 1, "Expert-parallel degree (MoE layers).")
@click.option("--attention-dp", is_flag=True,
              help="Data-parallel attention over the worker's tp ranks (MoE layers stay "
                   "expert/tensor parallel over them).")
@_degree("--replicas", 1, "Identical workers (aggregated).")
@click.option("--batch", type=click.IntRange(min=1, max=1 << 20), default=None,
              help="Max sequences a (decode) worker runs (--max-num-seqs; default: runtime's).")
@click.option("--max-num-tokens", type=click.IntRange(min=1, max=1 << 24), default=None,
              help="Tokens per iteration (chunked-prefill budget; default: runtime's).")
@click.option("--prefill-capture-num-tokens", default=None, metavar="N,N,...",
              help="Token counts the runtime captures piecewise CUDA graphs of for iterations "
                   "that carry prompt tokens (TensorRT-LLM torch_compile_config "
                   "capture_num_tokens with enable_piecewise_cuda_graph; default: none, eager).")
@_degree("--prefill-workers", None, "Disaggregated: prefill workers.")
@_degree("--decode-workers", None, "Disaggregated: decode workers.")
@_degree("--prefill-tp", None, "Disaggregated: prefill worker tp (default --tp).")
@_degree("--prefill-pp", None, "Disaggregated: prefill worker pp (default --pp).")
@_degree("--prefill-ep", None, "Disaggregated: prefill worker ep (default --ep).")
@click.option("--prefill-attention-dp/--no-prefill-attention-dp", default=None,
              help="Disaggregated: data-parallel attention on prefill workers.")
@_degree("--decode-tp", None, "Disaggregated: decode worker tp (default --tp).")
@_degree("--decode-pp", None, "Disaggregated: decode worker pp (default --pp).")
@_degree("--decode-ep", None, "Disaggregated: decode worker ep (default --ep).")
@click.option("--decode-attention-dp/--no-decode-attention-dp", default=None,
              help="Disaggregated: data-parallel attention on decode workers.")
@_degree("--prefill-batch", 1,
         "Disaggregated: prompts a prefill worker batches (on each attention-DP rank).")
def serve_evaluate(model, cluster, nodes, isl, osl, concurrency, request_rate, ttft_ms, tpot_ms,
                   mode, dtype, kv_dtype, speculative, runtime_name, workload, as_json, tp, pp,
                   ep,
                   attention_dp, replicas, batch, max_num_tokens, prefill_capture_num_tokens,
                   prefill_workers, decode_workers, prefill_tp, prefill_pp, prefill_ep,
                   prefill_attention_dp, decode_tp, decode_pp, decode_ep, decode_attention_dp, prefill_batch):
    """Predict TTFT, TPOT and throughput of one given serving deployment."""
    from planner.errors import invalid
    from planner.serve.evaluate import evaluate_serving
    from planner.serve.plan import evaluation_doc
    from planner.serve.runtime import runtime
    from planner.serve.workload import ServingConfig

    rt = runtime(runtime_name)
    graph, hw, wl = _inputs(model, cluster, nodes, isl, osl, concurrency, request_rate, ttft_ms,
                            tpot_ms, mode, dtype, kv_dtype, speculative)
    caps = dict(batch=batch or rt.max_batch,
                max_num_tokens=max_num_tokens or rt.default_max_num_tokens(hw.gpu),
                prefill_capture_num_tokens=_token_counts(prefill_capture_num_tokens))
    if prefill_workers is not None or decode_workers is not None or mode == "disaggregated":
        if prefill_workers is None or decode_workers is None:
            raise invalid("disaggregated serving needs both --prefill-workers and "
                          "--decode-workers")
        prefill = _worker(prefill_tp or tp, prefill_pp or pp, prefill_ep or ep,
                          attention_dp if prefill_attention_dp is None else prefill_attention_dp)
        decode = _worker(decode_tp or tp, decode_pp or pp, decode_ep or ep,
                         attention_dp if decode_attention_dp is None else decode_attention_dp)
        config = ServingConfig("disaggregated", prefill=prefill, decode=decode,
                               prefill_workers=prefill_workers, decode_workers=decode_workers,
                               prefill_batch=prefill_batch, **caps)
        from dataclasses import replace

        wl = replace(wl, mode="disaggregated")
    else:
        if tp is None:
            raise invalid("--tp is required (the tensor-parallel degree of a worker)")
        config = ServingConfig("aggregated", worker=_worker(tp, pp, ep, attention_dp),
                               replicas=replicas, **caps)
    ev = evaluate_serving(graph, hw, wl, config, runtime_name)
    doc = evaluation_doc(ev)
    if as_json:
        _emit_json(doc)
    else:
        print_serving(doc)
    if not ev.fits:
        click.get_current_context().exit(1)


def _worker(tp, pp, ep, attention_dp):
    from planner.errors import invalid
    from planner.serve.workload import WorkerConfig

    if tp is None:
        raise invalid("--tp (or --prefill-tp / --decode-tp) is required")
    if attention_dp:  # the tp ranks run attention data-parallel
        return WorkerConfig(tp=1, pp=pp, ep=ep, attention_dp=tp)
    return WorkerConfig(tp=tp, pp=pp, ep=ep)


@click.command("plan")
@_common
@click.option("--top-k", type=click.IntRange(min=0, max=50), default=3, show_default=True,
              help="Also report this many runners-up.")
@click.option("-o", "--output", default=None, metavar="FILE",
              help="Write the plan file here (- for standard output).")
@click.option("--force", is_flag=True, help="Overwrite an existing output file.")
@click.option("--timings", is_flag=True,
              help="Record the search's wall-clock time in the plan.")
def serve_plan(model, cluster, nodes, isl, osl, concurrency, request_rate, ttft_ms, tpot_ms,
               mode, dtype, kv_dtype, speculative, runtime_name, workload, as_json, top_k,
               output, force,
               timings):
    """Search the serving deployment with the most output tokens/s per GPU under the latency
    targets (without targets or load: the Pareto frontier)."""
    from planner.serve.plan import make_serve_plan
    from planner.serve.search import no_plan_error, search_serving

    from cli.app import deliver_plan
    from planner.writer import check_target

    to_stdout = as_json or output == "-"
    if output == "-":
        output = None
    if output is not None:
        check_target(output, force=force)  # refused now, not after the search
    graph, hw, wl = _inputs(model, cluster, nodes, isl, osl, concurrency, request_rate, ttft_ms,
                            tpot_ms, mode, dtype, kv_dtype, speculative)
    result = search_serving(graph, hw, wl, runtime_name, top_k=top_k)
    if result.best is None:
        raise no_plan_error(wl)
    solver = result.record()
    if not timings:  # same inputs, same bytes
        del solver["solve_time_s"]
    doc = make_serve_plan(result.best, model_spec=model, cluster_spec=cluster, nodes=nodes,
                          solver=solver, alternatives=result.alternatives,
                          frontier=result.frontier)
    deliver_plan(doc, output, force=force, to_stdout=to_stdout)
    if not as_json:
        print_serving(doc, written_to=output, solve_time_s=result.solve_time_s)


def print_serving(doc: dict, written_to: str | None = None,
                  solve_time_s: float | None = None) -> None:
    """Tables for people (stderr): workers, predicted numbers, frontier."""
    from rich.table import Table

    from cli.console import console, line

    inf, p = doc["inference"], doc["predicted"]
    w = inf["workload"]
    console.print(line((doc["model"]["name"], "bold"), f" on {doc['cluster']['name']} "
                       f"({doc['cluster']['gpu']}), {inf['runtime']}, {w['mode']}, isl "
                       f"{w['isl']} / osl {w['osl']}, {w['dtype']} weights, {w['kv_dtype']} KV"
                       + _speculative_note(w)),
                  soft_wrap=True)
    table = Table(title="Workers")
    for column in ("role", "workers", "tp", "pp", "ep", "attn dp", "GPUs", "batch",
                   "max batch", "weights GiB", "KV GiB", "step ms"):
        table.add_column(column, justify="right")
    for pool in inf["pools"]:
        mem = pool["memory"]
        table.add_row(pool["role"], str(pool["workers"]), str(pool["tp"]), str(pool["pp"]),
                      str(pool["ep"]), str(pool["attention_dp"]), str(pool["gpus"]),
                      str(pool["batch"]), str(pool["max_batch"]), f"{mem['weights_gib']:.1f}",
                      f"{mem['kv_cache_gib']:.1f}", f"{pool['iteration']['total_s'] * 1e3:.2f}")
    console.print(table)
    verdict = ("fits", "green") if p["fits"] else ("does not fit", "red")
    ttft = "-" if p["ttft_ms"] is None else f"{p['ttft_ms']:.1f}"
    tpot = "-" if p["tpot_ms"] is None else f"{p['tpot_ms']:.2f}"
    console.print(line(verdict, f": {p['output_tokens_per_s_per_gpu']:.1f} output tok/s/GPU, "
                       f"{p['output_tokens_per_s_per_user']:.1f} tok/s/user, TTFT {ttft} ms, "
                       f"TPOT {tpot} ms, max concurrency {p['max_concurrency']}, KV cache "
                       f"{p['kv_cache_gib']:.1f} GiB/GPU"), soft_wrap=True)
    for problem in inf.get("problems") or []:
        console.print(line(("problem", "red"), ": ", problem), soft_wrap=True)
    from planner.export.serving import context_warning

    long_context = context_warning(doc)
    if long_context:
        console.print(line(("warning", "yellow"), ": ", long_context), soft_wrap=True)
    frontier = inf.get("frontier") or []
    if frontier:
        shown = _spread(frontier, FRONTIER_ROWS)
        title = "Pareto frontier (tok/s/GPU vs tok/s/user)" + (
            f": {len(shown)} of its {len(frontier)} points (all in the plan file)"
            if len(shown) < len(frontier) else "")
        t = Table(title=title)
        for column in ("deployment", "concurrency", "tok/s/user", "tok/s/GPU", "TTFT ms",
                       "TPOT ms"):
            t.add_column(column, justify="right")
        for point in shown:
            d, q = point["deployment"], point["predicted"]
            t.add_row(_label(d), f"{q['concurrency']:g}",
                      f"{q['output_tokens_per_s_per_user']:.1f}",
                      f"{q['output_tokens_per_s_per_gpu']:.1f}", f"{q['ttft_ms']:.1f}",
                      f"{q['tpot_ms']:.2f}")
        console.print(t)
    if solve_time_s is not None:
        console.print(line(f"searched in {solve_time_s:.2f} s"))
    if written_to:
        console.print(line("plan written to ", written_to), soft_wrap=True)


def _speculative_note(w: dict) -> str:
    spec = w.get("speculative")
    if not spec:
        return ""
    return (f", MTP speculative decoding: {spec['draft_tokens']} draft token(s), acceptance "
            f"{spec['acceptance']:g}")


def _label(d: dict) -> str:
    def one(x):
        return f"tp{x['tp']}" + (f"pp{x['pp']}" if x["pp"] > 1 else "") + \
            (f"ep{x['ep']}" if x["ep"] > 1 else "") + \
            (f"adp{x['attention_dp']}" if x["attention_dp"] > 1 else "")
    if d["mode"] == "aggregated":
        return f"{d['replicas']}x {one(d['worker'])}"
    return (f"{d['prefill']['workers']}x {one(d['prefill'])} + "
            f"{d['decode']['workers']}x {one(d['decode'])}")


def check_serve_file(doc: dict, plan_path, model_spec: str | None, cluster_spec: str | None,
                     nodes: int | None, allow_stale: bool):
    """``check`` of a serving plan; ``model_spec`` / ``cluster_spec`` / ``nodes`` load the
    inputs anew (as ``plan`` would) instead of the embedded ones."""
    import os

    model = cluster = None
    if model_spec is not None:
        from models import load_model

        model = load_model(model_spec)
    if cluster_spec is not None:
        from clusters import load_cluster

        cluster = load_cluster(cluster_spec, nodes=nodes)
    elif nodes is not None:
        from clusters.schema import with_nodes
        from planner.serialize import cluster_from_dict

        cluster = with_nodes(cluster_from_dict(doc["inputs"]["cluster"]["ir"],
                                               "$.inputs.cluster.ir"), nodes, "--nodes")
    source = cluster_spec if cluster_spec is not None else (
        f"embedded, --nodes {nodes}" if nodes is not None else None)
    from planner.serve.plan import check_serve_plan

    return check_serve_plan(doc, model=model, cluster=cluster, model_source=model_spec,
                            cluster_source=source, allow_stale=allow_stale,
                            plan_path=os.fspath(plan_path))


def _selected(args: list[str]) -> str | None:
    for i, arg in enumerate(args):
        if arg == "--workload" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--workload="):
            return arg.split("=", 1)[1]
    return None


def _without_train_workload(args: list[str]) -> list[str]:
    out, skip = [], False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if arg == "--workload" and i + 1 < len(args) and args[i + 1] == "train":
            skip = True
            continue
        if arg == "--workload=train":
            continue
        out.append(arg)
    return out


class WorkloadCommand(click.Command):
    """A training command that hands ``--workload serve`` invocations to a serving command."""

    def __init__(self, train: click.Command, serve: click.Command) -> None:
        epilog = (f"--workload serve plans/evaluates inference instead: see `shardplan "
                  f"{train.name} --workload serve --help`.")
        super().__init__(train.name, context_settings=train.context_settings,
                         callback=train.callback, params=list(train.params), help=train.help,
                         epilog=epilog, short_help=train.short_help,
                         options_metavar=train.options_metavar, add_help_option=True)
        self.train, self.serve = train, serve

    def make_context(self, info_name, args, parent=None, **extra):
        if _selected(args) == "serve":
            return self.serve.make_context(info_name, args, parent=parent, **extra)
        return super().make_context(info_name, _without_train_workload(list(args)),
                                    parent=parent, **extra)


def install(group: click.Group) -> None:
    """Make ``plan`` and ``evaluate`` of ``group`` accept ``--workload serve``."""
    for name, serve in (("plan", serve_plan), ("evaluate", serve_evaluate)):
        train = group.commands.get(name)
        if train is not None and not isinstance(train, WorkloadCommand):
            group.add_command(WorkloadCommand(train, serve), name)


FRONTIER_ROWS = 24  # frontier points the table shows (evenly spread, both ends included)


def _spread(points: list, most: int) -> list:
    """At most ``most`` of ``points``, evenly spread, the first and last included."""
    if len(points) <= most:
        return points
    step = (len(points) - 1) / (most - 1)
    return [points[round(i * step)] for i in range(most)]
