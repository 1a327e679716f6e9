"""Per-layer layout benchmark: the solver with a layout per block class vs the best uniform plan.

For each model the full search runs twice on the same cluster and batch: with the plan's global
mesh for every layer (``--pin layouts=mesh``, today's space) and with per-layer layouts
(``--pin layouts=per-layer``: each block class picks tensor degree tp/2, tp, 2 tp or 1 inside its
stage's ``tp x dp`` ranks, the embedding and LM head also the whole node's (``tp=node``), with
resharding between layers costed on the topology). It reports both step times, the gain, the
solve times (wall and CPU seconds: the solver is single-threaded, CPU seconds are what it takes
on an idle core), the status and which layers changed layout. A per-layer search that ends
OPTIMAL is never worse than the best uniform plan (its space contains the uniform one); one
that stops on its limits ran the uniform search in its second half (planner/solve/search.py).
Run::

    python bench/layouts.py              # prints a Markdown table (many minutes)
    python bench/layouts.py --quick      # one model
    python bench/layouts.py --only vit   # the cases whose label starts with "vit"

Models (non-uniform, where per-layer layouts can matter): a vision-language model shaped like
Llama-3.2-11B / 90B-Vision (a 40-layer ViT-H/14-style image encoder on its 4 x 1601 image tokens,
in front of the Llama-3.1-8B / 70B decoder), T5-small (encoder-decoder), Gemma-2-9B (256k
vocabulary), DeepSeek-V3 (3 dense + 58 MoE blocks; MTP not modelled), ViT-H/14 and ResNet-152
through ONNX (exported from their transformers configurations on the meta device), and
Llama-3.1-8B as a uniform control.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from clusters import load_cluster  # noqa: E402
from models import load_model  # noqa: E402
from models.hf_config import import_hf_config  # noqa: E402
from models.params import BlockShape, EmbeddingShape, HeadShape, assemble  # noqa: E402
from planner.ir import Attention, Mlp  # noqa: E402
from planner.solve.search import SearchOptions, search  # noqa: E402
from planner.solve.space import Pins  # noqa: E402


# Llama-3.2-Vision's image encoder: a ViT-H/14-style stack (32 local + 8 global layers of
# width 1280, 16 heads, GeLU MLP 5120) over one image of 4 tiles of 560 px, each 40 x 40 patches
# plus a class token: 4 x 1601 image tokens per sample (the Llama 3.2 model card;
# transformers' MllamaVisionModel). Its layers run on those tokens, not on the text sequence.
VISION_TOKENS = 4 * 1601


def _vision_blocks(count: int = 40):
    vit = BlockShape(hidden=1280, attention=Attention(16, 16, 80, 80, causal=False),
                     mlp=Mlp(5120, gated=False), norm_bias=True, qkv_bias=True, out_bias=True,
                     mlp_bias=True)
    return [(f"vision.{i}", vit) for i in range(count)]


def _with_vision_tokens(model):
    """The vision layers run on the image tokens (planner.ir.Layer.seq_len)."""
    layers = tuple(replace(layer, seq_len=VISION_TOKENS) if layer.name.startswith("vision.")
                   else layer for layer in model.layers)
    return replace(model, layers=layers)


def vlm():
    """Llama-3.2-11B-Vision-like: the 40-layer image encoder, then the Llama-3.1-8B decoder
    (its 8 cross-attention layers are left out)."""
    text = BlockShape(hidden=4096, attention=Attention(32, 8, 128, 128), mlp=Mlp(14336, True))
    blocks = _vision_blocks() + [(f"text.{i}", text) for i in range(32)]
    return _with_vision_tokens(assemble(
        name="vlm-11b", family="vlm", embedding=EmbeddingShape(128256, 4096), blocks=blocks,
        head=HeadShape(128256, 4096), default_seq_len=4096, max_seq_len=None,
        source="Llama-3.2-11B-Vision shapes"))


def vlm_90b():
    """Llama-3.2-90B-Vision-like: the same image encoder in front of the Llama-3.1-70B decoder
    (80 x 8192, 64 heads, 8 KV heads, SwiGLU 28672; cross-attention layers left out)."""
    text = BlockShape(hidden=8192, attention=Attention(64, 8, 128, 128), mlp=Mlp(28672, True))
    blocks = _vision_blocks() + [(f"text.{i}", text) for i in range(80)]
    return _with_vision_tokens(assemble(
        name="vlm-90b", family="vlm", embedding=EmbeddingShape(128256, 8192), blocks=blocks,
        head=HeadShape(128256, 8192), default_seq_len=4096, max_seq_len=None,
        source="Llama-3.2-90B-Vision shapes"))


def hf(name: str, folder: str = "models/hf_configs"):
    path = ROOT / folder / name
    return import_hf_config(json.loads(path.read_text()), name=path.stem)


ONNX_DIR = Path(tempfile.gettempdir()) / "shardplan-bench-onnx"


def _export_vision(make, config, path: Path) -> None:
    """Build a transformers image classifier on the meta device and write its weightless ONNX
    graph (models/graph/onnx_meta.py) to ``path``."""
    import torch

    from models.graph.onnx_meta import export_onnx_meta

    with torch.device("meta"):
        model = make(config).eval()

    class Logits(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, pixels):
            return self.inner(pixel_values=pixels).logits

    ONNX_DIR.mkdir(exist_ok=True)
    export_onnx_meta(Logits(model), (torch.zeros(1, 3, 224, 224, device="meta"),), path)


def onnx_vision(kind: str):
    """ResNet-152, ResNet-50 or ViT-H/14 from their transformers configurations, built on the
    meta device, exported to a weightless ONNX file (cached in the temp folder) and read back
    through the ONNX importer: the graph path a user's .onnx file takes."""
    import transformers

    from models.graph.onnx_import import load_onnx

    path = ONNX_DIR / f"{kind}.onnx"
    if not path.exists():
        if kind.startswith("resnet"):  # He et al. 2016, Table 1: bottleneck blocks per stage
            depths = {"resnet-152": [3, 8, 36, 3], "resnet-50": [3, 4, 6, 3]}[kind]
            _export_vision(transformers.ResNetForImageClassification, transformers.ResNetConfig(
                depths=depths, layer_type="bottleneck", hidden_sizes=[256, 512, 1024, 2048]),
                path)
        else:  # ViT-H/14 (Dosovitskiy et al. 2021, Table 1): 32 x 1280, 16 heads, MLP 5120
            _export_vision(transformers.ViTForImageClassification, transformers.ViTConfig(
                hidden_size=1280, num_hidden_layers=32, num_attention_heads=16,
                intermediate_size=5120, image_size=224, patch_size=14, num_labels=1000), path)
    return load_onnx(path).with_name(kind)


