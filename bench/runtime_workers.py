"""The runtimes' own parsers, one worker function per runtime (``bench/export_runtimes.py``
runs each in its own process: ``python -m bench.export_runtimes --worker RUNTIME CASES``).

Each takes the cases (export text, notes, the plan's world size and GPU architecture) and
returns, per case, whether the runtime accepted it and what it derived, then the runtime's
version. Process groups are the fake backend of the plan's world size; GPU-capability queries
answer for the plan's GPU.
"""
from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.export_runtimes import _titan_derived


def _worker_deepspeed(cases: list[dict]) -> list[dict]:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import deepspeed
    import deepspeed.comm as dscomm
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.pipe.topology import (PipelineParallelGrid,
                                                 PipeModelDataParallelTopology)

    # the parser needs no collective kernel: on a CPU machine DeepSpeed's backend would first
    # JIT-compile its shared-memory all-reduce op with g++ (minutes on 2 cores). The module is
    # taken from sys.modules: the package's attribute ``torch`` is PyTorch itself.
    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None

    class Mpu:  # what the export's note asks the user to pass as ``mpu``
        def __init__(self, dp: int) -> None:
            self.dp = dp

        def get_data_parallel_world_size(self) -> int:
            return self.dp

    out = []
    for case in cases:
        world = case["world"]
        if dist.is_initialized():
            dist.destroy_process_group()
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
        dscomm.init_distributed(dist_backend="fake", auto_mpi_discovery=False,
                                dist_init_required=False)
        notes = "\n".join(case["notes"])
        topo = re.search(r"num_pp=(\d+), num_mp=(\d+), num_dp=(\d+)", notes)
        told = re.search(r"get_data_parallel_world_size\(\) returns (\d+)", notes)
        mpu = None
        if topo:
            mpu = PipelineParallelGrid(topology=PipeModelDataParallelTopology(
                num_pp=int(topo[1]), num_mp=int(topo[2]), num_dp=int(topo[3])))
        elif told:
            mpu = Mpu(int(told[1]))
        try:
            config = DeepSpeedConfig(json.loads(case["text"]), mpu=mpu)
            if topo and config.zero_optimization_stage >= 2:  # PipelineEngine.__init__
                raise AssertionError("ZeRO-2 and ZeRO-3 are incompatible with pipeline "
                                     "parallelism")
            derived = {"dp": int(config.world_size), "micro_batch":
                       config.train_micro_batch_size_per_gpu,
                       "global_batch": config.train_batch_size,
                       "num_micro_batches": config.gradient_accumulation_steps,
                       "tp": max(1, config.tensor_parallel_config.autotp_size or 1)}
            if topo:
                derived.update(pp=mpu.pipe_parallel_size)
            out.append({"accepted": True, "derived": derived})
        except Exception as error:  # the runtime's refusal, as it words it
            out.append({"accepted": False, "message": f"{type(error).__name__}: {error}"})
    out.append({"version": deepspeed.__version__})
    return out


def _worker_torchtitan(cases: list[dict]) -> list[dict]:
    import contextlib
    import importlib.metadata
    import io
    import logging

    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torchtitan.config import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims

    from planner.export.quoting import parse_bash_array_file

    import torchtitan.components.quantization.float8 as float8
    import torchtitan.components.quantization.mx as mx
    import torchtitan.components.quantization.nvfp4 as nvfp4

    logging.disable(logging.WARNING)
    out = []
    for case in cases:
        # the registry's GPU-capability queries answer for the plan's GPU, not this CPU
        capability = (case["arch"], 0)
        for module in (float8, mx, nvfp4):
            module.has_cuda_capability = lambda major, minor, c=capability: c >= (major, minor)
        words = parse_bash_array_file(case["text"], "TORCHTITAN_ARGS")
        if "--module" not in words:  # the Use line: the user names their model's entry
            words = ["--module", "llama3", "--config", "llama3_8b"] + words
        errors = io.StringIO()
        try:
            with contextlib.redirect_stderr(errors):  # tyro prints its refusal, then exits
                config = ConfigManager().parse_args(words)
            if dist.is_initialized():
                dist.destroy_process_group()
            dist.init_process_group("fake", store=FakeStore(), rank=0,
                                    world_size=case["world"])
            dims = ParallelDims.from_config(config.parallelism, case["world"])
            dims.build_mesh()
            par, training = config.parallelism, config.training
            ac = config.activation_checkpoint
            mode = "none" if ac is None else type(ac).__qualname__.split(".")[0]
            as_dict = {k: getattr(par, k) for k in (
                "data_parallel_replicate_degree", "tensor_parallel_degree",
                "pipeline_parallel_degree", "context_parallel_degree", "expert_parallel_degree",
                "pipeline_parallel_microbatch_size", "module_fqns_per_model_part",
                "pipeline_parallel_schedule")}
            derived = _titan_derived(
                None, as_dict, {"local_batch_size": training.local_batch_size,
                                "global_batch_size": training.global_batch_size,
                                "seq_len": training.seq_len},
                dims.dp_shard, {"FullAC": "full", "SelectiveAC": "selective"}.get(mode, "none"))
            derived["sp"] = bool(par.enable_sequence_parallel and par.tensor_parallel_degree > 1)
            # the model compiled (CompileConfig.enable with "model" in its components): what
            # a compiled plan costs; a registry entry may compile the loss alone
            derived["compile"] = bool(config.compile.enable
                                      and "model" in config.compile.components)
            # Float8 training: the registry entry's converters turned Linear configs into
            # torchao Float8 ones (torchtitan/components/quantization/float8.py)
            derived["float8"] = "Float8" in repr(config.model_spec.model)
            out.append({"accepted": True, "derived": derived})
        except BaseException as error:  # tyro exits with SystemExit on a bad argument
            said = " ".join(line.strip(" │╭╮╰╯─") for line in errors.getvalue().splitlines()
                            if line.strip(" │╭╮╰╯─"))
            out.append({"accepted": False,
                        "message": f"{type(error).__name__}: {error} {said[:1500]}".strip()})
    out.append({"version": importlib.metadata.version("torchtitan")})
    return out


