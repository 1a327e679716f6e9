"""What every exporter shares: the result type and read-only views of a plan document.

Consumes a :class:`~planner.plan_types.Plan` (its document, for the per-layer views); produces
facts the exporters translate (pipeline chunks, per-chunk recomputation, memory under a changed setting).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from planner.errors import PlannerError
from planner.hardware import GIB
from planner.plan_types import Plan


@dataclass(frozen=True)
class ExportResult:
    """``text`` is the runtime's file; ``warnings`` name each way it differs from the plan
    (``export --strict`` fails on any); ``notes`` say what the user must do for the runtime
    to run it as planned (they are no difference, and ``--strict`` ignores them)."""

    format: str
    text: str
    warnings: tuple[str, ...] = ()
    suffix: str = ".txt"
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Chunk:
    """A contiguous run of layers on one pipeline rank (a stage; a model chunk when
    interleaved). ``recompute`` lists the blocks' settings in order."""

    rank: int
    has_embedding: bool
    has_head: bool
    block_indices: tuple[int, ...]  # block numbers (0-based among blocks) in this chunk
    recompute: tuple[str, ...]
    num_mtp: int = 0  # multi-token-prediction modules (layers of kind mtp, models/mtp.py)

    @property
    def num_blocks(self) -> int:
        return len(self.block_indices)


# schedules whose 2 chunks per rank form a V (planner.cost.pipeline): chunks pp - 1 and pp are
# consecutive on the last rank, one run of layers that is two model chunks
V_SCHEDULES = ("zbv", "dualpipev")


def _split_v_turn(pending: list, pp: int, num_blocks: int) -> list:
    """Split the run at the V's turn (rank pp - 1) into its two chunks, sized as
    :func:`planner.strategy.interleaved_rank` sizes them (the first blocks mod 2 pp chunks
    hold one block more)."""
    base, extra = divmod(num_blocks, 2 * pp)
    first = base + (1 if pp - 1 < extra else 0)  # blocks of chunk pp - 1
    run, blocks = pending[pp - 1]
    cut = run.index(next(x for x in run if x["kind"] == "block")) + first if blocks else 0
    head = [(run[:cut], blocks[:first]), (run[cut:], blocks[first:])]
    return pending[:pp - 1] + head + pending[pp:]


def chunks(doc: dict[str, Any]) -> list[Chunk]:
    """The plan's layers as runs of equal stage: pp runs, or pp x v round-robin when
    interleaved, or 2 pp in a V (``check`` verifies that shape)."""
    layers = sorted(doc["layers"], key=lambda layer: layer["index"])
    out: list[Chunk] = []
    current: list[dict] = []
    block = 0
    pending: list[tuple[list[dict], list[int]]] = []
    numbers: list[int] = []
    for layer in layers:
        if current and layer["stage"] != current[-1]["stage"]:
            pending.append((current, numbers))
            current, numbers = [], []
        current.append(layer)
        if layer["kind"] == "block":
            numbers.append(block)
            block += 1
    if current:
        pending.append((current, numbers))
    p = doc["parallelism"]
    if p.get("schedule") in V_SCHEDULES and p["pp"] > 1:
        pending = _split_v_turn(pending, p["pp"], block)
    for run, blocks in pending:
        out.append(Chunk(rank=run[0]["stage"],
                         has_embedding=any(x["kind"] == "embedding" for x in run),
                         has_head=any(x["kind"] == "head" for x in run),
                         block_indices=tuple(blocks),
                         recompute=tuple(x["recompute"] for x in run if x["kind"] == "block"),
                         num_mtp=sum(x["kind"] == "mtp" for x in run)))
    return out


def blocks_per_rank(doc: dict[str, Any]) -> list[int]:
    pp = doc["parallelism"]["pp"]
    counts = [0] * pp
    for layer in doc["layers"]:
        if layer["kind"] == "block" and layer["stage"] < pp:
            counts[layer["stage"]] += 1
    return counts


def block_recompute(doc: dict[str, Any]) -> list[str]:
    layers = sorted(doc["layers"], key=lambda layer: layer["index"])
    return [layer["recompute"] for layer in layers if layer["kind"] == "block"]


