"""The runtime's recompute rule (:mod:`planner.recompute_rules`) as CP-SAT constraints on the
inner model's option counts.

Consumes the model, the block classes, the counts ``x[i,c]`` (blocks of class c on stage i)
and ``n[i,c,r]`` (of those, with option r), the stage boundaries; adds constraints so that the
counts are those of one setting the rule expresses. Per recompute value s, N[i,c,s] is the
sum of ``n[i,c,r]`` over the options r with that value.

* ``uniform``: one-hot w[s]; N[i,c,s] <= count_c w[s].
* ``first-n`` (Megatron): a bool ``sel`` (selective on every block) and an integer
  0 <= k <= the largest chunk (``--recompute-num-layers``; 0: no recomputation);
  not sel => N[i,c,full] = f[i,c](k), N[i,c,s] = 0 for s not in {none, full};
  sel => N[i,c,selective] = x[i,c], k = 0. f[i,c](k), the class-c blocks among the first k
  of rank i's chunks, is a table of k when the chunks are fixed (interleaved: computed from
  :func:`planner.recompute_rules.first_n`, the rule itself), min(k, x[i,0]) with one class,
  else |[b[i], min(b[i] + k, b[i+1])) n class c| (:func:`~planner.solve.stage_model.blocks_in`).
* ``per-block``: nothing.

Brute force (:mod:`planner.solve.bruteforce`) enumerates :func:`~planner.recompute_rules.allows`
settings directly; tests/test_solver_recompute_rule.py proves both find the same optimum.
"""
from __future__ import annotations

from typing import Sequence

from ortools.sat.python import cp_model

from planner.recompute_rules import chunk_runs, first_n, largest_chunk
from planner.solve.stage_model import blocks_in


def rule_of(problem) -> str:
    """The recompute rule of a StageProblem's runtime profile."""
    from planner.profiles import profile

    return profile(problem.ctx.options.profile).recompute_rule


def add_rule(M: cp_model.CpModel, rule: str, classes: Sequence, num_blocks: int, pp: int,
             ranks: Sequence[int] | None, x: dict, n: dict, b: Sequence | None) -> None:
    """Constrain ``n`` to ``rule``; ``ranks``: each block's rank where the configuration fixes
    it (StageProblem.block_ranks: interleaved chunks, an explicit pipeline layout), else None;
    ``b``: the stage boundaries (None: one class, ``x`` are the stage sizes)."""
    values = sorted({o.recompute.value for cls in classes for o in cls.options})
    if rule == "per-block" or len(values) <= 1:
        return

    def total(i: int, ci: int, value: str):
        return sum(n[i, ci, ri] for ri, o in enumerate(classes[ci].options)
                   if o.recompute.value == value and (i, ci, ri) in n)

    cells = [(i, ci) for i in range(pp) for ci in range(len(classes))]
    if rule == "uniform" or not {"none", "full"} <= set(values):
        w = {value: M.new_bool_var(f"rule[{value}]") for value in values}
        M.add_exactly_one(list(w.values()))
        for i, ci in cells:
            for value in values:
                M.add(total(i, ci, value) <= classes[ci].count * w[value])
        return
    if rule != "first-n":
        raise ValueError(f"unknown recompute rule {rule!r}")
    L = num_blocks
    runs = chunk_runs(list(ranks)) if ranks is not None else None
    top = largest_chunk(runs) if runs else L - pp + 1
    k = M.new_int_var(0, top, "recompute_num_layers")
    sel = M.new_bool_var("rule[selective]") if "selective" in values else None
    if sel is not None:
        M.add(k == 0).only_enforce_if(sel)
    for i, ci in cells:
        cls = classes[ci]
        f = M.new_int_var(0, cls.count, f"first_n[{i},{ci}]")
        if runs is not None:  # fixed chunks: the rule's own count for every k
            blocks = range(cls.first_block, cls.first_block + cls.count)
            table = []
            for kk in range(top + 1):
                settings = first_n(runs, kk)
                table.append(sum(1 for blk in blocks if settings[blk] == "full"
                                 and ranks[blk] == i))
            M.add_element(k, table, f)
        elif b is None:
            M.add_min_equality(f, [k, x[i, ci]])
        else:
            end = M.new_int_var(0, L, f"first_n_end[{i}]")
            M.add_min_equality(end, [b[i] + k, b[i + 1]])
            blocks_in(M, f, [b[i], end], 0, ci, cls, L)
        full = M.add(total(i, ci, "full") == f)
        others = [s for s in values if s not in ("none", "full")]
        if sel is None:
            for s in others:
                M.add(total(i, ci, s) == 0)
            continue
        full.only_enforce_if(sel.Not())
        for s in others:
            if s == "selective":
                M.add(total(i, ci, s) == x[i, ci]).only_enforce_if(sel)
            M.add(total(i, ci, s) == 0).only_enforce_if(sel.Not())
