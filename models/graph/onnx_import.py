"""ONNX importer: an ``.onnx`` file to an :class:`~models.graph.ir.OpGraph`, never running it.

Consumes: an ONNX model file (external weight files are not read: only shapes matter).
Shapes come from ``onnx.shape_inference`` (symbolic input dims are first fixed: the batch dim to
1, other symbolic dims to ``seq_len``). Produces: an OpGraph with one op per ONNX node.

* **Scopes** (module paths) come from the torch exporter's ``pkg.torch.onnx.name_scopes``
  metadata (``torch.onnx.export(dynamo=True)``), else from TorchScript-style node names
  (``/model/layers.0/self_attn/q_proj/MatMul``), else from the names of the weights a node reads.
* **Parameters** are floating-point initializers of rank >= 1 that a node combines with data
  depending on a graph input (weights, biases, norm scales, tables). Initializers used only with
  other constants (RoPE frequency buffers combined with constant positions, shape constants)
  are constants, as a buffer is not a parameter in PyTorch.
* FLOPs and shardable dimensions as in :mod:`models.graph.fx` (MatMul/Gemm with a weight are
  linear layers, activation-by-activation MatMuls batched GEMMs, ``Attention`` (opset 23) a
  fused attention core, Conv an im2col GEMM).

Needs the ``onnx`` package (the ``graph`` extra).
"""
from __future__ import annotations

import ast
import os
from pathlib import Path
from typing import Any

from planner.errors import ErrorKind, PlannerError, invalid
from planner.ir import ModelGraph

from .group import group_layers
from .ir import (Op, OpGraph, OpKind, OpNames, Param, TensorMeta, attention_shardable,
                 classify_simple, conv_attrs, gemm_flops, linear_shardable)
from .torch_import import require

MAX_BYTES = 4 << 30  # a protobuf larger than this is refused unread (weights: external data)
DEFAULT_DIM = 128

VIEW = {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Slice", "Split",
        "Identity", "Expand", "Dropout"}
COPY = {"Concat", "GatherElements", "GatherND", "ScatterND", "ScatterElements", "Tile", "Pad",
        "Cast", "CastLike", "Trilu", "Gather", "Resize", "DepthToSpace", "SpaceToDepth"}
CONSTANT = {"Shape", "Size", "Constant", "ConstantOfShape", "Range", "EyeLike", "RandomNormal",
            "RandomUniform", "RandomNormalLike", "RandomUniformLike"}
REDUCTION = {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd",
             "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp", "CumSum", "ArgMax", "ArgMin",
             "GlobalAveragePool", "GlobalMaxPool", "AveragePool", "MaxPool"}
NORM = {"LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization",
        "BatchNormalization", "InstanceNormalization", "GroupNormalization",
        "SkipLayerNormalization", "SkipSimplifiedLayerNormalization"}
SOFTMAX = {"Softmax", "LogSoftmax"}
TOPK = {"TopK"}
WEIGHT_TRANSPARENT = {"Transpose", "Cast", "Identity", "Reshape", "Unsqueeze", "Squeeze",
                      "DequantizeLinear"}
# Inputs that carry shapes, indices or types, not data: no tensor edge, so that dataflow
# searches (q/k/v projections, masks) do not jump between paths through shape arithmetic.
SHAPE_ONLY = {"Shape", "Size"}
DATA_FIRST = {"Reshape", "Expand", "Slice", "Unsqueeze", "Squeeze", "Tile", "Pad", "CastLike",
              "Resize", "TopK", "Split", "ConstantOfShape", "Range"}
NO_FLOPS = VIEW | COPY | CONSTANT | TOPK | {"Equal", "Less", "LessOrEqual", "Greater",
                                            "GreaterOrEqual", "Not", "And", "Or", "Xor"}
ONNX_NAMES = OpNames(norm=frozenset(NORM), view=frozenset(VIEW), copy=frozenset(COPY),
                     constant=frozenset(CONSTANT), softmax=frozenset(SOFTMAX),
                     topk=frozenset(TOPK), reduction=frozenset(REDUCTION),
                     no_flops=frozenset(NO_FLOPS))


def _dtype_name(onnx: Any, elem_type: int) -> str:
    try:
        np_type = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
        name = str(np_type)
    except (KeyError, TypeError, ValueError):
        return "float32"
    return {"float16": "float16", "float32": "float32", "float64": "float64"}.get(name, name) \
        if elem_type != onnx.TensorProto.BFLOAT16 else "bfloat16"