def model_args(doc: dict[str, Any]) -> list[str]:
    """The model-shape arguments Megatron needs besides the exported parallel ones (the plan
    does not fix them; the bench takes them from the plan's embedded model)."""
    ir = doc["inputs"]["model"]["ir"]
    block = next(x for x in ir["layers"] if x["kind"] == "block")
    att, mlp = block["attention"], block["mlp"]
    args = ["--hidden-size", str(ir["hidden"]), "--num-attention-heads", str(att["num_heads"]),
            "--ffn-hidden-size", str(mlp["ffn_hidden"]),
            "--max-position-embeddings", str(max(ir["max_seq_len"] or 0,
                                                 doc["parallelism"]["seq_len"])),
            "--tokenizer-type", "NullTokenizer", "--vocab-size", str(ir["vocab"]),
            "--mock-data", "--train-iters", "1", "--lr", "1e-4", "--position-embedding-type",
            "rope"]
    if att["num_kv_heads"] != att["num_heads"]:
        args += ["--group-query-attention", "--num-query-groups", str(att["num_kv_heads"])]
    if mlp["num_experts"] > 1:
        args += ["--num-experts", str(mlp["num_experts"]), "--moe-router-topk",
                 str(mlp["top_k"])]
    return args


def _worker_megatron(cases: list[dict]) -> list[dict]:
    """Megatron-LM's parse_args + validate_args + micro-batch calculator + layer offsets,
    with WORLD_SIZE/RANK of the plan and the GPU-capability query answering for its GPU."""
    import contextlib
    import importlib.metadata
    import io

    import megatron.training.arguments as arguments
    from megatron.core.num_microbatches_calculator import (get_num_microbatches,
                                                           init_num_microbatches_calculator,
                                                           unset_num_microbatches_calculator)

    import torch

    out = []
    for case in cases:
        os.environ.update(case["env"], WORLD_SIZE=str(case["world"]), RANK="0", LOCAL_RANK="0")
        arguments.get_device_arch_version = lambda arch=case["arch"]: arch
        torch.cuda.get_device_capability = lambda device=None, arch=case["arch"]: (arch, 0)
        sys.argv = ["pretrain_gpt.py", *case["model_args"], *case["args"]]
        said = io.StringIO()
        try:
            with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
                args = arguments.parse_args()
                arguments.validate_args(args)
                init_num_microbatches_calculator(0, None, args.global_batch_size,
                                                 args.micro_batch_size, args.data_parallel_size)
                micro_batches = get_num_microbatches()
                unset_num_microbatches_calculator()
            vpp = args.virtual_pipeline_model_parallel_size or 1
            out.append({"accepted": True, "derived": {
                "tp": args.tensor_model_parallel_size, "pp": args.pipeline_model_parallel_size,
                "cp": args.context_parallel_size, "ep": args.expert_model_parallel_size,
                "dp": args.data_parallel_size, "micro_batch": args.micro_batch_size,
                "global_batch": args.global_batch_size, "num_micro_batches": micro_batches,
                "virtual_stages": vpp, "sp": bool(args.sequence_parallel)}})
        except BaseException as error:
            out.append({"accepted": False, "message": f"{type(error).__name__}: {error} "
                                                      f"{said.getvalue()[-800:]}".strip()})
        for key in case["env"]:
            os.environ.pop(key, None)
    out.append({"version": importlib.metadata.version("megatron-core")})
    return out


