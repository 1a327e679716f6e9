"""Which per-block recomputation settings a runtime can express: one rule per runtime profile,
written once here and used by the search (the CP-SAT model, :mod:`planner.solve.recompute_model`;
the brute-force oracle; the bounds), by ``check --runtime`` and by the exporters.

A runtime does not take one recomputation setting per block: it takes a few flags, and its own
code turns them into per-block settings. The rules (``RuntimeProfile.recompute_rule``):

* ``per-block``: any setting on any block (DeepSpeed: the model's code wraps each block it
  checkpoints, ``deepspeed.checkpointing.checkpoint``);
* ``uniform``: one setting for every block (torchtitan 0.3's ``activation_checkpoint:none |
  full | selective`` subcommand, one ``ActivationCheckpointing`` applied to every transformer
  block; FSDP1's ``activation_checkpointing``);
* ``first-n``: Megatron-LM's. ``--recompute-granularity selective`` recomputes the attention
  core of every layer; ``--recompute-granularity full --recompute-method block
  --recompute-num-layers N`` recomputes the first N blocks of every pipeline model chunk (every
  virtual stage when interleaved) and keeps the others (N >= the chunk's blocks: all of them,
  which ``--recompute-method uniform`` also gives); the two granularities never mix
  (``megatron/training/arguments.py``, ``TransformerBlock._checkpointed_forward``);
* ``every-nth`` (an export form, not searched): torchtitan <= 0.2.2's
  ``selective_ac_option = "N"``, every N-th block a process wraps, counted over its model parts
  (``_apply_ac_to_transformer_block``: ``_count % ac_freq == 0``).

Settings are strings (``planner.strategy.Recompute`` values), one per block in block order; a
model chunk is a run of consecutive blocks on one pipeline rank (``chunk_runs``).

Same cost: the cost model (planner.cost.terms; the solver's counts n[stage, class, option])
sees a stage's blocks by class and setting only, so :func:`equivalent` accepts any settings that
give every rank the counts of one of the rule's settings: its memory and step time are those.
"""
from __future__ import annotations

from collections import Counter
from typing import Iterable, Sequence

RULES = ("per-block", "uniform", "first-n")  # the rules a profile's search may have
Runs = Sequence[tuple[int, tuple[int, ...]]]  # (rank, blocks) of each model chunk, block order


def chunk_runs(block_stages: Sequence[int]) -> list[tuple[int, tuple[int, ...]]]:
    """The model chunks of a placement: runs of consecutive blocks on one rank, in block order
    (pp runs; pp x v round-robin runs when interleaved)."""
    out: list[tuple[int, list[int]]] = []
    for block, stage in enumerate(block_stages):
        if not out or out[-1][0] != stage:
            out.append((stage, []))
        out[-1][1].append(block)
    return [(rank, tuple(blocks)) for rank, blocks in out]


def first_n(runs: Runs, n: int) -> tuple[str, ...]:
    """Megatron's ``--recompute-method block --recompute-num-layers n``: the first n blocks of
    every chunk full, the others none (n = 0: none anywhere)."""
    out = ["none"] * sum(len(blocks) for _, blocks in runs)
    for _, blocks in runs:
        for block in blocks[:n]:
            out[block] = "full"
    return tuple(out)


def every_nth(runs: Runs, n: int) -> tuple[str, ...]:
    """torchtitan <= 0.2.2's ``selective_ac_option = "n"``: each rank counts the blocks it
    wraps, in order over its chunks, and checkpoints every n-th."""
    out = ["none"] * sum(len(blocks) for _, blocks in runs)
    position: Counter = Counter()
    for rank, blocks in runs:
        for block in blocks:
            position[rank] += 1
            if position[rank] % n == 0:
                out[block] = "full"
    return tuple(out)


def largest_chunk(runs: Runs) -> int:
    return max((len(blocks) for _, blocks in runs), default=0)


def settings_of(rule: str, runs: Runs, values: Iterable[str]) -> list[tuple[str, ...]] | None:
    """Every per-block setting ``rule`` expresses with the settings ``values`` (the options
    the search may take), in a fixed order; None when any mix is expressible (per-block)."""
    values = sorted(set(values))
    num_blocks = sum(len(blocks) for _, blocks in runs)
    if rule == "per-block":
        return None
    uniform = [(value,) * num_blocks for value in values]
    if rule == "uniform" or not {"none", "full"} <= set(values):
        return uniform
    if rule == "first-n":
        return uniform + [first_n(runs, n) for n in range(1, largest_chunk(runs))]
    if rule == "every-nth":
        return uniform + [every_nth(runs, n) for n in range(2, num_blocks + 1)]
    raise ValueError(f"unknown recompute rule {rule!r}")


def allows(rule: str, runs: Runs, settings: Sequence[str]) -> bool:
    """``settings`` are exactly what ``rule`` runs for one choice of its flags."""
    vectors = settings_of(rule, runs, set(settings) | {"none", "full"})
    return vectors is None or tuple(settings) in vectors


def _counts(runs: Runs, classes: Sequence[object], settings: Sequence[str]) -> Counter:
    return Counter((rank, classes[block], settings[block]) for rank, blocks in runs
                   for block in blocks)


def equivalent(rule: str, runs: Runs, classes: Sequence[object], settings: Sequence[str],
               values: Iterable[str] | None = None) -> tuple[str, ...] | None:
    """The first of ``rule``'s settings (over ``values``, default: those of ``settings`` and
    none / full) that gives every rank the number of blocks of each class and setting
    ``settings`` give it (so the cost model's memory and step time); None when none does.
    ``classes``: the layer class of each block."""
    settings = tuple(settings)
    pool = set(settings) | {"none", "full"} if values is None else set(values)
    vectors = settings_of(rule, runs, pool)
    if vectors is None:
        return settings
    want = _counts(runs, classes, settings)
    return next((v for v in vectors if _counts(runs, classes, v) == want), None)


def groups(rule: str, values: Iterable[str]) -> list[frozenset[str]]:
    """Sets of settings such that every setting the rule expresses uses one set only (the
    bounds take the best of them): one per value (uniform), selective apart from none / full
    (first-n), or all values (per-block)."""
    values = frozenset(values)
    if rule == "uniform" or (rule == "first-n" and not {"none", "full"} <= values):
        return [frozenset((v,)) for v in sorted(values)]
    if rule == "first-n":
        out = [frozenset(("none", "full"))]
        return out + [frozenset((v,)) for v in sorted(values - out[0])]
    return [values]


def placement_expressible(rule: str, model, placement) -> bool:
    """A :class:`~planner.strategy.LayerPlacement` of ``model`` costs what one of ``rule``'s
    settings costs (:func:`equivalent`)."""
    if rule == "per-block":
        return True
    from planner.ir import LayerKind

    blocks = [(s, o) for s, o, layer in zip(placement.stage, placement.options, model.layers)
              if layer.kind is LayerKind.BLOCK]
    classes = [ci for ci, cls in enumerate(model.layer_classes())
               if cls.layer.kind is LayerKind.BLOCK for _ in range(cls.count)]
    return equivalent(rule, chunk_runs([s for s, _ in blocks]), classes,
                      [o.recompute.value for _, o in blocks]) is not None