CASES = [
    ("vlm-11b", vlm, "dgx-h100", 2, 256, 4096),
    ("vlm-90b", vlm_90b, "dgx-h100", 8, 512, 4096),
    ("gemma-2-9b (256k vocab)", lambda: hf("gemma-2-9b.json", "tests/fixtures/hf_extra"),
     "dgx-h100", 1, 128, 4096),
    ("t5-small", lambda: hf("t5-small.json"), "dgx-a100-80g", 1, 256, 512),
    ("llama-3.1-8b (uniform control)", lambda: load_model("llama-3.1-8b"), "dgx-h100", 1, 128,
     8192),
    ("gpt3-175b (target: per-layer <= 5 s)", lambda: load_model("gpt3-175b"), "dgx-a100-80g",
     128, 1536, 2048),
    ("deepseek-v3 (3 dense + 58 MoE)", lambda: hf("DeepSeek-V3.json"), "hgx-h800", 256, 4096,
     4096),
    ("vit-h/14 (onnx, 224 px)", lambda: onnx_vision("vit-h-14"), "dgx-h100", 1, 1024, 1),
    ("resnet-152 (onnx, 224 px)", lambda: onnx_vision("resnet-152"), "dgx-h100", 1, 1024, 1),
]


# NVIDIA DeepLearningExamples, "ResNet50 v1.5 for PyTorch" README, training performance on
# DGX A100 (8x A100 80GB), mixed precision, 8 GPUs (pytorch-21.03 container): images per second.
RESNET50_PUBLISHED_IMAGES_PER_S = 16621


