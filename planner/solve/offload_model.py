"""Megatron-Core's activation-offload rule (:mod:`planner.offload_rules`) as CP-SAT constraints
on the inner model's option counts, as :mod:`planner.solve.recompute_model` does for the
recompute rule.

Consumes the block classes, each class's signature (the rule's unit: blocks of one signature
cost the same), the pipeline depth and the counts ``n[i,c,r]`` (blocks of class c on stage i
with option r). With no option that offloads activations it adds nothing. Otherwise, with
A[c] the sum of ``n[0,c,r]`` over the options r that offload (pp = 1: stage 0 is the model):

* pp where the rule refuses offload (:func:`~planner.offload_rules.pipeline_allows`): every
  offloading option's count is 0 (:func:`~planner.offload_rules.searchable` already drops them);
* an integer 0 <= N <= L - 1 (``--cpu-offloading-num-layers``; N < the layer count), a bool
  ``off`` = N >= 1 (some block offloads);
* per signature s: sum of A[c] over the classes c of signature s = the blocks of signature s
  among the first N (:func:`~planner.offload_rules.first_n_counts`, a table of N): the
  offloaded blocks are a prefix per block class in the first-N sense, a monotone chain over
  the classes' counts;
* off => every option whose recompute setting is not
  :data:`~planner.offload_rules.RECOMPUTE_ALLOWED` has count 0, on every stage (recomputation
  of any kind anywhere refuses the offload).

Brute force (:mod:`planner.solve.bruteforce`) enumerates
:func:`~planner.offload_rules.allows`; tests/test_solver_offload_rule.py proves both find the
same optimum.
"""
from __future__ import annotations

from typing import Sequence

from ortools.sat.python import cp_model

from planner.offload_rules import RECOMPUTE_ALLOWED, first_n_counts, pipeline_allows


def add_offload_rule(M: cp_model.CpModel, classes: Sequence, signatures: Sequence,
                     num_blocks: int, pp: int, n: dict) -> None:
    """Constrain ``n`` (keys (stage, class, option)) to the activation offload Megatron-Core
    runs; ``signatures[c]``: class c's layer signature."""
    offloading = [(i, ci, ri) for (i, ci, ri) in n if classes[ci].options[ri].act_offload]
    if not offloading:
        return
    if not pipeline_allows(pp):
        for key in offloading:
            M.add(n[key] == 0)
        return
    L = num_blocks
    N = M.new_int_var(0, L - 1, "cpu_offloading_num_layers")
    off = M.new_bool_var("act_offload[any]")
    M.add(N >= off)
    M.add(N <= (L - 1) * off)
    block_sigs = [signatures[ci] for ci, cls in enumerate(classes) for _ in range(cls.count)]
    # first_n_counts(block_sigs, m) for every m in one pass (not one Counter per m and signature)
    prefix = [first_n_counts(block_sigs, 0)]
    for sig in block_sigs[:L - 1]:
        prefix.append(prefix[-1] + first_n_counts([sig], 1))
    for k, sig in enumerate(dict.fromkeys(signatures)):
        table = [counts[sig] for counts in prefix]
        first = M.new_int_var(0, max(table), f"first_n_offloaded[{k}]")
        M.add_element(N, table, first)
        M.add(sum(n[key] for key in offloading if signatures[key[1]] == sig) == first)
    for (i, ci, ri), count in n.items():
        if classes[ci].options[ri].recompute.value != RECOMPUTE_ALLOWED:
            M.add(count <= classes[ci].count * (1 - off))