def recompute_counts(values: list[str] | tuple[str, ...]) -> dict[str, int]:
    return {kind: sum(1 for v in values if v == kind) for kind in ("none", "selective", "full")}


def describe_recompute(doc: dict[str, Any]) -> str:
    """'full on 6 of 24 blocks (stage 0: 3, stage 1: 3), selective on 2' (op: per-op SAC)."""
    pp = doc["parallelism"]["pp"]
    layers = [x for x in doc["layers"] if x["kind"] == "block"]
    parts = []
    for kind in ("full", "selective", "op"):
        chosen = [x for x in layers if x["recompute"] == kind]
        if not chosen:
            continue
        per_stage = [sum(1 for x in chosen if x["stage"] == s) for s in range(pp)]
        where = (" (" + ", ".join(f"stage {s}: {n}" for s, n in enumerate(per_stage)) + ")"
                 if pp > 1 else "")
        parts.append(f"{kind} on {len(chosen)} of {len(layers)} blocks{where}")
    return "; ".join(parts) if parts else "none"


def memory_note(plan: Plan, **changes: Any) -> str:
    """' (the cost model predicts 41.2 GiB peak per GPU of 80 GiB: fits)' for the plan with
    ``changes`` (ParallelConfig fields, ``runtime_*`` RuntimeOptions fields or ``option_*``
    LayerOption fields of every layer); '' if the
    changed plan cannot be evaluated."""
    try:
        ev = plan.with_changes(**changes).evaluate()
    except (PlannerError, KeyError, ValueError, TypeError):
        return ""
    peak = ev.peak_memory_bytes / GIB
    was = plan.document["predicted"]["peak_memory_gib"]
    verdict = "fits" if ev.fits else "does NOT fit"
    of = ("each stage's pool's GPU memory" if plan.across_pools
          else f"{ev.cluster.gpu.memory_gib:g} GiB")
    return (f" (the cost model predicts {peak:.1f} GiB peak per GPU instead of the plan's "
            f"{was:.1f}, of {of}: {verdict})")


def world(doc: dict[str, Any]) -> str:
    p = doc["parallelism"]
    n = p["tp"] * p["pp"] * p["dp"] * p["cp"]
    return (f"{n} GPUs = dp {p['dp']} x tp {p['tp']} x pp {p['pp']} x cp {p['cp']}"
            + (f", ep {p['ep']}" if p["ep"] > 1 else ""))


def launch_size(doc: dict[str, Any]) -> tuple[int, int]:
    """(processes per host, hosts) of the job's torchrun launch: one launcher per host, which
    is the node unless the cluster sets ``gpus_per_host`` (a GB200 NVL72 rack is one node of
    18 hosts of 4 GPUs). Across pools: the nodes the plan uses, with the first stage's pool's
    GPUs per node (planner/hetero/launch.py warns when the pools differ)."""
    c = doc["cluster"]
    if "pools" not in c:
        per_host = c.get("gpus_per_host", c["gpus_per_node"])
        return per_host, c["num_nodes"] * c["gpus_per_node"] // per_host
    from planner.hetero.layout import stage_shares

    p = doc["parallelism"]
    pool = stage_shares(p["stage_pools"][0], p["dp"])[0][0]  # a split stage: its first pool
    first = next(x for x in c["pools"] if x["name"] == pool)
    nodes = sum(-(-x["gpus_used"] // x["gpus_per_node"]) for x in c["pools"])
    return first["gpus_per_node"], nodes


def headline(doc: dict[str, Any]) -> str:
    c = doc["cluster"]
    if "pools" in c:  # a plan across pools (planner/hetero/plan_file.py)
        hardware = " + ".join(f"{x['name']}: {x['num_nodes']} x {x['gpus_per_node']} {x['gpu']}"
                              for x in c["pools"])
    else:
        hardware = f"{c['num_nodes']} x {c['gpus_per_node']} {c['gpu']}"
        if "gpus_per_host" in c:
            hosts = c["num_nodes"] * c["gpus_per_node"] // c["gpus_per_host"]
            hardware += f", {hosts} hosts of {c['gpus_per_host']}"
    return f"{doc['model']['name']} on {c['name']} ({hardware}): {world(doc)}"
