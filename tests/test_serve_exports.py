"""Serving exports (vLLM, SGLang, TensorRT-LLM) parsed back by a documented reference of each
runtime's options (tests/serve_runtime_options.py), and compared with the plan."""
from __future__ import annotations

import shlex

import pytest
import yaml

from conftest import run_cli
import serve_runtime_options as ref
from clusters import load_cluster
from models import load_model
from planner.errors import PlannerError
from planner.export import export_plan
from planner.serve.evaluate import evaluate_serving
from planner.serve.plan import make_serve_plan
from planner.serve.workload import ServingConfig, ServingWorkload, WorkerConfig


def _plan(model, cluster, workload, config, nodes=None):
    ev = evaluate_serving(load_model(model), load_cluster(cluster, nodes=nodes), workload, config,
                          "vllm")
    return make_serve_plan(ev, model_spec="org/model name", cluster_spec=cluster, nodes=nodes,
                           solver={"status": "EVALUATED"})


@pytest.fixture(scope="module")
def aggregated():
    wl = ServingWorkload(isl=2000, osl=500, concurrency=64, dtype="fp8", kv_dtype="fp8")
    cfg = ServingConfig("aggregated", worker=WorkerConfig(tp=4), replicas=2, batch=96,
                        max_num_tokens=4096)
    return _plan("llama-3.1-70b", "dgx-h100", wl, cfg)


@pytest.fixture(scope="module")
def disaggregated():
    wl = ServingWorkload(isl=1024, osl=1024, concurrency=64, mode="disaggregated", dtype="fp8",
                         kv_dtype="fp8")
    cfg = ServingConfig("disaggregated", prefill=WorkerConfig(tp=8, ep=8),
                        decode=WorkerConfig(tp=1, ep=16, attention_dp=16), prefill_workers=2,
                        decode_workers=1, batch=64)
    return _plan("deepseek-v3", "dgx-h200", wl, cfg, nodes=4)


def _commands(text: str, start: str) -> list[list[str]]:
    return [shlex.split(line) for line in text.splitlines() if line.startswith(start)]


def test_vllm_aggregated_round_trip(aggregated):
    out = export_plan(aggregated, "vllm")
    (cmd,) = _commands(out.text, "vllm serve")
    args = ref.parser(ref.VLLM, "vllm", 3).parse_args(cmd)
    assert args.positional2 == "org/model name"  # shlex quoting keeps the spec whole
    assert (args.tensor_parallel_size, args.pipeline_parallel_size) == (4, 1)
    assert args.max_num_seqs == 96 and args.max_num_batched_tokens == 4096
    assert args.max_model_len == 2500 and args.kv_cache_dtype == "fp8"
    assert args.gpu_memory_utilization == 0.9 and args.quantization == "fp8"
    assert "2 x 4 GPU(s)" in out.text


def test_sglang_and_trtllm_aggregated_round_trip(aggregated):
    (cmd,) = _commands(export_plan(aggregated, "sglang").text, "python -m sglang")
    assert cmd[:3] == ["python", "-m", "sglang.launch_server"]
    args = ref.parser(ref.SGLANG, "sglang", 0).parse_args(cmd[3:])
    assert args.model_path == "org/model name"
    assert (args.tp_size, args.pp_size, args.max_running_requests) == (4, 1, 96)
    assert args.context_length == 2500 and args.chunked_prefill_size == 4096
    assert args.kv_cache_dtype == "fp8_e4m3" and not args.enable_dp_attention
    doc = yaml.safe_load(export_plan(aggregated, "trtllm").text)
    (worker,) = doc["trtllm_workers"]
    args = ref.parser(ref.TRTLLM, "trtllm-serve", 2).parse_args(shlex.split(worker["command"]))
    assert (args.tp_size, args.pp_size, args.max_batch_size, args.max_seq_len) == (4, 1, 96, 2500)
    assert args.extra_llm_api_options == worker["options_file"]
    _check_yaml(worker["extra_llm_api_options"], ref.TRTLLM_YAML)
    assert worker["extra_llm_api_options"]["kv_cache_config"]["dtype"] == "fp8"
    assert worker["count"] == 2


def _check_yaml(doc: dict, schema: dict) -> None:
    assert set(doc) <= set(schema), set(doc) - set(schema)
    for key, value in doc.items():
        kind = schema[key]
        if isinstance(kind, dict):
            _check_yaml(value, kind)
        elif isinstance(kind, tuple):
            assert value in kind
        else:
            assert isinstance(value, kind)


