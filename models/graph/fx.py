"""Lower a ``torch.export`` ExportedProgram to an :class:`~models.graph.ir.OpGraph`.

Consumes: an ``ExportedProgram`` (ATen IR, as ``torch.export.export`` returns it or as
``torch.export.load`` reads a ``.pt2`` file), traced on any device (the meta device included:
only shapes and dtypes are read, never values).
Produces: an OpGraph with one op per ATen call, tensor edges, module scopes from
``nn_module_stack``, and the parameters of the graph signature (tied parameters, two names of
one tensor, become one :class:`Param` with aliases; buffers are not parameters).

Needs torch (the ``graph`` extra); imported lazily by :mod:`models.graph`.
"""
from __future__ import annotations

import operator
import re
from typing import Any

from .ir import (GEMM_KINDS, Op, OpGraph, OpKind, OpNames, Param, TensorMeta,
                 attention_shardable, classify_simple, conv_attrs, gemm_flops,
                 linear_shardable)

# ATen op names (overload packet names) by kind.
VIEW_OPS = frozenset({
    "view", "_unsafe_view", "reshape", "transpose", "t", "permute", "expand", "expand_as",
    "unsqueeze", "squeeze", "slice", "select", "alias", "split", "split_with_sizes", "chunk",
    "unbind", "detach", "narrow", "unflatten", "flatten", "movedim", "view_as", "as_strided",
    "lift_fresh_copy", "getitem", "_assert_tensor_metadata", "_assert_scalar", "sym_size",
    "dropout", "feature_dropout", "native_dropout", "numpy_T", "_reshape_alias", "unfold",
})
COPY_OPS = frozenset({
    "cat", "concat", "stack", "contiguous", "clone", "copy", "copy_", "index", "index_select",
    "gather", "to", "_to_copy", "type_as", "repeat", "repeat_interleave", "pad",
    "constant_pad_nd", "index_put", "index_put_", "scatter", "scatter_", "roll", "flip",
    "new_empty", "empty_like", "masked_scatter", "_to_dim_order_copy", "tril", "triu",
})
CONSTANT_OPS = frozenset({
    "arange", "full", "full_like", "zeros", "zeros_like", "ones", "ones_like", "empty",
    "new_ones", "new_zeros", "new_full", "scalar_tensor", "tensor", "linspace", "eye", "rand",
    "randn", "empty_strided",
})
REDUCTION_OPS = frozenset({"sum", "mean", "amax", "amin", "max", "min", "prod", "var", "std",
                           "argmax", "argmin", "cumsum", "histc", "logsumexp", "norm", "any",
                           "all"})
SOFTMAX_OPS = frozenset({"softmax", "_softmax", "log_softmax", "_log_softmax",
                         "_safe_softmax"})
TOPK_OPS = frozenset({"topk", "sort", "argsort"})
NORM_OPS = frozenset({"layer_norm", "native_layer_norm", "rms_norm", "_fused_rms_norm",
                      "group_norm", "native_group_norm", "batch_norm", "native_batch_norm",
                      "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
                      "instance_norm"})
FX_NAMES = OpNames(norm=NORM_OPS, view=VIEW_OPS, copy=COPY_OPS, constant=CONSTANT_OPS,
                   softmax=SOFTMAX_OPS, topk=TOPK_OPS, reduction=REDUCTION_OPS)
ATTENTION_OPS = frozenset({"scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
                           "_scaled_dot_product_efficient_attention",
                           "_scaled_dot_product_flash_attention_for_cpu",
                           "_scaled_dot_product_cudnn_attention"})
CONV_OPS = frozenset({"convolution", "_convolution", "conv1d", "conv2d", "conv3d",
                      "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"})
# Ops through which a weight keeps being "the parameter" (casts, transposes, views).
PARAM_TRANSPARENT = frozenset({"t", "transpose", "permute", "view", "reshape", "_unsafe_view",
                               "to", "_to_copy", "expand", "contiguous", "clone", "alias",
                               "unsqueeze", "squeeze", "detach", "_assert_tensor_metadata"})


def _opname(target: Any) -> str:
    if target is operator.getitem:
        return "getitem"
    name = getattr(target, "_opname", None) or getattr(target, "__name__", None) or str(target)
    return name


