"""Group an operator graph into the planner's layers (:class:`planner.ir.ModelGraph`).

Consumes: an :class:`~models.graph.ir.OpGraph` with module scopes on its ops.
Produces: a ModelGraph of ``embedding``, blocks, ``head``, with exact parameter counts (every
parameter tensor of the graph is owned by exactly one layer: the layer of the first op that
reads it; a later reader in another layer lists it as ``tied_params``) and the attention / MLP
shapes the cost model reads, recognised from the operators:

* **Blocks** are the children of module lists: the first numeric segment of a scope
  (``model.layers.7``, ``encoder.block.3``, ``layer1.0``) names a block. Ops outside any block
  before the first block form the embedding, after the last the head; ops between two blocks
  (T5's encoder final norm) belong to the block before them. Identical blocks get identical
  :class:`~planner.ir.Layer` signatures, so ``layer_classes()`` still forms classes with counts.
* **Attention**: each attention core (a fused SDPA / ONNX ``Attention`` op, or an eager
  ``MatMul → Softmax → MatMul`` chain) gives heads, head and value widths from its operands. The
  first linears upstream of q, k and v are the column-parallel projections (KV heads follow from
  their widths, fused QKV included); the first linear downstream is the row-parallel output
  projection. Linears feeding those projections through a norm are MLA down-projections
  (replicated, as in Megatron-LM). A core whose keys come from another layer is
  cross-attention. Causal: SDPA ``is_causal``, or a mask built by comparing two position ranges.
* **MLP**: the remaining linears: routers (their output reaches a top-k) and 1-wide gates are
  replicated; a linear whose input comes from another MLP linear is the row-parallel down
  projection, the others column-parallel up / gate projections (gated when there are twice as
  many). Grouped GEMMs are routed experts (experts = leading weight dim, ``top_k`` = routed rows
  / tokens).

Tensor-parallel placement (``tp_replicated_params``) follows Megatron-LM as in
:mod:`models.params`: norms, biases of row-parallel linears, routers, MLA down-projections,
position / token-type / relative-bias tables, convolutions and small head transforms are
replicated; column / row weights, column biases, the token table and the LM head are sharded.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from planner.errors import ErrorKind, PlannerError
from planner.ir import Attention, Conv, Layer, LayerKind, Mlp, ModelGraph

from .ir import Op, OpGraph, OpKind

TRANSPARENT = (OpKind.VIEW, OpKind.COPY, OpKind.ELEMENTWISE, OpKind.NORM, OpKind.SOFTMAX,
               OpKind.REDUCTION)
COMPARISONS = ("le", "lt", "ge", "gt", "LessOrEqual", "Less", "Greater", "GreaterOrEqual")


@dataclass
class Core:
    """One attention core, from a fused op or an eager matmul-softmax-matmul chain."""

    ops: tuple[str, ...]
    q: str | None  # producer of q (of k, v)
    k: str | None
    v: str | None
    out: str  # the op whose output is the attention result
    heads: int
    kv_heads: int
    head_dim: int
    v_head_dim: int
    causal: bool
    mask_roots: tuple[str, ...] = ()


@dataclass
class Unit:
    """The ops of one layer-to-be."""

    name: str
    kind: LayerKind
    ops: list[str] = field(default_factory=list)
    owned: list[str] = field(default_factory=list)  # parameters owned
    tied: list[str] = field(default_factory=list)  # parameters read but owned elsewhere


# Module-list names that hold the blocks of a stage inside a numbered stage (transformers'
# ResNet / ConvNeXt / Swin ``stages.2.layers.7``, diffusers' ``down_blocks.1.resnets.0``): the
# block is the inner list's child. (T5's ``block.3.layer.0`` is a sub-layer, not listed.)
NESTED_BLOCK_LISTS = frozenset({"layers", "blocks", "resnets", "attentions"})


def block_root(scope: str) -> str | None:
    """``model.layers.7.mlp.down_proj`` -> ``model.layers.7`` (first numeric segment; one level
    deeper through a nested block list: ``encoder.stages.2.layers.7.shortcut`` ->
    ``encoder.stages.2.layers.7``)."""
    if not scope:
        return None
    parts = scope.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            if i + 2 < len(parts) and parts[i + 1] in NESTED_BLOCK_LISTS and \
                    parts[i + 2].isdigit():
                return ".".join(parts[: i + 3])
            return ".".join(parts[: i + 1])
    return None


def _container(root: str) -> str:
    return root.rsplit(".", 1)[0]


class Grouper:
    def __init__(self, graph: OpGraph) -> None:
        self.g = graph
        self.order = graph.order()
        self.index = {name: i for i, name in enumerate(self.order)}
        self.unit_of: dict[str, str] = {}
        self.units: dict[str, Unit] = {}
        self._dep_input: dict[str, bool] = {}

    # -- dataflow helpers ----------------------------------------------------------------
    def op(self, name: str) -> Op:
        return self.g.op(name)

    def depends_on_input(self, name: str) -> bool:
        if not self._dep_input:
            for n in self.order:
                op = self.op(n)
                self._dep_input[n] = op.kind == OpKind.INPUT or any(
                    self._dep_input.get(p, False) for p in op.input_ops)
        return self._dep_input.get(name, False)

    def upstream(self, start: str | None, unit: str, stop: tuple[str, ...] = (OpKind.LINEAR,),
                 through: tuple[str, ...] = TRANSPARENT, limit: int = 400) -> list[str]:
        """First ops of a ``stop`` kind reached backwards from ``start`` (itself included),
        within ``unit``, through ops of the ``through`` kinds."""
        if start is None:
            return []
        return self._walk([start], lambda n: self.op(n).input_ops, unit, stop, through, limit)

    def downstream(self, start: str, unit: str, stop: tuple[str, ...],
                   through: tuple[str, ...] = TRANSPARENT, limit: int = 400) -> list[str]:
        """First ops of a ``stop`` kind reached forwards from ``start`` (itself excluded),
        within ``unit``, through ops of the ``through`` kinds."""
        return self._walk(list(self.g.successors(start)), self.g.successors, unit, stop,
                          through, limit)

    def _walk(self, stack: list[str], neighbours, unit: str, stop: tuple[str, ...],
              through: tuple[str, ...], limit: int) -> list[str]:
        """Depth-first from ``stack`` along ``neighbours`` inside ``unit``: the ops of a
        ``stop`` kind met first, in graph order (at most ``limit`` ops visited)."""
        found, seen = [], set()
        while stack and len(seen) < limit:
            n = stack.pop()
            if n in seen or self.unit_of.get(n) != unit:
                continue
            seen.add(n)
            op = self.op(n)
            if op.kind in stop:
                found.append(n)
                continue
            if op.kind in through:
                stack.extend(neighbours(n))
        return sorted(set(found), key=self.index.__getitem__)

    # -- units ---------------------------------------------------------------------------
    def split_units(self) -> list[Unit]:
        roots = [block_root(self.op(n).scope) for n in self.order]
        param_roots = {r for n, r in zip(self.order, roots) if r and self.op(n).params}
        # a lone numbered child after the last block list of two or more members (a
        # classifier's nn.Sequential index) belongs to the head, not to the blocks
        members = Counter(_container(r) for r in param_roots)
        listed = [i for i, r in enumerate(roots) if r in param_roots and members[_container(r)] > 1]
        if listed:
            trailing = {r for i, r in enumerate(roots) if i > listed[-1] and r in param_roots
                        and members[_container(r)] == 1}
            param_roots -= trailing
        if not param_roots:  # no module lists: every top-level child with parameters
            roots = [self.op(n).scope.split(".")[0] if self.op(n).scope else None
                     for n in self.order]
            param_roots = {r for n, r in zip(self.order, roots) if r and self.op(n).params}
        block_positions = [i for i, r in enumerate(roots) if r in param_roots]
        if not block_positions:
            raise PlannerError(ErrorKind.UNSUPPORTED,
                               f"{self.g.name}: no layers found: the graph's operators carry no "
                               f"module scopes with parameters")
        first, last = block_positions[0], block_positions[-1]
        units: list[Unit] = [Unit("embedding", LayerKind.EMBEDDING)]
        by_name: dict[str, Unit] = {"embedding": units[0]}
        current = None
        for i, n in enumerate(self.order):
            r = roots[i]
            if r in param_roots:
                if r not in by_name:
                    by_name[r] = Unit(r, LayerKind.BLOCK)
                    units.append(by_name[r])
                current = by_name[r]
                unit = current
            elif i < first:
                unit = units[0]
            elif i > last:
                if "head" not in by_name:
                    by_name["head"] = Unit("head", LayerKind.HEAD)
                unit = by_name["head"]
            else:
                unit = current  # between blocks: the block before
            unit.ops.append(n)
            self.unit_of[n] = unit.name
        units.append(by_name.get("head") or Unit("head", LayerKind.HEAD))
        by_name.setdefault("head", units[-1])
        self.units = by_name
        owner: dict[str, str] = {}
        for n in self.order:
            for p in self.op(n).params:
                u = self.unit_of[n]
                if p not in owner:
                    owner[p] = u
                    self.units[u].owned.append(p)
                elif owner[p] != u and p not in self.units[u].tied:
                    self.units[u].tied.append(p)
        self.owner = owner
        # parameters no op reads (dead weights) still count: give them to the embedding
        for p in self.g.params:
            if p not in owner:
                owner[p] = "embedding"
                units[0].owned.append(p)
        return units

    # -- attention -----------------------------------------------------------------------
    def cores(self, unit: Unit) -> list[Core]:
        cores: list[Core] = []
        used: set[str] = set()
        for n in unit.ops:
            op = self.op(n)
            if op.kind == OpKind.ATTENTION:
                a = op.attrs
                mask = a.get("mask")
                q, k, v = (op.input_ops + (None, None, None))[:3]
                cores.append(Core((n,), q, k, v, n, a["heads"], a["kv_heads"], a["head_dim"],
                                  a["v_head_dim"], bool(a.get("is_causal")),
                                  (mask,) if mask else ()))
            elif op.kind == OpKind.MATMUL and n not in used:
                core = self._eager_core(n, unit)
                if core is not None:
                    used.update(core.ops)
                    cores.append(core)
        for core in cores:
            if not core.causal and core.mask_roots:
                core.causal = self.mask_is_causal(core.mask_roots)
        return cores

    def _eager_core(self, first: str, unit: Unit) -> Core | None:
        """MatMul(q, kᵀ) → [scale, mask] → Softmax → [dropout] → MatMul(·, v)."""
        softmax = self.downstream(first, unit.name, (OpKind.SOFTMAX,),
                                  through=(OpKind.VIEW, OpKind.COPY, OpKind.ELEMENTWISE),
                                  limit=40)
        if not softmax:
            return None
        second = self.downstream(softmax[0], unit.name, (OpKind.MATMUL,),
                                 through=(OpKind.VIEW, OpKind.COPY, OpKind.ELEMENTWISE),
                                 limit=40)
        if not second:
            return None
        m1, m2 = self.op(first), self.op(second[0])
        if len(m1.inputs) < 2 or len(m2.inputs) < 2:
            return None
        q_t, k_t = m1.inputs[0], m1.inputs[1]
        scores = m1.outputs[0]
        if len(q_t.shape) < 3 or len(scores.shape) < 3:
            return None
        # the operand of the second matmul that is not the probabilities is v
        probs_side = {p for p in m2.input_ops if self._reaches(softmax[0], p)}
        v_index = 1 if m2.input_ops[0] in probs_side or m2.input_ops[0] == softmax[0] else 0
        v_t = m2.inputs[v_index]
        heads = q_t.shape[-3] if len(q_t.shape) >= 4 else 1
        kv_heads = k_t.shape[-3] if len(k_t.shape) >= 4 else heads
        head_dim = q_t.shape[-1]
        # mask operands: inputs of the ops between the two matmuls that are not on the path
        between = self._between(first, softmax[0], unit.name)
        path = set(between) | {first}
        masks = tuple(p for b in (*between, softmax[0]) for p in self.op(b).input_ops
                      if p not in path)
        return Core((first, *between, softmax[0], second[0]), m1.input_ops[0],
                    m1.input_ops[1], m2.input_ops[v_index], second[0], heads, kv_heads,
                    head_dim, v_t.shape[-1], False, masks)

    def _reaches(self, src: str, dst: str, depth: int = 12) -> bool:
        return src in self._back(dst, depth)

    def _back(self, dst: str, depth: int) -> set[str]:
        """Ops reachable backwards from ``dst`` in at most ``depth`` steps (breadth first)."""
        seen, frontier = {dst}, [dst]
        for _ in range(depth):
            frontier = [p for n in frontier for p in self.op(n).input_ops if p not in seen]
            seen.update(frontier)
        return seen

    def _forward(self, src: str, depth: int, unit: str) -> set[str]:
        seen, frontier = {src}, [src]
        for _ in range(depth):
            frontier = [s for n in frontier for s in self.g.successors(n)
                        if s not in seen and self.unit_of.get(s) == unit]
            seen.update(frontier)
        return seen

    def _between(self, first: str, last: str, unit: str) -> list[str]:
        """Ops on the paths from ``first`` to ``last`` (both excluded)."""
        between = (self._forward(first, 12, unit) & self._back(last, 12)) - {first, last}
        return sorted(between, key=self.index.__getitem__)

    def mask_is_causal(self, roots: tuple[str, ...]) -> bool:
        """A mask is causal when it compares two position tensors (``kv_idx <= q_idx``) that do
        not depend on the model's inputs, or comes from a ``Trilu``/``tril``/``triu``."""
        seen, stack = set(), list(roots)
        while stack and len(seen) < 2000:
            n = stack.pop()
            if n in seen or n not in self.g.g:
                continue
            seen.add(n)
            op = self.op(n)
            name = op.target.split(".")[1] if op.target.startswith("aten.") else op.target
            if name in ("tril", "triu", "Trilu"):
                return True
            if name in COMPARISONS and len(op.inputs) == 2 and all(t.shape for t in op.inputs) \
                    and not any(self.depends_on_input(p) for p in op.input_ops):
                return True
            stack.extend(op.input_ops)
        return False

    # -- blocks --------------------------------------------------------------------------
    def block_layer(self, unit: Unit) -> tuple[Layer, dict[str, str]]:
        roles: dict[str, str] = {}  # linear op -> column | row | replicated | expert
        linears = [n for n in unit.ops if self.op(n).kind == OpKind.LINEAR]
        attention = None
        cores = self.cores(unit)
        self_cores, cross_cores = [], []
        hidden_votes: Counter = Counter()
        for core in cores:
            q_lin = self.upstream(core.q, unit.name)
            k_lin = self.upstream(core.k, unit.name)
            v_lin = self.upstream(core.v, unit.name)
            out_lin = self.downstream(core.out, unit.name, (OpKind.LINEAR,),
                                      through=(OpKind.VIEW, OpKind.COPY))
            for n in q_lin + k_lin + v_lin:
                roles[n] = "column"
            for n in out_lin[:1]:
                roles[n] = "row"
            # MLA: a down-projection, then a latent norm, then the up-projection (not through
            # residual adds, which lead to the previous sub-layer's output projection)
            latent = (OpKind.VIEW, OpKind.COPY, OpKind.NORM)
            down_q = [u for n in q_lin for u in self.upstream_inputs(n, unit.name, latent)]
            down_kv = [u for n in k_lin for u in self.upstream_inputs(n, unit.name, latent)]
            for n in down_q + down_kv:
                roles[n] = "replicated"
            cross = any(self._from_other_unit(n, unit.name) for n in k_lin)
            (cross_cores if cross else self_cores).append(
                (core, q_lin, k_lin, v_lin, out_lin, down_q, down_kv))
            for n in out_lin[:1]:  # the output projection writes the residual width
                hidden_votes[self.op(n).attrs["n"]] += 1
        if self_cores or cross_cores:
            core, q_lin, k_lin, v_lin, out_lin, down_q, down_kv = (self_cores or cross_cores)[0]
            attention = self._attention(core, q_lin, k_lin, v_lin, down_q, down_kv,
                                        cross=bool(self_cores and cross_cores))
        mlp, mlp_roles = self._mlp(unit, [n for n in linears if n not in roles])
        roles.update(mlp_roles)
        if not hidden_votes:
            for n in linears:
                hidden_votes[self.op(n).attrs["k"]] += 1
        if not hidden_votes:  # convolutional blocks: their channel width
            for n in unit.ops:
                if self.op(n).kind == OpKind.CONV:
                    hidden_votes[self.op(n).attrs["out_channels"]] += 1
        hidden = hidden_votes.most_common(1)[0][0] if hidden_votes else self._norm_width(unit)
        count = self.count(unit, roles, conv_role="sharded")
        norms = self.block_norms(unit, hidden)
        layer = Layer(name=unit.name, kind=LayerKind.BLOCK, hidden=hidden, params=count[0],
                      active_params=count[3], tp_replicated_params=count[1],
                      expert_params=count[2], attention=attention, mlp=mlp, num_norms=norms,
                      seq_len=self.block_seq_len(linears, roles), convs=self.convs(unit))
        return layer, roles

    def convs(self, unit: Unit) -> tuple[Conv, ...]:
        """The unit's convolutions in execution order, per sample (planner.ir.Conv)."""
        out = []
        for n in unit.ops:
            op = self.op(n)
            if op.kind == OpKind.CONV and "in_pixels" in op.attrs:
                a = op.attrs
                out.append(Conv(a["in_channels"], a["out_channels"], a["kernel"],
                                a["in_pixels"], a["out_pixels"], a["groups"]))
        return tuple(out)

    def block_seq_len(self, linears: list[str], roles: dict[str, str]) -> int:
        """Tokens per sample of a block whose projections run on another sequence than the
        traced input's (a ViT's patches when the input is an image, a UNet's pixels); 0: the
        workload's sequence."""
        rows = [self.op(n).attrs["m"] for n in linears if roles.get(n) == "column"]
        if not rows or rows[0] == self.g.tokens:
            return 0
        return max(rows[0] // max(self.g.batch, 1), 1)

    def upstream_inputs(self, linear: str, unit: str,
                        through: tuple[str, ...] = TRANSPARENT) -> list[str]:
        """Linears upstream of ``linear``'s activation input."""
        op = self.op(linear)
        return [u for p in op.input_ops for u in self.upstream(p, unit, through=through)]

    def _from_other_unit(self, linear: str, unit: str) -> bool:
        for p in self.op(linear).input_ops:
            n = p
            for _ in range(8):
                if self.unit_of.get(n) != unit:
                    return self.op(n).kind not in (OpKind.CONSTANT,)
                op = self.op(n)
                if op.kind not in (OpKind.VIEW, OpKind.COPY) or not op.input_ops:
                    break
                n = op.input_ops[0]
        return False

    def _attention(self, core: Core, q_lin, k_lin, v_lin, down_q, down_kv,
                   cross: bool) -> Attention:
        heads, hd, vd = core.heads, core.head_dim, core.v_head_dim
        n_of = lambda ns: sum(self.op(n).attrs["n"] for n in ns)  # noqa: E731
        if down_kv:  # MLA: kv latent (kv_b input) + shared rope key
            kv_rank = self.op(k_lin[0]).attrs["k"]
            kv_a = n_of(sorted(set(down_kv)))
            q_rank = self.op(q_lin[0]).attrs["k"] if down_q else None
            return Attention(num_heads=heads, num_kv_heads=heads, head_dim=hd, v_head_dim=vd,
                             causal=core.causal, q_lora_rank=q_rank, kv_lora_rank=kv_rank,
                             rope_head_dim=kv_a - kv_rank, cross_attention=cross)
        kv = core.kv_heads
        if k_lin and set(k_lin) == set(q_lin) == set(v_lin):  # fused QKV
            kv = (n_of(k_lin) - heads * hd) // (hd + vd)
        elif k_lin and set(k_lin) == set(v_lin):  # fused KV
            kv = n_of(k_lin) // (hd + vd)
        elif k_lin:
            kv = n_of(k_lin) // hd
        return Attention(num_heads=heads, num_kv_heads=max(kv, 1), head_dim=hd, v_head_dim=vd,
                         causal=core.causal, cross_attention=cross)

    def _mlp(self, unit: Unit, linears: list[str]) -> tuple[Mlp | None, dict[str, str]]:
        roles: dict[str, str] = {}
        experts = [n for n in unit.ops if self.op(n).kind == OpKind.GROUPED_MM]
        dense = []
        for n in linears:
            op = self.op(n)
            if op.attrs["n"] == 1 or self.downstream(n, unit.name, (OpKind.TOPK,), limit=60):
                roles[n] = "replicated"  # router / shared-expert gate
            else:
                dense.append(n)
        downs = [n for n in dense if any(u in dense for u in self.upstream_inputs(n, unit.name))]
        ups = [n for n in dense if n not in downs]
        for n in ups:
            roles[n] = "column"
        for n in downs:
            roles[n] = "row"
        width = sum(self.op(n).attrs["k"] for n in downs)
        up_width = sum(self.op(n).attrs["n"] for n in ups)
        gated = bool(downs) and up_width == 2 * width
        if experts:
            first, second = self.op(experts[0]), self.op(experts[-1])
            routers = [n for n, r in roles.items() if r == "replicated" and self.op(n).attrs["n"] > 1]
            tokens = self.op(routers[0]).attrs["m"] if routers else self.g.tokens
            ffn = second.attrs["k"]
            top_k = max(first.attrs["m"] // max(tokens, 1), 1)
            mlp = Mlp(ffn_hidden=ffn, gated=first.attrs["n"] == 2 * ffn,
                      num_experts=first.attrs["groups"], top_k=top_k, shared_ffn_hidden=width)
            return mlp, roles
        if not downs:
            return None, roles
        return Mlp(ffn_hidden=width, gated=gated), roles

    def _norm_width(self, unit: Unit) -> int:
        for n in unit.ops:
            op = self.op(n)
            if op.kind == OpKind.NORM and op.outputs and op.outputs[0].shape:
                return op.outputs[0].shape[-1]
        return 0

    def block_norms(self, unit: Unit, hidden: int) -> int:
        """Norm modules of the block's width (not MLA latent or per-head q/k norms)."""
        modules = set()
        for n in unit.ops:
            op = self.op(n)
            if op.kind != OpKind.NORM:
                continue
            for p in op.params:
                shape = self.g.params[p].shape
                if shape == (hidden,) and p in unit.owned:
                    modules.add(op.scope or p.rsplit(".", 1)[0])
        return len(modules)

    # -- counting ------------------------------------------------------------------------
    def count(self, unit: Unit, roles: dict[str, str], lm_head: str | None = None,
              token_table: str | None = None,
              conv_role: str = "replicated") -> tuple[int, int, int, int]:
        """(params, tp_replicated, expert, active) of the parameters ``unit`` owns; a block's
        convolution weights are split over channel-parallel ranks (``conv_role``)."""
        role_of_param: dict[str, str] = {}
        experts = groups = 0
        # ops that compute with a parameter decide its role before ops that only view or
        # cast it (a transpose feeding a grouped GEMM, a cast feeding a router)
        computing = (OpKind.LINEAR, OpKind.GROUPED_MM, OpKind.EMBEDDING, OpKind.CONV)
        ordered = [n for n in unit.ops if self.op(n).kind in computing] + \
            [n for n in unit.ops if self.op(n).kind not in computing]
        for n in ordered:
            op = self.op(n)
            if not op.params:
                continue
            if op.kind == OpKind.LINEAR:
                role = roles.get(n, "replicated")
                if n == lm_head:
                    role = "column"
                weight, *biases = op.params
                role_of_param.setdefault(weight, "sharded" if role in ("column", "row")
                                         else "replicated")
                for b in biases:
                    role_of_param.setdefault(b, "sharded" if role == "column" else "replicated")
            elif op.kind == OpKind.GROUPED_MM:
                for p in op.params:
                    role_of_param.setdefault(p, "expert")
                groups = op.attrs.get("groups", 1)
            elif op.kind == OpKind.EMBEDDING:
                role_of_param.setdefault(op.params[0], "sharded" if op.params[0] == token_table
                                         else "replicated")
            elif op.kind == OpKind.CONV:
                for p in op.params:
                    role_of_param.setdefault(p, conv_role)
            else:
                for p in op.params:
                    role_of_param.setdefault(p, "replicated")
        total = replicated = expert = 0
        for p in unit.owned:
            numel = self.g.params[p].numel
            role = role_of_param.get(p, "replicated")
            total += numel
            if role == "replicated":
                replicated += numel
            elif role == "expert":
                expert += numel
                experts = groups
        active = total
        if expert:
            cores = [n for n in unit.ops if self.op(n).kind == OpKind.GROUPED_MM]
            first = self.op(cores[0])
            routers = [n for n, r in roles.items() if r == "replicated"
                       and self.op(n).attrs["n"] == first.attrs["groups"]]
            tokens = self.op(routers[0]).attrs["m"] if routers else self.g.tokens
            top_k = max(first.attrs["m"] // max(tokens, 1), 1)
            active = total - expert + (expert * top_k) // max(experts, 1)
        return total, replicated, expert, active

    # -- embedding and head --------------------------------------------------------------
    def embedding_layer(self, unit: Unit, hidden: int) -> tuple[Layer, str | None, int]:
        tables = [n for n in unit.ops if self.op(n).kind == OpKind.EMBEDDING]
        token = None
        for n in tables:  # the token table: indexed by a model input
            op = self.op(n)
            if any(self.depends_on_input(p) for p in op.input_ops) and (
                    token is None or self.op(token).attrs["rows"] < op.attrs["rows"]):
                token = n
        table = self.op(token).params[0] if token else None
        vocab = self.op(token).attrs["rows"] if token else 0
        width = self.op(token).attrs["width"] if token else hidden
        total, replicated, _, _ = self.count(unit, {}, token_table=table)
        norms = sum(1 for s in {self.op(n).scope for n in unit.ops
                                if self.op(n).kind == OpKind.NORM and self.op(n).params})
        layer = Layer(name="embedding", kind=LayerKind.EMBEDDING, hidden=width or hidden,
                      params=total, active_params=total, tp_replicated_params=replicated,
                      vocab=vocab, num_norms=norms, convs=self.convs(unit))
        return layer, table, vocab

    def head_layer(self, unit: Unit, hidden: int, vocab: int) -> Layer:
        lm_head = None
        for n in unit.ops:
            op = self.op(n)
            if op.kind == OpKind.LINEAR and vocab and op.attrs["n"] == vocab:
                lm_head = n
        total, replicated, _, _ = self.count(unit, {}, lm_head=lm_head)
        tied = sum(self.g.params[p].numel for p in unit.tied
                   if lm_head and p in self.op(lm_head).params)
        norms = len({self.op(n).scope for n in unit.ops
                     if self.op(n).kind == OpKind.NORM and self.op(n).params})
        return Layer(name="head", kind=LayerKind.HEAD, hidden=hidden, params=total,
                     active_params=total, tied_params=tied, tp_replicated_params=replicated,
                     vocab=vocab if lm_head else 0, num_norms=norms)


def group_layers(graph: OpGraph, *, name: str | None = None, family: str = "graph",
                 default_seq_len: int | None = None, max_seq_len: int | None = None,
                 source: str = "", metadata: tuple[tuple[str, str], ...] = ()) -> ModelGraph:
    """The ModelGraph of ``graph`` (see the module docstring for the rules)."""
    grouper = Grouper(graph)
    units = grouper.split_units()
    blocks = [u for u in units if u.kind is LayerKind.BLOCK]
    block_layers = [grouper.block_layer(u)[0] for u in blocks]
    hidden = Counter(layer.hidden for layer in block_layers).most_common(1)[0][0] \
        if block_layers else 0
    embedding, _, vocab = grouper.embedding_layer(units[0], hidden)
    head = grouper.head_layer(units[-1], hidden, vocab)
    layers = (embedding, *_share(block_layers), head)
    positions = "learned" if _has_position_table(grouper, units[0], vocab) else "graph"
    seq = default_seq_len or graph.seq_len
    meta = (("positions", positions), ("importer", graph.metadata.get("importer", "graph")),
            ("graph_ops", str(len(graph.order()))),
            ("graph_gemm_flops_per_token", f"{graph.flops_per_token():.6g}"), *metadata)
    return ModelGraph(name=name or graph.name, family=family, layers=layers,
                      hidden=embedding.hidden or hidden, vocab=vocab, default_seq_len=seq,
                      max_seq_len=max_seq_len, tied_embeddings=head.tied_params > 0,
                      source=source or graph.source, metadata=meta)


def _share(layers: list[Layer]) -> list[Layer]:
    """Identical blocks share one Layer object per signature (as models.params does)."""
    from dataclasses import replace

    cache: dict[tuple, Layer] = {}
    out = []
    for layer in layers:
        base = cache.setdefault(layer.signature, layer)
        out.append(base if base.name == layer.name else replace(base, name=layer.name))
    return out


def _has_position_table(grouper: Grouper, unit: Unit, vocab: int) -> bool:
    for n in unit.ops:
        op = grouper.op(n)
        if op.kind == OpKind.EMBEDDING and op.attrs["rows"] != vocab and \
                not any(grouper.depends_on_input(p) for p in op.input_ops):
            return True
    return False


__all__ = ["group_layers", "block_root", "Grouper"]