def test_disaggregated_exports_name_both_pools(disaggregated):
    vllm = _commands(export_plan(disaggregated, "vllm").text, "vllm serve")
    parse = ref.parser(ref.VLLM, "vllm", 3).parse_args
    prefill, decode = (parse(c) for c in vllm)
    assert prefill.kv_transfer_config["kv_role"] == "kv_producer"
    assert decode.kv_transfer_config["kv_role"] == "kv_consumer"
    assert (decode.tensor_parallel_size, decode.data_parallel_size) == (1, 16)
    assert decode.enable_expert_parallel
    # each of vLLM's 16 DP engine cores schedules its own requests: the worker's batch of 64
    # is 4 a rank (it was written as 64 a rank, 1,024 sequences in all)
    assert decode.max_num_seqs * decode.data_parallel_size == \
        disaggregated["inference"]["deployment"]["batch"] == 64
    sg = [ref.parser(ref.SGLANG, "sglang", 0).parse_args(c[3:])
          for c in _commands(export_plan(disaggregated, "sglang").text, "python -m sglang")]
    assert [a.disaggregation_mode for a in sg] == ["prefill", "decode"]
    assert (sg[1].tp_size, sg[1].dp_size, sg[1].ep_size, sg[1].enable_dp_attention) == \
        (16, 16, 16, True)
    # SGLang divides --chunked-prefill-size by --dp-size; the plan's budget is each rank's
    budget = disaggregated["inference"]["deployment"]["max_num_tokens"]
    assert (sg[0].chunked_prefill_size, sg[1].chunked_prefill_size) == (budget, 16 * budget)
    workers = yaml.safe_load(export_plan(disaggregated, "trtllm").text)["trtllm_workers"]
    assert [w["role"] for w in workers] == ["prefill", "decode"]
    assert workers[1]["extra_llm_api_options"]["enable_attention_dp"] is True
    args = ref.parser(ref.TRTLLM, "trtllm-serve", 2).parse_args(shlex.split(workers[1]["command"]))
    assert (args.tp_size, args.ep_size) == (16, 16)
    assert [w["count"] for w in workers] == [2, 1]


def test_reference_rejects_unknown_options():
    import argparse
    with pytest.raises((SystemExit, argparse.ArgumentError)):
        ref.parser(ref.VLLM, "vllm", 3).parse_args(["vllm", "serve", "m", "--tp-size", "2"])


def test_serving_exports_refuse_training_plans(tmp_path):
    from planner.config import ParallelConfig
    from planner.cost.model import evaluate
    from planner.plan import make_plan
    model, cluster = load_model("tiny"), load_cluster("tiny")
    ev = evaluate(model, cluster, ParallelConfig(tp=1, pp=1, dp=cluster.num_gpus,
                                                 global_batch=cluster.num_gpus, seq_len=128))
    doc = make_plan(ev, model_spec="tiny", cluster_spec="tiny")
    for fmt in ("sglang", "trtllm"):
        with pytest.raises(PlannerError):
            export_plan(doc, fmt)


def test_mtp_speculative_decoding_in_every_export():
    wl = ServingWorkload(isl=1024, osl=1024, concurrency=64, mode="disaggregated", dtype="fp8",
                         kv_dtype="fp8", draft_tokens=2)
    cfg = ServingConfig("disaggregated", prefill=WorkerConfig(tp=8), decode=WorkerConfig(tp=8),
                        prefill_workers=1, decode_workers=1, batch=64)
    doc = _plan("deepseek-v3", "dgx-h200", wl, cfg, nodes=2)
    prefill, decode = (ref.parser(ref.VLLM, "vllm", 3).parse_args(c)
                       for c in _commands(export_plan(doc, "vllm").text, "vllm serve"))
    assert prefill.speculative_config is None  # prefill workers do not decode
    assert decode.speculative_config == {"method": "mtp", "num_speculative_tokens": 2}
    sg = [ref.parser(ref.SGLANG, "sglang", 0).parse_args(c[3:])
          for c in _commands(export_plan(doc, "sglang").text, "python -m sglang")]
    assert sg[0].speculative_algorithm is None
    assert (sg[1].speculative_algorithm, sg[1].speculative_num_steps,
            sg[1].speculative_eagle_topk, sg[1].speculative_num_draft_tokens) == ("EAGLE", 2, 1, 3)
    workers = yaml.safe_load(export_plan(doc, "trtllm").text)["trtllm_workers"]
    for w in workers:
        _check_yaml(w["extra_llm_api_options"], ref.TRTLLM_YAML)
    assert "speculative_config" not in workers[0]["extra_llm_api_options"]
    assert workers[1]["extra_llm_api_options"]["speculative_config"] == {
        "decoding_type": "MTP", "num_nextn_predict_layers": 2}


