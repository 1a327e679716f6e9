"""shardplan.import_module on a user's own nn.Module, .pt2 files, and --importer graph."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import shardplan  # noqa: E402
from models import load_model  # noqa: E402
from models.graph.torch_import import module_graph  # noqa: E402
from planner.errors import PlannerError  # noqa: E402

HF = Path(__file__).parent.parent / "models" / "hf_configs"


class Block(nn.Module):
    def __init__(self, h: int, heads: int, kv_heads: int, ffn: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.d = heads, kv_heads, h // heads
        self.norm1, self.norm2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.q = nn.Linear(h, h, bias=False)
        self.kv = nn.Linear(h, 2 * kv_heads * self.d, bias=False)  # fused K and V
        self.out = nn.Linear(h, h, bias=True)
        self.up, self.down = nn.Linear(h, ffn), nn.Linear(ffn, h)

    def forward(self, x):
        b, s, h = x.shape
        y = self.norm1(x)
        q = self.q(y).view(b, s, self.heads, self.d).transpose(1, 2)
        k, v = self.kv(y).view(b, s, 2, self.kv_heads, self.d).unbind(2)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.out(a.transpose(1, 2).reshape(b, s, h))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class TinyGpt(nn.Module):
    def __init__(self, vocab=100, h=32, layers=3, heads=4, kv_heads=2, ffn=80):
        super().__init__()
        self.embed = nn.Embedding(vocab, h)
        self.blocks = nn.ModuleList(Block(h, heads, kv_heads, ffn) for _ in range(layers))
        self.norm = nn.LayerNorm(h)
        self.lm_head = nn.Linear(h, vocab, bias=False)
        self.lm_head.weight = self.embed.weight  # tied

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm(x))


@pytest.fixture(scope="module")
def tiny():
    with torch.device("meta"):
        model = TinyGpt()
    return model, torch.zeros(2, 24, dtype=torch.long, device="meta")


@pytest.fixture(scope="module")
def tiny_graph(tiny):
    """``tiny`` through shardplan.import_module (one export for the tests that read it)."""
    model, ids = tiny
    return shardplan.import_module(model, (ids,))


def test_import_module_counts_and_shapes(tiny, tiny_graph):
    model, _ = tiny
    graph = tiny_graph
    assert graph.params == sum(p.numel() for p in model.parameters())  # tied weight once
    assert [c.count for c in graph.layer_classes()] == [1, 3, 1]
    block = graph.layers[1]
    a, m = block.attention, block.mlp
    assert (a.num_heads, a.num_kv_heads, a.head_dim, a.causal) == (4, 2, 8, True)
    assert (m.ffn_hidden, m.gated) == (80, False) and block.num_norms == 2
    # Megatron placement: norms (2 x 2h), the row-parallel biases (out, down) replicated
    assert block.tp_replicated_params == 2 * 2 * 32 + 32 + 32
    assert graph.layers[-1].tied_params == 100 * 32 and graph.tied_embeddings
    assert graph.default_seq_len == 24


def test_op_graph_flops_and_shardable_dims(tiny):
    model, ids = tiny
    ops = module_graph(model, (ids,))
    assert ops.tokens == 2 * 24
    t, h, kv, ffn, v = 48, 32, 2 * 2 * 8, 80, 100
    per_block = 2 * t * (h * h + h * kv + h * h + 2 * h * ffn) + 2 * 2 * 24 * 24 * 4 * (8 + 8)
    assert ops.flops() == pytest.approx(3 * per_block + 2 * t * h * v)
    linear = next(op for op in ops.ops() if op.kind == "linear")
    weight = linear.params[0]
    assert dict(linear.shardable[weight]) == {0: "column", 1: "row"}
    attention = next(op for op in ops.ops() if op.kind == "attention")
    assert dict(attention.shardable["in0"]) == {0: "batch", 1: "heads"}


def test_pt2_round_trip(tiny_graph, tmp_path):
    real = TinyGpt()  # saving needs real tensors
    ids = torch.zeros(1, 16, dtype=torch.long)
    ep = torch.export.export(real, (ids,))
    path = tmp_path / "tiny.pt2"
    torch.export.save(ep, str(path))
    graph = load_model(str(path))  # the --model path: load_pt2
    assert graph.params == sum(p.numel() for p in real.parameters())
    # the same layers as the module imported directly (the meta-device TinyGpt of ``tiny``,
    # traced at another batch and length: the layer signatures do not depend on them)
    assert [c.layer.signature for c in graph.layer_classes()] == \
        [c.layer.signature for c in tiny_graph.layer_classes()]


def test_bad_pt2_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.pt2"
    bad.write_bytes(b"not a zip")
    with pytest.raises(PlannerError) as err:
        load_model(str(bad))
    assert "bad.pt2" in err.value.message


def test_untraceable_module_is_unsupported():
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            if x.sum() > 0:  # data-dependent control flow
                return self.lin(x)
            return x

    with pytest.raises(PlannerError) as err:
        shardplan.import_module(Branchy(), (torch.ones(2, 4),))
    assert err.value.kind.value == "unsupported" and "Branchy" in err.value.message


def test_importer_graph_on_the_cli(capsys):
    pytest.importorskip("transformers")
    from cli.main import main

    with pytest.raises(SystemExit) as done:
        main(["inspect", "--model", str(HF / "gpt2.json"), "--importer", "graph", "--json"])
    out, err = capsys.readouterr()
    assert done.value.code == 0, err
    doc = json.loads(out)
    assert doc["params"] == load_model(str(HF / "gpt2.json")).params == 124439808


def test_importer_graph_refuses_native_files(tmp_path):
    native = tmp_path / "m.yaml"
    native.write_text("shardplan_model: 1\nnum_layers: 2\nhidden_size: 64\nnum_heads: 4\n"
                      "ffn_hidden_size: 128\nvocab_size: 100\n")
    with pytest.raises(PlannerError) as err:
        load_model(str(native), importer="graph")
    assert "native" in err.value.message
