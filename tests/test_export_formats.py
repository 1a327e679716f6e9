"""Exporters: each output parsed back and compared with the plan; warnings for what differs."""
from __future__ import annotations

import json
import shlex
import shutil
import subprocess

import pytest

from planner.export import FORMATS, export_plan
from planner.plan_types import Plan
from planner.export.base import blocks_per_rank
from planner.export.megatron import ARRAY, parse_args_file
from planner.pipeline_layout import parse_layout
from conftest import MIXTRAL, build_plan, run_cli, write

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: no TOML reader in the standard library
    tomllib = None

GPT = dict(model="gpt3-1.3b", cluster="dgx-a100-80g", global_batch=64)
PLANS = {
    "dp-only": dict(**GPT, micro_batch=2),
    "tp-pp-first-last": dict(**GPT, tp=2, pp=4, stage_blocks=[5, 7, 7, 5]),
    "pp2-uneven": dict(**GPT, tp=2, pp=2, micro_batch=2, stage_blocks=[10, 14], zero=2),
    "pp-layout": dict(**GPT, pp=4, stage_blocks=[6, 5, 7, 6], zero=0),
    "interleaved": dict(**GPT, pp=4, virtual_stages=3, recompute="selective"),
    "mixed-recompute": dict(**GPT, pp=2, block_recompute=["full"] * 5 + ["none"] * 7 +
                            ["full"] * 3 + ["none"] * 9),
    "moe-cp": dict(model=MIXTRAL, cluster="dgx-h100", nodes=2, global_batch=32, tp=2, pp=2,
                   ep=4, cp=2, seq_len=4096, recompute="full", zero=3),
    "tiny-fp16": dict(dtype="fp16", zero=0),
}


@pytest.fixture(scope="module", params=list(PLANS))
def plan(request):
    return build_plan(**PLANS[request.param])


def _megatron_flags(text: str) -> dict[str, str | None]:
    args = parse_args_file(text)
    flags: dict[str, str | None] = {}
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            value = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else None
            assert arg not in flags, f"{arg} given twice"
            flags[arg] = value
    return flags


def _layout_blocks_per_rank(layout: str, pp: int) -> tuple[list[int], str]:
    """Megatron's reading of a layout (pipeline_parallel_layer_layout.py, through
    planner/pipeline_layout.py): segments in VPP-major order, segment k on pp rank k mod pp;
    returns decoder layers per rank and the flattened layer sequence."""
    parsed = parse_layout(layout)
    return [sum(chunks) for chunks in parsed.rank_blocks(pp)], "".join(parsed.chunks)