def conv_check() -> str:
    """The convolution cost against a published number (nothing fitted): ResNet-50 v1.5
    (transformers' ResNetConfig, depths 3-4-6-3, stride in the 3x3) through its ONNX graph,
    data parallel on one DGX A100 80GB, 256 images per GPU."""
    from planner.config import ParallelConfig
    from planner.cost.model import evaluate
    from planner.strategy import uniform as uniform_placement

    graph = onnx_vision("resnet-50")
    cluster = load_cluster("dgx-a100-80g")
    c = ParallelConfig(tp=1, pp=1, dp=8, micro_batch=256, global_batch=8 * 256, seq_len=1)
    ev = evaluate(graph, cluster, c, uniform_placement(graph, c))
    predicted = c.global_batch / ev.step_time_s
    return (f"ResNet-50 v1.5, DGX A100 80GB, dp 8 x 256 images: predicted {predicted:,.0f} "
            f"images/s, published {RESNET50_PUBLISHED_IMAGES_PER_S:,} "
            f"({predicted / RESNET50_PUBLISHED_IMAGES_PER_S - 1:+.1%})")


def run(case, time_limit: float) -> dict:
    label, make, cluster_name, nodes, batch, seq = case
    model, cluster = make(), load_cluster(cluster_name, nodes=nodes)
    out = {"model": label, "cluster": f"{cluster_name} x{nodes}", "batch": batch, "seq": seq}
    for key, pins in (("uniform", Pins()), ("layered", Pins(layouts="per-layer"))):
        start, cpu = time.perf_counter(), time.process_time()
        # the per-layer search as the CLI runs it (alone; the uniform search only runs in the
        # second half of its limits if it stops on the first half)
        result = search(model, cluster, batch, seq, pins=pins,
                        options=SearchOptions(time_limit_s=time_limit))
        out[key] = result.best.step_time_s
        out[f"{key}_solve_s"] = time.perf_counter() - start
        out[f"{key}_cpu_s"] = time.process_time() - cpu
        out[f"{key}_status"] = result.record.status
        best = result.best
        out[f"{key}_mesh"] = f"tp{best.config.tp} pp{best.config.pp} dp{best.config.dp}"
        if key == "layered":
            changed: dict[str, int] = {}
            for layer, option in zip(model.layers, best.placement.options):
                if option.layout.value != "mesh":
                    kind = layer.name.split(".")[0]
                    if layer.mlp is not None and layer.mlp.is_moe:
                        kind = f"moe-{kind}"  # a MoE block (attention + shared experts)
                    changed[f"{kind}:{option.layout.value}"] = \
                        changed.get(f"{kind}:{option.layout.value}", 0) + 1
            out["changed"] = ", ".join(f"{k} x{v}" for k, v in sorted(changed.items())) or "none"
    out["gain"] = out["uniform"] / out["layered"] - 1
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--only", help="run the cases whose label starts with this")
    parser.add_argument("--conv-check", action="store_true",
                        help="only compare the convolution cost with a published ResNet-50 run")
    args = parser.parse_args(argv)
    if args.conv_check:
        print(conv_check())
        return 0
    cases = CASES[:1] if args.quick else CASES
    if args.only:
        cases = [c for c in CASES if c[0].startswith(args.only)]
    print("| model | cluster | batch x seq | uniform s (mesh) | per-layer s (mesh) | gain | "
          "solve wall s (cpu s) uniform / per-layer | layers off the mesh layout |")
    print("|---|---|---|---:|---:|---:|---|---|")
    for case in cases:
        r = run(case, args.time_limit)
        print(f"| {r['model']} | {r['cluster']} | {r['batch']} x {r['seq']} | "
              f"{r['uniform']:.3f} ({r['uniform_mesh']}) | {r['layered']:.3f} "
              f"({r['layered_mesh']}) | {r['gain']:+.1%} | {r['uniform_solve_s']:.1f} "
              f"({r['uniform_cpu_s']:.1f}) {r['uniform_status']} / {r['layered_solve_s']:.1f} "
              f"({r['layered_cpu_s']:.1f}) {r['layered_status']} | {r['changed']} |",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