def _meta(value: Any) -> TensorMeta | None:
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is None or dtype is None:
        return None
    try:
        dims = tuple(int(d) for d in shape)
    except (TypeError, ValueError):  # unbacked symbolic sizes
        return None
    return TensorMeta(dims, str(dtype).replace("torch.", ""))


def _metas(value: Any) -> tuple[TensorMeta, ...]:
    if isinstance(value, (tuple, list)):
        return tuple(m for m in (_meta(v) for v in value) if m is not None)
    m = _meta(value)
    return (m,) if m is not None else ()


_GETATTR = re.compile(r"getattr\(([^,]+), '([^']+)'\)")


def normalize_scope(path: str) -> str:
    """Module paths as ``named_modules`` spells them (strict-mode stacks write
    ``L['self'].model.layers.0`` or ``getattr(L['self'].layers, '0')``)."""
    for _ in range(8):
        new = _GETATTR.sub(r"\1.\2", path)
        if new == path:
            break
        path = new
    path = path.replace("L['self'].", "").replace("L['self']", "")
    path = re.sub(r"\[(\d+)\]", r".\1", path)
    return path.strip(".")


def _scope(node: Any) -> tuple[str, tuple[str, ...]]:
    stack = node.meta.get("nn_module_stack") or {}
    entries = list(stack.values())
    if not entries:
        return "", ()
    path = normalize_scope(str(entries[-1][0]))
    types = tuple(str(getattr(e[1], "__name__", e[1])).rsplit(".", 1)[-1] for e in entries)
    return path, types


