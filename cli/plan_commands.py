"""Commands on plan files: ``schema``, ``show``, ``check``, ``export``.

Each one: parse -> one library call -> render (data on stdout, people on stderr). ``check``
exits 0 when the plan holds, 1 when it does not (stale inputs, a malformed plan, a stage over
capacity), 2 when the plan file or an input cannot be read (via :func:`cli.main.main`).
"""
from __future__ import annotations


import click

from cli import signals
from cli.app import emit_json, emit_text
from cli.params import PATH
from planner.export import FORMATS

json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print one JSON document on stdout instead of tables.")
plan_argument = click.argument("plan_path", metavar="PLAN", type=PATH)


@click.command()
def schema():
    """Print the JSON Schema (draft 2020-12) of plan files."""
    from planner.plan_io import schema_text

    emit_text(schema_text())


@click.command()
@plan_argument
@json_option
def show(plan_path, as_json):
    """Show a saved plan: memory per stage, step time, solver record, runners-up."""
    from planner.plan_io import load_plan

    doc = load_plan(plan_path)
    if as_json:
        from planner.plan import dumps

        emit_text(dumps(doc))
    elif doc.get("workload") == "serve":  # a serving plan (cli/serve_commands.py)
        from cli.serve_commands import print_serving

        print_serving(doc)
    else:
        from cli.render import print_plan_file

        print_plan_file(doc, plan_path)


@click.command()
@plan_argument
@click.option("--model", "-m", "model", default=None, metavar="M",
              help="Check against this model (preset or file) instead of the one embedded in "
                   "the plan; a different one makes the plan stale.")
@click.option("--cluster", "-c", "cluster", default=None, metavar="C",
              help="Check against this cluster (preset or YAML) instead of the embedded one.")
@click.option("--nodes", type=click.IntRange(min=1), default=None,
              help="Number of nodes of the cluster (as given to `shardplan plan`).")
@click.option("--allow-stale", is_flag=True,
              help="Do not fail because the model or cluster changed; still check memory.")
@click.option("--memory-confidence", type=click.FloatRange(0.01, 0.99), default=None,
              help="Quantile of the predicted peak's error band the memory gate uses "
                   "(0.9: the plan must fit with 90 % confidence; default: the one the plan "
                   "was searched with, `plan --memory-confidence`, else 0.5, the prediction).")
@click.option("--calibration", default=None, metavar="PROFILE.yaml",
              type=click.Path(dir_okay=False),
              help="Calibration profile whose error bands the gate uses (default: the one the "
                   "plan records, else the shipped one); refused unless it is the recorded one.")
@click.option("--runtime", default=None, metavar="R",
              type=click.Choice(["megatron", "torchtitan", "deepspeed", "fsdp", "deepspeed-bf16",
                                 "torch-fp32", "zero-paper"]),
              help="Check the plan against this runtime profile: exit 1 when it uses something "
                   "the runtime cannot run; memory with the runtime's layout (default: the "
                   "plan's recorded runtime, no capability check).")
@json_option
def check(plan_path, model, cluster, nodes, allow_stale, memory_confidence, calibration,
          runtime, as_json):
    """Check a saved plan still fits: exit 0 if so, 1 if not, 2 on invalid input."""
    from planner.check import check_plan
    from planner.plan_types import Plan

    from cli.serve_commands import check_serve_file
    from planner.serve.plan import load_any_plan

    plan = load_any_plan(plan_path)
    if not isinstance(plan, Plan):  # a serving plan (planner/serve/plan.py)
        # what only a training plan's check reads: refused, not ignored (a CI gate that asks
        # for 90 % confidence must not pass at the prediction)
        source = click.get_current_context().get_parameter_source
        given = [f"--{name.replace('_', '-')}" for name in
                 ("runtime", "calibration", "memory_confidence")
                 if source(name) is not click.core.ParameterSource.DEFAULT]
        if given:
            from planner.errors import invalid

            raise invalid(f"{' and '.join(given)}: {plan_path} is a serving plan (workload "
                          f"serve), and {'these options apply' if len(given) > 1 else 'this option applies'} "
                          f"to training plans only",
                          "check a serving plan with --model, --cluster, --nodes, "
                          "--allow-stale; its runtime is the one it was planned for")
        report = check_serve_file(plan, plan_path, model, cluster, nodes, allow_stale)
        _report_check(report, as_json)
        return
    given_model = given_cluster = None
    if model is not None:  # the inputs anew, as `shardplan plan` would load them
        from models import load_model

        given_model = load_model(model, seq_len=plan.config.seq_len)
    if cluster is not None:
        from clusters import load_cluster

        given_cluster = load_cluster(cluster, nodes=nodes, multi_pool=plan.across_pools)
    elif nodes is not None:
        from clusters.schema import with_nodes

        given_cluster = with_nodes(plan.cluster, nodes, "--nodes")
    source = cluster if cluster is not None else (
        f"embedded, --nodes {nodes}" if nodes is not None else None)
    report = check_plan(plan, model=given_model, cluster=given_cluster, model_source=model,
                        cluster_source=source, allow_stale=allow_stale, plan_path=plan_path,
                        memory_confidence=memory_confidence, calibration=calibration,
                        runtime=runtime)
    _report_check(report, as_json)


def _report_check(report, as_json: bool) -> None:
    document = report.to_dict()
    if as_json:
        emit_json(document)
    else:
        from cli.render import print_check

        print_check(document)
    if report.exit_code:
        click.get_current_context().exit(int(report.exit_code))


@click.command()
@plan_argument
@click.option("--format", "-f", "fmt", required=True, metavar="F",
              type=click.Choice(list(FORMATS)),
              help="megatron (args file), torchtitan (0.3 args file, or TOML for 0.2.2), "
                   "deepspeed (config JSON), vllm (engine args), json (the plan); serving "
                   "plans: vllm, sglang, trtllm, json.")
@click.option("-o", "--output", default=None, metavar="FILE",
              help="Write here instead of stdout (- is stdout).")
@click.option("--force", is_flag=True, help="Overwrite an existing output file.")
@click.option("--strict", is_flag=True,
              help="Exit 1 when the runtime cannot express the plan exactly (any warning).")
@click.option("--target-version", default=None, metavar="V",
              help="Runtime version to write for, where its format changed (torchtitan: 0.3 "
                   "command line, the default; 0.2.2 TOML job tables).")
def export(plan_path, fmt, output, force, strict, target_version):
    """Translate a saved plan into a runtime's configuration; differences go to stderr."""
    from planner.errors import ErrorKind, PlannerError
    from planner.export import export_plan
    from planner.writer import check_target, write_file

    if output == "-":
        output = None
    if output is not None:
        check_target(output, force=force)
    from planner.serve.plan import load_any_plan

    result = export_plan(load_any_plan(plan_path), fmt, target_version)
    from cli.console import say
    from cli.render import print_warnings

    print_warnings(result.warnings)
    print_warnings(result.notes, prefix="note")
    if output is not None:
        write_file(result.text, output, force=force, critical=signals.deferred,
                   on_commit=signals.finish)
        say(f"{fmt} configuration written to {output}")
    else:
        emit_text(result.text)
    if strict and result.warnings:
        raise PlannerError(ErrorKind.CHECK_FAILED,
                           f"the {fmt} export differs from the plan in {len(result.warnings)} "
                           f"way{'s' if len(result.warnings) != 1 else ''} (warnings above)")
