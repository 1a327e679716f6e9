"""ONNX importer: graphs built with onnx.helper (a ResNet, a UNet) and exported with
torch.onnx.export (a Llama-style decoder, a ViT), never run; counts checked against the
builders' own arithmetic and against torch's parameter count."""
from __future__ import annotations

import json
import math

import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

from models.graph.onnx_import import load_onnx, onnx_graph  # noqa: E402
from planner.errors import PlannerError  # noqa: E402


class Builder:
    """A tiny onnx.helper graph writer with TorchScript-style node names."""

    def __init__(self) -> None:
        self.nodes, self.inits, self.n = [], [], 0
        self.params = 0  # parameters (BatchNorm statistics excluded)
        self.conv_flops = 0.0

    def init(self, name: str, shape: tuple[int, ...], param: bool = True) -> str:
        self.inits.append(helper.make_tensor(name, TensorProto.FLOAT, shape,
                                             [0.0] * math.prod(shape)))
        if param:
            self.params += math.prod(shape)
        return name

    def node(self, op: str, scope: str, inputs: list[str], **attrs) -> str:
        self.n += 1
        out = f"t{self.n}"
        name = "/" + "/".join(scope.split("/")) + f"/{op}_{self.n}" if scope else f"{op}_{self.n}"
        self.nodes.append(helper.make_node(op, inputs, [out], name=name, **attrs))
        return out

    def conv(self, scope: str, x: str, cin: int, cout: int, k: int, hw_out: int,
             stride: int = 1) -> str:
        w = self.init(f"{scope.replace('/', '.')}.weight", (cout, cin, k, k))
        self.conv_flops += 2.0 * cout * hw_out * hw_out * cin * k * k
        return self.node("Conv", scope, [x, w], kernel_shape=[k, k], pads=[k // 2] * 4,
                         strides=[stride, stride])

    def bn(self, scope: str, x: str, c: int) -> str:
        p = scope.replace("/", ".")
        ins = [self.init(f"{p}.weight", (c,)), self.init(f"{p}.bias", (c,)),
               self.init(f"{p}.running_mean", (c,), param=False),
               self.init(f"{p}.running_var", (c,), param=False)]
        return self.node("BatchNormalization", scope, [x, *ins])

    def save(self, path, inputs, outputs) -> None:
        graph = helper.make_graph(self.nodes, "g", inputs, outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        onnx.save(model, str(path))


def resnet(path, blocks=(2, 2), width=8, image=16) -> Builder:
    """A ResNet-18-style network: stem, stages of basic blocks (the first block of a later stage
    downsamples with a strided 1x1 projection), global pooling, a linear classifier."""
    b = Builder()
    x = b.node("Relu", "relu", [b.bn("bn1", b.conv("conv1", "pixels", 3, width, 3, image), width)])
    cin, hw = width, image
    for s, count in enumerate(blocks, start=1):
        cout = width * 2 ** (s - 1)
        for i in range(count):
            scope = f"layer{s}/layer{s}.{i}"
            stride = 2 if (s > 1 and i == 0) else 1
            hw_out = hw // stride
            y = b.node("Relu", f"{scope}/relu", [b.bn(f"{scope}/bn1", b.conv(
                f"{scope}/conv1", x, cin, cout, 3, hw_out, stride), cout)])
            y = b.bn(f"{scope}/bn2", b.conv(f"{scope}/conv2", y, cout, cout, 3, hw_out), cout)
            short = x
            if stride != 1 or cin != cout:
                short = b.bn(f"{scope}/downsample/downsample.1", b.conv(
                    f"{scope}/downsample/downsample.0", x, cin, cout, 1, hw_out, stride), cout)
            x = b.node("Relu", f"{scope}/relu", [b.node("Add", scope, [y, short])])
            cin, hw = cout, hw_out
    pooled = b.node("Flatten", "", [b.node("GlobalAveragePool", "avgpool", [x])])
    w, bias = b.init("fc.weight", (10, cin)), b.init("fc.bias", (10,))
    out = b.node("Gemm", "fc", [pooled, w, bias], transB=1)
    b.nodes[-1].output[0] = "logits"
    del out
    b.save(path, [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, [1, 3, image, image])],
           [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])])
    return b


