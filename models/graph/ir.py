"""The operator graph IR: what the torch.export and ONNX importers produce.

An :class:`OpGraph` is a networkx DiGraph whose nodes are operators (:class:`Op`, node attribute
``op``) and whose edges are tensors (:class:`TensorMeta`, edge attribute ``tensor``: the
producer's output flowing into the consumer). Parameters are not nodes: an op lists the
parameter tensors it reads (``Op.params``, names into :attr:`OpGraph.params`), so a tied weight
is one :class:`Param` read by two ops.

Every op carries its FLOPs (``2·M·N·K`` per GEMM, Narayanan et al. 2021 §5.1; attention cores
``2·B·H·Sq·Sk·(d_qk + d_v)`` for QKᵀ and PV, no masked-block skipping; convolutions as im2col
GEMMs; one FLOP per output element for arithmetic element-wise ops), the bytes it reads and
writes (0 for pure view ops), and, per input and per parameter, the dimensions that may be
sharded without changing what the op computes (:data:`SHARD_ROLES`). ``tokens`` is the number
of tokens (or samples, for image models) of the example input the graph was traced with, so
``flops / tokens`` is FLOPs per token.

Consumes: nothing (plain data). Produced by: :mod:`models.graph.fx`, :mod:`models.graph.onnx`.
Read by: :mod:`models.graph.group` (layers for the planner's :class:`planner.ir.ModelGraph`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterator

import networkx as nx


class OpKind:
    """Canonical operator kinds, shared by both importers."""

    LINEAR = "linear"  # activation x parameter GEMM (nn.Linear, Conv1D, ONNX MatMul/Gemm + weight)
    MATMUL = "matmul"  # activation x activation (batched) GEMM (eager attention scores, ...)
    GROUPED_MM = "grouped_mm"  # MoE experts: rows routed to per-expert weight slices
    ATTENTION = "attention"  # fused attention core (SDPA / ONNX Attention)
    CONV = "conv"
    EMBEDDING = "embedding"  # table lookup (aten.embedding, ONNX Gather on a parameter)
    NORM = "norm"  # layer / RMS / group / batch norm (fused op or a Norm module's ops)
    SOFTMAX = "softmax"
    TOPK = "topk"  # routers: topk / sort
    ELEMENTWISE = "elementwise"
    REDUCTION = "reduction"
    VIEW = "view"  # no data movement: view, reshape, transpose, slice, expand, split, ...
    COPY = "copy"  # data movement without arithmetic: cat, contiguous, gather, index, ...
    INPUT = "input"  # a graph input (token ids, pixels, masks)
    CONSTANT = "constant"  # factory ops and constants (arange, full, ONNX Constant)
    OTHER = "other"


GEMM_KINDS = (OpKind.LINEAR, OpKind.MATMUL, OpKind.GROUPED_MM, OpKind.ATTENTION, OpKind.CONV)

# What a shardable dimension means to the op that reads it (Megatron-LM / GSPMD terms).
SHARD_ROLES = (
    "batch",  # data parallel: split samples / tokens, no communication in the forward pass
    "column",  # output features of a weight (column-parallel linear): outputs stay split
    "row",  # input features (row-parallel linear): partial sums, all-reduce after
    "heads",  # attention heads (head-parallel attention)
    "vocab",  # rows of an embedding / LM-head table (vocab-parallel)
    "experts",  # expert index of a grouped weight (expert parallel)
    "channels",  # output channels of a convolution
)

DTYPE_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4,
               "int16": 2, "int8": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1,
               "float8_e5m2": 1, "complex64": 8}


@dataclass(frozen=True)
class TensorMeta:
    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES.get(self.dtype, 4)


def conv_attrs(x: TensorMeta | None, weight: tuple[int, ...], out: TensorMeta,
               transposed: bool = False) -> dict:
    """The attributes of a convolution op from its input, weight and output shapes (N, C, ...
    layouts): FLOPs as ``2 x kernel x C_in/groups x C_out x output pixels`` per sample, and the
    per-sample shape the cost model's implicit GEMM reads (``planner.ir.Conv``). A transposed
    convolution runs as the data gradient of a convolution: M = its input pixels."""
    kernel = math.prod(weight[2:])
    batch = out.shape[0] if len(out.shape) > 2 else 1
    out_ch = out.shape[1] if len(out.shape) > 1 else weight[0]
    out_px = math.prod(out.shape[2:])
    in_ch = x.shape[1] if x is not None and len(x.shape) > 1 else weight[1]
    in_px = math.prod(x.shape[2:]) if x is not None and len(x.shape) > 2 else out_px
    per_group_in = weight[0] if transposed else weight[1]
    groups = max(in_ch // max(per_group_in, 1), 1)
    rows = in_px if transposed else out_px
    flops = 2.0 * batch * kernel * in_ch * out_ch * rows / groups
    return {"out_channels": out_ch, "kernel_elems": math.prod(weight[1:]), "in_channels": in_ch,
            "kernel": kernel, "in_pixels": in_px, "out_pixels": rows, "groups": groups,
            "flops": flops}


@dataclass(frozen=True)
class Param:
    """A parameter tensor; ``aliases`` are other names of the same storage (tied weights)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    aliases: tuple[str, ...] = ()

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass
class Op:
    """One operator. ``attrs`` holds the GEMM sizes (m, n, k, groups) and attention shape
    (batch, heads, kv_heads, q_len, kv_len, head_dim, v_head_dim, causal) where they apply.
    ``shardable`` maps an input position ("in0", "in1", ...) or a parameter name to a tuple of
    ``(dim, role)`` pairs."""

    name: str
    kind: str
    target: str  # aten op name or ONNX op_type
    scope: str = ""  # module path, e.g. "model.layers.3.self_attn.q_proj"
    scope_types: tuple[str, ...] = ()  # class names along the module stack, outermost first
    inputs: tuple[TensorMeta, ...] = ()
    input_ops: tuple[str, ...] = ()  # the producer of each input, aligned with ``inputs``
    outputs: tuple[TensorMeta, ...] = ()
    params: tuple[str, ...] = ()  # parameters read (weight first, then bias)
    flops: float = 0.0
    bytes_read: float = 0.0
    bytes_written: float = 0.0
    attrs: dict = field(default_factory=dict)
    shardable: dict = field(default_factory=dict)