def test_piecewise_capture_in_the_trtllm_options_of_the_workers_that_prefill():
    """A deployment that states piecewise CUDA graphs of its prompt-carrying iterations
    (prefill_capture_num_tokens) exports them as TensorRT-LLM's torch_compile_config on the
    aggregated and prefill workers (decode-only workers replay their generation graphs); the
    plan stays schema-valid and the other exports say they leave capture sizes at defaults."""
    import json

    from planner.plan_io import schema_errors
    from planner.serve.plan import config_from_dict

    capture = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 768, 1024, 1216)
    wl = ServingWorkload(isl=1024, osl=1024, concurrency=32, dtype="fp8", kv_dtype="fp8",
                         draft_tokens=3)
    agg = ServingConfig("aggregated", worker=WorkerConfig(tp=8, ep=8), batch=32,
                        max_num_tokens=1216, prefill_capture_num_tokens=capture)
    doc = json.loads(json.dumps(_plan("deepseek-v3", "dgx-b200", wl, agg)))
    assert schema_errors(doc) == []
    assert config_from_dict(doc["inference"]["deployment"]) == agg
    (worker,) = yaml.safe_load(export_plan(doc, "trtllm").text)["trtllm_workers"]
    _check_yaml(worker["extra_llm_api_options"], ref.TRTLLM_YAML)
    assert worker["extra_llm_api_options"]["torch_compile_config"] == {
        "enable_piecewise_cuda_graph": True, "capture_num_tokens": list(capture)}
    for fmt in ("vllm", "sglang"):
        assert any("piecewise CUDA graphs" in w for w in export_plan(doc, fmt).warnings)
    dwl = ServingWorkload(isl=1024, osl=1024, concurrency=32, mode="disaggregated",
                          dtype="fp8", kv_dtype="fp8")
    dis = ServingConfig("disaggregated", prefill=WorkerConfig(tp=8, ep=8),
                        decode=WorkerConfig(tp=8, ep=8), prefill_workers=1, decode_workers=1,
                        batch=32, max_num_tokens=1216, prefill_capture_num_tokens=capture)
    prefill, decode = yaml.safe_load(export_plan(
        _plan("deepseek-v3", "dgx-b200", dwl, dis, nodes=2), "trtllm").text)["trtllm_workers"]
    assert prefill["extra_llm_api_options"]["torch_compile_config"]["capture_num_tokens"] == \
        list(capture)
    assert "torch_compile_config" not in decode["extra_llm_api_options"]


def test_plans_without_capture_export_no_torch_compile_config(aggregated):
    (worker,) = yaml.safe_load(export_plan(aggregated, "trtllm").text)["trtllm_workers"]
    assert "torch_compile_config" not in worker["extra_llm_api_options"]
    assert not any("piecewise" in w for w in export_plan(aggregated, "vllm").warnings)


def _worker_commands(doc: dict) -> dict[str, list]:
    """Each runtime's parsed arguments of every worker of ``doc``, in the plan's order."""
    vllm = [ref.parser(ref.VLLM, "vllm", 3).parse_args(c)
            for c in _commands(export_plan(doc, "vllm").text, "vllm serve")]
    sglang = [ref.parser(ref.SGLANG, "sglang", 0).parse_args(c[3:])
              for c in _commands(export_plan(doc, "sglang").text, "python -m sglang")]
    workers = yaml.safe_load(export_plan(doc, "trtllm").text)["trtllm_workers"]
    trtllm = [ref.parser(ref.TRTLLM, "trtllm-serve", 2).parse_args(shlex.split(w["command"]))
              for w in workers]
    for w, args in zip(workers, trtllm):  # CUDA graphs up to each rank's batch
        assert w["extra_llm_api_options"]["cuda_graph_config"]["max_batch_size"] == \
            args.max_batch_size
    return {"vllm": vllm, "sglang": sglang, "trtllm": trtllm}