def test_resnet_from_helper(tmp_path):
    path = tmp_path / "resnet.onnx"
    b = resnet(path)
    ops = onnx_graph(path)
    assert ops.num_params == b.params  # BatchNorm running statistics are not parameters
    assert ops.flops(("conv",)) == pytest.approx(b.conv_flops)
    graph = load_onnx(path)
    assert graph.params == b.params
    names = [c.layer.name for c in graph.layer_classes()]
    counts = [c.count for c in graph.layer_classes()]
    # embedding (stem), layer1.0 + layer1.1 identical, layer2.0 (downsample), layer2.1, head
    assert names == ["embedding", "layer1.0", "layer2.0", "layer2.1", "head"]
    assert counts == [1, 2, 1, 1, 1]
    assert graph.layers[-1].params == 10 * 16 + 10
    assert all(layer.attention is None for layer in graph.blocks())


def test_unet_with_eager_attention_from_helper(tmp_path):
    """A UNet: down blocks, a mid block with self-attention written as MatMul-Softmax-MatMul,
    up blocks concatenating the skip connections."""
    b = Builder()
    c, hw, heads, d = 8, 8, 2, 8
    x = b.conv("conv_in", "image", 3, c, 3, hw)
    skips = []
    for i in range(2):
        x = b.node("Relu", f"down_blocks.{i}/act", [b.conv(f"down_blocks.{i}/conv", x, c, c, 3, hw)])
        skips.append(x)
    s = "mid_block/attentions.0"
    seq = b.node("Transpose", s, [b.node("Reshape", s, [x, b.init("shape_tokens", (3,), False)])],
                 perm=[0, 2, 1])  # (1, hw*hw, c)
    b.inits[-1] = helper.make_tensor("shape_tokens", TensorProto.INT64, [3], [1, c, hw * hw])
    proj = {}
    for name in ("to_q", "to_k", "to_v"):
        w = b.init(f"mid_block.attentions.0.{name}.weight", (c, heads * d))
        y = b.node("MatMul", f"{s}/{name}", [seq, w])
        shape = f"heads_{name}"
        b.inits.append(helper.make_tensor(shape, TensorProto.INT64, [4], [1, hw * hw, heads, d]))
        proj[name] = b.node("Transpose", s, [b.node("Reshape", s, [y, shape])], perm=[0, 2, 1, 3])
    kt = b.node("Transpose", s, [proj["to_k"]], perm=[0, 1, 3, 2])
    probs = b.node("Softmax", s, [b.node("MatMul", s, [proj["to_q"], kt])], axis=-1)
    ctx = b.node("MatMul", s, [probs, proj["to_v"]])
    b.inits.append(helper.make_tensor("merge", TensorProto.INT64, [3], [1, hw * hw, heads * d]))
    merged = b.node("Reshape", s, [b.node("Transpose", s, [ctx], perm=[0, 2, 1, 3]), "merge"])
    out = b.node("MatMul", f"{s}/to_out", [merged, b.init(f"{s.replace('/', '.')}.to_out.weight",
                                                         (heads * d, c))])
    b.inits.append(helper.make_tensor("back", TensorProto.INT64, [4], [1, c, hw, hw]))
    x = b.node("Add", s, [x, b.node("Reshape", s, [b.node("Transpose", s, [out], perm=[0, 2, 1]),
                                                   "back"])])
    for i in range(2):
        cat = b.node("Concat", f"up_blocks.{i}", [x, skips.pop()], axis=1)
        x = b.node("Relu", f"up_blocks.{i}/act", [b.conv(f"up_blocks.{i}/conv", cat, 2 * c, c, 3, hw)])
    b.conv("conv_out", x, c, 3, 3, hw)
    b.nodes[-1].output[0] = "noise"
    path = tmp_path / "unet.onnx"
    b.save(path, [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, hw, hw])],
           [helper.make_tensor_value_info("noise", TensorProto.FLOAT, [1, 3, hw, hw])])
    graph = load_onnx(path)
    assert graph.params == b.params
    by_name = {layer.name: layer for layer in graph.layers}
    assert set(by_name) == {"embedding", "down_blocks.0", "down_blocks.1",
                            "mid_block.attentions.0", "up_blocks.0", "up_blocks.1", "head"}
    att = by_name["mid_block.attentions.0"].attention
    assert (att.num_heads, att.num_kv_heads, att.head_dim, att.causal) == (heads, heads, d, False)
    ops = onnx_graph(path)
    tokens = hw * hw
    assert ops.flops(("matmul",)) == pytest.approx(2 * 2.0 * heads * tokens * tokens * d)


