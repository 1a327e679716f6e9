"""Trace one copy of each distinct block, then replicate it to the model's full depth.

A 70B-class model is 80 identical decoder layers; ``torch.export`` of all of them takes tens of
seconds and the trace of one says everything the planner reads. :func:`reduce_blocks` finds, in
every outermost ``nn.ModuleList`` of same-class children (``model.layers``, T5's
``encoder.block``), the *kinds* of its children: two children are one kind when their module
trees match (submodule names and classes, each submodule's scalar attributes but its layer
index, parameter and buffer names, shapes and dtypes) and so do the model config's per-layer
lists (``layer_types``: sliding / full attention) at their indices. Dense-first MoE layers,
sliding / global patterns and T5's block 0 (the one with the relative-position table) are
separate kinds that way. The list is replaced by the first child of each kind, the model is
traced, the list restored, and :func:`replicate` rebuilds the full operator graph: block ``i``
is a copy of its kind's traced block, with its scopes, parameter names and sharding keys
renamed to index ``i``; its hidden-state input is the previous block's output (the traced
chain tells which tensor that is), other reads of earlier blocks go to the copy at their
representative's own index, and the ops after the list read the last block's output.

Produces exactly the operator graph a full trace gives up to op names (the test
``tests/test_graph_replicate.py`` compares the two layer by layer on small configs); when the
traced graph does not have the shape this relies on (a block's ops not contiguous, ops between
two blocks of one list, no single hidden-state chain), :func:`replicate` returns ``None`` and
the caller traces the whole model.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .ir import Op, OpGraph, Param

_INDEX_ATTRS = frozenset({"layer_idx", "layer_id", "layer_index", "layer_number", "block_idx",
                          "training"})
_SCALARS = (int, float, str, bool, type(None))


@dataclass
class BlockList:
    """One module list: its path, its length, each index's kind and each kind's first index."""

    path: str
    kinds: list[int]
    reps: list[int]
    original: Any = field(default=None, repr=False)  # the full nn.ModuleList (restored)

    @property
    def length(self) -> int:
        return len(self.kinds)


def _scalar(value: Any) -> Any:
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, (tuple, list)) and all(isinstance(v, _SCALARS) for v in value):
        return tuple(value)
    return None


def _signature(module: Any, per_layer: tuple) -> tuple:
    mods = tuple((name, type(m).__name__,
                  tuple(sorted((k, _scalar(v)) for k, v in vars(m).items()
                               if not k.startswith("_") and k not in _INDEX_ATTRS
                               and _scalar(v) is not None)))
                 for name, m in module.named_modules())
    params = tuple((n, tuple(p.shape), str(p.dtype)) for n, p in module.named_parameters())
    buffers = tuple((n, tuple(b.shape), str(b.dtype)) for n, b in module.named_buffers())
    return mods, params, buffers, per_layer


def _per_layer_lists(config: Any, n: int) -> list[tuple]:
    """Config attributes that list one value per layer (``layer_types``, ``no_rope_layers``;
    a key naming layers, so that a list of token ids of the same length is not one)."""
    lists = []
    for key, value in sorted(vars(config).items()) if config is not None else ():
        if "layer" in key and isinstance(value, (list, tuple)) and len(value) == n and n > 1 \
                and all(isinstance(v, _SCALARS) for v in value):
            lists.append((key, tuple(value)))
    return lists


def reduce_blocks(model: Any) -> list[BlockList]:
    """Replace each reducible module list of ``model`` by one child per kind (in place);
    :func:`restore` puts the full lists back. Returns the lists reduced."""
    import torch.nn as nn

    config = getattr(model, "config", None)
    found: list[tuple[str, Any, Any]] = []
    skip: list[str] = []
    for name, mod in model.named_modules():
        if any(name == s or name.startswith(s + ".") for s in skip):
            continue
        if isinstance(mod, nn.ModuleList) and len(mod) >= 2:
            skip.append(name)
            if len({type(c) for c in mod}) == 1:
                parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
                found.append((name, mod, parent))
    lists: list[BlockList] = []
    for name, mod, parent in found:
        n = len(mod)
        per_layer = _per_layer_lists(getattr(parent, "config", config), n)
        sigs: dict[tuple, int] = {}
        kinds = []
        for i, child in enumerate(mod):
            sig = _signature(child, tuple((k, v[i]) for k, v in per_layer))
            kinds.append(sigs.setdefault(sig, len(sigs)))
        reps = [kinds.index(k) for k in range(len(sigs))]
        if len(reps) == n:
            continue
        lists.append(BlockList(name, kinds, reps, mod))
        parent.register_module(name.rsplit(".", 1)[-1], nn.ModuleList([mod[i] for i in reps]))
    return lists


def restore(model: Any, lists: list[BlockList]) -> None:
    for bl in lists:
        parent = model.get_submodule(bl.path.rsplit(".", 1)[0]) if "." in bl.path else model
        parent.register_module(bl.path.rsplit(".", 1)[-1], bl.original)


def _block_of(name: str, lists: list[BlockList]) -> tuple[int, int] | None:
    """(list index, reduced block index) of a scope or parameter name inside a reduced list."""
    for li, bl in enumerate(lists):
        prefix = bl.path + "."
        if name.startswith(prefix):
            head = name[len(prefix):].split(".", 1)[0]
            if head.isdigit() and int(head) < len(bl.reps):
                return li, int(head)
    return None


def _rename(name: str, bl: BlockList, j: int, i: int) -> str:
    prefix = f"{bl.path}.{j}"
    if name == prefix or name.startswith(prefix + "."):
        return f"{bl.path}.{i}" + name[len(prefix):]
    return name


def replicate(graph: OpGraph, lists: list[BlockList]) -> OpGraph | None:
    """The full-depth operator graph of a trace made after :func:`reduce_blocks`, or ``None``
    when the trace does not have the block structure replication relies on."""
    order = graph.order()
    member: dict[str, tuple[int, int]] = {}
    for name in order:
        where = _block_of(graph.op(name).scope, lists)
        if where is not None:
            member[name] = where
    # Each list's reduced blocks: contiguous runs, in order, nothing between them.
    runs: dict[int, list[list[str]]] = {li: [[] for _ in bl.reps] for li, bl in enumerate(lists)}
    entered = {li: 0 for li in runs}
    cur: tuple[int, int] | None = None
    for name in order:
        where = member.get(name)
        if where != cur:
            if cur is not None and (where is None or where[0] != cur[0]) \
                    and cur[1] != len(lists[cur[0]].reps) - 1:
                return None  # an op between two blocks of one list
            if where is not None:
                if where[1] != entered[where[0]]:
                    return None  # a block's ops are not one run, or out of order
                entered[where[0]] += 1
            cur = where
        if where is not None:
            runs[where[0]][where[1]].append(name)
    if any(not run for li in runs for run in runs[li]):
        return None
    # The hidden-state chain: what each block's first outside read is, and each kind's output.
    hidden_in: dict[tuple[int, int], str] = {}
    hidden_out: dict[tuple[int, int], str] = {}
    for li, blocks in runs.items():
        for j, run in enumerate(blocks):
            inside = set(run)
            for name in run:
                outside = {p for p in graph.op(name).input_ops if p not in inside}
                if outside:
                    if len(outside) != 1:
                        return None
                    hidden_in[li, j] = outside.pop()
                    break
            else:
                return None
            if j > 0:
                if member.get(hidden_in[li, j]) != (li, j - 1):
                    return None
                hidden_out[li, j - 1] = hidden_in[li, j]
        last_run = set(blocks[-1])
        readers = {p for name in order if (member.get(name) or (None,))[0] != li
                   for p in graph.op(name).input_ops if p in last_run}
        if len(readers) != 1:
            return None
        hidden_out[li, len(blocks) - 1] = readers.pop()

    # Buffers of a block (DeepSeek's router bias) are placeholders at the top of the graph.
    prelude: dict[str, tuple[int, int]] = {}
    for name in order:
        buffer = graph.op(name).attrs.get("buffer")
        where = _block_of(buffer, lists) if isinstance(buffer, str) else None
        if where is not None and graph.op(name).target == "placeholder":
            prelude[name] = where
    out = OpGraph(graph.name, source=graph.source, tokens=graph.tokens, batch=graph.batch,
                  seq_len=graph.seq_len, metadata=dict(graph.metadata))

    def copy_name(name: str, li: int, i: int) -> str:
        j = (member.get(name) or prelude[name])[1]
        bl = lists[li]
        if name in prelude:  # the name torch.export gives the buffer at index i
            old = f"b_{bl.path}_{j}_".replace(".", "_")
            if name.startswith(old):
                return f"b_{bl.path}_{i}_".replace(".", "_") + name[len(old):]
        return name if bl.reps[j] == i else f"{name}@{bl.path}.{i}"

    def after_list(p: str) -> str:
        """A read of a block's op from after its list: the last copy of that kind."""
        li, k = member[p]
        bl = lists[li]
        if p == hidden_out[li, k] and k == len(bl.reps) - 1:
            return copy_name(hidden_out[li, bl.kinds[-1]], li, bl.length - 1)
        i = max(x for x, kind in enumerate(bl.kinds) if kind == k)
        return copy_name(p, li, i)

    def outside(p: str) -> str:
        return after_list(p) if p in member else p

    def emit(op: Op, name: str, ref, rename=lambda s: s) -> None:
        inputs = tuple(ref(p) for p in op.input_ops)
        attrs = {k: ref(v) if isinstance(v, str) and v in graph.g else v
                 for k, v in op.attrs.items() if k != "buffer"}
        if "buffer" in op.attrs:
            attrs["buffer"] = rename(op.attrs["buffer"])
        new = Op(name, op.kind, op.target, scope=rename(op.scope), scope_types=op.scope_types,
                 inputs=op.inputs, input_ops=inputs, outputs=op.outputs,
                 params=tuple(rename(p) for p in op.params), flops=op.flops,
                 bytes_read=op.bytes_read, bytes_written=op.bytes_written, attrs=attrs,
                 shardable={rename(k): v for k, v in op.shardable.items()})
        out.add_op(new, list(zip(inputs, new.inputs)))

    def block_ref(li: int, i: int, kind: int):
        bl = lists[li]
        inside = set(runs[li][kind])

        def ref(p: str) -> str:
            if p in inside or prelude.get(p) == (li, kind):
                return copy_name(p, li, i)
            if p == hidden_in[li, kind] and i > 0:
                return copy_name(hidden_out[li, bl.kinds[i - 1]], li, i - 1)
            if p in member and member[p][0] == li:
                return copy_name(p, li, bl.reps[member[p][1]])
            return outside(p)
        return ref

    _replicate_params(graph, out, lists)
    done: set[tuple[str, int]] = set()
    for name in order:
        op = graph.op(name)
        where = member.get(name) or prelude.get(name)
        if where is None:
            emit(op, name, outside)
            continue
        part = "prelude" if name in prelude else "block"
        li = where[0]
        if (part, li) in done:
            continue
        done.add((part, li))
        bl = lists[li]
        for i, kind in enumerate(bl.kinds):
            ref = block_ref(li, i, kind)

            def rename(s: str, bl=bl, kind=kind, i=i) -> str:
                return _rename(s, bl, kind, i)

            srcs = [n for n in order if prelude.get(n) == (li, kind)] if part == "prelude" \
                else runs[li][kind]
            for src in srcs:
                emit(graph.op(src), copy_name(src, li, i), ref, rename)
    out.metadata["replicated_blocks"] = {bl.path: {"length": bl.length, "traced": len(bl.reps)}
                                         for bl in lists}
    return out


def _replicate_params(graph: OpGraph, out: OpGraph, lists: list[BlockList]) -> None:
    emitted: set[int] = set()
    by_block: dict[tuple[int, int], list[Param]] = {}
    for p in graph.params.values():
        where = _block_of(p.name, lists)
        if where is not None:
            by_block.setdefault(where, []).append(p)
    for p in graph.params.values():
        where = _block_of(p.name, lists)
        if where is None:
            out.add_param(p)
            continue
        li = where[0]
        if li in emitted:
            continue
        emitted.add(li)
        bl = lists[li]
        for i, kind in enumerate(bl.kinds):
            for q in by_block.get((li, kind), ()):
                out.add_param(Param(_rename(q.name, bl, kind, i), q.shape, q.dtype,
                                    tuple(_rename(a, bl, kind, i) for a in q.aliases)))