class _Lowering:
    def __init__(self, ep: Any, name: str, source: str) -> None:
        self.ep = ep
        self.graph = OpGraph(name, source=source)
        sig = ep.graph_signature
        self.param_of: dict[str, str] = {}  # placeholder name -> canonical parameter name
        by_tensor: dict[tuple, str] = {}
        state = ep.state_dict
        aliases: dict[str, list[str]] = {}
        for placeholder, fqn in sig.inputs_to_parameters.items():
            tensor = state.get(fqn)
            key = _storage_key(tensor) if tensor is not None else ("name", fqn)
            canonical = by_tensor.setdefault(key, fqn)
            self.param_of[placeholder] = canonical
            if canonical == fqn:
                shape = tuple(int(d) for d in tensor.shape) if tensor is not None else ()
                dtype = str(tensor.dtype).replace("torch.", "") if tensor is not None else "float32"
                self.graph.add_param(Param(fqn, shape, dtype))
                aliases[fqn] = []
            else:
                aliases[canonical].append(fqn)
        for canonical, names in aliases.items():
            if names:
                p = self.graph.params[canonical]
                self.graph.params[canonical] = Param(p.name, p.shape, p.dtype, tuple(names))
        self.user_inputs = set(sig.user_inputs)
        self.buffer_of = dict(getattr(sig, "inputs_to_buffers", {}) or {})
        self.nodes: dict[str, Any] = {}

    # -- parameter tracing ---------------------------------------------------------------
    def param(self, arg: Any) -> str | None:
        """The parameter ``arg`` is (possibly through casts, transposes and views)."""
        for _ in range(16):
            if not hasattr(arg, "op"):
                return None
            if arg.op == "placeholder":
                return self.param_of.get(arg.name)
            if arg.op != "call_function" or _opname(arg.target) not in PARAM_TRANSPARENT:
                return None
            arg = arg.args[0] if arg.args else None
        return None

    # -- lowering ------------------------------------------------------------------------
    def run(self) -> OpGraph:
        for node in self.ep.graph.nodes:
            if node.op == "placeholder":
                if node.name in self.param_of:
                    continue
                kind = OpKind.INPUT if node.name in self.user_inputs else OpKind.CONSTANT
                out = _metas(node.meta.get("val"))
                buffer = self.buffer_of.get(node.name)  # a buffer's module path (no scope:
                # buffers are read from where they are used)
                self.graph.add_op(Op(node.name, kind, "placeholder", outputs=out,
                                     bytes_written=sum(t.nbytes for t in out),
                                     attrs={"buffer": buffer} if buffer else {}))
            elif node.op == "get_attr":
                self.graph.add_op(Op(node.name, OpKind.CONSTANT, "get_attr"))
            elif node.op == "call_function":
                self.lower(node)
        return self.graph

    def _tensor_args(self, node: Any) -> list[Any]:
        flat: list[Any] = []

        def visit(a: Any) -> None:
            if isinstance(a, (list, tuple)):
                for x in a:
                    visit(x)
            elif isinstance(a, dict):
                for x in a.values():
                    visit(x)
            elif hasattr(a, "op") and hasattr(a, "meta"):
                flat.append(a)

        visit(node.args)
        visit(node.kwargs)
        return flat

    def lower(self, node: Any) -> None:
        name = _opname(node.target)
        scope, types = _scope(node)
        outputs = _metas(node.meta.get("val"))
        args = self._tensor_args(node)
        params: list[str] = []
        edges: list[tuple[str, TensorMeta]] = []
        inputs: list[TensorMeta] = []
        for a in args:
            p = self.param(a)
            if p is not None:
                if p not in params:
                    params.append(p)
                continue
            produced = _metas(a.meta.get("val"))
            if name == "getitem" and len(produced) > 1 and isinstance(node.args[1], int):
                index = node.args[1]
                tensor = produced[index] if index < len(produced) else None
            else:
                tensor = produced[0] if produced else None
            if tensor is None:
                continue
            inputs.append(tensor)
            edges.append((a.name, tensor))
        op = Op(node.name, OpKind.OTHER, str(node.target), scope=scope, scope_types=types,
                inputs=tuple(inputs), input_ops=tuple(e[0] for e in edges), outputs=outputs,
                params=tuple(params))
        self.classify(op, name, node)
        if op.kind not in (OpKind.VIEW,):
            op.bytes_read = sum(t.nbytes for t in op.inputs) + sum(
                self.graph.params[p].numel * _param_bytes(self.graph.params[p]) for p in op.params)
            op.bytes_written = sum(t.nbytes for t in op.outputs)
        self.graph.add_op(op, edges)

    def classify(self, op: Op, name: str, node: Any) -> None:
        out = op.outputs[0] if op.outputs else None
        if name in ("linear", "addmm", "mm", "matmul", "bmm") and out is not None:
            self._gemm(op, name, node, out)
        elif name == "_grouped_mm" and out is not None and op.inputs:
            x = op.inputs[0]
            weight = op.params[0] if op.params else None
            groups = self.graph.params[weight].shape[0] if weight else 1
            n, k = out.shape[-1], x.shape[-1]
            m = out.numel // n
            op.kind = OpKind.GROUPED_MM
            op.attrs = {"m": m, "n": n, "k": k, "groups": groups}
            op.flops = gemm_flops(m, n, k)
            if weight:
                op.shardable = {"in0": ((0, "batch"),), weight: ((0, "experts"),)}
        elif name in ATTENTION_OPS and len(op.inputs) >= 3:
            self._attention(op, node)
        elif name in CONV_OPS and out is not None and op.params:
            w = self.graph.params[op.params[0]]
            op.kind = OpKind.CONV
            op.attrs = conv_attrs(op.inputs[0] if op.inputs else None, w.shape, out,
                                  "transpose" in name)
            op.flops = op.attrs.pop("flops")
            op.shardable = {"in0": ((0, "batch"),), op.params[0]: ((0, "channels"),)}
        elif name == "embedding" and op.params:
            op.kind = OpKind.EMBEDDING
            table = self.graph.params[op.params[0]]
            op.attrs = {"rows": table.shape[0], "width": table.shape[-1]}
            op.shardable = {op.params[0]: ((0, "vocab"), (1, "column")),
                            "in0": tuple((d, "batch") for d in range(len(op.inputs[0].shape)))
                            if op.inputs else ()}
        else:
            classify_simple(op, name, FX_NAMES, out)

    def _gemm(self, op: Op, name: str, node: Any, out: TensorMeta) -> None:
        if name == "addmm":  # addmm(bias, x, w)
            x_arg, w_arg = node.args[1], node.args[2]
        else:
            x_arg, w_arg = node.args[0], node.args[1]
        n = out.shape[-1] if out.shape else 1
        x_meta = _meta(x_arg.meta.get("val")) if hasattr(x_arg, "meta") else None
        w_param = self.param(w_arg)
        if w_param is None and name in ("mm", "matmul") and self.param(x_arg) is not None:
            w_param, x_meta = self.param(x_arg), _meta(w_arg.meta.get("val"))
        if x_meta is None or not x_meta.shape:
            op.kind = OpKind.OTHER
            return
        k = x_meta.shape[-1]
        m = out.numel // max(n, 1)
        if w_param is not None and name in ("linear", "addmm", "mm", "matmul"):
            op.kind = OpKind.LINEAR
            # ``params`` lists the weight first: reorder so that it does
            others = [p for p in op.params if p != w_param]
            op.params = (w_param, *others)
            op.attrs = {"m": m, "n": n, "k": k, "bias": bool(others)}
            w = self.graph.params[w_param]
            out_dim = 0 if (len(w.shape) == 2 and w.shape[0] == n and name == "linear") else (
                0 if len(w.shape) == 2 and w.shape[0] == n and w.shape[1] == k else 1)
            op.shardable = linear_shardable(w_param, out_dim, len(x_meta.shape))
        else:
            op.kind = OpKind.MATMUL
            op.attrs = {"m": m, "n": n, "k": k}
            op.shardable = {"in0": tuple((d, "batch") for d in range(len(x_meta.shape) - 2))}
        op.flops = gemm_flops(m, n, k)

    def _attention(self, op: Op, node: Any) -> None:
        q, k, v = op.inputs[:3]
        op.kind = OpKind.ATTENTION
        if len(q.shape) < 3:
            op.kind = OpKind.OTHER
            return
        batch = 1
        for d in q.shape[:-3]:
            batch *= d
        heads, q_len, head_dim = q.shape[-3], q.shape[-2], q.shape[-1]
        kv_len, v_dim = k.shape[-2], v.shape[-1]
        causal = bool(node.kwargs.get("is_causal", node.args[5] if len(node.args) > 5 else False))
        mask = node.kwargs.get("attn_mask", node.args[3] if len(node.args) > 3 else None)
        op.attrs = {"batch": batch, "heads": heads, "kv_heads": k.shape[-3], "q_len": q_len,
                    "kv_len": kv_len, "head_dim": head_dim, "v_head_dim": v_dim,
                    "is_causal": causal,
                    "mask": getattr(mask, "name", None) if hasattr(mask, "op") else None}
        op.flops = 2.0 * batch * heads * q_len * kv_len * (head_dim + v_dim)
        op.shardable = attention_shardable(len(q.shape))