@pytest.fixture(scope="module")
def attention_dp_plans():
    """An aggregated attention-DP worker whose batch cap (29) is no multiple of its 4 ranks,
    and a disaggregated deployment whose prefill and decode workers both run attention DP (a
    prompt per prefill rank; a decode cap of 100 over 16 ranks)."""
    agg = _plan("deepseek-v3", "dgx-h200",
                ServingWorkload(isl=1024, osl=1024, concurrency=40, dtype="fp8", kv_dtype="fp8"),
                ServingConfig("aggregated", worker=WorkerConfig(tp=2, ep=8, attention_dp=4),
                              batch=29, max_num_tokens=2048))
    dis = _plan("deepseek-v3", "dgx-h200",
                ServingWorkload(isl=1024, osl=1024, concurrency=128, mode="disaggregated",
                                dtype="fp8", kv_dtype="fp8"),
                ServingConfig("disaggregated", prefill=WorkerConfig(tp=1, ep=8, attention_dp=8),
                              decode=WorkerConfig(tp=1, ep=16, attention_dp=16),
                              prefill_workers=2, decode_workers=1, batch=100,
                              max_num_tokens=4096), nodes=4)
    return agg, dis


def test_attention_dp_caps_are_each_ranks_in_every_export(attention_dp_plans):
    """With data-parallel attention every runtime schedules each rank's requests under its own
    caps (vLLM: an engine core per DP rank; TensorRT-LLM: max_batch_size / max_num_tokens per
    rank; SGLang: --max-running-requests and --chunked-prefill-size divided by --dp-size), so
    each export writes the values whose per-rank reading is the plan's: ceil(batch / ranks)
    sequences (WorkerConfig.rank_batch, the model's own reading), the rank's token budget, a
    prefill worker's prompts per rank. Before, the exports wrote the worker's batch: vLLM and
    TensorRT-LLM let each of the 4 ranks hold 29 (116 in all), SGLang left each rank 29 // 4 = 7
    (28 < 29), and an attention-DP prefill worker's one prompt a rank became 1 // 8 = 0."""
    agg, dis = attention_dp_plans
    for doc, expected in ((agg, [(8, 2048)]), (dis, [(1, 4096), (7, 4096)])):
        for runtime, workers in _worker_commands(doc).items():
            assert [ref.rank_caps(runtime, a) for a in workers] == expected, runtime
    vllm = _worker_commands(agg)["vllm"][0]
    assert (vllm.tensor_parallel_size, vllm.data_parallel_size, vllm.enable_expert_parallel) \
        == (2, 4, True)  # vLLM's exporter writes DP attention for the MoE worker
    sglang = _worker_commands(dis)["sglang"]
    assert [(a.dp_size, a.max_running_requests) for a in sglang] == [(8, 8), (16, 112)]


def test_runtime_worker_cap_is_the_models(attention_dp_plans):
    """The sequences a worker holds under the exported caps (ranks x each rank's) are the
    serving model's largest batch (one rule: WorkerConfig.rank_batch): the plan's 29 over 4
    ranks is 8 a rank, 32 in all, and 40 requests run 32 at once, not 29; a decode cap of 100
    over 16 ranks is 7 a rank, 112 in all."""
    from planner.serve.evaluate import evaluate_serving
    from planner.serve.plan import config_from_dict, workload_from_dict
    agg, dis = attention_dp_plans
    for doc, nodes in ((agg, None), (dis, 4)):
        inf = doc["inference"]
        ev = evaluate_serving(load_model("deepseek-v3"), load_cluster("dgx-h200", nodes=nodes),
                              workload_from_dict(inf["workload"]),
                              config_from_dict(inf["deployment"]), inf["runtime"])
        pool = ev.pools[-1]
        for runtime, workers in _worker_commands(doc).items():
            assert pool.worker.attention_dp * ref.rank_caps(runtime, workers[-1])[0] == \
                pool.max_batch, runtime
    assert [d["inference"]["deployment"]["batch"] for d in (agg, dis)] == [29, 100]
    assert agg["predicted"]["max_concurrency"] == 32
    assert dis["predicted"]["max_concurrency"] == 112


@pytest.fixture(scope="module")
def pipeline_plans():
    """Workers with pipeline stages whose batch caps are no multiple of their micro-batches: an
    aggregated tp2pp3 worker capped at 100 (3 micro-batches), and a disaggregated deployment of
    a tp8pp2ep8 prefill worker (one prompt a rank) and a tp1pp2ep8adp8 decode worker capped at 100
    (13 a rank over 2 micro-batches)."""
    agg = _plan("llama-3.1-70b", "dgx-h100",
                ServingWorkload(isl=1024, osl=1024, concurrency=128, dtype="fp8", kv_dtype="fp8"),
                ServingConfig("aggregated", worker=WorkerConfig(tp=2, pp=3), batch=100,
                              max_num_tokens=4096))
    dis = _plan("deepseek-v3", "dgx-h200",
                ServingWorkload(isl=1024, osl=1024, concurrency=128, mode="disaggregated",
                                dtype="fp8", kv_dtype="fp8"),
                ServingConfig("disaggregated", prefill=WorkerConfig(tp=8, pp=2, ep=8),
                              decode=WorkerConfig(tp=1, pp=2, ep=8, attention_dp=8),
                              prefill_workers=1, decode_workers=1, batch=100,
                              max_num_tokens=4096), nodes=4)
    return agg, dis