def test_not_onnx_is_a_clear_error(tmp_path):
    bad = tmp_path / "x.onnx"
    bad.write_bytes(b"\x00not a protobuf\xff" * 10)
    with pytest.raises(PlannerError) as err:
        load_onnx(bad)
    assert "not an ONNX model" in err.value.message or "shape inference" in err.value.message


# -- exported from PyTorch ---------------------------------------------------------------------

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


class _Logits(torch.nn.Module):
    def __init__(self, model, key="input_ids"):
        super().__init__()
        self.model, self.key = model, key

    def forward(self, x):
        out = self.model(**{self.key: x})
        return out.logits if hasattr(out, "logits") else out.pooler_output


@pytest.fixture(scope="module")
def llama_onnx(tmp_path_factory):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      vocab_size=96, max_position_embeddings=64)
    model = _Logits(transformers.LlamaForCausalLM(config).eval())
    ids = torch.zeros(1, 16, dtype=torch.long)
    path = tmp_path_factory.mktemp("onnx") / "llama.onnx"
    torch.onnx.export(model, (ids,), str(path), dynamo=True, optimize=False, verbose=False)
    return path, model, ids


def test_llama_onnx_matches_torch_export(llama_onnx):
    from models.graph.torch_import import import_module

    path, model, ids = llama_onnx
    by_onnx = load_onnx(path)
    by_fx = import_module(model, (ids,))
    assert by_onnx.params == by_fx.params == sum(p.numel() for p in model.parameters())
    assert [(c.layer.signature, c.count) for c in by_onnx.layer_classes()] == \
        [(c.layer.signature, c.count) for c in by_fx.layer_classes()]
    block = by_onnx.layers[1]
    assert (block.attention.num_heads, block.attention.num_kv_heads) == (4, 2)
    assert block.attention.causal and block.mlp.gated and block.mlp.ffn_hidden == 160
    # rotary inv_freq is a buffer: the exporter's record says so
    assert "model.model.rotary_emb.inv_freq" not in onnx_graph(path).params


def run(capsys, *argv: str) -> tuple[int, str, str]:
    from cli.main import main

    with pytest.raises(SystemExit) as done:
        main(list(argv))
    out, err = capsys.readouterr()
    return done.value.code, out, err


def test_cli_plans_an_onnx_file(llama_onnx, capsys):
    path, _, _ = llama_onnx
    code, out, err = run(capsys, "plan", "--model", str(path), "--cluster", "tiny",
                         "--global-batch", "8", "--time-limit", "20", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["inputs"]["model"]["spec"] == str(path)
    assert doc["inputs"]["model"]["ir"]["layers"][1]["attention"]["num_kv_heads"] == 2


def test_cli_bad_onnx_exits_2(tmp_path, capsys):
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"\x00not a protobuf\xff" * 10)
    code, _, err = run(capsys, "inspect", "--model", str(bad))
    assert code == 2 and "broken.onnx" in err and "Traceback" not in err


def test_vit_onnx(tmp_path):
    config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                    intermediate_size=64, image_size=32, patch_size=8)
    model = _Logits(transformers.ViTModel(config).eval(), key="pixel_values")
    pixels = torch.zeros(1, 3, 32, 32)
    path = tmp_path / "vit.onnx"
    torch.onnx.export(model, (pixels,), str(path), dynamo=True, optimize=False, verbose=False)
    graph = load_onnx(path)
    assert graph.params == sum(p.numel() for p in model.parameters())
    assert graph.num_blocks == 2 and [c.count for c in graph.layer_classes()] == [1, 2, 1]
    block = graph.layers[1]
    assert not block.attention.causal and block.attention.num_heads == 4
    assert block.mlp.ffn_hidden == 64 and not block.mlp.gated
    # patch projection, CLS token, 17 positions: replicated, in the embedding
    assert graph.layers[0].tp_replicated_params == 3 * 8 * 8 * 32 + 32 + 32 + 17 * 32
