"""Per-layer decisions: the :class:`LayerOption` a layer runs with and the :class:`LayerPlacement`
(pipeline stage and option of every layer) a plan holds.

A layer option is a layout (how the layer's tensors are split over its stage's devices) and a
recomputation policy. Today the only layout is :attr:`Layout.MESH`, the plan's global mesh
(``tp x cp x dp``, ``ep`` in MoE layers, from :class:`~planner.mesh.Mesh`); per-layer tensor /
data sharding and expert layouts become new :class:`Layout` members. Everything that iterates
over decisions (the CP-SAT model, the brute-force oracle, the bounds, the plan file) iterates over
:func:`block_options`, never over :class:`Recompute` directly; the cost of an option is written
once, in :func:`planner.cost.terms.layer_terms`.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from enum import Enum
from typing import Iterable

from planner.ir import LayerKind, ModelGraph


class Recompute(str, Enum):
    NONE = "none"
    SELECTIVE = "selective"  # recompute the attention core only (Korthikanti et al. 2022 §5)
    FULL = "full"  # store the block input only, recompute the whole block in backward
    # Per-op selective checkpointing (torchtitan ``selective_ac_option = "op"``): keep the
    # outputs of every other matmul and of the attention kernel, recompute everything else
    # (torchtitan ``_save_list`` / ``_apply_op_sac``; planner/cost/compute.py, memory.py).
    OP = "op"


class Layout(str, Enum):
    """How a layer factors its stage's ``tp x dp`` ranks into tensor x data parallelism
    (Galvatron-style per-layer hybrid parallelism, Miao et al. VLDB 2023). The mesh's CP degree,
    its rank order and the pipeline stage are unchanged; a layer whose tensor degree is ``t'``
    runs column/row-parallel linears, head-parallel attention and a vocab-parallel table over
    ``t'`` consecutive ranks and is data-parallel over the other ``tp * dp / t'``."""

    MESH = "mesh"  # the plan's global mesh layout (planner.mesh.Mesh)
    TP_HALF = "tp/2"  # half the mesh's tensor degree, twice its data degree
    TP_DOUBLE = "tp*2"  # twice the tensor degree (two mesh TP groups), half the data degree
    REPLICATED = "tp=1"  # no tensor parallelism: every rank of the stage data-parallel
    # The widest tensor group inside one NVLink domain: tp x k ranks, k the largest divisor of
    # dp with tp x k <= the GPUs of a node (a vocab-parallel LM head over the whole node while
    # the blocks run data-parallel).
    NODE = "tp=node"

    def tensor_degree(self, tp: int, dp: int, node: int = 0) -> int | None:
        """This layout's tensor degree under a mesh ``tp x dp`` on nodes of ``node`` GPUs (0:
        unknown, no NODE layout); None where it does not exist (or would repeat another
        layout's degree)."""
        if self is Layout.MESH:
            return tp
        if self is Layout.TP_HALF:
            return tp // 2 if tp % 2 == 0 and tp > 2 else None
        if self is Layout.TP_DOUBLE:
            return 2 * tp if dp % 2 == 0 else None
        if self is Layout.NODE:
            k = max((k for k in range(1, dp + 1) if dp % k == 0 and tp * k <= node), default=1)
            return tp * k if k > 2 else None  # k = 1, 2: the mesh's or tp*2's degree
        return 1 if tp > 1 else None


@dataclass(frozen=True)
class LayerOption:
    """How one layer runs: its layout, its recomputation, whether its optimizer states and
    fp32 master weights live in host memory (ZeRO-Offload, planner/cost/offload.py) and whether
    its saved activations do (``act_offload``: copied out during the forward, back in before its
    backward; planner/cost/offload.py ``activation_exposed_s``)."""

    recompute: Recompute = Recompute.NONE
    layout: Layout = Layout.MESH
    offload: bool = False
    act_offload: bool = False

    @property
    def name(self) -> str:
        """Short stable name (CP-SAT variable names, messages): 'full', 'tp=1/full',
        'full+offload', 'none+act-offload'."""
        name = self.recompute.value if self.layout is Layout.MESH else \
            f"{self.layout.value}/{self.recompute.value}"
        name = name + "+offload" if self.offload else name
        return name + "+act-offload" if self.act_offload else name

    @property
    def memory_rank(self) -> int:
        """Order used to lay out a stage's blocks (most recomputation first; costs are equal
        in any order, this keeps placements readable and deterministic)."""
        return {Recompute.FULL: 3, Recompute.OP: 2, Recompute.SELECTIVE: 1,
                Recompute.NONE: 0}[self.recompute]


NO_OPTION = LayerOption()  # embedding and head: mesh layout, never recomputed
RECOMPUTE_POLICIES = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)
# the recomputation under which a block's saved activations may go to host memory
# (LayerOption.act_offload): a fully recomputed block keeps only its input
ACT_OFFLOAD_RECOMPUTE = (Recompute.NONE, Recompute.SELECTIVE)
LAYOUTS = (Layout.MESH,)
PER_LAYER_LAYOUTS = tuple(Layout)  # the solver picks a layout per block class