class OpGraph:
    """Operators in execution order with tensor edges; parameters in :attr:`params`."""

    def __init__(self, name: str, *, source: str = "", tokens: int = 1,
                 batch: int = 1, seq_len: int = 1, metadata: dict | None = None) -> None:
        self.g = nx.DiGraph(name=name)
        self.name = name
        self.source = source
        self.tokens = tokens
        self.batch = batch
        self.seq_len = seq_len
        self.params: dict[str, Param] = {}
        self.metadata: dict = dict(metadata or {})
        self._order: list[str] = []

    # -- building ------------------------------------------------------------------------
    def add_param(self, param: Param) -> None:
        self.params[param.name] = param

    def add_op(self, op: Op, inputs: list[tuple[str, TensorMeta]] = ()) -> None:
        """Add ``op`` after every op added before it; ``inputs`` are (producer, tensor)."""
        if op.name in self.g:
            raise ValueError(f"duplicate op name {op.name!r}")
        self.g.add_node(op.name, op=op)
        self._order.append(op.name)
        for producer, tensor in inputs:
            if producer in self.g and producer != op.name:
                self.g.add_edge(producer, op.name, tensor=tensor)

    # -- reading -------------------------------------------------------------------------
    def ops(self) -> Iterator[Op]:
        """Operators in execution (topological) order."""
        return (self.g.nodes[name]["op"] for name in self._order)

    def op(self, name: str) -> Op:
        return self.g.nodes[name]["op"]

    def order(self) -> list[str]:
        return list(self._order)

    def predecessors(self, name: str) -> list[str]:
        return list(self.g.predecessors(name))

    def successors(self, name: str) -> list[str]:
        return list(self.g.successors(name))

    @property
    def num_params(self) -> int:
        return sum(p.numel for p in self.params.values())

    def flops(self, kinds: tuple[str, ...] | None = GEMM_KINDS) -> float:
        """Forward FLOPs of the traced example; ``kinds=None`` counts every op."""
        return sum(op.flops for op in self.ops() if kinds is None or op.kind in kinds)

    def flops_per_token(self, kinds: tuple[str, ...] | None = GEMM_KINDS) -> float:
        return self.flops(kinds) / self.tokens

    def summary(self) -> dict:
        kinds: dict[str, int] = {}
        for op in self.ops():
            kinds[op.kind] = kinds.get(op.kind, 0) + 1
        return {"name": self.name, "ops": len(self._order), "params": self.num_params,
                "param_tensors": len(self.params), "tokens": self.tokens,
                "gemm_flops": self.flops(), "ops_by_kind": dict(sorted(kinds.items()))}