def _worker_torchtitan_022(cases: list[dict]) -> list[dict]:
    """torchtitan 0.2.2 (TOML era, installed in its own folder on PYTHONPATH): ConfigManager
    reads the job file (unknown keys refused), ParallelDims.build_mesh on the fake backend."""
    import contextlib
    import io
    import logging

    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torchtitan.config import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims

    logging.disable(logging.WARNING)
    out = []
    for case in cases:
        said = io.StringIO()
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "job.toml"
            path.write_text(case["text"])
            try:
                with contextlib.redirect_stderr(said), contextlib.redirect_stdout(said):
                    config = ConfigManager().parse_args(["--job.config_file", str(path)])
                if dist.is_initialized():
                    dist.destroy_process_group()
                dist.init_process_group("fake", store=FakeStore(), rank=0,
                                        world_size=case["world"])
                par, training = config.parallelism, config.training
                dims = ParallelDims(dp_replicate=par.data_parallel_replicate_degree,
                                    dp_shard=par.data_parallel_shard_degree,
                                    cp=par.context_parallel_degree, tp=par.tensor_parallel_degree,
                                    pp=par.pipeline_parallel_degree,
                                    ep=par.expert_parallel_degree,
                                    etp=par.expert_tensor_parallel_degree,
                                    world_size=case["world"])
                dims.build_mesh()
                as_dict = {k: getattr(par, k) for k in (
                    "data_parallel_replicate_degree", "tensor_parallel_degree",
                    "pipeline_parallel_degree", "context_parallel_degree",
                    "expert_parallel_degree", "pipeline_parallel_microbatch_size",
                    "module_fqns_per_model_part", "pipeline_parallel_schedule")}
                derived = _titan_derived(None, as_dict, {
                    "local_batch_size": training.local_batch_size,
                    "global_batch_size": training.global_batch_size,
                    "seq_len": training.seq_len}, dims.dp_shard,
                    config.activation_checkpoint.mode)
                derived["compile"] = bool(config.compile.enable  # [compile] enable, the model
                                          and "model" in config.compile.components)
                out.append({"accepted": True, "derived": derived})
            except BaseException as error:
                out.append({"accepted": False, "message": f"{type(error).__name__}: {error} "
                                                          f"{said.getvalue()[-800:]}".strip()})
    import importlib.metadata

    out.append({"version": importlib.metadata.version("torchtitan")})  # the folder's, first
    return out


def _worker_vllm(cases: list[dict]) -> list[dict]:
    """vLLM's own ``vllm serve`` path on its CPU platform (VLLM_TARGET_DEVICE=cpu, offline):
    the serve parser (``make_arg_parser`` over a ``FlexibleArgumentParser``), then
    ``AsyncEngineArgs.from_cli_args`` and ``create_engine_config``, which validates the
    parallel layout against the model's config.json (heads, layers, experts) and the
    platform. Each case: the words after ``vllm serve MODEL``, the model's HF config and the
    GPUs the plan gives the engine."""
    import contextlib
    import importlib.metadata
    import io
    import logging

    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    logging.disable(logging.WARNING)
    out = []
    for case in cases:
        said = io.StringIO()
        with tempfile.TemporaryDirectory() as folder:
            (Path(folder) / "config.json").write_text(json.dumps(case["config"]))
            try:
                with contextlib.redirect_stderr(said), contextlib.redirect_stdout(said):
                    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
                    args = parser.parse_args([folder, *case["args"], "--skip-tokenizer-init"])
                    args.model = args.model_tag  # as `vllm serve` does
                    engine = AsyncEngineArgs.from_cli_args(args)
                    config = engine.create_engine_config()
                par, model = config.parallel_config, config.model_config
                ep = par.tensor_parallel_size * par.data_parallel_size \
                    if par.enable_expert_parallel else 1
                out.append({"accepted": True, "derived": {
                    "tp": par.tensor_parallel_size, "pp": par.pipeline_parallel_size,
                    "dp": par.data_parallel_size, "ep": ep,
                    "gpus": par.world_size * par.data_parallel_size,
                    "seq_len": model.max_model_len, "dtype": str(model.dtype),
                    "max_num_seqs": config.scheduler_config.max_num_seqs,
                    "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
                    "kv_cache_dtype": config.cache_config.cache_dtype,
                    "kv_role": (config.kv_transfer_config.kv_role
                                if config.kv_transfer_config else None),
                    "chunked_prefill": bool(config.scheduler_config.enable_chunked_prefill),
                    "use_mla": bool(model.use_mla)}})
            except BaseException as error:
                out.append({"accepted": False, "message": f"{type(error).__name__}: {error} "
                                                          f"{said.getvalue()[-800:]}".strip()})
    out.append({"version": importlib.metadata.version("vllm")})
    return out


WORKERS = {"deepspeed": _worker_deepspeed, "torchtitan": _worker_torchtitan,
           "megatron": _worker_megatron, "torchtitan-0.2.2": _worker_torchtitan_022,
           "vllm": _worker_vllm}