def block_options(recompute: Iterable[Recompute] = RECOMPUTE_POLICIES,
                  layouts: Iterable[Layout] = LAYOUTS,
                  offload: Iterable[bool] = (False,),
                  act_offload: Iterable[bool] = (False,)) -> tuple[LayerOption, ...]:
    """The per-block choices the solver, the oracle and the bounds enumerate (activation-
    offload-, offload-, then layout-major: the options without offload first). Activation
    offload goes with recomputation none or selective: a fully recomputed block keeps only its
    input, and Megatron-Core offloads module inputs it would otherwise keep."""
    return _block_options(tuple(recompute), tuple(layouts), tuple(offload), tuple(act_offload))


@lru_cache(maxsize=1024)
def _block_options(recompute: tuple[Recompute, ...], layouts: tuple[Layout, ...],
                   offload: tuple[bool, ...], act_offload: tuple[bool, ...]
                   ) -> tuple[LayerOption, ...]:
    """(once per combination: the search asks for every configuration's options)"""
    return tuple(LayerOption(r, lay, off, act) for act in act_offload for off in offload
                 for lay in layouts for r in recompute
                 if not act or r in ACT_OFFLOAD_RECOMPUTE)


BLOCK_OPTIONS = block_options()


def layouts_for(config) -> tuple[Layout, ...]:
    """The layouts a block may take under ``config`` (a ParallelConfig; None: every layout).
    The mesh layout is always valid; a layout that needs some degree or divisibility of the
    mesh (a tensor-parallel degree inside the stage group, an expert layout) says so here."""
    return LAYOUTS


def per_layer_layouts(config, node: int = 0) -> tuple[Layout, ...]:
    """The layouts a block may take with per-layer layouts on (``--pin layouts=per-layer``):
    those whose tensor degree exists under ``config``'s tp x dp on nodes of ``node`` GPUs
    (config None: every layout; node 0: as if the stage were one node, the cost terms then
    drop a NODE layout the real node size does not give). Whether a given layer can take one
    (heads, FFN width, vocabulary, MoE) is planner.cost.terms.option_valid."""
    if config is None:
        return PER_LAYER_LAYOUTS
    node = node or config.tp * config.dp
    return tuple(lay for lay in PER_LAYER_LAYOUTS
                 if lay.tensor_degree(config.tp, config.dp, node) is not None)


def edge_options(block_opts: Iterable[LayerOption]) -> tuple[LayerOption, ...]:
    """The options of the embedding and the head: every layout (and offload choice) the
    blocks may take, never recomputed (NO_OPTION first)."""
    block_opts = tuple(block_opts)
    layouts = dict.fromkeys([Layout.MESH] + [o.layout for o in block_opts])
    offload = dict.fromkeys([False] + [o.offload for o in block_opts])
    return tuple(LayerOption(Recompute.NONE, lay, off) for off in offload for lay in layouts)


def block_options_for(config, recompute: Iterable[Recompute] = RECOMPUTE_POLICIES
                      ) -> tuple[LayerOption, ...]:
    """The option enumeration: every block option the solver, the oracle and the bounds
    consider under ``config``. The one place that decides which options exist."""
    return block_options(recompute, layouts_for(config))


@dataclass(frozen=True)
class LayerPlacement:
    """Per-layer decisions: ``stage[i]`` and ``options[i]`` of layer ``i`` of the model."""

    stage: tuple[int, ...]
    options: tuple[LayerOption, ...]

    @property
    def recompute(self) -> tuple[Recompute, ...]:
        """The recomputation policy of every layer (a view of ``options``)."""
        return tuple(o.recompute for o in self.options)

    def layers_of_stage(self, stage: int) -> list[int]:
        return [i for i, s in enumerate(self.stage) if s == stage]

    @staticmethod
    def of(stage: Iterable[int], recompute: Iterable[Recompute | str]) -> "LayerPlacement":
        """Placement with the mesh layout for every layer and the given recomputation."""
        return LayerPlacement(tuple(stage), tuple(LayerOption(Recompute(r)) for r in recompute))


def interleaved_chunk(block: int, num_blocks: int, chunks: int) -> int:
    """The model chunk (0 .. chunks - 1) holding ``block`` when the blocks form ``chunks``
    chunks: equal when ``chunks`` divides the blocks; otherwise the first ``blocks mod
    chunks`` chunks hold one block more (an uneven split, as Megatron's
    ``--pipeline-model-parallel-layout`` and torchtitan's per-stage layer counts run it:
    DeepSeek-V3's 61 layers in 16 chunks)."""
    base, extra = divmod(num_blocks, chunks)
    big = extra * (base + 1)  # blocks in the first ``extra`` chunks of base + 1
    return block // (base + 1) if block < big else extra + (block - big) // max(base, 1)