def _type_meta(onnx: Any, tp: Any) -> TensorMeta | None:
    if not tp.HasField("tensor_type"):
        return None
    tt = tp.tensor_type
    if not tt.HasField("shape"):
        return None
    dims = []
    for d in tt.shape.dim:
        if not d.HasField("dim_value"):
            return None
        dims.append(int(d.dim_value))
    return TensorMeta(tuple(dims), _dtype_name(onnx, tt.elem_type))


def _fix_symbolic_inputs(model: Any, seq_len: int) -> None:
    for value in model.graph.input:
        tt = value.type.tensor_type
        if not tt.HasField("shape"):
            continue
        for i, d in enumerate(tt.shape.dim):
            if not d.HasField("dim_value"):
                d.dim_value = 1 if i == 0 else seq_len


def _scope_of(node: Any, initializer_names: set[str]) -> tuple[str, tuple[str, ...]]:
    props = {p.key: p.value for p in node.metadata_props}
    scopes = props.get("pkg.torch.onnx.name_scopes")
    if scopes:
        try:
            parts = ast.literal_eval(scopes)
            classes = ast.literal_eval(props.get("pkg.torch.onnx.class_hierarchy", "[]"))
        except (ValueError, SyntaxError):
            parts, classes = [], []
        if isinstance(parts, list) and len(parts) >= 2:
            types = tuple(str(c).rsplit(".", 1)[-1] for c in classes[:-1]) \
                if isinstance(classes, list) else ()
            return str(parts[-2]), types
    if node.name.startswith("/") and node.name.count("/") >= 2:
        # TorchScript exporter: "/model/layers.0/self_attn/q_proj/MatMul"; a level may repeat
        # its parent's path ("/layer1/layer1.0/conv1/Conv")
        path = ""
        for seg in (p for p in node.name.split("/")[1:-1] if p):
            path = seg if (not path or seg.startswith(path + ".")) else f"{path}.{seg}"
        return path, ()
    for name in node.input:
        if name in initializer_names and "." in name:
            return name.rsplit(".", 1)[0], ()
    return "", ()


def onnx_graph(path: str | os.PathLike, *, seq_len: int = DEFAULT_DIM) -> OpGraph:
    """Read ``path`` and build its operator graph (shape inference, no execution)."""
    onnx = require("onnx")
    path = Path(path)
    if not path.is_file():
        raise invalid(f"{path}: no such file")
    if path.stat().st_size > MAX_BYTES:
        raise invalid(f"{path}: larger than {MAX_BYTES >> 30} GiB; save the weights as external "
                      f"data (onnx.save(..., save_as_external_data=True))")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - protobuf decode errors have many types
        raise invalid(f"{path}: not an ONNX model ({type(exc).__name__}: {str(exc)[:200]})") \
            from None
    _fix_symbolic_inputs(model, seq_len)
    try:
        model = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception as exc:  # noqa: BLE001
        raise PlannerError(ErrorKind.UNSUPPORTED, f"{path}: ONNX shape inference failed: "
                           f"{str(exc)[:300]}") from None
    return _Builder(onnx, model, path).run()


