"""Re-planning after failures and around stragglers, under a churn budget.

Consumes a plan's decisions (model, cluster, ParallelConfig, LayerPlacement, runtime options;
across pools also the stage pools), the failed runtime ranks, per-rank slowdown factors and a budget (layers that may change
stage); produces a :class:`ReplanResult`: the fastest plan on the remaining GPUs that fits memory
and stays within the budget, what it costs against the old plan (throughput, layers moved, TP
groups re-formed, state that crosses each link, state lost with the failed GPUs), and every
option considered.

Options (each surviving GPU keeps its pipeline stage, TP and CP coordinates unless a layer
moves; ranks are the Megatron order of :class:`~planner.mesh.Mesh`; across pools every stage
keeps its pool, a split stage its shares recounted over the surviving replicas, and the new
plan runs on each pool's nodes it uses, :mod:`planner.hetero.survivors`):

* **drop replicas**: the data-parallel replicas holding a failed rank leave (with the replicas
  that share their nodes, so whole nodes leave); dp shrinks, the global batch is kept (the
  fewest further replicas are dropped until dp x micro-batch divides it) or, when allowed,
  rounded down to a multiple of the new dp. No layer moves; ZeRO shards are re-partitioned over
  the new data-parallel groups.
* **rebalance**: the stage boundaries and the layer options are re-solved with the CP-SAT model
  of :mod:`planner.hetero.ilp` with each stage's slowdown (the slowest rank of the stage: its TP
  peers wait at every collective, and the slowest replica sets the step), under the budget of
  blocks that change stage (a hard constraint). 1F1B plans only (interleaved chunks are equal).
* **drop the stragglers' replicas**: slow ranks treated as failed.

Not offered: nonuniform tensor parallelism (a TP group continuing with one GPU fewer): none of
the runtimes the plan exports to (Megatron-LM, torchtitan, DeepSpeed) runs a TP group whose
size does not divide the heads evenly over equal shards.

State accounting (bytes, per GPU summed over GPUs): a layer that changes stage is sent whole
(weights and optimizer states, after TP and ZeRO sharding) to every GPU of its new stage;
ZeRO-1/2/3 shards of the layers that stay are re-partitioned: a GPU whose new shard interval
(flat data-parallel index j' of n') is not inside its old one fetches the difference from its
old owners; what only a failed GPU held is lost (restore it from the last checkpoint). A
transfer crosses the node's tier inside a node, the pool's network tier between its nodes, and
the inter-pool link between pools.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

from planner.config import ParallelConfig, RuntimeOptions
from planner.cost.terms import layer_terms
from planner.errors import ErrorKind, PlannerError, invalid
from planner.hardware import GIB, Cluster, MultiPoolCluster
from planner.hetero.evaluate import HeteroEvaluation, hetero_evaluate
from planner.hetero.ilp import solve_pools
from planner.hetero.layout import StagePools, stage_shares
from planner.hetero.survivors import RankLayout, shrunk_cluster  # noqa: F401 (re-exported)
from planner.hetero.terms import pool_terms
from planner.ir import LayerKind, ModelGraph
from planner.mesh import Mesh
from planner.solve.space import _divisors
from planner.strategy import LayerPlacement


@dataclass(frozen=True)
class ReplanOption:
    strategy: str
    config: ParallelConfig
    placement: LayerPlacement
    cluster: Cluster | MultiPoolCluster  # the GPUs the new plan runs on (renumbered from 0)
    evaluation: HeteroEvaluation
    rank_map: tuple[int, ...]  # new rank -> old global rank
    dropped_replicas: tuple[int, ...]
    moved_layers: int
    moved_state_bytes: float
    moved_state_by_link: Mapping[str, float]
    lost_state_bytes: float
    reformed_tp_groups: int
    solver_status: str

    @property
    def step_time_s(self) -> float:
        return self.evaluation.step_time_s


@dataclass
class ReplanResult:
    old: HeteroEvaluation
    chosen: ReplanOption
    considered: list[ReplanOption]
    failed_ranks: tuple[int, ...]
    slow: Mapping[int, float]
    max_moved_layers: int | None
    wall_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def throughput_loss_pct(self) -> float:
        return 100.0 * (1.0 - self.chosen.evaluation.tokens_per_s / self.old.tokens_per_s)

    def as_dict(self) -> dict:
        """The ``replan`` section of the new plan (and of ``--json``)."""
        c = self.chosen
        return {
            "failed_ranks": list(self.failed_ranks),
            "slow_ranks": {str(r): f for r, f in sorted(self.slow.items())},
            "strategy": c.strategy,
            "throughput_loss_pct": self.throughput_loss_pct,
            "old_step_time_s": self.old.step_time_s,
            "new_step_time_s": c.step_time_s,
            "old_tokens_per_s": self.old.tokens_per_s,
            "new_tokens_per_s": c.evaluation.tokens_per_s,
            "moved_layers": c.moved_layers,
            "max_moved_layers": self.max_moved_layers,
            "moved_state_gib": c.moved_state_bytes / GIB,
            "moved_state_gib_by_link": {k: v / GIB for k, v in sorted(c.moved_state_by_link.items())},
            "lost_state_gib": c.lost_state_bytes / GIB,
            "reformed_tp_groups": c.reformed_tp_groups,
            "dropped_replicas": list(c.dropped_replicas),
            "gpus_used": c.config.num_gpus,
            "global_batch": c.config.global_batch,
            "old_global_batch": self.old.config.global_batch,
            "rank_map": list(c.rank_map),
            "solver_status": c.solver_status,
            "considered": [{"strategy": o.strategy, "step_time_s": o.step_time_s,
                            "fits": o.evaluation.fits, "moved_layers": o.moved_layers,
                            "moved_state_gib": o.moved_state_bytes / GIB,
                            "gpus_used": o.config.num_gpus} for o in self.considered],
            "notes": list(self.notes),
        }


def slowdown_from_step_times(times: Mapping[int, float]) -> dict[int, float]:
    """Per-rank slowdown factors from a user's measurements: ``times`` maps ranks to measured
    step (or per-micro-batch compute) seconds; a rank's factor is its time over the median of
    the measured ranks, kept for the ranks above the median (those at it or faster run at the
    plan's pace)."""
    import statistics

    if not times:
        raise invalid("no measured step times", "give {rank: seconds, ...} for the ranks measured")
    for r, t in times.items():
        if isinstance(r, bool) or not isinstance(r, int) or r < 0:
            raise invalid(f"measured step times: {r!r} is not a rank")
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) \
                or t <= 0:
            raise invalid(f"measured step time of rank {r}: {t!r} is not a positive number of "
                          f"seconds")
    median = statistics.median(float(t) for t in times.values())
    return {r: float(t) / median for r, t in sorted(times.items()) if t > median}