def interleaved_rank(block: int, num_blocks: int, pp: int, virtual_stages: int,
                     placement: str = "loop") -> int:
    """Pipeline rank holding ``block`` when the blocks form pp x v model chunks
    (:func:`interleaved_chunk`): chunk k runs on rank k mod pp (``placement`` "loop":
    Megatron-LM virtual pipeline stages, PyTorch's looped schedules) or, with 2 chunks per
    rank, on rank k then 2 pp - 1 - k ("v": the V schedules ZB-V and DualPipeV, torchtitan's
    ``style="v"`` stage-to-rank map)."""
    from planner.cost.pipeline import chunk_rank

    return chunk_rank(interleaved_chunk(block, num_blocks, pp * virtual_stages), pp, placement)


def block_ranks(config, num_blocks: int) -> tuple[int, ...] | None:
    """Each block's pipeline rank where the configuration fixes it, None where a search places
    the blocks (one contiguous chunk per rank): an explicit ``pipeline_layout`` (chunk k of its
    blocks on :func:`planner.cost.pipeline.chunk_rank`, as :func:`layout_placement`), or pp x v
    interleaved chunks (:func:`interleaved_rank`)."""
    placement = getattr(getattr(config, "schedule_spec", None), "placement", "loop")
    if getattr(config, "pipeline_layout", ""):
        from planner.cost.pipeline import chunk_rank
        from planner.pipeline_layout import parse_layout

        blocks = parse_layout(config.pipeline_layout).blocks
        return tuple(chunk_rank(k, config.pp, placement)
                     for k, n in enumerate(blocks) for _ in range(n))
    if config.virtual_stages > 1:
        return tuple(interleaved_rank(b, num_blocks, config.pp, config.virtual_stages, placement)
                     for b in range(num_blocks))
    return None


def head_stage(config) -> int:
    """The rank holding the last model chunk (the LM head): the last rank, or rank 0 under a
    V placement (chunk 2 pp - 1 comes back to rank 0)."""
    return 0 if config.pp > 1 and config.schedule_spec.placement == "v" else config.pp - 1


def default_placement(model: ModelGraph, config, block_option: LayerOption = NO_OPTION
                      ) -> LayerPlacement:
    """Megatron-LM's default split: blocks spread evenly over pp stages (earlier stages take the
    remainder; round-robin chunks when interleaved), the embedding on the first stage, the head
    on the last; ``block_option`` for every block (embedding and head: :data:`NO_OPTION`).
    ``config`` is anything with ``pp`` and ``virtual_stages`` (a ParallelConfig); one with a
    ``pipeline_layout`` places the layers as it says instead (:func:`layout_placement`)."""
    if getattr(config, "pipeline_layout", ""):
        return layout_placement(model, config, block_option)
    pp, virtual_stages = config.pp, config.virtual_stages
    blocks = [i for i, layer in enumerate(model.layers) if layer.kind is LayerKind.BLOCK]
    per_stage, extra = divmod(len(blocks), pp)
    stage_of: dict[int, int] = {}
    cursor = 0
    for stage in range(pp):
        count = per_stage + (1 if stage < extra else 0)
        for index in blocks[cursor:cursor + count]:
            stage_of[index] = stage
        cursor += count
    placement = getattr(getattr(config, "schedule_spec", None), "placement", "loop")
    if virtual_stages > 1:
        stage_of = {index: interleaved_rank(b, len(blocks), pp, virtual_stages, placement)
                    for b, index in enumerate(blocks)}
    last = 0 if pp > 1 and placement == "v" else pp - 1
    stages = []
    for i, layer in enumerate(model.layers):
        if layer.kind is LayerKind.BLOCK:
            stages.append(stage_of[i])
        elif layer.kind is LayerKind.EMBEDDING:
            stages.append(0)
        else:
            stages.append(last)
    options = tuple(block_option if layer.kind is LayerKind.BLOCK else NO_OPTION
                    for layer in model.layers)
    return LayerPlacement(tuple(stages), options)


def layout_placement(model: ModelGraph, config, block_option: LayerOption = NO_OPTION
                     ) -> LayerPlacement:
    """The layers where ``config.pipeline_layout`` puts them (Megatron-Core's
    ``--pipeline-model-parallel-layout``, planner/pipeline_layout.py): chunk k of pp x v on
    rank k mod pp, or, under a V schedule (ZB-V, DualPipeV), on rank k then 2 pp - 1 - k
    (torchtitan's ``style="v"`` stage-to-rank map, which takes per-stage layer lists:
    ``module_fqns_per_model_part``); ``block_option`` for every block."""
    from planner.cost.pipeline import chunk_rank
    from planner.pipeline_layout import layer_chunks, parse_layout

    chunks = layer_chunks(model, parse_layout(config.pipeline_layout))
    options = tuple(block_option if layer.kind is LayerKind.BLOCK else NO_OPTION
                    for layer in model.layers)
    placement = getattr(getattr(config, "schedule_spec", None), "placement", "loop")
    return LayerPlacement(tuple(chunk_rank(k, config.pp, placement) for k in chunks), options)


def uniform(model: ModelGraph, config,
            recompute: Recompute | str = Recompute.NONE) -> LayerPlacement:
    """:func:`default_placement` with the mesh layout and ``recompute`` for every block."""
    return default_placement(model, config, LayerOption(Recompute(recompute)))