class _Builder:
    def __init__(self, onnx: Any, model: Any, path: Path) -> None:
        self.onnx = onnx
        self.model = model
        graph = model.graph
        self.og = OpGraph(path.stem, source=str(path))
        self.og.metadata["importer"] = "onnx"
        self.meta: dict[str, TensorMeta] = {}
        for v in list(graph.input) + list(graph.value_info) + list(graph.output):
            m = _type_meta(onnx, v.type)
            if m is not None:
                self.meta[v.name] = m
        self.inits = {t.name: t for t in graph.initializer}
        for name, t in self.inits.items():
            self.meta[name] = TensorMeta(tuple(int(d) for d in t.dims),
                                         _dtype_name(onnx, t.data_type))
        self.producer: dict[str, str] = {}
        self.consumers: dict[str, list[Any]] = {}
        for node in graph.node:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self.graph_inputs = [v.name for v in graph.input if v.name not in self.inits]

    def _float(self, name: str) -> bool:
        m = self.meta.get(name)
        return m is not None and m.dtype in ("float32", "float16", "bfloat16", "float64")

    def _input_dependent(self) -> set[str]:
        dep = set(self.graph_inputs)
        for node in self.model.graph.node:
            if any(i in dep for i in node.input):
                dep.update(node.output)
        return dep

    def params(self) -> dict[str, str]:
        """Initializer name -> itself for the initializers that are parameters; names reached
        from a parameter through casts / transposes map to the parameter."""
        params = self._declared_params()
        if params is None:
            params = self._inferred_params()
        alias: dict[str, str] = {p: p for p in params}
        for node in self.model.graph.node:  # weight views: Transpose(W), Cast(W)
            if node.op_type in WEIGHT_TRANSPARENT and node.input and node.input[0] in alias:
                for out in node.output:
                    alias[out] = alias[node.input[0]]
        return alias

    def _declared_params(self) -> set[str] | None:
        """The torch exporter records each initializer's ExportedProgram input kind
        (PARAMETER / BUFFER / CONSTANT_TENSOR) on its value info: exact when present."""
        kinds = {}
        for v in list(self.model.graph.value_info) + list(self.model.graph.input):
            for prop in v.metadata_props:
                if prop.key == "pkg.torch.export.graph_signature.InputSpec.kind":
                    kinds[v.name] = prop.value
        declared = {name for name in self.inits if name in kinds}
        if not declared:
            return None
        return {name for name in declared if kinds[name] == "PARAMETER"}

    def _inferred_params(self) -> set[str]:
        """Without that record: a floating-point initializer of rank >= 1 is a parameter when
        a value derived from it (and other constants only) meets data that depends on a graph
        input. BatchNormalization statistics (inputs 3, 4) are buffers."""
        dep = self._input_dependent()
        sources: dict[str, frozenset[str]] = {
            name: frozenset((name,)) if len(t.dims) >= 1 and self._float(name) else frozenset()
            for name, t in self.inits.items()}
        params: set[str] = set()
        for node in self.model.graph.node:
            const_inputs = [(i, n) for i, n in enumerate(node.input) if n and n in sources]
            if any(n in dep for n in node.input if n):
                for i, n in const_inputs:
                    if node.op_type == "BatchNormalization" and i >= 3:
                        continue
                    params.update(sources[n])
            elif const_inputs or not node.input:
                merged = frozenset().union(*(sources[n] for _, n in const_inputs)) \
                    if const_inputs else frozenset()
                for out in node.output:
                    sources[out] = merged
        return params

    def run(self) -> OpGraph:
        og = self.og
        alias = self.params()
        for name in sorted(set(alias.values())):
            m = self.meta[name]
            og.add_param(Param(name, m.shape, m.dtype))
        for name in self.graph_inputs:
            m = self.meta.get(name)
            og.add_op(Op(f"input:{name}", OpKind.INPUT, "input", outputs=(m,) if m else ()))
            self.producer[name] = f"input:{name}"
        for name in self.inits:
            if name not in alias:
                og.add_op(Op(f"const:{name}", OpKind.CONSTANT, "initializer",
                             outputs=(self.meta[name],)))
                self.producer[name] = f"const:{name}"
        names = set()
        for i, node in enumerate(self.model.graph.node):
            op_name = node.name or f"{node.op_type}_{i}"
            while op_name in names:
                op_name = f"{op_name}_{i}"
            names.add(op_name)
            self.lower(node, op_name, alias)
        return og

    def lower(self, node: Any, op_name: str, alias: dict[str, str]) -> None:
        scope, types = _scope_of(node, set(self.inits))
        params: list[str] = []
        inputs: list[TensorMeta] = []
        edges: list[tuple[str, TensorMeta]] = []
        positions: list[str | None] = []  # per node input: "p:<param>" or producer
        for index, name in enumerate(node.input):
            if not name:
                positions.append(None)
                continue
            if name in alias:
                if alias[name] not in params:
                    params.append(alias[name])
                positions.append("p:" + alias[name])
                continue
            m = self.meta.get(name)
            producer = self.producer.get(name)
            positions.append(producer)
            if m is None or producer is None or node.op_type in SHAPE_ONLY or (
                    index > 0 and node.op_type in DATA_FIRST):
                continue
            inputs.append(m)
            edges.append((producer, m))
        outputs = tuple(self.meta[o] for o in node.output if o in self.meta)
        op = Op(op_name, OpKind.OTHER, node.op_type, scope=scope, scope_types=types,
                inputs=tuple(inputs), input_ops=tuple(e[0] for e in edges), outputs=outputs,
                params=tuple(params))
        self.classify(op, node, positions)
        if op.kind != OpKind.VIEW:
            op.bytes_read = sum(t.nbytes for t in op.inputs) + sum(
                self.og.params[p].numel * 2 for p in op.params)
            op.bytes_written = sum(t.nbytes for t in op.outputs)
        self.og.add_op(op, edges)
        for out in node.output:
            self.producer[out] = op_name

    def _attr(self, node: Any, name: str, default: Any) -> Any:
        for a in node.attribute:
            if a.name == name:
                return self.onnx.helper.get_attribute_value(a)
        return default

    def classify(self, op: Op, node: Any, positions: list[str | None]) -> None:
        t = node.op_type
        out = op.outputs[0] if op.outputs else None
        weight_pos = [i for i, p in enumerate(positions) if p and p.startswith("p:")]
        if t in ("MatMul", "Gemm") and out is not None:
            ins = [self.meta.get(n) for n in node.input]
            if t == "Gemm":
                x = ins[0]
                k = x.shape[0] if self._attr(node, "transA", 0) and x else (x.shape[-1] if x else 0)
            else:
                x = ins[0] if 0 not in weight_pos else ins[1]
                k = x.shape[-1] if x and x.shape else 0
            n = out.shape[-1] if out.shape else 1
            m = out.numel // max(n, 1)
            w = positions[1][2:] if len(positions) > 1 and positions[1] and \
                positions[1].startswith("p:") else (
                positions[0][2:] if positions[0] and positions[0].startswith("p:") else None)
            op.flops = gemm_flops(m, n, k)
            if w is not None and x is not None:
                op.kind = OpKind.LINEAR
                others = [p for p in op.params if p != w]
                op.params = (w, *others)
                op.attrs = {"m": m, "n": n, "k": k, "bias": bool(others)}
                shape = self.og.params[w].shape
                out_dim = 1 if (t == "MatMul" or not self._attr(node, "transB", 0)) else 0
                if len(shape) != 2:
                    out_dim = 0
                op.shardable = linear_shardable(w, out_dim, len(x.shape))
            else:
                op.kind = OpKind.MATMUL
                op.attrs = {"m": m, "n": n, "k": k}
        elif t == "Attention" and len(op.inputs) >= 3:
            self._attention(op, node, positions)
        elif t in ("Conv", "ConvTranspose") and out is not None and op.params:
            w = self.og.params[op.params[0]]
            op.kind = OpKind.CONV
            op.attrs = conv_attrs(op.inputs[0] if op.inputs else None, w.shape, out,
                                  t == "ConvTranspose")
            op.flops = op.attrs.pop("flops")
            op.shardable = {"in0": ((0, "batch"),), op.params[0]: ((0, "channels"),)}
        elif t == "Gather" and positions and positions[0] and positions[0].startswith("p:"):
            table = self.og.params[positions[0][2:]]
            op.kind = OpKind.EMBEDDING
            op.params = (table.name,)
            op.attrs = {"rows": table.shape[0], "width": table.shape[-1] if table.shape else 1}
            op.shardable = {table.name: ((0, "vocab"), (1, "column"))}
        else:
            classify_simple(op, t, ONNX_NAMES, out)

    def _attention(self, op: Op, node: Any, positions: list[str | None]) -> None:
        q, k, v = op.inputs[:3]
        if len(q.shape) == 4:
            batch, heads, q_len, head_dim = q.shape
            kv_heads, kv_len, v_dim = k.shape[1], k.shape[2], v.shape[-1]
        else:  # 3-D inputs: (batch, seq, heads * dim) with the head counts as attributes
            heads = int(self._attr(node, "q_num_heads", 1))
            kv_heads = int(self._attr(node, "kv_num_heads", heads))
            batch, q_len = q.shape[0], q.shape[1]
            head_dim = q.shape[-1] // heads
            kv_len, v_dim = k.shape[1], v.shape[-1] // kv_heads
        mask = positions[3] if len(positions) > 3 else None
        op.kind = OpKind.ATTENTION
        op.attrs = {"batch": batch, "heads": heads, "kv_heads": kv_heads, "q_len": q_len,
                    "kv_len": kv_len, "head_dim": head_dim, "v_head_dim": v_dim,
                    "is_causal": bool(self._attr(node, "is_causal", 0)),
                    "mask": mask if mask and not mask.startswith("p:") else None}
        op.flops = 2.0 * batch * heads * q_len * kv_len * (head_dim + v_dim)
        op.shardable = attention_shardable(len(q.shape))


def load_onnx(path: str | os.PathLike, *, seq_len: int | None = None) -> ModelGraph:
    """The planner's ModelGraph of an ONNX file."""
    from .fx import infer_tokens

    graph = onnx_graph(path, seq_len=seq_len or DEFAULT_DIM)
    graph.tokens = infer_tokens(graph)
    seq = seq_len
    if seq is None:
        for op in graph.ops():
            if op.kind == OpKind.INPUT and op.outputs and op.outputs[0].dtype.startswith("int") \
                    and len(op.outputs[0].shape) >= 2:
                seq = op.outputs[0].shape[1]
                break
    graph.seq_len = seq or 1
    return group_layers(graph, name=graph.name, family="onnx", default_seq_len=graph.seq_len,
                        source=graph.source)


__all__ = ["onnx_graph", "load_onnx"]