def _check_ranks(cluster: Cluster, failed: Sequence[int], slow: Mapping[int, float],
                 config: ParallelConfig) -> None:
    n = config.num_gpus
    for r in list(failed) + list(slow):
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < n:
            raise invalid(f"rank {r!r} is not a rank of the plan (0 .. {n - 1})",
                          "ranks are global ranks as the plan numbers them")
    for r, f in slow.items():
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f) \
                or not 1.0 <= f <= 1000.0:
            raise invalid(f"slowdown of rank {r}: {f!r} is not a factor in [1, 1000]",
                          "a factor of 1.5 means the rank takes 1.5x as long")


def _stage_factors(mesh: Mesh, slow: Mapping[int, float], replicas: Sequence[int]) -> list[float]:
    keep = set(replicas)
    out = [1.0] * mesh.pp
    for rank, factor in slow.items():
        c = mesh.coords(rank)
        if c["dp"] in keep:
            out[c["pp"]] = max(out[c["pp"]], float(factor))
    return out


def _block_counts(model: ModelGraph, placement: LayerPlacement, pp: int) -> list[int]:
    counts = [0] * pp
    for i, layer in enumerate(model.layers):
        if layer.kind is LayerKind.BLOCK:
            counts[placement.stage[i]] += 1
    return counts