def _storage_key(tensor: Any) -> tuple:
    """Tied parameters share storage (a loaded .pt2 gives two tensor objects over one storage;
    meta tensors have no storage address, so there the object itself identifies it)."""
    if getattr(tensor, "is_meta", False):
        return ("object", id(tensor))
    try:
        ptr = tensor.untyped_storage().data_ptr()
    except (RuntimeError, AttributeError):
        return ("object", id(tensor))
    if ptr == 0:
        return ("object", id(tensor))
    return ("storage", ptr, tensor.storage_offset(), tuple(tensor.shape))


def _param_bytes(p: Param) -> int:
    from .ir import DTYPE_BYTES

    return DTYPE_BYTES.get(p.dtype, 4)


def lower_exported_program(ep: Any, *, name: str = "model", source: str = "",
                           tokens: int | None = None) -> OpGraph:
    """The OpGraph of ``ep``; ``tokens`` (default: the token ids' numel, else the first input's
    batch size) makes ``flops_per_token`` meaningful."""
    graph = _Lowering(ep, name, source).run()
    graph.tokens = tokens if tokens is not None else infer_tokens(graph)
    return graph


def infer_tokens(graph: OpGraph) -> int:
    inputs = [op for op in graph.ops() if op.kind == OpKind.INPUT and op.outputs]
    for op in inputs:
        t = op.outputs[0]
        if t.dtype.startswith("int") and t.shape:
            return max(t.numel, 1)
    for op in inputs:
        if op.outputs[0].shape:
            return max(op.outputs[0].shape[0], 1)
    return 1


__all__ = ["lower_exported_program", "normalize_scope", "infer_tokens", "GEMM_KINDS"]
