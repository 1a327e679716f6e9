"""Pieces shared by the Hugging Face family importers (:mod:`models.hf_config`, :mod:`models.hf_moe`).

Consumes: validated :class:`models.fields.Fields` of one ``config.json``.
Produces: :class:`Parts` (what one family importer works out) and small helpers: the default
training sequence, per-layer sliding windows, the MoE MLP shape.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from planner.errors import ErrorKind, PlannerError, invalid
from planner.ir import Mlp

from .fields import Fields
from .params import BlockShape, EmbeddingShape, HeadShape

DEFAULT_SEQ_CAP = 4096  # default training sequence: min(max_position_embeddings, this)


@dataclass(frozen=True)
class Parts:
    """What one family importer works out; :func:`models.hf_config.import_hf_config` assembles it.

    ``metadata`` carries extra (key, value) strings onto the graph (e.g. DeepSeek's MTP depth).
    """

    embedding: EmbeddingShape
    blocks: list[tuple[str, BlockShape]]
    head: HeadShape
    max_seq_len: int | None
    default_seq_len: int
    positions: str  # learned | rope | relative | alibi
    metadata: tuple[tuple[str, str], ...] = ()


def default_seq(max_pos: int | None) -> int:
    return min(max_pos, DEFAULT_SEQ_CAP) if max_pos else DEFAULT_SEQ_CAP


def windows(fields: Fields, layers: int, sliding: int | None,
            default_rule: Callable[[int], bool]) -> list[int | None]:
    """Per-layer sliding window: ``layer_types`` if given, else ``default_rule(i)``."""
    types = fields.str_list("layer_types")
    if types is None:
        return [sliding if (sliding and default_rule(i)) else None for i in range(layers)]
    if len(types) != layers:
        raise invalid(f"{fields.where}: 'layer_types' lists {len(types)} layers but the model "
                      f"has {layers}")
    allowed = ("full_attention", "sliding_attention")
    for kind in types:
        if kind not in allowed:
            raise PlannerError(ErrorKind.UNSUPPORTED,
                               f"{fields.where}: layer type {kind[:40]!r} is not supported "
                               f"(supported: {', '.join(allowed)})")
    if "sliding_attention" in types and not sliding:
        raise invalid(f"{fields.where}: 'layer_types' has sliding layers but no sliding_window")
    return [sliding if kind == "sliding_attention" else None for kind in types]


def moe_mlp(f: Fields, expert_ffn: int, experts: int, top_k: int, shared: int,
            groups: tuple[int, int] = (1, 1)) -> Mlp:
    """A gated MoE MLP: ``experts`` routed experts of width ``expert_ffn``, ``top_k`` per token,
    always-active shared experts of total width ``shared``; ``groups`` (expert groups, groups
    per token) for group-limited routing (:func:`check_expert_groups`)."""
    if top_k > experts:
        raise invalid(f"{f.where}: num_experts_per_tok ({top_k}) exceeds the number of experts "
                      f"({experts})")
    check_expert_groups(f.where, experts, top_k, *groups, names=("n_group", "topk_group"))
    return Mlp(ffn_hidden=expert_ffn, gated=True, num_experts=experts, top_k=top_k,
               shared_ffn_hidden=shared, expert_groups=groups[0], groups_per_token=groups[1])


def check_expert_groups(where: str, experts: int, top_k: int, groups: int, per_token: int,
                        names: tuple[str, str]) -> None:
    """Group-limited routing's rules (HF DeepseekV3 ``MoEGate``: the experts view as
    ``n_group`` equal groups, ``topk_group`` of them kept per token, then the top-k experts of
    those): the groups divide the experts, a token keeps 1 .. all groups, and the kept groups
    hold at least ``top_k`` experts."""
    g, k = names
    if groups < 1 or experts % groups:
        raise invalid(f"{where}: {g} ({groups}) must divide the {experts} routed experts",
                      f"{g} splits the experts into equal groups (DeepSeek-V3: 8)")
    if not 1 <= per_token <= groups:
        raise invalid(f"{where}: {k} ({per_token}) must be between 1 and {g} ({groups})")
    if per_token * (experts // groups) < top_k:
        raise invalid(f"{where}: {k} ({per_token}) groups of {experts // groups} experts hold "
                      f"fewer than the {top_k} experts a token picks")
