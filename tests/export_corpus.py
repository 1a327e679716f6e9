"""The 15 plans every exporter is proven on (issue 15's corpus): ZeRO 0-3, interleaving with
4/5/7 virtual stages, uneven splits (first/last flags and a free layout), selective / full /
per-layer recomputation, SP on and off, CP 2, fp16 and fp8, Mixtral with EP. Five exports
each (Megatron, torchtitan 0.2.2 TOML, torchtitan 0.3 command line, DeepSpeed, vLLM) make
the 75 cases ``tests/test_export_runtimes.py`` and ``bench/export_runtimes.py`` check.
"""
from __future__ import annotations

from pathlib import Path

from conftest import MIXTRAL, build_plan

HF = Path(__file__).resolve().parents[1] / "models" / "hf_configs"

GPT = dict(model="gpt3-1.3b", cluster="dgx-a100-80g", global_batch=64)

CORPUS: dict[str, dict] = {
    "zero0-dp-fp16": dict(**GPT, micro_batch=2, zero=0, dtype="fp16"),
    "zero1-tp2-pp2": dict(**GPT, tp=2, pp=2, zero=1),
    "zero2-pp2-uneven": dict(**GPT, tp=2, pp=2, micro_batch=2, stage_blocks=[10, 14], zero=2),
    "zero3-tp2": dict(**GPT, tp=2, zero=3, micro_batch=2),
    "interleaved-v4": dict(**GPT, pp=2, virtual_stages=4, tp=2),
    "interleaved-v5": dict(model=str(HF / "Llama-3.1-70B-Instruct.json"), cluster="dgx-h100",
                           nodes=8, global_batch=256, tp=4, pp=2, virtual_stages=5,
                           recompute="selective", seq_len=2048),
    "interleaved-v7": dict(model=str(HF / "Llama-3.1-405B.json"), cluster="dgx-h100",
                           nodes=48, global_batch=384, tp=8, pp=6, virtual_stages=7, zero=1,
                           recompute="full", seq_len=4096),
    "pp4-first-last": dict(**GPT, tp=2, pp=4, stage_blocks=[5, 7, 7, 5]),
    "pp4-layout": dict(**GPT, pp=4, stage_blocks=[6, 5, 7, 6], zero=0),
    "selective-fp8": dict(model="gpt3-1.3b", cluster="dgx-h100", global_batch=64, tp=2,
                          recompute="selective", dtype="fp8"),
    "full-recompute": dict(**GPT, pp=2, recompute="full"),
    "per-layer-recompute": dict(**GPT, pp=2, block_recompute=["full"] * 5 + ["none"] * 7 +
                                ["full"] * 3 + ["none"] * 9),
    "sp-off": dict(**GPT, tp=4, sp=False),
    "cp2": dict(**GPT, tp=2, cp=2),
    "mixtral-ep": dict(model=MIXTRAL, cluster="dgx-h100", nodes=2, global_batch=32, tp=2,
                       pp=2, ep=4, cp=2, seq_len=4096, recompute="full", zero=3),
}

# (format, target version) of the five exports per plan
EXPORTS = (("megatron", None), ("torchtitan", "0.2.2"), ("torchtitan", "0.3"),
           ("deepspeed", None), ("vllm", None))

_CACHE: dict[str, dict] = {}


def corpus_plan(name: str) -> dict:
    if name not in _CACHE:
        _CACHE[name] = build_plan(**CORPUS[name])
    return _CACHE[name]