def _contiguous(model: ModelGraph, placement: LayerPlacement) -> bool:
    stages = [placement.stage[i] for i, layer in enumerate(model.layers)
              if layer.kind is LayerKind.BLOCK]
    return stages == sorted(stages)


class _Replanner:
    def __init__(self, model, cluster, config, placement, runtime, failed, slow, budget,
                 allow_batch_change, deadline, layout: RankLayout):
        self.model, self.cluster, self.config = model, cluster, config
        self.layout = layout
        self.placement, self.runtime = placement, runtime
        self.failed, self.slow, self.budget = tuple(sorted(set(failed))), dict(slow), budget
        self.allow_batch_change = allow_batch_change
        self.deadline = deadline
        self.mesh = config.mesh
        self.notes: list[str] = []

    # -- survivors ---------------------------------------------------------------------------
    @property
    def group(self) -> int:
        """Replicas whose GPUs share nodes (tp x cp smaller than a node): they leave together."""
        c, gpn = self.config, self.layout.gpus_per_node
        group = gpn // (c.tp * c.cp) if c.tp * c.cp < gpn else 1
        return group if group > 1 and c.dp % group == 0 else 1

    def drop_set(self, ranks: Sequence[int]) -> list[int]:
        """Replicas to drop for ``ranks``: theirs, and those sharing their nodes."""
        c, group = self.config, self.group
        hit = {self.mesh.coords(r)["dp"] for r in ranks}
        return sorted({g * group + k for r in hit for g in [r // group] for k in range(group)
                       if g * group + k < c.dp})

    def shrink(self, dropped: list[int]) -> tuple[list[int], ParallelConfig] | None:
        """Surviving replicas and the config on them (global batch kept, or rounded down)."""
        c = self.config
        survivors = [r for r in range(c.dp) if r not in dropped]
        while survivors:
            dp = len(survivors)
            # hybrid sharding: equal shard groups of dp_shard ranks, replicated; where the old
            # group no longer divides dp, the largest that does and is no larger (states
            # re-partitioned as from a checkpoint); as large as dp: plain sharding over dp
            shard = 0
            if c.dp_shard and c.dp_shard < dp:
                shard = max(d for d in _divisors(dp) if d <= c.dp_shard)
                shard = shard if shard > 1 else 0
            base = replace(c, dp=dp, dp_shard=shard)
            for mbs in [c.micro_batch] + [b for b in _divisors(c.global_batch)
                                          if b != c.micro_batch and b <= 16]:
                if c.global_batch % (dp * mbs) == 0:
                    new = replace(base, micro_batch=mbs)
                    if new.micro_batches_fit_schedule:  # interleaved: micro-batches x pp
                        return survivors, new
            if self.allow_batch_change:
                step = dp * c.micro_batch
                if not replace(base, global_batch=step).micro_batches_fit_schedule:
                    step *= c.pp  # interleaved: the micro-batches in groups of pp
                gb = c.global_batch // step * step
                if gb:
                    self.notes.append(f"global batch {c.global_batch} -> {gb} (dp {dp})")
                    return survivors, replace(base, global_batch=gb)
            # drop more replicas (a node's worth at a time) until dp divides the batch
            survivors = survivors[:-self.group]
        return None

    def why_none_survive(self, dropped: list[int]) -> str:
        """What really leaves no replica: dp 1, or failures in every replica (or node group).
        (When a node group survives, dp = the group size divides the batch: shrink never
        runs out for the batch alone.)"""
        c, group = self.config, self.group
        if c.dp == 1:
            return "the plan has dp 1 (its one replica holds every GPU)"
        if group > 1:
            return (f"they hit every node group of replicas (the {c.dp} replicas share nodes "
                    f"{group} at a time, tp x cp = {c.tp * c.cp} of "
                    f"{self.layout.gpus_per_node} GPUs a node, and leave with their node)")
        return f"they hit all {c.dp} replicas"

    def rank_map(self, survivors: Sequence[int], config: ParallelConfig) -> tuple[int, ...]:
        new = config.mesh
        out = []
        for rank in range(new.num_gpus):
            c = new.coords(rank)
            out.append(self.mesh.rank(pp=c["pp"], dp=survivors[c["dp"]], cp=c["cp"], tp=c["tp"]))
        return tuple(out)

    # -- options -----------------------------------------------------------------------------
    def option(self, strategy: str, survivors: list[int], config: ParallelConfig,
               rebalance: bool) -> ReplanOption | None:
        dropped = tuple(r for r in range(self.config.dp) if r not in survivors)
        cluster, pools = self.layout.after(config, survivors)
        factors = _stage_factors(self.mesh, self.slow, survivors)
        terms = pool_terms(self.model, cluster, config, self.runtime,
                           splits=[stage_shares(n, config.dp) for n in pools.splits()])
        placement, status = self.placement, "KEPT"
        if rebalance:
            if config.virtual_stages > 1 or not _contiguous(self.model, self.placement):
                return None
            old_counts = _block_counts(self.model, self.placement, config.pp)
            budget = self.budget if self.budget is not None else self.model.num_blocks
            result = solve_pools(terms, config.pp, slowdown=factors, fixed_pools=pools,
                                 old_counts=old_counts, max_moved=budget,
                                 hint=(pools, self.placement),
                                 max_time_s=max(0.2, self.deadline - time.monotonic()),
                                 deterministic_time=5.0)
            if result.placement is None:
                return None
            placement, status = result.placement, result.status
        ev = hetero_evaluate(self.model, cluster, config, pools, placement, self.runtime,
                             factors, terms)
        rank_map = self.rank_map(survivors, config)
        moved, state, by_link, lost = self.churn(config, placement, rank_map, terms)
        return ReplanOption(strategy, config, placement, cluster, ev, rank_map, dropped, moved,
                            state, by_link, lost, self.reformed_tp(config, rank_map), status)

    def reformed_tp(self, config: ParallelConfig, rank_map: Sequence[int]) -> int:
        old = {frozenset(self.mesh.group("tp", r)) for r in range(self.mesh.num_gpus)}
        new = config.mesh
        groups = {frozenset(rank_map[m] for m in new.group("tp", r)) for r in range(new.num_gpus)}
        return sum(1 for g in groups if g not in old)

    def churn(self, config: ParallelConfig, placement: LayerPlacement,
              rank_map: Sequence[int], terms) -> tuple[int, float, dict, float]:
        """(layers moved, bytes moved, bytes per link, bytes lost) of the new plan."""
        model, old_mesh, new_mesh = self.model, self.mesh, config.mesh
        ctx = terms[0].problem.ctx  # bytes: the same on every pool (the same shards)
        failed = set(self.failed)
        by_link: dict[str, float] = {}
        lost = 0.0

        def send(src: int, dst: int, nbytes: float) -> None:
            nonlocal lost
            if nbytes <= 0:
                return
            if src in failed:
                lost += nbytes
                return
            link = self.layout.link(src, dst)
            by_link[link] = by_link.get(link, 0.0) + nbytes

        moved = {i for i in range(len(model.layers))
                 if placement.stage[i] != self.placement.stage[i]}
        zero = config.zero_stage
        n_old, n_new = old_mesh.shard_degree, new_mesh.shard_degree
        reshard = zero >= 1 and (n_old != n_new or rank_map != tuple(range(len(rank_map))))
        cache: dict = {}

        def terms_of(i: int):
            key = (model.layers[i].signature, placement.options[i])
            if key not in cache:
                cache[key] = layer_terms(ctx, model.layers[i], placement.options[i])
            return cache[key]

        ranks_of_stage: dict[int, list[tuple[int, dict]]] = {}
        for new_rank in range(new_mesh.num_gpus):
            c = new_mesh.coords(new_rank)
            ranks_of_stage.setdefault(c["pp"], []).append((new_rank, c))
        for stage in range(config.pp):
            layers = [i for i in range(len(model.layers)) if placement.stage[i] == stage]
            sharded = sum(terms_of(i).optimizer_bytes * n_new
                          + (terms_of(i).params_bytes * n_new if zero >= 3 else 0.0)
                          for i in layers if i not in moved)
            moved_from = {}  # old stage -> bytes of this stage's moved layers that were there
            for i in layers:
                if i in moved:
                    x = terms_of(i)
                    moved_from[self.placement.stage[i]] = moved_from.get(
                        self.placement.stage[i], 0.0) + x.params_bytes + x.optimizer_bytes
            for new_rank, c in ranks_of_stage.get(stage, []):
                dst = rank_map[new_rank]
                oc = old_mesh.coords(dst)
                # moved layers: whole, from the GPU of the same replica, cp and tp there
                for old_stage, nbytes in moved_from.items():
                    send(old_mesh.rank(pp=old_stage, dp=oc["dp"], cp=oc["cp"], tp=oc["tp"]),
                         dst, nbytes)
                if not reshard or not sharded:
                    continue
                # the layers that stay: re-partition their ZeRO shards over the new group
                j_new = c["dp"] * config.cp + c["cp"]
                lo, hi = j_new / n_new, (j_new + 1) / n_new
                j_old = oc["dp"] * self.config.cp + oc["cp"]
                for j in range(math.floor(lo * n_old), min(n_old, math.ceil(hi * n_old))):
                    overlap = min(hi, (j + 1) / n_old) - max(lo, j / n_old)
                    if j == j_old or overlap <= 1e-15:
                        continue
                    src = old_mesh.rank(pp=oc["pp"], dp=j // self.config.cp,
                                        cp=j % self.config.cp, tp=oc["tp"])
                    send(src, dst, overlap * sharded)
        return len(moved), sum(by_link.values()), by_link, lost

    def run(self) -> list[ReplanOption]:
        options: list[ReplanOption] = []
        v1 = self.config.virtual_stages == 1
        if self.config.pipeline_layout and (self.slow or self.failed):
            # plan --pin pipeline_layout: the layout fixes every block's rank (v 1 too)
            v1 = False
            self.notes.append(f"no rebalancing: the plan's pipeline layout "
                              f"{self.config.pipeline_layout} is pinned and fixes the blocks' "
                              f"ranks (re-plan from scratch with `shardplan plan` to move them)")
        elif not v1 and (self.slow or self.failed):
            self.notes.append(f"no rebalancing: the plan interleaves {self.config.virtual_stages} "
                              f"chunks per pipeline rank, whose layers the re-plan does not move "
                              f"(re-plan from scratch with `shardplan plan` to move them)")
        if self.failed:
            dropped = self.drop_set(self.failed)
            shrunk = self.shrink(dropped)
            if shrunk is None:
                raise PlannerError(ErrorKind.INFEASIBLE,
                                   f"no data-parallel replica survives the failure of ranks "
                                   f"{', '.join(map(str, self.failed))}: "
                                   f"{self.why_none_survive(dropped)}",
                                   ("re-plan from scratch on the remaining GPUs with "
                                    "`shardplan plan`",))
            survivors, config = shrunk
            for strategy, rebalance in (("drop-replicas", False),
                                        ("drop-replicas+rebalance", True)):
                if rebalance and not v1:
                    continue
                opt = self.option(strategy, survivors, config, rebalance)
                if opt is not None:
                    options.append(opt)
        else:
            survivors = list(range(self.config.dp))
            options.append(self.option("keep", survivors, self.config, False))
            if v1 and self.slow:
                opt = self.option("rebalance", survivors, self.config, True)
                if opt is not None:
                    options.append(opt)
        if self.slow:  # treat the stragglers as failed
            dropped = self.drop_set(list(self.failed) + list(self.slow))
            shrunk = self.shrink(dropped)
            if shrunk is not None and len(shrunk[0]) < self.config.dp:
                opt = self.option("drop-slow-replicas", shrunk[0], shrunk[1], False)
                if opt is not None:
                    options.append(opt)
        return options


def _refusal(option: ReplanOption, max_moved_layers: int | None) -> str:
    """Why a considered re-plan was refused: the memory it needs, or the layers it moves."""
    c, ev = option.config, option.evaluation
    what = (f"{option.strategy} (dp {c.dp}, global batch {c.global_batch}, "
            f"{c.num_gpus} GPUs)")
    if not ev.fits:
        over = min(ev.memory_headroom_bytes, 0.0)
        return (f"{what} needs {ev.peak_memory_bytes / GIB:.1f} GiB per GPU, "
                f"{-over / GIB:.1f} GiB over")
    return f"{what} moves {option.moved_layers} layers, over the budget of {max_moved_layers}"


def replan(model: ModelGraph, cluster: Cluster | MultiPoolCluster, config: ParallelConfig,
           placement: LayerPlacement, runtime: RuntimeOptions = RuntimeOptions(), *,
           failed: Sequence[int] = (), slow: Mapping[int, float] | None = None,
           max_moved_layers: int | None = None, allow_batch_change: bool = False,
           time_limit_s: float = 5.0, stage_pools: Sequence[str] | None = None,
           memory_limit_gib: float | None = None, memory_gate=None) -> ReplanResult:
    """The best plan on the remaining GPUs within the budget (see the module docstring).
    ``stage_pools``: a plan across pools' stage pools (``cluster`` a MultiPoolCluster).
    ``memory_limit_gib``: the per-GPU memory the old plan was searched under (its
    ``solver.memory_limit_gib``: the GPU less ``--memory-headroom``); a re-plan within it is
    preferred to a faster one that needs more, and a chosen one above it is said (notes).
    ``memory_gate``: the :class:`planner.solve.gate.MemoryGate` the old plan was searched
    under (``--memory-confidence``, :func:`planner.solve.gate.plan_gate`): a re-plan must fit
    the GPU at its band's quantile, the test ``check`` makes at the plan's recorded gate
    (:meth:`~planner.solve.gate.MemoryGate.peak_limit_bytes`, the search's), and one whose
    quantile is within ``memory_limit_gib`` is preferred; none passing is refused."""
    start = time.monotonic()
    slow = dict(slow or {})
    if isinstance(cluster, MultiPoolCluster) != (stage_pools is not None):
        raise invalid("a plan across pools is re-planned with its stage pools, a one-pool plan "
                      "without")
    _check_ranks(cluster, failed, slow, config)
    if max_moved_layers is not None and max_moved_layers < 0:
        raise invalid(f"--max-moved-layers must be >= 0, got {max_moved_layers}")
    if not failed and not slow:
        raise invalid("nothing to re-plan: give --failed RANKS or --slow RANK:FACTOR")
    for r in failed:
        slow.pop(r, None)
    gate = memory_gate if memory_gate is not None and memory_gate.active else None
    if gate is not None and stage_pools is not None:
        raise invalid("a plan across pools has no memory gate (--memory-confidence)")
    pools = StagePools(tuple(stage_pools) if stage_pools is not None
                       else (cluster.name,) * config.pp)
    old = hetero_evaluate(model, cluster, config, pools, placement, runtime)
    layout = RankLayout(cluster, config, pools if stage_pools is not None else None)
    planner = _Replanner(model, cluster, config, placement, runtime, failed, slow,
                         max_moved_layers, allow_batch_change, start + time_limit_s, layout)
    considered = planner.run()
    within = [o for o in considered if o.evaluation.fits
              and (max_moved_layers is None or o.moved_layers <= max_moved_layers)]
    budget = "" if max_moved_layers is None else \
        f" within the churn budget of {max_moved_layers} moved layers"
    if not within:
        why = [_refusal(o, max_moved_layers) for o in considered]
        hints = (("raise --max-moved-layers",) if max_moved_layers is not None else ()) + \
            (() if allow_batch_change else
             ("allow a smaller global batch with --allow-batch-change",)) + \
            ("re-plan from scratch with `shardplan plan`",)
        raise PlannerError(ErrorKind.DOES_NOT_FIT if considered else ErrorKind.INFEASIBLE,
                           f"no re-plan fits memory{budget}"
                           + (f": {'; '.join(why)}" if why else ""), hints,
                           {"considered": [o.strategy for o in considered]})

    def gated_peak(o):  # GiB: the peak at the gate's quantile (the prediction without a gate)
        ev = o.evaluation
        if gate is None:
            return ev.peak_memory_bytes / GIB
        return ev.peak_memory_bytes / GIB * ev.cluster.memory_bytes_per_gpu \
            / gate.peak_limit_bytes(ev, ev.cluster.memory_bytes_per_gpu)

    if gate is not None:  # what check at the plan's recorded gate passes
        passing = [o for o in within if gated_peak(o) * GIB
                   <= o.evaluation.cluster.memory_bytes_per_gpu * (1 + 1e-12)]
        if not passing:
            why = [f"{o.strategy} ({o.config.num_gpus} GPUs) peaks at {gated_peak(o):.2f} GiB "
                   f"at the {gate.confidence:.0%} quantile, over the "
                   f"{o.evaluation.cluster.gpu.memory_gib:g} GiB GPU" for o in within]
            raise PlannerError(
                ErrorKind.DOES_NOT_FIT,
                f"no re-plan fits memory at the {gate.confidence:.0%} quantile of its peak's "
                f"error band (the plan's --memory-confidence){budget}: {'; '.join(why)}",
                ("re-plan from scratch with `shardplan plan`, or plan with a lower "
                 "--memory-confidence",),
                {"considered": [o.strategy for o in considered],
                 "memory_confidence": gate.confidence})
        within = passing
    quantile = "" if gate is None else f" at the {gate.confidence:.0%} quantile"
    searched = "(--memory-headroom)" if gate is None else \
        "(--memory-headroom, --memory-confidence)"

    def order(o):
        return o.step_time_s, o.moved_layers, o.moved_state_bytes, o.strategy

    chosen = min(within, key=order)
    if memory_limit_gib is not None:
        roomy = [o for o in within if gated_peak(o) <= memory_limit_gib * (1 + 1e-12)]
        if roomy and chosen not in roomy:
            planner.notes.append(
                f"{chosen.strategy} ({chosen.step_time_s:.3f} s) peaks at "
                f"{gated_peak(chosen):.1f} GiB{quantile}, above the {memory_limit_gib:g} GiB "
                f"the plan was searched under {searched}: chose the fastest re-plan within it")
            chosen = min(roomy, key=order)
        elif not roomy:
            planner.notes.append(
                f"no re-plan keeps the plan's memory headroom: {chosen.strategy} peaks at "
                f"{gated_peak(chosen):.1f} GiB{quantile}, above the {memory_limit_gib:g} GiB "
                f"the plan was searched under {searched}; it fits the GPUs with less margin")
    result = ReplanResult(old, chosen, considered, tuple(sorted(set(failed))), slow,
                          max_moved_layers, notes=planner.notes)
    result.wall_s = time.monotonic() - start
    return result