def test_pipeline_caps_are_each_micro_batchs_in_every_export(pipeline_plans):
    """With pipeline parallelism every runtime keeps pp micro-batches in flight: TensorRT-LLM
    caps each at max_batch_size (pp x that in flight), SGLang at --pp-max-micro-batch-size
    (default --max-running-requests // pp), vLLM's pp in-flight batches share --max-num-seqs.
    So each export writes the values whose reading is the plan's pp micro-batches of
    WorkerConfig.micro_batch = ceil(ceil(batch / ranks) / pp) a rank (the serving model's own:
    pp micro-batches of b / pp). Before, TensorRT-LLM got the whole batch a micro-batch (100
    over 3 stages: 300 in flight; the decode worker's 13 a rank: 26), and SGLang's default
    100 // 3 = 33 a micro-batch ran 99 < 100."""
    agg, dis = pipeline_plans
    for doc, expected in ((agg, [(3, 34)]), (dis, [(2, 1), (2, 7)])):
        for runtime, workers in _worker_commands(doc).items():
            assert [ref.micro_caps(runtime, a) for a in workers] == expected, runtime
            assert [ref.rank_caps(runtime, a)[0] for a in workers] == \
                [pp * micro for pp, micro in expected], runtime
    (trtllm,) = _worker_commands(agg)["trtllm"]
    assert (trtllm.pp_size, trtllm.max_batch_size) == (3, 34)
    (sglang,) = _worker_commands(agg)["sglang"]
    assert (sglang.max_running_requests, sglang.pp_max_micro_batch_size) == (102, 34)
    (vllm,) = _worker_commands(agg)["vllm"]
    assert (vllm.pipeline_parallel_size, vllm.max_num_seqs) == (3, 102)


def test_runtime_pipeline_batch_is_the_models(pipeline_plans):
    """The sequences a worker with pipeline stages holds under the exported caps (ranks x pp
    micro-batches) are the serving model's largest batch, its micro-batches the runtime's: a
    cap of 100 over 3 stages is 3 x 34 = 102 (128 requests run 102 at once, not 100); a decode
    cap of 100 over 8 ranks and 2 stages 8 x 2 x 7 = 112."""
    from planner.serve.plan import config_from_dict, workload_from_dict
    agg, dis = pipeline_plans
    for doc, model, cluster, nodes in ((agg, "llama-3.1-70b", "dgx-h100", None),
                                       (dis, "deepseek-v3", "dgx-h200", 4)):
        inf = doc["inference"]
        ev = evaluate_serving(load_model(model), load_cluster(cluster, nodes=nodes),
                              workload_from_dict(inf["workload"]),
                              config_from_dict(inf["deployment"]), inf["runtime"])
        pool = ev.pools[-1]
        for runtime, workers in _worker_commands(doc).items():
            pp, micro = ref.micro_caps(runtime, workers[-1])
            assert pool.worker.attention_dp * pp * micro == pool.max_batch, runtime
    assert [d["inference"]["deployment"]["batch"] for d in (agg, dis)] == [100, 100]
    assert agg["predicted"]["max_concurrency"] == 102
    assert dis["predicted"]["max_concurrency"] == 112


@pytest.mark.parametrize("argv", [["replan", "{plan}", "--failed", "1", "-o", "{out}"],
                                  ["report", "{plan}", "-o", "{out}"],
                                  ["diff", "{plan}", "{plan}"],
                                  ["verify", "{plan}"]])
def test_training_commands_name_a_serving_plan(aggregated, argv, tmp_path, capsys):
    """A serving plan given to a training command: exit 2 naming it and the commands that
    take it. It was "missing or invalid 'parallelism'" (replan, report, diff) and an internal
    error, exit 4, KeyError (verify)."""
    if argv[0] == "verify":
        pytest.importorskip("torch")
    from planner.plan import dumps

    plan = tmp_path / "serve.json"
    plan.write_text(dumps(aggregated))
    args = [a.format(plan=plan, out=tmp_path / "out") for a in argv]
    code, _, err = run_cli(args, capsys)
    assert code == 2 and "Traceback" not in err
    assert "this is a serving plan (workload serve); this command takes a training plan" in err