def test_megatron_round_trip(plan):
    result = export_plan(Plan.from_dict(plan), "megatron")
    p = plan["parallelism"]
    flags = _megatron_flags(result.text)
    assert int(flags["--tensor-model-parallel-size"]) == p["tp"]
    assert int(flags["--pipeline-model-parallel-size"]) == p["pp"]
    assert int(flags["--micro-batch-size"]) == p["micro_batch"]
    assert int(flags["--global-batch-size"]) == p["global_batch"]
    assert int(flags["--seq-length"]) == p["seq_len"]
    assert int(flags["--num-layers"]) == plan["model"]["num_layers"]
    assert int(flags.get("--context-parallel-size") or 1) == p["cp"]
    assert int(flags.get("--expert-model-parallel-size") or 1) == p["ep"]
    assert ("--sequence-parallel" in flags) == p["sp"]
    assert ("--use-distributed-optimizer" in flags) == (p["zero_stage"] >= 1)
    assert ("--fp16" in flags) == (p["dtype"] == "fp16") != ("--bf16" in flags)
    # the pipeline split Megatron will build equals the plan's
    per_rank = blocks_per_rank(plan)
    num_layers = plan["model"]["num_layers"]
    if "--pipeline-model-parallel-layout" in flags:
        counts, flat = _layout_blocks_per_rank(flags["--pipeline-model-parallel-layout"], p["pp"])
        assert counts == per_rank
        assert flat == "E" + "t" * num_layers + "L"
    elif "--decoder-first-pipeline-num-layers" in flags or \
            "--decoder-last-pipeline-num-layers" in flags:
        # Megatron spreads what the first/last flags leave evenly over the other stages
        named = ((0, "--decoder-first-pipeline-num-layers"),
                 (p["pp"] - 1, "--decoder-last-pipeline-num-layers"))
        explicit = {s: int(flags[f]) for s, f in named if f in flags}
        rest, free = num_layers - sum(explicit.values()), p["pp"] - len(explicit)
        assert rest % free == 0
        assert [explicit.get(s, rest // free) for s in range(p["pp"])] == per_rank
    elif p["pp"] > 1:
        assert per_rank == [num_layers // p["pp"]] * p["pp"]
    if p["virtual_stages"] > 1 and "--pipeline-model-parallel-layout" not in flags:
        assert int(flags["--num-virtual-stages-per-pipeline-rank"]) == p["virtual_stages"]
    recompute = {x["recompute"] for x in plan["layers"] if x["kind"] == "block"}
    if recompute == {"none"}:
        assert "--recompute-granularity" not in flags
    elif recompute == {"selective"}:
        assert flags["--recompute-granularity"] == "selective"
    else:
        assert flags["--recompute-granularity"] == "full"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_megatron_file_is_a_bash_array(tmp_path):
    plan = build_plan(**PLANS["pp-layout"])
    text = export_plan(Plan.from_dict(plan), "megatron").text
    path = tmp_path / "args.sh"
    path.write_text(text)
    out = subprocess.run(["bash", "-c", f'source "$1"; printf "%s\\n" "${{{ARRAY}[@]}}"', "_",
                          str(path)], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == parse_args_file(text)
    assert "|" in out  # the layout string survived quoting


@pytest.mark.skipif(tomllib is None, reason="tomllib needs Python 3.11")
def test_torchtitan_toml_round_trip(plan):
    result = export_plan(Plan.from_dict(plan), "torchtitan", target_version="0.2.2")
    config = tomllib.loads(result.text)
    p = plan["parallelism"]
    par, training = config["parallelism"], config["training"]
    dp_degree = par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
    assert dp_degree == p["dp"]
    assert par["tensor_parallel_degree"] == p["tp"]
    assert par["pipeline_parallel_degree"] == p["pp"]
    assert par["context_parallel_degree"] == p["cp"]
    assert par["expert_parallel_degree"] == p["ep"]
    assert training["seq_len"] == p["seq_len"]
    assert training["global_batch_size"] == p["global_batch"]
    if p["pp"] > 1:
        micro = par["pipeline_parallel_microbatch_size"]
        assert micro == p["micro_batch"]
        assert training["local_batch_size"] // micro == p["num_micro_batches"]
        assert training["local_batch_size"] * dp_degree == p["global_batch"]
        parts = par["module_fqns_per_model_part"]
        assert len(parts) == p["pp"] * p["virtual_stages"]
        flat = [name for part in parts for name in part]
        blocks = plan["model"]["num_layers"]
        assert flat == ["tok_embeddings"] + [f"layers.{i}" for i in range(blocks)] + \
               ["norm", "output"]
        per_rank = [0] * p["pp"]
        for k, part in enumerate(parts):  # looped schedules: part k on rank k mod pp
            per_rank[k % p["pp"]] += sum(1 for name in part if name.startswith("layers."))
        assert per_rank == blocks_per_rank(plan)
        assert par["pipeline_parallel_schedule"] == ("Interleaved1F1B" if p["virtual_stages"] > 1
                                                     else "1F1B")
    else:
        assert training["local_batch_size"] == p["micro_batch"]
        accumulation = training["global_batch_size"] // (training["local_batch_size"] * dp_degree)
        assert accumulation == p["num_micro_batches"]
    recompute = {x["recompute"] for x in plan["layers"] if x["kind"] == "block"}
    mode = config["activation_checkpoint"]["mode"]
    if recompute == {"none"}:
        assert mode == "none"
    elif recompute == {"full"}:
        assert mode == "full"
    else:
        assert mode == "selective"


@pytest.mark.parametrize("model, pp, kept", [("gpt3-1.3b", 2, True), ("gpt3-1.3b", 1, False),
                                              (MIXTRAL, 2, True), (MIXTRAL, 1, False)])
def test_torchtitan_reshard_policy_is_the_one_the_plan_costs(model, pp, kept):
    """ZeRO-3 under PP: torchtitan's cost model keeps the weights gathered over the step, dense
    or MoE (its "default" policy with PP, the same for its MoE models); the export must run
    that, not "always" (a gather per micro-batch, which the plan does not charge). pp 1
    reshards after each forward."""
    from planner.calibration.session import runtime_setup
    from planner.cost.memory import layer_params_on_gpu
    from clusters import load_cluster

    cluster = "dgx-h100"
    options = runtime_setup(load_cluster(cluster, nodes=2), "torchtitan", "bf16").options
    doc = build_plan(model=model, cluster=cluster, nodes=2, global_batch=64, pp=pp, zero=3,
                     ep=4 if model == MIXTRAL else 1, seq_len=2048, recompute="full",
                     runtime=options)
    plan = Plan.from_dict(doc)
    # what the plan costs: kept weights are whole 16-bit copies of the rank's layers (beside
    # their shard; the rank's experts only), resharded ones a 1/dp shard of them
    p = doc["parallelism"]
    whole_gib = sum(2 * sum(layer_params_on_gpu(layer, p["tp"], p["ep"], p["etp"]))
                    for layer, x in zip(plan.model.layers, doc["layers"])
                    if x["stage"] == 0) / 2 ** 30
    assert (doc["stages"][0]["memory_gib"]["params"] >= whole_gib) is kept
    want = "never" if kept else "always"
    new = export_plan(plan, "torchtitan")
    assert f"--parallelism.fsdp_reshard_after_forward {want}" in new.text
    old = tomllib.loads(export_plan(plan, "torchtitan", target_version="0.2.2").text)
    assert old["parallelism"]["fsdp_reshard_after_forward"] == want
    assert not any("reshard" in w for w in new.warnings)


def test_deepspeed_round_trip(plan):
    result = export_plan(Plan.from_dict(plan), "deepspeed")
    config = json.loads(result.text)
    p = plan["parallelism"]
    assert config["train_batch_size"] == p["global_batch"]
    assert config["train_micro_batch_size_per_gpu"] == p["micro_batch"]
    assert config["gradient_accumulation_steps"] == p["num_micro_batches"]
    # DeepSpeed's own identity over the data-parallel size it is told to use (the notes)
    assert config["train_batch_size"] == (config["train_micro_batch_size_per_gpu"] *
                                          config["gradient_accumulation_steps"] * p["dp"])
    world = p["tp"] * p["pp"] * p["dp"] * p["cp"]
    notes = "\n".join(result.notes)
    assert (f"returns {p['dp']}" in notes or f"num_dp={p['dp']})" in notes) == (world != p["dp"])
    stage = config["zero_optimization"]["stage"]
    assert stage == (min(p["zero_stage"], 1) if p["pp"] > 1 else p["zero_stage"])
    assert config.get("tensor_parallel", {}).get("autotp_size", 1) == p["tp"]
    assert config["bf16"]["enabled"] == (p["dtype"] != "fp16") == (not config["fp16"]["enabled"])


def test_vllm_round_trip(plan):
    result = export_plan(Plan.from_dict(plan), "vllm")
    assert result.text.count("\n") == 1
    args = shlex.split(result.text)
    values = {a: args[i + 1] for i, a in enumerate(args[:-1]) if a.startswith("--")
              and not args[i + 1].startswith("--")}
    p = plan["parallelism"]
    assert int(values["--tensor-parallel-size"]) == p["tp"]
    assert int(values["--pipeline-parallel-size"]) == p["pp"]
    assert int(values["--data-parallel-size"]) == p["dp"]
    assert int(values["--max-model-len"]) == p["seq_len"]
    assert ("--enable-expert-parallel" in args) == (p["ep"] > 1)


def test_json_is_the_plan(plan):
    result = export_plan(Plan.from_dict(plan), "json")
    assert json.loads(result.text) == plan and result.warnings == ()


def _warnings(name: str, fmt: str, version: str | None = None) -> str:
    return "\n".join(export_plan(Plan.from_dict(build_plan(**PLANS[name])), fmt,
                                 version).warnings)


def _notes(name: str, fmt: str, version: str | None = None) -> str:
    return "\n".join(export_plan(Plan.from_dict(build_plan(**PLANS[name])), fmt,
                                 version).notes)


def test_exact_exports_have_no_warnings():
    assert _warnings("dp-only", "megatron") == ""
    assert _warnings("tp-pp-first-last", "megatron") == ""  # first/last flags are exact
    assert _warnings("pp-layout", "megatron") == ""  # the layout is exact
    assert _warnings("interleaved", "megatron") == ""
    assert _warnings("dp-only", "deepspeed").count("\n") == 0  # only the state-layout note


def test_inexpressible_features_are_named():
    # ZeRO-2/3 in Megatron: distributed optimizer + what it costs
    text = _warnings("pp2-uneven", "megatron")
    assert "ZeRO-2" in text and "--use-distributed-optimizer" in text and "GiB" in text
    # per-layer recompute mix with unequal per-stage counts
    text = _warnings("mixed-recompute", "megatron")
    assert "recompute" in text and "5, 3" in text and "--recompute-num-layers 5" in text
    assert "layer-selective" in _warnings("mixed-recompute", "torchtitan", "0.2.2")
    assert "no layer-selective AC" in _warnings("mixed-recompute", "torchtitan")
    # DeepSpeed: ZeRO-2/3 refused under PP, interleaving, CP are differences; the pipeline
    # split and EP are set in model code, exactly, so they are notes
    text = _warnings("pp2-uneven", "deepspeed")
    assert "accepts ZeRO 0 and 1 only" in text and "PipelineModule" not in text
    text = _notes("pp2-uneven", "deepspeed")
    assert "PipelineModule" in text and "num_stages=2" in text and "10, 14" in text
    assert "_partition_layers" in text  # an uneven split: no partition_method gives it
    assert "no interleaved schedule" in _warnings("interleaved", "deepspeed")
    text = _warnings("moe-cp", "deepspeed")
    assert "context parallelism 2" in text and "ep_size" not in text
    assert "ep_size=4" in _notes("moe-cp", "deepspeed")
    assert "wrap blocks 0-23" in _notes("moe-cp", "deepspeed") or \
        "activation_checkpoint_interval=1" in _notes("moe-cp", "deepspeed")
    # vLLM: interleaving, CP and uneven stages dropped
    assert "virtual stages" in _warnings("interleaved", "vllm")
    assert "context parallelism 2" in _warnings("moe-cp", "vllm")
    assert "VLLM_PP_LAYER_PARTITION" in _warnings("pp-layout", "vllm")
    # torchtitan: ZeRO-0 with PP is not DDP there; SP is always on with TP
    assert "ZeRO-0" in _warnings("pp-layout", "torchtitan")
    sp_off = build_plan(**GPT, tp=2, sp=False)
    warnings = export_plan(Plan.from_dict(sp_off), "torchtitan", "0.2.2").warnings
    assert "sequence parallelism" not in "\n".join(
        export_plan(Plan.from_dict(sp_off), "torchtitan").warnings)
    assert "sequence parallelism" in "\n".join(warnings)
    assert "fp16" in _warnings("tiny-fp16", "torchtitan")


def test_activation_offload_is_written_where_megatron_runs_it():
    """Megatron-Core runs layer-level CPU offload of the first N decoder layers only with pp 1
    and no recomputation (TransformerConfig.__post_init__); elsewhere, and in runtimes
    without it, the file keeps the activations on the GPUs and says what that costs."""
    h100 = dict(GPT, cluster="dgx-h100")
    first = Plan.from_dict(build_plan(**h100, block_act_offload=[True] * 6 + [False] * 18))
    result = export_plan(first, "megatron")
    flags = _megatron_flags(result.text)
    assert "--cpu-offloading" in flags and flags["--cpu-offloading-num-layers"] == "6"
    assert not any("offload" in w for w in result.warnings)
    [warning] = [w for w in export_plan(first, "torchtitan").warnings if "offload" in w]
    assert "block.0-5" in warning and "keeps them on the GPUs" in warning and "GiB" in warning
    for kw, why in ((dict(pp=2), "pp 2: no CPU offloading with pipeline parallelism"),
                    (dict(recompute="selective"), "refuses any recompute granularity")):
        plan = Plan.from_dict(build_plan(**h100, **kw,
                                         block_act_offload=[True] * 6 + [False] * 18))
        result = export_plan(plan, "megatron")
        assert "--cpu-offloading" not in _megatron_flags(result.text)
        [warning] = [w for w in result.warnings if "activation offload" in w]
        assert why in warning and "instead of the plan's" in warning
    # identical blocks: offloading block 1 costs what Megatron's first block does
    middle = Plan.from_dict(build_plan(**h100, block_act_offload=[False, True] + [False] * 22))
    assert _megatron_flags(export_plan(middle, "megatron").text)[
        "--cpu-offloading-num-layers"] == "1"


def test_megatron_activation_offload_rule():
    from planner.offload_rules import megatron_refusals

    none = ["none"] * 4
    assert megatron_refusals(1, none, [True, True, False, False], [0, 0, 0, 0]) == []
    assert megatron_refusals(1, none, [False, True, False, True], [0, 0, 0, 0]) == []
    [why] = megatron_refusals(1, none, [False, False, True, True], [0, 0, 1, 1])
    assert "not (blocks of the same kinds as) the first 2" in why
    [why] = megatron_refusals(1, none, [True] * 4, [0] * 4)
    assert "less than --num-layers" in why
    assert len(megatron_refusals(2, ["full"] + none[1:], [True] + [False] * 3, [0] * 4)) == 2
    assert megatron_refusals(4, ["full"] * 4, [False] * 4, [0] * 4) == []


def test_optimizer_offload_of_every_layer_is_written():
    """Every layer's optimizer states on the host is Megatron-Core's hybrid device optimizer at
    fraction 1 (it needs the precision-aware, hence distributed, optimizer) and DeepSpeed's
    ZeRO-Offload; a per-layer subset or ZeRO-0 is a warning with the memory it then needs."""
    plan = Plan.from_dict(build_plan(**dict(GPT, cluster="dgx-h100"), offload=True))
    flags = _megatron_flags(export_plan(plan, "megatron").text)
    assert flags["--optimizer-offload-fraction"] == "1.0"
    assert "--optimizer-cpu-offload" in flags and "--use-precision-aware-optimizer" in flags
    result = export_plan(plan, "deepspeed")
    assert json.loads(result.text)["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert not any("offload" in w for w in result.warnings)
    [warning] = [w for w in export_plan(plan, "torchtitan").warnings if "offload" in w]
    assert "embedding, block.0-23, head" in warning and "instead of the plan's" in warning
    zero0 = Plan.from_dict(build_plan(**dict(GPT, cluster="dgx-h100"), offload=True, zero=0))
    assert "--optimizer-cpu-offload" not in _megatron_flags(export_plan(zero0, "megatron").text)
    assert any("needs the distributed optimizer" in w
               for w in export_plan(zero0, "megatron").warnings)
    assert "offload_optimizer" not in export_plan(zero0, "deepspeed").text


def test_exact_megatron_recompute_mix_is_silent():
    # first N blocks of every stage, the same N: Megatron's block method exactly
    plan = build_plan(**GPT, pp=2, block_recompute=(["full"] * 4 + ["none"] * 8) * 2)
    result = export_plan(Plan.from_dict(plan), "megatron")
    flags = _megatron_flags(result.text)
    assert flags["--recompute-method"] == "block" and flags["--recompute-num-layers"] == "4"
    assert result.warnings == ()


def test_export_command(tmp_path, capsys):
    path = write(build_plan(**PLANS["pp2-uneven"]), tmp_path / "plan.json")
    code, out, err = run_cli(["export", path, "--format", "deepspeed"], capsys)
    assert code == 0 and json.loads(out)["train_batch_size"] == 64
    assert "warning" in err and "PipelineModule" in err
    target = tmp_path / "args.sh"
    code, out, err = run_cli(["export", path, "--format", "megatron", "-o", target], capsys)
    assert code == 0 and out == "" and "ZeRO-2" in err
    assert parse_args_file(target.read_text())[:2] == ["--tensor-model-parallel-size", "2"]
    code, out, err = run_cli(["export", path, "--format", "megatron", "-o", target], capsys)
    assert code == 2 and "exists" in err
    code, out, err = run_cli(["export", path, "--format", "megatron", "-o", target, "--force",
                              "--strict"], capsys)
    assert code == 1 and "differs from the plan" in err
    code, out, err = run_cli(["export", write(build_plan(**PLANS["dp-only"]), tmp_path / "d.json"),
                              "--format", "megatron", "--strict"], capsys)
    assert code == 0 and out.startswith("# Megatron-LM")
    code, out, err = run_cli(["export", path, "--format", "nemo"], capsys)
    assert code == 2
    code, out, err = run_cli(["export", tmp_path / "missing.json", "--format", "json"], capsys)
    assert code == 2 and "Traceback" not in err


def test_every_format_is_registered():
    assert list(FORMATS) == ["megatron", "torchtitan", "deepspeed", "vllm", "json", "sglang", "trtllm"]


def test_malformed_plans_are_not_exported(tmp_path, capsys):
    doc = build_plan(pp=2)
    doc["layers"][2]["stage"], doc["layers"][3]["stage"] = 1, 0  # stages not contiguous
    path = write(doc, tmp_path / "bad.json")
    code, out, err = run_cli(["export", path, "--format", "megatron"], capsys)
    assert code == 2 and out == "" and "malformed" in err and "shardplan check" in err


def test_per_layer_layouts_are_named_exactly_in_every_export(tmp_path, capsys):
    """A plan whose layers run on their own tensor degrees (per-layer layouts): no runtime file
    takes more than one TP degree, so every exporter names each such layer with its layout and
    degree, and torchtitan's also the per-module parallelize plan (its llama3 module FQNs and
    ParallelStyles, over how many ranks) a custom parallelize_fn would have to apply."""
    from conftest import run_cli

    path = tmp_path / "layouts.json"
    code, _, err = run_cli(["plan", "--model", "tiny", "--cluster", "tiny", "--nodes", "1",
                            "--global-batch", "8", "--seq-len", "32", "--pin",
                            "layouts=per-layer", "--pin", "tp=2", "--pin", "pp=1", "--pin",
                            "micro_batch=2", "-o", path, "--force", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(path.read_text())
    for layer in doc["layers"]:  # blocks 1-2 replicated, the rest as the planner chose
        if layer["name"] in ("block.1", "block.2"):
            layer["layout"] = "tp=1"
        elif layer["kind"] == "block":
            layer["layout"] = "mesh"
    assert {doc["layers"][0].get("layout"), doc["layers"][-1].get("layout")} == {"tp*2"}
    plan = Plan.from_dict(doc)
    for fmt in ("megatron", "deepspeed", "torchtitan"):
        warning = [w for w in export_plan(plan, fmt).warnings if w.startswith("layouts:")]
        assert len(warning) == 1, fmt
        text = warning[0]
        assert ("tp*2 (tensor degree 4): embedding, head; tp=1 (tensor degree 1): block.1-2"
                in text), text
        assert f"{fmt} takes one tensor-parallel degree" in text and "block.0" not in text
    assert ("tok_embeddings: RowwiseParallel over 4 ranks; layers.[1-2].attention.wq/wk/wv, "
            "layers.[1-2].attention.wo, layers.[1-2].feed_forward.w1/w3, "
            "layers.[1-2].feed_forward.w2: no tensor parallelism (data-parallel over the "
            "stage); output: ColwiseParallel over 4 ranks") in text
    assert not [w for w in export_plan(plan, "json").warnings if w.startswith("layouts:")]