# -- per-op helpers shared by the importers ---------------------------------------------------

def gemm_flops(m: int, n: int, k: int, count: int = 1) -> float:
    return 2.0 * m * n * k * count


def linear_shardable(weight: str, weight_out_dim: int, in_rank: int) -> dict:
    """Input rows are data-parallel and its last dim is row-parallel; the weight splits along
    its output features (column) or input features (row)."""
    return {"in0": tuple((d, "batch") for d in range(in_rank - 1)) + ((in_rank - 1, "row"),),
            weight: ((weight_out_dim, "column"), (1 - weight_out_dim, "row"))}


def attention_shardable(rank: int = 4) -> dict:
    dims = ((0, "batch"), (1, "heads")) if rank == 4 else ((0, "batch"),)
    return {"in0": dims, "in1": dims, "in2": dims}


def elementwise_shardable(inputs: tuple[TensorMeta, ...]) -> dict:
    """Element-wise and row-wise ops (norms, softmax over the last dim): every leading dim of
    every input is data-parallel (token) shardable."""
    return {f"in{i}": tuple((d, "batch") for d in range(len(t.shape) - 1))
            for i, t in enumerate(inputs)}


@dataclass(frozen=True)
class OpNames:
    """An importer's operator names (aten overloads, ONNX op types) of the kinds
    :func:`classify_simple` tells apart by name alone."""

    norm: frozenset[str]
    view: frozenset[str]
    copy: frozenset[str]
    constant: frozenset[str]
    softmax: frozenset[str]
    topk: frozenset[str]
    reduction: frozenset[str]
    no_flops: frozenset[str] = frozenset()  # element-wise ops that compute nothing (compares)


def classify_simple(op: Op, name: str, names: OpNames, out: TensorMeta | None) -> None:
    """Kind, FLOPs and shardable dimensions of an op that is not a GEMM, attention core,
    convolution or embedding, from its operator ``name`` (both importers call it): norms (by
    name, or any op but a view or copy inside a module whose type says norm), views, copies,
    constants, softmax (5 FLOPs per element: max, subtract, exp, sum, divide), top-k,
    reductions (one FLOP per input element), and element-wise for the rest (one FLOP per output
    element, none for ``names.no_flops``)."""
    in_norm = bool(op.scope_types) and "norm" in op.scope_types[-1].lower()
    elements = float(out.numel) if out is not None else 0.0
    if name in names.norm or (in_norm and name not in names.view and name not in names.copy):
        op.kind, op.flops = OpKind.NORM, elements
        op.shardable = elementwise_shardable(op.inputs)
    elif name in names.view:
        op.kind = OpKind.VIEW
    elif name in names.copy:
        op.kind = OpKind.COPY
    elif name in names.constant:
        op.kind = OpKind.CONSTANT
    elif name in names.softmax:
        op.kind, op.flops = OpKind.SOFTMAX, 5.0 * elements
        op.shardable = elementwise_shardable(op.inputs)
    elif name in names.topk:
        op.kind = OpKind.TOPK
    elif name in names.reduction:
        op.kind, op.flops = OpKind.REDUCTION, float(sum(t.numel for t in op.inputs))
    else:
        op.kind = OpKind.ELEMENTWISE
        op.flops = 0.0 if name in names.no_flops else elements
        op.shardable = elementwise_shardable(op.inputs)
